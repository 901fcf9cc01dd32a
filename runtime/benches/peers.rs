//! Peers measured in the same run as rfidl's exactly-once rate (issue 12):
//! `cargo xtask bench peers` (see BENCHMARKS.md, "Peers in the same run").
//!
//! One run, one machine, the same 300-byte JSON message for everyone:
//! * rfidl: the raw one-row `synchronous=FULL` insert (ref) and (c), the
//!   delivery benchmark's exactly-once end-to-end scenario (its code, from
//!   `common`), receiver `FULL`, batched;
//! * NATS JetStream (a `nats-server` started here, file storage in a temp
//!   dir), once with the default fsync policy and once with
//!   `sync_interval: always`: publishes carry `Nats-Msg-Id` (de-duplication
//!   on), with a bounded window of outstanding publish acks; a durable pull
//!   consumer double-acks every message (a bounded window of acks awaiting
//!   the server's confirmation);
//! * apalis with its SQLite backend (only when built with
//!   `--cfg rfidl_bench_peers`, which `cargo xtask bench peers` sets): a
//!   pushed backlog, drained by one worker;
//! * with `RFIDL_POSTGRES_URL` (`cargo xtask bench peers` starts a
//!   throw-away server): rfidl's (c) on the sqlx PostgreSQL store beside
//!   apalis with its PostgreSQL backend (again only under
//!   `--cfg rfidl_bench_peers`), on fresh databases of that one server
//!   (issue 28); `RFIDL_BENCH_ONLY=postgres` runs this pass alone;
//! * rfidl's (c) and (e) over HTTP, gRPC and JetStream (issue 11);
//! * rfidl's (c) over AMQP 1.0 (RabbitMQ) and over an R3 JetStream stream
//!   (a 3-node cluster) beside each broker used directly (issue 31, the
//!   `brokers` module), last.
//!
//! `RFIDL_NATS_SERVER` names the `nats-server` binary (`cargo xtask` sets
//! it); without it the JetStream rows are skipped, loudly. RabbitMQ comes
//! from `RFIDL_RABBITMQ_SERVER` (else Debian's `/usr/sbin/rabbitmq-server`);
//! without it the AMQP rows are skipped, loudly.

mod brokers;
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use rfidl_runtime::config::Durability;

/// Bytes of every message's payload (rfidl's JSON payload, and the body of
/// the JetStream message and the apalis job).
const BYTES: usize = 300;
/// Messages per figure: the same count as (c).
const MESSAGES: usize = DELIVERIES;
/// (c)'s batch size, as in the delivery benchmark.
const BATCH: u32 = 256;

