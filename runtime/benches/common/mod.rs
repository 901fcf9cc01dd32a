//! What the delivery and peers benchmarks share: the raw insert reference,
//! the message, and the end-to-end exactly-once scenario (c). Included by
//! both with `mod common;` (each uses part of it), and by the backlog
//! benchmark for its [`Ledger`] service and [`count`].

// Each benchmark uses only part of this module.
#![allow(dead_code)]

pub mod sqlx_pg;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rfidl_runtime::MessageType;
use rfidl_runtime::config::{Config, DestinationConfig, Durability};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{
    HandlerError, HostedInterface, HostedService, IncomingCall, Receiver,
};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlite as db;

/// Rows of the raw insert reference.
pub const ROWS: usize = 20_000;
/// Messages of one end-to-end run (c).
pub const DELIVERIES: usize = 20_000;

pub fn report(name: &str, value: String) {
    println!("{name:<66} {value:>16}");
}

pub fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

/// The ceiling the outbox is measured against: one INSERT of a row the size
/// of an outbox row per transaction, nothing else.
pub fn raw_insert_rate(path: &Path, durability: Durability) -> f64 {
    let mut conn = raw_table(path, durability);
    let started = Instant::now();
    raw_inserts(&mut conn, ROWS);
    rate(ROWS, started.elapsed())
}

/// The reference's database: one table of a 36-character key, a body and a
/// time.
pub fn raw_table(path: &Path, durability: Durability) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open");
    db::configure(&conn, durability).expect("pragmas");
    conn.execute_batch(
        "CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT NOT NULL, at INTEGER NOT NULL)",
    )
    .expect("table");
    conn
}

/// `rows` reference inserts of a 300-byte body, one row per transaction.
pub fn raw_inserts(conn: &mut rusqlite::Connection, rows: usize) {
    let body = "x".repeat(300);
    for _ in 0..rows {
        let tx = conn.transaction().expect("tx");
        tx.execute(
            "INSERT INTO t (id, body, at) VALUES (?1, ?2, ?3)",
            rusqlite::params![
                uuid::Uuid::now_v7().to_string(),
                body,
                rfidl_runtime::store::now_ms()
            ],
        )
        .expect("insert");
        tx.commit().expect("commit");
    }
}

/// The message of (c) and (e): a JSON payload of about 250 bytes.
pub fn message(destination: &str, n: usize) -> OutgoingMessage {
    message_with_note(destination, n, 200)
}

/// The same message with its payload padded to exactly `bytes` bytes of
/// JSON, so that peers can be handed the same bytes.
pub fn sized_message(destination: &str, n: usize, bytes: usize) -> OutgoingMessage {
    let bare = serde_json::to_vec(&payload(n, 0)).expect("json").len();
    let message = message_with_note(destination, n, bytes.saturating_sub(bare));
    debug_assert_eq!(
        serde_json::to_vec(&message.payload).expect("json").len(),
        bytes
    );
    message
}

/// The payload of message `n`, with a note of `note` bytes.
pub fn payload(n: usize, note: usize) -> serde_json::Value {
    serde_json::json!({"account": format!("acct-{}", n % 100), "amount": n, "note": "x".repeat(note)})
}

fn message_with_note(destination: &str, n: usize, note: usize) -> OutgoingMessage {
    OutgoingMessage {
        destination: destination.into(),
        message_type: MessageType::Signal,
        interface: "bench.Ledger".into(),
        version: 1,
        fingerprint: "sha256:bench".into(),
        endpoint: "Credit".into(),
        correlation_id: Some(format!("order-{n}")),
        payload: payload(n, note),
        headers: BTreeMap::new(),
        max_retries: None,
        ttl: None,
        deliver_at: None,
    }
}

/// Writes one ledger row per credit, in the delivery's transaction, and
/// notes when in `effects` if it has one (the backlog benchmark keeps none:
/// its memory figure is the runtime's alone).
pub struct Ledger {
    pub effects: Option<Arc<Mutex<Vec<Instant>>>>,
}

