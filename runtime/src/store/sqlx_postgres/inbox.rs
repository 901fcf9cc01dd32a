//! The receiver on sqlx PostgreSQL: async writers that run async handlers
//! in transactions on the caller's pool, and the committed-inbox look-up.
//!
//! The order within a transaction is the blocking writer's
//! (`receiver::writer`): each message first inserts its inbox row (`ON
//! CONFLICT DO NOTHING`, which waits for a concurrent copy's transaction,
//! on this replica or another), then runs its handler, then stores the
//! answer in that row; a copy processed already is answered as a duplicate
//! and never runs its handler. Messages that share a transaction have a
//! savepoint each, so a refusal undoes only its own work.
//!
//! `writers` tasks take what is queued: each takes up to the group-commit
//! limit of requests into one transaction (one commit, one fsync, for the
//! whole group), and the tasks run side by side, so handlers of different
//! transactions run concurrently and the number of writers bounds both
//! them and the connections the receiver holds.

use std::sync::Arc;

use sqlx::Row as _;
use sqlx::postgres::{PgConnection, Postgres};
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::error;

use crate::inbox::{InboxEntry, InboxError, InboxLookup, RawEntry};
use crate::receiver::handler::{AsyncHostedService, IncomingCall};
use crate::receiver::reply::{ReceiveError, Reply};
use crate::receiver::writer::{
    Command, Delivery, Handlers, Job, acknowledged, count_committed, entry_response, panic_message,
    refusal_of,
};
use crate::receiver::{ReceiverError, Started, WriterParts};
use crate::store::StoreError;

use super::{INBOX_CLAIM, INBOX_LOOKUP, INBOX_RECORD, PgStore};

/// Starts `writers` writer tasks on the current runtime (the pool's).
pub(crate) fn start(
    store: PgStore,
    writers: usize,
    parts: WriterParts<Postgres>,
) -> Result<Started, ReceiverError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        ReceiverError::Database(StoreError::Postgres {
            target: store.target().to_owned(),
            cause: "a receiver on a sqlx pool must be built on the pool's tokio runtime".to_owned(),
        })
    })?;
    if let Some(lifecycle) = &parts.lifecycle {
        lifecycle.replace(super::lifecycle::read(&store)?);
    }
    let WriterParts {
        commands,
        handlers,
        retention,
        group_limit,
        alive,
        ..
    } = parts;
    let shared = Arc::new(Shared {
        store: store.clone(),
        commands: Mutex::new(commands),
        handlers,
        retention_ms: retention.as_millis() as i64,
        group_limit: group_limit.max(1),
        finished: std::sync::Mutex::new(Finished {
            stopped: Vec::new(),
            _alive: alive,
        }),
    });
    for _ in 0..writers {
        runtime.spawn(write(Arc::clone(&shared)));
    }
    let reader = SqlxInbox { store, runtime };
    Ok((Arc::new(reader) as Arc<dyn InboxLookup>, Vec::new()))
}

/// What the writer tasks share.
struct Shared {
    store: PgStore,
    commands: Mutex<mpsc::Receiver<Command>>,
    handlers: Handlers<dyn AsyncHostedService<Postgres>>,
    retention_ms: i64,
    group_limit: usize,
    /// Told when the last writer ended.
    finished: std::sync::Mutex<Finished>,
}

/// The stop requests answered, and the receiver's liveness released, when
/// the last writer task drops [`Shared`].
struct Finished {
    stopped: Vec<oneshot::Sender<()>>,
    _alive: Arc<crate::liveness::LivenessGuard>,
}

impl Drop for Finished {
    fn drop(&mut self) {
        for done in self.stopped.drain(..) {
            let _ = done.send(());
        }
    }
}

/// One writer task: takes a group, commits it; until stopped.
async fn write(shared: Arc<Shared>) {
    loop {
        let group = {
            let mut commands = shared.commands.lock().await;
            let Some(first) = commands.recv().await else {
                break;
            };
            let mut group = Vec::new();
            let mut queued = 0;
            let mut next = Some(first);
            while let Some(command) = next.take() {
                match command {
                    Command::Deliver(job) => {
                        queued += job.deliveries.len();
                        group.push(job);
                    }
                    Command::Stop { done } => {
                        // Refuse new work; what is queued is still processed.
                        commands.close();
                        if let Ok(mut finished) = shared.finished.lock() {
                            finished.stopped.push(done);
                        }
                    }
                }
                if queued < shared.group_limit {
                    next = commands.try_recv().ok();
                }
            }
            group
        };
        if !group.is_empty() {
            commit_group(&shared, group).await;
        }
    }
}

/// How a message's work is set apart from the rest of its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoint {
    None,
    Open,
    ReleaseAndOpen,
}

/// What became of the transaction after one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Intact,
    RollBack,
    Compromised,
}

