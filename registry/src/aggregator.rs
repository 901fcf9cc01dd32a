//! The health aggregator: polls `GET {baseUrl}/_rf/health` of every
//! registered instance (with its diagnostics token, if it gave one), judges
//! the answer by the plan's traffic-light thresholds ([`judge`]) and stores
//! each result in `health_checks`, keeping [`RETENTION`] of history and at
//! most [`MAX_CHECKS_PER_INSTANCE`] rows per instance.
//!
//! An instance is not trusted: at most [`MAX_HEALTH_BYTES`] of its answer
//! are read (more is critical, "too large"), at most [`MAX_REASONS`]
//! reasons of at most [`MAX_REASON_CHARS`] characters are stored, no
//! redirect is followed (`crate::access::instance_client`), and a failure
//! is stored as one generic reason: the dashboard and `GET /v1/services`
//! are open reads, and "refused" against "timed out" against "HTTP 401"
//! would make the registry a port scanner of its network for whoever can
//! register a base URL. The precise cause goes to the log
//! ([`Check::detail`]).

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension as _, params};
use serde::Deserialize;

use crate::directory::LastHealth;

/// Largest `/_rf/health` answer read; a larger one is critical.
pub const MAX_HEALTH_BYTES: usize = 64 * 1024;
/// Most reasons stored per check (the rest are counted in one more).
pub const MAX_REASONS: usize = 16;
/// Longest reason stored, in characters (longer ones are cut, marked `…`).
pub const MAX_REASON_CHARS: usize = 300;
/// The reason stored and shown for an instance whose health could not be read.
pub const UNREACHABLE: &str = "unreachable: no health answer (the registry's log says why)";

/// How long health history is kept.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Most health rows kept per instance, whatever the interval.
pub const MAX_CHECKS_PER_INSTANCE: i64 = 2000;
/// How long one `/_rf/health` request may take before the instance counts
/// as unreachable (critical); shorter when the interval is.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(5);

/// Healthy needs an outbox (pending + sending) under this …
pub const HEALTHY_DEPTH: u64 = 50;
/// … and the oldest waiting message younger than this (plan §7.3).
pub const HEALTHY_OLDEST: Duration = Duration::from_secs(30);

/// The dashboard colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Colour {
    /// Green: reachable, says `healthy`, and within [`HEALTHY_DEPTH`] and
    /// [`HEALTHY_OLDEST`].
    Healthy,
    /// Amber: a backlog, or the instance says `warning`.
    Warning,
    /// Red: unreachable, messages that need a human, or the instance says
    /// `critical` (or a status it does not know).
    Critical,
}

impl Colour {
    /// `healthy`, `warning` or `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Colour::Healthy => "healthy",
            Colour::Warning => "warning",
            Colour::Critical => "critical",
        }
    }
}

/// The parts of the runtime's `/_rf/health` answer the aggregator reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteHealth {
    /// The instance's own verdict: `healthy`, `warning` or `critical`
    /// (anything else is judged critical).
    pub status: String,
    /// The instance's reasons for its verdict (bounded by [`judge`]).
    #[serde(default)]
    pub reasons: Vec<String>,
    /// Its outbox's message counts.
    pub outbox: RemoteOutbox,
    /// Its send counters since it started (`None` from a runtime before
    /// them): the aggregator turns two in a row into a rate ([`crate::rollup`]).
    #[serde(default)]
    pub sends: Option<RemoteSends>,
    /// Its decommissioned interface versions (at most
    /// [`MAX_DECOMMISSIONED`] kept).
    #[serde(default)]
    pub decommissioned: Vec<RemoteDecommissioned>,
}

/// Most decommissioned versions stored per check.
pub const MAX_DECOMMISSIONED: usize = 16;
/// Most latency buckets read per check (the runtime has 15).
pub const MAX_LATENCY_BUCKETS: usize = 32;

