//! Runtime benchmarks, side by side in one run (see BENCHMARKS.md).
//!
//! `cargo bench -p rfidl-runtime --bench delivery` (or `cargo xtask bench delivery`).
//! Every figure is measured on real SQLite files in a temp dir and, where a
//! network is involved, real HTTP on 127.0.0.1.

use std::time::{Duration, Instant};

use rfidl_runtime::Durability;
use rfidl_runtime::db;

/// How many single-row transactions the rate figures use.
const ROWS: usize = 20_000;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    println!(
        "rfidl-runtime delivery benchmarks ({} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("{:<58} {:>14}", "figure", "value");
    let raw_normal = raw_insert_rate(&dir.path().join("raw-normal.db"), Durability::Normal);
    report(
        "reference: raw rusqlite insert, 1 row/txn, NORMAL",
        raw_normal,
        "rows/s",
    );
    let raw_full = raw_insert_rate(&dir.path().join("raw-full.db"), Durability::Full);
    report(
        "reference: raw rusqlite insert, 1 row/txn, FULL",
        raw_full,
        "rows/s",
    );
}

fn report(name: &str, value: f64, unit: &str) {
    println!("{name:<58} {value:>10.0} {unit}");
}

/// The ceiling the outbox is measured against: one INSERT of a row the size
/// of an outbox row per transaction, nothing else.
fn raw_insert_rate(path: &std::path::Path, durability: Durability) -> f64 {
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

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}
