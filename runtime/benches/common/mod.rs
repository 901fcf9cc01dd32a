//! What the delivery and peers benchmarks share: the raw insert reference,
//! the message, and the end-to-end exactly-once scenario (c). Included by
//! both with `mod common;` (each uses part of it).

// Each benchmark uses only part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rfidl_runtime::config::{Config, DestinationConfig, Durability};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{
    HandlerError, HostedInterface, HostedService, IncomingCall, Receiver,
};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::{MessageType, db};

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
    let mut conn = rusqlite::Connection::open(path).expect("open");
    db::configure(&conn, durability).expect("pragmas");
    conn.execute_batch(
        "CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT NOT NULL, at INTEGER NOT NULL)",
    )
    .expect("table");
    let body = "x".repeat(300);
    let started = Instant::now();
    for _ in 0..ROWS {
        let tx = conn.transaction().expect("tx");
        tx.execute(
            "INSERT INTO t (id, body, at) VALUES (?1, ?2, ?3)",
            rusqlite::params![uuid::Uuid::now_v7().to_string(), body, db::now_ms()],
        )
        .expect("insert");
        tx.commit().expect("commit");
    }
    rate(ROWS, started.elapsed())
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
    }
}

/// Writes one ledger row per credit, in the delivery's transaction.
pub struct Ledger {
    pub effects: Arc<Mutex<Vec<Instant>>>,
}

pub const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: "bench.Ledger",
    version: 1,
    fingerprint: "sha256:bench",
    endpoints: &["Credit"],
    manifest_json: "{}",
}];

impl HostedService<rfidl_runtime::Postgres> for Ledger {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &mut ::postgres::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        tx.execute(
            "INSERT INTO ledger (message_id, amount) VALUES ($1, $2)",
            &[
                &call.message_id,
                &call.payload["amount"].as_i64().unwrap_or(0),
            ],
        )?;
        if let Ok(mut effects) = self.effects.lock() {
            effects.push(Instant::now());
        }
        Ok(serde_json::Value::Null)
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
        if let Ok(mut effects) = self.effects.lock() {
            effects.push(Instant::now());
        }
        Ok(serde_json::Value::Null)
    }
}

/// How the pair's receiver is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Http,
    Grpc,
}

/// A sender's outbox and a receiver serving on loopback, with their files.
pub struct Pair {
    pub outbox: Outbox,
    pub sender_db: std::path::PathBuf,
    pub receiver_db: std::path::PathBuf,
    pub effects: Arc<Mutex<Vec<Instant>>>,
    pub url: String,
}

pub async fn pair(
    dir: &Path,
    name: &str,
    durability: Durability,
    batch_size: u32,
    wire: Wire,
) -> Pair {
    let secret = Secret::generate();
    let receiver_db = dir.join(format!("{name}-receiver.db"));
    let mut config = Config {
        service_id: "ledger".into(),
        ..Config::default()
    };
    config.inbox.durability = durability;
    config.peers.insert("bench".into(), vec![secret.to_whsec()]);
    db::open(&receiver_db, durability)
        .expect("open")
        .execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .expect("table");
    let effects = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::builder(config, &receiver_db)
        .service(Ledger {
            effects: effects.clone(),
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
            tokio::spawn(async move {
                rfidl_runtime::grpc::serve_grpc(receiver, listener, never)
                    .await
                    .expect("serve")
            });
            format!("grpc://{address}")
        }
    };
    let sender_db = dir.join(format!("{name}-sender.db"));
    let mut sender = Config {
        service_id: "bench".into(),
        ..Config::default()
    };
    sender.outbox.max_in_flight = 64;
    sender.outbox.batch_size = batch_size;
    sender.destinations.insert(
        "ledger".into(),
        DestinationConfig {
            url: url.clone(),
            urls: Vec::new(),
            secret: secret.to_whsec(),
            ca_file: None,
        },
    );
    let outbox = Outbox::new(sender, &sender_db);
    Pair {
        outbox,
        sender_db,
        receiver_db,
        effects,
        url,
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
    let pair = pair(
        dir,
        &format!("c-{durability:?}-{batch_size}-{wire:?}"),
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
    let dispatcher = Dispatcher::builder(&pair.outbox, &pair.sender_db)
        .start()
        .expect("dispatcher");
    loop {
        let sent = count(
            &pair.sender_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
        );
        if sent as usize == DELIVERIES {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliver = started.elapsed();
    dispatcher.shutdown().await;
    let effects = count(&pair.receiver_db, "SELECT COUNT(*) FROM ledger");
    assert_eq!(effects as usize, DELIVERIES, "exactly once at {}", pair.url);
    DeliveryRun { enqueue, deliver }
}
