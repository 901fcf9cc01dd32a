//! The diagnostics vocabulary: what the routes answer ([`OutboxStats`],
//! [`Health`], [`AttentionMessage`], [`InboxStats`]), their filter
//! ([`AttentionFilter`]), their errors ([`DiagnosticsError`], with the wire's
//! status and code) and the raw rows a store hands up ([`UnsentGroup`],
//! [`AttentionRow`]).
//!
//! Plain data and its conversions: it never runs a query, decides a health
//! status or serves a route.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::circuit::DestinationState;
use crate::envelope::ErrorBody;
use crate::outbox::Status;

/// The statuses that need a human; the only ones a retry accepts.
const ATTENTION: [Status; 3] = [Status::Failed, Status::DeadLetter, Status::Expired];

/// Most rows one `GET /_rf/outbox/failed` returns.
pub const MAX_LIST_LIMIT: u32 = 1000;

/// When `GET /_rf/health` turns from `healthy` to `warning`. Any `Failed`,
/// `DeadLetter` or `Expired` row makes it `critical`: a message is not
/// getting through, and only a human can decide what to do with it.
///
/// Start from [`Default`] and change the fields (the struct is
/// `#[non_exhaustive]`: `let mut t = HealthThresholds::default();
/// t.backlog = 5_000;`), then pass it to
/// [`DiagnosticsBuilder::thresholds`](super::DiagnosticsBuilder::thresholds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    /// 403 `token_required`: a route that changes state (a retry, a discard) on
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
    NotRetryable {
        /// The message asked for.
        message_id: String,
        /// Its status now: `Pending`, `Sending` (it is still being
        /// delivered) or `Sent` (it was delivered; nothing to retry).
        status: Status,
    },
    /// 409 `not_discardable`: the message is not `Failed`, `DeadLetter` or
    /// `Expired` (it is being delivered, was delivered, or is already
    /// `Discarded`).
    #[error(
        "message `{message_id}` is {status:?}; only Failed, DeadLetter and Expired messages can be discarded"
    )]
    NotDiscardable {
        /// The message asked for.
        message_id: String,
        /// Its status now.
        status: Status,
    },
    /// 400 `invalid_cursor`: the `cursor` is not one this service made.
    #[error("`{0}` is not a cursor of this list; start again without one")]
    InvalidCursor(String),
    /// 400 `cursor_mismatch`: the `cursor` was made for another filter.
    #[error(
        "this cursor was made for another filter; repeat the filter of the first page, \
         or start again without a cursor"
    )]
    CursorMismatch,
    /// 503 `unavailable`: the database could not be read (locked, corrupt, gone).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// 409 `backup_running`: `POST /_rf/backup` while a backup (scheduled
    /// or on demand) is being written.
    #[error("a backup is already being written; try again when it is done")]
    BackupRunning,
    /// 409 `backup_not_configured`: `POST /_rf/backup` on a service without
    /// a backup folder (`backup.directory`), or on PostgreSQL.
    #[error(
        "this service takes no backups: set backup.directory (RFIDL_BACKUP_DIRECTORY); \
         a PostgreSQL database is backed up by its server's tools"
    )]
    BackupNotConfigured,
    /// 500 `backup_failed`: the backup could not be written (disk full,
    /// permissions, a damaged copy); nothing was kept of it.
    #[error("{0}")]
    BackupFailed(String),
    /// 405 `method_not_allowed`: e.g. `DELETE /_rf/health`.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
    },
}