impl Ledger {
    /// Notes an effect's time in `effects`, if kept.
    fn note_effect(&self) {
        if let Some(effects) = &self.effects
            && let Ok(mut effects) = effects.lock()
        {
            effects.push(Instant::now());
        }
    }
}

pub const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: "bench.Ledger",
    version: 1,
    fingerprint: "sha256:bench",
    endpoints: &["Credit"],
    manifest_json: "{}",
}];

impl rfidl_runtime::receiver::AsyncHostedService<sqlx::Postgres> for Ledger {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut sqlx::PgConnection,
    ) -> rfidl_runtime::BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            sqlx::query("INSERT INTO ledger (message_id, amount) VALUES ($1, $2)")
                .bind(call.message_id)
                .bind(call.payload["amount"].as_i64().unwrap_or(0))
                .execute(conn)
                .await
                .map_err(HandlerError::retryable)?;
            self.note_effect();
            Ok(serde_json::Value::Null)
        })
    }
}

impl HostedService for Ledger {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        tx.execute(
            "INSERT INTO ledger (message_id, amount) VALUES (?1, ?2)",
            rusqlite::params![
                call.message_id,
                call.payload["amount"].as_i64().unwrap_or(0)
            ],
        )?;
        self.note_effect();
        Ok(serde_json::Value::Null)
    }
}

/// How the pair's receiver is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Http,
    Grpc,
    /// Through NATS JetStream: the sender publishes to a stream of the
    /// server at this `nats://host:port` URL, the receiver consumes it.
    JetStream(&'static str),
    /// Through an R3 JetStream stream (three replicas) of the cluster at
    /// this `nats://host:port,host:port,host:port` URL.
    JetStreamR3(&'static str),
    /// Through AMQP 1.0: the sender sends to a queue of the broker at this
    /// `amqp://user:password@host:port` URL (RabbitMQ 3.x: `/queue/NAME`
    /// addresses), an `AmqpConsumer` takes from it.
    Amqp(&'static str),
}

impl Wire {
    /// Its name, for reports and file names.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Http => "HTTP",
            Wire::Grpc => "gRPC",
            Wire::JetStream(_) => "JetStream",
            Wire::JetStreamR3(_) => "JetStream R3",
            Wire::Amqp(_) => "AMQP 1.0",
        }
    }

    /// Whether a broker sits between sender and receiver (`Sent` means
    /// published, not processed).
    pub fn brokered(self) -> bool {
        !matches!(self, Wire::Http | Wire::Grpc)
    }
}

/// The receiving side of a brokered [`Wire`].
pub enum BrokerConsumer {
    JetStream(rfidl_runtime::nats::ConsumerHandle),
    Amqp(rfidl_runtime::amqp::AmqpConsumerHandle),
}

/// A sender's outbox and a receiver serving on loopback, with their files.
pub struct Pair {
    pub outbox: Outbox,
    pub sender_db: std::path::PathBuf,
    pub receiver_db: std::path::PathBuf,
    pub effects: Arc<Mutex<Vec<Instant>>>,
    pub url: String,
    /// The receiving side of a brokered wire.
    pub consumer: Option<BrokerConsumer>,
}

