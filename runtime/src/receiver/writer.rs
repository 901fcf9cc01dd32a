//! The receiver's single database writer: one thread that owns the write
//! connection, runs every handler, and group-commits.
//!
//! A `synchronous=FULL` commit costs one fsync (a few hundred microseconds),
//! which would cap a receiver that commits once per message at a few thousand
//! messages a second. So the writer drains every delivery queued at that
//! moment (up to a cap), opens one `BEGIN IMMEDIATE` transaction, and gives
//! each message its own savepoint: re-check the inbox (a copy of the same id
//! processed earlier in this group, or committed since the request's own
//! look-up, is seen here and answered as a duplicate, so two copies can never
//! both run the handler to commit), run the handler, insert the inbox row,
//! `RELEASE`; or `ROLLBACK TO` when the handler fails or panics, so only that
//! message's work is undone. One `COMMIT` (one fsync) covers the group; only
//! then is any request of the group answered.
//!
//! Handlers run on this thread because `rusqlite::Transaction` is neither
//! `Send` nor `Sync`. This thread never touches the network.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use crate::envelope::Envelope;
use crate::inbox::{self, PayloadDigest, ProcessedMessage};
use crate::metrics::Metrics;
use crate::receiver::answer::{Answer, ReceiveError};
use crate::receiver::handler::{HandlerError, HostedService, IncomingCall};
use crate::store::now_ms;
use crate::store::{Sqlite, Store};

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
    pub reply: oneshot::Sender<Vec<Answer>>,
}

#[derive(Debug)]
pub(crate) enum Command {
    Deliver(Job),
    /// Finish what is queued, then stop; `done` fires when the connection is closed.
    Stop {
        done: oneshot::Sender<()>,
    },
}

pub(crate) struct Writer {
    pub conn: Connection,
    pub commands: mpsc::Receiver<Command>,
    pub handlers: Handlers<Sqlite>,
    pub retention: Duration,
    /// Most deliveries per group commit (a bigger single batch still goes whole).
    pub group_limit: usize,
}

/// What runs one message: the hosted services and the metrics they count into.
pub(crate) struct Handlers<S: Store = Sqlite> {
    pub services: Arc<[Arc<dyn HostedService<S>>]>,
    pub metrics: Arc<Metrics>,
}

impl<S: Store> Handlers<S> {
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
        let service = &self.services[delivery.service];
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

/// Whether the group's transaction can still be committed after a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TransactionState {
    Intact,
    /// A failed message's work could not be rolled back to its savepoint.
    Compromised,
}

const SAVEPOINT: &str = "SAVEPOINT rf_message";
const RELEASE: &str = "RELEASE rf_message";
const ROLLBACK_TO: &str = "ROLLBACK TO rf_message; RELEASE rf_message";

impl Writer {
    /// Runs until stopped or until every sender is gone.
    pub fn run(mut self) {
        let mut stopped = Vec::new();
        while let Some(first) = self.commands.blocking_recv() {
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
                        // Refuse new work; what is already queued is still processed.
                        self.commands.close();
                        stopped.push(done);
                    }
                }
                if queued < self.group_limit {
                    next = self.commands.try_recv().ok();
                }
            }
            if !group.is_empty() {
                self.commit_group(group);
            }
        }
        drop(self.conn);
        for done in stopped {
            let _ = done.send(());
        }
    }

    fn commit_group(&mut self, group: Vec<Job>) {
        let started = Instant::now();
        let tx = match self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
        {
            Ok(tx) => tx,
            Err(e) => {
                error!(error = %e, "receiver cannot begin a write transaction");
                let refusal = ReceiveError::Unavailable(format!("cannot begin a transaction: {e}"));
                for job in group {
                    let answers = vec![Answer::Refused(refusal.clone()); job.deliveries.len()];
                    let _ = job.reply.send(answers);
                }
                return;
            }
        };
        let now = now_ms();
        let expires_at = now.saturating_add(self.retention.as_millis() as i64);
        let mut answered: Vec<(oneshot::Sender<Vec<Answer>>, Vec<Answer>)> =
            Vec::with_capacity(group.len());
        let mut lost: Option<String> = None;
        let mut processed = 0u64;
        let mut duplicates = 0u64;
        for job in group {
            let mut answers = Vec::with_capacity(job.deliveries.len());
            for delivery in &job.deliveries {
                if let Some(reason) = &lost {
                    answers.push(Answer::Refused(ReceiveError::Unavailable(reason.clone())));
                    continue;
                }
                let (answer, state) = self.handlers.process(&tx, delivery, now, expires_at);
                if tx.is_autocommit() || state == TransactionState::Compromised {
                    // SQLite ended the transaction (I/O error, disk full, a
                    // handler's stray COMMIT/ROLLBACK), or a failed message's
                    // work could not be undone: roll the whole group back and
                    // acknowledge nothing of it.
                    error!(
                        "receiver transaction lost or compromised mid-group; rolling the group back"
                    );
                    lost = Some("the write transaction was lost; retry".to_owned());
                }
                answers.push(answer);
            }
            answered.push((job.reply, answers));
        }
        let failure = match lost {
            Some(reason) => {
                let _ = tx.rollback();
                Some(reason)
            }
            None => tx.commit().err().map(|e| {
                error!(error = %e, "receiver group commit failed");
                format!("commit failed: {e}")
            }),
        };
        for (_, answers) in &mut answered {
            if let Some(reason) = &failure {
                // Acknowledgements and id-reuse verdicts of this group may rest
                // on rows that never committed: the sender must retry.
                for answer in answers.iter_mut() {
                    *answer = Answer::Refused(ReceiveError::Unavailable(reason.clone()));
                }
                continue;
            }
            let (fresh, again) = acknowledged(answers);
            processed += fresh;
            duplicates += again;
        }
        // Count before answering, so a caller that saw its answer sees the count.
        // Each message processed now waited for the whole group's commit.
        count_committed(
            &self.handlers.metrics,
            processed,
            duplicates,
            started.elapsed(),
        );
        for (reply, answers) in answered {
            let _ = reply.send(answers);
        }
    }
}

