//! [`AnswersConsumer`]: the sender's side of answers sent through JetStream.
//!
//! A command (or pushcall) published to `nats://…/<subject>` is `Sent` on
//! the stream's acknowledgement, before anyone processed it. The receiving
//! [`JetStreamConsumer`](super::JetStreamConsumer) publishes the answer,
//! after its inbox commit, to `<subject>.answers.<sender service id>`; this
//! consumer takes it and, in one transaction of the sender's database
//! (any store: `crate::broker::AnswerStore`), stores the response on the
//! outbox row, sets its `answered_at` marker and runs the row's
//! [`ResponseHandler`](crate::responses::ResponseHandler) (an
//! [`AsyncResponseHandler`](crate::responses::AsyncResponseHandler) on a
//! sqlx store), then commits and acknowledges (double ack). A redelivered answer finds the marker and is
//! only acknowledged: the handler runs once. An answer that arrives before
//! the dispatcher recorded the publish (the row is not `Sent` yet) is
//! negatively acknowledged for a moment.

use crate::broker::BrokerError;
use crate::transport::UrlError;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::{
    NatsError, NatsUrl, PullSettings, Task, answers_subject, ensure_consumer, ensure_stream,
    reconnect_delay, validate_durable,
};
use crate::broker::{AnswerStore, Published, Recorded};
use crate::responses::IntoResponder;
use crate::store::{AnyStore, Location, Sqlite};

/// The entry point: `AnswersConsumer::builder("engine", "nats://…/orders",
/// "engine.db").responses(router).spawn()`.
pub struct AnswersConsumer;

impl AnswersConsumer {
    /// Takes the answers to the messages this service (`service_id`, its
    /// `Config::service_id`) sends to the destination `destination_url`,
    /// for the outbox in `database` (a SQLite file path, or a sqlx store's
    /// `PgStore` / `SqliteStore`). The answer,
    /// its marker and the handler's writes commit in one transaction of that
    /// database (on PostgreSQL the row is locked, so replicas apply an
    /// answer once).
    pub fn builder<S: AnyStore>(
        service_id: &str,
        destination_url: &str,
        database: impl Location<Store = S>,
    ) -> AnswersBuilder<S> {
        AnswersBuilder {
            service_id: service_id.to_owned(),
            url: NatsUrl::parse(destination_url),
            database: database.into_database(),
            durable: None,
            secrets: Vec::new(),
            issued: None,
            handlers: Vec::new(),
            settings: PullSettings::default(),
        }
    }

    /// The answers consumer of the configured destination `destination`
    /// (its `nats://` URL and secret, and `config.service_id`), for the
    /// outbox in `database`.
    ///
    /// # Errors
    ///
    /// [`NatsError::Config`] when `config.destinations` has no such
    /// destination or its secret is invalid.
    pub fn for_destination<S: AnyStore>(
        config: &crate::Config,
        destination: &str,
        database: impl Location<Store = S>,
    ) -> Result<AnswersBuilder<S>, NatsError> {
        let (found, secret) = crate::broker::configured_destination(config, destination)
            .map_err(|(field, message)| NatsError::Config { field, message })?;
        let mut builder = Self::builder(&config.service_id, &found.url, database);
        // No secret in the config: the registry issues this service's
        // signing keys, and the caller adds them (`issued_keys`).
        if let Some(secret) = secret {
            builder = builder.secret(secret);
        }
        builder.url = builder
            .url
            .map(|url| url.with_default_replicas(found.replicas.unwrap_or(1)));
        Ok(builder)
    }
}

/// Configures an [`AnswersConsumer`].
#[must_use = "call .spawn() to start the consumer"]
pub struct AnswersBuilder<S: AnyStore = Sqlite> {
    service_id: String,
    url: Result<NatsUrl, UrlError>,
    database: crate::store::Database,
    durable: Option<String>,
    secrets: Vec<crate::signing::Secret>,
    issued: Option<crate::keys::IssuedKeys>,
    handlers: Vec<Arc<S::Responder>>,
    settings: PullSettings,
}

