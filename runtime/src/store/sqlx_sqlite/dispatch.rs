//! The dispatcher on sqlx SQLite: the blocking SQLite store's claims, and
//! answers recorded on the pool when a response handler acts on them.
//!
//! Claims are what the user's code never touches, so they are the blocking
//! store's (`store/sqlite/dispatch.rs`), on a connection of their own to the
//! file: `BEGIN IMMEDIATE` claims, the `<db>.dispatcher-lock` file (one
//! dispatcher per file reclaims at once what a dead one left `Sending`),
//! and its durability rules. Recording runs there too, unless response or
//! failure handlers are registered: an async handler writes through a
//! `&mut SqliteConnection`, so the recording transaction is then one of the
//! pool's (`BEGIN IMMEDIATE`), its statements driven by the runtime the
//! dispatcher was started on (the pool's) from the dispatcher's blocking
//! threads, as on sqlx PostgreSQL. The lease token fences every update, as
//! on every store. A claim that finds a row past its TTL whose version has a
//! failure handler leaves it claimed, and the recording expires it
//! (`records::Claim::expiring`), so the handler runs on the pool too.

use std::sync::Arc;

use sqlx::Row as _;
use sqlx::sqlite::{Sqlite, SqliteArguments};
use tokio::runtime::Handle;

use crate::circuit::Admission;
use crate::config::Config;
use crate::dispatcher::records::{self, DispatchDb, OutboxTx, RecordCounts};
use crate::dispatcher::{Attempt, Claimed, Verdict};
use crate::failures::{AsyncFailureHandler, Failure, FailureHandlers};
use crate::responses::AsyncResponseHandler;
use crate::store::StoreError;

use super::SqliteStore;

type Responders = Vec<Arc<dyn AsyncResponseHandler<Sqlite>>>;
type Failures = FailureHandlers<dyn AsyncFailureHandler<Sqlite>>;

/// Opens the blocking store's dispatcher on the store's file, and the
/// recording of results on the pool when `responses` or `failures` has
/// handlers. Called on the runtime the pool belongs to (the dispatcher's
/// `start`).
pub(crate) fn open(
    store: SqliteStore,
    config: &Config,
    responses: Responders,
    failures: Failures,
) -> Result<Arc<dyn DispatchDb>, StoreError> {
    let on_failure = crate::store::sqlite::dispatch::OnFailure {
        handlers: FailureHandlers::default(),
        elsewhere: failures.keys(),
    };
    let claims =
        crate::store::sqlite::dispatch::open(store.location(), config, Vec::new(), on_failure)?;
    if responses.is_empty() && failures.is_empty() {
        return Ok(claims);
    }
    let runtime = Handle::try_current().map_err(|_| StoreError::SqlxSqlite {
        path: store.path().display().to_string(),
        cause: "a dispatcher with response or failure handlers on a sqlx pool must be started \
                on the pool's tokio runtime"
            .to_owned(),
    })?;
    Ok(Arc::new(SqlxDispatch {
        claims,
        store,
        runtime,
        responses,
        failures,
    }))
}

struct SqlxDispatch {
    /// The blocking store's dispatcher: claims, look-ups.
    claims: Arc<dyn DispatchDb>,
    store: SqliteStore,
    runtime: Handle,
    responses: Responders,
    failures: Failures,
}

impl DispatchDb for SqlxDispatch {
    fn claims_on_dispatcher_worker(&self) -> bool {
        self.claims.claims_on_dispatcher_worker()
    }

    fn discover(&self) -> Result<Vec<String>, StoreError> {
        self.claims.discover()
    }

    fn decommissioned(&self) -> Result<Vec<(String, u32, i64)>, StoreError> {
        self.claims.decommissioned()
    }

    fn claim(
        &self,
        plan: &[(String, Admission)],
        lease_ms: i64,
        row_budget: usize,
        capacity: usize,
        claimed: records::ClaimSender,
        commit: records::ClaimCommit,
    ) {
        self.claims
            .claim(plan, lease_ms, row_budget, capacity, claimed, commit);
    }

    fn finish_claim(&self) {
        self.claims.finish_claim();
    }

