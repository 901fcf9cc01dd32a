//! Diagnostics: what an operator asks a running service, as an axum router.
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /_rf/health` | traffic light `healthy` / `warning` / `critical` with its reasons and the outbox counts |
//! | `GET /_rf/outbox/stats` | rows per status, per destination, oldest pending age, last send |
//! | `GET /_rf/outbox/failed` | messages that need a human (`Failed`, `DeadLetter`, `Expired`), metadata only |
//! | `POST /_rf/outbox/{messageId}/retry` | puts one such message back to `Pending` |
//! | `POST /_rf/outbox/retry` | the same for every one matching `?status=` and `?destination=` |
//! | `GET /_rf/inbox/stats` | inbox size, processed and duplicate counts, duplicate rate |
//! | `GET /_rf/metrics` | Prometheus text format ([`crate::metrics`]) |
//! | `GET /_rf/livez` | 200 while the process answers (no token needed) |
//! | `GET /_rf/readyz` | 200 when the database takes a write transaction, its schema is current and the dispatcher and receiver writer run; else 503 naming what failed (no token needed) |
//!
//! Payloads are never shown (they may hold personal data): the failed list
//! gives ids, routing, status, retries and the last error. Errors have the
//! wire's body `{"error": code, "message": text}` with the codes of
//! [`DiagnosticsError`]. Set [`DiagnosticsBuilder::bearer_token`] to require
//! `Authorization: Bearer <token>` on every route ([`crate::auth`]: any case
//! of the scheme; an empty token refuses everything); without it, the routes
//! that change state (the retries) answer 403 `token_required` and the
//! read-only ones answer anyone, so serve the router on an internal address
//! only.
//!
//! Every query runs on the blocking pool against one connection of its own,
//! and reads only through the partial indexes of [`crate::db`], so a large
//! table of `Sent` rows does not slow the health check down.
//!
//! **Both stores.** [`Diagnostics::builder`] serves a SQLite file,
//! `Diagnostics::postgres` (cargo feature `postgres`) a PostgreSQL database,
//! and [`Diagnostics::builder_for`] either. The statements sit behind a
//! store trait (`DiagnosticsStore`, here for SQLite and in `pg/diagnostics.rs`
//! for PostgreSQL) that returns raw rows; what the routes make of them (the
//! counts, the gauges, the filters, the retry errors) is written once, here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::circuit::{Circuits, DestinationState};
use crate::config::Config;
use crate::db::{self, DbError};
use crate::envelope::ErrorBody;
use crate::liveness::Liveness;
use crate::metrics::{DestinationGauges, Gauges, Metrics};
use crate::outbox::{Outbox, Status};
use crate::store::Database;

/// The statuses that need a human; the only ones a retry accepts.
const ATTENTION: [Status; 3] = [Status::Failed, Status::DeadLetter, Status::Expired];

/// Most rows one `GET /_rf/outbox/failed` returns.
pub const MAX_LIST_LIMIT: u32 = 1000;

/// When `GET /_rf/health` turns from `healthy` to `warning`. Any `Failed`,
/// `DeadLetter` or `Expired` row makes it `critical`: a message is not
/// getting through, and only a human can decide what to do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthThresholds {
    /// Pending + sending rows at or above this are a backlog (default 500).
    pub backlog: u64,
    /// A pending row older than this is a stuck peer (default 2 minutes).
    pub oldest_pending_age: Duration,
}

impl Default for HealthThresholds {
    fn default() -> Self {
        Self {
            backlog: 500,
            oldest_pending_age: Duration::from_secs(120),
        }
    }
}

/// A refused diagnostics request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiagnosticsError {
    /// 401 `unauthorized`: the bearer token is missing or wrong.
    #[error("a valid `Authorization: Bearer` token is required")]
    Unauthorized,
    /// 403 `token_required`: a route that changes state (a retry) on
    /// diagnostics built without a token.
    #[error(
        "this route changes state and the service has no diagnostics token; configure one \
         (DiagnosticsBuilder::bearer_token, --ops-token on the demo services) to use it"
    )]
    TokenRequired,
    /// 400 `bad_request`: a malformed id or query parameter.
    #[error("{0}")]
    BadRequest(String),
    /// 404 `not_found`: no outbox message has this id.
    #[error("no outbox message `{0}`")]
    NotFound(String),
    /// 409 `not_retryable`: the message is not `Failed`, `DeadLetter` or `Expired`.
    #[error(
        "message `{message_id}` is {status:?}; only Failed, DeadLetter and Expired messages can be retried"
    )]
    NotRetryable { message_id: String, status: Status },
    /// 503 `unavailable`: the database could not be read (locked, corrupt, gone).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// 405 `method_not_allowed`: e.g. `DELETE /_rf/health`.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
}

impl DiagnosticsError {
    pub fn status(&self) -> StatusCode {
        match self {
            DiagnosticsError::Unauthorized => StatusCode::UNAUTHORIZED,
            DiagnosticsError::TokenRequired => StatusCode::FORBIDDEN,
            DiagnosticsError::BadRequest(_) => StatusCode::BAD_REQUEST,
            DiagnosticsError::NotFound(_) => StatusCode::NOT_FOUND,
            DiagnosticsError::NotRetryable { .. } => StatusCode::CONFLICT,
            DiagnosticsError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            DiagnosticsError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The `error` member of the body.
    pub fn code(&self) -> &'static str {
        match self {
            DiagnosticsError::Unauthorized => "unauthorized",
            DiagnosticsError::TokenRequired => "token_required",
            DiagnosticsError::BadRequest(_) => "bad_request",
            DiagnosticsError::NotFound(_) => "not_found",
            DiagnosticsError::NotRetryable { .. } => "not_retryable",
            DiagnosticsError::Unavailable(_) => "unavailable",
            DiagnosticsError::MethodNotAllowed { .. } => "method_not_allowed",
        }
    }
}

impl IntoResponse for DiagnosticsError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
        };
        let mut response = (self.status(), Json(body)).into_response();
        if matches!(self, DiagnosticsError::Unauthorized) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<rusqlite::Error> for DiagnosticsError {
    fn from(error: rusqlite::Error) -> Self {
        DiagnosticsError::Unavailable(error.to_string())
    }
}

/// Outbox rows of one destination, by status (only statuses with rows).
pub type StatusCounts = BTreeMap<Status, u64>;

/// `GET /_rf/outbox/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxStats {
    pub pending: u64,
    pub sending: u64,
    /// Kept `Sent` rows (up to `outbox.sent_retention`). Counting them reads
    /// the whole `outbox_sent` index, so only `GET /_rf/outbox/stats` does;
    /// the health check leaves it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<u64>,
    pub failed: u64,
    pub dead_letter: u64,
    pub expired: u64,
    /// Age of the oldest `Pending` or `Sending` row, if any.
    pub oldest_pending_age_ms: Option<i64>,
    /// When the last message was acknowledged (RFC 3339), if any is kept.
    pub last_sent_at: Option<String>,
    /// Unsent rows per destination (`Sent` rows are not broken down).
    pub destinations: BTreeMap<String, StatusCounts>,
}

