//! AMQP 1.0 (cargo feature `amqp`): rfidl's outbox and inbox on top of an
//! AMQP 1.0 broker (RabbitMQ with its AMQP 1.0 plugin, Azure Service Bus,
//! ActiveMQ, Qpid). `docs/transports.md` is the user's guide.
//!
//! * Sending: a destination whose URL is `amqp://…/<address>`,
//!   `amqps://…/<address>` or an Azure Service Bus connection string is
//!   sent to by [`AmqpTransport`](crate::transport::AmqpTransport) (chosen by
//!   the dispatcher from the URL): one message per rfidl message, the
//!   signed envelope as its body, the signing headers as application
//!   properties, `message-id` = the rfidl message id.
//! * Receiving: [`AmqpConsumer`] takes deliveries from the address into
//!   [`Receiver::receive`](crate::receiver::Receiver::receive) and settles
//!   each only after the inbox commit (`accepted`), or `modified` after the
//!   outbox backoff (retryable), or `rejected` (the broker's dead-letter
//!   queue) for a message that never succeeds.
//! * Answers of commands and pushcalls: the consumer sends them to the
//!   message's `reply-to` address (`<address>.answers.<sender service id>`,
//!   set by the sender's transport); the sender's [`AmqpAnswersConsumer`]
//!   records each once and runs its response handler.

pub(crate) mod answers;
pub(crate) mod consumer;
mod url;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use answers::{AmqpAnswersBuilder, AmqpAnswersConsumer, AmqpAnswersHandle};
pub use consumer::{AmqpConsumer, AmqpConsumerBuilder, AmqpConsumerHandle, DEFAULT_CONCURRENCY};
pub use url::{AmqpUrl, DEFAULT_PORT, DEFAULT_TLS_PORT};

/// `message-id` of an answer: this prefix and the message id.
pub const ANSWER_ID_PREFIX: &str = "answer-";

/// Why an AMQP consumer could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// A setting is malformed; `field` names it, the message never holds
    /// a credential.
    #[error("{field}: {message}")]
    Config {
        /// The setting, e.g. `amqp url`, `destination`, `secret`.
        field: &'static str,
        /// What is wrong with it (the part of a URL or connection string
        /// named, never a credential).
        message: String,
    },
    /// The database (terminated messages, answers) cannot be opened.
    #[error(transparent)]
    Db(#[from] crate::store::StoreError),
}

/// The address of the answers to `sender`'s messages sent to `address`:
/// `<address>.answers.<sender>` (the sender's id with anything but ASCII
/// letters, digits, `-` and `_` as `_`). On RabbitMQ 3.x with `/queue/NAME`
/// addresses the queue is declared on first use; on Service Bus it is a
/// queue to create beside the destination's.
pub fn answers_address(address: &str, sender: &str) -> String {
    let token: String = sender
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let token = if token.is_empty() { "_".into() } else { token };
    format!("{address}.answers.{token}")
}

/// The target of a sender link to `address`, asking for a durable
/// terminus: RabbitMQ 3.x declares a `/queue/NAME` queue durable then (its
/// messages, sent durable, survive a broker restart); Service Bus entities
/// are durable anyway.
pub(crate) fn durable_target(address: &str) -> fe2o3_amqp::types::messaging::Target {
    fe2o3_amqp::types::messaging::Target::builder()
        .address(address.to_owned())
        .durable(fe2o3_amqp::types::messaging::TerminusDurability::Configuration)
        .build()
}

/// The source of a receiver link from `address`, durable as
/// [`durable_target`].
pub(crate) fn durable_source(address: &str) -> fe2o3_amqp::types::messaging::Source {
    fe2o3_amqp::types::messaging::Source::builder()
        .address(address.to_owned())
        .durable(fe2o3_amqp::types::messaging::TerminusDurability::Configuration)
        .build()
}

/// How long to wait before connecting again after `failures` failures in a
/// row: 100 ms doubling to 5 s.
pub(crate) fn reconnect_delay(failures: u32) -> Duration {
    Duration::from_millis((100u64 << failures.min(6)).min(5_000))
}

/// The settings [`AmqpConsumerBuilder`] and [`AmqpAnswersBuilder`] share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// The backoff of a retryable answer, by delivery count.
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    /// Failed deliveries before a message is rejected.
    pub(crate) max_retries: u32,
    /// Bounds connecting, sending and each settlement.
    pub(crate) timeout: Duration,
}

impl Default for Settings {
    /// The outbox's backoff and `max_retries`, 5 s.
    fn default() -> Self {
        let outbox = crate::config::OutboxConfig::default();
        Self {
            backoff_base: outbox.backoff_base,
            backoff_max: outbox.backoff_max,
            max_retries: outbox.max_retries,
            timeout: Duration::from_secs(5),
        }
    }
}

impl Settings {
    /// The outbox's backoff for delivery `delivered` (1 for the first).
    pub(crate) fn backoff(&self, delivered: u32) -> Duration {
        crate::dispatcher::backoff(
            delivered.saturating_sub(1),
            self.backoff_base,
            self.backoff_max,
            Duration::ZERO,
        )
    }
}

/// A consumer's task and the token that stops it.
#[derive(Debug)]
pub(crate) struct Task {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Task {
    /// Spawns `run(cancel)` on the current tokio runtime.
    pub(crate) fn spawn<F>(run: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(cancel.clone()));
        Self { cancel, task }
    }

    /// Cancels the task and waits for it to finish.
    pub(crate) async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }

    /// Stops the task at once.
    pub(crate) fn abort(self) {
        self.task.abort();
    }
}

/// A received message's application properties as HTTP headers (string
/// values whose names are valid header names).
pub(crate) fn http_headers(
    properties: Option<&fe2o3_amqp::types::messaging::ApplicationProperties>,
) -> axum::http::HeaderMap {
    use fe2o3_amqp::types::primitives::SimpleValue;
    let mut out = axum::http::HeaderMap::new();
    let Some(properties) = properties else {
        return out;
    };
    for (name, value) in properties.iter() {
        let SimpleValue::String(value) = value else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        out.append(name, value);
    }
    out
}

/// The bytes of a message body: its data sections, or a string or binary
/// value; `None` for anything else.
pub(crate) fn body_bytes(
    body: fe2o3_amqp::types::messaging::Body<fe2o3_amqp::types::primitives::Value>,
) -> Option<Vec<u8>> {
    use fe2o3_amqp::types::messaging::Body;
    use fe2o3_amqp::types::primitives::Value;
    match body {
        Body::Data(batch) => {
            let mut out = Vec::new();
            for data in batch.iter() {
                out.extend_from_slice(data.0.as_ref());
            }
            Some(out)
        }
        Body::Value(value) => match value.0 {
            Value::String(text) => Some(text.into_bytes()),
            Value::Binary(bytes) => Some(bytes.into_vec()),
            _ => None,
        },
        _ => None,
    }
}
