//! The receiver's writers on a sqlx store: async tasks that run async
//! handlers in transactions on the caller's pool. One loop for both sqlx
//! stores ([`start`]), over the store's statements ([`AsyncInboxStep`], in
//! `store::sqlx_<name>::inbox`), as [`super::writer`] is for the blocking
//! stores.
//!
//! The order within a transaction is the blocking writer's: each message
//! first claims its inbox row (an insert that leaves a row processed or
//! being processed by another transaction alone), then runs its handler,
//! then stores the answer in that row (unless it is `null`, which the
//! claim stored already); a copy processed already is
//! answered as a duplicate and never runs its handler. Messages that share
//! a transaction have a savepoint each, so a refusal undoes only its own
//! work.
//!
//! `writers` tasks take what is queued: each takes up to the group-commit
//! limit of requests into one transaction (one commit, one fsync, for the
//! whole group), and the tasks run side by side, so handlers of different
//! transactions run concurrently and the number of writers bounds both
//! them and the connections the receiver holds (PostgreSQL: several;
//! SQLite: one, since its transactions take the file's one write lock).

use std::ops::DerefMut;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::error;

use crate::BoxFuture;
use crate::receiver::handler::{AsyncHostedService, IncomingCall};
use crate::receiver::reply::{ReceiveError, Reply};
use crate::receiver::writer::{
    Claim, Command, Delivery, Handlers, Job, acknowledged, count_committed, entry_response,
    panic_message, refusal_of,
};
use crate::store::AsyncStore;

/// The connection handlers of `W`'s store write through.
pub(crate) type Conn<W> = <<W as AsyncInboxStep>::Store as AsyncStore>::Connection;

/// One sqlx store's part of the writer: its transaction and statements.
pub(crate) trait AsyncInboxStep: Send + Sync + 'static {
    /// The store whose handlers run here.
    type Store: AsyncStore;
    /// A write transaction on a connection of the pool.
    type Tx: DerefMut<Target = Conn<Self>> + Send + 'static;

    /// Begins a write transaction.
    fn begin(&self) -> BoxFuture<'_, Result<Self::Tx, sqlx::Error>>;

    fn commit(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>>;

    fn rollback(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>>;

    /// Runs `sql` (savepoint statements, the same on both stores).
    fn batch<'a>(
        conn: &'a mut Conn<Self>,
        sql: &'static str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Claims the delivery for this transaction: inserts its inbox row
    /// (without an answer) unless one exists; [`Claim::Fresh`] when it was
    /// inserted, else what the inbox holds.
    fn claim<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        delivery: &'a Delivery,
        now: i64,
        expires_at: i64,
    ) -> BoxFuture<'a, Result<Claim, sqlx::Error>>;

    /// Claims every delivery of a group at once, in the order given (one
    /// statement), or `None` when the store claims each in its message's
    /// savepoint ([`claim`](Self::claim)). The group holds no two copies of
    /// one message. A row claimed so whose handler fails is removed with
    /// [`unclaim`](Self::unclaim) after its savepoint is rolled back.
    fn claim_all<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        deliveries: &'a [&'a Delivery],
        now: i64,
        expires_at: i64,
    ) -> BoxFuture<'a, Result<Option<Vec<Claim>>, sqlx::Error>> {
        let _ = (conn, deliveries, now, expires_at);
        Box::pin(async { Ok(None) })
    }

    /// Deletes the inbox row [`claim_all`](Self::claim_all) inserted for
    /// `delivery`, whose handler failed.
    fn unclaim<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let _ = (conn, delivery);
        Box::pin(async { Ok(()) })
    }

    /// Stores the answer in the claimed row.
    fn record<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        delivery: &'a Delivery,
        response: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
}

