//! NATS JetStream for a demo service: `--nats nats://host:port/<subject>`
//! consumes the service's inbound messages from a stream (besides its HTTP
//! receiver), and a `--peer-url nats://…/<subject>` publishes its outbound
//! messages there; the answers to its commands come back through the same
//! broker and run its response handlers once (docs/transports.md). The
//! host runs both consumers ([`HostBuilder::jetstream`]).
//!
//! The demo keeps JetStream to SQLite services: a service on PostgreSQL
//! uses HTTP or gRPC.

use std::time::Duration;

use rfidl_runtime::Store;
use rfidl_runtime::host::HostBuilder;

use super::Settings;

/// How long the broker waits for an acknowledgement before it redelivers:
/// the demo's handlers take milliseconds, so a message in the hands of a
/// killed process comes back after 5 s, not the runtime's default 30 s.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// `--nats` and a `nats://` `--peer-url` on `host`.
pub fn jetstream<S: Store>(
    host: HostBuilder<S>,
    settings: &Settings,
) -> anyhow::Result<HostBuilder<S>> {
    let publishes = settings.peer_url.starts_with("nats://");
    if settings.nats.is_none() && !publishes {
        return Ok(host);
    }
    anyhow::ensure!(
        settings.db.sqlite_path().is_some(),
        "JetStream (--nats, --peer-url nats://…) needs a SQLite --db in the demo"
    );
    let host = host.jetstream_ack_wait(ACK_WAIT);
    Ok(match &settings.nats {
        // Replicas of one service share its durable consumer.
        Some(url) => host.jetstream(url.clone()),
        None => host,
    })
}
