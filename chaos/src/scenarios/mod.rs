//! The scenarios, one file per family of faults: process kills (`kills`),
//! the network between the services (`network`), the disk (`disk`), the
//! clock (`clock`), replicas on PostgreSQL (`replicas`), the JetStream
//! transport (`jetstream`), a 3-node JetStream cluster
//! (`jetstream_cluster`) and the AMQP 1.0 transport on RabbitMQ (`amqp`). Each builds its cluster, injects its faults,
//! waits for the drain and returns a [`Report`].
//!
//! A scenario never judges its own run: the verdict comes from both
//! databases ([`rfidl_examples::demo::verdict`]), and `Report::ok` reads it.

mod amqp;
mod clock;
mod disk;
mod jetstream;
mod jetstream_cluster;
mod kills;
mod network;
mod replicas;

use anyhow::bail;
use rand::rngs::StdRng;

use super::Context;
use super::report::Report;

/// Every scenario, in the order `--scenario all` runs them.
pub const SCENARIOS: &[&str] = &[
    "sender-kill",
    "receiver-kill",
    "both-kill",
    "lost-acks",
    "lost-acks-50",
    "slow-handler",
    "outage",
    "disk-full",
    "clock-skew",
    "corrupt-db",
    "replicas",
    "jetstream",
    "jetstream-cluster",
    "amqp",
];

/// Runs scenario `name`.
pub(crate) async fn run(name: &str, context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    match name {
        "sender-kill" => kills::kills(context, rng, kills::Target::Sender).await,
        "receiver-kill" => kills::kills(context, rng, kills::Target::Receiver).await,
        "both-kill" => kills::kills(context, rng, kills::Target::Both).await,
        "lost-acks" => network::lost_acks(context, rng, 0.2, 0.1).await,
        "lost-acks-50" => network::lost_acks(context, rng, 0.5, 0.1).await,
        "slow-handler" => network::slow_handler(context).await,
        "outage" => network::outage(context, rng).await,
        "disk-full" => disk::disk_full(context).await,
        "clock-skew" => clock::clock_skew(context).await,
        "corrupt-db" => disk::corrupt_db(context).await,
        "replicas" => replicas::replicas(context, rng).await,
        "jetstream" => jetstream::jetstream(context, rng).await,
        "jetstream-cluster" => jetstream_cluster::jetstream_cluster(context, rng).await,
        "amqp" => amqp::amqp(context, rng).await,
        other => bail!("no scenario `{other}`"),
    }
}
