//! The receiver's database writers: threads that own a write connection
//! each, run the handlers, and commit.
//!
//! One loop for every store ([`run`]), over the store's step ([`InboxStep`],
//! in `store::<name>::inbox`). A writer takes what is queued (up to the
//! store's group limit), opens one transaction, and processes each message
//! in it: claim the message (a copy processed earlier, by this transaction
//! or another that committed, is answered as a duplicate, so two copies can
//! never both run the handler to commit), run the handler, record the
//! inbox row. A message that shares its transaction has a savepoint of its
//! own, so a refusal or a panic undoes only its work; the next message's
//! savepoint releases it in the same round trip. A message alone in its
//! transaction has none, and its refusal rolls the transaction back. One
//! commit covers the group; only then is any request of the group answered.
//!
//! SQLite runs one writer that group-commits (one fsync for many
//! messages); PostgreSQL runs several (`ReceiverBuilder::writers`), one
//! request per transaction, and the server shares fsyncs between them.
//! Handlers run on these threads because the stores' transactions are
//! neither `Send` nor `Sync`. A writer never touches the network.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use crate::envelope::Envelope;
use crate::inbox::{PayloadDigest, RawEntry};
use crate::metrics::Metrics;
use crate::receiver::handler::Registered;
use crate::receiver::handler::{HandlerError, HostedService, IncomingCall};
use crate::receiver::reply::{ReceiveError, Reply};
use crate::store::{Store, StoreError};

/// A verified, routed message waiting for the writer.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub envelope: Envelope,
    /// The inbox key: the canonical (lower-case, hyphenated) `messageId`.
    pub message_id: String,
    pub payload_sha256: PayloadDigest,
    /// Index of the hosting service in the receiver's list.
    pub service: usize,
    /// The hosted fingerprint, when the sender's differs from it.
    pub hosted_fingerprint_differs: Option<&'static str>,
    /// The trace the handler continues: the envelope's `traceparent`, or a
    /// new trace when it carries none (or a malformed one).
    pub trace: crate::trace::TraceParent,
    /// The message's `receive` span (closed when the delivery is dropped).
    pub span: tracing::Span,
}

/// Deliveries answered together (one request: one, or a whole batch).
#[derive(Debug)]
pub(crate) struct Job {
    pub deliveries: Vec<Delivery>,
    pub reply: oneshot::Sender<Vec<Reply>>,
}

#[derive(Debug)]
pub(crate) enum Command {
    Deliver(Job),
    /// Finish what is queued, then stop; `done` fires when the connection is closed.
    Stop {
        done: oneshot::Sender<()>,
    },
}

/// What runs one message: the hosted services and the metrics they count into.
pub(crate) struct Handlers<T: ?Sized> {
    pub services: Arc<[Registered<T>]>,
    pub metrics: Arc<Metrics>,
}

impl<S: Store> Handlers<dyn HostedService<S>> {
    /// Runs the delivery's handler in `tx`: its answer payload, or what the
    /// sender is told. A panic is caught and answered 500 `handler_failed`.
    pub(crate) fn run(
        &self,
        delivery: &Delivery,
        tx: S::Handle<'_, '_>,
    ) -> Result<serde_json::Value, ReceiveError> {
        let envelope = &delivery.envelope;
        let source = envelope.source_service_id.as_str();
        let span = tracing::info_span!(
            parent: &delivery.span,
            "handler",
            message_id = %delivery.message_id,
            endpoint = %envelope.endpoint,
            trace_id = %delivery.trace.trace_id(),
        );
        let _entered = span.enter();
        if let Some(hosted) = delivery.hosted_fingerprint_differs {
            self.metrics.inbox_fingerprint_mismatches.inc();
            warn!(
                source,
                interface = %envelope.interface,
                version = envelope.version,
                sender_fingerprint = %envelope.fingerprint,
                hosted_fingerprint = hosted,
                "accepting a message whose contract fingerprint differs from the hosted one"
            );
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
        let service = &self.services[delivery.service].0;
        // Messages the handler enqueues continue the incoming trace.
        let handled = crate::trace::with_traceparent(delivery.trace, || {
            catch_unwind(AssertUnwindSafe(|| service.handle(&call, tx)))
        });
        match handled {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(handler_error)) => Err(refusal_of(handler_error, envelope)),
            Err(panic) => {
                let what = panic_message(panic.as_ref());
                error!(source, message_id = %delivery.message_id, endpoint = %envelope.endpoint, panic = %what, "handler panicked; its work is rolled back");
                Err(ReceiveError::HandlerFailed(format!(
                    "handler panicked: {what}"
                )))
            }
        }
    }
}

