//! Memory with a large backlog (issue 12, bounded memory): fills the outbox
//! with `RFIDL_BENCH_BACKLOG` pending messages (default 1,000,000), then
//! starts the dispatcher and a receiver in this process (real SQLite files,
//! real HTTP on 127.0.0.1) and samples the process's resident set size every
//! second while the backlog drains. The dispatcher claims at most
//! `outbox.batch_size` rows per round and `outbox.max_in_flight` requests at
//! once, so its memory should not grow with the backlog.
//!
//! `cargo bench -p rfidl-runtime --bench backlog` (or `cargo xtask bench backlog`).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rfidl_runtime::MessageType;
use rfidl_runtime::config::{Config, DestinationConfig, Durability};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlite as db;

use common::{Ledger, count};

/// The resident set size of this process, in MiB (Linux `/proc`).
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() {
    let backlog: usize = std::env::var("RFIDL_BENCH_BACKLOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver_db = dir.path().join("receiver.db");
    let sender_db = dir.path().join("sender.db");
    println!("rfidl-runtime backlog benchmark: {backlog} pending messages");

    // The backlog: every message pending before the dispatcher starts.
    let mut sender = Config::for_service("bench");
    sender.outbox.max_in_flight = 64;
    sender.outbox.batch_size = 256;
    let filled = Instant::now();
    {
        let outbox = Outbox::new(sender.clone(), &sender_db);
        let mut conn = db::open(&sender_db, Durability::Normal).expect("open");
        for chunk in 0..backlog.div_ceil(10_000) {
            let tx = conn.transaction().expect("tx");
            for n in chunk * 10_000..((chunk + 1) * 10_000).min(backlog) {
                outbox
                    .enqueue(
                        &tx,
                        OutgoingMessage {
                            destination: "ledger".into(),
                            message_type: MessageType::Signal,
                            interface: "bench.Ledger".into(),
                            version: 1,
                            fingerprint: "sha256:bench".into(),
                            endpoint: "Credit".into(),
                            correlation_id: None,
                            payload: serde_json::json!({"amount": n, "note": "x".repeat(200)}),
                            headers: BTreeMap::new(),
                            max_retries: None,
                            ttl: None,
                            deliver_at: None,
                        },
                    )
                    .expect("enqueue");
            }
            tx.commit().expect("commit");
        }
    }
    println!(
        "filled in {:.1} s; RSS before the dispatcher starts: {:.1} MiB",
        filled.elapsed().as_secs_f64(),
        rss_mib()
    );

    let mut receiver_config = Config::for_service("ledger");
    receiver_config
        .peers
        .insert("bench".into(), vec![secret.to_whsec()]);
    db::open(&receiver_db, Durability::Full)
        .expect("open")
        .execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .expect("table");
    let samples = runtime.block_on(async {
        let receiver = Receiver::builder(receiver_config, &receiver_db)
            .service(Ledger { effects: None })
            .build()
            .expect("receiver");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let router = receiver.router();
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        sender.destinations.insert(
            "ledger".into(),
            DestinationConfig::new(url, secret.to_whsec()),
        );
        let outbox = Outbox::new(sender, &sender_db);
        let started = Instant::now();
        let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
        let mut samples = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let sent = count(
                &sender_db,
                "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
            );
            let rss = rss_mib();
            println!(
                "t={:>4.0} s  sent={sent:>8}  pending={:>8}  RSS={rss:.1} MiB",
                started.elapsed().as_secs_f64(),
                backlog as i64 - sent
            );
            samples.push((sent, rss));
            if sent as usize >= backlog {
                break;
            }
        }
        dispatcher.shutdown().await;
        receiver.shutdown().await;
        println!(
            "drained {backlog} in {:.1} s ({:.0} msg/s)",
            started.elapsed().as_secs_f64(),
            backlog as f64 / started.elapsed().as_secs_f64()
        );
        samples
    });
    let effects = count(&receiver_db, "SELECT COUNT(*) FROM ledger");
    assert_eq!(effects as usize, backlog, "exactly once");
    let peak = samples.iter().map(|(_, rss)| *rss).fold(0.0, f64::max);
    let first = samples.first().map_or(0.0, |(_, rss)| *rss);
    let last = samples.last().map_or(0.0, |(_, rss)| *rss);
    println!(
        "RSS while draining: first {first:.1} MiB, peak {peak:.1} MiB, last {last:.1} MiB \
         (dispatcher, receiver and the benchmark's own runtime, one process)"
    );
}