impl DiagnosticsError {
    /// The HTTP status of the answer (401, 403, 400, 404, 409, 500, 503, 405);
    /// the body is an [`ErrorBody`] with [`code`](Self::code).
    pub fn status(&self) -> StatusCode {
        match self {
            DiagnosticsError::Unauthorized => StatusCode::UNAUTHORIZED,
            DiagnosticsError::TokenRequired => StatusCode::FORBIDDEN,
            DiagnosticsError::BadRequest(_)
            | DiagnosticsError::InvalidCursor(_)
            | DiagnosticsError::CursorMismatch => StatusCode::BAD_REQUEST,
            DiagnosticsError::NotFound(_) => StatusCode::NOT_FOUND,
            DiagnosticsError::NotRetryable { .. }
            | DiagnosticsError::NotDiscardable { .. }
            | DiagnosticsError::BackupRunning
            | DiagnosticsError::BackupNotConfigured => StatusCode::CONFLICT,
            DiagnosticsError::BackupFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
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
            DiagnosticsError::InvalidCursor(_) => "invalid_cursor",
            DiagnosticsError::CursorMismatch => "cursor_mismatch",
            DiagnosticsError::NotFound(_) => "not_found",
            DiagnosticsError::NotRetryable { .. } => "not_retryable",
            DiagnosticsError::NotDiscardable { .. } => "not_discardable",
            DiagnosticsError::Unavailable(_) => "unavailable",
            DiagnosticsError::BackupRunning => "backup_running",
            DiagnosticsError::BackupNotConfigured => "backup_not_configured",
            DiagnosticsError::BackupFailed(_) => "backup_failed",
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
    /// `Pending` rows: waiting for their first or next attempt, or held
    /// for a decommissioned version. Durable timers not due yet are not
    /// among them: see `scheduled`.
    pub pending: u64,
    /// `Pending` rows whose `deliver_at` is still ahead (durable timers):
    /// not backlog, so they count towards no health threshold.
    pub scheduled: u64,
    /// `Sending` rows: claimed by a dispatcher, in flight (or left by one
    /// that crashed, until their lease runs out).
    pub sending: u64,
    /// Kept `Sent` rows (up to `outbox.sent_retention`). Counting them reads
    /// the whole `outbox_sent` index, so only `GET /_rf/outbox/stats` does;
    /// the health check leaves it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<u64>,
    /// `Failed` rows: retries exhausted, or beyond the receiver's dedup
    /// horizon; need an operator.
    pub failed: u64,
    /// `DeadLetter` rows: refused for good by the receiver; need an
    /// operator.
    pub dead_letter: u64,
    /// `Expired` rows: their TTL passed before delivery; need an operator.
    pub expired: u64,
    /// Age of the oldest `Pending` or `Sending` row, if any, counted from
    /// when it was due (a durable timer's `deliver_at`).
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
    /// Nothing needs attention.
    Healthy,
    /// Messages are slow but not lost: a backlog or an old waiting message
    /// ([`HealthThresholds`]), a destination unreachable (circuit open), a
    /// clock problem, or rows held for a decommissioned version.
    Warning,
    /// At least one `Failed`, `DeadLetter` or `Expired` row: a message is not
    /// getting through and only a human can decide what to do with it.
    Critical,
}

/// `GET /_rf/health`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
///
/// Answered with 200 whatever the status (a peer's refusal must not make a
/// probe restart this service); only an unreadable database answers 503.
pub struct Health {
    /// The worst finding: `critical` over `warning` over `healthy`.
    pub status: HealthStatus,
    /// Why the status is not `healthy`, one sentence each.
    pub reasons: Vec<String>,
    /// The counts the status was decided on (without `sent`).
    pub outbox: OutboxStats,
    /// What the dispatcher knows of each destination: circuit open or
    /// closed, batch limit, clock problems (empty without an outbox).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<DestinationState>,
    /// Interface versions decommissioned on this service, with their held
    /// outbox rows ([`crate::lifecycle`]); left out when none is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decommissioned: Vec<DecommissionedVersion>,
    /// What this process's dispatcher delivered and how long its receivers
    /// took to answer, counted since it started ([`SendCounters`]).
    pub sends: SendCounters,
}

/// `sends` of `GET /_rf/health`: counters since the process started, never
/// rates, so that a reader that polls (the registry's aggregator) takes the
/// difference of two answers for a rate over its own interval; a smaller
/// value than before means the process restarted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SendCounters {
    /// Messages acknowledged by their receiver (`rf_outbox_sent_total`).
    pub sent: u64,
    /// Send attempts timed from send to the receiver's answer
    /// (`rf_outbox_send_duration_seconds_count`).
    pub timed: u64,
    /// Those attempts by duration, cumulative: `[upper bound in µs,
    /// attempts at most that long]` (`rf_outbox_send_duration_seconds_bucket`).
    pub latency_buckets_micros: Vec<[u64; 2]>,
}

impl SendCounters {
    /// The counters of `metrics` now.
    pub fn of(metrics: &crate::metrics::Metrics) -> Self {
        Self {
            sent: metrics.outbox_sent.get(),
            timed: metrics.outbox_send_duration.count(),
            latency_buckets_micros: metrics.outbox_send_duration.cumulative_micros(),
        }
    }
}

/// One decommissioned interface version in `GET /_rf/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecommissionedVersion {
    /// The interface, `package.Service`.
    pub interface: String,
    /// The decommissioned version of it.
    pub version: u32,
    /// When the registry's command decommissioned it (RFC 3339).
    pub decommissioned_at: String,
    /// Its outbox rows held (`Pending`, not sent) until it is re-commissioned.
    pub held: u64,
}

