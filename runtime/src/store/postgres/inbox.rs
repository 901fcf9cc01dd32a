//! The receiver on PostgreSQL: the committed-inbox look-up, and writer
//! threads that run handlers in transactions of the shared database.
//!
//! **Copies on two replicas.** Each message (in a savepoint of its own when
//! it shares its request with others) first inserts its inbox row (`ON CONFLICT DO NOTHING`), then runs the handler, then stores
//! the answer in that row. A copy of the same (source, id) being processed
//! by another transaction (another writer thread, or another replica) makes
//! the insert wait until that transaction ends: if it committed, the insert
//! does nothing and the copy is answered as a duplicate with the stored
//! answer; if it rolled back, this copy runs the handler. So the database,
//! not a lock in one process, decides who processes a message, and a copy
//! never runs its handler to commit twice. A wait longer than
//! `inbox.in_progress_wait` answers the sender 503 `in_progress`
//! (retryable; the retry is then a duplicate).
//!
//! Each writer thread commits one request (one message, or one batch) per
//! transaction; several threads (`writers`) work side by side, and the
//! server's own group commit shares fsyncs between them. The loop is the
//! receiver's ([`crate::receiver::writer`]); this file is its step.

use std::sync::{Arc, Mutex};

use postgres::types::Type;

use crate::inbox::{InboxEntry, InboxError, InboxLookup, RawEntry};
use crate::receiver::writer::{Claim, Delivery, InboxStep, Writer};
use crate::receiver::{ReceiverError, Started, WriterParts};
use crate::store::{Postgres, StoreError};

use super::{Connection, PostgresUrl, statement};

const LOOKUP_SQL: &str = "SELECT endpoint, payload_sha256, processed_at, response, expires_at \
     FROM inbox_messages WHERE source_service_id = $1 AND message_id = $2";

/// Idle look-up connections kept.
const READ_POOL_SIZE: usize = 8;

/// The committed-inbox look-up, on a few connections of its own.
pub(crate) struct PostgresInbox {
    url: PostgresUrl,
    idle: Mutex<Vec<Connection>>,
}

impl PostgresInbox {
    fn wrap(&self, cause: String) -> InboxError {
        InboxError::Postgres {
            target: self.url.target(),
            cause,
        }
    }
}

impl InboxLookup for PostgresInbox {
    fn lookup(
        &self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut conn = match idle {
            Some(conn) => conn,
            None => {
                let client = self.url.connect().map_err(|e| self.wrap(e.to_string()))?;
                Connection::new(self.url.clone(), client)
            }
        };
        let found = conn.client().and_then(|client| {
            client
                .query_typed_opt(
                    LOOKUP_SQL,
                    &[(&source_service_id, Type::TEXT), (&message_id, Type::TEXT)],
                )
                .map_err(|e| statement(&e))
        });
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < READ_POOL_SIZE
        {
            idle.push(conn);
        }
        match found.map_err(|e| self.wrap(e.to_string()))? {
            Some(row) => raw_entry(&row)
                .into_entry(source_service_id, message_id)
                .map(Some),
            None => Ok(None),
        }
    }
}

fn raw_entry(row: &postgres::Row) -> RawEntry {
    RawEntry {
        endpoint: row.get(0),
        payload_sha256: row.get(1),
        processed_at_ms: row.get(2),
        response: row.get(3),
        expires_at_ms: row.get(4),
    }
}

/// Migrates the database and starts `writers` writer threads.
pub(crate) fn start_receiver(
    url: &PostgresUrl,
    writers: usize,
    parts: WriterParts<Postgres>,
) -> Result<Started, ReceiverError> {
    let mut client = super::open(url)?;
    if let Some(lifecycle) = &parts.lifecycle {
        let rows = super::off_runtime(|| crate::store::postgres::lifecycle::read(&mut client))
            .map_err(|error| crate::store::StoreError::Postgres {
                target: url.target(),
                cause: super::error_text(&error),
            })?;
        lifecycle.replace(rows);
    }
    let reader = PostgresInbox {
        url: url.clone(),
        idle: Mutex::new(vec![Connection::new(url.clone(), client)]),
    };
    let WriterParts {
        commands,
        handlers,
        retention,
        alive,
        ..
    } = parts;
    let commands = Arc::new(Mutex::new(commands));
    let handlers = Arc::new(handlers);
    let mut threads = Vec::with_capacity(writers);
    for index in 0..writers {
        let writer = Writer {
            step: PostgresStep {
                conn: Connection::new(url.clone(), url.connect()?),
            },
            commands: Arc::clone(&commands),
            handlers: Arc::clone(&handlers),
            retention,
        };
        let alive = Arc::clone(&alive);
        let thread = std::thread::Builder::new()
            .name(format!("rfidl-receiver-writer-{index}"))
            .spawn(move || {
                let _alive = alive;
                crate::sched::request_short_slice();
                writer.run();
            })
            .map_err(ReceiverError::WriterThread)?;
        threads.push(thread);
    }
    Ok((Arc::new(reader) as Arc<dyn InboxLookup>, threads))
}