impl<S: AnyStore> std::fmt::Debug for AnswersBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswersBuilder")
            .field("service_id", &self.service_id)
            .field("url", &self.url.as_ref().map(NatsUrl::shown).ok())
            .finish_non_exhaustive()
    }
}

impl<S: AnyStore> AnswersBuilder<S> {
    /// Runs `handler` on the answers to messages of its interface version
    /// (the same handler as the dispatcher's
    /// [`responses`](crate::dispatcher::DispatcherBuilder::responses)): a
    /// [`ResponseHandler`](crate::responses::ResponseHandler) on a store
    /// with blocking transactions, an
    /// [`AsyncResponseHandler`](crate::responses::AsyncResponseHandler) on
    /// a sqlx store.
    pub fn responses<M>(mut self, handler: impl IntoResponder<S, M>) -> Self {
        self.handlers.push(handler.into_responder().0);
        self
    }

    /// [`responses`](Self::responses) for a handler shared with another
    /// part (the host's dispatcher).
    pub(crate) fn shared_responder(mut self, handler: Arc<S::Responder>) -> Self {
        self.handlers.push(handler);
        self
    }

    /// Accepts answers signed with the keys the registry issued to this
    /// service ([`crate::keys`]), as they are when each answer arrives,
    /// when no [`secret`](Self::secret) is given: the receiving side signs
    /// its answers with the keys it accepts from this service.
    pub fn issued_keys(mut self, keys: &crate::keys::IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Accepts only answers signed with `secret` (the destination's, which
    /// the receiving side signs its answers with); several for a rotation.
    pub fn secret(mut self, secret: crate::signing::Secret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// The durable consumer's name (default `rfidl-answers-<service id>`).
    pub fn durable(mut self, name: impl Into<String>) -> Self {
        self.durable = Some(name.into());
        self
    }

    /// How long the server waits for an acknowledgement (30 s).
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.settings.ack_wait = ack_wait;
        self
    }

    /// The backoff of a failed response handler, by delivery count.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_max = max;
        self
    }

    /// Failures of a response handler before its answer is terminated
    /// (recorded in the row's `last_error`).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.settings.max_retries = retries;
        self
    }

    /// Bounds connecting and each acknowledgement (5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Starts the task (on the current tokio runtime); it reconnects after
    /// losing the broker until [`AnswersHandle::shutdown`].
    ///
    /// # Errors
    ///
    /// [`NatsError::Config`] for a malformed URL or durable name,
    /// [`NatsError::Db`] when the database cannot be opened.
    pub fn spawn(self) -> Result<AnswersHandle, NatsError> {
        let url = self.url.map_err(|message| NatsError::Config {
            field: "nats url",
            message: message.to_string(),
        })?;
        let durable = self.durable.unwrap_or_else(|| {
            let subject = answers_subject("x", &self.service_id);
            format!("rfidl-answers-{}", &subject["x.answers.".len()..])
        });
        validate_durable(&durable).map_err(|message| NatsError::Config {
            field: "durable",
            message: message.to_string(),
        })?;
        let store = S::open_answers(&self.database, self.handlers)?;
        let shared = Arc::new(Shared {
            filter: answers_subject(url.subject(), &self.service_id),
            url,
            durable,
            secrets: self.secrets,
            issued: self.issued,
            settings: self.settings,
            store,
        });
        Ok(AnswersHandle(Task::spawn(|cancel| run(shared, cancel))))
    }
}

/// The running answers consumer.
#[derive(Debug)]
pub struct AnswersHandle(Task);

impl AnswersHandle {
    /// Stops after the answer in hand.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }

    /// Stops at once, like a crash.
    pub fn abort(self) {
        self.0.abort();
    }
}