async fn commit_group(shared: &Shared, group: Vec<Job>) {
    let started = std::time::Instant::now();
    let count: usize = group.iter().map(|job| job.deliveries.len()).sum();
    let mut tx = match shared.store.pool().begin().await {
        Ok(tx) => tx,
        Err(e) => {
            let reason = format!("cannot begin a transaction: {}", super::error_text(&e));
            error!(error = %reason, "receiver cannot begin a write transaction");
            for job in group {
                let refusal = Reply::Refused(ReceiveError::Unavailable(reason.clone()));
                let _ = job.reply.send(vec![refusal; job.deliveries.len()]);
            }
            return;
        }
    };
    let now = crate::store::now_ms();
    let expires_at = now.saturating_add(shared.retention_ms);
    let mut answered = Vec::with_capacity(group.len());
    let mut lost: Option<String> = None;
    let mut refused_alone = false;
    let mut index = 0;
    for job in group {
        let mut answers = Vec::with_capacity(job.deliveries.len());
        for delivery in &job.deliveries {
            if let Some(reason) = &lost {
                answers.push(Reply::Refused(ReceiveError::Unavailable(reason.clone())));
                continue;
            }
            let savepoint = match (count, index) {
                (1, _) => Savepoint::None,
                (_, 0) => Savepoint::Open,
                _ => Savepoint::ReleaseAndOpen,
            };
            index += 1;
            let (answer, state) =
                process(shared, &mut tx, delivery, now, expires_at, savepoint).await;
            match state {
                State::Intact => {}
                State::RollBack => refused_alone = true,
                State::Compromised => {
                    error!("receiver transaction lost mid-group; rolling the group back");
                    lost = Some("the write transaction was lost; retry".to_owned());
                }
            }
            answers.push(answer);
        }
        answered.push((job.reply, answers));
    }
    let failure = if refused_alone {
        match tx.rollback().await {
            Ok(()) => None,
            Err(e) => Some(format!(
                "the database connection was lost: {}",
                super::error_text(&e)
            )),
        }
    } else {
        match lost {
            Some(reason) => {
                let _ = tx.rollback().await;
                Some(reason)
            }
            None => tx.commit().await.err().map(|e| {
                let reason = super::error_text(&e);
                error!(error = %reason, "receiver commit failed");
                format!("commit failed: {reason}")
            }),
        }
    };
    let (mut processed, mut duplicates) = (0, 0);
    for (_, answers) in &mut answered {
        if let Some(reason) = &failure {
            for answer in answers.iter_mut() {
                *answer = Reply::Refused(ReceiveError::Unavailable(reason.clone()));
            }
            continue;
        }
        let (fresh, again) = acknowledged(answers);
        processed += fresh;
        duplicates += again;
    }
    count_committed(
        &shared.handlers.metrics,
        processed,
        duplicates,
        started.elapsed(),
    );
    for (reply, answers) in answered {
        let _ = reply.send(answers);
    }
}

/// One message: claim it, run the handler, record the answer.
async fn process(
    shared: &Shared,
    tx: &mut PgConnection,
    delivery: &Delivery,
    now: i64,
    expires_at: i64,
    savepoint: Savepoint,
) -> (Reply, State) {
    let store = &shared.store;
    let envelope = &delivery.envelope;
    let source = envelope.source_service_id.as_str();
    let unavailable = |what: &str, e: &sqlx::Error| {
        let cause = super::error_text(e);
        error!(error = %cause, "{what}");
        Reply::Refused(ReceiveError::Unavailable(format!("{what}: {cause}")))
    };
    let opening = match savepoint {
        Savepoint::None => None,
        Savepoint::Open => Some("SAVEPOINT rf_message"),
        Savepoint::ReleaseAndOpen => Some("RELEASE SAVEPOINT rf_message; SAVEPOINT rf_message"),
    };
    if let Some(sql) = opening
        && let Err(e) = sqlx::raw_sql(sql).execute(&mut *tx).await
    {
        return (
            unavailable("cannot open a savepoint", &e),
            State::Compromised,
        );
    }
    let claimed = sqlx::query(store.sql(INBOX_CLAIM))
        .bind(source)
        .bind(&delivery.message_id)
        .bind(&envelope.endpoint)
        .bind(&delivery.payload_sha256[..])
        .bind(now)
        .bind(expires_at)
        .execute(&mut *tx)
        .await;
    let refusal = match claimed {
        Err(e) => return (unavailable("inbox claim failed", &e), State::Compromised),
        Ok(done) if done.rows_affected() == 0 => {
            let found = sqlx::query(store.sql(INBOX_LOOKUP))
                .bind(source)
                .bind(&delivery.message_id)
                .fetch_optional(&mut *tx)
                .await;
            let answer = match found {
                Err(e) => return (unavailable("inbox look-up failed", &e), State::Compromised),
                Ok(None) => Reply::Refused(ReceiveError::InProgress),
                Ok(Some(row)) => {
                    let entry = raw_entry(&row);
                    if entry.payload_sha256[..] == delivery.payload_sha256[..] {
                        Reply::Acknowledged {
                            duplicate: true,
                            payload: entry_response(entry.response.as_deref()),
                        }
                    } else {
                        Reply::Refused(ReceiveError::MessageIdReused {
                            source_service_id: source.to_owned(),
                            message_id: delivery.message_id.clone(),
                        })
                    }
                }
            };
            return (answer, State::Intact);
        }
        Ok(_) => match run_handler(shared, delivery, tx).await {
            Ok(response) => {
                let recorded = sqlx::query(store.sql(INBOX_RECORD))
                    .bind(source)
                    .bind(&delivery.message_id)
                    .bind(response.to_string())
                    .execute(&mut *tx)
                    .await;
                match recorded {
                    Ok(_) => {
                        return (
                            Reply::Acknowledged {
                                duplicate: false,
                                payload: response,
                            },
                            State::Intact,
                        );
                    }
                    Err(e) => {
                        return (
                            unavailable("cannot record the message", &e),
                            State::Compromised,
                        );
                    }
                }
            }
            Err(refusal) => refusal,
        },
    };
    if savepoint == Savepoint::None {
        return (Reply::Refused(refusal), State::RollBack);
    }
    match sqlx::raw_sql("ROLLBACK TO SAVEPOINT rf_message")
        .execute(&mut *tx)
        .await
    {
        Ok(_) => (Reply::Refused(refusal), State::Intact),
        Err(e) => {
            error!(error = %super::error_text(&e), "cannot roll back a failed message's savepoint");
            (Reply::Refused(refusal), State::Compromised)
        }
    }
}