/// `sends` of `/_rf/health`: counters since the instance started.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteSends {
    /// Messages acknowledged by their receiver.
    #[serde(default)]
    pub sent: u64,
    /// Send attempts timed, send to answer.
    #[serde(default)]
    pub timed: u64,
    /// `[upper bound in µs, attempts at most that long]`, cumulative.
    #[serde(default)]
    pub latency_buckets_micros: Vec<[u64; 2]>,
}

/// One entry of `decommissioned` of `/_rf/health`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteDecommissioned {
    /// The interface, `package.Service`.
    pub interface: String,
    /// The decommissioned version.
    pub version: u32,
    /// Its outbox rows held until it is re-commissioned.
    #[serde(default)]
    pub held: u64,
}

/// `outbox` of `/_rf/health`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteOutbox {
    /// Messages waiting to be sent (first try or retry).
    #[serde(default)]
    pub pending: u64,
    /// Messages a dispatcher is sending now.
    #[serde(default)]
    pub sending: u64,
    /// Messages that must not be sent again automatically (need a human).
    #[serde(default)]
    pub failed: u64,
    /// Messages the receiver refused for good (need a human).
    #[serde(default)]
    pub dead_letter: u64,
    /// Messages whose TTL ran out before delivery (need a human).
    #[serde(default)]
    pub expired: u64,
    /// Age in milliseconds of the oldest pending or sending message; `None`
    /// when there is none.
    #[serde(default)]
    pub oldest_pending_age_ms: Option<i64>,
}

/// One poll's outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// The verdict: the worse of the thresholds' and the instance's own.
    pub colour: Colour,
    /// The answer as read (its reasons bounded); `None` when the instance
    /// could not be read.
    pub health: Option<RemoteHealth>,
    /// What is stored and shown: the instance's reasons plus the
    /// thresholds' where they made the colour worse, or the one generic
    /// failure reason.
    pub reasons: Vec<String>,
    /// Why the instance could not be read, precisely (refused, timeout,
    /// `HTTP 401`, …): for the log only, never stored or shown.
    pub detail: Option<String>,
}

/// Why a poll failed: what is shown, and what is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollError {
    /// Stored and shown: [`UNREACHABLE`], or the too-large sentence.
    pub shown: String,
    /// Logged only.
    pub detail: String,
}

impl PollError {
    fn unreachable(detail: String) -> Self {
        Self {
            shown: UNREACHABLE.to_owned(),
            detail,
        }
    }
}

/// At most `max` characters of `text`, marked `…` when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The instance's own reasons, bounded in count and length.
fn bounded_reasons(reasons: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = reasons
        .iter()
        .take(MAX_REASONS)
        .map(|r| cut(r, MAX_REASON_CHARS))
        .collect();
    if reasons.len() > MAX_REASONS {
        kept.push(format!(
            "… and {} more reason(s)",
            reasons.len() - MAX_REASONS
        ));
    }
    kept
}

/// Polls `target` and judges the answer.
pub async fn check(client: &reqwest::Client, target: &Target) -> Check {
    match poll(client, target).await {
        Ok(health) => judge(Ok(health)),
        Err(error) => Check {
            detail: Some(error.detail),
            ..judge(Err(error.shown))
        },
    }
}

