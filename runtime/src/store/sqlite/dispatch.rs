//! The dispatcher's statements on SQLite: one connection, claims in
//! `BEGIN IMMEDIATE` transactions (one writer at a time, so two dispatchers
//! on one file never claim the same row).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension as _, params};

use crate::circuit::Admission;
use crate::config::{Config, Durability};
use crate::failures::{Failure, FailureHandler, FailureHandlers};
use crate::responses::ResponseHandler;
use crate::store::Sqlite;
use crate::store::StoreError;
use crate::store::sqlite as db;

use crate::dispatcher::records::{
    self, Claim, ClaimCommit, ClaimSender, DispatchDb, OutboxTx, RecordCounts,
};
use crate::dispatcher::{Attempt, Claimed, Verdict};

/// Held for the life of a dispatcher on one SQLite file: an exclusive
/// `flock` on `<db>.dispatcher-lock`, which the kernel releases when the
/// process dies, however it dies. A dispatcher that gets it knows that no
/// other live process dispatches from the file, so rows left `Sending` were
/// claimed by one that is gone: they are due at once instead of after their
/// lease. The lock is on a file of its own because closing any descriptor
/// of the database file would drop SQLite's own POSIX locks on it.
pub(crate) struct ExclusiveDispatch {
    _file: std::fs::File,
}

impl ExclusiveDispatch {
    /// The lock for `db_path`, or `None` while another dispatcher (in this
    /// process or another) holds it, or where it cannot be taken (a
    /// read-only folder): then rows wait for their lease, as on PostgreSQL.
    pub(crate) fn try_acquire(db_path: &std::path::Path) -> Option<Self> {
        let mut path = db_path.as_os_str().to_owned();
        path.push(".dispatcher-lock");
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(path = %std::path::Path::new(&path).display(), %error, "cannot open the dispatcher's lock file; rows a crashed dispatcher left `Sending` wait for their lease");
                return None;
            }
        };
        match file.try_lock() {
            Ok(()) => Some(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => None,
            Err(std::fs::TryLockError::Error(error)) => {
                tracing::warn!(%error, "cannot lock the dispatcher's lock file; rows a crashed dispatcher left `Sending` wait for their lease");
                None
            }
        }
    }
}

/// Makes every `Sending` row due now (`now`, Unix milliseconds): called by
/// a dispatcher that holds [`ExclusiveDispatch`], so their claimer is gone.
/// The next claim takes them under a fresh lease, which fences out anything
/// the dead claimer might still have written. Returns how many there were.
pub(crate) fn reclaim_abandoned(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    conn.execute(
        "UPDATE outbox_messages SET next_retry_at = ?1 \
         WHERE status = 'Sending' AND next_retry_at > ?1",
        params![now],
    )
}

pub(crate) struct SqliteDispatch {
    conn: Mutex<Connection>,
    /// Kept for the dispatcher's life (see [`ExclusiveDispatch`]).
    _exclusive: Option<ExclusiveDispatch>,
    durability: Durability,
    /// Whether a claim under `full` hands its rows over before it commits
    /// (cleared by a claim whose commit failed after it did, set again by
    /// the next that commits).
    send_before_commit: AtomicBool,
    responses: Vec<Arc<dyn ResponseHandler<Sqlite>>>,
    failures: OnFailure,
}

/// The failure handlers a SQLite dispatcher runs itself, and the interface
/// versions whose handlers run elsewhere (on a sqlx pool: `sqlx_sqlite`),
/// whose rows past their TTL a claim leaves for the recording to expire.
#[derive(Default)]
pub(crate) struct OnFailure {
    pub(crate) handlers: FailureHandlers<dyn FailureHandler<Sqlite>>,
    pub(crate) elsewhere: Vec<(&'static str, u32)>,
}

impl SqliteDispatch {
    pub(crate) fn new(
        conn: Connection,
        exclusive: Option<ExclusiveDispatch>,
        durability: Durability,
        responses: Vec<Arc<dyn ResponseHandler<Sqlite>>>,
        failures: OnFailure,
    ) -> Self {
        conn.busy_handler(Some(wait_for_writer))
            .expect("setting a busy handler cannot fail on an open connection");
        Self {
            conn: Mutex::new(conn),
            _exclusive: exclusive,
            durability,
            send_before_commit: AtomicBool::new(true),
            responses,
            failures,
        }
    }