impl OutboxStats {
    /// Rows that need a human.
    pub fn attention(&self) -> u64 {
        self.failed + self.dead_letter + self.expired
    }
}

/// The traffic light of `GET /_rf/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Healthy,
    Warning,
    Critical,
}

/// `GET /_rf/health`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub status: HealthStatus,
    /// Why the status is not `healthy`, one sentence each.
    pub reasons: Vec<String>,
    pub outbox: OutboxStats,
    /// What the dispatcher knows of each destination: circuit open or
    /// closed, batch limit, clock problems (empty without an outbox).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<DestinationState>,
    /// Interface versions decommissioned on this service, with their held
    /// outbox rows ([`crate::lifecycle`]); left out when none is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decommissioned: Vec<DecommissionedVersion>,
}

/// One decommissioned interface version in `GET /_rf/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecommissionedVersion {
    pub interface: String,
    pub version: u32,
    /// When the registry's command decommissioned it (RFC 3339).
    pub decommissioned_at: String,
    /// Its outbox rows held (`Pending`, not sent) until it is re-commissioned.
    pub held: u64,
}

/// Adds the decommissioned versions to `health`; held rows turn a healthy
/// service to `warning`, with a reason per version.
pub fn with_decommissioned(mut health: Health, versions: Vec<DecommissionedVersion>) -> Health {
    for version in &versions {
        if version.held > 0 {
            health.reasons.push(format!(
                "{} v{} is decommissioned: {} outbox message(s) held until it is re-commissioned",
                version.interface, version.version, version.held
            ));
            if health.status == HealthStatus::Healthy {
                health.status = HealthStatus::Warning;
            }
        }
    }
    health.decommissioned = versions;
    health
}

/// One message of `GET /_rf/outbox/failed`: everything but the payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttentionMessage {
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub message_type: String,
    pub destination: String,
    pub interface: String,
    pub version: u32,
    pub endpoint: String,
    pub status: Status,
    pub retry_count: u32,
    pub max_retries: u32,
    pub last_error: Option<String>,
    pub created_at: String,
    pub last_attempt_at: Option<String>,
    pub expires_at: String,
}

/// `GET /_rf/inbox/stats`. The counts are this process's since it started.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxStats {
    /// Rows in the inbox now.
    pub size: u64,
    pub processed: u64,
    pub duplicates: u64,
    /// `duplicates / (processed + duplicates)`; 0 before the first delivery.
    pub duplicate_rate: f64,
    pub signature_failures: u64,
    pub rejected: u64,
}

/// One (destination, status) group of undelivered outbox rows, as a store
/// reads it: the raw material of [`OutboxStats`] and [`DestinationGauges`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnsentGroup {
    pub destination: String,
    pub status: Status,
    pub rows: u64,
    /// `created_at` of the group's oldest row (ms).
    pub oldest_created_at: i64,
}

/// One row of the failed list as a store reads it (times in ms); made into
/// an [`AttentionMessage`] in one place.
#[derive(Debug, Clone)]
pub(crate) struct AttentionRow {
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub message_type: String,
    pub destination: String,
    pub interface: String,
    pub version: i64,
    pub endpoint: String,
    pub status: String,
    pub retry_count: i64,
    pub max_retries: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub last_attempt_at: Option<i64>,
    pub expires_at: i64,
}

impl From<AttentionRow> for AttentionMessage {
    fn from(row: AttentionRow) -> Self {
        let small = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        AttentionMessage {
            message_id: row.message_id,
            correlation_id: row.correlation_id,
            message_type: row.message_type,
            destination: row.destination,
            interface: row.interface,
            version: small(row.version),
            endpoint: row.endpoint,
            status: Status::parse(&row.status).unwrap_or(Status::Failed),
            retry_count: small(row.retry_count),
            max_retries: small(row.max_retries),
            last_error: row.last_error,
            created_at: rfc3339(row.created_at),
            last_attempt_at: row.last_attempt_at.map(rfc3339),
            expires_at: rfc3339(row.expires_at),
        }
    }
}

