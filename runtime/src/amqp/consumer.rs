//! [`AmqpConsumer`]: an AMQP 1.0 receiver link feeding a [`Receiver`].
//!
//! Every delivery goes through [`Receiver::receive`] (signature, envelope
//! checks, inbox, handler, one transaction, on any store), and what it
//! answered decides, by the dispatcher's own table
//! ([`classify`](crate::dispatcher::classify)), as for
//! [`JetStreamConsumer`](crate::nats::JetStreamConsumer) when both
//! features are on:
//!
//! * processed or duplicate: the answer is sent to the message's
//!   `reply-to` address if it has one (commands, pushcalls), then the
//!   delivery is settled `accepted`, only after `receive` returned, i.e.
//!   after the inbox commit;
//! * retryable (503, 429, 5xx, a handler failure): held for the outbox's
//!   backoff (by delivery count), then settled `modified` with
//!   `delivery-failed` (the broker counts the delivery and delivers it
//!   again); failures counted against `max_retries` on HTTP are rejected
//!   once a message was delivered more than `max_retries + 1` times;
//! * never succeeds (what HTTP answers 400, 404, 413, 422): a row in
//!   `rf_terminated`, a warning and `rf_inbox_terminated_total`, then
//!   `rejected`: the broker moves it to its dead-letter queue (Service Bus
//!   always; RabbitMQ when the queue has a dead-letter exchange).
//!
//! A crash anywhere before the settlement leaves the delivery unsettled:
//! the broker delivers it again when the link goes, and the inbox answers
//! it as a duplicate if its transaction had committed.

use crate::broker::BrokerError;
use crate::transport::UrlError;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::types::definitions::{self, ErrorCondition};
use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message, Modified, Properties};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    ANSWER_ID_PREFIX, AmqpError, AmqpUrl, Settings, Task, body_bytes, http_headers, reconnect_delay,
};
use crate::broker::{Action, Retries, TerminatedRow, TerminatedStore, decide};
use crate::receiver::Receiver;

/// Default number of deliveries processed at once (the link's credit is at
/// most twice this). 256: the receiver's group commits then take up to 256
/// messages per transaction, as a batch over HTTP does (BENCHMARKS.md,
/// "Transports side by side").
pub const DEFAULT_CONCURRENCY: usize = 256;

/// The entry point: `AmqpConsumer::builder(receiver, "amqp://…//queue/orders")
/// .spawn()`.
pub struct AmqpConsumer;

impl AmqpConsumer {
    /// A consumer of the address of `url` (an `amqp[s]://` URL or a Service
    /// Bus connection string) into `receiver`, recording terminated
    /// messages in the receiver's database (table `rf_terminated`).
    pub fn builder(receiver: Receiver, url: &str) -> AmqpConsumerBuilder {
        AmqpConsumerBuilder {
            receiver,
            url: AmqpUrl::parse(url),
            concurrency: DEFAULT_CONCURRENCY,
            settings: Settings::default(),
        }
    }
}

/// Configures an [`AmqpConsumer`].
#[must_use = "call .spawn() to start the consumer"]
pub struct AmqpConsumerBuilder {
    receiver: Receiver,
    url: Result<AmqpUrl, UrlError>,
    concurrency: usize,
    settings: Settings,
}

impl std::fmt::Debug for AmqpConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpConsumerBuilder")
            .field("url", &self.url.as_ref().map(AmqpUrl::shown).ok())
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl AmqpConsumerBuilder {
    /// Deliveries processed at once ([`DEFAULT_CONCURRENCY`]); as many
    /// more may wait in hand (the link credit the broker is given is at
    /// most twice this).
    pub fn concurrency(mut self, messages: usize) -> Self {
        self.concurrency = messages.clamp(1, 10_000);
        self
    }

    /// The delay before a retryable delivery is settled `modified`, for
    /// delivery `n`: `min(base * 2^(n-1), max)` (the outbox's backoff).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_max = max;
        self
    }

    /// Deliveries allowed to fail in a way HTTP counts against a message
    /// before it is rejected (default: the outbox's `max_retries`).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.settings.max_retries = retries;
        self
    }

    /// Bounds connecting and each answer sent (5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Starts the consumer task (on the current tokio runtime). It
    /// connects, attaches a receiver link to the address, and reconnects
    /// after losing the broker, until [`AmqpConsumerHandle::shutdown`].
    ///
    /// # Errors
    ///
    /// [`AmqpError::Config`] for a malformed URL or connection string (field
    /// `amqp url`, the part named, never a credential); [`AmqpError::Db`]
    /// when the database cannot be opened.
    pub fn spawn(self) -> Result<AmqpConsumerHandle, AmqpError> {
        let url = self.url.map_err(|message| AmqpError::Config {
            field: "amqp url",
            message: message.to_string(),
        })?;
        let terminated = crate::broker::open_terminated(self.receiver.database())?;
        let shared = Arc::new(Shared {
            receiver: self.receiver,
            url,
            concurrency: self.concurrency,
            settings: self.settings,
            terminated,
            attempts: Mutex::new(HashMap::new()),
        });
        Ok(AmqpConsumerHandle(Task::spawn(|cancel| {
            run(shared, cancel)
        })))
    }
}