    /// The connection, with no claim left open on it: one that
    /// [`ClaimCommit::Later`] left open commits first.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        if !conn.is_autocommit() {
            self.commit_open_claim(&conn);
        }
        Ok(conn)
    }

    /// Commits the claim left open on `conn`, whose rows have gone out
    /// already. A failure is handled as that of any claim that sent before
    /// it committed (see `claim_sending`).
    fn commit_open_claim(&self, conn: &Connection) {
        match conn.execute_batch("COMMIT") {
            Ok(()) => self.send_before_commit.store(true, Ordering::Relaxed),
            Err(error) => {
                self.send_before_commit.store(false, Ordering::Relaxed);
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                warn_unclaimed_sent(&StoreError::SqliteStatement(error));
            }
        }
    }

    /// The claim. Its groups go to `early` before the commit when they may
    /// (`early` is `None` afterwards, and the `Ok` value empty).
    fn claim_sending(
        &self,
        plan: &[(String, Admission)],
        lease_ms: i64,
        row_budget: usize,
        capacity: usize,
        early: &mut Option<ClaimSender>,
        commit: ClaimCommit,
    ) -> Result<Claim, StoreError> {
        let mut conn = self.lock()?;
        // Nothing may leave before the transaction that enqueued it is on
        // disk. Under `outbox.durability: normal` an enqueuing commit is not
        // (NORMAL syncs the WAL only at checkpoints), so the claim commits
        // with FULL: its fsync of the WAL makes every transaction committed
        // before it durable (one fsync per claim, none per enqueue). Without
        // it a power cut after the receiver's 2xx could undo the very
        // transaction whose message the receiver processed (test
        // `powerloss_sender_normal_never_delivers_a_transaction_it_can_lose`).
        // Under `full` every enqueuing commit was fsynced already
        // (`Outbox::enqueue` refuses a connection that commits with less), so
        // the claim needs no fsync of its own, and a message's path from
        // commit to receiver has none. Recording results never needs one: a
        // result lost in a power cut means a re-send, answered as a duplicate.
        let sync_claim = self.durability == Durability::Normal;
        if sync_claim {
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(text)?;
        }
        let claimed = (|| -> Result<Claim, StoreError> {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(text)?;
            let mut ops = SqliteOps {
                tx: &tx,
                responses: &self.responses,
                failures: &self.failures,
            };
            let claimed = records::claim_in(&mut ops, plan, lease_ms, row_budget, capacity)?;
            // Under `full` the rows may leave before the claim commits: what
            // they carry is on disk already (see above), and no other
            // dispatcher can claim them while this transaction holds the
            // write lock. Sending then overlaps the commit (see BENCHMARKS.md,
            // "Commit -> effect"). A claim on the
            // dispatcher's loop worker (`ClaimCommit::Later`) is left open
            // instead, and commits once the loop has written its requests:
            // its write lock lasts that much longer. Should the commit
            // fail, the rows are still due and unleased: they go again, are
            // answered as duplicates, and their first recording finds its
            // lease fence broken and writes nothing. After such a failure
            // claims commit before they send, until one commits again, so
            // a disk that stays full does not turn into a loop of re-sends.
            // A claim that expired rows commits first too: the expired count
            // goes into the metrics with the groups, and a count must not
            // move for a change that may not commit.
            if !sync_claim
                && claimed.expired == 0
                && self.send_before_commit.load(Ordering::Relaxed)
                && let Some(early) = early.take()
            {
                let leave_open = commit == ClaimCommit::Later && !claimed.groups.is_empty();
                let _ = early.send(Ok(claimed));
                if leave_open {
                    // Left open: `lock` or `finish_claim` commits it.
                    let mut tx = tx;
                    tx.set_drop_behavior(rusqlite::DropBehavior::Ignore);
                    return Ok(Claim::default());
                }
                return match tx.commit() {
                    Ok(()) => Ok(Claim::default()),
                    Err(error) => {
                        self.send_before_commit.store(false, Ordering::Relaxed);
                        Err(text(error))
                    }
                };
            }
            tx.commit().map_err(text)?;
            self.send_before_commit.store(true, Ordering::Relaxed);
            Ok(claimed)
        })();
        if sync_claim {
            conn.pragma_update(None, "synchronous", "NORMAL")
                .map_err(text)?;
        }
        claimed
    }
}

