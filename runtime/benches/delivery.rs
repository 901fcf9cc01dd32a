//! Runtime benchmarks, side by side in one run (see BENCHMARKS.md):
//! `cargo bench -p rfidl-runtime --bench delivery` (or `cargo xtask bench delivery`).
//!
//! Real SQLite files in a temp dir; real HTTP on 127.0.0.1 where a network
//! is involved. Figures:
//! (ref) raw rusqlite insert rate, one row per transaction;
//! (a) `Outbox::enqueue`, one message per caller transaction;
//! (b) `Outbox::send` with many concurrent callers;
//! (c) messages delivered and processed exactly once per second, outbox ->
//!     dispatcher -> HTTP -> receiver -> inbox, receiver FULL and NORMAL;
//! (d) inbox duplicate-check latency with 1,000,000 inbox rows;
//! (e) latency from the sender's commit to the handler's effect, low load,
//!     and beside it the machine's floor for the same pattern: a bare TCP
//!     write, and a hyper request to an axum handler, with nothing of rfidl;
//! (c) and (e) again over gRPC (`grpc://`, the receiver served by
//!     `rfidl_runtime::grpc::serve_grpc`).
//!
//! With `RFIDL_POSTGRES_URL` set (`cargo xtask bench delivery` starts a
//! throw-away server), the same figures follow on the PostgreSQL store, each
//! on a fresh database of that server, with the raw insert rate of a
//! same-sized row on PostgreSQL as their reference.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use rfidl_runtime::config::{Config, Durability};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::store::sqlite::{inbox_lookup, record_processed};

const INBOX_ROWS: usize = 1_000_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("rfidl-runtime delivery benchmarks ({cores} cores)");
    println!("{:<66} {:>16}", "figure", "value");

    // `RFIDL_BENCH_ONLY=a`, `c1` or `e`: that figure alone, e.g. under `perf record`;
    // `transports` (or `grpc`): (c) and (e) over HTTP, gRPC and JetStream.
    if std::env::var("RFIDL_BENCH_ONLY").as_deref() == Ok("a") {
        // As in the full run: straight (raw, then enqueue), then interleaved.
        let raw = raw_insert_rate(&dir.path().join("raw-normal.db"), Durability::Normal);
        let enqueue = enqueue_rate(&dir.path().join("enqueue.db"));
        report(
            "(a) Outbox::enqueue, 1 message/caller txn, NORMAL",
            format!(
                "{enqueue:.0} msg/s = {:.0} % of raw {raw:.0}",
                100.0 * enqueue / raw
            ),
        );
        report_interleaved_enqueue(dir.path());
        return;
    }
    if std::env::var("RFIDL_BENCH_ONLY").as_deref() == Ok("e") {
        report_commit_to_effect(&runtime, dir.path());
        report_loopback_floor(&runtime);
        return;
    }
    // `postgres`: the PostgreSQL figures alone, blocking and sqlx stores.
    if std::env::var("RFIDL_BENCH_ONLY").as_deref() == Ok("postgres") {
        match std::env::var("RFIDL_POSTGRES_URL") {
            Ok(server) if !server.is_empty() => postgres::figures(&runtime, &server),
            _ => println!("(PostgreSQL figures skipped: RFIDL_POSTGRES_URL is not set)"),
        }
        return;
    }
    if std::env::var("RFIDL_BENCH_ONLY").as_deref() == Ok("c1") {
        let rate = runtime.block_on(delivery_rate(dir.path(), Durability::Full, 1, Wire::Http));
        report(
            "(c1) exactly-once deliveries, one message per request, receiver Full",
            format!("{rate:.0} msg/s"),
        );
        return;
    }

    if matches!(
        std::env::var("RFIDL_BENCH_ONLY").as_deref(),
        Ok("grpc" | "transports")
    ) {
        transports(&runtime, dir.path());
        return;
    }

    let raw = raw_insert_rate(&dir.path().join("raw-normal.db"), Durability::Normal);
    report(
        "(ref) raw rusqlite insert, 1 row/txn, NORMAL",
        format!("{raw:.0} rows/s"),
    );
    let raw_full = raw_insert_rate(&dir.path().join("raw-full.db"), Durability::Full);
    report(
        "(ref) raw rusqlite insert, 1 row/txn, FULL",
        format!("{raw_full:.0} rows/s"),
    );

    let enqueue = enqueue_rate(&dir.path().join("enqueue.db"));
    report(
        "(a) Outbox::enqueue, 1 message/caller txn, NORMAL",
        format!("{enqueue:.0} msg/s"),
    );
    report(
        "    ... as a share of the raw insert rate",
        format!("{:.0} %", 100.0 * enqueue / raw),
    );
    report_interleaved_enqueue(dir.path());

    let send = runtime.block_on(send_rate(&dir.path().join("send.db"), 64));
    report(
        "(b) Outbox::send, 64 concurrent callers",
        format!("{send:.0} msg/s"),
    );

    for durability in [Durability::Full, Durability::Normal] {
        let rate = runtime.block_on(delivery_rate(dir.path(), durability, 256, Wire::Http));
        let label = format!("(c) exactly-once deliveries, HTTP loopback, receiver {durability:?}");
        report(&label, format!("{rate:.0} msg/s"));
    }
    let rate = runtime.block_on(delivery_rate(dir.path(), Durability::Full, 1, Wire::Http));
    report(
        "(c1) the same, one message per request (batch_size 1), receiver Full",
        format!("{rate:.0} msg/s"),
    );

    let (p50, p99, p999) = dedupe_latency(&dir.path().join("inbox.db"));
    report(
        "(d) inbox duplicate check, 1,000,000 rows: p50",
        format!("{:.1} µs", p50),
    );
    report("    p99", format!("{:.1} µs", p99));
    report("    p99.9", format!("{:.1} µs", p999));

    report_commit_to_effect(&runtime, dir.path());
    report_loopback_floor(&runtime);

    transports(&runtime, dir.path());

    match std::env::var("RFIDL_POSTGRES_URL") {
        Ok(server) if !server.is_empty() => postgres::figures(&runtime, &server),
        _ => println!("(PostgreSQL figures skipped: RFIDL_POSTGRES_URL is not set)"),
    }
}