fn main() {
    // `RUST_LOG=…`: the runtime's logs on stderr (diagnosis only).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "rfidl-runtime peers benchmark ({cores} cores, {MESSAGES} messages of {BYTES} bytes each)"
    );
    println!("load average at start: {}", load_average());

    // `RFIDL_BENCH_ONLY=brokers`: the broker pass alone (AMQP 1.0 and R3
    // JetStream, rfidl beside raw), e.g. under `perf record`.
    if std::env::var("RFIDL_BENCH_ONLY").as_deref() == Ok("brokers") {
        brokers::run(&runtime, dir.path());
        println!("load average at end: {}", load_average());
        return;
    }
    if std::env::var("RFIDL_BENCH_ONLY").as_deref() == Ok("postgres") {
        postgres_pass(&runtime);
        return;
    }

    let raw_full = raw_insert_rate(&dir.path().join("raw-full.db"), Durability::Full);
    let rfidl = runtime.block_on(delivery_run(
        dir.path(),
        Durability::Full,
        BATCH,
        Wire::Http,
        |d, n| sized_message(d, n, BYTES),
    ));
    let e2e = rate(MESSAGES, rfidl.deliver);
    eprintln!("rfidl (c): {e2e:.0} msg/s");
    let with_enqueue = rate(MESSAGES, rfidl.enqueue + rfidl.deliver);

    let nats = std::env::var_os("RFIDL_NATS_SERVER").map(PathBuf::from);
    let jetstream = nats.map(|server| {
        let default = runtime.block_on(jetstream_run(&server, dir.path(), Fsync::Default));
        eprintln!("JetStream default: {:?}", default.total);
        let always = runtime.block_on(jetstream_run(&server, dir.path(), Fsync::Always));
        eprintln!("JetStream always: {:?}", always.total);
        (default, always)
    });

    // apalis's default fetch size (10), and the batch size of rfidl's (c).
    #[cfg(rfidl_bench_peers)]
    let apalis: Vec<(usize, Phases)> = [10, BATCH as usize]
        .into_iter()
        .map(|batch| {
            (
                batch,
                runtime.block_on(apalis_queue::run(dir.path(), batch)),
            )
        })
        .collect();
    #[cfg(not(rfidl_bench_peers))]
    let apalis: Vec<(usize, Phases)> = Vec::new();

    println!("load average at end: {}", load_average());
    println!();
    println!("{:<66} {:>16} {:>12}", "figure", "rate", "rfidl (c) ÷");
    let row = |name: &str, value: f64, unit: &str| {
        println!(
            "{name:<66} {:>16} {:>11.2}×",
            format!("{value:.0} {unit}"),
            e2e / value
        );
    };
    row(
        "(ref) raw rusqlite insert, 1 row/txn, FULL",
        raw_full,
        "rows/s",
    );
    row(
        "rfidl (c) exactly-once e2e, receiver FULL, batched",
        e2e,
        "msg/s",
    );
    row(
        "    ... counting the backlog's enqueue (1 txn) too",
        with_enqueue,
        "msg/s",
    );
    match &jetstream {
        Some((default, always)) => {
            for (name, run) in [("default fsync", default), ("sync always", always)] {
                row(
                    &format!("JetStream {name}: e2e, first publish -> last double ack"),
                    rate(MESSAGES, run.total),
                    "msg/s",
                );
                row(
                    "    ... publish only (to the last publish ack)",
                    rate(MESSAGES, run.first),
                    "msg/s",
                );
            }
        }
        None => println!("(JetStream skipped: RFIDL_NATS_SERVER is not set)"),
    }
    for (batch, run) in &apalis {
        row(
            &format!("apalis-sqlite, FULL, batch_size {batch}: e2e, first push -> last Done"),
            rate(MESSAGES, run.total),
            "msg/s",
        );
        row(
            "    ... push only (push_bulk)",
            rate(MESSAGES, run.first),
            "msg/s",
        );
        row(
            "    ... drain only (worker start -> last job Done)",
            rate(MESSAGES, run.total - run.first),
            "msg/s",
        );
    }
    if apalis.is_empty() {
        println!(
            "(apalis skipped: build with RUSTFLAGS=\"--cfg rfidl_bench_peers\", as `cargo xtask bench peers` does)"
        );
    }
    println!();
    report(
        "rfidl (c) / raw FULL insert (target ≥ 2.5×)",
        format!("{:.2}×", e2e / raw_full),
    );
    if let Some((default, always)) = &jetstream {
        report(
            "rfidl (c) / JetStream sync always (target ≥ 3×)",
            format!("{:.2}×", e2e / rate(MESSAGES, always.total)),
        );
        report(
            "rfidl (c) / JetStream default fsync",
            format!("{:.2}×", e2e / rate(MESSAGES, default.total)),
        );
    }
    for (batch, run) in &apalis {
        report(
            &format!("rfidl (c) / apalis-sqlite e2e, batch_size {batch}"),
            format!("{:.2}×", e2e / rate(MESSAGES, run.total)),
        );
    }

    // Issue 28: rfidl on the sqlx PostgreSQL store beside apalis-postgres.
    println!();
    postgres_pass(&runtime);

    // Issue 11: rfidl's own transports in the same run, beside the raw
    // JetStream rows above.
    println!();
    transports(&runtime, dir.path());
    println!("load average after the transports: {}", load_average());

    // Issue 31: rfidl over AMQP 1.0 and R3 JetStream beside the same
    // broker used directly, on the same broker.
    println!();
    brokers::run(&runtime, dir.path());
    println!("load average at the very end: {}", load_average());
}

