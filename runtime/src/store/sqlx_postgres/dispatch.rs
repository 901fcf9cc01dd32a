//! The dispatcher's statements on sqlx PostgreSQL, and its wake-up
//! listener.
//!
//! The dispatcher's loop is the same on every store: it runs each claim
//! and each recording as one transaction on its blocking pool
//! ([`DispatchDb`]), and the claims and verdicts are written once
//! (`dispatcher::records`). Here each statement of such a transaction is a
//! sqlx future, driven to completion on that blocking thread by the runtime
//! the dispatcher was started on (the runtime of the caller's pool), so the
//! pool's connections always live on their own runtime. Claims lock their
//! rows `FOR UPDATE SKIP LOCKED`, and the lease token fences every later
//! update, as on the other stores.

use std::sync::Arc;

use sqlx::Row as _;
use sqlx::postgres::Postgres;
use tokio::runtime::Handle;

use crate::circuit::Admission;
use crate::config::Config;
use crate::dispatcher::records::{self, DispatchDb, OutboxTx, RecordCounts};
use crate::dispatcher::{Attempt, Claimed, Verdict};
use crate::failures::{AsyncFailureHandler, Failure, FailureHandlers};
use crate::responses::AsyncResponseHandler;
use crate::store::StoreError;

use super::{
    CLAIM_DUE, DECOMMISSIONED, DISCOVER, EXPIRE, HOLD, MARK_FINAL, MARK_SENT, MARK_SENT_MANY,
    NEXT_DUE, PgStore, RELEASE, SCHEDULE_RETRY, STILL_DECOMMISSIONED,
};

type Responders = Vec<Arc<dyn AsyncResponseHandler<Postgres>>>;
type Failures = FailureHandlers<dyn AsyncFailureHandler<Postgres>>;

pub(crate) struct SqlxDispatch {
    store: PgStore,
    runtime: Handle,
    responses: Responders,
    failures: Failures,
}

impl SqlxDispatch {
    /// Called on the runtime the pool belongs to (the dispatcher's
    /// `start`), which then drives every statement.
    pub(crate) fn new(
        store: PgStore,
        responses: Responders,
        failures: Failures,
    ) -> Result<Self, StoreError> {
        let runtime = Handle::try_current().map_err(|_| StoreError::Postgres {
            target: store.target().to_owned(),
            cause: "a dispatcher on a sqlx pool must be started on the pool's tokio runtime"
                .to_owned(),
        })?;
        Ok(Self {
            store,
            runtime,
            responses,
            failures,
        })
    }

