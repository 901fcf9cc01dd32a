//! The dispatcher's statements on SQLite: one connection, claims in
//! `BEGIN IMMEDIATE` transactions (one writer at a time, so two dispatchers
//! on one file never claim the same row).

use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension as _, params};

use crate::circuit::Admission;
use crate::config::{Config, Durability};
use crate::db;
use crate::responses::ResponseHandler;
use crate::store::Sqlite;

use super::records::{self, DispatchDb, OutboxTx, RecordCounts};
use super::{Attempt, Claimed, Group, Verdict};

pub(crate) struct SqliteDispatch {
    conn: Mutex<Connection>,
    durability: Durability,
    responses: Vec<Arc<dyn ResponseHandler<Sqlite>>>,
}

impl SqliteDispatch {
    pub(crate) fn new(
        conn: Connection,
        durability: Durability,
        responses: Vec<Arc<dyn ResponseHandler<Sqlite>>>,
    ) -> Self {
        Self {
            conn: Mutex::new(conn),
            durability,
            responses,
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, String> {
        self.conn
            .lock()
            .map_err(|_| "the dispatcher's connection is poisoned".to_owned())
    }
}

fn text(error: rusqlite::Error) -> String {
    error.to_string()
}

impl DispatchDb for SqliteDispatch {
    fn discover(&self) -> Result<Vec<String>, String> {
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

    fn decommissioned(&self) -> Result<Vec<(String, u32, i64)>, String> {
        crate::lifecycle::read_sqlite(&*self.lock()?).map_err(text)
    }

    fn claim(
        &self,
        plan: &[(String, Admission)],
        lease_ms: i64,
        row_budget: usize,
        capacity: usize,
    ) -> Result<(Vec<Group>, u64), String> {
        let mut conn = self.lock()?;
        // The claim commits with FULL whatever `outbox.durability` says: its
        // fsync of the WAL makes every transaction committed before it
        // durable, so no message leaves before the transaction that enqueued
        // it is on disk. (With NORMAL, a power cut after the receiver's 2xx
        // could undo the very transaction whose message the receiver
        // processed: test
        // `powerloss_sender_normal_never_delivers_a_transaction_it_can_lose`.)
        // One fsync per claim, none per enqueue. Recording results needs
        // none of its own: a result lost in a power cut means a re-send,
        // answered as a duplicate.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(text)?;
        let claimed = (|| -> Result<(Vec<Group>, u64), String> {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(text)?;
            let mut ops = SqliteOps {
                tx: &tx,
                responses: &self.responses,
            };
            let claimed = records::claim_in(&mut ops, plan, lease_ms, row_budget, capacity)?;
            tx.commit().map_err(text)?;
            Ok(claimed)
        })();
        let restored = conn
            .pragma_update(None, "synchronous", db::synchronous(self.durability))
            .map_err(text);
        let claimed = claimed?;
        restored?;
        Ok(claimed)
    }

    fn record(
        &self,
        attempts: &[(Attempt, Verdict)],
        config: &Config,
    ) -> Result<RecordCounts, String> {
        let mut conn = self.lock()?;
        let tx = conn.transaction().map_err(text)?;
        let mut ops = SqliteOps {
            tx: &tx,
            responses: &self.responses,
        };
        let counts = records::record_in(&mut ops, attempts, config)?;
        tx.commit().map_err(text)?;
        Ok(counts)
    }
}

struct SqliteOps<'t, 'c> {
    tx: &'t rusqlite::Transaction<'c>,
    responses: &'t [Arc<dyn ResponseHandler<Sqlite>>],
}

impl SqliteOps<'_, '_> {
    fn handler(&self, row: &Claimed) -> Option<&dyn ResponseHandler<Sqlite>> {
        self.responses
            .iter()
            .find(|h| h.interface() == (row.interface.as_str(), row.version))
            .map(|h| h.as_ref())
    }
}

impl OutboxTx for SqliteOps<'_, '_> {
    fn claim_due(
        &mut self,
        destination: &str,
        lease: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<(Claimed, i64)>, String> {
        let mut statement = self
            .tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = 'Sending', lease_token = ?1, next_retry_at = ?2, last_attempt_at = ?3 \
                 WHERE seq IN (SELECT seq FROM outbox_messages \
                     WHERE destination = ?5 AND status IN ('Pending', 'Sending') AND next_retry_at <= ?3 \
                     ORDER BY next_retry_at LIMIT ?4) \
                 RETURNING message_id, correlation_id, message_type, interface, version, fingerprint, \
                     endpoint, payload, headers, retry_count, max_retries, created_at, expires_at, seq",
            )
            .map_err(text)?;
        let rows = statement
            .query_map(
                params![lease, lease_until, now, limit as i64, destination],
                |r| {
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
                },
            )
            .map_err(text)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(text)
    }

    fn expire(&mut self, row: &Claimed) -> Result<(), String> {
        self.tx
            .execute(
                "UPDATE outbox_messages SET status = 'Expired', lease_token = NULL, \
                 last_error = 'time to live exceeded' WHERE seq = ?1 AND lease_token = ?2",
                params![row.seq, row.lease],
            )
            .map(drop)
            .map_err(text)
    }

    fn release(&mut self, row: &Claimed, now: i64) -> Result<(), String> {
        self.tx
            .execute(
                "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, next_retry_at = ?3 \
                 WHERE seq = ?1 AND lease_token = ?2",
                params![row.seq, row.lease, now],
            )
            .map(drop)
            .map_err(text)
    }

    fn finish(&mut self, row: &Claimed, status: &str, error: &str) -> Result<bool, String> {
        self.tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = ?3, last_error = ?4, lease_token = NULL \
                 WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
            )
            .and_then(|mut s| s.execute(params![row.seq, row.lease, status, error]))
            .map(|n| n == 1)
            .map_err(text)
    }

    fn again(
        &mut self,
        row: &Claimed,
        retry_count: u32,
        next_at: i64,
        error: &str,
    ) -> Result<bool, String> {
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

    fn mark_sent(&mut self, row: &Claimed, now: i64, response: &str) -> Result<bool, String> {
        self.tx
            .prepare_cached(
                "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3, response = ?4, lease_token = NULL, \
                 last_error = NULL WHERE seq = ?1 AND lease_token = ?2 AND status = 'Sending'",
            )
            .and_then(|mut s| s.execute(params![row.seq, row.lease, now, response]))
            .map(|n| n == 1)
            .map_err(text)
    }

    fn hold(&mut self, row: &Claimed, now: i64, error: &str) -> Result<bool, String> {
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

    fn savepoint(&mut self) -> Result<(), String> {
        self.tx
            .execute_batch("SAVEPOINT rfidl_answer")
            .map_err(text)
    }

    fn release_savepoint(&mut self) -> Result<(), String> {
        self.tx.execute_batch("RELEASE rfidl_answer").map_err(text)
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), String> {
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
}
