//! [`JetStreamConsumer`]: a durable pull consumer feeding a [`Receiver`].
//!
//! Every message goes through [`Receiver::receive`] (signature, envelope
//! checks, inbox, handler, one transaction, on any store: the receiver's
//! writer, blocking or async), and what it answered decides, by the
//! dispatcher's own table ([`classify`](crate::dispatcher::classify)):
//!
//! * processed or duplicate: the answer is published to the message's
//!   `rf-reply-to` subject if it has one (commands, pushcalls), then the
//!   message is acknowledged with a double ack (`+ACK` confirmed by the
//!   server), only after `receive` returned, i.e. after the inbox commit;
//! * retryable (503, 429, 5xx, a handler failure): `-NAK` with the
//!   runtime's backoff, by delivery count; failures counted against
//!   `max_retries` on HTTP (handler failures, refused signatures) are
//!   terminated once a message was delivered more than `max_retries + 1`
//!   times;
//! * never succeeds (what HTTP answers 400, 404, 413, 422): `+TERM`,
//!   after a row in `rf_terminated`, a warning and
//!   `rf_inbox_terminated_total`.
//!
//! A crash anywhere before the ack leaves the message unacknowledged: it is
//! redelivered after `ack_wait`, and the inbox answers it as a duplicate if
//! its transaction had committed. Several consumers (replicas, each with
//! its receiver on the shared database) may pull from one durable consumer.

use crate::broker::BrokerError;
use crate::transport::UrlError;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures_util::{FutureExt as _, StreamExt as _};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    ANSWER_ID_PREFIX, NatsError, NatsUrl, PullSettings, REPLY_TO_HEADER, Task, ensure_consumer,
    ensure_stream, http_headers, reconnect_delay, validate_durable,
};
use crate::broker::{Action, Retries, TerminatedRow, TerminatedStore, decide};
use crate::dispatcher::backoff;
use crate::receiver::{Receiver, Reply, Stored};

/// Default durable consumer name.
pub const DEFAULT_DURABLE: &str = "rfidl-receiver";
/// Default `ack_wait`: how long the server waits for an ack before
/// redelivering.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// Default number of messages processed at once (and the consumer's
/// `max_ack_pending` is four times this). 256: the receiver's group
/// commits then take up to 256 messages per transaction, as a batch over
/// HTTP does (BENCHMARKS.md, "Transports side by side").
pub const DEFAULT_CONCURRENCY: usize = 256;

/// The entry point: `JetStreamConsumer::builder(receiver, "nats://…/orders")
/// .durable("orders").spawn()`.
pub struct JetStreamConsumer;

impl JetStreamConsumer {
    /// A consumer of the stream of `nats_url` into `receiver`, recording
    /// terminated messages in the receiver's database (table
    /// `rf_terminated`).
    pub fn builder(receiver: Receiver, nats_url: &str) -> ConsumerBuilder {
        let database = receiver.database().clone();
        ConsumerBuilder {
            receiver,
            url: NatsUrl::parse(nats_url),
            db: database,
            durable: DEFAULT_DURABLE.to_owned(),
            concurrency: DEFAULT_CONCURRENCY,
            settings: PullSettings::default(),
        }
    }
}

/// Configures a [`JetStreamConsumer`].
#[must_use = "call .spawn() to start the consumer"]
pub struct ConsumerBuilder {
    receiver: Receiver,
    url: Result<NatsUrl, UrlError>,
    db: crate::Database,
    durable: String,
    concurrency: usize,
    settings: PullSettings,
}