/// The dispatcher connection's busy handler, in place of SQLite's
/// `busy_timeout` one: that one sleeps 1, 2, 5, 10 … ms between tries, and
/// the dispatcher's first claim after an enqueue nearly always finds the
/// enqueuing transaction still committing (`Outbox::enqueue` wakes the
/// dispatcher from inside it), so every message waited a millisecond or
/// more for a lock released a few microseconds later. This one yields the
/// processor between tries (a try is one `fcntl`) for the first 1.5 ms,
/// longer than nearly every commit's fsync takes (the measured waits are in
/// BENCHMARKS.md, "Commit -> effect"), then sleeps 50 µs at a time until
/// 3 ms, then 1 ms,
/// and gives up after [`db::BUSY_TIMEOUT`] as before. Yielding gives the
/// processor to any thread that wants it, so the wait only spends a
/// processor nobody else needs, and only while a transaction that wrote to
/// the outbox is still committing.
fn wait_for_writer(attempt: i32) -> bool {
    use std::time::{Duration, Instant};
    thread_local! {
        static FIRST_TRY: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = Instant::now();
    let first = FIRST_TRY.with(|first| {
        if attempt == 0 || first.get().is_none() {
            first.set(Some(now));
        }
        first.get().unwrap_or(now)
    });
    let waited = now.duration_since(first);
    if waited >= db::BUSY_TIMEOUT {
        return false;
    }
    if waited < Duration::from_micros(1500) {
        std::thread::yield_now();
    } else if waited < Duration::from_millis(3) {
        std::thread::sleep(Duration::from_micros(50));
    } else {
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// A claim whose rows went out failed to commit.
fn warn_unclaimed_sent(error: &StoreError) {
    tracing::warn!(%error, "an outbox claim failed to commit after its rows went out; they are sent again after their lease and answered as duplicates");
}

fn text(error: rusqlite::Error) -> StoreError {
    StoreError::SqliteStatement(error)
}

impl DispatchDb for SqliteDispatch {
    fn claims_on_dispatcher_worker(&self) -> bool {
        true
    }

    fn discover(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.lock()?;
        let mut statement = conn
            .prepare_cached(
                "SELECT destination FROM outbox_messages WHERE status IN ('Pending', 'Sending') \
                 AND destination > ?1 ORDER BY destination LIMIT 1",
            )
            .map_err(text)?;
        let mut destinations = Vec::new();
        let mut after = String::new();
        while let Some(next) = statement
            .query_row([&after], |row| row.get::<_, String>(0))
            .optional()
            .map_err(text)?
        {
            destinations.push(next.clone());
            after = next;
        }
        Ok(destinations)
    }

    fn decommissioned(&self) -> Result<Vec<(String, u32, i64)>, StoreError> {
        crate::store::sqlite::lifecycle::read(&*self.lock()?).map_err(text)
    }

    fn claim(
        &self,
        plan: &[(String, Admission)],
        lease_ms: i64,
        row_budget: usize,
        capacity: usize,
        claimed: ClaimSender,
        commit: ClaimCommit,
    ) {
        let mut claimed = Some(claimed);
        let result = self.claim_sending(plan, lease_ms, row_budget, capacity, &mut claimed, commit);
        if let Some(claimed) = claimed {
            let _ = claimed.send(result);
        } else if let Err(error) = result {
            warn_unclaimed_sent(&error);
        }
    }

    fn finish_claim(&self) {
        // `lock` commits what is open.
        drop(self.lock());
    }

    fn record(
        &self,
        attempts: &[(Attempt, Verdict)],
        config: &Config,
    ) -> Result<RecordCounts, StoreError> {
        let mut conn = self.lock()?;
        let tx = conn.transaction().map_err(text)?;
        let mut ops = SqliteOps {
            tx: &tx,
            responses: &self.responses,
            failures: &self.failures,
        };
        let counts = records::record_in(&mut ops, attempts, config)?;
        tx.commit().map_err(text)?;
        Ok(counts)
    }
}

struct SqliteOps<'t, 'c> {
    tx: &'t rusqlite::Transaction<'c>,
    responses: &'t [Arc<dyn ResponseHandler<Sqlite>>],
    failures: &'t OnFailure,
}

impl SqliteOps<'_, '_> {
    fn handler(&self, row: &Claimed) -> Option<&dyn ResponseHandler<Sqlite>> {
        self.responses
            .iter()
            .find(|h| h.interface() == (row.interface.as_str(), row.version))
            .map(|h| h.as_ref())
    }
}

/// The due rows of a destination, oldest due first (index `outbox_due`).
///
/// `LIMIT +?3`, not `LIMIT ?3`: SQLite's planner reads a bare bound `LIMIT`
/// and marks the statement to be re-prepared whenever it is bound again, so
/// every claim parsed and planned this statement anew; the unary plus leaves the value the same and the prepared plan in place
/// (test `claiming_reuses_its_prepared_statements`).
const CLAIM_SELECT: &str = "SELECT message_id, correlation_id, message_type, interface, version, \
     fingerprint, endpoint, payload, headers, retry_count, max_retries, created_at, expires_at, seq \
     FROM outbox_messages \
     WHERE destination = ?1 AND status IN ('Pending', 'Sending') AND next_retry_at <= ?2 \
     ORDER BY next_retry_at LIMIT +?3";

/// When the next waiting row of a destination is due, after `?2`: one
/// look-up in `outbox_due` (`OutboxTx::next_due`).
pub(crate) const NEXT_DUE: &str = "SELECT next_retry_at FROM outbox_messages \
     WHERE destination = ?1 AND status IN ('Pending', 'Sending') AND next_retry_at > ?2 \
     ORDER BY next_retry_at LIMIT 1";

/// Claims one of them by its key (`seq`, the rowid): `Sending` under this
/// claim's lease until `?3`.
const CLAIM_UPDATE: &str = "UPDATE outbox_messages \
     SET status = 'Sending', lease_token = ?2, next_retry_at = ?3, last_attempt_at = ?4 \
     WHERE seq = ?1";

impl OutboxTx for SqliteOps<'_, '_> {
    fn claim_due(
        &mut self,
        destination: &str,
        lease: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<(Claimed, i64)>, StoreError> {
        // Read the due rows, then claim each by its key: one
        // `UPDATE … WHERE message_id IN (SELECT …) RETURNING …` spent most
        // of a single-row claim in the temporary b-trees
        // SQLite builds for the sub-select and for RETURNING (see
        // `claiming_builds_no_temporary_btree`); these two build none.
        let mut select = self.tx.prepare_cached(CLAIM_SELECT).map_err(text)?;
        let rows = select
            .query_map(params![destination, now, limit as i64], |r| {
                Ok((
                    Claimed {
                        message_id: r.get(0)?,
                        seq: r.get(13)?,
                        lease: lease.to_owned(),
                        correlation_id: r.get(1)?,
                        message_type: r.get(2)?,
                        interface: r.get(3)?,
                        version: r.get(4)?,
                        fingerprint: r.get(5)?,
                        endpoint: r.get(6)?,
                        payload: r.get(7)?,
                        headers: r.get(8)?,
                        retry_count: r.get(9)?,
                        max_retries: r.get(10)?,
                        created_at_ms: r.get(11)?,
                    },
                    r.get::<_, i64>(12)?,
                ))
            })
            .map_err(text)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(text)?;
        let mut update = self.tx.prepare_cached(CLAIM_UPDATE).map_err(text)?;
        for (row, _) in &rows {
            update
                .execute(params![row.seq, lease, lease_until, now])
                .map_err(text)?;
        }
        Ok(rows)
    }

    fn next_due(&mut self, destination: &str, now: i64) -> Result<Option<i64>, StoreError> {
        self.tx
            .prepare_cached(NEXT_DUE)
            .and_then(|mut next| {
                next.query_row(params![destination, now], |r| r.get(0))
                    .optional()
            })
            .map_err(text)
    }

    fn expire(&mut self, row: &Claimed) -> Result<(), StoreError> {
        self.tx
            .execute(
                "UPDATE outbox_messages SET status = 'Expired', lease_token = NULL, \
                 last_error = 'time to live exceeded' WHERE seq = ?1 AND lease_token = ?2",
                params![row.seq, row.lease],
            )
            .map(drop)
            .map_err(text)
    }

    fn release(&mut self, row: &Claimed, now: i64) -> Result<(), StoreError> {
        self.tx
            .execute(
                "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, next_retry_at = ?3 \
                 WHERE seq = ?1 AND lease_token = ?2",
                params![row.seq, row.lease, now],
            )
            .map(drop)
            .map_err(text)
    }

    fn mark_final(&mut self, row: &Claimed, status: &str, error: &str) -> Result<bool, StoreError> {
        self.tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = ?3, last_error = ?4, lease_token = NULL \
                 WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
            )
            .and_then(|mut s| s.execute(params![row.seq, row.lease, status, error]))
            .map(|n| n == 1)
            .map_err(text)
    }

    fn schedule_retry(
        &mut self,
        row: &Claimed,
        retry_count: u32,
        next_at: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        self.tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = 'Pending', retry_count = ?3, next_retry_at = ?4, \
                 last_error = ?5, lease_token = NULL \
                 WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
            )
            .and_then(|mut s| {
                s.execute(params![row.seq, row.lease, retry_count, next_at, error])
            })
            .map(|n| n == 1)
            .map_err(text)
    }

    fn mark_sent(&mut self, row: &Claimed, now: i64, response: &str) -> Result<bool, StoreError> {
        self.tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3, response = ?4, lease_token = NULL, \
                 last_error = NULL WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
            )
            .and_then(|mut s| s.execute(params![row.seq, row.lease, now, response]))
            .map(|n| n == 1)
            .map_err(text)
    }

    fn hold_if_decommissioned(
        &mut self,
        row: &Claimed,
        now: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        self.tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, \
                 next_retry_at = CASE WHEN EXISTS (SELECT 1 FROM rf_decommissioned d \
                     WHERE d.interface = ?3 AND d.version = ?4) THEN ?5 ELSE ?6 END, \
                 last_error = CASE WHEN EXISTS (SELECT 1 FROM rf_decommissioned d \
                     WHERE d.interface = ?3 AND d.version = ?4) THEN ?7 ELSE last_error END \
                 WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
            )
            .and_then(|mut s| {
                s.execute(params![
                    row.seq,
                    row.lease,
                    row.interface,
                    row.version,
                    crate::lifecycle::HELD_DUE_MS,
                    now,
                    error
                ])
            })
            .map(|n| n == 1)
            .map_err(text)
    }

    fn has_answer_handler(&self, row: &Claimed) -> bool {
        self.handler(row).is_some()
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.tx
            .execute_batch("SAVEPOINT rfidl_answer")
            .map_err(text)
    }

    fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.tx.execute_batch("RELEASE rfidl_answer").map_err(text)
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.tx
            .execute_batch("ROLLBACK TO rfidl_answer; RELEASE rfidl_answer")
            .map_err(text)
    }

    fn act_on_answer(&mut self, row: &Claimed, response: &serde_json::Value) -> Option<String> {
        let handler = self.handler(row)?;
        handler
            .handle(&records::answer_of(row, response), self.tx)
            .err()
            .map(|error| format!("response handler: {error}"))
    }

    fn has_failure_handler(&self, row: &Claimed) -> bool {
        let key = (row.interface.as_str(), row.version);
        self.failures.handlers.get(key.0, key.1).is_some()
            || self.failures.elsewhere.iter().any(|(i, v)| (*i, *v) == key)
    }

    fn act_on_failure(&mut self, row: &Claimed, failure: &Failure<'_>) -> Option<String> {
        let handler = self.failures.handlers.get(&row.interface, row.version)?;
        handler
            .handle(failure, self.tx)
            .err()
            .map(|e| e.to_string())
    }
}