/// The statements behind the diagnostics routes, one implementation per
/// store: SQLite below (on `rusqlite::Connection`), PostgreSQL in
/// `crate::pg::diagnostics`. Synchronous: the routes call it on the blocking
/// pool, one call at a time per connection. Each method reads or writes raw
/// rows; what the routes make of them (the folding into [`OutboxStats`] and
/// [`DestinationGauges`], the filters, the retry errors) is written once,
/// in this module, for both.
pub(crate) trait DiagnosticsStore {
    /// Every (destination, status) group of rows not `Sent`, read through
    /// the partial indexes `outbox_due` and `outbox_attention` only.
    fn unsent_groups(&self) -> Result<Vec<UnsentGroup>, DiagnosticsError>;
    /// `sent_at` of the last acknowledged row kept (one index look-up).
    fn last_sent_at(&self) -> Result<Option<i64>, DiagnosticsError>;
    /// Kept `Sent` rows (a scan of the `outbox_sent` index).
    fn sent_count(&self) -> Result<u64, DiagnosticsError>;
    /// `Failed`, `DeadLetter` and `Expired` rows matching the filter,
    /// oldest first, at most `limit`.
    fn attention_rows(
        &self,
        status: Option<Status>,
        destination: Option<&str>,
        limit: u32,
    ) -> Result<Vec<AttentionRow>, DiagnosticsError>;
    /// Puts `message_id` back to `Pending` if it needs a human: due at
    /// `now_ms`, retry count 0, expiring no earlier than `renew_until_ms`.
    /// Returns the rows changed (0 or 1).
    fn retry_one(
        &self,
        message_id: &str,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError>;
    /// The status of `message_id`, if the row exists.
    fn status_of(&self, message_id: &str) -> Result<Option<String>, DiagnosticsError>;
    /// [`retry_one`](Self::retry_one) for every row needing a human that
    /// matches the filter.
    fn retry_matching(
        &self,
        status: Option<Status>,
        destination: Option<&str>,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError>;
    /// Rows needing a human, matching the filter (and `message_id`), created
    /// before `before_ms`.
    fn count_older(
        &self,
        message_id: Option<&str>,
        status: Option<Status>,
        destination: Option<&str>,
        before_ms: i64,
    ) -> Result<usize, DiagnosticsError>;
    /// Rows in the inbox.
    fn inbox_size(&self) -> Result<u64, DiagnosticsError>;
    /// `rf_decommissioned` with each version's held rows: (interface,
    /// version, decommissioned at, held).
    fn decommissioned(&self) -> Result<Vec<(String, i64, i64, i64)>, DiagnosticsError>;
    /// The `database` and `migrations` checks of `GET /_rf/readyz`, each
    /// `"ok"` or why not, answered within the readiness timeout.
    fn database_checks(&self) -> BTreeMap<String, String>;
}

/// The decommissioned versions and their held rows (the same SQL on both
/// stores; `4611686018427387904` is [`crate::lifecycle::HELD_DUE_MS`]).
pub(crate) const DECOMMISSIONED_SQL: &str = "SELECT d.interface, d.version, d.decommissioned_at, \
     (SELECT COUNT(*) FROM outbox_messages o WHERE o.status IN ('Pending', 'Sending') \
      AND o.status = 'Pending' AND o.next_retry_at >= 4611686018427387904 \
      AND o.interface = d.interface AND o.version = d.version) \
     FROM rf_decommissioned d ORDER BY d.interface, d.version";

/// The outbox counts, read through the partial indexes only, with the
/// number of kept `Sent` rows (which costs a scan of their index).
pub fn outbox_stats(conn: &Connection, now_ms: i64) -> rusqlite::Result<OutboxStats> {
    let mut stats = unsent_stats(conn, now_ms)?;
    stats.sent = Some(sqlite::sent_count(conn)?);
    Ok(stats)
}

/// The outbox counts except `Sent`: every row that is not delivered yet,
/// and the time of the last delivery. Its cost does not grow with the
/// number of kept `Sent` rows; the health check uses it.
pub fn unsent_stats(conn: &Connection, now_ms: i64) -> rusqlite::Result<OutboxStats> {
    Ok(fold_unsent(
        sqlite::unsent_groups(conn)?,
        sqlite::last_sent_at(conn)?,
        now_ms,
    ))
}

/// [`outbox_stats`] on any store.
fn outbox_stats_in(
    store: &dyn DiagnosticsStore,
    now_ms: i64,
) -> Result<OutboxStats, DiagnosticsError> {
    let mut stats = unsent_stats_in(store, now_ms)?;
    stats.sent = Some(store.sent_count()?);
    Ok(stats)
}

/// [`unsent_stats`] on any store.
fn unsent_stats_in(
    store: &dyn DiagnosticsStore,
    now_ms: i64,
) -> Result<OutboxStats, DiagnosticsError> {
    Ok(fold_unsent(
        store.unsent_groups()?,
        store.last_sent_at()?,
        now_ms,
    ))
}

/// The one folding of the (destination, status) groups into the counts.
fn fold_unsent(groups: Vec<UnsentGroup>, last_sent: Option<i64>, now_ms: i64) -> OutboxStats {
    let mut stats = OutboxStats::default();
    let mut oldest_pending: Option<i64> = None;
    for group in groups {
        if matches!(group.status, Status::Pending | Status::Sending) {
            let oldest = group.oldest_created_at;
            oldest_pending = Some(oldest_pending.map_or(oldest, |o| o.min(oldest)));
        }
        if let Some(total) = status_total(&mut stats, group.status) {
            *total += group.rows;
        }
        *stats
            .destinations
            .entry(group.destination)
            .or_default()
            .entry(group.status)
            .or_default() += group.rows;
    }
    stats.last_sent_at = last_sent.map(rfc3339);
    stats.oldest_pending_age_ms = oldest_pending.map(|created| (now_ms - created).max(0));
    stats
}

/// The counter of an unsent status (`Sent` rows are counted on their own).
fn status_total(stats: &mut OutboxStats, status: Status) -> Option<&mut u64> {
    Some(match status {
        Status::Pending => &mut stats.pending,
        Status::Sending => &mut stats.sending,
        Status::Sent => return None,
        Status::Failed => &mut stats.failed,
        Status::DeadLetter => &mut stats.dead_letter,
        Status::Expired => &mut stats.expired,
    })
}

/// The traffic light for `stats`.
pub fn health(stats: OutboxStats, thresholds: HealthThresholds) -> Health {
    let mut reasons = Vec::new();
    let mut status = HealthStatus::Healthy;
    if stats.attention() > 0 {
        status = HealthStatus::Critical;
        reasons.push(format!(
            "{} outbox message(s) need attention ({} failed, {} dead-lettered, {} expired); \
             see GET /_rf/outbox/failed",
            stats.attention(),
            stats.failed,
            stats.dead_letter,
            stats.expired
        ));
    }
    let backlog = stats.pending + stats.sending;
    let mut warn = |reason: String| {
        if status == HealthStatus::Healthy {
            status = HealthStatus::Warning;
        }
        reasons.push(reason);
    };
    if backlog >= thresholds.backlog {
        warn(format!(
            "{backlog} outbox message(s) waiting (threshold {})",
            thresholds.backlog
        ));
    }
    if let Some(age) = stats.oldest_pending_age_ms
        && age >= thresholds.oldest_pending_age.as_millis() as i64
    {
        warn(format!(
            "the oldest waiting message is {} old (threshold {})",
            crate::duration::format_duration(Duration::from_millis(age as u64)),
            crate::duration::format_duration(thresholds.oldest_pending_age),
        ));
    }
    Health {
        status,
        reasons,
        outbox: stats,
        destinations: Vec::new(),
        decommissioned: Vec::new(),
    }
}

/// Adds what the dispatcher knows of its destinations to `health`: an
/// unreachable destination (circuit open) and a clock problem each turn a
/// healthy service to `warning`, with a reason.
pub fn with_destinations(mut health: Health, states: Vec<DestinationState>) -> Health {
    let now = db::now_ms();
    for state in &states {
        if let Some(since) = state.open_since_ms {
            health.reasons.push(format!(
                "destination `{}` unreachable for {} (circuit open, probing): {}",
                state.destination,
                crate::duration::format_duration(
                    Duration::from_millis((now - since).max(0) as u64)
                ),
                state.last_problem.as_deref().unwrap_or("no answer")
            ));
        }
        if let Some(problem) = &state.clock_problem {
            health
                .reasons
                .push(format!("destination `{}`: {problem}", state.destination));
        }
        if (state.open_since_ms.is_some() || state.clock_problem.is_some())
            && health.status == HealthStatus::Healthy
        {
            health.status = HealthStatus::Warning;
        }
    }
    health.destinations = states;
    health
}

/// Filters of the failed list and of the bulk retry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionFilter {
    /// One of `Failed`, `DeadLetter`, `Expired`; all three when absent.
    pub status: Option<String>,
    pub destination: Option<String>,
    /// At most this many rows (default 100, at most [`MAX_LIST_LIMIT`]).
    pub limit: Option<u32>,
}

impl AttentionFilter {
    fn status(&self) -> Result<Option<Status>, DiagnosticsError> {
        let Some(text) = &self.status else {
            return Ok(None);
        };
        ATTENTION
            .into_iter()
            .find(|status| status.as_str() == text)
            .map(Some)
            .ok_or_else(|| {
                DiagnosticsError::BadRequest(format!(
                    "status `{text}` is not one of Failed, DeadLetter, Expired"
                ))
            })
    }
}

/// The messages that need a human, oldest first.
pub fn attention_messages(
    conn: &Connection,
    filter: &AttentionFilter,
) -> Result<Vec<AttentionMessage>, DiagnosticsError> {
    attention_messages_in(conn, filter)
}

/// [`attention_messages`] on any store.
fn attention_messages_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
) -> Result<Vec<AttentionMessage>, DiagnosticsError> {
    let limit = filter.limit.unwrap_or(100).clamp(1, MAX_LIST_LIMIT);
    Ok(store
        .attention_rows(filter.status()?, filter.destination.as_deref(), limit)?
        .into_iter()
        .map(AttentionMessage::from)
        .collect())
}