impl std::fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("url", &self.url.as_ref().map(NatsUrl::shown).ok())
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl ConsumerBuilder {
    /// The durable consumer's name ([`DEFAULT_DURABLE`]): replicas of one
    /// service use the same name and share its messages.
    pub fn durable(mut self, name: impl Into<String>) -> Self {
        self.durable = name.into();
        self
    }

    /// How long the server waits for an acknowledgement before it
    /// redelivers ([`DEFAULT_ACK_WAIT`]). Longer than the slowest handler.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.settings.ack_wait = ack_wait;
        self
    }

    /// Messages processed at once ([`DEFAULT_CONCURRENCY`]); the receiver
    /// commits them in groups.
    pub fn concurrency(mut self, messages: usize) -> Self {
        self.concurrency = messages.max(1);
        self
    }

    /// The delay of a negative acknowledgement for delivery `n`:
    /// `min(base * 2^(n-1), max)` (the outbox's backoff; defaults from
    /// [`OutboxConfig`](crate::config::OutboxConfig)).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_max = max;
        self
    }

    /// Deliveries allowed to fail in a way HTTP counts against a message
    /// (handler failures, refused signatures) before it is terminated
    /// (default: the outbox's `max_retries`).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.settings.max_retries = retries;
        self
    }

    /// Bounds connecting and each publish of an answer (5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Starts the consumer task (on the current tokio runtime). It
    /// connects, creates the stream and the durable consumer if missing,
    /// and reconnects after losing the broker, until
    /// [`ConsumerHandle::shutdown`].
    ///
    /// # Errors
    ///
    /// [`NatsError::Config`] for a malformed URL (field `nats url`, never
    /// showing credentials) or durable name; [`NatsError::Db`] when the
    /// database cannot be opened.
    pub fn spawn(self) -> Result<ConsumerHandle, NatsError> {
        let url = self.url.map_err(|message| NatsError::Config {
            field: "nats url",
            message: message.to_string(),
        })?;
        validate_durable(&self.durable).map_err(|message| NatsError::Config {
            field: "durable",
            message: message.to_string(),
        })?;
        let terminated = crate::broker::open_terminated(&self.db)?;
        let shared = Arc::new(Shared {
            receiver: self.receiver,
            url,
            durable: self.durable,
            concurrency: self.concurrency,
            settings: self.settings,
            terminated,
        });
        Ok(ConsumerHandle(Task::spawn(|cancel| run(shared, cancel))))
    }
}

/// The running consumer.
#[derive(Debug)]
pub struct ConsumerHandle(Task);

impl ConsumerHandle {
    /// Stops pulling, finishes (and acknowledges) the messages in hand.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }

    /// Stops at once, like a crash: messages in hand stay unacknowledged
    /// and are redelivered after `ack_wait`.
    pub fn abort(self) {
        self.0.abort();
    }
}

struct Shared {
    receiver: Receiver,
    url: NatsUrl,
    durable: String,
    concurrency: usize,
    settings: PullSettings,
    /// Where terminated messages are recorded.
    terminated: Arc<dyn TerminatedStore>,
}

async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut failures = 0u32;
    let mut client = None;
    while !cancel.is_cancelled() {
        let attempt = async {
            let nats = match &client {
                Some(nats) => Clone::clone(nats),
                None => {
                    let nats = shared
                        .url
                        .connect(shared.settings.timeout)
                        .await
                        .map_err(|e| BrokerError(e.to_string()))?;
                    client = Some(nats.clone());
                    nats
                }
            };
            let mut context = jetstream::new(nats);
            context.set_timeout(shared.settings.timeout);
            let stream = ensure_stream(&context, &shared.url).await?;
            let consumer = ensure_consumer(
                &stream,
                &shared.durable,
                shared.url.subject(),
                shared.settings.ack_wait,
                (shared.concurrency * 4) as i64,
            )
            .await?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(shared.concurrency)
                .heartbeat(Duration::from_secs(1))
                .expires(Duration::from_secs(5))
                .messages()
                .await
                .map_err(|e| BrokerError(format!("pull: {e}")))?;
            Ok::<_, BrokerError>((context, messages))
        };
        let (context, messages) = tokio::select! {
            _ = cancel.cancelled() => break,
            attempt = attempt => match attempt {
                Ok(ready) => ready,
                Err(error) => {
                    failures += 1;
                    tracing::warn!(
                        server = %shared.url.server(),
                        subject = shared.url.subject(),
                        %error,
                        "JetStream consumer cannot start; retrying"
                    );
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(reconnect_delay(failures)) => continue,
                    }
                }
            }
        };
        failures = 0;
        tracing::info!(
            server = %shared.url.server(),
            subject = shared.url.subject(),
            durable = %shared.durable,
            "JetStream consumer pulling"
        );
        pull(&shared, &context, messages, &cancel).await;
    }
}

