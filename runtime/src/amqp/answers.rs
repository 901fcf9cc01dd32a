//! [`AmqpAnswersConsumer`]: the sender's side of answers sent through an
//! AMQP 1.0 broker.
//!
//! A command (or pushcall) sent to an AMQP destination is `Sent` on the
//! broker's `accepted`, before anyone processed it. The receiving
//! [`AmqpConsumer`](super::AmqpConsumer) sends the answer, after its inbox
//! commit, to `<address>.answers.<sender service id>`; this consumer takes
//! it and, in one transaction of the sender's database, stores the
//! response on the outbox row, sets its `answered_at` marker and runs the
//! row's [`ResponseHandler`](crate::responses::ResponseHandler) (an
//! [`AsyncResponseHandler`](crate::responses::AsyncResponseHandler) on a
//! sqlx store), then settles it `accepted`. A redelivered answer finds the
//! marker and is only accepted: the handler runs once. An answer that
//! arrives before the dispatcher recorded the send (the row is not `Sent`
//! yet) is settled `modified` a moment later and comes back.

use crate::broker::BrokerError;
use crate::transport::UrlError;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::types::messaging::{Body, Modified};
use fe2o3_amqp::types::primitives::Value;
use tokio_util::sync::CancellationToken;

use super::{
    AmqpError, AmqpUrl, Settings, Task, answers_address, body_bytes, http_headers, reconnect_delay,
};
use crate::broker::{AnswerStore, Published, Recorded};
use crate::responses::IntoResponder;
use crate::store::{AnyStore, Location, Sqlite};

/// The entry point: `AmqpAnswersConsumer::builder("engine",
/// "amqp://…//queue/orders", "engine.db").responses(router).spawn()`.
pub struct AmqpAnswersConsumer;

impl AmqpAnswersConsumer {
    /// Takes the answers to the messages this service (`service_id`, its
    /// `Config::service_id`) sends to the destination `destination_url`,
    /// for the outbox in `database` (a SQLite file path, or a sqlx store's
    /// `PgStore` / `SqliteStore`).
    pub fn builder<S: AnyStore>(
        service_id: &str,
        destination_url: &str,
        database: impl Location<Store = S>,
    ) -> AmqpAnswersBuilder<S> {
        AmqpAnswersBuilder {
            url: AmqpUrl::parse(destination_url)
                .map(|url| url.with_address(answers_address(url.address(), service_id))),
            database: database.into_database(),
            secrets: Vec::new(),
            issued: None,
            handlers: Vec::new(),
            settings: Settings::default(),
        }
    }

    /// The answers consumer of the configured destination `destination`
    /// (its AMQP URL or connection string and its secret, and
    /// `config.service_id`), for the outbox in `database`.
    ///
    /// # Errors
    ///
    /// [`AmqpError::Config`] when `config.destinations` has no such
    /// destination or its secret is invalid.
    pub fn for_destination<S: AnyStore>(
        config: &crate::Config,
        destination: &str,
        database: impl Location<Store = S>,
    ) -> Result<AmqpAnswersBuilder<S>, AmqpError> {
        let (found, secret) = crate::broker::configured_destination(config, destination)
            .map_err(|(field, message)| AmqpError::Config { field, message })?;
        let mut builder = Self::builder(&config.service_id, &found.url, database);
        // No secret in the config: the registry issues this service's
        // signing keys, and the caller adds them (`issued_keys`).
        if let Some(secret) = secret {
            builder = builder.secret(secret);
        }
        Ok(builder)
    }
}

/// Configures an [`AmqpAnswersConsumer`].
#[must_use = "call .spawn() to start the consumer"]
pub struct AmqpAnswersBuilder<S: AnyStore = Sqlite> {
    url: Result<AmqpUrl, UrlError>,
    database: crate::store::Database,
    secrets: Vec<crate::signing::Secret>,
    issued: Option<crate::keys::IssuedKeys>,
    handlers: Vec<Arc<S::Responder>>,
    settings: Settings,
}

impl<S: AnyStore> std::fmt::Debug for AmqpAnswersBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpAnswersBuilder")
            .field("url", &self.url.as_ref().map(AmqpUrl::shown).ok())
            .finish_non_exhaustive()
    }
}