pub async fn pair(
    dir: &Path,
    name: &str,
    durability: Durability,
    batch_size: u32,
    wire: Wire,
) -> Pair {
    let secret = Secret::generate();
    // Files of their own, even for a second pair of the same kind.
    static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "{name}-{}",
        PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let receiver_db = dir.join(format!("{name}-receiver.db"));
    let mut config = Config::for_service("ledger");
    config.inbox.durability = durability;
    config.peers.insert("bench".into(), vec![secret.to_whsec()]);
    db::open(&receiver_db, durability)
        .expect("open")
        .execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .expect("table");
    let effects = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::builder(config, &receiver_db)
        .service(Ledger {
            effects: Some(effects.clone()),
        })
        .build()
        .expect("receiver");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr");
    let url = match wire {
        Wire::Http => {
            let router = receiver.router();
            tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
            format!("http://{address}")
        }
        Wire::Grpc => {
            let never = std::future::pending::<()>();
            let receiver = receiver.clone();
            tokio::spawn(async move {
                rfidl_runtime::grpc::serve_grpc(receiver, listener, never)
                    .await
                    .expect("serve")
            });
            format!("grpc://{address}")
        }
        // A stream or queue of its own per pair.
        Wire::JetStream(server) => format!("{server}/{}", token(&name)),
        Wire::JetStreamR3(servers) => format!("{servers}/{}?replicas=3", token(&name)),
        Wire::Amqp(broker) => format!("{broker}//queue/{}", token(&name)),
    };
    let consumer = match wire {
        Wire::JetStream(_) | Wire::JetStreamR3(_) => {
            let consumer = rfidl_runtime::nats::JetStreamConsumer::builder(receiver, &url)
                .concurrency(consumer_concurrency(
                    rfidl_runtime::nats::DEFAULT_CONCURRENCY,
                ))
                .spawn()
                .expect("consumer");
            jetstream_ready(&url).await;
            Some(BrokerConsumer::JetStream(consumer))
        }
        Wire::Amqp(_) => {
            let consumer = rfidl_runtime::amqp::AmqpConsumer::builder(receiver, &url)
                .concurrency(consumer_concurrency(
                    rfidl_runtime::amqp::DEFAULT_CONCURRENCY,
                ))
                .spawn()
                .expect("consumer");
            // Its link attaches (and declares the queue) within
            // milliseconds; no client API tells when, so wait a little.
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some(BrokerConsumer::Amqp(consumer))
        }
        Wire::Http | Wire::Grpc => None,
    };
    let sender_db = dir.join(format!("{name}-sender.db"));
    let mut sender = Config::for_service("bench");
    sender.outbox.max_in_flight = 64;
    sender.outbox.batch_size = batch_size;
    sender.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(url.clone(), secret.to_whsec()),
    );
    let outbox = Outbox::new(sender, &sender_db);
    Pair {
        outbox,
        sender_db,
        receiver_db,
        effects,
        url,
        consumer,
    }
}