/// Takes messages until the pull ends (the broker went away, the consumer
/// was deleted) or the consumer is stopped; finishes those in hand.
async fn pull(
    shared: &Arc<Shared>,
    context: &jetstream::Context,
    mut messages: jetstream::consumer::pull::Stream,
    cancel: &CancellationToken,
) {
    // A message holds a slot while the receiver processes it; its
    // acknowledgement (a round trip, replicated on an R3 stream) runs
    // after the slot is given back, so the slots keep the receiver's group
    // commits full. The server's `max_ack_pending` bounds the messages in
    // hand, acknowledgements included.
    let slots = Arc::new(tokio::sync::Semaphore::new(shared.concurrency));
    let mut slot = None;
    let mut in_flight = JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            acquired = slots.clone().acquire_owned(), if slot.is_none() => slot = acquired.ok(),
            item = messages.next(), if slot.is_some() => {
                // The first message and every one already here, while
                // slots are free, go to the receiver together: one call,
                // one job for its writer (as an HTTP batch), one task.
                let Some(mut slots_held) = slot.take() else { continue };
                let mut batch = Vec::new();
                let mut item = item;
                let ended = loop {
                    match item {
                        Some(Ok(message)) => batch.push(message),
                        Some(Err(error)) => break pull_failed(&error),
                        None => break true,
                    }
                    let Ok(more) = slots.clone().try_acquire_owned() else { break false };
                    match messages.next().now_or_never() {
                        Some(next) => {
                            slots_held.merge(more);
                            item = next;
                        }
                        None => break false,
                    }
                };
                if !batch.is_empty() {
                    let shared = shared.clone();
                    let context = context.clone();
                    in_flight.spawn(async move {
                        handle(&shared, &context, batch, slots_held).await
                    });
                }
                if ended {
                    break;
                }
            }
        }
    }
    while in_flight.join_next().await.is_some() {}
    if !cancel.is_cancelled() {
        tokio::time::sleep(reconnect_delay(0)).await;
    }
}

/// Whether a pull error ends the pull (else it goes on).
fn pull_failed(error: &jetstream::consumer::pull::MessagesError) -> bool {
    use jetstream::consumer::pull::MessagesErrorKind as Kind;
    match error.kind() {
        Kind::MissingHeartbeat | Kind::Other | Kind::Pull => {
            tracing::debug!(%error, "JetStream pull interrupted; going on");
            false
        }
        _ => {
            tracing::warn!(%error, "JetStream pull ended; starting again");
            true
        }
    }
}

/// A delivery in hand and what the consumer read from it.
struct InHand {
    message: jetstream::Message,
    stream: String,
    sequence: u64,
    delivered: u32,
    /// The signed id (the receiver checks it equals the envelope's), else
    /// the broker's.
    message_id: Option<String>,
    /// Where its answer goes (commands, pushcalls).
    reply_to: Option<String>,
}

impl InHand {
    /// The delivery, and what the receiver takes of it.
    fn read(shared: &Shared, message: jetstream::Message) -> (InHand, Stored) {
        let (stream, sequence, delivered, stored_at) = match message.info() {
            Ok(info) => (
                info.stream.to_owned(),
                info.stream_sequence,
                info.delivered.max(1) as u32,
                info.published.unix_timestamp(),
            ),
            Err(_) => (shared.url.stream_name(), 0, 1, crate::signing::unix_now()),
        };
        let headers = http_headers(message.headers.as_ref());
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let message_id = header(crate::signing::HEADER_ID)
            .or_else(|| header(async_nats::header::NATS_MESSAGE_ID.as_ref()));
        let reply_to = header(REPLY_TO_HEADER);
        // The signature's time is checked against when the stream stored
        // the message: it may wait there longer than the tolerance.
        let stored = Stored {
            headers,
            body: message.payload.clone(),
            stored_at,
        };
        let held = InHand {
            message,
            stream,
            sequence,
            delivered,
            message_id,
            reply_to,
        };
        (held, stored)
    }
}

