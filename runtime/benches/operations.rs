//! Operations benchmarks (see BENCHMARKS.md):
//! `cargo bench -p rfidl-runtime --bench operations` (or `cargo xtask bench operations`).
//!
//! A real SQLite file shaped like a busy service a week in: 1,000,000 kept
//! `Sent` outbox rows, 200 waiting, 5 failed, and 1,000,000 inbox rows.
//! Figures: the health check and the full statistics (does their cost grow
//! with the `Sent` rows?), the failed list, and the retention clean-up's
//! deletion rate, outbox and inbox, in its 1,000-row batches.

use std::time::{Duration, Instant};

use rfidl_runtime::config::{Config, Durability};
use rfidl_runtime::diagnostics::{self, AttentionFilter};
use rfidl_runtime::store::sqlite as db;

const SENT_ROWS: i64 = 1_000_000;
const INBOX_ROWS: i64 = 1_000_000;
const DAY_MS: i64 = 86_400_000;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("service.db");
    let conn = db::open(&path, Durability::Normal).expect("open");
    let now = rfidl_runtime::store::now_ms();
    let started = Instant::now();
    fill(&conn, now);
    println!(
        "rfidl-runtime operations benchmarks: {SENT_ROWS} Sent outbox rows, {INBOX_ROWS} inbox rows \
         (filled in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!("{:<66} {:>16}", "figure", "value");

    let health = latencies(200, || {
        diagnostics::unsent_stats(&conn, now).expect("unsent stats");
    });
    report("GET /_rf/health query (unsent_stats): p50 / p99", health);
    let stats = latencies(20, || {
        diagnostics::outbox_stats(&conn, now).expect("stats");
    });
    report(
        "GET /_rf/outbox/stats query (counts the Sent rows): p50 / p99",
        stats,
    );
    let failed = latencies(200, || {
        diagnostics::attention_messages(&conn, &AttentionFilter::default()).expect("list");
    });
    report("GET /_rf/outbox/failed query: p50 / p99", failed);
    let gauges = latencies(200, || {
        diagnostics::destination_gauges(&conn, now, &[]).expect("gauges");
    });
    report(
        "GET /_rf/metrics per-destination gauges query: p50 / p99",
        gauges,
    );
    let scrape = latencies(20, || {
        diagnostics::destination_gauges(&conn, now, &[]).expect("gauges");
        rfidl_runtime::store::sqlite::inbox_count(&conn).expect("inbox size");
    });
    report(
        "GET /_rf/metrics all queries (with the inbox size): p50 / p99",
        scrape,
    );

    // The start-up pre-flight (schema version + PRAGMA quick_check) reads
    // the whole file: its cost on this one, checkpointed first.
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .expect("checkpoint");
    let size_mib = std::fs::metadata(&path).expect("size").len() as f64 / (1024.0 * 1024.0);
    let preflight = latencies(5, || {
        db::preflight(&path, db::MIGRATIONS.len() as i64).expect("preflight");
    });
    report(
        &format!("start-up pre-flight (quick_check) of the {size_mib:.0} MiB file: p50 / p99"),
        preflight,
    );

    // A week and a day later: every Sent row and every inbox row is due.
    let config = Config::default();
    let later = now + 8 * DAY_MS;
    let started = Instant::now();
    let report_ = db::cleanup(&conn, &config, later).expect("cleanup");
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(report_.sent_deleted as i64, SENT_ROWS);
    assert_eq!(report_.inbox_deleted as i64, INBOX_ROWS);
    println!(
        "{:<66} {:>16}",
        "retention clean-up, outbox + inbox rows deleted",
        format!(
            "{:.0} rows/s",
            (report_.sent_deleted + report_.inbox_deleted) as f64 / elapsed
        )
    );
    println!(
        "{:<66} {:>16}",
        "    ... the whole pass (2,000,000 rows, 1,000 per commit)",
        format!("{elapsed:.1} s")
    );
}

fn fill(conn: &rusqlite::Connection, now: i64) {
    conn.execute_batch("BEGIN").expect("begin");
    {
        let mut outbox = conn
            .prepare(
                "INSERT INTO outbox_messages (message_id, message_type, destination, interface, \
                 version, fingerprint, endpoint, payload, status, max_retries, next_retry_at, \
                 created_at, expires_at, sent_at) \
                 VALUES (?1, 'Signal', ?2, 'hr.employees.EmpService', 2, 'sha256:x', \
                 'EmployeeHired', '{}', ?3, 5, ?4, ?4, ?5, ?6)",
            )
            .expect("prepare");
        let mut insert = |i: i64, status: &str, sent_at: Option<i64>| {
            let created = now - 7 * DAY_MS + i;
            outbox
                .execute(rusqlite::params![
                    uuid::Uuid::now_v7().to_string(),
                    if i % 3 == 0 { "engine" } else { "billing" },
                    status,
                    created,
                    created + DAY_MS,
                    sent_at,
                ])
                .expect("insert");
        };
        for i in 0..SENT_ROWS {
            insert(i, "Sent", Some(now - 7 * DAY_MS + i));
        }
        for i in 0..200 {
            insert(i, "Pending", None);
        }
        for i in 0..5 {
            insert(i, "Failed", None);
        }
        let mut inbox = conn
            .prepare(
                "INSERT INTO inbox_messages (source_service_id, message_id, endpoint, \
                 payload_sha256, processed_at, response, expires_at) \
                 VALUES ('engine', ?1, 'ProvisionLaptop', x'00', ?2, NULL, ?3)",
            )
            .expect("prepare");
        for i in 0..INBOX_ROWS {
            inbox
                .execute(rusqlite::params![
                    format!("m-{i}"),
                    now - DAY_MS + i / 1000,
                    now + i / 1000
                ])
                .expect("insert");
        }
    }
    conn.execute_batch("COMMIT").expect("commit");
}

/// p50 and p99 of `runs` calls of `query`.
fn latencies(runs: usize, mut query: impl FnMut()) -> (Duration, Duration) {
    query(); // warm the cache
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            query();
            started.elapsed()
        })
        .collect();
    times.sort();
    (times[runs / 2], times[(runs * 99 / 100).min(runs - 1)])
}

fn report(figure: &str, (p50, p99): (Duration, Duration)) {
    println!("{figure:<66} {:>16}", format!("{p50:.2?} / {p99:.2?}"));
}