/// The running consumer.
#[derive(Debug)]
pub struct AmqpConsumerHandle(Task);

impl AmqpConsumerHandle {
    /// Stops taking deliveries, finishes those in hand and closes the link.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }

    /// Stops at once, like a crash: deliveries in hand stay unsettled and
    /// the broker delivers them again.
    pub fn abort(self) {
        self.0.abort();
    }
}

struct Shared {
    receiver: Receiver,
    url: AmqpUrl,
    concurrency: usize,
    settings: Settings,
    /// Where terminated messages are recorded.
    terminated: Arc<dyn TerminatedStore>,
    /// Deliveries seen per message id while it is retried here: brokers
    /// that do not count deliveries (RabbitMQ's classic queues) still
    /// reach `max_retries`.
    attempts: Mutex<HashMap<String, u32>>,
}

/// How one delivery is settled.
#[derive(Debug)]
enum Settle {
    Accept,
    /// `modified` with `delivery-failed`: delivered again.
    Retry,
    /// `rejected`: the dead-letter queue.
    Reject(String),
}

/// Answers sent back through the broker: one sender link per `reply-to`
/// address, on the consumer's session.
struct Replies {
    session: fe2o3_amqp::session::SessionHandle<()>,
    senders: HashMap<String, fe2o3_amqp::Sender>,
}

async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut failures = 0u32;
    while !cancel.is_cancelled() {
        let container = format!("rfidl-consumer-{}", uuid::Uuid::now_v7());
        let attempt = async {
            let mut connection = shared
                .url
                .connect(shared.settings.timeout, &container)
                .await
                .map_err(|e| e.to_string())?;
            let mut session = fe2o3_amqp::Session::begin(&mut connection)
                .await
                .map_err(|e| format!("session: {e}"))?;
            let link = fe2o3_amqp::Receiver::builder()
                .name(format!("{container}-in"))
                .source(super::durable_source(shared.url.address()))
                // Granted by `consume`, once the broker used what it had.
                .credit_mode(fe2o3_amqp::link::CreditMode::Manual)
                .auto_accept(false)
                .attach(&mut session)
                .await
                .map_err(|e| format!("cannot attach to `{}`: {e}", shared.url.address()))?;
            let reply_session = fe2o3_amqp::Session::begin(&mut connection)
                .await
                .map_err(|e| format!("session: {e}"))?;
            Ok::<_, BrokerError>((connection, session, link, reply_session))
        };
        let attempt = tokio::time::timeout(shared.settings.timeout * 2, attempt);
        let (mut connection, mut session, link, reply_session) = tokio::select! {
            _ = cancel.cancelled() => break,
            attempt = attempt => match attempt.unwrap_or_else(|_| Err("no answer within the timeout".to_owned().into())) {
                Ok(ready) => ready,
                Err(error) => {
                    failures += 1;
                    tracing::warn!(
                        server = %shared.url.server(),
                        address = shared.url.address(),
                        %error,
                        "AMQP consumer cannot start; retrying"
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
            address = shared.url.address(),
            "AMQP consumer receiving"
        );
        let replies = Arc::new(tokio::sync::Mutex::new(Replies {
            session: reply_session,
            senders: HashMap::new(),
        }));
        let link = consume(&shared, link, replies.clone(), &cancel).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            if let Some(link) = link {
                let _ = link.close().await;
            }
            let mut replies = replies.lock().await;
            for (_, sender) in replies.senders.drain() {
                let _ = sender.close().await;
            }
            let _ = replies.session.end().await;
            let _ = session.end().await;
            let _ = connection.close().await;
        })
        .await;
        if !cancel.is_cancelled() {
            tokio::time::sleep(reconnect_delay(0)).await;
        }
    }
}