/// The colour of an instance by the plan's thresholds (§7.3):
/// critical when it cannot be reached or has dead letters (or any other
/// message that needs a human: failed, expired) or says so itself;
/// healthy when its outbox is under [`HEALTHY_DEPTH`] and the oldest
/// waiting message under [`HEALTHY_OLDEST`] and it says `healthy`;
/// warning otherwise (the runtime itself turns `warning` at 500 messages
/// or 2 minutes).
pub fn judge(answer: Result<RemoteHealth, String>) -> Check {
    let health = match answer {
        Ok(health) => health,
        Err(error) => {
            return Check {
                colour: Colour::Critical,
                health: None,
                reasons: vec![cut(&error, MAX_REASON_CHARS)],
                detail: None,
            };
        }
    };
    let mut health = health;
    health.reasons = bounded_reasons(&health.reasons);
    health.status = cut(&health.status, 32);
    health.decommissioned.truncate(MAX_DECOMMISSIONED);
    for version in &mut health.decommissioned {
        version.interface = cut(&version.interface, MAX_REASON_CHARS);
    }
    if let Some(sends) = &mut health.sends {
        sends.latency_buckets_micros.truncate(MAX_LATENCY_BUCKETS);
    }
    let outbox = &health.outbox;
    let mut reasons = health.reasons.clone();
    let reported = match health.status.as_str() {
        "healthy" => Colour::Healthy,
        "warning" => Colour::Warning,
        "critical" => Colour::Critical,
        other => {
            reasons.push(format!("unknown health status `{other}`"));
            Colour::Critical
        }
    };
    // The plan's thresholds; their reasons are added only where they make
    // the colour worse than the service's own (which has said the rest).
    let mut own = Vec::new();
    let mut colour = Colour::Healthy;
    let attention = outbox.failed + outbox.dead_letter + outbox.expired;
    if attention > 0 {
        colour = Colour::Critical;
        own.push(format!(
            "{attention} message(s) need attention ({} dead letter(s))",
            outbox.dead_letter
        ));
    }
    let depth = outbox.pending + outbox.sending;
    if depth >= HEALTHY_DEPTH {
        colour = colour.max(Colour::Warning);
        own.push(format!(
            "outbox depth {depth} (healthy under {HEALTHY_DEPTH})"
        ));
    }
    if let Some(age) = outbox.oldest_pending_age_ms
        && age >= HEALTHY_OLDEST.as_millis() as i64
    {
        colour = colour.max(Colour::Warning);
        own.push(format!(
            "oldest waiting message {} s old (healthy under {} s)",
            age / 1000,
            HEALTHY_OLDEST.as_secs()
        ));
    }
    if colour > reported {
        reasons.extend(own);
    }
    let colour = colour.max(reported);
    reasons.dedup();
    Check {
        colour,
        health: Some(health),
        reasons,
        detail: None,
    }
}

/// An instance to poll.
#[derive(Debug, Clone)]
pub struct Target {
    /// The instance id ([`crate::directory::instance_id`]).
    pub instance_id: String,
    /// Its registered base URL; the poll asks `{base_url}/_rf/health`.
    pub base_url: String,
    /// Its diagnostics bearer token, sent with the poll when it gave one.
    pub token: Option<String>,
}

/// Every registered instance.
pub fn targets(conn: &Connection) -> rusqlite::Result<Vec<Target>> {
    let mut statement = conn.prepare(
        "SELECT instance_id, base_url, diagnostics_token FROM instances ORDER BY instance_id",
    )?;
    statement.query_map([], Target::of_row)?.collect()
}

impl Target {
    /// A target of a row `instance_id, base_url, diagnostics_token`.
    pub(crate) fn of_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            instance_id: row.get(0)?,
            base_url: row.get(1)?,
            token: row.get(2)?,
        })
    }
}

/// Asks one instance; any failure (refused, timeout, non-2xx, a redirect,
/// not the runtime's JSON) is [`UNREACHABLE`] with its detail, an answer
/// over [`MAX_HEALTH_BYTES`] says so.
pub async fn poll(client: &reqwest::Client, target: &Target) -> Result<RemoteHealth, PollError> {
    let mut request = client.get(format!("{}/_rf/health", target.base_url));
    if let Some(token) = &target.token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|error| {
        PollError::unreachable(if error.is_timeout() {
            "timed out asking /_rf/health".to_owned()
        } else if error.is_connect() {
            "connection refused or unreachable".to_owned()
        } else {
            format!("cannot ask /_rf/health: {error}")
        })
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(PollError::unreachable(format!(
            "/_rf/health answered HTTP {}",
            status.as_u16()
        )));
    }
    let body = read_bounded(response, MAX_HEALTH_BYTES)
        .await
        .map_err(|error| match error {
            BoundedRead::TooLarge => PollError {
                shown: format!(
                    "the health answer is larger than {} KiB",
                    MAX_HEALTH_BYTES / 1024
                ),
                detail: format!("/_rf/health answered over {MAX_HEALTH_BYTES} bytes"),
            },
            BoundedRead::Failed(detail) => {
                PollError::unreachable(format!("reading /_rf/health: {detail}"))
            }
        })?;
    serde_json::from_slice(&body).map_err(|e| {
        PollError::unreachable(format!(
            "/_rf/health answered something else than health JSON: {}",
            cut(&e.to_string(), MAX_REASON_CHARS)
        ))
    })
}

