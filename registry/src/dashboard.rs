//! `GET /`: the traffic-light dashboard, server-rendered with askama
//! (`registry/templates/dashboard.html`): the totals per colour, one row
//! per service with its instances counted per colour (its name links to
//! `?service=NAME`), and one page of instances ([`PAGE_SIZE`], the worst
//! first, gone ones last) with each one's colour, outbox depth, oldest
//! waiting message, dead letters, messages sent per minute and the p50/p99
//! send → answer latency ([`crate::throughput`]), when it was last seen, an
//! inline-SVG sparkline of its outbox depth, a link to its failed list, its
//! decommissioned versions and what to do for its colour ([`action_for`]);
//! each service links to its failures page (`crate::failures`). No
//! JavaScript, no external resource; the page reloads itself (`<meta
//! http-equiv="refresh">`).
//!
//! A page load reads only pre-aggregated state ([`crate::rollup`]: one row
//! per instance, one per sparkline bucket of the instances shown), never
//! the raw health history, so its cost does not grow with the history
//! (BENCHMARKS.md, "Registry dashboard").

use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use rusqlite::{Connection, params};
use serde::Deserialize;

use crate::liveness::ActiveAt;
use crate::{ApiError, Shared, aggregator, now_ms, rollup, with_db};

/// Longest sparkline window, in hours: the health history kept
/// ([`aggregator::RETENTION`]), so no window shows more than there is.
pub const MAX_HOURS: u32 = (crate::aggregator::RETENTION.as_secs() / 3600) as u32;
/// Instances per page.
pub const PAGE_SIZE: usize = 50;
const SPARK_WIDTH: f64 = 160.0;
/// Most points drawn in one sparkline (one per 2 pixels).
const MAX_POINTS: usize = 80;
const SPARK_HEIGHT: f64 = 32.0;
const SPARK_MARGIN: f64 = 3.0;

/// `?hours=N`: the sparkline window (1 to [`MAX_HOURS`], the history kept;
/// default 6; more is a 400 that says how much is kept); `?page=N` (from
/// 1); `?service=NAME`: only that service's instances. Any other
/// parameter is a 400.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DashboardQuery {
    hours: Option<String>,
    page: Option<String>,
    service: Option<String>,
}