/// Opens the dispatcher's connection on the SQLite file `path` and, when
/// this dispatcher is the file's only one, reclaims what a dispatcher that
/// is gone left `Sending`.
pub(crate) fn open(
    path: &std::path::Path,
    config: &crate::config::Config,
    responses: Vec<Arc<dyn crate::responses::ResponseHandler<crate::store::Sqlite>>>,
    failures: OnFailure,
) -> Result<Arc<dyn DispatchDb>, crate::store::StoreError> {
    // NORMAL: only a claim may need an fsync, and it asks for one itself
    // (see `SqliteDispatch::claim`).
    let conn = db::open(path, Durability::Normal)?;
    let exclusive = ExclusiveDispatch::try_acquire(path);
    if exclusive.is_some() {
        let reclaimed = reclaim_abandoned(&conn, db::now_ms()).map_err(|source| {
            crate::store::StoreError::Sqlite {
                path: path.display().to_string(),
                source,
            }
        })?;
        if reclaimed > 0 {
            tracing::info!(
                rows = reclaimed,
                "rows a dispatcher that is gone left `Sending` are due again now"
            );
        }
    }
    Ok(Arc::new(SqliteDispatch::new(
        conn,
        exclusive,
        config.outbox.durability,
        responses,
        failures,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claiming_builds_no_temporary_btree_and_uses_the_due_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = db::open(dir.path().join("o.db"), Durability::Normal).expect("open");
        let explain = |sql: &str, column: usize| -> Vec<String> {
            let mut statement = conn.prepare(sql).expect("explain");
            let nulls = vec![rusqlite::types::Null; statement.parameter_count()];
            statement
                .query_map(rusqlite::params_from_iter(nulls), |row| row.get(column))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        for sql in [CLAIM_SELECT, CLAIM_UPDATE, NEXT_DUE] {
            let ops = explain(&format!("EXPLAIN {sql}"), 1);
            assert!(
                !ops.iter()
                    .any(|op| op == "OpenEphemeral" || op == "SorterOpen"),
                "{sql}\nbuilds a temporary b-tree or sorts: {ops:?}"
            );
        }
        for sql in [CLAIM_SELECT, NEXT_DUE] {
            let plan = explain(&format!("EXPLAIN QUERY PLAN {sql}"), 3);
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX outbox_due")),
                "{sql}\n{plan:?}"
            );
        }
    }

    #[test]
    fn claiming_reuses_its_prepared_statements() {
        use rusqlite::StatementStatus::RePrepare;
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = db::open(dir.path().join("o.db"), Durability::Normal).expect("open");
        for seq in 1..=3 {
            conn.execute(
                "INSERT INTO outbox_messages (seq, message_id, message_type, destination, \
                 interface, version, fingerprint, endpoint, payload, headers, status, \
                 max_retries, next_retry_at, created_at, expires_at) \
                 VALUES (?1, ?1, 'Signal', 'd', 'i.I', 1, 'f', 'E', '{}', '{}', 'Pending', \
                 3, ?1, 0, 9)",
                [seq],
            )
            .expect("insert");
        }
        let mut select = conn.prepare(CLAIM_SELECT).expect("prepare");
        let count = |select: &mut rusqlite::Statement<'_>, limit: i64| {
            select
                .query_map(params!["d", 10, limit], |_| Ok(()))
                .expect("query")
                .count()
        };
        // Each binding of a new limit is honoured...
        assert_eq!(count(&mut select, 2), 2);
        assert_eq!(count(&mut select, 64), 3);
        assert_eq!(count(&mut select, 1), 1);
        // ...by the statement prepared once: a bare `LIMIT ?3` is re-prepared
        // on every execution.
        assert_eq!(select.get_status(RePrepare), 0, "{CLAIM_SELECT}");
        let mut update = conn.prepare(CLAIM_UPDATE).expect("prepare");
        for seq in 1..=3 {
            update
                .execute(params![seq, "lease", 20, 10])
                .expect("update");
        }
        assert_eq!(update.get_status(RePrepare), 0, "{CLAIM_UPDATE}");
        assert_eq!(count(&mut select, 64), 0, "every row is claimed");
    }

    #[test]
    fn a_bare_bound_limit_is_reprepared_on_every_execution() {
        // Why `CLAIM_SELECT` says `LIMIT +?3`: if a SQLite upgrade stops
        // re-preparing `LIMIT ?`, this fails and the plus can go.
        use rusqlite::StatementStatus::RePrepare;
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = db::open(dir.path().join("o.db"), Durability::Normal).expect("open");
        let bare = CLAIM_SELECT.replace("LIMIT +?3", "LIMIT ?3");
        assert_ne!(bare, CLAIM_SELECT);
        let mut select = conn.prepare(&bare).expect("prepare");
        for limit in [1, 2] {
            select
                .query_map(params!["d", 10, limit], |_| Ok(()))
                .expect("query")
                .for_each(drop);
        }
        assert_eq!(select.get_status(RePrepare), 2);
    }
}