/// Processes a batch of deliveries in one receiver call and acknowledges
/// each as its answer says; gives the batch's `slots` back once the
/// receiver answered (before the acknowledgements).
async fn handle(
    shared: &Shared,
    context: &jetstream::Context,
    batch: Vec<jetstream::Message>,
    slots: tokio::sync::OwnedSemaphorePermit,
) {
    let (held, stored): (Vec<InHand>, Vec<Stored>) = batch
        .into_iter()
        .map(|message| InHand::read(shared, message))
        .unzip();
    // A slow handler keeps its messages: "in progress" every half
    // `ack_wait` (the server then waits another `ack_wait`), so they are
    // not redelivered while this copy runs. A crash stops these, and the
    // messages come back after `ack_wait`.
    let receive = shared.receiver.receive_many_stored_at(stored);
    tokio::pin!(receive);
    let mut progress = tokio::time::interval_at(
        tokio::time::Instant::now() + shared.settings.ack_wait / 2,
        (shared.settings.ack_wait / 2).max(Duration::from_millis(10)),
    );
    let answers = loop {
        tokio::select! {
            answers = &mut receive => break answers,
            _ = progress.tick() => {
                for held in &held {
                    let _ = held.message.ack_with(AckKind::Progress).await;
                }
            }
        }
    };
    drop(slots);
    let settled = held
        .into_iter()
        .zip(answers)
        .map(|(held, answer)| settle(shared, context, held, answer));
    futures_util::future::join_all(settled).await;
}

/// Acknowledges one delivery as the receiver's `answer` says.
async fn settle(shared: &Shared, context: &jetstream::Context, held: InHand, answer: Reply) {
    let message = &held.message;
    let (delivered, message_id) = (held.delivered, &held.message_id);
    let action = decide(
        &answer,
        delivered,
        Retries {
            backoff: backoff_of(shared, delivered),
            backoff_max: shared.settings.backoff_max,
            max_retries: shared.settings.max_retries,
        },
    );
    match action {
        Action::Ack { answer } => {
            if let (Some(reply), Some(id)) = (&held.reply_to, message_id)
                && let Err(error) =
                    publish_answer(shared, context, reply, id, answer, &message.payload).await
            {
                tracing::warn!(message_id = %id, %error, "cannot publish the answer; redelivered later");
                nak(message, backoff_of(shared, delivered)).await;
                return;
            }
            if let Err(error) = double_ack(message, shared.settings.timeout).await {
                // Redelivered after ack_wait; the inbox answers it as a
                // duplicate.
                tracing::warn!(message_id = ?message_id, %error, "ack not confirmed; the message may be redelivered");
            }
        }
        Action::Retry(delay) => nak(message, delay).await,
        Action::Term(error) => {
            let subject = message.subject.to_string();
            let recorded = record_terminated(
                shared,
                &held.stream,
                held.sequence,
                message_id.as_deref(),
                &subject,
                &error,
            )
            .await;
            match recorded {
                Ok(()) => {
                    shared.receiver.metrics().inbox_terminated.inc();
                    tracing::warn!(
                        message_id = ?message_id,
                        stream = %held.stream,
                        sequence = held.sequence,
                        %error,
                        "message terminated: it will never succeed and is not redelivered"
                    );
                    if let Err(error) = message.ack_with(AckKind::Term).await {
                        tracing::warn!(%error, "cannot terminate; redelivered and terminated again");
                    }
                }
                Err(record_error) => {
                    tracing::error!(%record_error, "cannot record a terminated message; redelivering it");
                    nak(message, backoff_of(shared, delivered)).await;
                }
            }
        }
    }
}

