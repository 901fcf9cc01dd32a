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

pub(crate) const SUBJECT: &str = "ledger.inbound";

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

    fn consumer(&self, receiver: Receiver) -> ConsumerHandle {
        JetStreamConsumer::builder(receiver, &self.url)
            .durable("ledger")
            .ack_wait(Duration::from_secs(2))
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
            .max_retries(2)
            .timeout(Duration::from_secs(1))
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

/// A broker, a [`Pair`] on it, the pair's receiver and consumer and,
/// when asked for, its dispatcher: the setup most tests share.
struct Running {
    pair: Pair,
    server: NatsServer,
    receiver: Receiver,
    consumer: ConsumerHandle,
    dispatcher: Option<DispatcherHandle>,
}

impl Running {
    /// Starts a `nats-server` (`None` without `RFIDL_NATS_SERVER`), the
    /// pair's receiver with its config changed by `configure`, its
    /// consumer, and with `dispatch` the sender's dispatcher.
    fn start(configure: impl FnOnce(&mut Config), dispatch: bool) -> Option<Self> {
        let server = NatsServer::start()?;
        let pair = Pair::new(&server);
        let mut config = pair.receiver_config();
        configure(&mut config);
        let receiver = pair.receiver(config);
        let consumer = pair.consumer(receiver.clone());
        let dispatcher = dispatch.then(|| pair.dispatcher());
        Some(Self {
            pair,
            server,
            receiver,
            consumer,
            dispatcher,
        })
    }

    /// Shuts down the dispatcher, the consumer and the receiver, in that
    /// order, then removes the files and stops the broker.
    async fn stop(self) {
        if let Some(dispatcher) = self.dispatcher {
            dispatcher.shutdown().await;
        }
        self.consumer.shutdown().await;
        self.receiver.shutdown().await;
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

/// Waits (at most 4 s) until the durable consumer has nothing pending and
/// nothing unacknowledged; returns what it last saw.
pub(crate) async fn drained(server: &NatsServer, durable: &str) -> (u64, usize) {
    let mut backlog = consumer_backlog(server, durable).await;
    for _ in 0..200 {
        if backlog == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        backlog = consumer_backlog(server, durable).await;
    }
    backlog
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
    let Some(running) = Running::start(|_| {}, true) else {
        return;
    };
    let (server, pair) = (&running.server, &running.pair);
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
    let backlog = drained(server, "ledger").await;
    assert_eq!(backlog, (0, 0), "every message acknowledged");
    assert_exactly_once(pair, 200);
    assert_eq!(
        pair.ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
        200
    );
    eprintln!("jetstream: 200 messages delivered exactly once in {elapsed:?}");
    running.stop().await;
}

/// A client of the test's server, for publishing by hand.
pub(crate) async fn jetstream(server: &NatsServer) -> async_nats::jetstream::Context {
    let client = async_nats::connect(format!("127.0.0.1:{}", server.port()))
        .await
        .expect("connect");
    async_nats::jetstream::new(client)
}

/// Publishes `body` with `headers` and `Nats-Msg-Id = msg_id` to the
/// pair's subject, retrying while the stream does not exist yet (the
/// consumer creates it as it starts); returns the stream's acknowledgement.
pub(crate) async fn publish_raw(
    context: &async_nats::jetstream::Context,
    headers: &[(&str, String)],
    body: &[u8],
    msg_id: &str,
) -> async_nats::jetstream::publish::PublishAck {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut map = async_nats::HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, value.as_str());
        }
        map.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
        let ack = match context
            .publish_with_headers(SUBJECT, map, body.to_vec().into())
            .await
        {
            Ok(future) => future.await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match ack {
            Ok(ack) => return ack,
            Err(error) => {
                assert!(Instant::now() < deadline, "cannot publish: {error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// An envelope of `endpoint` signed with `secret` now: (headers, body).
pub(crate) fn signed(
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

/// Publishes a message of `endpoint` with `payload` under a fresh id,
/// signed with `secret` now (see [`signed`] and [`publish_raw`]); returns
/// the id.
async fn publish_signed(
    context: &async_nats::jetstream::Context,
    endpoint: &str,
    payload: serde_json::Value,
    secret: &Secret,
) -> String {
    let id = Uuid::now_v7().to_string();
    let (headers, body) = signed(&id, endpoint, payload, secret);
    publish_raw(context, &headers, &body, &id).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_terminated_recorded_and_not_redelivered() {
    let Some(running) = Running::start(|config| config.inbox.body_limit = 4_096, false) else {
        return;
    };
    let (server, pair) = (&running.server, &running.pair);
    let metrics = running.receiver.metrics().clone();
    let context = jetstream(server).await;

    // 401, counted: terminated after max_retries (2) + 1 deliveries.
    publish_signed(
        &context,
        "Credit",
        json!({"account": "p", "amount": 1}),
        &Secret::generate(),
    )
    .await;
    // 404: no such endpoint.
    publish_signed(&context, "Refund", json!({}), &pair.secret).await;
    // 413: larger than inbox.body_limit.
    publish_signed(
        &context,
        "Credit",
        json!({"account": "x".repeat(8_000), "amount": 1}),
        &pair.secret,
    )
    .await;
    // 400: not an envelope (signed, so the signature passes).
    let id = Uuid::now_v7().to_string();
    let body = b"{\"not\": \"an envelope\"".to_vec();
    let headers = rfidl_runtime::signing::SignatureHeaders::sign(
        &id,
        rfidl_runtime::signing::unix_now(),
        &body,
        std::slice::from_ref(&pair.secret),
    )
    .to_pairs()
    .to_vec();
    publish_raw(&context, &headers, &body, &id).await;
    // 422: the handler says poison.
    publish_signed(&context, "Poison", json!({}), &pair.secret).await;
    // And a good message behind them all.
    publish_signed(
        &context,
        "Credit",
        json!({"account": "ok", "amount": 7}),
        &pair.secret,
    )
    .await;

    wait_until("5 terminated, 1 processed", Duration::from_secs(10), || {
        pair.receiver_count("SELECT COUNT(*) FROM rf_terminated") == 5
            && pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1
    })
    .await;
    let errors: Vec<String> = {
        let conn = rusqlite::Connection::open(&pair.receiver_db).expect("open");
        let mut statement = conn
            .prepare("SELECT error FROM rf_terminated ORDER BY stream_sequence")
            .expect("prepare");
        statement
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    for (error, wanted) in errors.iter().zip([
        "401 bad_signature",
        "404 unknown_endpoint",
        "413 payload_too_large",
        "400 malformed_envelope",
        "422 poison",
    ]) {
        assert!(error.starts_with(wanted), "{error} (wanted {wanted})");
    }
    assert!(errors[0].contains("delivered 3 times"), "{}", errors[0]);
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM rf_terminated WHERE subject = 'ledger.inbound' AND message_id IS NOT NULL"),
        5
    );
    // Nothing left for the consumer, and nothing comes back after ack_wait.
    let backlog = drained(server, "ledger").await;
    assert_eq!(backlog, (0, 0));
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    assert_eq!(metrics.inbox_terminated.get(), 5, "each terminated once");
    assert_eq!(
        metrics.inbox_signature_failures.get(),
        3,
        "the bad signature was delivered 3 times, then never again"
    );
    assert_eq!(pair.receiver_count("SELECT COUNT(*) FROM ledger"), 1);
    assert!(
        metrics
            .render(&Default::default())
            .contains("rf_inbox_terminated_total 5\n")
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republish_is_dropped_by_the_stream_and_a_late_copy_by_the_inbox() {
    let Some(running) = Running::start(|_| {}, false) else {
        return;
    };
    let (server, pair, receiver) = (&running.server, &running.pair, &running.receiver);
    let context = jetstream(server).await;
    let id = Uuid::now_v7().to_string();
    let (headers, body) = signed(
        &id,
        "Credit",
        json!({"account": "d", "amount": 5}),
        &pair.secret,
    );
    let first = publish_raw(&context, &headers, &body, &id).await;
    let second = publish_raw(&context, &headers, &body, &id).await;
    assert!(!first.duplicate);
    assert!(second.duplicate, "the same Nats-Msg-Id inside the window");
    assert_eq!(first.sequence, second.sequence);
    let mut stream = context
        .get_stream("RF_ledger_inbound")
        .await
        .expect("stream");
    assert_eq!(
        stream.info().await.expect("info").state.last_sequence,
        first.sequence,
        "one stream message"
    );
    assert_eq!(
        stream.info().await.expect("info").config.retention,
        async_nats::jetstream::stream::RetentionPolicy::WorkQueue
    );
    assert_eq!(
        stream.info().await.expect("info").config.duplicate_window,
        rfidl_runtime::nats::DUPLICATE_WINDOW
    );
    wait_until("processed", Duration::from_secs(5), || {
        pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1
    })
    .await;

    // Outside the window the stream no longer knows the id: shrink the
    // window, let it pass, publish the very same message again.
    let mut config = stream.info().await.expect("info").config.clone();
    config.duplicate_window = Duration::from_millis(100);
    context.update_stream(config).await.expect("update stream");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = publish_raw(&context, &headers, &body, &id).await;
    assert!(!late.duplicate, "outside the window the stream takes it");
    assert_eq!(late.sequence, first.sequence + 1, "a second stream message");
    let backlog = drained(server, "ledger").await;
    assert_eq!(
        backlog,
        (0, 0),
        "the late copy was delivered and acknowledged"
    );
    // Acknowledged messages leave the work queue.
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = stream.info().await.expect("info").state.messages;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0, "nothing left in the stream");
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM ledger"),
        1,
        "one effect"
    );
    assert_eq!(
        pair.ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(
        receiver.metrics().inbox_duplicates.get(),
        1,
        "the inbox answered the copy"
    );
    running.stop().await;
}

/// A copy the stream takes again (under another `Nats-Msg-Id`) is a
/// duplicate for the inbox, logged once at `warn` with its id and source as
/// over HTTP (issue 30). One thread: the consumer's tasks run where the
/// log is captured.
#[tokio::test]
async fn a_duplicate_through_the_consumer_is_logged_once() {
    let (logged, _guard) = crate::duplicate_log::Logged::start();
    let Some(running) = Running::start(|_| {}, false) else {
        return;
    };
    let context = jetstream(&running.server).await;
    let id = Uuid::now_v7().to_string();
    let (headers, body) = signed(
        &id,
        "Credit",
        json!({"account": "d", "amount": 5}),
        &running.pair.secret,
    );
    for copy in 0..3 {
        publish_raw(&context, &headers, &body, &format!("{id}-{copy}")).await;
    }
    wait_until("two copies answered", Duration::from_secs(10), || {
        running.receiver.metrics().inbox_duplicates.get() == 2
    })
    .await;
    assert_eq!(
        running.pair.receiver_count("SELECT COUNT(*) FROM ledger"),
        1
    );
    let lines = logged.duplicate_lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    crate::duplicate_log::assert_one_line_for(&lines, &id);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_killed_and_restarted_mid_stream_loses_nothing_and_duplicates_no_effect() {
    let Some(mut running) = Running::start(|_| {}, true) else {
        return;
    };
    let Running {
        ref mut server,
        ref pair,
        ..
    } = running;
    let messages = 400;
    pair.credits(messages as usize);
    wait_until(
        "some effects before the kill",
        Duration::from_secs(10),
        || pair.receiver_count("SELECT COUNT(*) FROM ledger") >= 40,
    )
    .await;
    server.kill();
    let at_kill = pair.receiver_count("SELECT COUNT(*) FROM ledger");
    let sent_at_kill =
        pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'");
    // Down for a moment: publishes fail (retryable, not counted).
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart_same_store();
    let recovered = wait_until(
        "every row Sent and every effect once after the restart",
        Duration::from_secs(30),
        || {
            pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
                == messages
                && pair.receiver_count("SELECT COUNT(*) FROM ledger") >= messages
        },
    )
    .await;
    let backlog = drained(server, "ledger").await;
    assert_eq!(backlog, (0, 0), "everything acknowledged after the restart");
    assert_exactly_once(pair, messages);
    assert_eq!(
        pair.sender_count("SELECT MAX(retry_count) FROM outbox_messages"),
        0,
        "an unreachable broker is not counted against max_retries"
    );
    eprintln!(
        "jetstream restart: killed at {at_kill} effects / {sent_at_kill} Sent of {messages}; \
         all delivered exactly once {recovered:?} after the restart"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_retried_uncounted_and_shows_in_health() {
    // Nothing listens on this port: no nats-server needed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.request_timeout = Duration::from_millis(300);
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(
            format!("nats://svc:pa55word@127.0.0.1:{port}/{SUBJECT}"),
            Secret::generate().to_whsec(),
        ),
    );
    let outbox = Outbox::new(config, &db);
    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
    let mut conn =
        rfidl_runtime::store::sqlite::open(&db, rfidl_runtime::Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    for i in 0..5 {
        outbox
            .enqueue(
                &tx,
                message("ledger", "Credit", json!({"account": "u", "amount": i})),
            )
            .expect("enqueue");
    }
    tx.commit().expect("commit");
    let diagnostics = rfidl_runtime::diagnostics::Diagnostics::builder(&db)
        .outbox(&outbox)
        .build()
        .expect("diagnostics");
    let (url, _server) = support::serve(diagnostics.router()).await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let health = loop {
        let health: serde_json::Value = client
            .get(format!("{url}/_rf/health"))
            .send()
            .await
            .expect("health")
            .json()
            .await
            .expect("json");
        if health["reasons"]
            .to_string()
            .contains("destination `ledger` unreachable")
        {
            break health;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never shown unreachable: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(health["status"], "warning", "{health}");
    assert!(!health.to_string().contains("pa55word"), "{health}");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')"
        ),
        5
    );
    assert_eq!(
        count(&db, "SELECT MAX(retry_count) FROM outbox_messages"),
        0,
        "not counted"
    );
    let errors = count(
        &db,
        "SELECT COUNT(*) FROM outbox_messages WHERE last_error LIKE '%cannot connect%' \
         AND last_error NOT LIKE '%pa55word%'",
    );
    assert!(errors >= 1, "the cause is kept, without the password");
    dispatcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_nats_url_is_a_configuration_error_naming_the_field_not_the_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    for (url, wanted) in [
        ("nats://alice:hunter2@broker:99999/ledger", "invalid port"),
        ("nats://alice:hunter2@broker:4222", "no subject"),
        ("nats://alice:hunter2@broker:4222/led ger", "dot-separated"),
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
        assert!(error.contains(wanted), "{error}");
        assert!(
            !error.contains("hunter2") && !error.contains(url),
            "{error}"
        );
    }
    support::create_ledger_table(&dir.path().join("receiver.db"));
    let receiver = Receiver::builder(Config::default(), dir.path().join("receiver.db"))
        .build()
        .expect("receiver");
    let error =
        JetStreamConsumer::builder(receiver.clone(), "nats://alice:hunter2@broker:4222/a.*")
            .spawn()
            .expect_err("refused")
            .to_string();
    assert!(error.starts_with("nats url: "), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
    let error = JetStreamConsumer::builder(receiver.clone(), "nats://127.0.0.1:4222/ledger")
        .durable("a.b")
        .spawn()
        .expect_err("refused")
        .to_string();
    assert!(error.starts_with("durable: "), "{error}");
    receiver.shutdown().await;
}

/// The child process of the kill test: set by the parent, read by the child.
const CHILD_ENV: &str = "RFIDL_NATS_TEST_CHILD";

/// A ledger whose `Credit` leaves a marker file, then blocks (the parent
/// kills the process meanwhile), then would write its row.
struct SlowLedger {
    marker: PathBuf,
    delay: Duration,
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
        std::thread::sleep(self.delay);
        Ok(json!({}))
    }
}

/// Not a test of its own: the body of the child process that
/// `a_consumer_killed_mid_handler_…` starts (this test binary, re-executed
/// with [`CHILD_ENV`] set) and SIGKILLs. Without the variable it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_consumer_of_the_kill_test() {
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
            delay: Duration::from_secs(30),
        })
        .build()
        .expect("receiver");
    let _consumer = JetStreamConsumer::builder(receiver, &text("url"))
        .durable("ledger")
        .ack_wait(Duration::from_secs(2))
        .spawn()
        .expect("consumer");
    // Killed by the parent long before this ends.
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the parent did not kill this child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_handler_leaves_the_message_to_the_next_which_processes_it_once() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
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
            "nats::child_consumer_of_the_kill_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("child process");
    let context = jetstream(&server).await;
    publish_signed(
        &context,
        "Credit",
        json!({"account": "k", "amount": 3}),
        &pair.secret,
    )
    .await;
    wait_until("the child's handler runs", Duration::from_secs(20), || {
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

    // A new consumer on the same database and durable: the unacknowledged
    // message comes back after ack_wait and is processed once.
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    wait_until("redelivered and processed", Duration::from_secs(10), || {
        pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1
    })
    .await;
    let backlog = drained(&server, "ledger").await;
    assert_eq!(backlog, (0, 0));
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
async fn command_answers_come_back_and_their_handler_runs_once() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
    rfidl_runtime::store::sqlite::open(&pair.sender_db, rfidl_runtime::Durability::Normal)
        .expect("open")
        .execute_batch("CREATE TABLE answers (message_id TEXT PRIMARY KEY, balance INTEGER)")
        .expect("answers table");
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    let balances = Arc::new(Balances::default());
    let answers =
        rfidl_runtime::nats::AnswersConsumer::builder(support::SOURCE, &pair.url, &pair.sender_db)
            .responses(BalancesHandler(balances.clone()))
            .secret(pair.secret.clone())
            .ack_wait(Duration::from_secs(2))
            .timeout(Duration::from_secs(1))
            .spawn()
            .expect("answers consumer");
    let dispatcher = pair.dispatcher();
    let messages = 50;
    let ids = pair.credits(messages as usize);
    wait_until("every answer handled", Duration::from_secs(15), || {
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
    // The balances are the receiver's answers: the last processed saw all.
    assert_eq!(
        pair.sender_count("SELECT MAX(balance) FROM answers"),
        (0..messages).sum::<i64>()
    );

    // An answer delivered again (here: published again under another
    // Nats-Msg-Id, so the stream takes it) is only acknowledged.
    // Forgeries (unsigned, or signed with another key) for a row whose
    // answer is not applied (its marker cleared here) are terminated, and
    // the genuine answer after them is applied.
    rusqlite::Connection::open(&pair.sender_db)
        .expect("open")
        .execute_batch(&format!(
            "UPDATE outbox_messages SET answered_at = NULL WHERE message_id = '{id}'; \
             DELETE FROM answers WHERE message_id = '{id}';",
            id = ids[1]
        ))
        .expect("clear the marker");
    let context = jetstream(&server).await;
    let answers_subject = format!("{SUBJECT}.answers.{}", support::SOURCE);
    let wrong_key = Secret::generate();
    for (id, signed_with, balance, msg_id) in [
        (ids[0], Some(&pair.secret), -1, "answer-again"),
        (ids[1], None, -2, "answer-forged"),
        (ids[1], Some(&wrong_key), -3, "answer-wrong-key"),
        (ids[1], Some(&pair.secret), 4242, "answer-genuine"),
    ] {
        let copy = serde_json::to_vec(&json!({"messageId": id.to_string(), "status": 200,
            "body": {"acknowledged": true, "duplicate": true, "payload": {"balance": balance}}}))
        .expect("json");
        let mut headers = async_nats::HeaderMap::new();
        if let Some(secret) = signed_with {
            let signature = rfidl_runtime::signing::SignatureHeaders::sign(
                &format!("answer-{id}"),
                rfidl_runtime::signing::unix_now(),
                &copy,
                std::slice::from_ref(secret),
            );
            for (name, value) in signature.to_pairs() {
                headers.insert(name, value);
            }
        }
        headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
        context
            .publish_with_headers(answers_subject.clone(), headers, copy.into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    wait_until("the genuine answer applied", Duration::from_secs(5), || {
        pair.sender_count(&format!(
            "SELECT COUNT(*) FROM answers WHERE message_id = '{}' AND balance = 4242",
            ids[1]
        )) == 1
    })
    .await;
    let backlog = drained(&server, "rfidl-answers-billing").await;
    assert_eq!(backlog, (0, 0), "the copy was taken and acknowledged");
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

crate::stores::on_each_sqlx_store! {
impl rfidl_runtime::responses::AsyncResponseHandler<Db> for BalancesHandler {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle<'a>(
        &'a self,
        answer: &'a rfidl_runtime::responses::Answer<'a>,
        conn: &'a mut Conn,
    ) -> rfidl_runtime::BoxFuture<'a, Result<(), rfidl_runtime::receiver::HandlerError>> {
        Box::pin(async move {
            self.0
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            sqlx::query("INSERT INTO answers (message_id, balance) VALUES ($1, $2)")
                .bind(answer.message_id)
                .bind(answer.payload["balance"].as_i64())
                .execute(conn)
                .await
                .map_err(rfidl_runtime::receiver::HandlerError::retryable)?;
            Ok(())
        })
    }
}
}

crate::stores::on_every_store!(
    commands_over_jetstream_take_effect_once_and_their_answers_are_handled_once,
    answers_on_every_store
);
async fn answers_on_every_store(store: &crate::stores::TestStore) {
    use crate::stores::TestStore;
    let Some(server) = NatsServer::start() else {
        return;
    };
    let receiver_store = store.another();
    store.execute_dialects(
        "CREATE TABLE answers (message_id TEXT PRIMARY KEY, balance INTEGER)",
        "CREATE TABLE answers (message_id TEXT PRIMARY KEY, balance BIGINT)",
    );
    let secret = Secret::generate();
    let url = server.url(SUBJECT);
    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.request_timeout = Duration::from_secs(1);
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(url.clone(), secret.to_whsec()),
    );
    let outbox_config = config.clone();
    let outbox = store.outbox(config);
    let ledger = Arc::new(Ledger::default());
    let receiver = receiver_store
        .receiver(support::receiver_config(&[&secret]), ledger.clone())
        .expect("receiver");
    let consumer = JetStreamConsumer::builder(receiver.clone(), &url)
        .durable("ledger")
        .ack_wait(Duration::from_secs(2))
        .timeout(Duration::from_secs(1))
        .spawn()
        .expect("consumer");
    let balances = Arc::new(Balances::default());
    let handler = BalancesHandler(balances.clone());
    /// The same on either sqlx store.
    macro_rules! on_sqlx {
        ($database:expr) => {
            rfidl_runtime::nats::AnswersConsumer::builder(support::SOURCE, &url, $database)
                .secret(secret.clone())
                .responses(handler)
                .timeout(Duration::from_secs(1))
                .spawn()
        };
    }
    let answers = match store {
        TestStore::Sqlite { path, .. } => {
            rfidl_runtime::nats::AnswersConsumer::for_destination(&outbox_config, "ledger", path)
                .expect("configured")
                .responses(handler)
                .timeout(Duration::from_secs(1))
                .spawn()
        }
        TestStore::Postgres { store, .. } => on_sqlx!(store),
        TestStore::SqlxSqlite { store, .. } => on_sqlx!(store),
    }
    .expect("answers consumer");
    let dispatcher = store.dispatcher(&outbox).start().expect("dispatcher");
    let messages = 50;
    store.enqueue_many(
        &outbox,
        (0..messages)
            .map(|i| message("ledger", "Credit", json!({"account": "s", "amount": i})))
            .collect(),
    );
    // And one that will never succeed: terminated into the receiver's database.
    let context = jetstream(&server).await;
    let poison = publish_signed(&context, "Refund", json!({}), &secret).await;
    wait_until("every answer handled", Duration::from_secs(15), || {
        store.count("SELECT COUNT(*) FROM answers") == messages
            && receiver_store.count("SELECT COUNT(*) FROM rf_terminated") == 1
    })
    .await;
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        messages
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        messages
    );
    assert_eq!(
        store.count(
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent' AND answered_at IS NOT NULL"
        ),
        messages
    );
    // Each answer carries the receiver's response (a balance; concurrent
    // PostgreSQL writers do not see each other's rows, so no total here).
    assert_eq!(
        store.count("SELECT COUNT(*) FROM answers WHERE balance IS NOT NULL"),
        messages
    );
    assert_eq!(
        receiver_store.count(&format!(
            "SELECT COUNT(*) FROM rf_terminated WHERE message_id = '{poison}' \
             AND error LIKE '404 unknown_endpoint%'"
        )),
        1
    );
    assert_eq!(
        balances.calls.load(std::sync::atomic::Ordering::SeqCst),
        messages as u32
    );
    assert_eq!(drained(&server, "ledger").await, (0, 0));
    assert_eq!(drained(&server, "rfidl-answers-billing").await, (0, 0));
    dispatcher.shutdown().await;
    answers.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_for_the_broker_is_dead_lettered_and_a_deleted_stream_is_created_again() {
    let Some(running) = Running::start(|_| {}, true) else {
        return;
    };
    let (server, pair) = (&running.server, &running.pair);
    // nats-server's default max_payload is 1 MiB.
    let ids = pair.enqueue(vec![
        message(
            "ledger",
            "Credit",
            json!({"account": "x".repeat(1_200_000), "amount": 1}),
        ),
        message("ledger", "Credit", json!({"account": "small", "amount": 1})),
    ]);
    wait_until(
        "one dead letter, one effect",
        Duration::from_secs(10),
        || {
            pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'DeadLetter'")
                == 1
                && pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1
        },
    )
    .await;
    assert_eq!(
        pair.sender_count(&format!(
            "SELECT COUNT(*) FROM outbox_messages WHERE message_id = '{}' \
             AND last_error LIKE '413 payload_too_large%'",
            ids[0]
        )),
        1
    );

    // The stream deleted under both sides: created again, nothing lost.
    jetstream(server)
        .await
        .delete_stream("RF_ledger_inbound")
        .await
        .expect("delete stream");
    pair.credits(5);
    wait_until(
        "delivered after the stream came back",
        Duration::from_secs(15),
        || {
            pair.receiver_count("SELECT COUNT(*) FROM ledger") == 6
                && pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
                    == 6
        },
    )
    .await;
    assert_eq!(
        pair.receiver_count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        6
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_on_one_durable_share_the_messages_and_each_takes_effect_once() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
    // Two replicas of the receiving service on one database, one durable.
    let first = pair.receiver(pair.receiver_config());
    let other_ledger = Arc::new(Ledger::default());
    let second = Receiver::builder(pair.receiver_config(), &pair.receiver_db)
        .service(LedgerService(other_ledger.clone()))
        .build()
        .expect("second receiver");
    let consumers = [pair.consumer(first.clone()), pair.consumer(second.clone())];
    let dispatcher = pair.dispatcher();
    let messages = 300;
    pair.credits(messages as usize);
    wait_until("every effect", Duration::from_secs(20), || {
        pair.receiver_count("SELECT COUNT(*) FROM ledger") >= messages
            && pair.sender_count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
                == messages
    })
    .await;
    assert_eq!(drained(&server, "ledger").await, (0, 0));
    assert_exactly_once(&pair, messages);
    let (one, two) = (
        pair.ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
        other_ledger.calls.load(std::sync::atomic::Ordering::SeqCst),
    );
    assert_eq!(
        i64::from(one + two),
        messages,
        "each handler call took effect"
    );
    assert!(
        one > 0 && two > 0,
        "both replicas took messages: {one} + {two}"
    );
    eprintln!("jetstream replicas: {one} + {two} of {messages}");
    dispatcher.shutdown().await;
    for consumer in consumers {
        consumer.shutdown().await;
    }
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_ack_wait_keeps_its_message_and_is_not_redelivered() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
    let receiver = Receiver::builder(pair.receiver_config(), &pair.receiver_db)
        .service(SlowLedger {
            marker: pair.dir.path().join("in-handler"),
            delay: Duration::from_millis(2_500),
        })
        .build()
        .expect("receiver");
    let consumer = JetStreamConsumer::builder(receiver.clone(), &pair.url)
        .durable("ledger")
        .ack_wait(Duration::from_secs(1))
        .timeout(Duration::from_secs(1))
        .spawn()
        .expect("consumer");
    let context = jetstream(&server).await;
    publish_signed(
        &context,
        "Credit",
        json!({"account": "slow", "amount": 1}),
        &pair.secret,
    )
    .await;
    wait_until("processed", Duration::from_secs(10), || {
        pair.receiver_count("SELECT COUNT(*) FROM ledger") == 1
    })
    .await;
    assert_eq!(drained(&server, "ledger").await, (0, 0));
    let mut durable: async_nats::jetstream::consumer::PullConsumer = context
        .get_consumer_from_stream("ledger", "RF_ledger_inbound")
        .await
        .expect("consumer");
    let info = durable.info().await.expect("info");
    assert_eq!(
        info.num_redelivered, 0,
        "kept in progress for 2.5 s with a 1 s ack_wait"
    );
    assert_eq!(info.delivered.consumer_sequence, 1, "delivered once");
    assert_eq!(receiver.metrics().inbox_duplicates.get(), 0);
    consumer.shutdown().await;
    receiver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_in_the_stream_longer_than_the_signature_tolerance_is_processed() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
    let mut config = pair.receiver_config();
    config.inbox.signature_tolerance = Duration::from_secs(1);
    // Published (signed now) while no consumer runs; it waits 2.5 s.
    let context = jetstream(&server).await;
    async_nats::jetstream::Context::get_or_create_stream(
        &context,
        async_nats::jetstream::stream::Config {
            name: "RF_ledger_inbound".into(),
            subjects: vec![SUBJECT.into(), format!("{SUBJECT}.>")],
            ..Default::default()
        },
    )
    .await
    .expect("stream");
    let waited = publish_signed(
        &context,
        "Credit",
        json!({"account": "w", "amount": 1}),
        &pair.secret,
    )
    .await;
    // Signed long before it was stored: a replay, refused (waits, uncounted).
    let replayed = Uuid::now_v7().to_string();
    let body_old = serde_json::to_vec(&support::envelope(
        &replayed,
        "Credit",
        json!({"account": "r", "amount": 1}),
    ))
    .expect("json");
    let old_headers = rfidl_runtime::signing::SignatureHeaders::sign(
        &replayed,
        rfidl_runtime::signing::unix_now() - 3_600,
        &body_old,
        std::slice::from_ref(&pair.secret),
    )
    .to_pairs()
    .to_vec();
    publish_raw(&context, &old_headers, &body_old, &replayed).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    let receiver = pair.receiver(config);
    let metrics = receiver.metrics().clone();
    let consumer = pair.consumer(receiver.clone());
    wait_until(
        "the waiting message processed",
        Duration::from_secs(10),
        || {
            pair.receiver_count(&format!(
                "SELECT COUNT(*) FROM ledger WHERE message_id = '{waited}'"
            )) == 1
        },
    )
    .await;
    wait_until("the replay refused", Duration::from_secs(10), || {
        metrics.inbox_signature_failures.get() >= 1
    })
    .await;
    assert_eq!(pair.receiver_count("SELECT COUNT(*) FROM ledger"), 1);
    consumer.shutdown().await;
    receiver.shutdown().await;
}

/// With keys issued by the registry (no secret in the sender's config),
/// the answers consumer checks answers against the keys the service signs
/// with, as they are when each answer arrives; before any key is issued it
/// leaves answers in the stream (NAK) instead of refusing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_checked_against_the_issued_keys_and_wait_for_them() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let pair = Pair::new(&server);
    rfidl_runtime::store::sqlite::open(&pair.sender_db, rfidl_runtime::Durability::Normal)
        .expect("open")
        .execute_batch("CREATE TABLE answers (message_id TEXT PRIMARY KEY, balance INTEGER)")
        .expect("answers table");
    let receiver = pair.receiver(pair.receiver_config());
    let consumer = pair.consumer(receiver.clone());
    let keys = rfidl_runtime::keys::IssuedKeys::new();
    let balances = Arc::new(Balances::default());
    let answers =
        rfidl_runtime::nats::AnswersConsumer::builder(support::SOURCE, &pair.url, &pair.sender_db)
            .responses(BalancesHandler(balances.clone()))
            .issued_keys(&keys)
            .ack_wait(Duration::from_secs(2))
            .timeout(Duration::from_secs(1))
            .spawn()
            .expect("answers consumer");
    let dispatcher = pair.dispatcher();
    let messages = 20;
    pair.credits(messages as usize);
    wait_until("every effect", Duration::from_secs(15), || {
        pair.receiver_count("SELECT COUNT(*) FROM ledger") == messages
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pair.sender_count("SELECT COUNT(*) FROM answers"),
        0,
        "no answer applied before the keys are issued"
    );
    // The registry issues the key this service signs with.
    keys.replace(rfidl_runtime::keys::KeySnapshot {
        signing: vec![pair.secret.clone()],
        peers: Default::default(),
    });
    wait_until("every answer applied", Duration::from_secs(15), || {
        pair.sender_count("SELECT COUNT(*) FROM answers") == messages
    })
    .await;
    assert_exactly_once(&pair, messages);
    answers.shutdown().await;
    dispatcher.shutdown().await;
    consumer.shutdown().await;
    receiver.shutdown().await;
}
