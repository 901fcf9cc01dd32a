//! NATS JetStream (cargo feature `nats`): rfidl's outbox and inbox on top of
//! a broker. `docs/transports.md` is the user's guide.
//!
//! * Sending: a destination whose URL is `nats://…/<subject>` is published
//!   to by [`JetStreamTransport`](crate::transport::JetStreamTransport)
//!   (chosen by the dispatcher from the URL).
//! * Receiving: [`JetStreamConsumer`] pulls from a durable consumer on the
//!   stream into [`Receiver::receive`](crate::receiver::Receiver::receive)
//!   and acknowledges (double ack) only after the inbox commit.
//! * Answers of commands and pushcalls: the consumer publishes them to the
//!   subject in the message's [`REPLY_TO_HEADER`]; the sender's
//!   [`AnswersConsumer`] records each once and runs its response handler.
//!
//! Streams and consumers are created when missing, with the settings
//! below (file storage, a [`DUPLICATE_WINDOW`] of deduplication by
//! `Nats-Msg-Id`).

pub(crate) mod answers;
pub(crate) mod consumer;
mod url;

use crate::broker::BrokerError;
use std::time::Duration;

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;

pub use answers::{AnswersBuilder, AnswersConsumer, AnswersHandle};
pub use consumer::{
    ConsumerBuilder, ConsumerHandle, DEFAULT_ACK_WAIT, DEFAULT_CONCURRENCY, DEFAULT_DURABLE,
    JetStreamConsumer,
};
pub use url::{DEFAULT_PORT, MAX_REPLICAS, NatsUrl};

/// The header that carries the subject a message's answer is published to
/// (`<destination subject>.answers.<sender service id>`), set by the
/// sender's transport on commands and pushcalls.
pub const REPLY_TO_HEADER: &str = "rf-reply-to";

/// `Nats-Msg-Id` of an answer: this prefix and the message id.
pub const ANSWER_ID_PREFIX: &str = "answer-";

/// How long the stream remembers a `Nats-Msg-Id` to drop a re-publish.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Why a JetStream consumer could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// A setting is malformed; `field` names it, the message never holds
    /// a credential.
    #[error("{field}: {message}")]
    Config {
        /// The setting, e.g. `nats url`, `durable`, `destination`, `secret`.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The database (terminated messages, answers) cannot be opened.
    #[error(transparent)]
    Db(#[from] crate::store::StoreError),
}

/// The subject of the answers to `sender`'s messages sent to `subject`.
pub fn answers_subject(subject: &str, sender: &str) -> String {
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
    format!("{subject}.answers.{token}")
}

/// The stream of `url`'s subject: created if missing (file storage, work
/// queue retention, subjects `<subject>` and `<subject>.>`,
/// [`DUPLICATE_WINDOW`]); an
/// existing stream of that name must take the subject.
pub(crate) async fn ensure_stream(
    context: &jetstream::Context,
    url: &NatsUrl,
) -> Result<jetstream::stream::Stream, BrokerError> {
    let name = url.stream_name();
    let subject = url.subject().to_owned();
    let config = jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone(), format!("{subject}.>")],
        storage: jetstream::stream::StorageType::File,
        // A message leaves the stream once acknowledged (or terminated):
        // the stream holds what is not processed yet, and does not grow.
        // The receiver's consumer (`<subject>`) and each sender's answers
        // consumer (`<subject>.answers.<id>`) filter disjoint subjects, as
        // a work queue requires.
        retention: jetstream::stream::RetentionPolicy::WorkQueue,
        duplicate_window: DUPLICATE_WINDOW,
        num_replicas: url.replicas(),
        ..Default::default()
    };
    let mut stream = context
        .get_or_create_stream(config)
        .await
        .map_err(|e| format!("stream `{name}`: {e}"))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("stream `{name}`: {e}"))?;
    if !info.config.subjects.iter().any(|s| s == &subject) {
        return Err(format!(
            "stream `{name}` exists but does not take subject `{subject}` (it takes {:?})",
            info.config.subjects
        )
        .into());
    }
    Ok(stream)
}

/// Checks a durable consumer name (no `.`, `*`, `>`, spaces).
pub(crate) fn validate_durable(name: &str) -> Result<(), BrokerError> {
    if name.is_empty()
        || name.len() > 200
        || name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(
            "a durable consumer name is 1 to 200 characters without `.`, `*`, `>`, slashes or spaces"
                .to_owned().into());
    }
    Ok(())
}

/// A durable pull consumer named `durable` on `stream`, created if
/// missing: explicit acks, `ack_wait`, unlimited deliveries, only
/// `filter`.
pub(crate) async fn ensure_consumer(
    stream: &jetstream::stream::Stream,
    durable: &str,
    filter: &str,
    ack_wait: Duration,
    max_ack_pending: i64,
) -> Result<jetstream::consumer::PullConsumer, BrokerError> {
    let config = jetstream::consumer::pull::Config {
        durable_name: Some(durable.to_owned()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        filter_subject: filter.to_owned(),
        max_ack_pending,
        ..Default::default()
    };
    stream
        .get_or_create_consumer(durable, config)
        .await
        .map_err(|e| BrokerError(format!("consumer `{durable}`: {e}")))
}

/// A NATS message's headers as HTTP headers (names that are not valid
/// HTTP header names are left out).
pub(crate) fn http_headers(headers: Option<&async_nats::HeaderMap>) -> axum::http::HeaderMap {
    let mut out = axum::http::HeaderMap::new();
    let Some(headers) = headers else {
        return out;
    };
    for (name, values) in headers.iter() {
        let Ok(name) = axum::http::HeaderName::from_bytes(AsRef::<[u8]>::as_ref(name)) else {
            continue;
        };
        for value in values {
            if let Ok(value) = axum::http::HeaderValue::from_str(value.as_str()) {
                out.append(name.clone(), value);
            }
        }
    }
    out
}

/// How long to wait before connecting again after `failures` failures in a
/// row: 100 ms doubling to 5 s.
pub(crate) fn reconnect_delay(failures: u32) -> Duration {
    Duration::from_millis((100u64 << failures.min(6)).min(5_000))
}

/// The settings [`ConsumerBuilder`] and [`AnswersBuilder`] share: how a
/// pull consumer acknowledges, backs off and gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PullSettings {
    /// How long the server waits for an acknowledgement.
    pub(crate) ack_wait: Duration,
    /// The backoff of a negative acknowledgement, by delivery count.
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    /// Failed deliveries before a message is terminated.
    pub(crate) max_retries: u32,
    /// Bounds connecting, publishing and each acknowledgement.
    pub(crate) timeout: Duration,
}

impl Default for PullSettings {
    /// [`consumer::DEFAULT_ACK_WAIT`], the outbox's backoff and
    /// `max_retries`, 5 s.
    fn default() -> Self {
        let outbox = crate::config::OutboxConfig::default();
        Self {
            ack_wait: consumer::DEFAULT_ACK_WAIT,
            backoff_base: outbox.backoff_base,
            backoff_max: outbox.backoff_max,
            max_retries: outbox.max_retries,
            timeout: Duration::from_secs(5),
        }
    }
}

/// A consumer's task and the token that stops it (the inside of
/// [`ConsumerHandle`] and [`AnswersHandle`]).
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
