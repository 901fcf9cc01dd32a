//! The diagnostics operations written once over a store: the
//! [`DiagnosticsStore`] trait each database implements (SQLite in
//! `sqlite`, PostgreSQL in `crate::store::sqlx_postgres::diagnostics`), and the operations the
//! routes and the public functions run on it (the counts, the failed list,
//! the manual retries and their errors).
//!
//! It never holds SQL of its own beyond the one statement both stores share
//! (`store::DECOMMISSIONED_SQL`), and never touches HTTP.

use std::collections::BTreeMap;
use std::time::Duration;

use rusqlite::Connection;
use uuid::Uuid;

use super::health::{fold_gauges, fold_unsent};
use super::listing::{ErrorGroupRow, FailureGroup, RowFilter, encode_cursor, fold_groups, resolve};
use super::{
    AttentionFilter, AttentionMessage, AttentionRow, DiagnosticsError, MAX_LIST_LIMIT, OutboxStats,
    UnsentGroup,
};
use crate::metrics::DestinationGauges;
use crate::outbox::Status;

/// The statements behind the diagnostics routes, one implementation per
/// store: SQLite below (on `rusqlite::Connection`), PostgreSQL in
/// `crate::store::sqlx_postgres::diagnostics`. Synchronous: the routes call it on the blocking
/// pool, one call at a time per connection. Each method reads or writes raw
/// rows; what the routes make of them (the folding into [`OutboxStats`] and
/// [`DestinationGauges`], the filters, the retry errors) is written once,
/// in this module, for both.
pub(crate) trait DiagnosticsStore {
    /// Every (destination, status) group of rows not `Sent`, read through
    /// the partial indexes `outbox_due` and `outbox_attention` only; a
    /// waiting row due after `now` (a durable timer) counts as scheduled.
    fn unsent_groups(&self, now: i64) -> Result<Vec<UnsentGroup>, DiagnosticsError>;
    /// `sent_at` of the last acknowledged row kept (one index look-up).
    fn last_sent_at(&self) -> Result<Option<i64>, DiagnosticsError>;
    /// Kept `Sent` rows (a scan of the `outbox_sent` index).
    fn sent_count(&self) -> Result<u64, DiagnosticsError>;
    /// `Failed`, `DeadLetter` and `Expired` rows matching the filter,
    /// oldest first (then by id), at most `limit`.
    fn attention_rows(
        &self,
        filter: &RowFilter,
        limit: u32,
    ) -> Result<Vec<AttentionRow>, DiagnosticsError>;
    /// The same rows (its `after` unset) grouped by destination and last
    /// error: rows, oldest and newest `created_at`.
    fn error_groups(&self, filter: &RowFilter) -> Result<Vec<ErrorGroupRow>, DiagnosticsError>;
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
        filter: &RowFilter,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError>;
    /// Puts `message_id` aside if it needs a human: `Discarded` since
    /// `now_ms`. Returns the rows changed (0 or 1).
    fn discard_one(&self, message_id: &str, now_ms: i64) -> Result<usize, DiagnosticsError>;
    /// [`discard_one`](Self::discard_one) for every row needing a human that
    /// matches the filter.
    fn discard_matching(&self, filter: &RowFilter, now_ms: i64) -> Result<usize, DiagnosticsError>;
    /// Rows needing a human, matching the filter (and `message_id`), created
    /// before `before_ms`.
    fn count_older(
        &self,
        message_id: Option<&str>,
        filter: &RowFilter,
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

/// The outbox counts, read through the partial indexes only, with the
/// number of kept `Sent` rows (which costs a scan of their index).
pub fn outbox_stats(conn: &Connection, now_ms: i64) -> rusqlite::Result<OutboxStats> {
    let mut stats = unsent_stats(conn, now_ms)?;
    stats.sent = Some(crate::store::sqlite::diagnostics::sent_count(conn)?);
    Ok(stats)
}

/// The outbox counts except `Sent`: every row that is not delivered yet,
/// and the time of the last delivery. Its cost does not grow with the
/// number of kept `Sent` rows; the health check uses it.
pub fn unsent_stats(conn: &Connection, now_ms: i64) -> rusqlite::Result<OutboxStats> {
    Ok(fold_unsent(
        crate::store::sqlite::diagnostics::unsent_groups(conn, now_ms)?,
        crate::store::sqlite::diagnostics::last_sent_at(conn)?,
        now_ms,
    ))
}

/// [`outbox_stats`] on any store.
pub(super) fn outbox_stats_in(
    store: &dyn DiagnosticsStore,
    now_ms: i64,
) -> Result<OutboxStats, DiagnosticsError> {
    let mut stats = unsent_stats_in(store, now_ms)?;
    stats.sent = Some(store.sent_count()?);
    Ok(stats)
}

/// [`unsent_stats`] on any store.
pub(super) fn unsent_stats_in(
    store: &dyn DiagnosticsStore,
    now_ms: i64,
) -> Result<OutboxStats, DiagnosticsError> {
    Ok(fold_unsent(
        store.unsent_groups(now_ms)?,
        store.last_sent_at()?,
        now_ms,
    ))
}

/// The messages that need a human, oldest first.
pub fn attention_messages(
    conn: &Connection,
    filter: &AttentionFilter,
) -> Result<Vec<AttentionMessage>, DiagnosticsError> {
    attention_messages_in(conn, filter)
}

/// [`attention_messages`] on any store.
pub(super) fn attention_messages_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
) -> Result<Vec<AttentionMessage>, DiagnosticsError> {
    Ok(attention_page_in(store, filter, crate::store::now_ms())?.0)
}

/// One page of the failed list at `now_ms`, and the cursor of the next
/// page when there is one.
pub(super) fn attention_page_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
    now_ms: i64,
) -> Result<(Vec<AttentionMessage>, Option<String>), DiagnosticsError> {
    let limit = filter.limit.unwrap_or(100).clamp(1, MAX_LIST_LIMIT);
    let rows = resolve(filter, now_ms, true)?;
    // One row more than asked: whether there is a next page.
    let mut found = store.attention_rows(&rows, limit + 1)?;
    let next = if found.len() > limit as usize {
        found.truncate(limit as usize);
        found
            .last()
            .map(|row| encode_cursor(filter, row.created_at, &row.message_id))
    } else {
        None
    };
    Ok((
        found.into_iter().map(AttentionMessage::from).collect(),
        next,
    ))
}

