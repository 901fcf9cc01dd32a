//! The dispatcher's statements on PostgreSQL. Claims lock the rows they
//! take with `FOR UPDATE SKIP LOCKED`, so any number of dispatchers on one
//! database share the due rows without waiting for each other and never
//! claim one row twice; the lease token fences every later update, as on
//! SQLite.

use std::sync::{Arc, Mutex};

use postgres::types::{ToSql, Type};

use crate::circuit::Admission;
use crate::config::Config;
use crate::dispatcher::records::{self, DispatchDb, OutboxTx, RecordCounts};
use crate::dispatcher::{Attempt, Claimed, Verdict};
use crate::failures::{Failure, FailureHandler, FailureHandlers};
use crate::responses::ResponseHandler;
use crate::store::Postgres;
use crate::store::StoreError;

use super::{Connection, statement};

pub(crate) struct PostgresDispatch {
    conn: Mutex<Connection>,
    responses: Vec<Arc<dyn ResponseHandler<Postgres>>>,
    failures: Failures,
}

type Failures = FailureHandlers<dyn FailureHandler<Postgres>>;

impl PostgresDispatch {
    pub(crate) fn new(
        conn: Connection,
        responses: Vec<Arc<dyn ResponseHandler<Postgres>>>,
        failures: Failures,
    ) -> Self {
        Self {
            conn: Mutex::new(conn),
            responses,
            failures,
        }
    }