/// Issue 28: rfidl's (c) on the sqlx PostgreSQL store, then apalis with
/// its PostgreSQL backend at its default fetch size (10) and at (c)'s batch
/// size, each on fresh databases of the one server of `RFIDL_POSTGRES_URL`;
/// the same messages as the SQLite rows above. Its own table, each figure
/// beside rfidl's (c) on PostgreSQL.
fn postgres_pass(runtime: &tokio::runtime::Runtime) {
    let Some(server) = std::env::var("RFIDL_POSTGRES_URL")
        .ok()
        .filter(|url| !url.is_empty())
    else {
        println!(
            "(PostgreSQL rows skipped: RFIDL_POSTGRES_URL is not set; `cargo xtask bench peers` starts a server)"
        );
        return;
    };
    println!("PostgreSQL pass, load average at start: {}", load_average());
    let rfidl = runtime.block_on(common::sqlx_pg::delivery_run(&server, "peers_c", |d, n| {
        sized_message(d, n, BYTES)
    }));
    let e2e = rate(MESSAGES, rfidl.deliver);
    eprintln!("rfidl (c) on sqlx PostgreSQL: {e2e:.0} msg/s");
    #[cfg(rfidl_bench_peers)]
    let apalis: Vec<(usize, Phases)> = [10, BATCH as usize]
        .into_iter()
        .map(|batch| {
            (
                batch,
                runtime.block_on(apalis_queue::run_postgres(&server, batch)),
            )
        })
        .collect();
    #[cfg(not(rfidl_bench_peers))]
    let apalis: Vec<(usize, Phases)> = Vec::new();
    println!("PostgreSQL pass, load average at end: {}", load_average());
    println!();
    println!("{:<66} {:>16} {:>12}", "figure", "rate", "rfidl (c) ÷");
    let row = |name: &str, value: f64| {
        println!(
            "{name:<66} {:>16} {:>11.2}×",
            format!("{value:.0} msg/s"),
            e2e / value
        );
    };
    row("rfidl (c) exactly-once e2e, sqlx PostgreSQL, batched", e2e);
    row(
        "    ... counting the backlog's enqueue (1 txn) too",
        rate(MESSAGES, rfidl.enqueue + rfidl.deliver),
    );
    for (batch, run) in &apalis {
        row(
            &format!("apalis-postgres, batch_size {batch}: e2e, first push -> last Done"),
            rate(MESSAGES, run.total),
        );
        row("    ... push only (push_bulk)", rate(MESSAGES, run.first));
        row(
            "    ... drain only (worker start -> last job Done)",
            rate(MESSAGES, run.total - run.first),
        );
    }
    if apalis.is_empty() {
        println!(
            "(apalis-postgres skipped: build with RUSTFLAGS=\"--cfg rfidl_bench_peers\", as `cargo xtask bench peers` does)"
        );
    }
    println!();
    for (batch, run) in &apalis {
        report(
            &format!("rfidl (c) PostgreSQL / apalis-postgres e2e, batch_size {batch}"),
            format!("{:.2}×", e2e / rate(MESSAGES, run.total)),
        );
    }
}

/// `/proc/loadavg`'s first three fields (other work on the machine skews
/// every figure; they are printed beside them).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A peer's run in two phases: `first` (publishing or pushing) and `total`
/// (from the first publish or push to the last message processed).
struct Phases {
    first: Duration,
    total: Duration,
}

/// The payloads every peer carries: rfidl's JSON payload of message `n`.
fn payloads() -> Vec<Vec<u8>> {
    (0..MESSAGES)
        .map(|n| {
            let body =
                serde_json::to_vec(&sized_message("ledger", n, BYTES).payload).expect("json");
            assert_eq!(body.len(), BYTES);
            body
        })
        .collect()
}

/// JetStream on one server: [`brokers::jetstream_raw`] on a `nats-server`
/// started here with the fsync policy `fsync`, a stream of one replica.
async fn jetstream_run(binary: &Path, dir: &Path, fsync: Fsync) -> Phases {
    let server = NatsServer::start(binary, dir, fsync);
    let phases = brokers::jetstream_raw(vec![server.url.clone()], 1, "PEERS").await;
    drop(server);
    phases
}

/// apalis with its SQLite backend and with its PostgreSQL backend: the
/// backlog pushed with `push_bulk`, then one worker (otherwise default
/// settings) drains it, fetching `batch_size` jobs at a time; a job counts
/// once the backend recorded it `Done`.
#[cfg(rfidl_bench_peers)]
mod apalis_queue {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use apalis::prelude::*;
    use apalis_postgres::{PgPool, PostgresStorage};
    use apalis_sqlite::{
        Config, SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteStorage,
    };

    use super::{MESSAGES, Phases, count, payloads};
    use crate::common::sqlx_pg;

