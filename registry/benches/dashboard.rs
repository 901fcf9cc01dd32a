//! Dashboard benchmark (see BENCHMARKS.md, "Registry dashboard"):
//! `cargo bench -p rfidl-registry --bench dashboard`.
//!
//! A real SQLite file shaped like a registry of 5,000 instances (100
//! services of 50) after a day of health checks at the default 60 s
//! interval: 7,200,000 rows of raw history, written at schema version 3
//! (before the pre-aggregated tables) and then opened by the registry,
//! whose migration fills them from that history (its time is printed
//! too). About 2% of the instances are gone (no heartbeat for an hour),
//! 7% warning and 3% critical. Figures: `GET /`, one service's page and a
//! later page, timed over real HTTP on loopback; p50 / p99 of each. Then,
//! for comparison, the raw-history queries the page made before migration
//! 4 at every load (three runs).

use std::path::Path;
use std::time::{Duration, Instant};

use rfidl_registry::Registry;
use rfidl_registry::directory::instance_id;
use rfidl_registry::store::MIGRATIONS;
use rusqlite::{Connection, params};

const SERVICES: usize = 100;
const PER_SERVICE: usize = 50;
const INTERVAL_MS: i64 = 60_000;
const DAY_MS: i64 = 86_400_000;
const REQUESTS: usize = 100;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("registry.db");
    let started = Instant::now();
    let rows = seed(&path);
    println!(
        "rfidl-registry dashboard benchmark: {} instances, {rows} health rows (seeded in {:.1} s)",
        SERVICES * PER_SERVICE,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let registry = Registry::open(&path).expect("open and migrate");
    println!(
        "{:<66} {:>16}",
        "open + migration 4 (fills the pre-aggregated tables)",
        format!("{:.1} s", started.elapsed().as_secs_f64())
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = registry.router();
    let server = runtime.spawn(async move {
        axum::serve(listener, router).await.expect("serve");
    });
    let client = reqwest::blocking::Client::new();
    println!("{:<66} {:>16}", "figure", "value");
    for (label, path) in [
        ("GET / (totals, 100 services, first 50 instances)", "/"),
        (
            "GET /?service=svc-042 (one service's 50 instances)",
            "/?service=svc-042",
        ),
        (
            "GET /?page=60&hours=24 (a later page, 24 h sparklines)",
            "/?page=60&hours=24",
        ),
    ] {
        let mut bytes = 0;
        let times = latencies(REQUESTS, || {
            let response = client.get(format!("{url}{path}")).send().expect("get");
            assert!(response.status().is_success(), "{path}");
            bytes = response.text().expect("body").len();
        });
        report(&format!("{label}: p50 / p99"), &times);
        println!(
            "{:<66} {:>16}",
            "  page size",
            format!("{} KiB", bytes / 1024)
        );
    }
    server.abort();

    // For comparison, in the same run: what the page before migration 4
    // read at every load, one row per instance (its latest check, from the
    // raw history) and its 6 h of raw points (`aggregator::history`).
    let conn = Connection::open(&path).expect("open");
    let since = now_ms() - 6 * 3_600_000;
    let ids: Vec<String> = conn
        .prepare("SELECT instance_id FROM instances")
        .and_then(|mut s| s.query_map([], |row| row.get(0))?.collect())
        .expect("ids");
    let times = latencies(3, || {
        for id in &ids {
            conn.query_row(
                "SELECT colour, depth FROM health_checks WHERE instance_id = ?1 \
                 ORDER BY id DESC LIMIT 1",
                [id],
                |row| Ok((row.get::<_, String>(0)?, row.get::<_, Option<i64>>(1)?)),
            )
            .expect("latest");
            rfidl_registry::aggregator::history(&conn, id, since).expect("history");
        }
    });
    report(
        "raw-history queries of the old page, 5,000 instances: p50 / max",
        &times,
    );
}

/// The history of 5,000 instances at schema version 3; returns its rows.
fn seed(path: &Path) -> i64 {
    let mut conn = Connection::open(path).expect("open");
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; PRAGMA foreign_keys=ON")
        .expect("pragmas");
    for script in &MIGRATIONS[..3] {
        conn.execute_batch(script).expect("migration");
    }
    conn.pragma_update(None, "user_version", 3)
        .expect("user_version");
    let now = now_ms();
    let tx = conn.transaction().expect("tx");
    let mut rows = 0;
    {
        let mut instance = tx
            .prepare(
                "INSERT INTO instances (instance_id, service, base_url, registered_at, \
                 last_seen_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .expect("prepare");
        let mut check = tx
            .prepare(
                "INSERT INTO health_checks (instance_id, checked_at, colour, reported, depth, \
                 dead_letter, attention, oldest_pending_age_ms, reasons) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8)",
            )
            .expect("prepare");
        for s in 0..SERVICES {
            let service = format!("svc-{s:03}");
            for i in 0..PER_SERVICE {
                let n = s * PER_SERVICE + i;
                let base_url = format!("http://10.0.{}.{}:7001", n / 250, n % 250);
                let id = instance_id(&service, &base_url);
                // 2% gone: last seen an hour ago.
                let seen = if n % 50 == 7 { now - 3_600_000 } else { now };
                instance
                    .execute(params![id, service, base_url, now - DAY_MS, seen])
                    .expect("instance");
                let (colour, reasons) = match n % 100 {
                    0..3 => ("critical", r#"["connection refused or unreachable"]"#),
                    3..10 => ("warning", r#"["outbox depth 80 (healthy under 50)"]"#),
                    _ => ("healthy", "[]"),
                };
                let mut at = now - DAY_MS;
                while at <= now {
                    let minute = (at / INTERVAL_MS) as u64;
                    let depth = ((minute * 7 + n as u64) % 40) as i64;
                    let reachable = colour != "critical";
                    check
                        .execute(params![
                            id,
                            at,
                            colour,
                            reachable.then_some(colour),
                            reachable.then_some(depth),
                            reachable.then_some(0),
                            reachable.then_some(1_000),
                            reasons,
                        ])
                        .expect("check");
                    rows += 1;
                    at += INTERVAL_MS;
                }
            }
        }
    }
    tx.commit().expect("commit");
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .expect("checkpoint");
    rows
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn latencies(n: usize, mut run: impl FnMut()) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let started = Instant::now();
            run();
            started.elapsed()
        })
        .collect();
    times.sort();
    times
}

fn report(label: &str, sorted: &[Duration]) {
    let at = |q: f64| sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)];
    println!(
        "{label:<66} {:>16}",
        format!(
            "{:.1} / {:.1} ms",
            at(0.50).as_secs_f64() * 1000.0,
            at(0.99).as_secs_f64() * 1000.0
        )
    );
}