/// (e) for each sender durability, the receiver on the sender's runtime and
/// on one of its own.
fn report_commit_to_effect(runtime: &tokio::runtime::Runtime, dir: &Path) {
    for receiving in [Receiving::SameRuntime, Receiving::OwnRuntime] {
        for sender in [Durability::Normal, Durability::Full] {
            let (p50, p99) = runtime.block_on(commit_to_effect(dir, Wire::Http, sender, receiving));
            let label = match receiving {
                Receiving::SameRuntime => {
                    format!("(e) sender commit -> handler effect, outbox {sender:?}: p50 / p99")
                }
                Receiving::OwnRuntime => {
                    format!("(e) the same, receiver on a runtime apart, {sender:?}: p50 / p99")
                }
            };
            report(&label, format!("{p50:.2} / {p99:.2} ms"));
        }
    }
}

fn enqueue_rate(path: &Path) -> f64 {
    let outbox = Outbox::new(Config::default(), path);
    let mut conn = db::open(path, Durability::Normal).expect("open");
    let started = Instant::now();
    for n in 0..ROWS {
        let tx = conn.transaction().expect("tx");
        outbox.enqueue(&tx, message("peer", n)).expect("enqueue");
        tx.commit().expect("commit");
    }
    rate(ROWS, started.elapsed())
}

/// Prints (a) measured interleaved with the raw insert.
fn report_interleaved_enqueue(dir: &Path) {
    let (enqueue, raw) = enqueue_beside_raw(dir);
    report(
        "    ... the two interleaved, 1,000 rows at a time",
        format!(
            "{enqueue:.0} msg/s = {:.0} % of raw {raw:.0}",
            100.0 * enqueue / raw
        ),
    );
}

/// `Outbox::enqueue` and the raw insert (NORMAL) measured in alternating
/// blocks of 1,000 rows on two files, so that load from elsewhere on the
/// machine falls on both alike: (enqueue msg/s, raw rows/s).
fn enqueue_beside_raw(dir: &Path) -> (f64, f64) {
    const BLOCK: usize = 1_000;
    let path = dir.join("interleaved-enqueue.db");
    let outbox = Outbox::new(Config::default(), &path);
    let mut conn = db::open(&path, Durability::Normal).expect("open");
    let mut raw = raw_table(&dir.join("interleaved-raw.db"), Durability::Normal);
    let (mut enqueue_time, mut raw_time) = (Duration::ZERO, Duration::ZERO);
    for block in 0..ROWS / BLOCK {
        let started = Instant::now();
        for n in block * BLOCK..(block + 1) * BLOCK {
            let tx = conn.transaction().expect("tx");
            outbox.enqueue(&tx, message("peer", n)).expect("enqueue");
            tx.commit().expect("commit");
        }
        enqueue_time += started.elapsed();
        let started = Instant::now();
        raw_inserts(&mut raw, BLOCK);
        raw_time += started.elapsed();
    }
    let done = ROWS / BLOCK * BLOCK;
    (rate(done, enqueue_time), rate(done, raw_time))
}