/// Why [`read_bounded`] stopped.
#[derive(Debug)]
pub(crate) enum BoundedRead {
    TooLarge,
    Failed(String),
}

/// The body of `response`, at most `limit` bytes: reading stops (and the
/// connection is dropped) at the first byte beyond, or at once when the
/// stated length is larger.
pub(crate) async fn read_bounded(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BoundedRead> {
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(BoundedRead::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BoundedRead::Failed(e.to_string()))?
    {
        if body.len() + chunk.len() > limit {
            return Err(BoundedRead::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Stores one check, prunes the history and updates the dashboard's
/// pre-aggregated state ([`crate::rollup`]); returns the colour of the
/// instance's check before this one (`None` for its first).
pub fn record(
    conn: &Connection,
    instance_id: &str,
    check: &Check,
    now_ms: i64,
) -> rusqlite::Result<Option<String>> {
    let outbox = check.health.as_ref().map(|h| &h.outbox);
    conn.execute(
        "INSERT INTO health_checks (instance_id, checked_at, colour, reported, depth, \
         dead_letter, attention, oldest_pending_age_ms, reasons) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            instance_id,
            now_ms,
            check.colour.as_str(),
            check.health.as_ref().map(|h| h.status.clone()),
            outbox.map(|o| (o.pending + o.sending) as i64),
            outbox.map(|o| o.dead_letter as i64),
            outbox.map(|o| (o.failed + o.dead_letter + o.expired) as i64),
            outbox.and_then(|o| o.oldest_pending_age_ms),
            serde_json::to_string(&check.reasons).unwrap_or_else(|_| "[]".into()),
        ],
    )?;
    conn.execute(
        // Older than the retention, or older than the newest MAX rows (read
        // through the (instance_id, checked_at) index).
        "DELETE FROM health_checks WHERE instance_id = ?1 AND (checked_at < ?2 OR checked_at < \
         (SELECT checked_at FROM health_checks WHERE instance_id = ?1 \
          ORDER BY checked_at DESC LIMIT 1 OFFSET ?3 - 1))",
        params![
            instance_id,
            now_ms - RETENTION.as_millis() as i64,
            MAX_CHECKS_PER_INSTANCE
        ],
    )?;
    crate::rollup::apply(conn, instance_id, check, now_ms)
}

/// The latest check of an instance (one row read, [`crate::rollup`]).
pub fn last_health(conn: &Connection, instance_id: &str) -> rusqlite::Result<Option<LastHealth>> {
    conn.query_row(
        "SELECT colour, reported, checked_at, depth, dead_letter, attention, \
         oldest_pending_age_ms, reasons FROM instance_health WHERE instance_id = ?1",
        params![instance_id],
        |row| {
            let reasons: String = row.get(7)?;
            Ok(LastHealth {
                status: row.get(0)?,
                reported: row.get(1)?,
                checked_at: crate::store::rfc3339(row.get(2)?),
                outbox_depth: row.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                dead_letter: row.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                attention: row.get::<_, Option<i64>>(5)?.map(|v| v as u64),
                oldest_pending_age_ms: row.get(6)?,
                reasons: serde_json::from_str(&reasons).unwrap_or_default(),
            })
        },
    )
    .optional()
}

/// One point of a sparkline: when, the outbox depth (`None` when
/// unreachable) and the colour.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// When it was checked, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Outbox depth (pending + sending); `None` when unreachable.
    pub depth: Option<u64>,
    /// `healthy`, `warning` or `critical` ([`Colour::as_str`]).
    pub colour: String,
}

/// The checks of an instance since `since_ms`, oldest first.
pub fn history(
    conn: &Connection,
    instance_id: &str,
    since_ms: i64,
) -> rusqlite::Result<Vec<Point>> {
    let mut statement = conn.prepare_cached(
        "SELECT checked_at, depth, colour FROM health_checks \
         WHERE instance_id = ?1 AND checked_at >= ?2 ORDER BY id",
    )?;
    statement
        .query_map(params![instance_id, since_ms], |row| {
            Ok(Point {
                at_ms: row.get(0)?,
                depth: row.get::<_, Option<i64>>(1)?.map(|v| v as u64),
                colour: row.get(2)?,
            })
        })?
        .collect()
}

/// The request timeout for `interval`: at most [`MAX_TIMEOUT`], and under
/// the interval so one round ends before the next.
pub fn timeout_for(interval: Duration) -> Duration {
    interval
        .mul_f32(0.8)
        .clamp(Duration::from_millis(200), MAX_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(
        status: &str,
        pending: u64,
        oldest_s: i64,
        dead: u64,
    ) -> Result<RemoteHealth, String> {
        Ok(RemoteHealth {
            status: status.to_owned(),
            reasons: Vec::new(),
            outbox: RemoteOutbox {
                pending,
                dead_letter: dead,
                oldest_pending_age_ms: Some(oldest_s * 1000),
                ..RemoteOutbox::default()
            },
            ..RemoteHealth::default()
        })
    }

    #[test]
    fn colours_follow_the_plan_thresholds() {
        let colour = |answer| judge(answer).colour;
        assert_eq!(colour(reported("healthy", 49, 29, 0)), Colour::Healthy);
        assert_eq!(colour(reported("healthy", 50, 0, 0)), Colour::Warning);
        assert_eq!(colour(reported("healthy", 0, 30, 0)), Colour::Warning);
        assert_eq!(colour(reported("warning", 501, 0, 0)), Colour::Warning);
        assert_eq!(colour(reported("healthy", 0, 0, 1)), Colour::Critical);
        // The service's own verdict is never softened.
        assert_eq!(colour(reported("warning", 0, 0, 0)), Colour::Warning);
        assert_eq!(colour(reported("critical", 0, 0, 0)), Colour::Critical);
        assert_eq!(colour(reported("sideways", 0, 0, 0)), Colour::Critical);
        assert_eq!(colour(Err("connection refused".into())), Colour::Critical);
        // Own reasons only where they make it worse.
        assert_eq!(judge(reported("healthy", 60, 0, 0)).reasons.len(), 1);
        assert!(judge(reported("warning", 60, 0, 0)).reasons.is_empty());
    }

    #[test]
    fn history_is_bounded_per_instance() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = crate::store::open(&dir.path().join("r.db")).expect("open");
        conn.execute(
            "INSERT INTO instances (instance_id, service, base_url, registered_at, last_seen_at) \
             VALUES ('a', 's', 'http://x', 0, 0)",
            [],
        )
        .expect("instance");
        let check = judge(reported("healthy", 1, 0, 0));
        let now = 10 * RETENTION.as_millis() as i64;
        // One row older than the retention, then more than the cap.
        record(&conn, "a", &check, now - RETENTION.as_millis() as i64 - 1).expect("old");
        // One transaction: a commit per row would make this test slow.
        conn.execute_batch("BEGIN").expect("begin");
        for i in 0..MAX_CHECKS_PER_INSTANCE + 10 {
            record(&conn, "a", &check, now + i).expect("record");
        }
        conn.execute_batch("COMMIT").expect("commit");
        let (rows, oldest): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), MIN(checked_at) FROM health_checks",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .expect("count");
        assert_eq!(rows, MAX_CHECKS_PER_INSTANCE);
        assert_eq!(oldest, now + 10);
    }
}
