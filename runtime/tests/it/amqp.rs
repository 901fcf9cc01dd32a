//! The AMQP 1.0 transport against a real broker: a RabbitMQ node of the
//! test's own with its AMQP 1.0 plugin (support/amqp.rs). Sender: outbox +
//! dispatcher to `amqp://…//queue/ledger`; receiver: `AmqpConsumer` into
//! the ledger service.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message, Properties};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Value};
use rfidl_runtime::Config;
use rfidl_runtime::amqp::{AmqpConsumer, AmqpConsumerHandle};
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::{Dispatcher, DispatcherHandle};
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::support::amqp::RabbitNode;
use crate::support::{self, Ledger, LedgerService, count};

const QUEUE: &str = "ledger";

/// A sender (outbox + dispatcher to the node's `ledger` queue) and a
/// receiver fed by an AMQP consumer, each with its SQLite file in `dir`.
struct Pair {
    dir: tempfile::TempDir,
    sender_db: PathBuf,
    receiver_db: PathBuf,
    outbox: Outbox,
    secret: Secret,
    ledger: Arc<Ledger>,
    url: String,
}

impl Pair {
    fn new(node: &RabbitNode) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sender_db = dir.path().join("sender.db");
        let receiver_db = dir.path().join("receiver.db");
        support::create_ledger_table(&receiver_db);
        let secret = Secret::generate();
        let url = node.url(QUEUE);
        let mut config = sender_config(Duration::from_millis(50));
        config.outbox.request_timeout = Duration::from_millis(2_000);
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
        Dispatcher::builder(&self.outbox)
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

    fn consumer(&self, receiver: Receiver) -> AmqpConsumerHandle {
        AmqpConsumer::builder(receiver, &self.url)
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
            .max_retries(2)
            .timeout(Duration::from_secs(2))
            .spawn()
            .expect("consumer")
    }