impl Handlers<Sqlite> {
    /// One message inside the group's transaction.
    fn process(
        &self,
        tx: &Transaction<'_>,
        delivery: &Delivery,
        now: i64,
        expires_at: i64,
    ) -> (Answer, TransactionState) {
        let intact = |answer| (answer, TransactionState::Intact);
        let envelope = &delivery.envelope;
        let source = envelope.source_service_id.as_str();
        match inbox::lookup(tx, source, &delivery.message_id) {
            Ok(Some(entry)) => {
                return intact(if entry.payload_sha256 == delivery.payload_sha256 {
                    Answer::Acknowledged {
                        duplicate: true,
                        payload: entry_response(entry.response.as_deref()),
                    }
                } else {
                    Answer::Refused(ReceiveError::MessageIdReused {
                        source_service_id: source.to_owned(),
                        message_id: delivery.message_id.clone(),
                    })
                });
            }
            Ok(None) => {}
            Err(e) => return intact(unavailable("inbox look-up failed", &e)),
        }
        if let Err(e) = tx.execute_batch(SAVEPOINT) {
            return intact(unavailable("cannot open a savepoint", &e));
        }
        let outcome = self.run(delivery, tx);
        let refusal = match outcome {
            Ok(response) => {
                let response_text = response.to_string();
                let row = ProcessedMessage {
                    source_service_id: source,
                    message_id: &delivery.message_id,
                    endpoint: &envelope.endpoint,
                    payload_sha256: &delivery.payload_sha256,
                    response: &response_text,
                    processed_at_ms: now,
                    expires_at_ms: expires_at,
                };
                match inbox::record_processed(tx, &row).and_then(|()| tx.execute_batch(RELEASE)) {
                    Ok(()) => {
                        return intact(Answer::Acknowledged {
                            duplicate: false,
                            payload: response,
                        });
                    }
                    Err(e) => {
                        error!(error = %e, source, message_id = %delivery.message_id, "cannot record an inbox row");
                        ReceiveError::Unavailable(format!("cannot record the message: {e}"))
                    }
                }
            }
            Err(refusal) => refusal,
        };
        if let Err(e) = tx.execute_batch(ROLLBACK_TO) {
            error!(error = %e, "cannot roll back a failed message's savepoint");
            return (Answer::Refused(refusal), TransactionState::Compromised);
        }
        (Answer::Refused(refusal), TransactionState::Intact)
    }
}

/// How many of `answers` were processed now and how many were duplicates.
pub(crate) fn acknowledged(answers: &[Answer]) -> (u64, u64) {
    answers
        .iter()
        .fold((0, 0), |(fresh, again), answer| match answer {
            Answer::Acknowledged {
                duplicate: false, ..
            } => (fresh + 1, again),
            Answer::Acknowledged {
                duplicate: true, ..
            } => (fresh, again + 1),
            Answer::Refused(_) => (fresh, again),
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

fn unavailable(what: &str, error: &rusqlite::Error) -> Answer {
    error!(error = %error, "{what}");
    Answer::Refused(ReceiveError::Unavailable(format!("{what}: {error}")))
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

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}