impl<S: AnyStore> AmqpAnswersBuilder<S> {
    /// Runs `handler` on the answers to messages of its interface version:
    /// a [`ResponseHandler`](crate::responses::ResponseHandler) on a store
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
    /// service, when no [`secret`](Self::secret) is given.
    pub fn issued_keys(mut self, keys: &crate::keys::IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Accepts only answers signed with `secret` (the destination's);
    /// several for a rotation.
    pub fn secret(mut self, secret: crate::signing::Secret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// The backoff of a failed response handler, by delivery count.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_max = max;
        self
    }

    /// Failures of a response handler before its answer is rejected
    /// (recorded in the row's `last_error`).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.settings.max_retries = retries;
        self
    }

    /// Bounds connecting (5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Starts the task (on the current tokio runtime); it reconnects after
    /// losing the broker until [`AmqpAnswersHandle::shutdown`].
    ///
    /// # Errors
    ///
    /// [`AmqpError::Config`] for a malformed URL or connection string,
    /// [`AmqpError::Db`] when the database cannot be opened.
    pub fn spawn(self) -> Result<AmqpAnswersHandle, AmqpError> {
        let url = self.url.map_err(|message| AmqpError::Config {
            field: "amqp url",
            message: message.to_string(),
        })?;
        let store = S::open_answers(&self.database, self.handlers)?;
        let shared = Arc::new(Shared {
            url,
            secrets: self.secrets,
            issued: self.issued,
            settings: self.settings,
            store,
        });
        Ok(AmqpAnswersHandle(Task::spawn(|cancel| run(shared, cancel))))
    }
}

/// The running answers consumer.
#[derive(Debug)]
pub struct AmqpAnswersHandle(Task);

impl AmqpAnswersHandle {
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
    /// The answers address.
    url: AmqpUrl,
    secrets: Vec<crate::signing::Secret>,
    issued: Option<crate::keys::IssuedKeys>,
    settings: Settings,
    store: Arc<dyn AnswerStore>,
}

/// Answers the broker may send before the consumer asks for more (it asks
/// once all were sent: they are taken one at a time).
const ANSWERS_CREDIT: u32 = 100;

/// How an answer is settled.
enum Settle {
    Accept,
    Retry(Duration),
    Reject,
}

async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut failures = 0u32;
    while !cancel.is_cancelled() {
        let container = format!("rfidl-answers-{}", uuid::Uuid::now_v7());
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
                // Granted below, once the broker used what it had (as the
                // message consumer does: RabbitMQ 3.x overruns credit
                // granted while it is still sending).
                .credit_mode(fe2o3_amqp::link::CreditMode::Manual)
                .auto_accept(false)
                .attach(&mut session)
                .await
                .map_err(|e| format!("cannot attach to `{}`: {e}", shared.url.address()))?;
            Ok::<_, BrokerError>((connection, session, link))
        };
        let attempt = tokio::time::timeout(shared.settings.timeout * 2, attempt);
        let (mut connection, mut session, mut link) = tokio::select! {
            _ = cancel.cancelled() => break,
            attempt = attempt => match attempt.unwrap_or_else(|_| Err("no answer within the timeout".to_owned().into())) {
                Ok(ready) => ready,
                Err(error) => {
                    failures += 1;
                    tracing::warn!(server = %shared.url.server(), %error, "AMQP answers consumer cannot start; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(reconnect_delay(failures)) => continue,
                    }
                }
            }
        };
        failures = 0;
        let mut open = true;
        loop {
            if link.credit() == 0
                && let Err(error) = link.set_credit(ANSWERS_CREDIT).await
            {
                tracing::warn!(%error, "cannot grant AMQP answers credit; connecting again");
                open = false;
                break;
            }
            let delivery = tokio::select! {
                _ = cancel.cancelled() => break,
                delivery = link.recv::<Body<Value>>() => delivery,
            };
            let delivery = match delivery {
                Ok(delivery) => delivery,
                Err(error) => {
                    tracing::warn!(%error, "AMQP answers receive ended; connecting again");
                    open = false;
                    break;
                }
            };
            let (info, message) = delivery.into_parts();
            let counted = message.header.as_ref().map_or(0, |h| h.delivery_count);
            let settle = handle(&shared, message, counted + 1).await;
            if let Settle::Retry(delay) = &settle {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(*delay) => {}
                }
            }
            let settled = tokio::time::timeout(shared.settings.timeout, async {
                match settle {
                    Settle::Accept => link.accept(info).await,
                    Settle::Retry(_) => {
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
                    Settle::Reject => link.reject(info, None).await,
                }
            })
            .await;
            if !matches!(settled, Ok(Ok(()))) {
                open = false;
                break;
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            if open {
                let _ = link.close().await;
            }
            let _ = session.end().await;
            let _ = connection.close().await;
        })
        .await;
        if !cancel.is_cancelled() {
            tokio::time::sleep(reconnect_delay(0)).await;
        }
    }
}

async fn handle(
    shared: &Arc<Shared>,
    message: fe2o3_amqp::types::messaging::Message<Body<Value>>,
    delivered: u32,
) -> Settle {
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
        // Keys not issued yet: the answer waits for them rather than
        // being refused as a forgery.
        keys.request_refresh();
        return Settle::Retry(Duration::from_secs(1));
    }
    let headers = http_headers(message.application_properties.as_ref());
    let Some(body) = body_bytes(message.body) else {
        tracing::warn!("answer with a body that is not a data section rejected");
        return Settle::Reject;
    };
    if !secrets.is_empty() {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        // No time window: a late redelivery of a genuine answer is still
        // genuine, and applied once anyway (the marker).
        let verified = crate::signing::verify(
            header(crate::signing::HEADER_ID).as_deref(),
            header(crate::signing::HEADER_TIMESTAMP).as_deref(),
            header(crate::signing::HEADER_SIGNATURE).as_deref(),
            &body,
            secrets,
            crate::signing::unix_now(),
            Duration::from_secs(u64::MAX / 4),
        );
        if let Err(error) = verified {
            tracing::warn!(%error, "answer with a refused signature rejected");
            return Settle::Reject;
        }
    }
    let published: Published = match serde_json::from_slice(&body) {
        Ok(published) => published,
        Err(error) => {
            tracing::warn!(%error, "malformed answer rejected");
            return Settle::Reject;
        }
    };
    let id = published.message_id.clone();
    let recorded = shared.store.record(&published).await;
    let backoff = shared.settings.backoff(delivered);
    match recorded {
        Recorded::Done => Settle::Accept,
        Recorded::NotYet => Settle::Retry(Duration::from_millis(50).max(backoff / 4)),
        Recorded::Failed(error) if delivered > shared.settings.max_retries => {
            tracing::error!(message_id = %id, %error, "response handler failed {delivered} times; answer rejected");
            shared
                .store
                .note_failure(&id, &format!("answer not handled: {error}"))
                .await;
            Settle::Reject
        }
        Recorded::Failed(error) => {
            tracing::warn!(message_id = %id, %error, "response handler failed; the answer comes back");
            Settle::Retry(backoff)
        }
    }
}