    /// Runs `work` in one transaction on a connection of the pool.
    fn in_transaction<T>(
        &self,
        work: impl FnOnce(&mut SqlxOps<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let statement = |e: sqlx::Error| self.store.statement(&e);
        let mut tx = self
            .runtime
            .block_on(self.store.pool().begin())
            .map_err(statement)?;
        let value = {
            let mut ops = SqlxOps {
                tx: &mut tx,
                store: &self.store,
                runtime: &self.runtime,
                responses: &self.responses,
                failures: &self.failures,
            };
            work(&mut ops)?
        };
        self.runtime.block_on(tx.commit()).map_err(statement)?;
        Ok(value)
    }
}

impl DispatchDb for SqlxDispatch {
    fn discover(&self) -> Result<Vec<String>, StoreError> {
        self.in_transaction(|ops| {
            let rows = run(
                ops.runtime,
                ops.store,
                sqlx::query(ops.store.sql(DISCOVER)).fetch_all(&mut **ops.tx),
            )?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
    }

    fn decommissioned(&self) -> Result<Vec<(String, u32, i64)>, StoreError> {
        self.in_transaction(|ops| {
            let rows = run(
                ops.runtime,
                ops.store,
                sqlx::query(ops.store.sql(DECOMMISSIONED)).fetch_all(&mut **ops.tx),
            )?;
            Ok(rows
                .iter()
                .map(|row| (row.get(0), row.get::<i64, _>(1) as u32, row.get(2)))
                .collect())
        })
    }

    fn claim(
        &self,
        plan: &[(String, Admission)],
        lease_ms: i64,
        row_budget: usize,
        capacity: usize,
        claimed: records::ClaimSender,
        _commit: records::ClaimCommit,
    ) {
        let _ =
            claimed.send(self.in_transaction(|ops| {
                records::claim_in(ops, plan, lease_ms, row_budget, capacity)
            }));
    }

    fn record(
        &self,
        attempts: &[(Attempt, Verdict)],
        config: &Config,
    ) -> Result<RecordCounts, StoreError> {
        self.in_transaction(|ops| records::record_in(ops, attempts, config))
    }
}

struct SqlxOps<'t> {
    tx: &'t mut sqlx::Transaction<'static, Postgres>,
    store: &'t PgStore,
    runtime: &'t Handle,
    responses: &'t Responders,
    failures: &'t Failures,
}

/// Drives one statement to its end on `runtime`.
fn run<T>(
    runtime: &Handle,
    store: &PgStore,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    runtime.block_on(statement).map_err(|e| store.statement(&e))
}

impl SqlxOps<'_> {
    /// One fenced update: whether it changed the row.
    fn update(
        &mut self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<bool, StoreError> {
        let done = self
            .runtime
            .block_on(query.execute(&mut **self.tx))
            .map_err(|e| self.store.statement(&e))?;
        Ok(done.rows_affected() == 1)
    }

    fn handler(&self, row: &Claimed) -> Option<Arc<dyn AsyncResponseHandler<Postgres>>> {
        self.responses
            .iter()
            .find(|h| h.interface() == (row.interface.as_str(), row.version))
            .cloned()
    }

    fn batch(&mut self, sql: &'static str) -> Result<(), StoreError> {
        let done = self
            .runtime
            .block_on(sqlx::raw_sql(sql).execute(&mut **self.tx));
        done.map(drop).map_err(|e| self.store.statement(&e))
    }
}

impl OutboxTx for SqlxOps<'_> {
    fn claim_due(
        &mut self,
        destination: &str,
        lease: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<(Claimed, i64)>, StoreError> {
        let rows = run(
            self.runtime,
            self.store,
            sqlx::query(self.store.sql(CLAIM_DUE))
                .bind(lease)
                .bind(lease_until)
                .bind(now)
                .bind(limit as i64)
                .bind(destination)
                .fetch_all(&mut **self.tx),
        )?;
        let mut claimed: Vec<(Claimed, i64)> = rows
            .iter()
            .map(|r| {
                (
                    Claimed {
                        message_id: r.get(0),
                        seq: 0,
                        lease: lease.to_owned(),
                        correlation_id: r.get(1),
                        message_type: r.get(2),
                        interface: r.get(3),
                        version: r.get::<i64, _>(4) as u32,
                        fingerprint: r.get(5),
                        endpoint: r.get(6),
                        payload: r.get(7),
                        headers: r.get(8),
                        retry_count: r.get::<i64, _>(9) as u32,
                        max_retries: r.get::<i64, _>(10) as u32,
                        created_at_ms: r.get(11),
                    },
                    r.get::<i64, _>(12),
                )
            })
            .collect();
        // RETURNING has no order: send oldest first, as SQLite does.
        claimed.sort_by(|a, b| a.0.message_id.cmp(&b.0.message_id));
        Ok(claimed)
    }

    fn next_due(&mut self, destination: &str, now: i64) -> Result<Option<i64>, StoreError> {
        let next = sqlx::query_scalar(self.store.sql(NEXT_DUE))
            .bind(destination)
            .bind(now)
            .fetch_optional(&mut **self.tx);
        run(self.runtime, self.store, next)
    }

    fn expire(&mut self, row: &Claimed) -> Result<(), StoreError> {
        let query = sqlx::query(self.store.sql(EXPIRE))
            .bind(row.message_id.clone())
            .bind(row.lease.clone());
        self.update(query).map(drop)
    }

    fn release(&mut self, row: &Claimed, now: i64) -> Result<(), StoreError> {
        let query = sqlx::query(self.store.sql(RELEASE))
            .bind(row.message_id.clone())
            .bind(row.lease.clone())
            .bind(now);
        self.update(query).map(drop)
    }

    fn mark_final(&mut self, row: &Claimed, status: &str, error: &str) -> Result<bool, StoreError> {
        let query = sqlx::query(self.store.sql(MARK_FINAL))
            .bind(row.message_id.clone())
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
        let query = sqlx::query(self.store.sql(SCHEDULE_RETRY))
            .bind(row.message_id.clone())
            .bind(row.lease.clone())
            .bind(i64::from(retry_count))
            .bind(next_at)
            .bind(error.to_owned());
        self.update(query)
    }

    fn hold_if_decommissioned(
        &mut self,
        row: &Claimed,
        now: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        let still = run(
            self.runtime,
            self.store,
            sqlx::query(self.store.sql(STILL_DECOMMISSIONED))
                .bind(&row.interface)
                .bind(i64::from(row.version))
                .fetch_optional(&mut **self.tx),
        )?
        .is_some();
        let due = if still {
            crate::lifecycle::HELD_DUE_MS
        } else {
            now
        };
        let query = sqlx::query(self.store.sql(HOLD))
            .bind(row.message_id.clone())
            .bind(row.lease.clone())
            .bind(due)
            .bind(still.then(|| error.to_owned()));
        self.update(query)
    }

    fn mark_sent_many(&mut self, rows: &[(&Claimed, String)], now: i64) -> Result<u64, StoreError> {
        let ids: Vec<String> = rows.iter().map(|(row, _)| row.message_id.clone()).collect();
        let leases: Vec<String> = rows.iter().map(|(row, _)| row.lease.clone()).collect();
        let responses: Vec<String> = rows.iter().map(|(_, response)| response.clone()).collect();
        let done = run(
            self.runtime,
            self.store,
            sqlx::query(self.store.sql(MARK_SENT_MANY))
                .bind(now)
                .bind(ids)
                .bind(leases)
                .bind(responses)
                .execute(&mut **self.tx),
        )?;
        Ok(done.rows_affected())
    }

    fn mark_sent(&mut self, row: &Claimed, now: i64, response: &str) -> Result<bool, StoreError> {
        let query = sqlx::query(self.store.sql(MARK_SENT))
            .bind(row.message_id.clone())
            .bind(row.lease.clone())
            .bind(now)
            .bind(response.to_owned());
        self.update(query)
    }

    fn has_answer_handler(&self, row: &Claimed) -> bool {
        self.handler(row).is_some()
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.batch("SAVEPOINT rfidl_answer")
    }

    fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.batch("RELEASE SAVEPOINT rfidl_answer")
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.batch("ROLLBACK TO SAVEPOINT rfidl_answer; RELEASE SAVEPOINT rfidl_answer")
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

/// Wakes the dispatcher at every commit of an enqueue into the store's
/// schema, by any replica (`LISTEN` on the channel the enqueuing statement
/// notifies), until `stop`. A lost listening connection is opened again
/// (after a pause, and with a wake-up, since notifications may have been
/// missed meanwhile); the dispatcher's poll covers the gap.
pub(crate) fn listen(
    store: PgStore,
    wake: Arc<tokio::sync::Notify>,
    stop: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let listened = async {
                let mut listener = sqlx::postgres::PgListener::connect_with(store.pool()).await?;
                listener.listen(&store.inner.channel).await?;
                wake.notify_one();
                loop {
                    listener.recv().await?;
                    wake.notify_one();
                }
                #[allow(unreachable_code)]
                Ok::<(), sqlx::Error>(())
            };
            tokio::select! {
                () = stop.cancelled() => return,
                result = listened => {
                    if let Err(error) = result {
                        tracing::warn!(
                            target = store.target(),
                            error = %super::error_text(&error),
                            "the outbox wake-up listener lost its connection; listening again"
                        );
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => wake.notify_one(),
            }
        }
    });
}