/// Puts one `Failed`, `DeadLetter` or `Expired` message back to `Pending`,
/// due now, with its retry count reset and its TTL renewed from now.
pub fn retry_message(
    conn: &Connection,
    message_id: &Uuid,
    ttl: Duration,
    now_ms: i64,
) -> Result<(), DiagnosticsError> {
    retry_message_in(conn, message_id, ttl, now_ms)
}

/// [`retry_message`] on any store.
fn retry_message_in(
    store: &dyn DiagnosticsStore,
    message_id: &Uuid,
    ttl: Duration,
    now_ms: i64,
) -> Result<(), DiagnosticsError> {
    let id = message_id.to_string();
    if store.retry_one(&id, now_ms, renewed_expiry(now_ms, ttl))? == 1 {
        return Ok(());
    }
    match store.status_of(&id)?.as_deref().and_then(Status::parse) {
        None => Err(DiagnosticsError::NotFound(id)),
        Some(status) => Err(DiagnosticsError::NotRetryable {
            message_id: id,
            status,
        }),
    }
}

/// [`retry_message`] for every message matching `filter` (its `limit` is
/// ignored); returns how many were put back.
pub fn retry_matching(
    conn: &Connection,
    filter: &AttentionFilter,
    ttl: Duration,
    now_ms: i64,
) -> Result<usize, DiagnosticsError> {
    retry_matching_in(conn, filter, ttl, now_ms)
}

/// [`retry_matching`] on any store.
fn retry_matching_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
    ttl: Duration,
    now_ms: i64,
) -> Result<usize, DiagnosticsError> {
    store.retry_matching(
        filter.status()?,
        filter.destination.as_deref(),
        now_ms,
        renewed_expiry(now_ms, ttl),
    )
}

/// The expiry of a message retried by hand at `now_ms`: a full TTL from now.
fn renewed_expiry(now_ms: i64, ttl: Duration) -> i64 {
    now_ms.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
}

fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| ms.to_string())
}

/// Builds a [`Diagnostics`]; see [`Diagnostics::builder`].
pub struct DiagnosticsBuilder {
    database: Database,
    metrics: Arc<Metrics>,
    wake: Option<Arc<Notify>>,
    circuits: Option<Arc<Circuits>>,
    dedup_horizon: Duration,
    ttl: Duration,
    token: Option<String>,
    thresholds: HealthThresholds,
    destinations: Vec<String>,
    outbox: Option<Outbox>,
    workers: Vec<(String, Liveness)>,
    readiness_timeout: Duration,
}

impl DiagnosticsBuilder {
    /// Takes the outbox's metrics and TTL, and wakes its dispatcher when a
    /// message is retried by hand.
    pub fn outbox(mut self, outbox: &Outbox) -> Self {
        self.metrics = Arc::clone(outbox.metrics());
        self.wake = Some(outbox.wake_handle());
        self.circuits = Some(Arc::clone(outbox.circuits()));
        self.ttl = outbox.config().outbox.ttl;
        let inbox = &outbox.config().inbox;
        self.dedup_horizon = inbox.retention.saturating_sub(inbox.signature_tolerance);
        self.destinations = outbox.config().destinations.keys().cloned().collect();
        self.outbox = Some(outbox.clone());
        self
    }

    /// `GET /_rf/readyz` also checks that the receiver's writer thread runs.
    /// (With [`outbox`](Self::outbox), it checks the dispatcher started on
    /// that outbox: none started is not ready.)
    pub fn receiver(self, receiver: &crate::receiver::Receiver) -> Self {
        self.worker("receiver_writer", receiver.liveness())
    }

    /// `GET /_rf/readyz` also checks this worker, reported under `name`.
    pub fn worker(mut self, name: impl Into<String>, liveness: Liveness) -> Self {
        self.workers.push((name.into(), liveness));
        self
    }

    /// How long `GET /_rf/readyz` waits for the database before it answers
    /// 503 (default 1 s; a probe must answer quickly): on SQLite, for the
    /// write lock; on PostgreSQL, for a new connection and for each of its
    /// statements (`statement_timeout`).
    pub fn readiness_timeout(mut self, timeout: Duration) -> Self {
        self.readiness_timeout = timeout;
        self
    }

    /// The counters `GET /_rf/metrics` and `GET /_rf/inbox/stats` report
    /// (share one `Arc<Metrics>` between the outbox and the receiver).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Requires `Authorization: Bearer <token>` on every route.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn thresholds(mut self, thresholds: HealthThresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// Opens the database (creating and migrating it if needed). On
    /// PostgreSQL, an unreachable server or a wrong URL is
    /// `DbError::Postgres`, naming the host and the cause.
    pub fn build(self) -> Result<Diagnostics, DbError> {
        let (conn, ready_conn) = match &self.database {
            Database::Sqlite(path) => {
                let conn = db::open(path, crate::config::Durability::Normal)?;
                // A connection of its own, so a probe never queues behind a
                // slow diagnostics query, with a short busy timeout.
                let ready_conn = db::open(path, crate::config::Durability::Normal)?;
                ready_conn
                    .busy_timeout(self.readiness_timeout)
                    .map_err(|source| DbError::Sqlite {
                        path: path.display().to_string(),
                        source,
                    })?;
                (Box::new(conn) as StoreBox, Box::new(ready_conn) as StoreBox)
            }
            #[cfg(feature = "postgres")]
            Database::Postgres(url) => {
                let (conn, ready_conn) = crate::pg::diagnostics::open(url, self.readiness_timeout)?;
                (Box::new(conn) as StoreBox, Box::new(ready_conn) as StoreBox)
            }
        };
        Ok(Diagnostics {
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                metrics: self.metrics,
                wake: self.wake,
                circuits: self.circuits,
                dedup_horizon: self.dedup_horizon,
                ttl: self.ttl,
                token: self.token,
                thresholds: self.thresholds,
                destinations: self.destinations,
                ready_conn: Mutex::new(ready_conn),
                readiness_timeout: self.readiness_timeout,
                outbox: self.outbox,
                workers: self.workers,
            }),
        })
    }
}

