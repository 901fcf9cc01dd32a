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
//! server's own group commit shares fsyncs between them. Every statement is
//! a round trip, so they are few: a lone message has no savepoint (a refusal
//! rolls its transaction back), and in a batch one round trip releases the
//! previous message's savepoint and opens the next one's.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use postgres::types::Type;
use tokio::sync::{mpsc, oneshot};
use tracing::error;

use crate::inbox::{InboxEntry, InboxError, InboxLookup, RawEntry};
use crate::receiver::answer::{Answer, ReceiveError};
use crate::receiver::writer::{
    Command, Delivery, Handlers, Job, acknowledged, count_committed, entry_response,
};
use crate::receiver::{ReceiverError, Started, WriterParts};
use crate::store::Postgres;

use super::{Connection, PostgresUrl, error_text};

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
                .map_err(|e| error_text(&e))
        });
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < READ_POOL_SIZE
        {
            idle.push(conn);
        }
        match found.map_err(|e| self.wrap(e))? {
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
        let rows = super::off_runtime(|| crate::lifecycle::read_postgres(&mut client)).map_err(
            |error| crate::store::StoreError::Postgres {
                target: url.target(),
                cause: super::error_text(&error),
            },
        )?;
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
        let conn = Connection::new(url.clone(), url.connect()?);
        let writer = PostgresWriter {
            conn,
            commands: Arc::clone(&commands),
            handlers: Arc::clone(&handlers),
            retention_ms: retention.as_millis() as i64,
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

/// One writer thread and its connection.
pub(crate) struct PostgresWriter {
    conn: Connection,
    commands: Arc<Mutex<mpsc::Receiver<Command>>>,
    handlers: Arc<Handlers<Postgres>>,
    retention_ms: i64,
}

impl PostgresWriter {
    fn run(mut self) {
        let mut stopped: Vec<oneshot::Sender<()>> = Vec::new();
        loop {
            // Waits for work holding the lock (the other writers wait for
            // the lock); a Stop closes the queue under that same lock, so
            // no writer sleeps on a queue that will never be closed.
            let command = match self.commands.lock() {
                Ok(mut commands) => {
                    let command = commands.blocking_recv();
                    if matches!(command, Some(Command::Stop { .. })) {
                        // Refuse new work; what is queued is still processed
                        // by whichever writer takes it.
                        commands.close();
                    }
                    command
                }
                Err(_) => None,
            };
            match command {
                None => break,
                Some(Command::Deliver(job)) => self.commit_job(job),
                Some(Command::Stop { done }) => stopped.push(done),
            }
        }
        drop(self.conn);
        for done in stopped {
            let _ = done.send(());
        }
    }

    fn commit_job(&mut self, job: Job) {
        let started = Instant::now();
        let count = job.deliveries.len();
        let refuse_all =
            |reason: String| vec![Answer::Refused(ReceiveError::Unavailable(reason)); count];
        let client = match self.conn.client() {
            Ok(client) => client,
            Err(reason) => {
                error!(%reason, "receiver cannot reach its database");
                let _ = job.reply.send(refuse_all(reason));
                return;
            }
        };
        let mut tx = match client.transaction() {
            Ok(tx) => tx,
            Err(e) => {
                let reason = format!("cannot begin a transaction: {}", error_text(&e));
                error!(%reason, "receiver cannot begin a write transaction");
                let _ = job.reply.send(refuse_all(reason));
                return;
            }
        };
        let now = crate::store::now_ms();
        let expires_at = now.saturating_add(self.retention_ms);
        let mut answers = Vec::with_capacity(count);
        let mut lost: Option<String> = None;
        let mut refused_alone = false;
        for (index, delivery) in job.deliveries.iter().enumerate() {
            if let Some(reason) = &lost {
                answers.push(Answer::Refused(ReceiveError::Unavailable(reason.clone())));
                continue;
            }
            // A request of one message needs no savepoint: its transaction
            // is the message's. In a batch, each message opens one, and the
            // next message's opening releases it in the same round trip
            // (COMMIT releases the last).
            let savepoint = match (count, index) {
                (1, _) => Savepoint::None,
                (_, 0) => Savepoint::Open,
                _ => Savepoint::ReleaseAndOpen,
            };
            let (answer, state) = process(
                &mut tx,
                &self.handlers,
                delivery,
                now,
                expires_at,
                savepoint,
            );
            match state {
                State::Intact => {}
                State::RollBack => refused_alone = true,
                State::Compromised => {
                    error!("receiver transaction compromised mid-request; rolling it back");
                    lost = Some("the write transaction was lost; retry".to_owned());
                }
            }
            answers.push(answer);
        }
        if refused_alone {
            // The one message was refused: nothing of it may commit. If the
            // rollback fails too, the connection was lost under the handler
            // (its error said so only as a failed statement): that is the
            // database's fault, not the message's, and is answered 503 (not
            // counted against the message's retries), as a lost commit is.
            let answers = match tx.rollback() {
                Ok(()) => answers,
                Err(e) => refuse_all(format!(
                    "the database connection was lost: {}",
                    error_text(&e)
                )),
            };
            let _ = job.reply.send(answers);
            return;
        }
        let failure = match lost {
            Some(reason) => {
                let _ = tx.rollback();
                Some(reason)
            }
            None => tx.commit().err().map(|e| {
                let reason = format!("commit failed: {}", error_text(&e));
                error!(%reason, "receiver commit failed");
                reason
            }),
        };
        if let Some(reason) = failure {
            let _ = job.reply.send(refuse_all(reason));
            return;
        }
        let (processed, duplicates) = acknowledged(&answers);
        count_committed(
            &self.handlers.metrics,
            processed,
            duplicates,
            started.elapsed(),
        );
        let _ = job.reply.send(answers);
    }
}

/// How a message's work is set apart from the rest of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoint {
    /// Alone in its transaction: a refusal rolls the transaction back.
    None,
    /// The first of a batch: opens `rf_message`.
    Open,
    /// A later one: releases the previous message's savepoint and opens its
    /// own, in one round trip.
    ReleaseAndOpen,
}

/// What became of the transaction after one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Usable; the message's work is kept or was undone to its savepoint.
    Intact,
    /// The message (alone in its transaction) was refused: roll back.
    RollBack,
    /// Could not be brought back to a usable state.
    Compromised,
}