/// The broker consumers' concurrency: their default, or
/// `RFIDL_BENCH_CONCURRENCY`.
fn consumer_concurrency(default: usize) -> usize {
    std::env::var("RFIDL_BENCH_CONCURRENCY")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A subject or queue name made of `name`: ASCII letters and digits, `_`
/// for anything else.
fn token(name: &str) -> String {
    name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
}

/// Waits until the consumer of `url` (an rfidl `nats://` URL) has created
/// its stream and durable consumer, so that the measured run does not
/// include them (nor a cluster's leader election).
async fn jetstream_ready(url: &str) {
    let (servers, rest) = url
        .strip_prefix("nats://")
        .and_then(|u| u.split_once('/'))
        .expect("a nats:// URL");
    let subject = rest.split('?').next().unwrap_or(rest);
    let stream = format!("RF_{}", subject.replace('.', "_"));
    let servers: Vec<String> = servers.split(',').map(|s| format!("nats://{s}")).collect();
    let client = async_nats::connect(servers).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(stream) = js.get_stream(&stream).await
            && stream
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
                    rfidl_runtime::nats::DEFAULT_DURABLE,
                )
                .await
                .is_ok()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no stream {stream} with its consumer after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn count(path: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(path)
        .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
        .expect("count")
}

pub async fn delivery_rate(dir: &Path, durability: Durability, batch_size: u32, wire: Wire) -> f64 {
    let run = delivery_run(dir, durability, batch_size, wire, message).await;
    rate(DELIVERIES, run.deliver)
}

/// The two phases of one (c) run.
pub struct DeliveryRun {
    /// Enqueuing the backlog of [`DELIVERIES`] messages in one transaction.
    pub enqueue: Duration,
    /// From the dispatcher's start to the last message marked `Sent` (each
    /// one processed by the receiver and committed in its inbox first).
    pub deliver: Duration,
}

/// (c): a backlog of [`DELIVERIES`] messages made by `make`, enqueued in
/// one transaction, then delivered and processed exactly once (checked).
pub async fn delivery_run(
    dir: &Path,
    durability: Durability,
    batch_size: u32,
    wire: Wire,
    make: fn(&str, usize) -> OutgoingMessage,
) -> DeliveryRun {
    let mut pair = pair(
        dir,
        &format!("c-{durability:?}-{batch_size}-{}", wire.name()),
        durability,
        batch_size,
        wire,
    )
    .await;
    let mut conn = db::open(&pair.sender_db, Durability::Normal).expect("open");
    let enqueuing = Instant::now();
    let tx = conn.transaction().expect("tx");
    for n in 0..DELIVERIES {
        pair.outbox
            .enqueue(&tx, make("ledger", n))
            .expect("enqueue");
    }
    tx.commit().expect("commit");
    let enqueue = enqueuing.elapsed();
    let started = Instant::now();
    let dispatcher = Dispatcher::builder(&pair.outbox)
        .start()
        .expect("dispatcher");
    // `RFIDL_BENCH_TRACE=1`: progress every half second (diagnosis).
    let trace = std::env::var_os("RFIDL_BENCH_TRACE").is_some();
    let mut last_trace = Instant::now();
    loop {
        // The handler notes each effect (in its transaction): counting
        // those is free, so the database is read only near the end, and
        // the polling takes no CPU from the run it measures.
        let effects = pair.effects.lock().expect("lock").len();
        if trace && last_trace.elapsed() >= Duration::from_millis(500) {
            last_trace = Instant::now();
            eprintln!(
                "  {:>6.2} s: {} Sent, {effects} effects",
                started.elapsed().as_secs_f64(),
                count(
                    &pair.sender_db,
                    "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'"
                )
            );
        }
        // Every row `Sent` (over a broker that means published) and every
        // effect committed.
        if effects >= DELIVERIES
            && count(
                &pair.sender_db,
                "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
            ) as usize
                == DELIVERIES
            && count(&pair.receiver_db, "SELECT COUNT(*) FROM ledger") as usize == DELIVERIES
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliver = started.elapsed();
    dispatcher.shutdown().await;
    match pair.consumer.take() {
        Some(BrokerConsumer::JetStream(consumer)) => consumer.shutdown().await,
        Some(BrokerConsumer::Amqp(consumer)) => consumer.shutdown().await,
        None => {}
    }
    let effects = count(&pair.receiver_db, "SELECT COUNT(*) FROM ledger");
    assert_eq!(effects as usize, DELIVERIES, "exactly once at {}", pair.url);
    DeliveryRun { enqueue, deliver }
}

#[derive(Clone, Copy, Debug)]
pub enum Fsync {
    /// nats-server's default (`sync_interval` 2 minutes: writes reach the
    /// OS at once, the disk at the next sync).
    Default,
    /// `sync_interval: always`: an fsync after every write.
    Always,
}

/// A `nats-server` with JetStream on a free loopback port, its store in a
/// directory of its own; killed when dropped.
pub struct NatsServer {
    child: Child,
    pub url: String,
}

impl NatsServer {
    pub fn start(binary: &Path, dir: &Path, fsync: Fsync) -> NatsServer {
        // A folder per server: a ports file left by an earlier one must not
        // be read as this one's.
        static SERVERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = dir.join(format!("nats-{fsync:?}-{n}"));
        let store = base.join("store");
        let ports = base.join("ports");
        std::fs::create_dir_all(&store).expect("store dir");
        std::fs::create_dir_all(&ports).expect("ports dir");
        let sync = match fsync {
            Fsync::Default => "",
            Fsync::Always => "  sync_interval: always\n",
        };
        // Port -1: the server picks a free one and writes it to a file in
        // `ports_file_dir` (no race with another process for the port).
        let config = format!(
            "host: 127.0.0.1\nport: -1\nports_file_dir: {ports:?}\njetstream {{\n  store_dir: {store:?}\n{sync}}}\n"
        );
        let config_path = base.join("nats.conf");
        std::fs::write(&config_path, config).expect("config");
        let log = std::fs::File::create(base.join("nats.log")).expect("log");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut server = NatsServer {
            child,
            url: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        server.url = loop {
            let written = std::fs::read_dir(&ports)
                .expect("ports dir")
                .filter_map(Result::ok)
                .find_map(|entry| std::fs::read_to_string(entry.path()).ok());
            if let Some(url) = written.as_deref().and_then(nats_url) {
                break url;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "nats-server exited with {status}; see {}",
                    base.join("nats.log").display()
                );
            }
            assert!(Instant::now() < deadline, "nats-server wrote no ports file");
            std::thread::sleep(Duration::from_millis(20));
        };
        server
    }
}

/// The client URL in a ports file (`{"nats":["nats://127.0.0.1:4222"],…}`).
fn nats_url(ports_file: &str) -> Option<String> {
    let start = ports_file.find("nats://")?;
    let end = ports_file[start..].find('"')?;
    Some(ports_file[start..start + end].to_owned())
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// Where (e)'s receiver runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receiving {
    /// On the sender's tokio runtime: a worker that has just written a
    /// request may find the receiving socket ready itself, with no wake-up.
    SameRuntime,
    /// On a tokio runtime of its own (two workers), as a receiver in
    /// another process: a request's arrival must wake one of its threads.
    OwnRuntime,
}

/// (e): 300 messages one at a time, each committed alone while the
/// dispatcher idles: commit -> the handler's effect, p50 and p99 in ms.
/// `sender` is the sender's `outbox.durability`, and how its enqueuing
/// transactions commit: under `normal` the dispatcher's claim fsyncs (the
/// commit did not), under `full` the commit did and the claim does not.
pub async fn commit_to_effect(
    dir: &Path,
    wire: Wire,
    sender: Durability,
    receiving: Receiving,
) -> (f64, f64) {
    let name = format!("e-{}", wire.name());
    let (pair, receiver_runtime) = match receiving {
        Receiving::SameRuntime => (pair(dir, &name, Durability::Full, 256, wire).await, None),
        Receiving::OwnRuntime => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let dir = dir.to_path_buf();
            let pair = runtime
                .spawn(async move { pair(&dir, &name, Durability::Full, 256, wire).await })
                .await
                .expect("pair");
            (pair, Some(runtime))
        }
    };
    let mut config = pair.outbox.config().clone();
    config.outbox.durability = sender;
    let outbox = Outbox::new(config, &pair.sender_db);
    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
    let mut conn = db::open(&pair.sender_db, sender).expect("open");
    let mut samples = Vec::new();
    for n in 0..300 {
        let before = pair.effects.lock().expect("lock").len();
        let tx = conn.transaction().expect("tx");
        outbox.enqueue(&tx, message("ledger", n)).expect("enqueue");
        tx.commit().expect("commit");
        let committed = Instant::now();
        let effect = loop {
            if let Some(at) = pair.effects.lock().expect("lock").get(before).copied() {
                break at;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        samples.push(effect.duration_since(committed).as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dispatcher.shutdown().await;
    if let Some(runtime) = receiver_runtime {
        runtime.shutdown_background();
    }
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// (c) and (e) over each transport, side by side: HTTP, gRPC, and NATS
/// JetStream (a `nats-server` started here from `RFIDL_NATS_SERVER`, default
/// fsync policy; skipped, loudly, without it). Over JetStream (c) ends when
/// every effect is committed, not at the last publish acknowledgement.
pub fn transports(runtime: &tokio::runtime::Runtime, dir: &Path) {
    let server = std::env::var_os("RFIDL_NATS_SERVER")
        .map(|binary| NatsServer::start(Path::new(&binary), dir, Fsync::Default));
    let mut wires = vec![Wire::Http, Wire::Grpc];
    match &server {
        Some(server) => wires.push(Wire::JetStream(server.url.clone().leak())),
        None => println!("(JetStream transport skipped: RFIDL_NATS_SERVER is not set)"),
    }
    for wire in wires {
        let name = wire.name();
        let rate = runtime.block_on(delivery_rate(dir, Durability::Full, 256, wire));
        report(
            &format!("(c) exactly-once e2e over {name}, receiver Full, batched"),
            format!("{rate:.0} msg/s"),
        );
        for sender in [Durability::Normal, Durability::Full] {
            let (p50, p99) =
                runtime.block_on(commit_to_effect(dir, wire, sender, Receiving::SameRuntime));
            report(
                &format!("(e) commit -> effect over {name}, outbox {sender:?}: p50 / p99"),
                format!("{p50:.2} / {p99:.2} ms"),
            );
        }
    }
}

/// This machine's floor under (e): the same pattern as (e) (one 600-byte
/// message every 5 ms, the receiving side idle in between, sender and
/// receiver on one tokio runtime, loopback) with nothing of rfidl in it.
/// `(tcp, http)`, each `(p50, p99)` in ms: a bare TCP write to the moment
/// the receiving task has read it, and a hyper HTTP/1.1 request (the
/// dispatcher's client for plain `http://`) to the moment an axum handler
/// runs with its body. A floor, not a model of (e): here the sending task
/// runs on a worker the timer woke, which may find the receiving socket
/// ready itself when it next polls (the HTTP figure takes one of two
/// values, about 0.045 or 0.13 ms on the benchmark machine); in (e) the
/// request leaves from a worker the claim's thread has just woken
/// (BENCHMARKS.md, "third pass").
pub async fn loopback_floor() -> ((f64, f64), (f64, f64)) {
    use axum::body::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const SAMPLES: usize = 300;
    let body = vec![b'x'; 600];

    // Bare TCP.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr");
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket.set_nodelay(true).expect("nodelay");
        let mut buffer = [0u8; 600];
        while socket.read_exact(&mut buffer).await.is_ok() {
            if arrived.send(Instant::now()).is_err() {
                break;
            }
        }
    });
    let mut socket = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    socket.set_nodelay(true).expect("nodelay");
    let mut tcp = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let sent = Instant::now();
        socket.write_all(&body).await.expect("write");
        let at = arrivals.recv().await.expect("arrival");
        tcp.push(at.duration_since(sent).as_secs_f64() * 1e3);
    }
    drop(socket);
    let _ = reader.await;

    // hyper -> axum.
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let router = axum::Router::new().route(
        "/receive",
        axum::routing::post(move |body: Bytes| {
            let arrived = arrived.clone();
            async move {
                let _ = arrived.send(Instant::now());
                assert_eq!(body.len(), 600);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (mut client, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let mut http = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let request = hyper::Request::post("/receive")
            .header("host", address.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.clone())))
            .expect("request");
        let sent = Instant::now();
        let response = client.send_request(request).await.expect("send");
        assert_eq!(response.status(), 204);
        let at = arrivals.recv().await.expect("arrival");
        http.push(at.duration_since(sent).as_secs_f64() * 1e3);
    }
    server.abort();
    let summary = |mut samples: Vec<f64>| {
        samples.sort_by(f64::total_cmp);
        (percentile(&samples, 0.5), percentile(&samples, 0.99))
    };
    (summary(tcp), summary(http))
}

/// Prints [`loopback_floor`] beside (e).
pub fn report_loopback_floor(runtime: &tokio::runtime::Runtime) {
    // Sent from a task on the runtime's workers, as the dispatcher's
    // requests are (from `block_on`'s thread hyper's connection task is
    // woken through the runtime's shared queue instead).
    let ((tcp50, tcp99), (http50, http99)) = runtime
        .block_on(async { tokio::spawn(loopback_floor()).await })
        .expect("loopback floor");
    report(
        "(e) floor: bare TCP write -> reading task, 600 B: p50 / p99",
        format!("{tcp50:.3} / {tcp99:.3} ms"),
    );
    report(
        "(e) floor: hyper request -> axum handler, 600 B: p50 / p99",
        format!("{http50:.3} / {http99:.3} ms"),
    );
}