/// One store's part of the writer: its transaction and statements.
pub(crate) trait InboxStep: Send + 'static {
    /// The store whose handlers run here.
    type Store: Store;
    /// An open transaction on the writer's connection.
    type Tx<'c>
    where
        Self: 'c;

    /// Most deliveries one transaction takes (a single bigger batch still
    /// goes whole); 1: one request per transaction.
    fn group_limit(&self) -> usize;

    /// Begins a write transaction.
    fn begin(&mut self) -> Result<Self::Tx<'_>, StoreError>;

    /// The transaction as handlers and clients get it.
    fn handle<'a, 'c>(tx: &'a mut Self::Tx<'c>) -> <Self::Store as Store>::Handle<'a, 'c>;

    /// Runs `sql` (savepoint statements, the same on every store).
    fn batch(tx: &mut Self::Tx<'_>, sql: &str) -> Result<(), StoreError>;

    /// Claims (`source`, `message_id`) for this transaction: [`Claim::Fresh`]
    /// when no transaction processed it, else what the inbox holds.
    fn claim(
        tx: &mut Self::Tx<'_>,
        delivery: &Delivery,
        now: i64,
        expires_at: i64,
    ) -> Result<Claim, StoreError>;

    /// Records the claimed message as processed, with its answer.
    fn record(
        tx: &mut Self::Tx<'_>,
        delivery: &Delivery,
        response: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError>;

    /// Whether the database ended the transaction under the writer (I/O
    /// error, disk full, a handler's stray `COMMIT`).
    fn lost(tx: &Self::Tx<'_>) -> bool;

    fn commit(tx: Self::Tx<'_>) -> Result<(), StoreError>;

    fn rollback(tx: Self::Tx<'_>) -> Result<(), StoreError>;
}

/// What the inbox says of a message a writer is about to process.
pub(crate) enum Claim {
    /// Nobody processed it: run the handler.
    Fresh,
    /// Processed already (committed, or earlier in this transaction).
    Done(RawEntry),
    /// Another transaction holds it and its row is not visible yet.
    #[cfg_attr(
        not(any(feature = "sqlx-postgres", feature = "sqlx-sqlite")),
        allow(dead_code)
    )]
    InProgress,
}

/// How a message's work is set apart from the rest of its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoint {
    /// Alone in its transaction: a refusal rolls the transaction back.
    None,
    /// The first of several: opens `rf_message`.
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

/// A writer thread: its store's step, the shared queue, the handlers.
pub(crate) struct Writer<W: InboxStep> {
    pub step: W,
    pub commands: Arc<Mutex<mpsc::Receiver<Command>>>,
    pub handlers: Arc<Handlers<dyn HostedService<W::Store>>>,
    pub retention: Duration,
}

impl<W: InboxStep> Writer<W> {
    /// Runs until stopped or until every sender is gone.
    pub fn run(mut self) {
        let mut stopped = Vec::new();
        loop {
            // Waits for work holding the lock (other writers wait for the
            // lock); a Stop closes the queue under that same lock, so no
            // writer sleeps on a queue that will never be closed.
            let group = {
                let Ok(mut commands) = self.commands.lock() else {
                    break;
                };
                let Some(first) = commands.blocking_recv() else {
                    break;
                };
                let limit = self.step.group_limit();
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
                            // Refuse new work; what is queued is still
                            // processed by whichever writer takes it.
                            commands.close();
                            stopped.push(done);
                        }
                    }
                    if queued < limit {
                        next = commands.try_recv().ok();
                    }
                }
                group
            };
            if !group.is_empty() {
                self.commit_group(group);
            }
        }
        drop(self.step);
        for done in stopped {
            let _ = done.send(());
        }
    }

    fn commit_group(&mut self, group: Vec<Job>) {
        let started = Instant::now();
        let count: usize = group.iter().map(|job| job.deliveries.len()).sum();
        let refuse_all = |group: Vec<Job>, reason: &str| {
            for job in group {
                let refusal = Reply::Refused(ReceiveError::Unavailable(reason.to_owned()));
                let _ = job.reply.send(vec![refusal; job.deliveries.len()]);
            }
        };
        let retention_ms = self.retention.as_millis() as i64;
        let handlers = Arc::clone(&self.handlers);
        let mut tx = match self.step.begin() {
            Ok(tx) => tx,
            Err(e) => {
                error!(error = %e, "receiver cannot begin a write transaction");
                refuse_all(group, &format!("cannot begin a transaction: {e}"));
                return;
            }
        };
        let now = crate::store::now_ms();
        let expires_at = now.saturating_add(retention_ms);
        let mut answered: Vec<(oneshot::Sender<Vec<Reply>>, Vec<Reply>)> =
            Vec::with_capacity(group.len());
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
                    process::<W>(&mut tx, &handlers, delivery, now, expires_at, savepoint);
                let state = if W::lost(&tx) {
                    State::Compromised
                } else {
                    state
                };
                match state {
                    State::Intact => {}
                    State::RollBack => refused_alone = true,
                    State::Compromised => {
                        error!(
                            "receiver transaction lost or compromised mid-group; rolling the group back"
                        );
                        lost = Some("the write transaction was lost; retry".to_owned());
                    }
                }
                answers.push(answer);
            }
            answered.push((job.reply, answers));
        }
        let failure = if refused_alone {
            // The one message was refused: nothing of it may commit. If the
            // rollback fails too, the connection was lost under the handler
            // (its error said so only as a failed statement): that is the
            // database's fault, not the message's, and is answered 503 (not
            // counted against the message's retries), as a lost commit is.
            match W::rollback(tx) {
                Ok(()) => None,
                Err(e) => Some(format!("the database connection was lost: {e}")),
            }
        } else {
            match lost {
                Some(reason) => {
                    let _ = W::rollback(tx);
                    Some(reason)
                }
                None => W::commit(tx).err().map(|e| {
                    error!(error = %e, "receiver commit failed");
                    format!("commit failed: {e}")
                }),
            }
        };
        let (mut processed, mut duplicates) = (0, 0);
        for (_, answers) in &mut answered {
            if let Some(reason) = &failure {
                // Acknowledgements and id-reuse verdicts of this group may rest
                // on rows that never committed: the sender must retry.
                for answer in answers.iter_mut() {
                    *answer = Reply::Refused(ReceiveError::Unavailable(reason.clone()));
                }
                continue;
            }
            let (fresh, again) = acknowledged(answers);
            processed += fresh;
            duplicates += again;
        }
        // Count before answering, so a caller that saw its answer sees the count.
        // Each message processed now waited for the whole group's commit.
        count_committed(&handlers.metrics, processed, duplicates, started.elapsed());
        for (reply, answers) in answered {
            let _ = reply.send(answers);
        }
    }
}