    fn record(
        &self,
        attempts: &[(Attempt, Verdict)],
        config: &Config,
    ) -> Result<RecordCounts, StoreError> {
        // A claim left open on the claims' connection holds the file's
        // write lock: it commits first.
        self.claims.finish_claim();
        let statement = |e: sqlx::Error| SqliteStore::statement(&e);
        let mut tx = self
            .runtime
            .block_on(self.store.pool().begin_with("BEGIN IMMEDIATE"))
            .map_err(statement)?;
        let counts = {
            let mut ops = SqlxOps {
                tx: &mut tx,
                runtime: &self.runtime,
                responses: &self.responses,
                failures: &self.failures,
            };
            records::record_in(&mut ops, attempts, config)?
        };
        self.runtime.block_on(tx.commit()).map_err(statement)?;
        Ok(counts)
    }
}

struct SqlxOps<'t> {
    tx: &'t mut sqlx::Transaction<'static, Sqlite>,
    runtime: &'t Handle,
    responses: &'t Responders,
    failures: &'t Failures,
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

impl SqlxOps<'_> {
    /// One fenced update: whether it changed the row.
    fn update(&mut self, query: Query<'_>) -> Result<bool, StoreError> {
        let done = self
            .runtime
            .block_on(query.execute(&mut **self.tx))
            .map_err(|e| SqliteStore::statement(&e))?;
        Ok(done.rows_affected() == 1)
    }

    fn handler(&self, row: &Claimed) -> Option<Arc<dyn AsyncResponseHandler<Sqlite>>> {
        self.responses
            .iter()
            .find(|h| h.interface() == (row.interface.as_str(), row.version))
            .cloned()
    }

    fn batch(&mut self, sql: &'static str) -> Result<(), StoreError> {
        self.runtime
            .block_on(sqlx::raw_sql(sql).execute(&mut **self.tx))
            .map(drop)
            .map_err(|e| SqliteStore::statement(&e))
    }
}

/// The blocking store's claim (`CLAIM_SELECT`, then `CLAIM_UPDATE` by
/// `seq`), for completeness: the dispatcher claims on the blocking store's
/// connection.
const CLAIM_SELECT: &str = "SELECT message_id, correlation_id, message_type, interface, \
     version, fingerprint, endpoint, payload, headers, retry_count, max_retries, created_at, \
     expires_at, seq FROM outbox_messages \
     WHERE destination = ?1 AND status IN ('Pending', 'Sending') AND next_retry_at <= ?2 \
     ORDER BY next_retry_at LIMIT +?3";

const CLAIM_UPDATE: &str = "UPDATE outbox_messages \
     SET status = 'Sending', lease_token = ?2, next_retry_at = ?3, last_attempt_at = ?4 \
     WHERE seq = ?1";

