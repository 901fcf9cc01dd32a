//! `GET /`: the traffic-light dashboard, server-rendered with askama
//! (`registry/templates/dashboard.html`): one row per service instance with
//! its colour, outbox depth, oldest waiting message, dead letters, when it
//! was last seen, an inline-SVG sparkline of its outbox depth, and a link to
//! its failed list. No JavaScript, no external resource; the page reloads
//! itself (`<meta http-equiv="refresh">`).

use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::{ApiError, Shared, aggregator, directory, now_ms, with_db};

/// Longest sparkline window, in hours.
pub const MAX_HOURS: u32 = 48;
const SPARK_WIDTH: f64 = 160.0;
const SPARK_HEIGHT: f64 = 32.0;
const SPARK_MARGIN: f64 = 3.0;

/// `?hours=N`: the sparkline window (1 to 48, default 6). Any other
/// parameter is a 400.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DashboardQuery {
    hours: Option<String>,
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
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct Page {
    refresh_secs: u64,
    hours: u32,
    rows: Vec<Row>,
    counts: [(&'static str, &'static str, usize); 4],
    generated_at: String,
}

fn colour_of(status: &str) -> (&'static str, &'static str) {
    match status {
        "healthy" => ("healthy", "#2e7d32"),
        "warning" => ("warning", "#f9a825"),
        "critical" => ("critical", "#c62828"),
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
    text.parse::<u32>()
        .ok()
        .filter(|h| (1..=MAX_HOURS).contains(h))
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "`hours={text}` is not a whole number of hours from 1 to {MAX_HOURS}"
            ))
        })
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
        let fraction = ((point.at_ms - since_ms) as f64 / span).clamp(0.0, 1.0);
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

/// `GET /?hours=N`.
pub(crate) async fn serve(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<DashboardQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the dashboard takes only ?hours=1..{MAX_HOURS}",
            e.body_text()
        ))
    })?;
    let hours = parse_hours(query.hours.as_deref())?;
    let refresh_secs = shared.refresh_secs;
    let now = now_ms();
    let since = now - i64::from(hours) * 3_600_000;
    let rows = with_db(&shared, move |conn| {
        let mut rows = Vec::new();
        for service in directory::services(conn)? {
            for instance in service.instances {
                let history = aggregator::history(conn, &instance.instance_id, since)?;
                let (spark_points, spark_last) = sparkline(&history, since, now);
                let health = instance.health.as_ref();
                let (status, colour) = colour_of(health.map_or("", |h| h.status.as_str()));
                let number = |v: Option<u64>| v.map_or_else(|| "–".to_owned(), |v| v.to_string());
                rows.push(Row {
                    service: service.service.clone(),
                    status,
                    colour,
                    depth: number(health.and_then(|h| h.outbox_depth)),
                    oldest: health
                        .and_then(|h| h.oldest_pending_age_ms)
                        .map_or_else(|| "–".to_owned(), |ms| format!("{} s", ms / 1000)),
                    dead_letters: number(health.and_then(|h| h.dead_letter)),
                    last_seen: ago(now, instance.last_seen_ms),
                    checked: health.map_or_else(|| "not yet".to_owned(), |h| h.checked_at.clone()),
                    reasons: health.map(|h| h.reasons.join("; ")).unwrap_or_default(),
                    spark_points,
                    spark_last,
                    failed_url: format!("/instances/{}/failed", instance.instance_id),
                    instance_id: instance.instance_id,
                    base_url: instance.base_url,
                });
            }
        }
        Ok(rows)
    })
    .await?;
    let count = |s: &str| rows.iter().filter(|r| r.status == s).count();
    let counts = [
        ("healthy", colour_of("healthy").1, count("healthy")),
        ("warning", colour_of("warning").1, count("warning")),
        ("critical", colour_of("critical").1, count("critical")),
        ("unknown", colour_of("").1, count("unknown")),
    ];
    let page = Page {
        refresh_secs,
        hours,
        rows,
        counts,
        generated_at: crate::store::rfc3339(now),
    };
    let html = page
        .render()
        .map_err(|e| ApiError::Unavailable(format!("cannot render the dashboard: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_accepts_only_the_documented_range() {
        assert_eq!(parse_hours(None).unwrap(), 6);
        assert_eq!(parse_hours(Some("48")).unwrap(), 48);
        for odd in ["0", "49", "-1", "1.5", "", "six", "99999999999"] {
            assert!(parse_hours(Some(odd)).is_err(), "{odd}");
        }
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