/// One message: claim it, run the handler, record the answer.
fn process<W: InboxStep>(
    tx: &mut W::Tx<'_>,
    handlers: &Handlers<dyn HostedService<W::Store>>,
    delivery: &Delivery,
    now: i64,
    expires_at: i64,
    savepoint: Savepoint,
) -> (Reply, State) {
    let envelope = &delivery.envelope;
    let source = envelope.source_service_id.as_str();
    let unavailable = |what: &str, e: &StoreError| {
        error!(error = %e, "{what}");
        Reply::Refused(ReceiveError::Unavailable(format!("{what}: {e}")))
    };
    let opening = match savepoint {
        Savepoint::None => None,
        Savepoint::Open => Some("SAVEPOINT rf_message"),
        Savepoint::ReleaseAndOpen => Some("RELEASE SAVEPOINT rf_message; SAVEPOINT rf_message"),
    };
    if let Some(sql) = opening
        && let Err(e) = W::batch(tx, sql)
    {
        return (
            unavailable("cannot open a savepoint", &e),
            State::Compromised,
        );
    }
    let refusal = match W::claim(tx, delivery, now, expires_at) {
        Ok(Claim::Done(entry)) => {
            // Processed already: by a transaction that committed, or
            // earlier in this one.
            let answer = if entry.payload_sha256[..] == delivery.payload_sha256[..] {
                Reply::Acknowledged {
                    duplicate: true,
                    payload: entry_response(entry.response.as_deref()),
                }
            } else {
                Reply::Refused(ReceiveError::MessageIdReused {
                    source_service_id: source.to_owned(),
                    message_id: delivery.message_id.clone(),
                })
            };
            return (answer, State::Intact);
        }
        Ok(Claim::InProgress) => return (Reply::Refused(ReceiveError::InProgress), State::Intact),
        Err(e) => return (unavailable("inbox look-up failed", &e), State::Intact),
        Ok(Claim::Fresh) => match handlers.run(delivery, W::handle(tx)) {
            Ok(response) => match W::record(tx, delivery, &response.to_string(), now, expires_at) {
                Ok(()) => {
                    return (
                        Reply::Acknowledged {
                            duplicate: false,
                            payload: response,
                        },
                        State::Intact,
                    );
                }
                Err(e) => {
                    error!(error = %e, source, message_id = %delivery.message_id, "cannot record an inbox row");
                    ReceiveError::Unavailable(format!("cannot record the message: {e}"))
                }
            },
            Err(refusal) => refusal,
        },
    };
    if savepoint == Savepoint::None {
        return (Reply::Refused(refusal), State::RollBack);
    }
    // The savepoint stays open: the next message (or the commit) releases it.
    match W::batch(tx, "ROLLBACK TO SAVEPOINT rf_message") {
        Ok(()) => (Reply::Refused(refusal), State::Intact),
        Err(e) => {
            error!(error = %e, "cannot roll back a failed message's savepoint");
            (Reply::Refused(refusal), State::Compromised)
        }
    }
}

