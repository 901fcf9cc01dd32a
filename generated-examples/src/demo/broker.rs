//! The brokers of a demo service. NATS JetStream: `--nats
//! nats://host:port/<subject>` consumes the service's inbound messages from
//! a stream (besides its HTTP receiver), and a `--peer-url
//! nats://…/<subject>` publishes its outbound messages there; the answers to
//! its commands come back through the same broker and run its response
//! handlers once (docs/transports.md). AMQP 1.0 the same way: `--amqp URL`
//! (an `amqp[s]://` URL or a Service Bus connection string) consumes the
//! service's inbound address, and a `--peer-url amqp://…` sends there, its
//! answers coming back through the broker. The host runs the consumers
//! ([`HostBuilder::jetstream`], [`HostBuilder::amqp`]) and stops them in
//! order: inbound before the receiver, answers after the dispatcher.
//!
//! The demo keeps brokers to SQLite services: a service on PostgreSQL uses
//! HTTP or gRPC.

use std::time::Duration;

use rfidl_runtime::AnyStore;
use rfidl_runtime::amqp::AmqpUrl;
use rfidl_runtime::host::HostBuilder;

use super::Settings;

/// How long the broker waits for an acknowledgement before it redelivers:
/// the demo's handlers take milliseconds, so a message in the hands of a
/// killed process comes back after 5 s, not the runtime's default 30 s.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// `--nats`, `--amqp` and a broker `--peer-url` on `host`.
pub fn brokers<S: AnyStore>(
    host: HostBuilder<S>,
    settings: &Settings,
) -> anyhow::Result<HostBuilder<S>> {
    let publishes = settings.peer_url.starts_with("nats://");
    let sends_amqp = AmqpUrl::is_amqp(&settings.peer_url);
    if settings.nats.is_none() && !publishes && settings.amqp.is_none() && !sends_amqp {
        return Ok(host);
    }
    anyhow::ensure!(
        settings.db.sqlite_path().is_some(),
        "a broker (--nats, --amqp, --peer-url nats://… or amqp://…) needs a SQLite --db in \
         the demo"
    );
    let mut host = host.jetstream_ack_wait(ACK_WAIT);
    if let Some(url) = &settings.nats {
        // Replicas of one service share its durable consumer.
        host = host.jetstream(url.clone());
    }
    if let Some(url) = &settings.amqp {
        host = host.amqp(url.clone());
    }
    Ok(host)
}