struct Row {
    service: String,
    instance_id: String,
    base_url: String,
    status: &'static str,
    colour: &'static str,
    depth: String,
    oldest: String,
    dead_letters: String,
    last_seen: String,
    checked: String,
    reasons: String,
    spark_points: String,
    spark_last: Option<(String, String, &'static str)>,
    failed_url: String,
    sent_per_minute: String,
    p50: String,
    p99: String,
    decommissioned: String,
    action: &'static str,
}

/// One service's instances counted per colour.
#[derive(Default)]
struct ServiceRow {
    service: String,
    url: String,
    failures_url: String,
    instances: usize,
    healthy: usize,
    warning: usize,
    critical: usize,
    unknown: usize,
    gone: usize,
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct Page {
    refresh_secs: u64,
    hours: u32,
    services: Vec<ServiceRow>,
    rows: Vec<Row>,
    counts: [(&'static str, &'static str, usize); 5],
    filter: Option<String>,
    page: usize,
    pages: usize,
    first: usize,
    last: usize,
    total: usize,
    prev_url: Option<String>,
    next_url: Option<String>,
    generated_at: String,
}

fn colour_of(status: &str) -> (&'static str, &'static str) {
    match status {
        "healthy" => ("healthy", "#2e7d32"),
        "warning" => ("warning", "#f9a825"),
        "critical" => ("critical", "#c62828"),
        "gone" => ("gone", "#616161"),
        _ => ("unknown", "#9e9e9e"),
    }
}

fn ago(now_ms: i64, then_ms: i64) -> String {
    let secs = ((now_ms - then_ms).max(0) / 1000) as u64;
    match secs {
        0..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        _ => format!("{} h ago", secs / 3600),
    }
}

fn parse_hours(text: Option<&str>) -> Result<u32, ApiError> {
    let Some(text) = text else { return Ok(6) };
    match text.parse::<u64>() {
        Ok(hours) if (1..=u64::from(MAX_HOURS)).contains(&hours) => Ok(hours as u32),
        Ok(hours) if hours > u64::from(MAX_HOURS) => Err(ApiError::BadRequest(format!(
            "`hours={hours}` is more than the {MAX_HOURS} hours of health history the \
             registry keeps: give 1 to {MAX_HOURS}"
        ))),
        _ => Err(ApiError::BadRequest(format!(
            "`hours={text}` is not a whole number of hours from 1 to {MAX_HOURS}"
        ))),
    }
}

/// `?page=N`: 1 by default; any whole number from 1 (a page past the last
/// one shows no instance).
fn parse_page(text: Option<&str>) -> Result<usize, ApiError> {
    let Some(text) = text else { return Ok(1) };
    text.parse::<u32>()
        .ok()
        .filter(|p| *p >= 1)
        .map(|p| p as usize)
        .ok_or_else(|| ApiError::BadRequest(format!("`page={text}` is not a page number from 1")))
}

/// The polyline points (`x,y …`) of `points` from the first to the last
/// check (within `[since, now]`), the depth scaled to the highest one;
/// unreachable checks are left out.
fn sparkline(
    points: &[aggregator::Point],
    since_ms: i64,
    now_ms: i64,
) -> (String, Option<(String, String, &'static str)>) {
    // From the first to the last check in the window: a short history
    // still fills the width instead of being squeezed into one corner.
    let since_ms = points.first().map_or(since_ms, |p| p.at_ms.max(since_ms));
    let until_ms = points.last().map_or(now_ms, |p| p.at_ms.min(now_ms));
    let span = (until_ms - since_ms).max(1) as f64;
    let max = points
        .iter()
        .filter_map(|p| p.depth)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut coords = Vec::new();
    for point in points {
        let Some(depth) = point.depth else { continue };
        // A margin of the end dot's radius, so it is never clipped.
        // A lone point is the latest: drawn at the right end.
        let fraction = if until_ms > since_ms {
            ((point.at_ms - since_ms) as f64 / span).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let x = SPARK_MARGIN + fraction * (SPARK_WIDTH - 2.0 * SPARK_MARGIN);
        let y =
            SPARK_HEIGHT - SPARK_MARGIN - depth as f64 / max * (SPARK_HEIGHT - 2.0 * SPARK_MARGIN);
        coords.push((format!("{x:.1}"), format!("{y:.1}")));
    }
    let last = points.last().map(|p| {
        let (x, y) = coords.last().cloned().unwrap_or_else(|| {
            (
                format!("{:.1}", SPARK_WIDTH - SPARK_MARGIN),
                format!("{SPARK_MARGIN:.1}"),
            )
        });
        (x, y, colour_of(&p.colour).1)
    });
    let text = coords
        .iter()
        .map(|(x, y)| format!("{x},{y}"))
        .collect::<Vec<_>>()
        .join(" ");
    (text, last)
}

/// At most [`MAX_POINTS`] points: runs of neighbours merged into one (at
/// the run's last time, its highest depth, its worst colour), so that a
/// long window draws no more points than the sparkline has room for.
fn merged(points: Vec<aggregator::Point>) -> Vec<aggregator::Point> {
    if points.len() <= MAX_POINTS {
        return points;
    }
    let run = points.len().div_ceil(MAX_POINTS);
    let rank = |colour: &str| match colour {
        "healthy" => 0,
        "warning" => 1,
        _ => 2,
    };
    points
        .chunks(run)
        .filter_map(|chunk| {
            let last = chunk.last()?;
            let worst = chunk.iter().max_by_key(|p| rank(&p.colour))?;
            Some(aggregator::Point {
                at_ms: last.at_ms,
                depth: chunk.iter().filter_map(|p| p.depth).max(),
                colour: worst.colour.clone(),
            })
        })
        .collect()
}

/// What the operator does about an instance of this status (the table of
/// `docs/registry.md`, "Health aggregator and dashboard").
pub(crate) fn action_for(status: &str) -> &'static str {
    match status {
        "healthy" => "Nothing to do.",
        "warning" => {
            "Watch it: a backlog or a slow or unreachable destination. Check the \
             destination named in the reasons; it clears by itself once the destination \
             keeps up."
        }
        "critical" => {
            "Act now: messages need a human, or the instance does not answer. Open its \
             service's failures, fix the cause, then retry or discard them; if it is \
             unreachable, check the process and its diagnostics token."
        }
        "gone" => {
            "It stopped heartbeating: start it again, or delete it (DELETE \
             /v1/services/{service}/instances/{instance}) if it was retired."
        }
        _ => "Wait for the first health check.",
    }
}

/// `hr.Api v1 (3 held)`, … of the stored JSON; `–` for none.
fn decommissioned_text(stored: Option<String>) -> String {
    let versions: Vec<aggregator::RemoteDecommissioned> = stored
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    if versions.is_empty() {
        return "–".to_owned();
    }
    versions
        .iter()
        .map(|v| format!("{} v{} ({} held)", v.interface, v.version, v.held))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every service with its instances counted per colour, by service name:
/// one grouped query over the instances and their latest checks.
fn service_rows(conn: &Connection, at: &ActiveAt) -> rusqlite::Result<Vec<ServiceRow>> {
    let mut statement = conn.prepare(&format!(
        "SELECT i.service, NOT {}, h.colour, COUNT(*) FROM instances i \
         LEFT JOIN instance_health h ON h.instance_id = i.instance_id \
         GROUP BY 1, 2, 3 ORDER BY 1",
        at.sql("i")
    ))?;
    let mut services: Vec<ServiceRow> = Vec::new();
    let groups = statement.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, bool>(1)?,
            row.get::<_, Option<String>>(2)?,
            row.get::<_, i64>(3)? as usize,
        ))
    })?;
    for group in groups {
        let (service, gone, colour, n) = group?;
        if services.last().is_none_or(|last| last.service != service) {
            services.push(ServiceRow {
                url: format!("/?service={service}"),
                failures_url: format!("/services/{service}/failures"),
                service,
                ..ServiceRow::default()
            });
        }
        let Some(entry) = services.last_mut() else {
            continue;
        };
        entry.instances += n;
        let count = match (gone, colour.as_deref()) {
            (true, _) => &mut entry.gone,
            (false, Some("healthy")) => &mut entry.healthy,
            (false, Some("warning")) => &mut entry.warning,
            (false, Some("critical")) => &mut entry.critical,
            (false, _) => &mut entry.unknown,
        };
        *count += n;
    }
    Ok(services)
}