/// Starts `writers` writer tasks on `runtime` (the pool's).
pub(crate) fn start<W: AsyncInboxStep>(
    step: W,
    runtime: &tokio::runtime::Handle,
    writers: usize,
    parts: crate::receiver::WriterParts<W::Store>,
) {
    let crate::receiver::WriterParts {
        commands,
        handlers,
        retention,
        group_limit,
        alive,
        ..
    } = parts;
    let shared = Arc::new(Shared {
        step,
        commands: Mutex::new(commands),
        handlers,
        retention_ms: retention.as_millis() as i64,
        group_limit: group_limit.max(1),
        finished: std::sync::Mutex::new(Finished {
            stopped: Vec::new(),
            _alive: alive,
        }),
    });
    for _ in 0..writers.max(1) {
        runtime.spawn(write(Arc::clone(&shared)));
    }
}

/// What the writer tasks share.
struct Shared<W: AsyncInboxStep> {
    step: W,
    commands: Mutex<mpsc::Receiver<Command>>,
    handlers: Handlers<dyn AsyncHostedService<W::Store>>,
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
async fn write<W: AsyncInboxStep>(shared: Arc<Shared<W>>) {
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

async fn commit_group<W: AsyncInboxStep>(shared: &Shared<W>, group: Vec<Job>) {
    let started = std::time::Instant::now();
    let count: usize = group.iter().map(|job| job.deliveries.len()).sum();
    let mut tx = match shared.step.begin().await {
        Ok(tx) => tx,
        Err(e) => {
            let reason = format!(
                "cannot begin a transaction: {}",
                crate::store::sqlx_error_text(&e)
            );
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
    let mut lost: Option<String> = None;
    let mut refused_alone = false;
    // Every group claims its messages in one order (source, then id): two
    // groups holding copies of the same messages then wait for each other
    // in turn, never in a cycle that PostgreSQL would end as a deadlock
    // (and answer every message of one group 503).
    let mut order: Vec<(usize, usize)> = group
        .iter()
        .enumerate()
        .flat_map(|(j, job)| (0..job.deliveries.len()).map(move |d| (j, d)))
        .collect();
    order.sort_by(|&(ja, da), &(jb, db)| {
        let (a, b) = (&group[ja].deliveries[da], &group[jb].deliveries[db]);
        (a.envelope.source_service_id.as_str(), a.message_id.as_str())
            .cmp(&(b.envelope.source_service_id.as_str(), b.message_id.as_str()))
    });
    let mut replies: Vec<Vec<Option<Reply>>> = group
        .iter()
        .map(|job| (0..job.deliveries.len()).map(|_| None).collect())
        .collect();
    // Several messages, no two copies of one: claimed in one statement
    // where the store can (PostgreSQL), a round trip less per message.
    let ordered: Vec<&Delivery> = order
        .iter()
        .map(|&(j, d)| &group[j].deliveries[d])
        .collect();
    let distinct = ordered.windows(2).all(|pair| {
        (
            pair[0].envelope.source_service_id.as_str(),
            pair[0].message_id.as_str(),
        ) != (
            pair[1].envelope.source_service_id.as_str(),
            pair[1].message_id.as_str(),
        )
    });
    let mut claims = match count > 1 && distinct {
        true => match shared
            .step
            .claim_all(&mut tx, &ordered, now, expires_at)
            .await
        {
            Ok(claims) => claims.map(Vec::into_iter),
            Err(e) => {
                let cause = crate::store::sqlx_error_text(&e);
                error!(error = %cause, "inbox claim failed; rolling the group back");
                lost = Some(format!("inbox claim failed: {cause}"));
                None
            }
        },
        false => None,
    };
    drop(ordered);
    for (index, (j, d)) in order.into_iter().enumerate() {
        let delivery = &group[j].deliveries[d];
        if let Some(reason) = &lost {
            replies[j][d] = Some(Reply::Refused(ReceiveError::Unavailable(reason.clone())));
            continue;
        }
        let savepoint = match (count, index) {
            (1, _) => Savepoint::None,
            (_, 0) => Savepoint::Open,
            _ => Savepoint::ReleaseAndOpen,
        };
        let claimed = claims.as_mut().and_then(Iterator::next);
        let (answer, state) = process(
            shared, &mut tx, delivery, now, expires_at, savepoint, claimed,
        )
        .await;
        match state {
            State::Intact => {}
            State::RollBack => refused_alone = true,
            State::Compromised => {
                error!("receiver transaction lost mid-group; rolling the group back");
                lost = Some("the write transaction was lost; retry".to_owned());
            }
        }
        replies[j][d] = Some(answer);
    }
    let mut answered: Vec<_> = group
        .into_iter()
        .zip(replies)
        .map(|(job, replies)| {
            let answers: Vec<Reply> = replies
                .into_iter()
                .map(|reply| reply.expect("every delivery of the group was answered"))
                .collect();
            (job.reply, answers)
        })
        .collect();
    let failure = if refused_alone {
        match W::rollback(tx).await {
            Ok(()) => None,
            Err(e) => Some(format!(
                "the database connection was lost: {}",
                crate::store::sqlx_error_text(&e)
            )),
        }
    } else {
        match lost {
            Some(reason) => {
                let _ = W::rollback(tx).await;
                Some(reason)
            }
            None => W::commit(tx).await.err().map(|e| {
                let reason = crate::store::sqlx_error_text(&e);
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

/// One message: claim it (unless `claimed` up front), run the handler,
/// record the answer.
async fn process<W: AsyncInboxStep>(
    shared: &Shared<W>,
    tx: &mut Conn<W>,
    delivery: &Delivery,
    now: i64,
    expires_at: i64,
    savepoint: Savepoint,
    claimed: Option<Claim>,
) -> (Reply, State) {
    let up_front = claimed.is_some();
    let envelope = &delivery.envelope;
    let source = envelope.source_service_id.as_str();
    let unavailable = |what: &str, e: &sqlx::Error| {
        let cause = crate::store::sqlx_error_text(e);
        error!(error = %cause, "{what}");
        Reply::Refused(ReceiveError::Unavailable(format!("{what}: {cause}")))
    };
    let opening = match savepoint {
        Savepoint::None => None,
        Savepoint::Open => Some("SAVEPOINT rf_message"),
        Savepoint::ReleaseAndOpen => Some("RELEASE SAVEPOINT rf_message; SAVEPOINT rf_message"),
    };
    if let Some(sql) = opening
        && let Err(e) = W::batch(tx, sql).await
    {
        return (
            unavailable("cannot open a savepoint", &e),
            State::Compromised,
        );
    }
    let claim = match claimed {
        Some(claim) => Ok(claim),
        None => shared.step.claim(tx, delivery, now, expires_at).await,
    };
    let refusal = match claim {
        Err(e) => return (unavailable("inbox claim failed", &e), State::Compromised),
        Ok(Claim::InProgress) => return (Reply::Refused(ReceiveError::InProgress), State::Intact),
        Ok(Claim::Done(entry)) => {
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
        Ok(Claim::Fresh) => match run_handler(&shared.handlers, delivery, tx).await {
            // The claim stored the answer as NULL, which reads back as
            // `null`: a signal's (or any `null`) answer needs no second
            // write, a round trip less per message on PostgreSQL.
            Ok(serde_json::Value::Null) => {
                return (
                    Reply::Acknowledged {
                        duplicate: false,
                        payload: serde_json::Value::Null,
                    },
                    State::Intact,
                );
            }
            Ok(response) => {
                let text = response.to_string();
                match shared.step.record(tx, delivery, &text).await {
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
    let undone = match W::batch(tx, "ROLLBACK TO SAVEPOINT rf_message").await {
        // A row claimed before the savepoint outlives its rollback.
        Ok(()) if up_front => shared.step.unclaim(tx, delivery).await,
        other => other,
    };
    match undone {
        Ok(()) => (Reply::Refused(refusal), State::Intact),
        Err(e) => {
            error!(error = %crate::store::sqlx_error_text(&e), "cannot roll back a failed message's savepoint");
            (Reply::Refused(refusal), State::Compromised)
        }
    }
}

/// Runs the delivery's async handler on `conn`: its answer payload, or what
/// the sender is told. A panic is caught and answered 500 `handler_failed`.
async fn run_handler<S: AsyncStore>(
    handlers: &Handlers<dyn AsyncHostedService<S>>,
    delivery: &Delivery,
    conn: &mut S::Connection,
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
        handlers.metrics.inbox_fingerprint_mismatches.inc();
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
    let service = &handlers.services[delivery.service].0;
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
