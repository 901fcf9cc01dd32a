//! Receiver benchmarks (see BENCHMARKS.md): the inbox duplicate look-up with
//! 1,000,000 rows, and end-to-end receiver throughput over real HTTP on
//! 127.0.0.1 with `synchronous=FULL` commits (group-committed by the writer).
//!
//! `cargo bench -p rfidl-runtime --bench receiver` (or `cargo xtask bench receiver`).
//! `RFIDL_BENCH_INBOX_ROWS` overrides the inbox size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::receiver::{
    HandlerError, HostedInterface, HostedService, IncomingCall, Receiver, Reply,
};
use rfidl_runtime::signing::{Secret, SignatureHeaders, unix_now};
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::store::sqlite::ProcessedMessage;
use rfidl_runtime::store::sqlite::{InboxReader, record_processed};
use rfidl_runtime::{Config, Durability};

const SOURCE: &str = "bench-sender";
const INTERFACE: &str = "bench.Counter";
const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: INTERFACE,
    version: 1,
    fingerprint: "sha256:bench",
    endpoints: &["Add"],
    manifest_json: "{}",
}];

/// Writes one business row per message, as a real handler would.
struct Counter;

impl HostedService for Counter {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        let amount = call.payload["amount"].as_i64().unwrap_or(0);
        tx.prepare_cached("INSERT INTO counter (message_id, amount) VALUES (?1, ?2)")?
            .execute(rusqlite::params![call.message_id, amount])?;
        Ok(serde_json::json!({ "ok": true }))
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    println!(
        "rfidl-runtime receiver benchmarks ({} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("{:<62} {:>14}", "figure", "value");
    inbox_lookup(&dir.path().join("inbox.db"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(receiver_throughput(dir.path()));
}

fn report(name: &str, value: f64, unit: &str) {
    println!("{name:<62} {value:>10.1} {unit}");
}

/// p50 / p99 of `InboxReader::lookup` on a table of N rows, hits and misses.
fn inbox_lookup(path: &std::path::Path) {
    let rows: usize = std::env::var("RFIDL_BENCH_INBOX_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut conn = db::open(path, Durability::Normal).expect("open");
    let digest = [9u8; 32];
    let response = r#"{"ok":true}"#;
    let mut ids = Vec::with_capacity(rows);
    let started = Instant::now();
    let tx = conn.transaction().expect("tx");
    for _ in 0..rows {
        let id = uuid::Uuid::now_v7().to_string();
        record_processed(
            &tx,
            &ProcessedMessage {
                source_service_id: SOURCE,
                message_id: &id,
                endpoint: "Add",
                payload_sha256: &digest,
                response,
                processed_at_ms: 1,
                expires_at_ms: i64::MAX,
            },
        )
        .expect("insert");
        ids.push(id);
    }
    tx.commit().expect("commit");
    eprintln!("  ({rows} inbox rows written in {:?})", started.elapsed());

    let reader = InboxReader::open(path).expect("reader");
    let samples = 200_000;
    let mut hits = Vec::with_capacity(samples);
    let mut misses = Vec::with_capacity(samples);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..samples {
        // xorshift: spread look-ups over the whole key range.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let id = &ids[(state % rows as u64) as usize];
        let t = Instant::now();
        let found = reader.lookup(SOURCE, id).expect("lookup");
        hits.push(t.elapsed());
        assert!(found.is_some());
        let missing = uuid::Uuid::now_v7().to_string();
        let t = Instant::now();
        let found = reader.lookup(SOURCE, &missing).expect("lookup");
        misses.push(t.elapsed());
        assert!(found.is_none());
    }
    let label = if rows == 1_000_000 {
        "1M".to_owned()
    } else {
        rows.to_string()
    };
    for (what, mut times) in [("hit", hits), ("miss", misses)] {
        times.sort();
        let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
        report(
            &format!("inbox look-up ({label} rows), {what}, p50"),
            micros(p(0.50)),
            "µs",
        );
        report(
            &format!("inbox look-up ({label} rows), {what}, p99"),
            micros(p(0.99)),
            "µs",
        );
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Messages per second through `POST /_rf/receive` (many concurrent
/// clients) and `POST /_rf/receive/batch`, with FULL durability.
async fn receiver_throughput(dir: &std::path::Path) {
    let path = dir.join("receiver.db");
    let conn = db::open(&path, Durability::Full).expect("open");
    conn.execute_batch("CREATE TABLE counter (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .expect("table");
    drop(conn);
    let secret = Secret::generate();
    let mut config = Config::default();
    config
        .peers
        .insert(SOURCE.to_owned(), vec![secret.to_whsec()]);
    assert_eq!(config.inbox.durability, Durability::Full);
    let receiver = Receiver::builder(config, &path)
        .service(Counter)
        .build()
        .expect("receiver");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = receiver.router();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let client = reqwest::Client::new();
    let secret = Arc::new(secret);

    let signed = |amount: i64| {
        let id = uuid::Uuid::now_v7().to_string();
        let body = serde_json::json!({
            "messageId": id,
            "sourceServiceId": SOURCE,
            "messageType": "Command",
            "interface": INTERFACE,
            "version": 1,
            "fingerprint": "sha256:bench",
            "endpoint": "Add",
            "payload": {"amount": amount},
        })
        .to_string();
        let headers = SignatureHeaders::sign(
            &id,
            unix_now(),
            body.as_bytes(),
            std::slice::from_ref(&secret),
        );
        (headers, body)
    };

    // Single-message endpoint, 64 concurrent clients.
    let messages = 10_000;
    let clients = 64;
    let prepared: Vec<_> = (0..messages).map(|i| signed(i as i64)).collect();
    let prepared = Arc::new(prepared);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (client, base, prepared, next) = (
            client.clone(),
            base.clone(),
            Arc::clone(&prepared),
            Arc::clone(&next),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((headers, body)) = prepared.get(i) else {
                    return;
                };
                let mut request = client
                    .post(format!("{base}/_rf/receive"))
                    .body(body.clone());
                for (name, value) in headers.to_pairs() {
                    request = request.header(name, value);
                }
                let response = request.send().await.expect("send");
                assert_eq!(response.status(), 200);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    report(
        "receiver, single endpoint, 64 clients, FULL, new messages",
        messages as f64 / started.elapsed().as_secs_f64(),
        "msg/s",
    );

    // The same messages again: every answer is a duplicate from the inbox.
    next.store(0, std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (client, base, prepared, next) = (
            client.clone(),
            base.clone(),
            Arc::clone(&prepared),
            Arc::clone(&next),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((headers, body)) = prepared.get(i) else {
                    return;
                };
                let mut request = client
                    .post(format!("{base}/_rf/receive"))
                    .body(body.clone());
                for (name, value) in headers.to_pairs() {
                    request = request.header(name, value);
                }
                let response = request.send().await.expect("send");
                assert_eq!(response.status(), 200);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    report(
        "receiver, single endpoint, 64 clients, duplicates",
        messages as f64 / started.elapsed().as_secs_f64(),
        "msg/s",
    );

    // Batch endpoint: 50 messages per request (the dispatcher's batch size), 4 clients.
    let batches = 200;
    let per_batch = 50;
    let bodies: Vec<String> = (0..batches)
        .map(|_| {
            let items: Vec<serde_json::Value> = (0..per_batch)
                .map(|i| {
                    let (headers, body) = signed(i);
                    let headers: std::collections::BTreeMap<&str, String> =
                        headers.to_pairs().into_iter().collect();
                    serde_json::json!({"headers": headers, "body": body})
                })
                .collect();
            serde_json::Value::Array(items).to_string()
        })
        .collect();
    let bodies = Arc::new(bodies);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, base, bodies, next) = (
            client.clone(),
            base.clone(),
            Arc::clone(&bodies),
            Arc::clone(&next),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(body) = bodies.get(i) else {
                    return;
                };
                let response = client
                    .post(format!("{base}/_rf/receive/batch"))
                    .body(body.clone())
                    .send()
                    .await
                    .expect("send");
                assert_eq!(response.status(), 200);
                let results: Vec<serde_json::Value> = response.json().await.expect("json");
                assert!(results.iter().all(|r| r["status"] == 200));
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    report(
        "receiver, batch endpoint (50/request), 4 clients, FULL",
        (batches * per_batch as usize) as f64 / started.elapsed().as_secs_f64(),
        "msg/s",
    );

    // Without HTTP: `Receiver::receive` from 256 concurrent tasks, to show
    // what the receiver itself (checks, look-up, writer, FULL group commits)
    // sustains when the network stack is not in the way.
    let direct = 20_000;
    let prepared: Vec<_> = (0..direct).map(|i| signed(i as i64)).collect();
    let prepared = Arc::new(prepared);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..256 {
        let (receiver, prepared, next) =
            (receiver.clone(), Arc::clone(&prepared), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((headers, body)) = prepared.get(i) else {
                    return;
                };
                let mut map = axum::http::HeaderMap::new();
                for (name, value) in headers.to_pairs() {
                    map.insert(name, value.parse().expect("header"));
                }
                let answer = receiver.receive(&map, body.clone().into()).await;
                assert!(matches!(answer, Reply::Acknowledged { .. }), "{answer:?}");
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    report(
        "receiver without HTTP (Receiver::receive), 256 tasks, FULL",
        direct as f64 / started.elapsed().as_secs_f64(),
        "msg/s",
    );

    receiver.shutdown().await;
    server.abort();
    let conn = rusqlite::Connection::open(&path).expect("open");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM counter", [], |r| r.get(0))
        .expect("count");
    assert_eq!(
        rows,
        (messages + batches * per_batch as usize + direct) as i64
    );
}
