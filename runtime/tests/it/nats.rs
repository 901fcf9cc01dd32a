//! The NATS JetStream transport with a real `nats-server` (support/nats.rs;
//! skipped without `RFIDL_NATS_SERVER`): outbox -> stream -> durable
//! consumer -> receiver, on SQLite files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::Config;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::{Dispatcher, DispatcherHandle};
use rfidl_runtime::nats::{ConsumerHandle, JetStreamConsumer};
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::support::nats::NatsServer;
use crate::support::{self, Ledger, LedgerService, count};

/// A sender (outbox + dispatcher to `nats://…/ledger`) and a receiver fed
/// by a JetStream consumer, each with its SQLite file in `dir`.
struct Pair {
    dir: tempfile::TempDir,
    sender_db: PathBuf,
    receiver_db: PathBuf,
    outbox: Outbox,
    secret: Secret,
    ledger: Arc<Ledger>,
    url: String,
}

const SUBJECT: &str = "ledger.inbound";

impl Pair {
    fn new(server: &NatsServer) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sender_db = dir.path().join("sender.db");
        let receiver_db = dir.path().join("receiver.db");
        support::create_ledger_table(&receiver_db);
        let secret = Secret::generate();
        let url = server.url(SUBJECT);
        let mut config = sender_config(Duration::from_millis(50));
        config.outbox.request_timeout = Duration::from_millis(1_000);
        config.destinations.insert(
            "ledger".into(),
            DestinationConfig::new(url.clone(), secret.to_whsec()),
        );
        let outbox = Outbox::new(config, &sender_db);
        Self {
            dir,
            sender_db,
            receiver_db,
            outbox,
            secret,
            ledger: Arc::new(Ledger::default()),
            url,
        }
    }

    fn dispatcher(&self) -> DispatcherHandle {
        Dispatcher::builder(&self.outbox, &self.sender_db)
            .start()
            .expect("dispatcher")
    }

    fn receiver(&self, config: Config) -> Receiver {
        Receiver::builder(config, &self.receiver_db)
            .service(LedgerService(self.ledger.clone()))
            .build()
            .expect("receiver")
    }

    fn receiver_config(&self) -> Config {
        support::receiver_config(&[&self.secret])
    }

    fn consumer(&self, receiver: Receiver) -> ConsumerHandle {
        JetStreamConsumer::builder(receiver, &self.url, &self.receiver_db)
            .durable("ledger")
            .ack_wait(Duration::from_secs(2))
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
            .max_retries(2)
            .spawn()
            .expect("consumer")
    }

    /// Enqueues `messages` in one transaction.
    fn enqueue(&self, messages: Vec<OutgoingMessage>) -> Vec<Uuid> {
        let mut conn = rfidl_runtime::db::open(&self.sender_db, rfidl_runtime::Durability::Normal)
            .expect("open");
        let tx = conn.transaction().expect("tx");
        let ids = messages
            .into_iter()
            .map(|m| self.outbox.enqueue(&tx, m).expect("enqueue"))
            .collect();
        tx.commit().expect("commit");
        ids
    }

    fn credits(&self, n: usize) -> Vec<Uuid> {
        self.enqueue(
            (0..n)
                .map(|i| message("ledger", "Credit", json!({"account": "js", "amount": i})))
                .collect(),
        )
    }

    fn sender_count(&self, sql: &str) -> i64 {
        count(&self.sender_db, sql)
    }

    fn receiver_count(&self, sql: &str) -> i64 {
        count(&self.receiver_db, sql)
    }
}

/// Polls `done` every 10 ms until it holds, failing after `limit`.
async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

/// Every message has exactly one effect, and every outbox row is `Sent`.
fn assert_exactly_once(pair: &Pair, messages: i64) {
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM ledger"),
        messages,
        "one effect per message"
    );
    assert_eq!(
        pair.receiver_count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        messages
    );
    assert_eq!(
        pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'"),
        messages,
        "every row Sent"
    );
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM inbox_messages"),
        messages
    );
}

/// The durable consumer's pending and unacknowledged counts, from the server.
async fn consumer_backlog(server: &NatsServer, durable: &str) -> (u64, usize) {
    let client = async_nats::connect(format!("127.0.0.1:{}", server.port()))
        .await
        .expect("connect");
    let context = async_nats::jetstream::new(client);
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = context
        .get_consumer_from_stream(durable, "RF_ledger_inbound")
        .await
        .expect("consumer");
    let info = consumer.info().await.expect("info");
    (info.num_pending, info.num_ack_pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_messages_are_delivered_exactly_once() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    let dispatcher = pair.dispatcher();
    let started = Instant::now();
    pair.credits(200);
    wait_until(
        "200 effects and 200 rows Sent",
        Duration::from_secs(20),
        || {
            pair.receiver_count("SELECT COUNT(*) FROM ledger") >= 200
                && pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
                    == 200
        },
    )
    .await;
    let elapsed = started.elapsed();
    // Every delivery acknowledged: nothing pending, nothing redelivered later.
    let mut backlog = consumer_backlog(&server, "ledger").await;
    for _ in 0..100 {
        if backlog == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        backlog = consumer_backlog(&server, "ledger").await;
    }
    assert_eq!(backlog, (0, 0), "every message acknowledged");
    assert_exactly_once(&pair, 200);
    assert_eq!(
        pair.ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
        200
    );
    eprintln!("jetstream: 200 messages delivered exactly once in {elapsed:?}");
    dispatcher.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
    drop(pair.dir);
}