/// Runs the delivery's async handler on `conn`: its answer payload, or what
/// the sender is told. A panic is caught and answered 500 `handler_failed`.
async fn run_handler(
    shared: &Shared,
    delivery: &Delivery,
    conn: &mut PgConnection,
) -> Result<serde_json::Value, ReceiveError> {
    use futures_util::FutureExt as _;
    use tracing::Instrument as _;
    let envelope = &delivery.envelope;
    let source = envelope.source_service_id.as_str();
    let span = tracing::info_span!(
        parent: &delivery.span,
        "handler",
        message_id = %delivery.message_id,
        endpoint = %envelope.endpoint,
        trace_id = %delivery.trace.trace_id(),
    );
    if delivery.hosted_fingerprint_differs.is_some() {
        shared.handlers.metrics.inbox_fingerprint_mismatches.inc();
    }
    let call = IncomingCall {
        source,
        message_id: &delivery.message_id,
        correlation_id: envelope.correlation_id.as_deref(),
        message_type: envelope.message_type,
        interface: &envelope.interface,
        version: envelope.version,
        fingerprint: &envelope.fingerprint,
        endpoint: &envelope.endpoint,
        payload: &envelope.payload,
        headers: &envelope.headers,
    };
    let service = &shared.handlers.services[delivery.service].0;
    let handled = crate::trace::scope_traceparent(
        delivery.trace,
        std::panic::AssertUnwindSafe(service.handle(&call, conn)).catch_unwind(),
    )
    .instrument(span)
    .await;
    match handled {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(handler_error)) => Err(refusal_of(handler_error, envelope)),
        Err(panic) => {
            let what = panic_message(panic.as_ref());
            error!(source, message_id = %delivery.message_id, panic = %what, "handler panicked; its work is rolled back");
            Err(ReceiveError::HandlerFailed(format!(
                "handler panicked: {what}"
            )))
        }
    }
}

fn raw_entry(row: &sqlx::postgres::PgRow) -> RawEntry {
    RawEntry {
        endpoint: row.get(0),
        payload_sha256: row.get(1),
        processed_at_ms: row.get(2),
        response: row.get(3),
        expires_at_ms: row.get(4),
    }
}

/// The committed-inbox look-up, on the pool (called on the blocking pool).
struct SqlxInbox {
    store: PgStore,
    runtime: tokio::runtime::Handle,
}

impl InboxLookup for SqlxInbox {
    fn lookup(
        &self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError> {
        let found = self
            .runtime
            .block_on(
                sqlx::query(self.store.sql(INBOX_LOOKUP))
                    .bind(source_service_id)
                    .bind(message_id)
                    .fetch_optional(self.store.pool()),
            )
            .map_err(|e| InboxError::Postgres {
                target: self.store.target().to_owned(),
                cause: super::error_text(&e),
            })?;
        match found {
            Some(row) => raw_entry(&row)
                .into_entry(source_service_id, message_id)
                .map(Some),
            None => Ok(None),
        }
    }
}