/// How many of `answers` were processed now and how many were duplicates.
pub(crate) fn acknowledged(answers: &[Reply]) -> (u64, u64) {
    answers
        .iter()
        .fold((0, 0), |(fresh, again), answer| match answer {
            Reply::Acknowledged {
                duplicate: false, ..
            } => (fresh + 1, again),
            Reply::Acknowledged {
                duplicate: true, ..
            } => (fresh, again + 1),
            Reply::Refused(_) => (fresh, again),
        })
}

/// Counts a commit's messages: each one processed waited `elapsed` (the
/// whole transaction).
pub(crate) fn count_committed(
    metrics: &Metrics,
    processed: u64,
    duplicates: u64,
    elapsed: Duration,
) {
    metrics.inbox_processed.add(processed);
    metrics.inbox_duplicates.add(duplicates);
    for _ in 0..processed {
        metrics.inbox_process_duration.observe(elapsed);
    }
}

pub(crate) fn entry_response(text: Option<&str>) -> serde_json::Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(serde_json::Value::Null)
}

pub(crate) fn refusal_of(handler_error: HandlerError, envelope: &Envelope) -> ReceiveError {
    match handler_error {
        HandlerError::PayloadMismatch(message) => ReceiveError::PayloadMismatch(format!(
            "payload of {} v{} {} does not match the contract: {message}",
            envelope.interface, envelope.version, envelope.endpoint
        )),
        HandlerError::Poison(message) => ReceiveError::Poison(message),
        HandlerError::Refused { code, message } => ReceiveError::Refused { code, message },
        HandlerError::Retryable(message) => ReceiveError::HandlerFailed(message),
        HandlerError::UnknownEndpoint(endpoint) => ReceiveError::UnknownEndpoint {
            interface: envelope.interface.clone(),
            version: envelope.version,
            endpoint,
        },
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}