/// The messages that need a human matching `filter` (its `cursor` and
/// `limit` refused or ignored), counted per destination and error code.
pub(super) fn failure_groups_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
    now_ms: i64,
) -> Result<Vec<FailureGroup>, DiagnosticsError> {
    let rows = resolve(filter, now_ms, false)?;
    Ok(fold_groups(store.error_groups(&rows)?))
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
pub(super) fn retry_message_in(
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
pub(super) fn retry_matching_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
    ttl: Duration,
    now_ms: i64,
) -> Result<usize, DiagnosticsError> {
    store.retry_matching(&bulk(filter, now_ms)?, now_ms, renewed_expiry(now_ms, ttl))
}

/// Puts one `Failed`, `DeadLetter` or `Expired` message aside: it becomes
/// `Discarded` at `now_ms`, is no longer counted by the health check, and
/// is deleted by retention `outbox.failed_retention` later. Nothing is
/// deleted now.
pub fn discard_message(
    conn: &Connection,
    message_id: &Uuid,
    now_ms: i64,
) -> Result<(), DiagnosticsError> {
    discard_message_in(conn, message_id, now_ms)
}

/// [`discard_message`] on any store.
pub(super) fn discard_message_in(
    store: &dyn DiagnosticsStore,
    message_id: &Uuid,
    now_ms: i64,
) -> Result<(), DiagnosticsError> {
    let id = message_id.to_string();
    if store.discard_one(&id, now_ms)? == 1 {
        return Ok(());
    }
    match store.status_of(&id)?.as_deref().and_then(Status::parse) {
        None => Err(DiagnosticsError::NotFound(id)),
        Some(status) => Err(DiagnosticsError::NotDiscardable {
            message_id: id,
            status,
        }),
    }
}

/// [`discard_message`] for every message matching `filter` (its `limit` is
/// ignored); returns how many were put aside.
pub fn discard_matching(
    conn: &Connection,
    filter: &AttentionFilter,
    now_ms: i64,
) -> Result<usize, DiagnosticsError> {
    discard_matching_in(conn, filter, now_ms)
}

/// [`discard_matching`] on any store.
pub(super) fn discard_matching_in(
    store: &dyn DiagnosticsStore,
    filter: &AttentionFilter,
    now_ms: i64,
) -> Result<usize, DiagnosticsError> {
    store.discard_matching(&bulk(filter, now_ms)?, now_ms)
}

/// The expiry of a message retried by hand at `now_ms`: a full TTL from now.
fn renewed_expiry(now_ms: i64, ttl: Duration) -> i64 {
    now_ms.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
}

/// Messages matching `filter` (or the one `message_id`) that are waiting for
/// a human and were created longer than `age` before `now_ms`.
pub(super) fn count_older(
    store: &dyn DiagnosticsStore,
    message_id: Option<&str>,
    filter: &AttentionFilter,
    now_ms: i64,
    age: Duration,
) -> Result<usize, DiagnosticsError> {
    let before_ms = now_ms.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
    store.count_older(message_id, &bulk(filter, now_ms)?, before_ms)
}

/// The filter of a bulk retry or discard (or of the count of old rows it
/// would touch), resolved at `now_ms`: the list's filters without paging
/// (`cursor` and `limit` are refused, so a filter never matches more or less
/// than the caller meant).
fn bulk(filter: &AttentionFilter, now_ms: i64) -> Result<RowFilter, DiagnosticsError> {
    filter.without_paging()?;
    resolve(filter, now_ms, false)
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
        crate::store::sqlite::diagnostics::unsent_groups(conn, now_ms)?,
        now_ms,
        configured,
    ))
}