/// The diagnostics routes of one service database. Cheap to clone.
#[derive(Clone)]
pub struct Diagnostics {
    shared: Arc<Shared>,
}

/// A store's connection behind the routes.
type StoreBox = Box<dyn DiagnosticsStore + Send>;

struct Shared {
    conn: Mutex<StoreBox>,
    metrics: Arc<Metrics>,
    wake: Option<Arc<Notify>>,
    circuits: Option<Arc<Circuits>>,
    /// The dedup horizon assumed for receivers (this service's own
    /// `inbox.retention` less its signature tolerance): a manual retry of an
    /// older message warns that it may be refused.
    dedup_horizon: Duration,
    ttl: Duration,
    token: Option<String>,
    thresholds: HealthThresholds,
    /// Configured destinations: their gauges are rendered even at zero.
    destinations: Vec<String>,
    ready_conn: Mutex<StoreBox>,
    readiness_timeout: Duration,
    outbox: Option<Outbox>,
    workers: Vec<(String, Liveness)>,
}

impl Diagnostics {
    /// Diagnostics of the SQLite service database at `db_path`.
    pub fn builder(db_path: impl AsRef<Path>) -> DiagnosticsBuilder {
        Self::builder_for(Database::Sqlite(db_path.as_ref().to_path_buf()))
    }

    /// Diagnostics of the service database in PostgreSQL: the same routes
    /// and answers as on SQLite.
    #[cfg(feature = "postgres")]
    pub fn postgres(url: &crate::pg::PostgresUrl) -> DiagnosticsBuilder {
        Self::builder_for(Database::Postgres(Box::new(url.clone())))
    }

    /// Diagnostics of the service database `database`, either store.
    pub fn builder_for(database: impl Into<Database>) -> DiagnosticsBuilder {
        DiagnosticsBuilder {
            database: database.into(),
            metrics: Arc::new(Metrics::default()),
            wake: None,
            circuits: None,
            dedup_horizon: Duration::MAX,
            ttl: Config::default().outbox.ttl,
            token: None,
            thresholds: HealthThresholds::default(),
            destinations: Vec::new(),
            outbox: None,
            workers: Vec::new(),
            readiness_timeout: Duration::from_secs(1),
        }
    }

    /// The routes, ready to merge with [`crate::receiver::Receiver::router`]
    /// (which answers a JSON 404 for other paths under `/_rf/`) or into an
    /// application router.
    pub fn router(&self) -> Router {
        // A wrong method gets the JSON 405 every other error has (axum's
        // own is an empty body).
        Router::new()
            .route(
                "/_rf/health",
                get(serve_health).fallback(method_not_allowed),
            )
            .route(
                "/_rf/outbox/stats",
                get(serve_outbox_stats).fallback(method_not_allowed),
            )
            .route(
                "/_rf/outbox/failed",
                get(serve_failed).fallback(method_not_allowed),
            )
            .merge(
                Router::new()
                    .route(
                        "/_rf/outbox/retry",
                        post(serve_retry_matching).fallback(method_not_allowed),
                    )
                    .route(
                        "/_rf/outbox/{message_id}/retry",
                        post(serve_retry).fallback(method_not_allowed),
                    )
                    .route_layer(middleware::from_fn_with_state(
                        Arc::clone(&self.shared),
                        require_token_for_changes,
                    )),
            )
            .route(
                "/_rf/inbox/stats",
                get(serve_inbox_stats).fallback(method_not_allowed),
            )
            .route(
                "/_rf/metrics",
                get(serve_metrics).fallback(method_not_allowed),
            )
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&self.shared),
                require_token,
            ))
            // Probes need no token: they show no data, and an orchestrator's
            // probe rarely carries credentials.
            .route("/_rf/livez", get(serve_livez))
            .route("/_rf/readyz", get(serve_readyz))
            .with_state(Arc::clone(&self.shared))
    }

    /// Runs `query` on the diagnostics connection, on the blocking pool.
    async fn query<T: Send + 'static>(
        shared: &Arc<Shared>,
        query: impl FnOnce(&dyn DiagnosticsStore) -> Result<T, DiagnosticsError> + Send + 'static,
    ) -> Result<T, DiagnosticsError> {
        let shared = Arc::clone(shared);
        tokio::task::spawn_blocking(move || {
            let conn = shared
                .conn
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            query(conn.as_ref())
        })
        .await
        .map_err(|error| DiagnosticsError::Unavailable(error.to_string()))?
    }
}

async fn method_not_allowed(request: Request) -> DiagnosticsError {
    DiagnosticsError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    // The check shared with the registry (`crate::auth`). Without a token,
    // the read-only routes answer (serve them on an internal address); the
    // ones that change state refuse (`require_token_for_changes`).
    if let Some(token) = &shared.token
        && !crate::auth::authorized(request.headers(), token)
    {
        return DiagnosticsError::Unauthorized.into_response();
    }
    next.run(request).await
}

/// On the routes that change state (the manual retries): a `POST` without a
/// configured token is refused with 403 `token_required`. Other methods
/// there get the JSON 405 as anywhere else.
async fn require_token_for_changes(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if shared.token.is_none() && *request.method() == Method::POST {
        return DiagnosticsError::TokenRequired.into_response();
    }
    next.run(request).await
}

/// `GET /_rf/readyz`: every check by name, `"ok"` or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: &'static str,
    /// The names of the checks that failed.
    pub failed: Vec<String>,
    pub checks: BTreeMap<String, String>,
}

impl Readiness {
    /// True when every check passed.
    pub fn is_ready(&self) -> bool {
        self.failed.is_empty()
    }
}

