//! The dispatcher's database work, written once for every store: which rows
//! a claim takes (and which it expires or gives back), and what each
//! verdict writes to its row. A store supplies the statements
//! ([`OutboxTx`], one open transaction) and the transactions around them
//! ([`DispatchDb`]): `crate::store::sqlite::dispatch`; the sqlx stores' are async (`store/sqlx_*/dispatch.rs`).

use std::time::Duration;

use crate::circuit::Admission;
use crate::config::Config;
use crate::failures::{Failure, FinalStatus};
use crate::store::StoreError;

use super::{Attempt, Claimed, Group, Verdict, backoff};

/// The dispatcher's three database operations, each one transaction. Called
/// on the blocking pool, or, for a claim while nothing is in flight and
/// [`claims_on_dispatcher_worker`](Self::claims_on_dispatcher_worker), on
/// a worker of the dispatcher's own runtime.
pub(crate) trait DispatchDb: Send + Sync + 'static {
    /// Whether a claim may run on a worker of the dispatcher's runtime: not
    /// for a client that starts a runtime itself, as the synchronous
    /// `postgres` client does.
    fn claims_on_dispatcher_worker(&self) -> bool {
        false
    }

    /// Destinations with waiting rows (`Pending` or `Sending`).
    fn discover(&self) -> Result<Vec<String>, StoreError>;

    /// The decommissioned interface versions (`crate::lifecycle`).
    fn decommissioned(&self) -> Result<Vec<(String, u32, i64)>, StoreError>;

    /// Claims due rows as `plan` admits them, and gives `claimed` the groups
    /// to send and how many rows expired instead (or why the claim failed):
    /// once the claim committed, or earlier if the rows may be sent before
    /// it does (see `sqlite.rs`).
    fn claim(
        &self,
        plan: &[(String, Admission)],
        lease_ms: i64,
        row_budget: usize,
        capacity: usize,
        claimed: ClaimSender,
        commit: ClaimCommit,
    );

    /// Commits a claim left open by [`ClaimCommit::Later`], if one is.
    fn finish_claim(&self) {}

    /// Writes the attempts' results; returns what changed once committed.
    fn record(
        &self,
        attempts: &[(Attempt, Verdict)],
        config: &Config,
    ) -> Result<RecordCounts, StoreError>;
}

/// When a claim whose rows may leave before it commits does commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimCommit {
    /// Before `claim` returns.
    Now,
    /// At [`DispatchDb::finish_claim`], or before the connection's next
    /// use, whichever comes first: the caller sends the rows first.
    Later,
}

/// Where a claim's result goes.
pub(crate) type ClaimSender = tokio::sync::oneshot::Sender<Result<Claim, StoreError>>;

/// What one claim came to.
#[derive(Debug, Default)]
pub(crate) struct Claim {
    /// The rows to send, cut into requests.
    pub groups: Vec<Group>,
    /// Rows found past their TTL and marked `Expired` instead.
    pub expired: u64,
    /// Rows found past their TTL whose interface version has a failure
    /// handler: still claimed (`Sending` under the claim's lease), for the
    /// dispatcher to record `Expired` at once, in a transaction where the
    /// handler runs (`Verdict::Expired`).
    pub expiring: Vec<Claimed>,
    /// When a claim that took nothing found the next waiting row of its
    /// destinations due (Unix ms): a durable timer, a retry's backoff, a
    /// lease. The dispatcher sleeps until then rather than until its next
    /// poll, so such a row leaves within milliseconds of its due time.
    pub next_due: Option<i64>,
}

/// What one recording transaction changed, added to the metrics after it commits.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RecordCounts {
    pub sent: u64,
    pub dead_lettered: u64,
    pub failed: u64,
    pub retries: u64,
    pub expired: u64,
}

