//! Durable timers' precision (issue 30, point 4): `RFIDL_BENCH_TIMERS`
//! messages (default 1,000) enqueued with `deliver_at` spread evenly over
//! three seconds, starting one second ahead, on SQLite; a dispatcher with the
//! default 1 s poll and a receiver (`synchronous=FULL`, one ledger row per
//! message) in this process, real HTTP on 127.0.0.1. Reports due → `Sent`
//! (the row's `sent_at` less its due time, after the receiver's answer was
//! recorded) as p50 / p99 / max, and asserts that none left early and that
//! each made one effect.
//!
//! `cargo bench -p rfidl-runtime --bench timers`.

mod common;

use std::time::{Duration, Instant, SystemTime};

use rfidl_runtime::config::{Config, DestinationConfig, Durability};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlite as db;

use common::{Ledger, count, report};

/// Over how long the due times are spread, and how far ahead the first is.
const SPREAD: Duration = Duration::from_secs(3);
const AHEAD: Duration = Duration::from_secs(1);

fn main() {
    let timers: usize = std::env::var("RFIDL_BENCH_TIMERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver_db = dir.path().join("receiver.db");
    let sender_db = dir.path().join("sender.db");
    println!(
        "rfidl-runtime timers benchmark: {timers} timers due over {} s, SQLite",
        SPREAD.as_secs()
    );
    let mut receiver_config = Config::for_service("ledger");
    receiver_config
        .peers
        .insert("bench".into(), vec![secret.to_whsec()]);
    db::open(&receiver_db, Durability::Full)
        .expect("open")
        .execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .expect("table");
    runtime.block_on(async {
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
        let mut sender = Config::for_service("bench");
        sender.destinations.insert(
            "ledger".into(),
            DestinationConfig::new(url, secret.to_whsec()),
        );
        let outbox = Outbox::new(sender, &sender_db);
        let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");

        // Every timer in one transaction, due from AHEAD to AHEAD + SPREAD.
        let first = SystemTime::now() + AHEAD;
        let step = SPREAD / timers as u32;
        {
            let mut conn = db::open(&sender_db, Durability::Normal).expect("open");
            let tx = conn.transaction().expect("tx");
            for n in 0..timers {
                let message = common::message("ledger", n).deliver_at(first + step * n as u32);
                outbox.enqueue(&tx, message).expect("enqueue");
            }
            tx.commit().expect("commit");
        }
        let started = Instant::now();
        while count(
            &sender_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
        ) < timers as i64
        {
            assert!(
                started.elapsed() < AHEAD + SPREAD + Duration::from_secs(30),
                "the timers were not all sent"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        dispatcher.shutdown().await;
        receiver.shutdown().await;
    });

    let conn = rusqlite::Connection::open(&sender_db).expect("open");
    let mut late: Vec<i64> = conn
        .prepare("SELECT sent_at - created_at FROM outbox_messages WHERE status = 'Sent'")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows");
    late.sort_unstable();
    assert_eq!(late.len(), timers);
    assert!(late[0] >= 0, "a timer left {} ms early", -late[0]);
    assert_eq!(
        count(&receiver_db, "SELECT COUNT(*) FROM ledger"),
        timers as i64,
        "one effect per timer"
    );
    let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
    report(
        "due -> Sent, p50 / p99 / max",
        format!("{} / {} / {} ms", at(0.5), at(0.99), late[late.len() - 1]),
    );
}