struct Shared {
    url: NatsUrl,
    filter: String,
    durable: String,
    secrets: Vec<crate::signing::Secret>,
    /// Issued signing keys, when no secret is configured.
    issued: Option<crate::keys::IssuedKeys>,
    settings: PullSettings,
    store: Arc<dyn AnswerStore>,
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
                &shared.filter,
                shared.settings.ack_wait,
                1_000,
            )
            .await?;
            consumer
                .stream()
                .heartbeat(Duration::from_secs(1))
                .expires(Duration::from_secs(5))
                .messages()
                .await
                .map_err(|e| BrokerError(format!("pull: {e}")))
        };
        let mut messages = tokio::select! {
            _ = cancel.cancelled() => break,
            attempt = attempt => match attempt {
                Ok(messages) => messages,
                Err(error) => {
                    failures += 1;
                    tracing::warn!(server = %shared.url.server(), %error, "JetStream answers consumer cannot start; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(reconnect_delay(failures)) => continue,
                    }
                }
            }
        };
        failures = 0;
        loop {
            let item = tokio::select! {
                _ = cancel.cancelled() => break,
                item = messages.next() => item,
            };
            match item {
                Some(Ok(message)) => handle(&shared, message).await,
                Some(Err(error)) => {
                    use jetstream::consumer::pull::MessagesErrorKind as Kind;
                    if !matches!(
                        error.kind(),
                        Kind::MissingHeartbeat | Kind::Other | Kind::Pull
                    ) {
                        tracing::warn!(%error, "JetStream answers pull ended; starting again");
                        break;
                    }
                }
                None => break,
            }
        }
        if !cancel.is_cancelled() {
            tokio::time::sleep(reconnect_delay(0)).await;
        }
    }
}

async fn handle(shared: &Arc<Shared>, message: jetstream::Message) {
    let delivered = message
        .info()
        .map(|info| info.delivered.max(1) as u32)
        .unwrap_or(1);
    let issued;
    let secrets: &[crate::signing::Secret] = match &shared.issued {
        Some(keys) if shared.secrets.is_empty() => {
            issued = keys.snapshot();
            &issued.signing
        }
        _ => &shared.secrets,
    };
    if secrets.is_empty()
        && let Some(keys) = &shared.issued
    {
        // Keys not issued yet (a restart before the registration): the
        // answer waits for them rather than being refused as a forgery.
        keys.request_refresh();
        let _ = message
            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
            .await;
        return;
    }
    if !secrets.is_empty() {
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        // No time window: a late redelivery of a genuine answer is still
        // genuine, and applied once anyway (the marker).
        let verified = crate::signing::verify(
            header(crate::signing::HEADER_ID).as_deref(),
            header(crate::signing::HEADER_TIMESTAMP).as_deref(),
            header(crate::signing::HEADER_SIGNATURE).as_deref(),
            &message.payload,
            secrets,
            crate::signing::unix_now(),
            Duration::from_secs(u64::MAX / 4),
        );
        if let Err(error) = verified {
            tracing::warn!(subject = %message.subject, %error, "answer with a refused signature terminated");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    }
    let published: Published = match serde_json::from_slice(&message.payload) {
        Ok(published) => published,
        Err(error) => {
            tracing::warn!(%error, subject = %message.subject, "malformed answer terminated");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    let id = published.message_id.clone();
    let recorded = shared.store.record(&published).await;
    let backoff = crate::dispatcher::backoff(
        delivered.saturating_sub(1),
        shared.settings.backoff_base,
        shared.settings.backoff_max,
        Duration::ZERO,
    );
    match recorded {
        Recorded::Done => {
            let acked = tokio::time::timeout(shared.settings.timeout, message.double_ack()).await;
            if !matches!(acked, Ok(Ok(()))) {
                tracing::debug!(message_id = %id, "answer ack not confirmed; a redelivery is a no-op");
            }
        }
        Recorded::NotYet => {
            let _ = message
                .ack_with(AckKind::Nak(Some(
                    Duration::from_millis(50).max(backoff / 4),
                )))
                .await;
        }
        Recorded::Failed(error) if delivered > shared.settings.max_retries => {
            tracing::error!(message_id = %id, %error, "response handler failed {delivered} times; answer terminated");
            shared
                .store
                .note_failure(&id, &format!("answer not handled: {error}"))
                .await;
            let _ = message.ack_with(AckKind::Term).await;
        }
        Recorded::Failed(error) => {
            tracing::warn!(message_id = %id, %error, "response handler failed; the answer is redelivered");
            let _ = message.ack_with(AckKind::Nak(Some(backoff))).await;
        }
    }
}