/// One page of instances (of `service`, if given): the worst first, gone
/// ones last, then by service and base URL; each with its sparkline from
/// the buckets since `since`.
fn instance_rows(
    conn: &Connection,
    at: &ActiveAt,
    service: Option<&str>,
    page: usize,
    since: i64,
) -> rusqlite::Result<Vec<Row>> {
    let mut statement = conn.prepare(&format!(
        "SELECT i.instance_id, i.service, i.base_url, i.last_seen_at, NOT {} AS gone, \
         h.colour, h.checked_at, h.depth, h.dead_letter, h.oldest_pending_age_ms, h.reasons, \
         h.sent_per_minute, h.p50_us, h.p99_us, h.decommissioned \
         FROM instances i LEFT JOIN instance_health h ON h.instance_id = i.instance_id \
         WHERE ?1 IS NULL OR i.service = ?1 \
         ORDER BY gone, CASE h.colour WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 \
         WHEN 'healthy' THEN 3 ELSE 2 END, i.service, i.base_url LIMIT ?2 OFFSET ?3",
        at.sql("i")
    ))?;
    let now = at.now_ms;
    let number = |v: Option<i64>| v.map_or_else(|| "–".to_owned(), |v| v.to_string());
    let mut rows = statement
        .query_map(
            params![service, PAGE_SIZE as i64, ((page - 1) * PAGE_SIZE) as i64],
            |row| {
                let colour: Option<String> = row.get(5)?;
                let gone: bool = row.get(4)?;
                let (status, colour) = colour_of(if gone {
                    "gone"
                } else {
                    colour.as_deref().unwrap_or("")
                });
                let checked: Option<i64> = row.get(6)?;
                let reasons: Option<String> = row.get(10)?;
                let reasons: Vec<String> = reasons
                    .and_then(|r| serde_json::from_str(&r).ok())
                    .unwrap_or_default();
                let instance_id: String = row.get(0)?;
                let latency = |v: Option<i64>| {
                    v.map_or_else(
                        || "–".to_owned(),
                        |v| crate::throughput::Quantile::from_stored(v).shown(),
                    )
                };
                Ok(Row {
                    sent_per_minute: row
                        .get::<_, Option<f64>>(11)?
                        .map_or_else(|| "–".to_owned(), |v| format!("{v:.1}")),
                    p50: latency(row.get(12)?),
                    p99: latency(row.get(13)?),
                    decommissioned: decommissioned_text(row.get(14)?),
                    action: action_for(status),
                    service: row.get(1)?,
                    failed_url: format!("/instances/{instance_id}/failed"),
                    instance_id,
                    base_url: row.get(2)?,
                    status,
                    colour,
                    depth: number(row.get(7)?),
                    oldest: row
                        .get::<_, Option<i64>>(9)?
                        .map_or_else(|| "–".to_owned(), |ms| format!("{} s", ms / 1000)),
                    dead_letters: number(row.get(8)?),
                    last_seen: ago(now, row.get(3)?),
                    checked: checked.map_or_else(|| "not yet".to_owned(), crate::store::rfc3339),
                    reasons: reasons.join("; "),
                    spark_points: String::new(),
                    spark_last: None,
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for row in &mut rows {
        let points = merged(rollup::sparkline_points(conn, &row.instance_id, since)?);
        (row.spark_points, row.spark_last) = sparkline(&points, since, now);
    }
    Ok(rows)
}

/// The dashboard's URL with these parameters (the defaults left out).
fn page_url(hours: u32, service: Option<&str>, page: usize) -> String {
    let mut parts = Vec::new();
    if let Some(service) = service {
        parts.push(format!("service={service}"));
    }
    if hours != 6 {
        parts.push(format!("hours={hours}"));
    }
    if page != 1 {
        parts.push(format!("page={page}"));
    }
    if parts.is_empty() {
        "/".to_owned()
    } else {
        format!("/?{}", parts.join("&"))
    }
}

/// `GET /?hours=N&page=N&service=NAME`.
pub(crate) async fn serve(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<DashboardQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the dashboard takes only ?hours=1..{MAX_HOURS}, ?page=N and ?service=NAME",
            e.body_text()
        ))
    })?;
    let hours = parse_hours(query.hours.as_deref())?;
    let page = parse_page(query.page.as_deref())?;
    let filter = query.service;
    if let Some(service) = &filter {
        crate::directory::check_service(service)?;
    }
    let refresh_secs = shared.refresh_secs;
    let at = shared.liveness.at(now_ms());
    let now = at.now_ms;
    let since = now - i64::from(hours) * 3_600_000;
    let wanted = filter.clone();
    let (services, rows) = with_db(&shared, move |conn| {
        let services = service_rows(conn, &at)?;
        let rows = instance_rows(conn, &at, wanted.as_deref(), page, since)?;
        Ok((services, rows))
    })
    .await?;
    let sum = |field: fn(&ServiceRow) -> usize| services.iter().map(field).sum::<usize>();
    let counts = [
        ("healthy", colour_of("healthy").1, sum(|s| s.healthy)),
        ("warning", colour_of("warning").1, sum(|s| s.warning)),
        ("critical", colour_of("critical").1, sum(|s| s.critical)),
        ("unknown", colour_of("").1, sum(|s| s.unknown)),
        ("gone", colour_of("gone").1, sum(|s| s.gone)),
    ];
    let total = match &filter {
        Some(name) => services
            .iter()
            .find(|s| &s.service == name)
            .map_or(0, |s| s.instances),
        None => sum(|s| s.instances),
    };
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    let first = ((page - 1) * PAGE_SIZE + 1).min(total);
    let last = ((page - 1) * PAGE_SIZE + rows.len()).min(total);
    let page_view = Page {
        refresh_secs,
        hours,
        services,
        rows,
        counts,
        prev_url: (page > 1).then(|| page_url(hours, filter.as_deref(), page - 1)),
        next_url: (page < pages).then(|| page_url(hours, filter.as_deref(), page + 1)),
        filter,
        page,
        pages,
        first,
        last,
        total,
        generated_at: crate::store::rfc3339(now),
    };
    html_page(&page_view)
}