/// One message of `GET /_rf/outbox/failed`: everything but the payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttentionMessage {
    /// The message id (UUID v7), what `POST /_rf/outbox/{messageId}/retry`
    /// takes.
    pub message_id: String,
    /// The `@correlate` key it was sent with, if any.
    pub correlation_id: Option<String>,
    /// `Signal`, `Command`, `PushCall` or `Response`.
    pub message_type: String,
    /// The destination name it is routed by.
    pub destination: String,
    /// The receiving interface, `package.Service`.
    pub interface: String,
    /// The interface version.
    pub version: u32,
    /// The method name.
    pub endpoint: String,
    /// `Failed`, `DeadLetter` or `Expired`.
    pub status: Status,
    /// Counted failed attempts.
    pub retry_count: u32,
    /// The limit those were counted against.
    pub max_retries: u32,
    /// Why it stopped: the status with the receiver's code and message (an
    /// rfidl receiver names fields, never values), or the transport error.
    pub last_error: Option<String>,
    /// When it was enqueued (RFC 3339, UTC).
    pub created_at: String,
    /// When it was last sent (RFC 3339, UTC); `None` if it never was.
    pub last_attempt_at: Option<String>,
    /// When its TTL ends or ended (RFC 3339, UTC); a retry renews it.
    pub expires_at: String,
}

/// `GET /_rf/inbox/stats`. The counts are this process's since it started.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxStats {
    /// Rows in the inbox now.
    pub size: u64,
    /// Deliveries whose handler ran and committed.
    pub processed: u64,
    /// Deliveries answered from the inbox (a copy of a processed message),
    /// without running the handler.
    pub duplicates: u64,
    /// `duplicates / (processed + duplicates)`; 0 before the first delivery.
    pub duplicate_rate: f64,
    /// Deliveries refused with 401 (unknown source, bad or missing
    /// signature, clock skew).
    pub signature_failures: u64,
    /// Deliveries refused with another 4xx (malformed, not hosted, payload
    /// mismatch, poison, …).
    pub rejected: u64,
}

/// One (destination, status) group of undelivered outbox rows, as a store
/// reads it: the raw material of [`OutboxStats`] and
/// [`DestinationGauges`](crate::metrics::DestinationGauges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnsentGroup {
    pub destination: String,
    pub status: Status,
    pub rows: u64,
    /// Of those, `Pending` rows not due yet (durable timers: their
    /// `created_at` is their due time, still ahead).
    pub scheduled: u64,
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

/// Filters of the failed list, its groups, and the bulk retry and discard
/// (which take every filter but `cursor` and `limit`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionFilter {
    /// One of `Failed`, `DeadLetter`, `Expired`; all three when absent.
    pub status: Option<String>,
    /// Only rows of this destination name; all destinations when absent.
    pub destination: Option<String>,
    /// Only messages to this interface (`package.Service`).
    pub interface: Option<String>,
    /// Only messages to this method.
    pub method: Option<String>,
    /// Only messages whose last error contains this text (an error code
    /// of the groups, `handler_failed`, matches its messages).
    pub error: Option<String>,
    /// Only messages enqueued longer ago than this (`30m`, `2h`, `7d`).
    #[serde(rename = "olderThan")]
    pub older_than: Option<String>,
    /// The `nextCursor` of the previous page, made under the same filter.
    pub cursor: Option<String>,
    /// At most this many rows (default 100, at most [`MAX_LIST_LIMIT`]).
    pub limit: Option<u32>,
}

impl AttentionFilter {
    /// The bulk retry and discard act on every message matching the
    /// filters: paging (`cursor`, `limit`) is refused, so a bulk action never
    /// touches only the part of a match that one page showed.
    /// The filters that are set, as `name=value` pairs (`every message`
    /// when none is): what a log line of a bulk action shows.
    pub(super) fn describe(&self) -> String {
        let set: Vec<String> = [
            ("status", &self.status),
            ("destination", &self.destination),
            ("interface", &self.interface),
            ("method", &self.method),
            ("error", &self.error),
            ("olderThan", &self.older_than),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_ref().map(|value| format!("{name}={value}")))
        .collect();
        if set.is_empty() {
            "every message".to_owned()
        } else {
            set.join(" ")
        }
    }

    pub(super) fn without_paging(&self) -> Result<(), DiagnosticsError> {
        let paging = [
            ("cursor", self.cursor.is_some()),
            ("limit", self.limit.is_some()),
        ];
        match paging.iter().find(|(_, present)| *present) {
            None => Ok(()),
            Some((name, _)) => Err(DiagnosticsError::BadRequest(format!(
                "`{name}` pages the list only; a bulk retry or discard acts on every message \
                 matching the filters"
            ))),
        }
    }

    pub(super) fn status(&self) -> Result<Option<Status>, DiagnosticsError> {
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

/// `ms` since the epoch as RFC 3339 (the number itself if out of range).
pub(super) fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| ms.to_string())
}