/// The PostgreSQL writer's step: one request per transaction (several
/// writers run side by side). A claim inserts the inbox row first (`ON
/// CONFLICT DO NOTHING`), which waits for a concurrent copy's transaction;
/// the record stores the answer in that row.
pub(crate) struct PostgresStep {
    conn: Connection,
}

impl InboxStep for PostgresStep {
    type Store = Postgres;
    type Tx<'c> = postgres::Transaction<'c>;

    fn group_limit(&self) -> usize {
        1
    }

    fn begin(&mut self) -> Result<Self::Tx<'_>, StoreError> {
        let client = self.conn.client()?;
        client.transaction().map_err(|e| statement(&e))
    }

    fn handle<'a, 'c>(tx: &'a mut Self::Tx<'c>) -> &'a mut postgres::Transaction<'c> {
        tx
    }

    fn batch(tx: &mut Self::Tx<'_>, sql: &str) -> Result<(), StoreError> {
        tx.batch_execute(sql).map_err(|e| statement(&e))
    }

    fn claim(
        tx: &mut Self::Tx<'_>,
        delivery: &Delivery,
        now: i64,
        expires_at: i64,
    ) -> Result<Claim, StoreError> {
        let envelope = &delivery.envelope;
        let source = envelope.source_service_id.as_str();
        // Waits for a concurrent copy's transaction to end.
        let claimed = tx
            .execute_typed(
                "INSERT INTO inbox_messages (source_service_id, message_id, endpoint, \
                 payload_sha256, processed_at, response, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, NULL, $6) \
                 ON CONFLICT (source_service_id, message_id) DO NOTHING",
                &[
                    (&source, Type::TEXT),
                    (&delivery.message_id, Type::TEXT),
                    (&envelope.endpoint, Type::TEXT),
                    (&&delivery.payload_sha256[..], Type::BYTEA),
                    (&now, Type::INT8),
                    (&expires_at, Type::INT8),
                ],
            )
            .map_err(|e| statement(&e))?;
        if claimed > 0 {
            return Ok(Claim::Fresh);
        }
        let found = tx
            .query_typed_opt(
                LOOKUP_SQL,
                &[(&source, Type::TEXT), (&delivery.message_id, Type::TEXT)],
            )
            .map_err(|e| statement(&e))?;
        Ok(match found {
            Some(row) => Claim::Done(raw_entry(&row)),
            None => Claim::InProgress,
        })
    }

    fn record(
        tx: &mut Self::Tx<'_>,
        delivery: &Delivery,
        response: &str,
        _now: i64,
        _expires_at: i64,
    ) -> Result<(), StoreError> {
        tx.execute_typed(
            "UPDATE inbox_messages SET response = $3 \
             WHERE source_service_id = $1 AND message_id = $2",
            &[
                (&delivery.envelope.source_service_id, Type::TEXT),
                (&delivery.message_id, Type::TEXT),
                (&response, Type::TEXT),
            ],
        )
        .map(|_| ())
        .map_err(|e| statement(&e))
    }

    fn lost(_: &Self::Tx<'_>) -> bool {
        false
    }

    fn commit(tx: Self::Tx<'_>) -> Result<(), StoreError> {
        tx.commit().map_err(|e| statement(&e))
    }

    fn rollback(tx: Self::Tx<'_>) -> Result<(), StoreError> {
        tx.rollback().map_err(|e| statement(&e))
    }
}