/// `page` rendered, as an HTML answer never cached (503 `unavailable`
/// when it cannot be rendered).
pub(crate) fn html_page(page: &impl Template) -> Result<Response, ApiError> {
    let html = page
        .render()
        .map_err(|e| ApiError::Unavailable(format!("cannot render the page: {e}")))?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response())
}

/// One message of an instance's `/_rf/outbox/failed`, as shown (metadata
/// only: the runtime never sends a payload there).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FailedMessage {
    message_id: String,
    message_type: String,
    destination: String,
    interface: String,
    version: u32,
    endpoint: String,
    status: String,
    retry_count: u32,
    max_retries: u32,
    #[serde(default)]
    last_error: Option<String>,
    created_at: String,
}

#[derive(Deserialize)]
struct FailedList {
    messages: Vec<FailedMessage>,
}

struct FailedRow {
    message_id: String,
    message_type: String,
    destination: String,
    interface: String,
    version: u32,
    endpoint: String,
    status: String,
    retry_count: u32,
    max_retries: u32,
    last_error: String,
    created_at: String,
}

#[derive(Template)]
#[template(path = "failed.html")]
struct FailedPage {
    service: String,
    base_url: String,
    messages: Vec<FailedRow>,
}

/// No query parameter is accepted on the failed-list page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoQuery {}