    /// Runs `work` in one transaction on the dispatcher's connection.
    fn in_transaction<T>(
        &self,
        work: impl FnOnce(&mut PostgresOps<'_, '_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let client = conn.client()?;
        let mut tx = client.transaction().map_err(|e| statement(&e))?;
        let value = {
            let mut ops = PostgresOps {
                tx: &mut tx,
                responses: &self.responses,
                failures: &self.failures,
            };
            work(&mut ops)?
        };
        tx.commit().map_err(|e| statement(&e))?;
        Ok(value)
    }
}

impl DispatchDb for PostgresDispatch {
    fn discover(&self) -> Result<Vec<String>, StoreError> {
        self.in_transaction(|ops| {
            // A loose index scan: one index probe per distinct destination.
            let rows = ops
                .tx
                .query(
                    "WITH RECURSIVE d(destination) AS ( \
                       (SELECT destination FROM outbox_messages \
                        WHERE status IN ('Pending', 'Sending') ORDER BY destination LIMIT 1) \
                       UNION ALL \
                       SELECT (SELECT o.destination FROM outbox_messages o \
                               WHERE o.status IN ('Pending', 'Sending') AND o.destination > d.destination \
                               ORDER BY o.destination LIMIT 1) \
                       FROM d WHERE d.destination IS NOT NULL) \
                     SELECT destination FROM d WHERE destination IS NOT NULL",
                    &[],
                )
                .map_err(|e| statement(&e))?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
    }

    fn decommissioned(&self) -> Result<Vec<(String, u32, i64)>, StoreError> {
        self.in_transaction(|ops| {
            crate::store::postgres::lifecycle::read(&mut *ops.tx).map_err(|e| statement(&e))
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

struct PostgresOps<'t, 'c> {
    tx: &'t mut postgres::Transaction<'c>,
    responses: &'t [Arc<dyn ResponseHandler<Postgres>>],
    failures: &'t Failures,
}

impl PostgresOps<'_, '_> {
    fn handler(&self, row: &Claimed) -> Option<Arc<dyn ResponseHandler<Postgres>>> {
        self.responses
            .iter()
            .find(|h| h.interface() == (row.interface.as_str(), row.version))
            .cloned()
    }

    /// One fenced update (typed parameters: one round trip, no prepare).
    fn update(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<bool, StoreError> {
        self.tx
            .execute_typed(sql, params)
            .map(|n| n == 1)
            .map_err(|e| statement(&e))
    }
}

impl OutboxTx for PostgresOps<'_, '_> {
    fn claim_due(
        &mut self,
        destination: &str,
        lease: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<(Claimed, i64)>, StoreError> {
        let rows = self
            .tx
            .query_typed(
                "UPDATE outbox_messages SET status = 'Sending', lease_token = $1, next_retry_at = $2, last_attempt_at = $3 \
                 WHERE message_id IN (SELECT message_id FROM outbox_messages \
                     WHERE destination = $5 AND status IN ('Pending', 'Sending') AND next_retry_at <= $3 \
                     ORDER BY next_retry_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING message_id, correlation_id, message_type, interface, version, fingerprint, \
                     endpoint, payload, headers, retry_count, max_retries, created_at, expires_at",
                &[
                    (&lease, Type::TEXT),
                    (&lease_until, Type::INT8),
                    (&now, Type::INT8),
                    (&(limit as i64), Type::INT8),
                    (&destination, Type::TEXT),
                ],
            )
            .map_err(|e| statement(&e))?;
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
                        version: r.get::<_, i64>(4) as u32,
                        fingerprint: r.get(5),
                        endpoint: r.get(6),
                        payload: r.get(7),
                        headers: r.get(8),
                        retry_count: r.get::<_, i64>(9) as u32,
                        max_retries: r.get::<_, i64>(10) as u32,
                        created_at_ms: r.get(11),
                    },
                    r.get::<_, i64>(12),
                )
            })
            .collect();
        // RETURNING has no order: send oldest first, as SQLite does.
        claimed.sort_by(|a, b| a.0.message_id.cmp(&b.0.message_id));
        Ok(claimed)
    }

    fn next_due(&mut self, destination: &str, now: i64) -> Result<Option<i64>, StoreError> {
        let row = self
            .tx
            .query_typed(
                "SELECT next_retry_at FROM outbox_messages \
                 WHERE destination = $1 AND status IN ('Pending', 'Sending') AND next_retry_at > $2 \
                 ORDER BY next_retry_at LIMIT 1",
                &[(&destination, Type::TEXT), (&now, Type::INT8)],
            )
            .map_err(|e| statement(&e))?;
        Ok(row.first().map(|r| r.get(0)))
    }

    fn expire(&mut self, row: &Claimed) -> Result<(), StoreError> {
        self.update(
            "UPDATE outbox_messages SET status = 'Expired', lease_token = NULL, \
             last_error = 'time to live exceeded' WHERE message_id = $1 AND lease_token = $2",
            &[(&row.message_id, Type::TEXT), (&row.lease, Type::TEXT)],
        )
        .map(drop)
    }

    fn release(&mut self, row: &Claimed, now: i64) -> Result<(), StoreError> {
        self.update(
            "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, next_retry_at = $3 \
             WHERE message_id = $1 AND lease_token = $2",
            &[
                (&row.message_id, Type::TEXT),
                (&row.lease, Type::TEXT),
                (&now, Type::INT8),
            ],
        )
        .map(drop)
    }

    fn mark_final(&mut self, row: &Claimed, status: &str, error: &str) -> Result<bool, StoreError> {
        self.update(
            "UPDATE outbox_messages SET status = $3, last_error = $4, lease_token = NULL \
             WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
            &[
                (&row.message_id, Type::TEXT),
                (&row.lease, Type::TEXT),
                (&status, Type::TEXT),
                (&error, Type::TEXT),
            ],
        )
    }

    fn schedule_retry(
        &mut self,
        row: &Claimed,
        retry_count: u32,
        next_at: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        self.update(
            "UPDATE outbox_messages SET status = 'Pending', retry_count = $3, next_retry_at = $4, \
             last_error = $5, lease_token = NULL \
             WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
            &[
                (&row.message_id, Type::TEXT),
                (&row.lease, Type::TEXT),
                (&i64::from(retry_count), Type::INT8),
                (&next_at, Type::INT8),
                (&error, Type::TEXT),
            ],
        )
    }

    fn hold_if_decommissioned(
        &mut self,
        row: &Claimed,
        now: i64,
        error: &str,
    ) -> Result<bool, StoreError> {
        let still = !self
            .tx
            .query_typed(
                "SELECT 1 FROM rf_decommissioned WHERE interface = $1 AND version = $2 FOR SHARE",
                &[
                    (&row.interface, Type::TEXT),
                    (&i64::from(row.version), Type::INT8),
                ],
            )
            .map_err(|e| statement(&e))?
            .is_empty();
        let due = if still {
            crate::lifecycle::HELD_DUE_MS
        } else {
            now
        };
        self.update(
            "UPDATE outbox_messages SET status = 'Pending', next_retry_at = $3, \
             last_error = COALESCE($4, last_error), lease_token = NULL \
             WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
            &[
                (&row.message_id, Type::TEXT),
                (&row.lease, Type::TEXT),
                (&due, Type::INT8),
                (&still.then_some(error), Type::TEXT),
            ],
        )
    }

    fn mark_sent_many(&mut self, rows: &[(&Claimed, String)], now: i64) -> Result<u64, StoreError> {
        let ids: Vec<&str> = rows
            .iter()
            .map(|(row, _)| row.message_id.as_str())
            .collect();
        let leases: Vec<&str> = rows.iter().map(|(row, _)| row.lease.as_str()).collect();
        let responses: Vec<&str> = rows.iter().map(|(_, response)| response.as_str()).collect();
        self.tx
            .execute_typed(
                "UPDATE outbox_messages AS o SET status = 'Sent', sent_at = $1, \
                 response = u.response, lease_token = NULL, last_error = NULL \
                 FROM unnest($2::text[], $3::text[], $4::text[]) AS u(message_id, lease, response) \
                 WHERE o.message_id = u.message_id AND o.lease_token = u.lease \
                 AND o.status = 'Sending'",
                &[
                    (&now, Type::INT8),
                    (&ids, Type::TEXT_ARRAY),
                    (&leases, Type::TEXT_ARRAY),
                    (&responses, Type::TEXT_ARRAY),
                ],
            )
            .map_err(|e| statement(&e))
    }

    fn mark_sent(&mut self, row: &Claimed, now: i64, response: &str) -> Result<bool, StoreError> {
        self.update(
            "UPDATE outbox_messages SET status = 'Sent', sent_at = $3, response = $4, lease_token = NULL, \
             last_error = NULL WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
            &[
                (&row.message_id, Type::TEXT),
                (&row.lease, Type::TEXT),
                (&now, Type::INT8),
                (&response, Type::TEXT),
            ],
        )
    }

    fn has_answer_handler(&self, row: &Claimed) -> bool {
        self.handler(row).is_some()
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.tx
            .batch_execute("SAVEPOINT rfidl_answer")
            .map_err(|e| statement(&e))
    }

    fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.tx
            .batch_execute("RELEASE SAVEPOINT rfidl_answer")
            .map_err(|e| statement(&e))
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.tx
            .batch_execute("ROLLBACK TO SAVEPOINT rfidl_answer; RELEASE SAVEPOINT rfidl_answer")
            .map_err(|e| statement(&e))
    }

    fn act_on_answer(&mut self, row: &Claimed, response: &serde_json::Value) -> Option<String> {
        let handler = self.handler(row)?;
        handler
            .handle(&records::answer_of(row, response), self.tx)
            .err()
            .map(|error| format!("response handler: {error}"))
    }

    fn has_failure_handler(&self, row: &Claimed) -> bool {
        self.failures.get(&row.interface, row.version).is_some()
    }

    fn act_on_failure(&mut self, row: &Claimed, failure: &Failure<'_>) -> Option<String> {
        let handler = self.failures.get(&row.interface, row.version)?.clone();
        handler
            .handle(failure, self.tx)
            .err()
            .map(|e| e.to_string())
    }
}