    /// Enqueues `messages` in one transaction.
    fn enqueue(&self, messages: Vec<OutgoingMessage>) -> Vec<Uuid> {
        let mut conn =
            rfidl_runtime::store::sqlite::open(&self.sender_db, rfidl_runtime::Durability::Normal)
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
                .map(|i| message("ledger", "Credit", json!({"account": "amqp", "amount": i})))
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

/// Waits (at most 10 s) until `queue` holds nothing, ready or unsettled;
/// returns what it last saw.
pub(crate) async fn drained(node: &RabbitNode, queue: &str) -> Option<(u64, u64)> {
    let mut depth = node.queue_depth(queue);
    for _ in 0..50 {
        if depth == Some((0, 0)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        depth = node.queue_depth(queue);
    }
    depth
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_messages_are_delivered_exactly_once() {
    let Some(node) = RabbitNode::start() else {
        return;
    };
    let pair = Pair::new(&node);
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    let dispatcher = pair.dispatcher();
    let started = Instant::now();
    pair.credits(200);
    wait_until(
        "200 effects and 200 rows Sent",
        Duration::from_secs(30),
        || {
            pair.receiver_count("SELECT COUNT(*) FROM ledger") >= 200
                && pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
                    == 200
        },
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(
        drained(&node, QUEUE).await,
        Some((0, 0)),
        "every delivery accepted"
    );
    assert_exactly_once(&pair, 200);
    assert_eq!(
        pair.ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
        200
    );
    eprintln!(
        "amqp (RabbitMQ): 200 messages delivered exactly once in {elapsed:?} ({:.0} messages/s)",
        200.0 / elapsed.as_secs_f64()
    );
    dispatcher.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_killed_and_restarted_mid_stream_loses_nothing_and_duplicates_no_effect() {
    let Some(mut node) = RabbitNode::start() else {
        return;
    };
    let pair = Pair::new(&node);
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    let dispatcher = pair.dispatcher();
    let messages = 1_500;
    pair.credits(messages as usize);
    wait_until(
        "some effects before the kill",
        Duration::from_secs(20),
        || pair.receiver_count("SELECT COUNT(*) FROM ledger") >= 100,
    )
    .await;
    node.kill();
    let at_kill = pair.receiver_count("SELECT COUNT(*) FROM ledger");
    let sent_at_kill =
        pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'");
    assert!(at_kill < messages, "killed mid-stream");
    tokio::time::sleep(Duration::from_millis(500)).await;
    node.restart();
    let recovered = wait_until(
        "every row Sent and every effect once after the restart",
        Duration::from_secs(60),
        || {
            pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
                == messages
                && pair.receiver_count("SELECT COUNT(*) FROM ledger") >= messages
        },
    )
    .await;
    assert_eq!(
        drained(&node, QUEUE).await,
        Some((0, 0)),
        "everything settled after the restart"
    );
    assert_exactly_once(&pair, messages);
    assert_eq!(
        pair.sender_count("SELECT MAX(retry_count) FROM outbox_messages"),
        0,
        "an unreachable broker is not counted against max_retries"
    );
    eprintln!(
        "amqp restart: killed at {at_kill} effects / {sent_at_kill} Sent of {messages}; \
         all delivered exactly once {recovered:?} after the restart"
    );
    dispatcher.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
}

/// Sends one message to `url`'s address as another AMQP client would
/// (within 20 s, or the test fails saying so).
pub(crate) async fn send_raw(
    url: &str,
    address: &str,
    headers: &[(&str, String)],
    body: &[u8],
    id: &str,
) {
    tokio::time::timeout(
        Duration::from_secs(20),
        send_raw_now(url, address, headers, body, id),
    )
    .await
    .expect("a message sent by hand within 20 s");
}

async fn send_raw_now(url: &str, address: &str, headers: &[(&str, String)], body: &[u8], id: &str) {
    let container = format!("test-{}", Uuid::now_v7());
    let plain = url
        .strip_prefix("amqp://guest:guest@")
        .and_then(|rest| rest.split_once('/'))
        .map(|(host, _)| host)
        .expect("a test URL");
    let mut connection = fe2o3_amqp::Connection::open(
        container.clone(),
        format!("amqp://guest:guest@{plain}").as_str(),
    )
    .await
    .expect("connect");
    let mut session = fe2o3_amqp::Session::begin(&mut connection)
        .await
        .expect("session");
    // A durable terminus, as rfidl's links ask for: RabbitMQ refuses a
    // link that would declare the durable queue otherwise.
    let target = fe2o3_amqp::types::messaging::Target::builder()
        .address(address.to_owned())
        .durable(fe2o3_amqp::types::messaging::TerminusDurability::Configuration)
        .build();
    let mut sender = fe2o3_amqp::Sender::builder()
        .name(container)
        .target(target)
        .attach(&mut session)
        .await
        .expect("attach");
    let mut properties = ApplicationProperties::builder();
    for (name, value) in headers {
        properties = properties.insert(*name, SimpleValue::String(value.clone()));
    }
    let message = Message::builder()
        .properties(Properties::builder().message_id(id.to_owned()).build())
        .application_properties(properties.build())
        .data(Binary::from(body.to_vec()))
        .build();
    let outcome = sender.send(message).await.expect("send");
    assert!(outcome.is_accepted(), "{outcome:?}");
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = sender.close().await;
        let _ = session.end().await;
        let _ = connection.close().await;
    })
    .await;
}

/// Takes up to `wanted` messages from `address` within `limit`, accepting
/// each; returns their message ids.
async fn take(node: &RabbitNode, address: &str, wanted: usize, limit: Duration) -> Vec<String> {
    let url = format!("amqp://guest:guest@127.0.0.1:{}", node.port());
    let container = format!("test-{}", Uuid::now_v7());
    let mut connection = fe2o3_amqp::Connection::open(container.clone(), url.as_str())
        .await
        .expect("connect");
    let mut session = fe2o3_amqp::Session::begin(&mut connection)
        .await
        .expect("session");
    let source = fe2o3_amqp::types::messaging::Source::builder()
        .address(address.to_owned())
        .durable(fe2o3_amqp::types::messaging::TerminusDurability::Configuration)
        .build();
    let mut receiver = fe2o3_amqp::Receiver::builder()
        .name(container)
        .source(source)
        .attach(&mut session)
        .await
        .expect("attach");
    let mut ids = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while ids.len() < wanted {
        let Ok(delivery) = tokio::time::timeout_at(deadline, receiver.recv::<Body<Value>>()).await
        else {
            break;
        };
        let delivery = delivery.expect("recv");
        receiver.accept(&delivery).await.expect("accept");
        let id = delivery
            .message()
            .properties
            .as_ref()
            .and_then(|p| p.message_id.clone())
            .map(|id| match id {
                fe2o3_amqp::types::messaging::MessageId::String(id) => id,
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        ids.push(id);
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = receiver.close().await;
        let _ = session.end().await;
        let _ = connection.close().await;
    })
    .await;
    ids
}

/// An envelope of `endpoint` signed with `secret` now: (headers, body).
fn signed(
    id: &str,
    endpoint: &str,
    payload: serde_json::Value,
    secret: &Secret,
) -> (Vec<(&'static str, String)>, Vec<u8>) {
    let body = serde_json::to_vec(&support::envelope(id, endpoint, payload)).expect("json");
    let headers = rfidl_runtime::signing::SignatureHeaders::sign(
        id,
        rfidl_runtime::signing::unix_now(),
        &body,
        std::slice::from_ref(secret),
    );
    (headers.to_pairs().to_vec(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_rejected_to_the_dead_letter_queue_recorded_and_not_redelivered() {
    let Some(node) = RabbitNode::start() else {
        return;
    };
    // RabbitMQ dead-letters a rejected message when its queue has a
    // dead-letter exchange: the default exchange, routing key
    // `ledger-dead` (Service Bus has a dead-letter queue per entity).
    node.ctl(&[
        "set_policy",
        "rfidl-dlx",
        "^ledger$",
        r#"{"dead-letter-exchange":"","dead-letter-routing-key":"ledger-dead"}"#,
        "--apply-to",
        "queues",
    ]);
    // Declares the dead-letter queue (a RabbitMQ 3.x `/queue/` address).
    assert!(
        take(&node, "/queue/ledger-dead", 1, Duration::from_millis(300))
            .await
            .is_empty()
    );
    let pair = Pair::new(&node);
    let mut config = pair.receiver_config();
    config.inbox.body_limit = 4_096;
    let receiver = pair.receiver(config);
    let consumer = pair.consumer(receiver.clone());
    let address = "/queue/ledger";

    // Larger than the inbox takes (413), and a signed body that is no
    // envelope (400): neither ever succeeds.
    let big = Uuid::now_v7().to_string();
    let (headers, body) = signed(
        &big,
        "Credit",
        json!({"account": "x".repeat(8_000), "amount": 1}),
        &pair.secret,
    );
    send_raw(&pair.url, address, &headers, &body, &big).await;
    let malformed = Uuid::now_v7().to_string();
    let body = b"{\"not\": \"an envelope\"}".to_vec();
    let headers = rfidl_runtime::signing::SignatureHeaders::sign(
        &malformed,
        rfidl_runtime::signing::unix_now(),
        &body,
        std::slice::from_ref(&pair.secret),
    );
    send_raw(
        &pair.url,
        address,
        headers.to_pairs().as_ref(),
        &body,
        &malformed,
    )
    .await;
    // And a good one after them.
    let good = Uuid::now_v7().to_string();
    let (headers, body) = signed(
        &good,
        "Credit",
        json!({"account": "g", "amount": 2}),
        &pair.secret,
    );
    send_raw(&pair.url, address, &headers, &body, &good).await;

    wait_until(
        "the good message processed",
        Duration::from_secs(20),
        || pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1,
    )
    .await;
    wait_until("two rows in rf_terminated", Duration::from_secs(20), || {
        pair.receiver_count("SELECT COUNT(*) FROM rf_terminated") == 2
    })
    .await;
    let mut dead = take(&node, "/queue/ledger-dead", 2, Duration::from_secs(10)).await;
    dead.sort();
    let mut wanted = vec![big.clone(), malformed.clone()];
    wanted.sort();
    assert_eq!(
        dead, wanted,
        "both poison messages in the dead-letter queue"
    );
    assert_eq!(
        drained(&node, QUEUE).await,
        Some((0, 0)),
        "nothing left to redeliver"
    );
    assert_eq!(
        pair.receiver_count(&format!(
            "SELECT COUNT(*) FROM rf_terminated WHERE message_id IN ('{big}', '{malformed}') \
             AND stream = '/queue/ledger'"
        )),
        2
    );
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM rf_terminated WHERE error LIKE '413%'"),
        1,
        "the 413 recorded with its status"
    );
    assert_eq!(
        receiver.metrics().inbox_terminated.get(),
        2,
        "each terminated once"
    );
    consumer.shutdown().await;
    receiver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_and_connection_strings_are_refused_at_start_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let key = "c2VjcmV0a2V5PQ==";
    for (url, wanted) in [
        ("amqp://alice:hunter2@broker:99999//queue/ledger", "port"),
        ("amqp://alice:hunter2@broker:5672", "address"),
        ("amqp://alice@broker:5672/ledger", "password"),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0a2V5PQ==",
            "EntityPath",
        ),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=c2VjcmV0a2V5PQ==;EntityPath=ledger",
            "SharedAccessKeyName",
        ),
        (
            "Endpoint=https://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0a2V5PQ==;EntityPath=ledger",
            "Endpoint",
        ),
    ] {
        let mut config = sender_config(Duration::from_millis(50));
        config.destinations.insert(
            "ledger".into(),
            DestinationConfig::new(url, Secret::generate().to_whsec()),
        );
        let outbox = Outbox::new(config, &db);
        let error = Dispatcher::builder(&outbox)
            .start()
            .err()
            .expect("refused at start")
            .to_string();
        assert!(
            error.starts_with("destination `ledger`: `url`: "),
            "{error}"
        );
        assert!(error.contains(wanted), "{url}: {error}");
        assert!(
            !error.contains("hunter2") && !error.contains(key) && !error.contains(url),
            "{error}"
        );
    }
    // A well-formed connection string is taken (its broker is not reached
    // here: the dispatcher connects on the first message).
    let mut config = sender_config(Duration::from_millis(50));
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0a2V5PQ==;EntityPath=ledger",
            Secret::generate().to_whsec(),
        ),
    );
    let outbox = Outbox::new(config, &db);
    let dispatcher = Dispatcher::builder(&outbox).start().expect("taken");
    dispatcher.shutdown().await;

    support::create_ledger_table(&dir.path().join("receiver.db"));
    let receiver = Receiver::builder(Config::default(), dir.path().join("receiver.db"))
        .build()
        .expect("receiver");
    let error = AmqpConsumer::builder(receiver.clone(), "amqp://alice:hunter2@broker:5672/")
        .spawn()
        .expect_err("refused")
        .to_string();
    assert!(error.starts_with("amqp url: "), "{error}");
    assert!(error.contains("address"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
    let error = AmqpConsumer::builder(
        receiver.clone(),
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=listen;EntityPath=ledger",
    )
    .spawn()
    .expect_err("refused")
    .to_string();
    assert!(error.contains("`SharedAccessKey`"), "{error}");
    receiver.shutdown().await;
}

/// The child process of the kill test: set by the parent, read by the child.
const CHILD_ENV: &str = "RFIDL_AMQP_TEST_CHILD";

/// A ledger whose `Credit` writes its row and a marker file, then blocks
/// (the parent kills the process meanwhile).
struct SlowLedger {
    marker: PathBuf,
}

impl rfidl_runtime::receiver::HostedService for SlowLedger {
    fn interfaces(&self) -> &[rfidl_runtime::receiver::HostedInterface] {
        const HOSTED: &[rfidl_runtime::receiver::HostedInterface] =
            &[rfidl_runtime::receiver::HostedInterface {
                interface: support::INTERFACE,
                version: 1,
                fingerprint: support::FINGERPRINT,
                endpoints: &["Credit"],
                manifest_json: r#"{"interface":"test.Ledger","version":1}"#,
            }];
        HOSTED
    }

    fn handle(
        &self,
        call: &rfidl_runtime::receiver::IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, rfidl_runtime::receiver::HandlerError> {
        tx.execute(
            "INSERT INTO ledger (message_id, account, amount) VALUES (?1, 'slow', 1)",
            [call.message_id],
        )?;
        std::fs::write(&self.marker, call.message_id).expect("marker");
        std::thread::sleep(Duration::from_secs(30));
        Ok(json!({}))
    }
}

/// Not a test of its own: the body of the child process that
/// `a_consumer_killed_inside_…` starts (this test binary, re-executed with
/// [`CHILD_ENV`] set) and SIGKILLs. Without the variable it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_consumer_of_the_amqp_kill_test() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec: serde_json::Value = serde_json::from_str(&spec).expect("child spec");
    let text = |key: &str| spec[key].as_str().expect(key).to_owned();
    let secret = Secret::parse(&text("secret")).expect("secret");
    let db = PathBuf::from(text("db"));
    let receiver = Receiver::builder(support::receiver_config(&[&secret]), &db)
        .service(SlowLedger {
            marker: PathBuf::from(text("marker")),
        })
        .build()
        .expect("receiver");
    let _consumer = AmqpConsumer::builder(receiver, &text("url"))
        .spawn()
        .expect("consumer");
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the parent did not kill this child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_inside_its_handlers_transaction_leaves_the_message_to_the_next() {
    let Some(node) = RabbitNode::start() else {
        return;
    };
    let pair = Pair::new(&node);
    let marker = pair.dir.path().join("in-handler");
    let spec = json!({
        "url": pair.url,
        "db": pair.receiver_db,
        "secret": pair.secret.to_whsec(),
        "marker": marker,
    });
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "amqp::child_consumer_of_the_amqp_kill_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("child process");
    let id = Uuid::now_v7().to_string();
    let (headers, body) = signed(
        &id,
        "Credit",
        json!({"account": "k", "amount": 3}),
        &pair.secret,
    );
    send_raw(&pair.url, "/queue/ledger", &headers, &body, &id).await;
    wait_until("the child's handler runs", Duration::from_secs(30), || {
        marker.exists()
    })
    .await;
    // SIGKILL inside the handler's transaction.
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM ledger"),
        0,
        "rolled back"
    );
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM inbox_messages"),
        0
    );

    // The connection died with the process: the broker delivers the
    // unsettled message to the next consumer, which processes it once.
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    wait_until("redelivered and processed", Duration::from_secs(20), || {
        pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1
    })
    .await;
    assert_eq!(drained(&node, QUEUE).await, Some((0, 0)));
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM ledger"),
        1,
        "one effect"
    );
    assert_eq!(
        pair.ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    consumer.shutdown().await;
    receiver.shutdown().await;
}

/// Writes each answer's balance into the sender's `answers` table.
#[derive(Default)]
struct Balances {
    calls: std::sync::atomic::AtomicU32,
}

struct BalancesHandler(Arc<Balances>);

impl rfidl_runtime::responses::ResponseHandler for BalancesHandler {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle(
        &self,
        answer: &rfidl_runtime::responses::Answer<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<(), rfidl_runtime::receiver::HandlerError> {
        self.0
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tx.execute(
            "INSERT INTO answers (message_id, balance) VALUES (?1, ?2)",
            rusqlite::params![answer.message_id, answer.payload["balance"].as_i64()],
        )?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_answers_come_back_through_the_broker_and_their_handler_runs_once() {
    let Some(node) = RabbitNode::start() else {
        return;
    };
    let pair = Pair::new(&node);
    rfidl_runtime::store::sqlite::open(&pair.sender_db, rfidl_runtime::Durability::Normal)
        .expect("open")
        .execute_batch("CREATE TABLE answers (message_id TEXT PRIMARY KEY, balance INTEGER)")
        .expect("answers table");
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    let balances = Arc::new(Balances::default());
    let answers = rfidl_runtime::amqp::AmqpAnswersConsumer::builder(
        support::SOURCE,
        &pair.url,
        &pair.sender_db,
    )
    .responses(BalancesHandler(balances.clone()))
    .secret(pair.secret.clone())
    .backoff(Duration::from_millis(20), Duration::from_millis(100))
    .timeout(Duration::from_secs(2))
    .spawn()
    .expect("answers consumer");
    let dispatcher = pair.dispatcher();
    let messages = 50;
    let ids = pair.credits(messages as usize);
    wait_until("every answer handled", Duration::from_secs(20), || {
        pair.sender_count("SELECT COUNT(*) FROM answers") == messages
    })
    .await;
    assert_exactly_once(&pair, messages);
    assert_eq!(
        pair.sender_count(
            "SELECT COUNT(*) FROM outbox_messages WHERE answered_at IS NOT NULL \
             AND json_extract(response, '$.balance') IS NOT NULL"
        ),
        messages,
        "each row keeps its answer and the marker"
    );
    assert_eq!(
        pair.sender_count("SELECT MAX(balance) FROM answers"),
        (0..messages).sum::<i64>()
    );

    // A copy of an answer is only accepted; forgeries (unsigned, or signed
    // with another key) for a row whose answer is not applied (its marker
    // cleared here) are rejected, and the genuine answer after them is
    // applied.
    rusqlite::Connection::open(&pair.sender_db)
        .expect("open")
        .execute_batch(&format!(
            "UPDATE outbox_messages SET answered_at = NULL WHERE message_id = '{id}'; \
             DELETE FROM answers WHERE message_id = '{id}';",
            id = ids[1]
        ))
        .expect("clear the marker");
    let answers_address = format!("/queue/{QUEUE}.answers.{}", support::SOURCE);
    let wrong_key = Secret::generate();
    for (id, signed_with, balance) in [
        (ids[0], Some(&pair.secret), -1),
        (ids[1], None, -2),
        (ids[1], Some(&wrong_key), -3),
        (ids[1], Some(&pair.secret), 4242),
    ] {
        let copy = serde_json::to_vec(&json!({"messageId": id.to_string(), "status": 200,
            "body": {"acknowledged": true, "duplicate": true, "payload": {"balance": balance}}}))
        .expect("json");
        let headers = match signed_with {
            Some(secret) => rfidl_runtime::signing::SignatureHeaders::sign(
                &format!("answer-{id}"),
                rfidl_runtime::signing::unix_now(),
                &copy,
                std::slice::from_ref(secret),
            )
            .to_pairs()
            .to_vec(),
            None => Vec::new(),
        };
        send_raw(
            &pair.url,
            &answers_address,
            &headers,
            &copy,
            &format!("answer-{id}"),
        )
        .await;
    }
    wait_until(
        "the genuine answer applied",
        Duration::from_secs(10),
        || {
            pair.sender_count(&format!(
                "SELECT COUNT(*) FROM answers WHERE message_id = '{}' AND balance = 4242",
                ids[1]
            )) == 1
        },
    )
    .await;
    assert_eq!(
        drained(&node, &format!("{QUEUE}.answers.{}", support::SOURCE)).await,
        Some((0, 0)),
        "every answer settled"
    );
    assert_eq!(
        balances.calls.load(std::sync::atomic::Ordering::SeqCst),
        messages as u32 + 1,
        "the response handler ran once per message (and once more for the cleared marker)"
    );
    assert_eq!(pair.sender_count("SELECT COUNT(*) FROM answers"), messages);
    assert_eq!(
        pair.sender_count("SELECT COUNT(*) FROM answers WHERE balance < 0"),
        0,
        "neither the copy's nor the forgeries' payload was acted on"
    );
    dispatcher.shutdown().await;
    answers.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
}