impl OutboxTx for SqlxOps<'_> {
    fn claim_due(
        &mut self,
        destination: &str,
        lease: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<(Claimed, i64)>, StoreError> {
        let statement = |e: sqlx::Error| SqliteStore::statement(&e);
        let rows = self
            .runtime
            .block_on(
                sqlx::query(CLAIM_SELECT)
                    .bind(destination)
                    .bind(now)
                    .bind(limit as i64)
                    .fetch_all(&mut **self.tx),
            )
            .map_err(statement)?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in &rows {
            let row = (|| -> Result<(Claimed, i64), sqlx::Error> {
                Ok((
                    Claimed {
                        message_id: r.try_get(0)?,
                        seq: r.try_get(13)?,
                        lease: lease.to_owned(),
                        correlation_id: r.try_get(1)?,
                        message_type: r.try_get(2)?,
                        interface: r.try_get(3)?,
                        version: r.try_get::<i64, _>(4)? as u32,
                        fingerprint: r.try_get(5)?,
                        endpoint: r.try_get(6)?,
                        payload: r.try_get(7)?,
                        headers: r.try_get(8)?,
                        retry_count: r.try_get::<i64, _>(9)? as u32,
                        max_retries: r.try_get::<i64, _>(10)? as u32,
                        created_at_ms: r.try_get(11)?,
                    },
                    r.try_get(12)?,
                ))
            })()
            .map_err(statement)?;
            claimed.push(row);
        }
        for (row, _) in &claimed {
            let query = sqlx::query(CLAIM_UPDATE)
                .bind(row.seq)
                .bind(lease.to_owned())
                .bind(lease_until)
                .bind(now);
            self.update(query)?;
        }
        Ok(claimed)
    }

    fn next_due(&mut self, destination: &str, now: i64) -> Result<Option<i64>, StoreError> {
        let next = sqlx::query_scalar(crate::store::sqlite::dispatch::NEXT_DUE)
            .bind(destination)
            .bind(now)
            .fetch_optional(&mut **self.tx);
        self.runtime
            .block_on(next)
            .map_err(|e| SqliteStore::statement(&e))
    }

    fn expire(&mut self, row: &Claimed) -> Result<(), StoreError> {
        let query = sqlx::query(
            "UPDATE outbox_messages SET status = 'Expired', lease_token = NULL, \
             last_error = 'time to live exceeded' WHERE seq = ?1 AND lease_token = ?2",
        )
        .bind(row.seq)
        .bind(row.lease.clone());
        self.update(query).map(drop)
    }

    fn release(&mut self, row: &Claimed, now: i64) -> Result<(), StoreError> {
        let query = sqlx::query(
            "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, \
             next_retry_at = ?3 WHERE seq = ?1 AND lease_token = ?2",
        )
        .bind(row.seq)
        .bind(row.lease.clone())
        .bind(now);
        self.update(query).map(drop)
    }

    fn mark_final(&mut self, row: &Claimed, status: &str, error: &str) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE outbox_messages SET status = ?3, last_error = ?4, lease_token = NULL \
             WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
        )
        .bind(row.seq)
        .bind(row.lease.clone())
        .bind(status.to_owned())
        .bind(error.to_owned());
        self.update(query)
    }

    fn schedule_retry(
        &mut self,
        row: &Claimed,
        retry_count: u32,
        next_at: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE outbox_messages SET status = 'Pending', retry_count = ?3, \
             next_retry_at = ?4, last_error = ?5, lease_token = NULL \
             WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
        )
        .bind(row.seq)
        .bind(row.lease.clone())
        .bind(i64::from(retry_count))
        .bind(next_at)
        .bind(error.to_owned());
        self.update(query)
    }

    fn mark_sent(&mut self, row: &Claimed, now: i64, response: &str) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3, response = ?4, \
             lease_token = NULL, last_error = NULL \
             WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
        )
        .bind(row.seq)
        .bind(row.lease.clone())
        .bind(now)
        .bind(response.to_owned());
        self.update(query)
    }

    fn hold_if_decommissioned(
        &mut self,
        row: &Claimed,
        now: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, \
             next_retry_at = CASE WHEN EXISTS (SELECT 1 FROM rf_decommissioned d \
                 WHERE d.interface = ?3 AND d.version = ?4) THEN ?5 ELSE ?6 END, \
             last_error = CASE WHEN EXISTS (SELECT 1 FROM rf_decommissioned d \
                 WHERE d.interface = ?3 AND d.version = ?4) THEN ?7 ELSE last_error END \
             WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
        )
        .bind(row.seq)
        .bind(row.lease.clone())
        .bind(row.interface.clone())
        .bind(i64::from(row.version))
        .bind(crate::lifecycle::HELD_DUE_MS)
        .bind(now)
        .bind(error.to_owned());
        self.update(query)
    }

    fn has_answer_handler(&self, row: &Claimed) -> bool {
        self.handler(row).is_some()
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.batch("SAVEPOINT rfidl_answer")
    }

    fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.batch("RELEASE rfidl_answer")
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.batch("ROLLBACK TO rfidl_answer; RELEASE rfidl_answer")
    }

    fn act_on_answer(&mut self, row: &Claimed, response: &serde_json::Value) -> Option<String> {
        let handler = self.handler(row)?;
        let answer = records::answer_of(row, response);
        self.runtime
            .block_on(handler.handle(&answer, &mut **self.tx))
            .err()
            .map(|error| format!("response handler: {error}"))
    }

    fn has_failure_handler(&self, row: &Claimed) -> bool {
        self.failures.get(&row.interface, row.version).is_some()
    }

    fn act_on_failure(&mut self, row: &Claimed, failure: &Failure<'_>) -> Option<String> {
        let handler = self.failures.get(&row.interface, row.version)?.clone();
        self.runtime
            .block_on(handler.handle(failure, &mut **self.tx))
            .err()
            .map(|error| error.to_string())
    }
}