/// `+ACK`, and the server's confirmation that it took it (a double ack),
/// within `timeout`. The request goes through the client's one shared
/// reply subscription: `Message::double_ack` subscribes and unsubscribes
/// an inbox of its own for every acknowledgement, two more protocol
/// operations per message for the client and the server.
async fn double_ack(message: &jetstream::Message, timeout: Duration) -> Result<(), String> {
    let Some(reply) = message.reply.clone() else {
        return Err("no reply subject: not a JetStream message".to_owned());
    };
    let request = async_nats::Request::new()
        .payload(AckKind::Ack.into())
        .timeout(Some(timeout));
    message
        .context
        .client()
        .send_request(reply, request)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

async fn nak(message: &jetstream::Message, delay: Duration) {
    if let Err(error) = message.ack_with(AckKind::Nak(Some(delay))).await {
        tracing::debug!(%error, "nak not sent; redelivered after ack_wait");
    }
}

fn backoff_of(shared: &Shared, delivered: u32) -> Duration {
    backoff(
        delivered.saturating_sub(1),
        shared.settings.backoff_base,
        shared.settings.backoff_max,
        Duration::ZERO,
    )
}

/// Publishes `{messageId, status, body}` to `reply` (which must be an
/// answers subject of this stream) with `Nats-Msg-Id = answer-<id>`, and
/// waits for the stream's acknowledgement.
async fn publish_answer(
    shared: &Shared,
    context: &jetstream::Context,
    reply: &str,
    message_id: &str,
    mut answer: serde_json::Value,
    envelope: &[u8],
) -> Result<(), BrokerError> {
    let prefix = format!("{}.answers.", shared.url.subject());
    if !reply.starts_with(&prefix) || super::url::validate_subject(reply).is_err() {
        // Not ours to write to: the answer is dropped, the message acked.
        tracing::warn!(%message_id, "`rf-reply-to` is not an answers subject of this stream; no answer sent");
        return Ok(());
    }
    answer["messageId"] = serde_json::Value::String(message_id.to_owned());
    let body = serde_json::to_vec(&answer).map_err(|e| e.to_string())?;
    let answer_id = format!("{ANSWER_ID_PREFIX}{message_id}");
    let mut headers = async_nats::HeaderMap::new();
    // Signed like a message, with the secrets of the peer it goes back to
    // (none when signatures are off for local development).
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Source {
        source_service_id: String,
    }
    if let Some(secrets) = serde_json::from_slice::<Source>(envelope)
        .ok()
        .and_then(|source| shared.receiver.peer_secrets(&source.source_service_id))
    {
        let signature = crate::signing::SignatureHeaders::sign(
            &answer_id,
            crate::signing::unix_now(),
            &body,
            &secrets,
        );
        for (name, value) in signature.to_pairs() {
            headers.insert(name, value);
        }
    }
    headers.insert(async_nats::header::NATS_MESSAGE_ID, answer_id);
    let published = tokio::time::timeout(shared.settings.timeout, async {
        context
            .publish_with_headers(reply.to_owned(), headers, body.into())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| "no acknowledgement within the timeout".to_owned())??;
    let _ = published;
    Ok(())
}

/// Writes the `rf_terminated` row (idempotent per stream sequence).
async fn record_terminated(
    shared: &Shared,
    stream: &str,
    sequence: u64,
    message_id: Option<&str>,
    subject: &str,
    error: &str,
) -> Result<(), BrokerError> {
    let row = TerminatedRow {
        stream_sequence: sequence as i64,
        stream: stream.to_owned(),
        message_id: message_id.map(str::to_owned),
        subject: subject.to_owned(),
        error: error.to_owned(),
        at: crate::store::now_ms(),
    };
    shared.terminated.record(row).await
}