/// The database part of readiness: a write transaction can start (nobody
/// holds the write lock past `conn`'s busy timeout, the file is writable)
/// and the schema is the one this build knows.
pub fn database_checks(conn: &Connection) -> BTreeMap<String, String> {
    let mut checks = BTreeMap::new();
    let writable = conn
        .execute_batch("BEGIN IMMEDIATE; ROLLBACK;")
        .map(|()| "ok".to_owned())
        .unwrap_or_else(|error| {
            // A failed BEGIN leaves no transaction; a failed ROLLBACK might.
            let _ = conn.execute_batch("ROLLBACK");
            format!("cannot start a write transaction: {error}")
        });
    checks.insert("database".to_owned(), writable);
    let known = db::MIGRATIONS.len() as i64;
    let migrations = match conn.query_row("PRAGMA user_version", [], |row| row.get::<_, i64>(0)) {
        Ok(version) if version == known => "ok".to_owned(),
        Ok(version) => format!("schema version {version}, this build needs {known}"),
        Err(error) => format!("cannot read the schema version: {error}"),
    };
    checks.insert("migrations".to_owned(), migrations);
    checks
}

async fn serve_livez() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "alive" }))
}

async fn serve_readyz(State(shared): State<Arc<Shared>>) -> Response {
    let probe = Arc::clone(&shared);
    let checked = tokio::task::spawn_blocking(move || {
        let conn = probe
            .ready_conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        conn.database_checks()
    });
    // The store bounds each step by the readiness timeout; this bounds the
    // whole (a connection that hangs without an error, a probe queued
    // behind one that does).
    let limit = shared
        .readiness_timeout
        .saturating_mul(3)
        .saturating_add(Duration::from_secs(1));
    let mut checks = match tokio::time::timeout(limit, checked).await {
        Ok(Ok(checks)) => checks,
        Ok(Err(error)) => BTreeMap::from([("database".to_owned(), error.to_string())]),
        Err(_) => BTreeMap::from([(
            "database".to_owned(),
            format!(
                "no answer within {}",
                crate::duration::format_duration(limit)
            ),
        )]),
    };
    if let Some(outbox) = &shared.outbox {
        let dispatcher = match outbox.dispatcher_liveness() {
            None => "not started".to_owned(),
            Some(liveness) if liveness.is_alive() => "ok".to_owned(),
            Some(_) => "stopped".to_owned(),
        };
        checks.insert("dispatcher".to_owned(), dispatcher);
    }
    for (name, liveness) in &shared.workers {
        let state = if liveness.is_alive() { "ok" } else { "stopped" };
        checks.insert(name.clone(), state.to_owned());
    }
    let failed: Vec<String> = checks
        .iter()
        .filter(|(_, state)| state.as_str() != "ok")
        .map(|(name, _)| name.clone())
        .collect();
    let readiness = Readiness {
        status: if failed.is_empty() {
            "ready"
        } else {
            "not_ready"
        },
        failed,
        checks,
    };
    let status = if readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness)).into_response()
}

async fn serve_health(State(shared): State<Arc<Shared>>) -> Result<Json<Health>, DiagnosticsError> {
    let thresholds = shared.thresholds;
    let (stats, decommissioned) = Diagnostics::query(&shared, |store| {
        Ok((
            unsent_stats_in(store, db::now_ms())?,
            store.decommissioned()?,
        ))
    })
    .await?;
    let decommissioned = decommissioned
        .into_iter()
        .map(|(interface, version, at, held)| DecommissionedVersion {
            interface,
            version: u32::try_from(version.max(0)).unwrap_or(u32::MAX),
            decommissioned_at: rfc3339(at),
            held: held.max(0) as u64,
        })
        .collect();
    let states = shared
        .circuits
        .as_ref()
        .map(|circuits| circuits.states())
        .unwrap_or_default();
    Ok(Json(with_decommissioned(
        with_destinations(health(stats, thresholds), states),
        decommissioned,
    )))
}