/// One message: claim its inbox row, run the handler, store the answer.
fn process(
    tx: &mut postgres::Transaction<'_>,
    handlers: &Handlers<Postgres>,
    delivery: &Delivery,
    now: i64,
    expires_at: i64,
    savepoint: Savepoint,
) -> (Answer, State) {
    let envelope = &delivery.envelope;
    let source = envelope.source_service_id.as_str();
    let unavailable = |what: &str, e: &postgres::Error| {
        let text = error_text(e);
        error!(error = %text, "{what}");
        Answer::Refused(ReceiveError::Unavailable(format!("{what}: {text}")))
    };
    let opening = match savepoint {
        Savepoint::None => None,
        Savepoint::Open => Some("SAVEPOINT rf_message"),
        Savepoint::ReleaseAndOpen => Some("RELEASE SAVEPOINT rf_message; SAVEPOINT rf_message"),
    };
    if let Some(sql) = opening
        && let Err(e) = tx.batch_execute(sql)
    {
        return (
            unavailable("cannot open a savepoint", &e),
            State::Compromised,
        );
    }
    // Claim the message: waits for a concurrent copy's transaction to end.
    let claimed = tx.execute_typed(
        "INSERT INTO inbox_messages (source_service_id, message_id, endpoint, payload_sha256, \
         processed_at, response, expires_at) VALUES ($1, $2, $3, $4, $5, NULL, $6) \
         ON CONFLICT (source_service_id, message_id) DO NOTHING",
        &[
            (&source, Type::TEXT),
            (&delivery.message_id, Type::TEXT),
            (&envelope.endpoint, Type::TEXT),
            (&&delivery.payload_sha256[..], Type::BYTEA),
            (&now, Type::INT8),
            (&expires_at, Type::INT8),
        ],
    );
    let refusal = match claimed {
        Ok(0) => {
            // Processed already: by a transaction that committed, or
            // earlier in this one.
            let answer = match tx.query_typed_opt(
                LOOKUP_SQL,
                &[(&source, Type::TEXT), (&delivery.message_id, Type::TEXT)],
            ) {
                Ok(Some(row)) => {
                    let raw = raw_entry(&row);
                    if raw.payload_sha256[..] == delivery.payload_sha256[..] {
                        Answer::Acknowledged {
                            duplicate: true,
                            payload: entry_response(raw.response.as_deref()),
                        }
                    } else {
                        Answer::Refused(ReceiveError::MessageIdReused {
                            source_service_id: source.to_owned(),
                            message_id: delivery.message_id.clone(),
                        })
                    }
                }
                Ok(None) => Answer::Refused(ReceiveError::InProgress),
                Err(e) => unavailable("inbox look-up failed", &e),
            };
            return (answer, State::Intact);
        }
        Ok(_) => match handlers.run(delivery, tx) {
            Ok(response) => {
                let stored = tx.execute_typed(
                    "UPDATE inbox_messages SET response = $3 \
                         WHERE source_service_id = $1 AND message_id = $2",
                    &[
                        (&source, Type::TEXT),
                        (&delivery.message_id, Type::TEXT),
                        (&response.to_string(), Type::TEXT),
                    ],
                );
                match stored {
                    Ok(_) => {
                        return (
                            Answer::Acknowledged {
                                duplicate: false,
                                payload: response,
                            },
                            State::Intact,
                        );
                    }
                    Err(e) => {
                        let text = error_text(&e);
                        error!(error = %text, source, message_id = %delivery.message_id, "cannot record an inbox row");
                        ReceiveError::Unavailable(format!("cannot record the message: {text}"))
                    }
                }
            }
            Err(refusal) => refusal,
        },
        Err(e) => {
            let text = error_text(&e);
            error!(error = %text, "cannot record an inbox row");
            ReceiveError::Unavailable(format!("cannot record the message: {text}"))
        }
    };
    if savepoint == Savepoint::None {
        return (Answer::Refused(refusal), State::RollBack);
    }
    // The savepoint stays open: the next message (or COMMIT) releases it.
    match tx.batch_execute("ROLLBACK TO SAVEPOINT rf_message") {
        Ok(()) => (Answer::Refused(refusal), State::Intact),
        Err(e) => {
            error!(error = %error_text(&e), "cannot roll back a failed message's savepoint");
            (Answer::Refused(refusal), State::Compromised)
        }
    }
}