/// Takes deliveries until the link ends (the broker went away) or the
/// consumer is stopped; finishes and settles those in hand. Gives the link
/// back when it is still open.
///
/// Credit: the link is always read, deliveries beyond the concurrency wait
/// here, and new credit is granted only once the broker has used all it
/// had (the link's credit is 0 here, so nothing is in flight to us): the
/// flow then means the same to every broker. RabbitMQ 3.x's AMQP 1.0
/// plugin, given fresh credit while it is still sending, sends more than
/// the flow allows, and the link fails with `transfer-limit-exceeded`.
/// At most twice the concurrency is in hand.
///
/// Settlements are sent in groups: those ready at once go out together,
/// consecutive `accepted` ones as one disposition.
async fn consume(
    shared: &Arc<Shared>,
    mut link: fe2o3_amqp::Receiver,
    replies: Arc<tokio::sync::Mutex<Replies>>,
    cancel: &CancellationToken,
) -> Option<fe2o3_amqp::Receiver> {
    let (settled_tx, mut settled_rx) = mpsc::unbounded_channel::<(DeliveryInfo, Settle)>();
    let mut in_flight = JoinSet::new();
    let mut waiting = VecDeque::new();
    let mut open = true;
    // Cut short the backoff of deliveries in hand when the link goes (the
    // broker delivers them again) or the consumer stops.
    let link_cancel = cancel.child_token();
    let timeout = shared.settings.timeout;
    let window = shared.concurrency * 2;
    let start = |delivery: fe2o3_amqp::link::delivery::Delivery<Body<Value>>,
                 in_flight: &mut JoinSet<()>| {
        let shared = shared.clone();
        let replies = replies.clone();
        let settled = settled_tx.clone();
        let cancel = link_cancel.clone();
        in_flight.spawn(async move {
            let (info, message) = delivery.into_parts();
            let settle = handle(&shared, &replies, message, &cancel).await;
            let _ = settled.send((info, settle));
        });
    };
    loop {
        while in_flight.len() < shared.concurrency
            && let Some(delivery) = waiting.pop_front()
        {
            start(delivery, &mut in_flight);
        }
        let held = in_flight.len() + waiting.len();
        if link.credit() == 0 && held <= shared.concurrency {
            let grant = u32::try_from(window - held).unwrap_or(u32::MAX);
            if let Err(error) = link.set_credit(grant).await {
                tracing::warn!(%error, "cannot grant link credit; connecting again");
                open = false;
                break;
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            Some(first) = settled_rx.recv() => {
                let mut ready = vec![first];
                while let Ok(more) = settled_rx.try_recv() {
                    ready.push(more);
                }
                if let Err(error) = settle_all(&link, ready, timeout).await {
                    tracing::warn!(%error, "cannot settle; the broker delivers the message again");
                    open = false;
                    break;
                }
            }
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            delivery = link.recv::<Body<Value>>() => match delivery {
                Ok(delivery) => waiting.push_back(delivery),
                Err(error) => {
                    tracing::warn!(%error, "AMQP receive ended; connecting again");
                    open = false;
                    break;
                }
            }
        }
    }
    if !open {
        link_cancel.cancel();
    }
    // Deliveries not started yet stay unsettled: the broker delivers them
    // again (after the link closes).
    waiting.clear();
    // The deliveries in hand finish (their inbox transactions commit) and
    // are settled while the link is open; a lost link leaves them to the
    // broker.
    while let Some(joined) = in_flight.join_next().await {
        let _ = joined;
        let mut ready = Vec::new();
        while let Ok(more) = settled_rx.try_recv() {
            ready.push(more);
        }
        if open && settle_all(&link, ready, timeout).await.is_err() {
            open = false;
        }
    }
    let mut ready = Vec::new();
    while let Ok(more) = settled_rx.try_recv() {
        ready.push(more);
    }
    if open && settle_all(&link, ready, timeout).await.is_err() {
        open = false;
    }
    open.then_some(link)
}

/// Settles `ready`: the accepted ones with one call (consecutive delivery
/// ids share a disposition), the others one by one; all within `timeout`.
async fn settle_all(
    link: &fe2o3_amqp::Receiver,
    ready: Vec<(DeliveryInfo, Settle)>,
    timeout: Duration,
) -> Result<(), BrokerError> {
    if ready.is_empty() {
        return Ok(());
    }
    let mut accepted = Vec::with_capacity(ready.len());
    let mut others = Vec::new();
    for (info, settle) in ready {
        match settle {
            Settle::Accept => accepted.push(info),
            settle => others.push((info, settle)),
        }
    }
    tokio::time::timeout(timeout, async {
        if !accepted.is_empty() {
            link.accept_all(accepted)
                .await
                .map_err(|e| BrokerError(e.to_string()))?;
        }
        for (info, settle) in others {
            settle_now(link, info, settle).await?;
        }
        Ok(())
    })
    .await
    .map_err(|_| "no settlement within the timeout".to_owned())?
}

async fn settle_now(
    link: &fe2o3_amqp::Receiver,
    info: DeliveryInfo,
    settle: Settle,
) -> Result<(), BrokerError> {
    match settle {
        Settle::Accept => link.accept(info).await,
        Settle::Retry => {
            link.modify(
                info,
                Modified {
                    delivery_failed: Some(true),
                    undeliverable_here: None,
                    message_annotations: None,
                },
            )
            .await
        }
        Settle::Reject(error) => {
            let error = definitions::Error::new(
                ErrorCondition::Custom("rfidl:terminated".into()),
                Some(error),
                None,
            );
            link.reject(info, error).await
        }
    }
    .map_err(|e| BrokerError(e.to_string()))
}

/// Processes one delivery; says how to settle it.
async fn handle(
    shared: &Shared,
    replies: &tokio::sync::Mutex<Replies>,
    message: Message<Body<Value>>,
    cancel: &CancellationToken,
) -> Settle {
    let headers = http_headers(message.application_properties.as_ref());
    let properties = message.properties.clone().unwrap_or_default();
    // The signed id (the receiver checks it equals the envelope's), else
    // the broker's.
    let message_id = headers
        .get(crate::signing::HEADER_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| properties.message_id.as_ref().map(message_id_text));
    let counted = message
        .header
        .as_ref()
        .map_or(0, |header| header.delivery_count);
    let delivered = {
        let mut attempts = shared.attempts.lock().unwrap_or_else(|p| p.into_inner());
        match &message_id {
            Some(id) => {
                let seen = attempts.entry(id.clone()).or_insert(0);
                *seen += 1;
                (*seen).max(counted.saturating_add(1))
            }
            None => counted.saturating_add(1),
        }
    };
    let enqueued = enqueued_at(&message);
    let Some(body) = body_bytes(message.body) else {
        let error = "the message body is not one data section or string".to_owned();
        return terminate(shared, message_id.as_deref(), &error).await;
    };
    // The signature's time is checked against when the broker enqueued
    // the message when it says so (Service Bus' `x-opt-enqueued-time`):
    // a message may rightly wait there longer than the tolerance.
    let answer = match enqueued {
        Some(at) => {
            shared
                .receiver
                .receive_stored_at(&headers, body.clone().into(), at)
                .await
        }
        None => {
            shared
                .receiver
                .receive_stored_at(&headers, body.clone().into(), crate::signing::unix_now())
                .await
        }
    };
    let action = decide(
        &answer,
        delivered,
        Retries {
            backoff: shared.settings.backoff(delivered),
            backoff_max: shared.settings.backoff_max,
            max_retries: shared.settings.max_retries,
        },
    );
    let forget = |shared: &Shared| {
        if let Some(id) = &message_id {
            shared
                .attempts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
        }
    };
    match action {
        Action::Ack { answer } => {
            if let (Some(reply), Some(id)) = (properties.reply_to.as_ref(), &message_id)
                && let Err(error) =
                    send_answer(shared, replies, &address_text(reply), id, answer, &body).await
            {
                tracing::warn!(message_id = %id, %error, "cannot send the answer; delivered again later");
                wait(shared.settings.backoff(delivered), cancel).await;
                return Settle::Retry;
            }
            forget(shared);
            Settle::Accept
        }
        Action::Retry(delay) => {
            wait(delay, cancel).await;
            Settle::Retry
        }
        Action::Term(error) => {
            forget(shared);
            terminate(shared, message_id.as_deref(), &error).await
        }
    }
}

/// Sleeps `delay`, or less when the consumer stops.
async fn wait(delay: Duration, cancel: &CancellationToken) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

/// Records the message in `rf_terminated`, then rejects it (or, when the
/// row cannot be written, has it delivered again).
async fn terminate(shared: &Shared, message_id: Option<&str>, error: &str) -> Settle {
    match record_terminated(shared, message_id, error).await {
        Ok(()) => {
            shared.receiver.metrics().inbox_terminated.inc();
            tracing::warn!(
                message_id = ?message_id,
                address = shared.url.address(),
                %error,
                "message rejected to the dead-letter queue: it will never succeed"
            );
            Settle::Reject(error.to_owned())
        }
        Err(record_error) => {
            tracing::error!(%record_error, "cannot record a terminated message; delivering it again");
            Settle::Retry
        }
    }
}

/// When the broker enqueued the message (Unix seconds), if it says:
/// Service Bus' `x-opt-enqueued-time` message annotation.
fn enqueued_at(message: &Message<Body<Value>>) -> Option<i64> {
    use fe2o3_amqp::types::messaging::annotations::OwnedKey;
    let annotations = message.message_annotations.as_ref()?;
    annotations
        .iter()
        .find_map(|(key, value)| match (key, value) {
            (OwnedKey::Symbol(symbol), Value::Timestamp(at))
                if symbol.as_str() == "x-opt-enqueued-time" =>
            {
                Some(at.milliseconds() / 1000)
            }
            _ => None,
        })
}

fn message_id_text(id: &fe2o3_amqp::types::messaging::MessageId) -> String {
    use fe2o3_amqp::types::messaging::MessageId;
    match id {
        MessageId::String(text) => text.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(uuid) => format!("{uuid:?}"),
        MessageId::Binary(bytes) => hex::encode(bytes.as_ref()),
    }
}

fn address_text(address: &fe2o3_amqp::types::messaging::Address) -> String {
    address.clone()
}

/// Sends `{messageId, status, body}` to `reply` (which must be an answers
/// address of this consumer's address) with `message-id = answer-<id>`,
/// signed, and waits for the broker's `accepted`.
async fn send_answer(
    shared: &Shared,
    replies: &tokio::sync::Mutex<Replies>,
    reply: &str,
    message_id: &str,
    mut answer: serde_json::Value,
    envelope: &[u8],
) -> Result<(), BrokerError> {
    let prefix = format!("{}.answers.", shared.url.address());
    let token = reply.strip_prefix(&prefix).unwrap_or_default();
    if token.is_empty()
        || !token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        // Not ours to write to: the answer is dropped, the message accepted.
        tracing::warn!(%message_id, "`reply-to` is not an answers address of this consumer's address; no answer sent");
        return Ok(());
    }
    answer["messageId"] = serde_json::Value::String(message_id.to_owned());
    let body = serde_json::to_vec(&answer).map_err(|e| e.to_string())?;
    let answer_id = format!("{ANSWER_ID_PREFIX}{message_id}");
    let mut properties = ApplicationProperties::builder();
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Source {
        source_service_id: String,
    }
    // Signed like a message, with the secrets of the peer it goes back to
    // (none when signatures are off for local development).
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
            properties = properties.insert(name, SimpleValue::String(value.to_string()));
        }
    }
    let message = Message::builder()
        .header(fe2o3_amqp::types::messaging::Header {
            durable: true,
            ..Default::default()
        })
        .properties(Properties::builder().message_id(answer_id).build())
        .application_properties(properties.build())
        .data(Binary::from(body))
        .build();
    let timeout = shared.settings.timeout;
    tokio::time::timeout(timeout, async {
        let mut guard = replies.lock().await;
        let replies = &mut *guard;
        if !replies.senders.contains_key(reply) {
            let sender = fe2o3_amqp::Sender::builder()
                .name(format!("rfidl-answers-{}", uuid::Uuid::now_v7()))
                .target(super::durable_target(reply))
                .attach(&mut replies.session)
                .await
                .map_err(|e| format!("cannot attach to the answers address: {e}"))?;
            replies.senders.insert(reply.to_owned(), sender);
        }
        let sender = replies
            .senders
            .get_mut(reply)
            .ok_or_else(|| "no sender".to_owned())?;
        // The transfer goes out under the lock; its disposition is awaited
        // without it, so answers of concurrent deliveries are pipelined.
        let pending = match sender.send_batchable(message).await {
            Ok(pending) => pending,
            Err(error) => {
                replies.senders.remove(reply);
                return Err(format!("send: {error}").into());
            }
        };
        drop(guard);
        let outcome = pending
            .await
            .map_err(|error| format!("no disposition: {error}"))?;
        match outcome {
            fe2o3_amqp::types::messaging::Outcome::Accepted(_) => Ok(()),
            other => Err(format!("the broker did not accept the answer: {other:?}").into()),
        }
    })
    .await
    .map_err(|_| "no disposition within the timeout".to_owned())?
}

/// Writes the `rf_terminated` row (idempotent per message: its "stream
/// sequence" is a hash of the message id).
async fn record_terminated(
    shared: &Shared,
    message_id: Option<&str>,
    error: &str,
) -> Result<(), BrokerError> {
    let now = crate::store::now_ms();
    let address = shared.url.address();
    let row = TerminatedRow {
        stream_sequence: message_id.map_or(now, |id| fnv(id.as_bytes())),
        stream: address.to_owned(),
        message_id: message_id.map(str::to_owned),
        subject: address.to_owned(),
        error: error.to_owned(),
        at: now,
    };
    shared.terminated.record(row).await
}

/// FNV-1a of `bytes`, as a non-negative i64.
fn fnv(bytes: &[u8]) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash >> 1) as i64
}