async fn serve_outbox_stats(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<OutboxStats>, DiagnosticsError> {
    let stats = Diagnostics::query(&shared, |store| outbox_stats_in(store, db::now_ms())).await?;
    Ok(Json(stats))
}

#[derive(Serialize)]
struct AttentionList {
    messages: Vec<AttentionMessage>,
}

async fn serve_failed(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<AttentionFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let Query(filter) = filter.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    let messages =
        Diagnostics::query(&shared, move |store| attention_messages_in(store, &filter)).await?;
    Ok(Json(AttentionList { messages }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Retried {
    retried: usize,
    /// Set when some of them are older than the dedup horizon receivers are
    /// assumed to keep: they may be refused (422 `beyond_dedup_horizon`)
    /// and come back `Failed`. They are never processed twice.
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
}

/// The warning of a manual retry of `old` messages created before the horizon.
fn horizon_warning(old: usize, horizon: Duration) -> Option<String> {
    (old > 0).then(|| {
        format!(
            "{old} of the retried messages were created more than {} ago, beyond the dedup \
             horizon receivers keep by default (inbox.retention less the signature tolerance): \
             a receiver with no record of one refuses it with 422 beyond_dedup_horizon rather \
             than risk processing it twice, and it comes back Failed; check the receiver's \
             effects before sending it another way",
            crate::duration::format_duration(horizon)
        )
    })
}

/// Messages matching `filter` (or the one `message_id`) that are waiting for
/// a human and were created before `before_ms`.
fn count_older(
    store: &dyn DiagnosticsStore,
    message_id: Option<&str>,
    filter: &AttentionFilter,
    before_ms: i64,
) -> Result<usize, DiagnosticsError> {
    store.count_older(
        message_id,
        filter.status()?,
        filter.destination.as_deref(),
        before_ms,
    )
}

async fn serve_retry(
    State(shared): State<Arc<Shared>>,
    message_id: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    // A segment that does not decode (`%FF`) is a bad id like any other,
    // answered as JSON (axum's own rejection is plain text).
    let UrlPath(message_id) =
        message_id.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    let id = Uuid::parse_str(&message_id).map_err(|_| {
        DiagnosticsError::BadRequest(format!("`{message_id}` is not a message id (a UUID)"))
    })?;
    let ttl = shared.ttl;
    let horizon = shared.dedup_horizon;
    let old = Diagnostics::query(&shared, move |store| {
        let now = db::now_ms();
        let key = id.to_string();
        let old = count_older(
            store,
            Some(&key),
            &AttentionFilter::default(),
            now.saturating_sub(i64::try_from(horizon.as_millis()).unwrap_or(i64::MAX)),
        )?;
        retry_message_in(store, &id, ttl, now)?;
        Ok(old)
    })
    .await?;
    wake_dispatcher(&shared);
    Ok(Json(Retried {
        retried: 1,
        warning: horizon_warning(old, horizon),
    }))
}

async fn serve_retry_matching(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<AttentionFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let Query(filter) = filter.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    let ttl = shared.ttl;
    let horizon = shared.dedup_horizon;
    let (retried, old) = Diagnostics::query(&shared, move |store| {
        let now = db::now_ms();
        let old = count_older(
            store,
            None,
            &filter,
            now.saturating_sub(i64::try_from(horizon.as_millis()).unwrap_or(i64::MAX)),
        )?;
        Ok((retry_matching_in(store, &filter, ttl, now)?, old))
    })
    .await?;
    if retried > 0 {
        wake_dispatcher(&shared);
    }
    Ok(Json(Retried {
        retried,
        warning: horizon_warning(old, horizon),
    }))
}

fn wake_dispatcher(shared: &Shared) {
    if let Some(wake) = &shared.wake {
        wake.notify_one();
    }
}

async fn serve_inbox_stats(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<InboxStats>, DiagnosticsError> {
    let size = Diagnostics::query(&shared, |store| store.inbox_size()).await?;
    let metrics = &shared.metrics;
    let processed = metrics.inbox_processed.get();
    let duplicates = metrics.inbox_duplicates.get();
    let seen = processed + duplicates;
    Ok(Json(InboxStats {
        size,
        processed,
        duplicates,
        duplicate_rate: if seen == 0 {
            0.0
        } else {
            duplicates as f64 / seen as f64
        },
        signature_failures: metrics.inbox_signature_failures.get(),
        rejected: metrics.inbox_rejected.get(),
    }))
}

async fn serve_metrics(State(shared): State<Arc<Shared>>) -> Result<Response, DiagnosticsError> {
    let configured = shared.destinations.clone();
    let gauges = Diagnostics::query(&shared, move |store| {
        Ok(Gauges {
            destinations: fold_gauges(store.unsent_groups()?, db::now_ms(), &configured),
            inbox_size: Some(store.inbox_size()?),
        })
    })
    .await?;
    let text = shared.metrics.render(&gauges);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// The gauges of every destination that has undelivered rows or is in
/// `configured` (those show zeros, so an alert rule sees the series before
/// the first problem), sorted by name. Reads through the partial indexes
/// `outbox_due` and `outbox_attention` only, like [`unsent_stats`].
pub fn destination_gauges(
    conn: &Connection,
    now_ms: i64,
    configured: &[String],
) -> rusqlite::Result<Vec<DestinationGauges>> {
    Ok(fold_gauges(
        sqlite::unsent_groups(conn)?,
        now_ms,
        configured,
    ))
}

/// The one folding of the (destination, status) groups into the gauges.
fn fold_gauges(
    groups: Vec<UnsentGroup>,
    now_ms: i64,
    configured: &[String],
) -> Vec<DestinationGauges> {
    let mut by_name: BTreeMap<String, DestinationGauges> = configured
        .iter()
        .map(|name| {
            let gauges = DestinationGauges {
                destination: name.clone(),
                ..DestinationGauges::default()
            };
            (name.clone(), gauges)
        })
        .collect();
    for group in groups {
        let gauges =
            by_name
                .entry(group.destination.clone())
                .or_insert_with(|| DestinationGauges {
                    destination: group.destination,
                    ..DestinationGauges::default()
                });
        let count = group.rows;
        match group.status {
            Status::Pending | Status::Sending => {
                gauges.pending += count;
                let age = (now_ms - group.oldest_created_at).max(0);
                gauges.oldest_pending_age_ms =
                    Some(gauges.oldest_pending_age_ms.map_or(age, |a| a.max(age)));
            }
            Status::Failed => gauges.failed += count,
            Status::DeadLetter => gauges.dead_letter += count,
            Status::Expired => gauges.expired += count,
            Status::Sent => {}
        }
    }
    by_name.into_values().collect()
}

/// The statements on SQLite. `?n` placeholders; the two `status IN (…)`
/// conditions of the group queries repeat those of the partial indexes
/// `outbox_due` and `outbox_attention`, so neither query scans the table.
mod sqlite {
    use std::collections::BTreeMap;

    use rusqlite::{Connection, OptionalExtension as _, params};

    use super::{AttentionRow, DiagnosticsError, DiagnosticsStore, UnsentGroup};
    use crate::outbox::Status;

    pub(super) fn unsent_groups(conn: &Connection) -> rusqlite::Result<Vec<UnsentGroup>> {
        let mut groups = Vec::new();
        for sql in [
            "SELECT destination, status, COUNT(*), MIN(created_at) FROM outbox_messages \
             WHERE status IN ('Pending', 'Sending') GROUP BY destination, status",
            concat!(
                "SELECT destination, status, COUNT(*), MIN(created_at) FROM outbox_messages \
             WHERE ",
                crate::db::attention!(),
                " GROUP BY destination, status"
            ),
        ] {
            let mut statement = conn.prepare_cached(sql)?;
            let mut rows = statement.query([])?;
            while let Some(row) = rows.next()? {
                let status: String = row.get(1)?;
                let Some(status) = Status::parse(&status) else {
                    continue;
                };
                groups.push(UnsentGroup {
                    destination: row.get(0)?,
                    status,
                    rows: row.get::<_, i64>(2)?.max(0) as u64,
                    oldest_created_at: row.get(3)?,
                });
            }
        }
        Ok(groups)
    }

    /// One look-up at the end of `outbox_sent`, not a scan.
    pub(super) fn last_sent_at(conn: &Connection) -> rusqlite::Result<Option<i64>> {
        conn.prepare_cached("SELECT MAX(sent_at) FROM outbox_messages WHERE status = 'Sent'")?
            .query_row([], |row| row.get(0))
    }

    pub(super) fn sent_count(conn: &Connection) -> rusqlite::Result<u64> {
        let sent: i64 = conn
            .prepare_cached("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")?
            .query_row([], |row| row.get(0))?;
        Ok(sent.max(0) as u64)
    }

    impl DiagnosticsStore for Connection {
        fn decommissioned(&self) -> Result<Vec<(String, i64, i64, i64)>, DiagnosticsError> {
            let mut statement = self.prepare_cached(super::DECOMMISSIONED_SQL)?;
            let rows = statement
                .query_map([], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        }

        fn unsent_groups(&self) -> Result<Vec<UnsentGroup>, DiagnosticsError> {
            Ok(unsent_groups(self)?)
        }

        fn last_sent_at(&self) -> Result<Option<i64>, DiagnosticsError> {
            Ok(last_sent_at(self)?)
        }

        fn sent_count(&self) -> Result<u64, DiagnosticsError> {
            Ok(sent_count(self)?)
        }

        fn attention_rows(
            &self,
            status: Option<Status>,
            destination: Option<&str>,
            limit: u32,
        ) -> Result<Vec<AttentionRow>, DiagnosticsError> {
            let mut statement = self.prepare_cached(concat!(
                "SELECT message_id, correlation_id, message_type, destination, interface, \
                        version, endpoint, status, retry_count, max_retries, last_error, \
                        created_at, last_attempt_at, expires_at \
                 FROM outbox_messages \
                 WHERE ",
                crate::db::attention!(),
                " \
                   AND (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR destination = ?2) \
                 ORDER BY created_at LIMIT +?3"
            ))?;
            let rows = statement.query_map(
                params![status.map(Status::as_str), destination, limit],
                |row| {
                    Ok(AttentionRow {
                        message_id: row.get(0)?,
                        correlation_id: row.get(1)?,
                        message_type: row.get(2)?,
                        destination: row.get(3)?,
                        interface: row.get(4)?,
                        version: row.get(5)?,
                        endpoint: row.get(6)?,
                        status: row.get(7)?,
                        retry_count: row.get(8)?,
                        max_retries: row.get(9)?,
                        last_error: row.get(10)?,
                        created_at: row.get(11)?,
                        last_attempt_at: row.get(12)?,
                        expires_at: row.get(13)?,
                    })
                },
            )?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        }

        fn retry_one(
            &self,
            message_id: &str,
            now_ms: i64,
            renew_until_ms: i64,
        ) -> Result<usize, DiagnosticsError> {
            Ok(self
                .prepare_cached(concat!(
                    "UPDATE outbox_messages \
                     SET status = 'Pending', retry_count = 0, next_retry_at = ?2, \
                         lease_token = NULL, expires_at = MAX(expires_at, ?3) \
                     WHERE message_id = ?1 AND seq = ?4 AND ",
                    crate::db::attention!(),
                    ""
                ))?
                .execute(params![
                    message_id,
                    now_ms,
                    renew_until_ms,
                    crate::db::outbox_seq(message_id)
                ])?)
        }

        fn status_of(&self, message_id: &str) -> Result<Option<String>, DiagnosticsError> {
            Ok(self
                .query_row(
                    "SELECT status FROM outbox_messages WHERE message_id = ?1 AND seq = ?2",
                    params![message_id, crate::db::outbox_seq(message_id)],
                    |row| row.get(0),
                )
                .optional()?)
        }

        fn retry_matching(
            &self,
            status: Option<Status>,
            destination: Option<&str>,
            now_ms: i64,
            renew_until_ms: i64,
        ) -> Result<usize, DiagnosticsError> {
            Ok(self
                .prepare_cached(concat!(
                    "UPDATE outbox_messages \
                     SET status = 'Pending', retry_count = 0, next_retry_at = ?3, \
                         lease_token = NULL, expires_at = MAX(expires_at, ?4) \
                     WHERE ",
                    crate::db::attention!(),
                    " \
                       AND (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR destination = ?2)"
                ))?
                .execute(params![
                    status.map(Status::as_str),
                    destination,
                    now_ms,
                    renew_until_ms
                ])?)
        }

        fn count_older(
            &self,
            message_id: Option<&str>,
            status: Option<Status>,
            destination: Option<&str>,
            before_ms: i64,
        ) -> Result<usize, DiagnosticsError> {
            let count: i64 = self
                .prepare_cached(concat!(
                    "SELECT COUNT(*) FROM outbox_messages \
                     WHERE ",
                    crate::db::attention!(),
                    " AND created_at < ?4 \
                       AND (?1 IS NULL OR message_id = ?1) AND (?2 IS NULL OR status = ?2) \
                       AND (?3 IS NULL OR destination = ?3)"
                ))?
                .query_row(
                    params![
                        message_id,
                        status.map(Status::as_str),
                        destination,
                        before_ms
                    ],
                    |row| row.get(0),
                )?;
            Ok(count.max(0) as usize)
        }

        fn inbox_size(&self) -> Result<u64, DiagnosticsError> {
            Ok(crate::inbox::count(self)?)
        }

        fn database_checks(&self) -> BTreeMap<String, String> {
            super::database_checks(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> OutboxStats {
        OutboxStats::default()
    }

    fn group(destination: &str, status: Status, rows: u64, oldest: i64) -> UnsentGroup {
        UnsentGroup {
            destination: destination.to_owned(),
            status,
            rows,
            oldest_created_at: oldest,
        }
    }

    /// The one folding both stores' groups go through.
    #[test]
    fn groups_fold_into_counts_and_gauges() {
        let groups = vec![
            group("ledger", Status::Pending, 3, 1_000),
            group("ledger", Status::Sending, 1, 500),
            group("billing", Status::Pending, 2, 4_000),
            group("billing", Status::Failed, 4, 100),
            group("audit", Status::Expired, 1, 100),
        ];
        let stats = fold_unsent(groups.clone(), Some(9_000), 10_000);
        assert_eq!(
            (stats.pending, stats.sending, stats.failed, stats.expired),
            (5, 1, 4, 1)
        );
        assert_eq!(
            stats.oldest_pending_age_ms,
            Some(9_500),
            "ledger's Sending row"
        );
        assert_eq!(stats.last_sent_at.as_deref(), Some("1970-01-01T00:00:09Z"));
        assert_eq!(stats.sent, None);
        assert_eq!(stats.destinations["ledger"][&Status::Pending], 3);
        assert_eq!(stats.destinations["billing"][&Status::Failed], 4);

        let gauges = fold_gauges(groups, 10_000, &["ledger".into(), "idle".into()]);
        let names: Vec<&str> = gauges.iter().map(|g| g.destination.as_str()).collect();
        assert_eq!(names, ["audit", "billing", "idle", "ledger"]);
        let ledger = &gauges[3];
        assert_eq!(
            (ledger.pending, ledger.oldest_pending_age_ms),
            (4, Some(9_500))
        );
        assert_eq!((gauges[1].pending, gauges[1].failed), (2, 4));
        assert_eq!(gauges[0].expired, 1);
        assert_eq!(
            gauges[2],
            DestinationGauges {
                destination: "idle".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn health_is_a_traffic_light() {
        let thresholds = HealthThresholds::default();
        assert_eq!(health(stats(), thresholds).status, HealthStatus::Healthy);

        let backlog = OutboxStats {
            pending: 499,
            sending: 1,
            ..stats()
        };
        let verdict = health(backlog, thresholds);
        assert_eq!(verdict.status, HealthStatus::Warning);
        assert!(verdict.reasons[0].contains("500 outbox message(s) waiting"));

        let stuck = OutboxStats {
            pending: 1,
            oldest_pending_age_ms: Some(180_000),
            ..stats()
        };
        let verdict = health(stuck, thresholds);
        assert_eq!(verdict.status, HealthStatus::Warning);
        assert!(
            verdict.reasons[0].contains("3m old"),
            "{:?}",
            verdict.reasons
        );

        let dead = OutboxStats {
            pending: 600,
            dead_letter: 1,
            ..stats()
        };
        let verdict = health(dead, thresholds);
        assert_eq!(verdict.status, HealthStatus::Critical);
        assert_eq!(verdict.reasons.len(), 2, "{:?}", verdict.reasons);
    }
}