    async fn handle(job: serde_json::Value) -> Result<(), BoxDynError> {
        if job.get("amount").is_none() {
            return Err("not a credit".into());
        }
        Ok(())
    }

    /// The jobs: the same JSON as every peer's payload.
    fn jobs() -> Vec<serde_json::Value> {
        payloads()
            .iter()
            .map(|body| serde_json::from_slice(body).expect("json"))
            .collect()
    }

    /// Where a backend's jobs are counted.
    #[derive(Clone)]
    enum Jobs {
        Sqlite(PathBuf),
        Postgres(PgPool),
    }

    impl Jobs {
        async fn done(&self) -> i64 {
            match self {
                Jobs::Sqlite(db) => count(db, "SELECT COUNT(*) FROM Jobs WHERE status = 'Done'"),
                Jobs::Postgres(pool) => {
                    sqlx_pg::count(
                        pool,
                        "SELECT COUNT(*) FROM apalis.jobs WHERE status = 'Done'",
                    )
                    .await
                }
            }
        }
    }

    /// The worker's watcher: once every job is `Done` (300 s at most),
    /// notes the time in `done_at` and stops the worker.
    async fn stop_when_drained(
        ctx: WorkerContext,
        jobs: Jobs,
        done_at: Arc<Mutex<Option<Instant>>>,
    ) -> Result<(), WorkerError> {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let done = jobs.done().await;
            if done as usize == MESSAGES {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "apalis: {done} jobs Done after 300 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        *done_at.lock().expect("lock") = Some(Instant::now());
        ctx.stop()
    }

    /// Pushes [`jobs`] into `storage` with `push_bulk`, then drains them
    /// with one worker until `counted` says every job is `Done`: the two
    /// phases. A macro, as each backend's worker has types of its own.
    macro_rules! push_and_drain {
        ($storage:ident, $counted:expr, $name:literal, $batch_size:ident) => {{
            let mut storage = $storage;
            let jobs = jobs();
            let started = Instant::now();
            storage.push_bulk(jobs).await.expect("push");
            let pushed = started.elapsed();
            eprintln!(
                "{} (batch_size {}): pushed in {pushed:?}",
                $name, $batch_size
            );
            let done_at = Arc::new(Mutex::new(None));
            let watch = ($counted, done_at.clone());
            WorkerBuilder::new("peers-worker")
                .backend(storage)
                .build(handle)
                .run_with_ctx(move |ctx| stop_when_drained(ctx, watch.0.clone(), watch.1.clone()))
                .await
                .expect("worker");
            let done = done_at.lock().expect("lock").expect("drained");
            Phases {
                first: pushed,
                total: done.duration_since(started),
            }
        }};
    }

    pub async fn run(dir: &Path, batch_size: usize) -> Phases {
        let path = dir.join(format!("apalis-{batch_size}.db"));
        // `setup` migrates and sets `synchronous = OFF` on the connection
        // it runs on: a pool of its own, closed before the measured one.
        let setup = SqlitePool::connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true),
        )
        .await
        .expect("open");
        SqliteStorage::setup(&setup).await.expect("setup");
        setup.close().await;
        // The same durability as rfidl's receiver: WAL (set by setup,
        // persistent) and synchronous=FULL on every connection.
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .pragma("synchronous", "FULL");
        let pool = SqlitePoolOptions::new()
            .connect_with(options)
            .await
            .expect("pool");
        let storage = SqliteStorage::<serde_json::Value>::new(&pool)
            .with_config(Config::default().queue("peers").batch_size(batch_size));
        push_and_drain!(storage, Jobs::Sqlite(path), "apalis-sqlite", batch_size)
    }

    /// apalis-postgres on a fresh database of `server`: `setup` (its
    /// migrations), then sqlx's default pool (10 connections) and the
    /// server's default durability, as rfidl's (c) on the same server.
    pub async fn run_postgres(server: &str, batch_size: usize) -> Phases {
        let pool = sqlx_pg::pool(server, &format!("apalis_{batch_size}"), 10).await;
        PostgresStorage::setup(&pool).await.expect("setup");
        let storage = PostgresStorage::<serde_json::Value>::new(&pool).with_config(
            apalis_postgres::Config::default()
                .queue("peers")
                .batch_size(batch_size),
        );
        push_and_drain!(storage, Jobs::Postgres(pool), "apalis-postgres", batch_size)
    }
}
