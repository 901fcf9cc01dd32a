//! The JetStream transport on a replicated stream of a real 3-node cluster
//! (support/nats.rs `NatsCluster`; skipped without `RFIDL_NATS_SERVER`):
//! 2,000 messages exactly once while a node, or the stream's leader, is
//! SIGKILLed and restarted mid-stream. The publisher and the consumer are
//! given the three nodes as seeds (`nats://h1,h2,h3/<subject>?replicas=3`)
//! and move to the remaining ones without an operator.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::nats::JetStreamConsumer;
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use serde_json::json;

use crate::dispatcher::{message, sender_config};
use crate::support::nats::NatsCluster;
use crate::support::{self, Ledger, LedgerService, count};

const SUBJECT: &str = "ledger.cluster";
const STREAM: &str = "RF_ledger_cluster";
const MESSAGES: usize = 2_000;

/// Which node dies mid-stream.
enum Victim {
    /// The first node (whatever its role).
    AnyNode,
    /// The node that leads the stream's replicas at that moment.
    StreamLeader,
}

/// The node leading the stream's replicas, asked of the cluster.
async fn stream_leader(cluster: &NatsCluster) -> Option<String> {
    let servers: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let client = async_nats::connect(servers).await.ok()?;
    let context = async_nats::jetstream::new(client);
    let mut stream = context.get_stream(STREAM).await.ok()?;
    stream.info().await.ok()?.cluster.as_ref()?.leader.clone()
}

async fn exactly_once_while_a_node_dies(victim: Victim) {
    let Some(mut cluster) = NatsCluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let sender_db: PathBuf = dir.path().join("sender.db");
    let receiver_db: PathBuf = dir.path().join("receiver.db");
    support::create_ledger_table(&receiver_db);
    let secret = Secret::generate();
    let url = cluster.url(SUBJECT);

    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.request_timeout = Duration::from_secs(2);
    // An election takes seconds: the rows wait it out, however many tries.
    config.outbox.max_retries = 10_000;
    config.outbox.backoff_max = Duration::from_millis(500);
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(url.clone(), secret.to_whsec()),
    );
    let outbox = Outbox::new(config, &sender_db);

    let ledger = Arc::new(Ledger::default());
    let receiver = Receiver::builder(support::receiver_config(&[&secret]), &receiver_db)
        .service(LedgerService(ledger.clone()))
        .build()
        .expect("receiver");
    let consumer = JetStreamConsumer::builder(receiver.clone(), &url)
        .durable("ledger")
        .ack_wait(Duration::from_secs(3))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .max_retries(10_000)
        .timeout(Duration::from_secs(2))
        .spawn()
        .expect("consumer");
    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");

    let started = Instant::now();
    let mut conn =
        rfidl_runtime::store::sqlite::open(&sender_db, rfidl_runtime::Durability::Normal)
            .expect("open");
    for batch in 0..(MESSAGES / 100) {
        let tx = conn.transaction().expect("tx");
        for i in 0..100 {
            let amount = (batch * 100 + i) as i64;
            outbox
                .enqueue(
                    &tx,
                    message(
                        "ledger",
                        "Credit",
                        json!({"account": "r3", "amount": amount}),
                    ),
                )
                .expect("enqueue");
        }
        tx.commit().expect("commit");
    }
    let effects = || count(&receiver_db, "SELECT COUNT(*) FROM ledger");
    let sent = || {
        count(
            &sender_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
        )
    };
    // Mid-stream: some effects, not all.
    // The cluster elects its leaders, then the stream is made: seconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    while effects() < 300 {
        assert!(Instant::now() < deadline, "no 300 effects within 120 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed = match victim {
        Victim::AnyNode => 0,
        Victim::StreamLeader => {
            let leader = stream_leader(&cluster)
                .await
                .expect("the stream has a leader");
            cluster.index_of(&leader).expect("a node of the cluster")
        }
    };
    cluster.kill(killed);
    let at_kill = effects();
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart(killed);

    let deadline = Instant::now() + Duration::from_secs(120);
    while effects() < MESSAGES as i64 || sent() < MESSAGES as i64 {
        assert!(
            Instant::now() < deadline,
            "not drained within 120 s: {} effects, {} Sent",
            effects(),
            sent()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = started.elapsed();
    // Redeliveries still in flight would show as a second effect: wait a
    // little longer than the consumer's ack wait before counting.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        at_kill < MESSAGES as i64,
        "the kill happened mid-stream ({at_kill} of {MESSAGES})"
    );
    let n = MESSAGES as i64;
    assert_eq!(effects(), n, "one effect per message");
    assert_eq!(
        count(
            &receiver_db,
            "SELECT COUNT(DISTINCT message_id) FROM ledger"
        ),
        n
    );
    assert_eq!(sent(), n, "every row Sent");
    assert_eq!(
        count(
            &sender_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status != 'Sent'"
        ),
        0,
        "nothing failed or dead-lettered"
    );
    eprintln!(
        "jetstream R3: {MESSAGES} messages exactly once with node {} killed at {at_kill} effects; drained in {drained:?}",
        killed + 1
    );
    dispatcher.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_messages_exactly_once_on_r3_while_a_node_is_killed_and_restarted() {
    exactly_once_while_a_node_dies(Victim::AnyNode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_messages_exactly_once_on_r3_while_the_stream_leader_is_killed() {
    exactly_once_while_a_node_dies(Victim::StreamLeader).await;
}