async fn send_rate(path: &Path, callers: usize) -> f64 {
    let outbox = Outbox::new(Config::default(), path);
    let per_caller = ROWS / callers;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let outbox = outbox.clone();
        tasks.spawn(async move {
            for n in 0..per_caller {
                outbox
                    .send(message("peer", caller * per_caller + n))
                    .await
                    .expect("send");
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    rate(per_caller * callers, started.elapsed())
}

fn dedupe_latency(path: &Path) -> (f64, f64, f64) {
    let mut conn = db::open(path, Durability::Normal).expect("open");
    let mut ids = Vec::with_capacity(INBOX_ROWS);
    let tx = conn.transaction().expect("tx");
    let digest = [7u8; 32];
    for _ in 0..INBOX_ROWS {
        let id = uuid::Uuid::now_v7().to_string();
        record_processed(
            &tx,
            &rfidl_runtime::store::sqlite::ProcessedMessage {
                source_service_id: "bench",
                message_id: &id,
                endpoint: "Credit",
                payload_sha256: &digest,
                response: r#"{"ok":true}"#,
                processed_at_ms: 0,
                expires_at_ms: i64::MAX,
            },
        )
        .expect("insert");
        ids.push(id);
    }
    tx.commit().expect("commit");
    let mut samples = Vec::with_capacity(100_000);
    let mut seed: u64 = 42;
    for _ in 0..100_000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = &ids[(seed >> 33) as usize % ids.len()];
        let started = Instant::now();
        let found = inbox_lookup(&conn, "bench", id).expect("lookup");
        samples.push(started.elapsed().as_secs_f64() * 1e6);
        assert!(found.is_some());
    }
    samples.sort_by(f64::total_cmp);
    (
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        percentile(&samples, 0.999),
    )
}

/// The PostgreSQL references measured with the plain `postgres` client (a
/// raw one-row INSERT+COMMIT, the inbox look-up statement), then rfidl's
/// figures on the sqlx store ([`sqlx_pg`]).
mod postgres {
    use super::*;
    use ::postgres::{Client, NoTls};
    use common::sqlx_pg::database;

    pub fn figures(runtime: &tokio::runtime::Runtime, server: &str) {
        let raw = raw_insert_rate(&database(server, "raw"));
        report(
            "(ref) PostgreSQL: raw insert, 1 row/txn",
            format!("{raw:.0} rows/s"),
        );
        let inbox = database(server, "inbox");
        runtime.block_on(super::sqlx_pg::migrate(&inbox));
        let (p50, p99, p999) = dedupe_latency(&inbox);
        report(
            "(d) PostgreSQL: inbox look-up statement, 1,000,000 rows: p50",
            format!("{p50:.1} µs"),
        );
        report("    p99", format!("{p99:.1} µs"));
        report("    p99.9", format!("{p999:.1} µs"));
        super::sqlx_pg::figures(runtime, server, raw);
    }

    fn connect(url: &str) -> Client {
        Client::connect(url, NoTls).expect("connect")
    }

    fn raw_insert_rate(url: &str) -> f64 {
        let mut client = connect(url);
        client
            .batch_execute(
                "CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT NOT NULL, at BIGINT NOT NULL)",
            )
            .expect("table");
        let body = "x".repeat(300);
        let started = Instant::now();
        for _ in 0..ROWS {
            let mut tx = client.transaction().expect("tx");
            tx.execute(
                "INSERT INTO t (id, body, at) VALUES ($1, $2, $3)",
                &[
                    &uuid::Uuid::now_v7().to_string(),
                    &body,
                    &rfidl_runtime::store::now_ms(),
                ],
            )
            .expect("insert");
            tx.commit().expect("commit");
        }
        rate(ROWS, started.elapsed())
    }

    fn dedupe_latency(url: &str) -> (f64, f64, f64) {
        let mut client = connect(url);
        // Bulk-load the inbox with generate_series (a million single
        // inserts would take minutes and measure nothing of interest).
        client
            .batch_execute(
                "INSERT INTO inbox_messages (source_service_id, message_id, endpoint, payload_sha256, \
                 processed_at, response, expires_at) \
                 SELECT 'bench', 'message-' || i, 'Credit', sha256(i::text::bytea), 0, \
                 '{\"ok\":true}', 9223372036854775807 FROM generate_series(1, 1000000) AS i; \
                 ANALYZE inbox_messages",
            )
            .expect("load");
        let mut samples = Vec::with_capacity(100_000);
        let mut seed: u64 = 42;
        for _ in 0..100_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = format!("message-{}", (seed >> 33) % 1_000_000 + 1);
            let started = Instant::now();
            let found = client
                .query_typed_opt(
                    "SELECT endpoint, payload_sha256, processed_at, response, expires_at \
                     FROM inbox_messages WHERE source_service_id = $1 AND message_id = $2",
                    &[
                        (&"bench", ::postgres::types::Type::TEXT),
                        (&id, ::postgres::types::Type::TEXT),
                    ],
                )
                .expect("lookup");
            samples.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(found.is_some(), "{id}");
        }
        samples.sort_by(f64::total_cmp);
        (
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            percentile(&samples, 0.999),
        )
    }
}

/// The same PostgreSQL figures on the async sqlx store (`sqlx::Postgres`):
/// the caller's own sqlx transaction, async handlers, the caller's pool.
mod sqlx_pg {
    use super::*;
    use common::sqlx_pg::{delivery_run, pair, pool};
    use rfidl_runtime::store::sqlx_postgres::PgStore;
    use sqlx::postgres::PgPoolOptions;

    pub fn figures(runtime: &tokio::runtime::Runtime, server: &str, raw_blocking: f64) {
        let (raw, enqueue) = runtime.block_on(enqueue_beside_raw(server));
        report(
            "(ref) sqlx PostgreSQL: raw sqlx INSERT, 1 row/txn",
            format!("{raw:.0} rows/s"),
        );
        report(
            "(a) sqlx PostgreSQL: enqueue_async in the caller's sqlx txn",
            format!("{enqueue:.0} msg/s = {:.0} % of raw", 100.0 * enqueue / raw),
        );
        let run = runtime.block_on(delivery_run(server, "c", message));
        let delivered = rate(DELIVERIES, run.deliver);
        report(
            "(c) sqlx PostgreSQL: exactly-once deliveries, HTTP loopback",
            format!(
                "{delivered:.0} msg/s = {:.1}x raw blocking INSERT+COMMIT ({raw_blocking:.0})",
                delivered / raw_blocking
            ),
        );
        let (p50, p99) = runtime.block_on(commit_to_effect(server));
        report(
            "(e) sqlx PostgreSQL: sender commit -> handler effect, idle: p50",
            format!("{p50:.2} ms"),
        );
        report("    p99", format!("{p99:.2} ms"));
    }

    /// Creates rfidl's tables in the database at `url`.
    pub(super) async fn migrate(url: &str) {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .expect("pool");
        PgStore::open(pool).await.expect("migrate");
    }

    /// Alternating rounds of a raw sqlx INSERT of a same-sized row and of
    /// `enqueue_async`, each in a transaction of its own (one caller).
    async fn enqueue_beside_raw(server: &str) -> (f64, f64) {
        let pool = pool(server, "sqlx_enqueue", 4).await;
        let store = PgStore::open(pool.clone()).await.expect("store");
        sqlx::query("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT NOT NULL, at BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .expect("table");
        let outbox = Outbox::new(Config::default(), &store);
        let body = "x".repeat(300);
        let (mut raw, mut enqueue) = (Duration::ZERO, Duration::ZERO);
        let rounds = 4;
        let per_round = ROWS / rounds;
        for round in 0..rounds {
            let started = Instant::now();
            for _ in 0..per_round {
                let mut tx = pool.begin().await.expect("tx");
                sqlx::query("INSERT INTO t (id, body, at) VALUES ($1, $2, $3)")
                    .bind(uuid::Uuid::now_v7().to_string())
                    .bind(&body)
                    .bind(rfidl_runtime::store::now_ms())
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
                tx.commit().await.expect("commit");
            }
            raw += started.elapsed();
            let started = Instant::now();
            for n in 0..per_round {
                let mut tx = pool.begin().await.expect("tx");
                outbox
                    .enqueue_async(&mut tx, message("peer", round * per_round + n))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }
            enqueue += started.elapsed();
        }
        (
            rate(rounds * per_round, raw),
            rate(rounds * per_round, enqueue),
        )
    }

    async fn commit_to_effect(server: &str) -> (f64, f64) {
        let pair = pair(server, "e").await;
        let dispatcher = Dispatcher::builder(&pair.outbox)
            .start()
            .expect("dispatcher");
        let mut samples = Vec::new();
        for n in 0..300 {
            let before = pair.effects.lock().expect("lock").len();
            let mut tx = pair.sender.begin().await.expect("tx");
            pair.outbox
                .enqueue_async(&mut tx, message("ledger", n))
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
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
        samples.sort_by(f64::total_cmp);
        (percentile(&samples, 0.5), percentile(&samples, 0.99))
    }
}