/// Largest failed list read from an instance.
pub const MAX_FAILED_BYTES: usize = 1024 * 1024;

/// `GET /instances/{instanceId}/failed`: the instance's failed list, asked
/// with its diagnostics token, as a page, for the operator only (the
/// registry's operator token, as a bearer token or a browser's `Basic`
/// password: the page would otherwise bypass each service's own token).
/// 401 `unauthorized`; 404 `unknown_instance`; 502 `instance_unreachable`
/// when the instance does not answer it (or answers over
/// [`MAX_FAILED_BYTES`]).
pub(crate) async fn serve_failed(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(instance): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    query: Result<Query<NoQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    crate::authorize(&shared, &headers, crate::access::Access::Operator)?;
    query.map_err(|e| {
        ApiError::BadRequest(format!("{}; this page takes no query", e.body_text()))
    })?;
    let wanted = instance.clone();
    let target = with_db(&shared, move |conn| {
        Ok(aggregator::targets(conn)?
            .into_iter()
            .find(|t| t.instance_id == wanted))
    })
    .await?
    .ok_or_else(|| ApiError::UnknownInstance(format!("no instance `{instance}` is registered")))?;
    let service = with_db(&shared, {
        let id = target.instance_id.clone();
        move |conn| {
            Ok(conn.query_row(
                "SELECT service FROM instances WHERE instance_id = ?1",
                [id],
                |row| row.get::<_, String>(0),
            )?)
        }
    })
    .await?;
    let client = crate::access::instance_client(aggregator::MAX_TIMEOUT, &shared.networks)?;
    let mut request = client.get(format!("{}/_rf/outbox/failed", target.base_url));
    if let Some(token) = &target.token {
        request = request.bearer_auth(token);
    }
    let unreachable =
        |why: String| ApiError::InstanceUnreachable(format!("{}: {why}", target.base_url));
    let response = request
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if !response.status().is_success() {
        return Err(unreachable(format!(
            "/_rf/outbox/failed answered HTTP {}",
            response.status().as_u16()
        )));
    }
    let body = aggregator::read_bounded(response, MAX_FAILED_BYTES)
        .await
        .map_err(|error| {
            unreachable(match error {
                aggregator::BoundedRead::TooLarge => {
                    format!(
                        "the failed list is larger than {} MiB",
                        MAX_FAILED_BYTES >> 20
                    )
                }
                aggregator::BoundedRead::Failed(why) => why,
            })
        })?;
    let list: FailedList = serde_json::from_slice(&body)
        .map_err(|e| unreachable(format!("not a failed list: {e}")))?;
    let page = FailedPage {
        service,
        base_url: target.base_url.clone(),
        messages: list
            .messages
            .into_iter()
            .map(|m| FailedRow {
                message_id: m.message_id,
                message_type: m.message_type,
                destination: m.destination,
                interface: m.interface,
                version: m.version,
                endpoint: m.endpoint,
                status: m.status,
                retry_count: m.retry_count,
                max_retries: m.max_retries,
                last_error: m.last_error.unwrap_or_default(),
                created_at: m.created_at,
            })
            .collect(),
    };
    html_page(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_accepts_only_the_documented_range() {
        assert_eq!(parse_hours(None).unwrap(), 6);
        assert_eq!(parse_hours(Some("24")).unwrap(), 24);
        // No window longer than the history kept.
        assert!(parse_hours(Some("25")).is_err());
        assert!(parse_hours(Some("48")).is_err());
        for odd in ["0", "49", "-1", "1.5", "", "six", "99999999999"] {
            assert!(parse_hours(Some(odd)).is_err(), "{odd}");
        }
        assert_eq!(parse_page(None).unwrap(), 1);
        assert_eq!(parse_page(Some("7")).unwrap(), 7);
        for odd in ["0", "-1", "", "x", "99999999999"] {
            assert!(parse_page(Some(odd)).is_err(), "{odd}");
        }
        assert_eq!(page_url(6, None, 1), "/");
        assert_eq!(page_url(2, Some("hr"), 3), "/?service=hr&hours=2&page=3");
    }

    #[test]
    fn long_windows_are_merged_to_the_points_the_line_has_room_for() {
        let point = |i: i64| aggregator::Point {
            at_ms: i,
            depth: (i != 5).then_some(i as u64),
            colour: if i == 3 { "critical" } else { "healthy" }.to_owned(),
        };
        let few: Vec<_> = (0..MAX_POINTS as i64).map(point).collect();
        assert_eq!(merged(few.clone()), few);
        let many = merged((0..288).map(point).collect());
        assert_eq!(many.len(), 72, "runs of 4");
        assert_eq!(
            (many[0].at_ms, many[0].depth, many[0].colour.as_str()),
            (3, Some(3), "critical")
        );
        assert_eq!((many[1].at_ms, many[1].depth), (7, Some(7)));
        assert_eq!(many[71].at_ms, 287);
    }

    #[test]
    fn sparkline_scales_depth_and_skips_unreachable_checks() {
        let point = |at_ms, depth, colour: &str| aggregator::Point {
            at_ms,
            depth,
            colour: colour.to_owned(),
        };
        let (points, last) = sparkline(
            &[
                point(0, Some(0), "healthy"),
                point(500, None, "critical"),
                point(1000, Some(10), "warning"),
            ],
            0,
            1000,
        );
        assert_eq!(points, "3.0,29.0 157.0,3.0");
        assert_eq!(
            last,
            Some(("157.0".to_owned(), "3.0".to_owned(), "#f9a825"))
        );
        // Drawn from the first to the last check, whatever the window.
        let (later, _) = sparkline(
            &[
                point(0, Some(0), "healthy"),
                point(1000, Some(10), "warning"),
            ],
            0,
            90_000,
        );
        assert_eq!(later, points);
        // A window that starts before the first check is drawn from it.
        let (earlier, _) = sparkline(
            &[
                point(0, Some(0), "healthy"),
                point(1000, Some(10), "warning"),
            ],
            -5000,
            1000,
        );
        assert_eq!(earlier, points);
    }
}