/// The statements of claims and results, in one open transaction. Every
/// update of a claimed row is fenced on its lease token and on `Sending`:
/// `Ok(false)` when the fence no longer holds (the lease ran out and the row
/// is someone else's now).
pub(crate) trait OutboxTx {
    /// Moves at most `limit` due rows of `destination` (`Pending`, or
    /// `Sending` with an expired lease) to `Sending` under `lease`, oldest
    /// due first, and returns them with their `expires_at`. Rows locked by
    /// another dispatcher's claim are skipped, never waited for.
    fn claim_due(
        &mut self,
        destination: &str,
        lease: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<(Claimed, i64)>, StoreError>;
    /// When the earliest waiting row (`Pending` or `Sending`) of
    /// `destination` due after `now` is due: one look-up at the start of
    /// the `outbox_due` index past `now`.
    fn next_due(&mut self, destination: &str, now: i64) -> Result<Option<i64>, StoreError>;
    /// Marks a claimed row `Expired` (its TTL passed).
    fn expire(&mut self, row: &Claimed) -> Result<(), StoreError>;
    /// Gives a claimed row back (due at `now`).
    fn release(&mut self, row: &Claimed, now: i64) -> Result<(), StoreError>;
    /// Ends a claimed row in `status` (`Failed`, `DeadLetter`, `Expired`)
    /// with `error`; whether the lease still held it.
    fn mark_final(&mut self, row: &Claimed, status: &str, error: &str) -> Result<bool, StoreError>;
    /// Gives a claimed row back `Pending`, due at `next_at`, after its
    /// `retry_count`-th failed attempt; whether the lease still held it.
    fn schedule_retry(
        &mut self,
        row: &Claimed,
        retry_count: u32,
        next_at: i64,
        error: &str,
    ) -> Result<bool, StoreError>;
    /// Marks a claimed row `Sent` with the receiver's `response`; whether
    /// the lease still held it.
    fn mark_sent(&mut self, row: &Claimed, now: i64, response: &str) -> Result<bool, StoreError>;
    /// [`mark_sent`](Self::mark_sent) for several rows (no response
    /// handler involved); how many changed. One statement where the store
    /// can (PostgreSQL: a round trip per statement), else one per row.
    fn mark_sent_many(&mut self, rows: &[(&Claimed, String)], now: i64) -> Result<u64, StoreError> {
        let mut changed = 0;
        for (row, response) in rows {
            if self.mark_sent(row, now, response)? {
                changed += 1;
            }
        }
        Ok(changed)
    }
    /// Holds a claimed row of a decommissioned version (`Pending`, due at
    /// `lifecycle::HELD_DUE_MS`, `error`) if `rf_decommissioned` still lists
    /// its version; gives it back due at `now` if a re-commission committed
    /// meanwhile, so no row is ever held for a version that is back. On
    /// PostgreSQL the check locks the table row (`FOR SHARE`): a
    /// re-commission's delete waits for this transaction, and its release
    /// then sees the held row.
    fn hold_if_decommissioned(
        &mut self,
        row: &Claimed,
        now: i64,
        error: &str,
    ) -> Result<bool, StoreError>;
    /// Whether a response handler is registered for the row's interface version.
    fn has_answer_handler(&self, row: &Claimed) -> bool;
    fn savepoint(&mut self) -> Result<(), StoreError>;
    fn release_savepoint(&mut self) -> Result<(), StoreError>;
    fn rollback_to_savepoint(&mut self) -> Result<(), StoreError>;
    /// Runs the row's response handler in this transaction; `Some(error)`
    /// when it failed.
    fn act_on_answer(&mut self, row: &Claimed, response: &serde_json::Value) -> Option<String>;
    /// Whether a failure handler is registered for the row's interface
    /// version (`crate::failures`).
    fn has_failure_handler(&self, row: &Claimed) -> bool;
    /// Runs the row's failure handler in this transaction; `Some(error)`
    /// when it failed.
    fn act_on_failure(&mut self, row: &Claimed, failure: &Failure<'_>) -> Option<String>;
}

/// The claim: due rows, destination by destination as `plan` admits them,
/// at most `row_budget` rows in at most `capacity` groups. Rows past their
/// TTL are marked `Expired` instead (their count is returned). A claim
/// that took nothing also reads when the next row of `plan` is due.
pub(crate) fn claim_in(
    tx: &mut impl OutboxTx,
    plan: &[(String, Admission)],
    lease_ms: i64,
    row_budget: usize,
    capacity: usize,
) -> Result<Claim, StoreError> {
    let now = crate::store::now_ms();
    let lease = uuid::Uuid::now_v7().to_string();
    let mut groups = Vec::new();
    let mut expired_total = 0;
    let mut expiring = Vec::new();
    let mut rows_left = row_budget;
    let mut groups_left = capacity;
    for (destination, admission) in plan {
        if rows_left == 0 || groups_left == 0 {
            break;
        }
        let (limit, per_group, probe) = match *admission {
            Admission::Probe => (1, 1, true),
            Admission::Closed { batch_limit } => {
                let per_group = batch_limit.max(1);
                (rows_left.min(per_group * groups_left), per_group, false)
            }
            Admission::Blocked { .. } => continue,
        };
        let mut live = Vec::new();
        for (claimed, expires_at) in
            tx.claim_due(destination, &lease, now, now + lease_ms, limit)?
        {
            if expires_at <= now && tx.has_failure_handler(&claimed) {
                expiring.push(claimed);
            } else if expires_at <= now {
                tx.expire(&claimed)?;
                expired_total += 1;
            } else {
                live.push(claimed);
            }
        }
        rows_left = rows_left.saturating_sub(live.len());
        let mut live = live.into_iter().peekable();
        while live.peek().is_some() && groups_left > 0 {
            let rows: Vec<Claimed> = live.by_ref().take(per_group).collect();
            groups_left -= 1;
            groups.push(Group {
                destination: destination.clone(),
                rows,
                probe,
            });
        }
        // Rows beyond the group capacity are given back.
        for row in live {
            tx.release(&row, now)?;
        }
    }
    // Only when idle: a claim that took rows is followed by another at
    // once, and the look-up would cost every busy claim (a round trip on
    // PostgreSQL) for nothing.
    let mut next_due = None;
    if groups.is_empty() && expired_total == 0 && expiring.is_empty() {
        for (destination, _) in plan {
            if let Some(due) = tx.next_due(destination, now)? {
                next_due = Some(next_due.map_or(due, |next: i64| next.min(due)));
            }
        }
    }
    Ok(Claim {
        groups,
        expired: expired_total,
        expiring,
        next_due,
    })
}

/// Writes what each attempt came to, as the wire protocol's table says.
pub(crate) fn record_in(
    tx: &mut impl OutboxTx,
    attempts: &[(Attempt, Verdict)],
    config: &Config,
) -> Result<RecordCounts, StoreError> {
    let now = crate::store::now_ms();
    let mut counts = RecordCounts::default();
    let backoff_of = |retry: u32| {
        backoff(
            retry,
            config.outbox.backoff_base,
            config.outbox.backoff_max,
            config.outbox.jitter,
        )
    };
    let at = |delay: Duration| now + delay.as_millis() as i64;
    // Answers nobody acts on are recorded together.
    let plain: Vec<(&Claimed, String)> = attempts
        .iter()
        .filter_map(|((row, _, _), verdict)| match verdict {
            Verdict::Sent { response } if !tx.has_answer_handler(row) => {
                Some((row, serde_json::to_string(response).unwrap_or_default()))
            }
            // The answer comes later, through the broker: no response yet.
            Verdict::Published => Some((row, "null".to_owned())),
            _ => None,
        })
        .collect();
    if !plain.is_empty() {
        counts.sent += tx.mark_sent_many(&plain, now)?;
    }
    for ((row, _, _), verdict) in attempts {
        match verdict {
            Verdict::Sent { .. } if !tx.has_answer_handler(row) => {}
            Verdict::Published => {}
            Verdict::Sent { response } => {
                // A response handler's writes and the `Sent` status commit
                // together or roll back together.
                tx.savepoint()?;
                let response_text = serde_json::to_string(response).unwrap_or_default();
                let changed = tx.mark_sent(row, now, &response_text)?;
                let failed = if changed {
                    // What the response handler enqueues continues the
                    // message's trace.
                    let headers = serde_json::from_str(&row.headers).unwrap_or_default();
                    match crate::trace::TraceParent::from_headers(&headers) {
                        Some(traceparent) => crate::trace::with_traceparent(traceparent, || {
                            tx.act_on_answer(row, response)
                        }),
                        None => tx.act_on_answer(row, response),
                    }
                } else {
                    None
                };
                if let Some(error) = failed {
                    tx.rollback_to_savepoint()?;
                    tracing::warn!(message_id = %row.message_id, %error, "response handler failed; the message is sent again");
                    let attempt = row.retry_count + 1;
                    if attempt > row.max_retries {
                        if end(tx, row, FinalStatus::Failed, &error)? {
                            counts.failed += 1;
                        }
                    } else if tx.schedule_retry(
                        row,
                        attempt,
                        at(backoff_of(row.retry_count)),
                        &error,
                    )? {
                        counts.retries += 1;
                    }
                    continue;
                }
                tx.release_savepoint()?;
                if changed {
                    counts.sent += 1;
                }
            }
            Verdict::DeadLetter { error } => {
                tracing::warn!(message_id = %row.message_id, %error, "message dead-lettered");
                if end(tx, row, FinalStatus::DeadLetter, error)? {
                    counts.dead_lettered += 1;
                }
            }
            Verdict::Failed { error } => {
                tracing::error!(message_id = %row.message_id, %error, "message failed; an operator decides");
                if end(tx, row, FinalStatus::Failed, error)? {
                    counts.failed += 1;
                }
            }
            Verdict::Expired => {
                tracing::warn!(message_id = %row.message_id, "message expired");
                if end(tx, row, FinalStatus::Expired, EXPIRED)? {
                    counts.expired += 1;
                }
            }
            Verdict::Retry {
                error,
                retry_after,
                dead_letter_when_exhausted,
            } => {
                let attempt = row.retry_count + 1;
                if attempt > row.max_retries {
                    let status = if *dead_letter_when_exhausted {
                        FinalStatus::DeadLetter
                    } else {
                        FinalStatus::Failed
                    };
                    tracing::error!(message_id = %row.message_id, %error, "giving up after {} retries", row.max_retries);
                    if end(tx, row, status, error)? {
                        if *dead_letter_when_exhausted {
                            counts.dead_lettered += 1;
                        } else {
                            counts.failed += 1;
                        }
                    }
                    continue;
                }
                let delay = backoff_of(row.retry_count).max(retry_after.unwrap_or_default());
                tracing::debug!(
                    name: "retry",
                    message_id = %row.message_id,
                    attempt,
                    delay_ms = delay.as_millis() as u64,
                    %error,
                    "send failed; retrying"
                );
                if tx.schedule_retry(row, attempt, at(delay), error)? {
                    counts.retries += 1;
                }
            }
            // Held until the version is re-commissioned: not counted, never
            // due, never expired (`crate::lifecycle`).
            Verdict::Held { error } => {
                tracing::info!(message_id = %row.message_id, %error, "message held");
                tx.hold_if_decommissioned(row, now, error)?;
            }
            // Not counted: the row waits (its circuit gates an unreachable
            // destination) and is due again after one base backoff.
            Verdict::Unavailable { error, retry_after }
            | Verdict::Wait {
                error, retry_after, ..
            } => {
                let delay = backoff_of(0).max(retry_after.unwrap_or_default());
                tracing::debug!(
                    name: "retry",
                    message_id = %row.message_id,
                    attempt = row.retry_count,
                    delay_ms = delay.as_millis() as u64,
                    %error,
                    "not delivered; retrying (not counted)"
                );
                if tx.schedule_retry(row, row.retry_count, at(delay), error)? {
                    counts.retries += 1;
                }
            }
        }
    }
    Ok(counts)
}

/// The `last_error` of a row past its time to live.
pub(crate) const EXPIRED: &str = "time to live exceeded";

/// Ends a claimed row in `status` with `error` and runs its failure handler
/// in the same transaction, if its interface version has one; whether the
/// lease still held the row. A handler that fails has its writes rolled
/// back (a savepoint) and its error appended to `last_error`: the row ends
/// in `status` all the same, so a failing handler never keeps a row (or the
/// dispatcher) from moving on (see `crate::failures`).
fn end(
    tx: &mut impl OutboxTx,
    row: &Claimed,
    status: FinalStatus,
    error: &str,
) -> Result<bool, StoreError> {
    if !tx.has_failure_handler(row) {
        return tx.mark_final(row, status.as_str(), error);
    }
    tx.savepoint()?;
    if !tx.mark_final(row, status.as_str(), error)? {
        tx.release_savepoint()?;
        return Ok(false);
    }
    let payload = serde_json::from_str(&row.payload).unwrap_or(serde_json::Value::Null);
    let headers = serde_json::from_str(&row.headers).unwrap_or_default();
    let traceparent = crate::trace::TraceParent::from_headers(&headers);
    let trace_id = traceparent.map(|t| t.trace_id().to_string());
    let failure = Failure {
        message_id: &row.message_id,
        status,
        interface: &row.interface,
        version: row.version,
        endpoint: &row.endpoint,
        correlation_id: row.correlation_id.as_deref(),
        retries: row.retry_count,
        error,
        trace_id: trace_id.as_deref(),
        created_at_ms: row.created_at_ms,
        payload: &payload,
    };
    // What the failure handler enqueues continues the message's trace.
    let failed = match traceparent {
        Some(traceparent) => {
            crate::trace::with_traceparent(traceparent, || tx.act_on_failure(row, &failure))
        }
        None => tx.act_on_failure(row, &failure),
    };
    match failed {
        None => tx.release_savepoint()?,
        Some(handler_error) => {
            tx.rollback_to_savepoint()?;
            tracing::error!(message_id = %row.message_id, %status, error = %handler_error, "failure handler failed; the message ends without its effects");
            let both = format!("{error}; failure handler: {handler_error}");
            tx.mark_final(row, status.as_str(), &both)?;
        }
    }
    Ok(true)
}

/// The answer of a response handler as the trait passes it.
pub(crate) fn answer_of<'a>(
    row: &'a Claimed,
    response: &'a serde_json::Value,
) -> crate::responses::Answer<'a> {
    crate::responses::Answer {
        message_id: &row.message_id,
        interface: &row.interface,
        version: row.version,
        endpoint: &row.endpoint,
        correlation_id: row.correlation_id.as_deref(),
        payload: response,
    }
}
