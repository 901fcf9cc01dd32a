//! NATS JetStream for a demo service: `--nats nats://host:port/<subject>`
//! consumes the service's inbound messages from a stream (besides its HTTP
//! receiver), and a `--peer-url nats://…/<subject>` publishes its outbound
//! messages there; the answers to its commands come back through the same
//! broker and run its response handlers once (docs/transports.md).
//!
//! AMQP 1.0 the same way: `--amqp URL` (an `amqp[s]://` URL or a Service
//! Bus connection string) consumes the service's inbound address, and a
//! `--peer-url amqp://…` sends there, its answers coming back through the
//! broker.
//!
//! The broker consumers keep their records (terminated messages, answered
//! markers) in the service's SQLite file, so a service on PostgreSQL uses
//! HTTP or gRPC for now.

use std::time::Duration;

use anyhow::Context as _;
use rfidl_runtime::Config;
use rfidl_runtime::amqp::{
    AmqpAnswersBuilder, AmqpAnswersConsumer, AmqpAnswersHandle, AmqpConsumer, AmqpConsumerHandle,
    AmqpUrl,
};
use rfidl_runtime::nats::{AnswersBuilder, AnswersConsumer, AnswersHandle};
use rfidl_runtime::nats::{ConsumerHandle, JetStreamConsumer};
use rfidl_runtime::receiver::Receiver;

use super::Settings;

/// How long the broker waits for an acknowledgement before it redelivers:
/// the demo's handlers take milliseconds, so a message in the hands of a
/// killed process comes back after 5 s, not the runtime's default 30 s.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// What a service runs on the broker; nothing when it uses none.
#[derive(Debug, Default)]
pub struct Broker {
    consumer: Option<ConsumerHandle>,
    answers: Option<AnswersHandle>,
    amqp_consumer: Option<AmqpConsumerHandle>,
    amqp_answers: Option<AmqpAnswersHandle>,
}

/// The answers consumer being configured, JetStream's or AMQP's: the
/// service adds its response handlers and keys the same way to either.
pub enum Answers {
    /// `--peer-url nats://…`.
    Nats(AnswersBuilder),
    /// `--peer-url amqp://…`, `amqps://…` or a connection string.
    Amqp(AmqpAnswersBuilder),
}

impl Answers {
    /// Runs `handler` on the answers of its interface version.
    pub fn responses(self, handler: impl rfidl_runtime::responses::ResponseHandler) -> Self {
        match self {
            Self::Nats(builder) => Self::Nats(builder.responses(handler)),
            Self::Amqp(builder) => Self::Amqp(builder.responses(handler)),
        }
    }

    /// Checks answers against the keys the registry issued.
    pub fn issued_keys(self, keys: &rfidl_runtime::keys::IssuedKeys) -> Self {
        match self {
            Self::Nats(builder) => Self::Nats(builder.issued_keys(keys)),
            Self::Amqp(builder) => Self::Amqp(builder.issued_keys(keys)),
        }
    }
}

impl Broker {
    /// Starts the consumer of `--nats` into `receiver`, and the consumer of
    /// answers when the peer (`destination` of `config`) is reached through
    /// JetStream; `answers` adds the service's response handlers to the
    /// latter, which checks every answer's signature with the
    /// destination's secret.
    pub fn start(
        settings: &Settings,
        config: &Config,
        destination: &str,
        receiver: &Receiver,
        answers: impl FnOnce(Answers) -> Answers,
    ) -> anyhow::Result<Self> {
        let publishes = settings.peer_url.starts_with("nats://");
        let sends_amqp = AmqpUrl::is_amqp(&settings.peer_url);
        if settings.nats.is_none() && !publishes && settings.amqp.is_none() && !sends_amqp {
            return Ok(Self::default());
        }
        let path = settings.db.sqlite_path().context(
            "a broker (--nats, --amqp, --peer-url nats://… or amqp://…) needs a SQLite --db \
             in the demo: its consumers keep their records in the service's SQLite file",
        )?;
        let amqp_consumer = match &settings.amqp {
            Some(url) => Some(
                AmqpConsumer::builder(receiver.clone(), url)
                    .spawn()
                    .context("--amqp")?,
            ),
            None => None,
        };
        if sends_amqp {
            let consumer = AmqpAnswersConsumer::for_destination(config, destination, path)
                .context("--peer-url")?;
            let Answers::Amqp(consumer) = answers(Answers::Amqp(consumer)) else {
                anyhow::bail!("the answers consumer changed kind");
            };
            return Ok(Self {
                consumer: None,
                answers: None,
                amqp_consumer,
                amqp_answers: Some(consumer.spawn().context("--peer-url")?),
            });
        }
        let consumer = match &settings.nats {
            // Replicas of one service share its durable consumer.
            Some(url) => Some(
                JetStreamConsumer::builder(receiver.clone(), url)
                    .durable(&settings.service_id)
                    .ack_wait(ACK_WAIT)
                    .spawn()
                    .context("--nats")?,
            ),
            None => None,
        };
        let answers = if publishes {
            let consumer = AnswersConsumer::for_destination(config, destination, path)
                .context("--peer-url")?;
            let Answers::Nats(consumer) = answers(Answers::Nats(consumer)) else {
                anyhow::bail!("the answers consumer changed kind");
            };
            Some(consumer.ack_wait(ACK_WAIT).spawn().context("--peer-url")?)
        } else {
            None
        };
        Ok(Self {
            consumer,
            answers,
            amqp_consumer,
            amqp_answers: None,
        })
    }

    /// Stops pulling inbound messages; those in hand finish and are
    /// acknowledged (before the receiver stops).
    pub async fn stop_consuming(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            consumer.shutdown().await;
        }
        if let Some(consumer) = self.amqp_consumer.take() {
            consumer.shutdown().await;
        }
    }

    /// Stops taking answers (after the dispatcher stopped).
    pub async fn stop_answers(&mut self) {
        if let Some(answers) = self.answers.take() {
            answers.shutdown().await;
        }
        if let Some(answers) = self.amqp_answers.take() {
            answers.shutdown().await;
        }
    }
}
