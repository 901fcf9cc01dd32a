//! Disk housekeeping benchmarks (see BENCHMARKS.md):
//! `cargo bench -p rfidl-runtime --bench housekeeping`.
//!
//! A real SQLite file with 100,000 expired inbox rows of about 1 KiB
//! (a backlog retention has just deleted, ~27,000 free pages), and a writer
//! committing one small row at a time without pause, as a service's
//! receiver or enqueuer would. Figures: how long that writer's commits
//! take with nothing else running, while the incremental vacuum returns the
//! free pages (one step size per run), and while an online backup copies the
//! file; the longest vacuum step (how long it held the write lock), and the
//! backup's duration.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rfidl_runtime::backup::Backups;
use rfidl_runtime::config::{BackupConfig, Config, Durability, VacuumConfig};
use rfidl_runtime::store::sqlite as db;

const ROWS: u32 = 100_000;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    println!("rfidl-runtime housekeeping benchmarks: {ROWS} expired inbox rows of ~1 KiB");
    println!("{:<60} {:>28}", "figure", "value");

    let path = dir.path().join("service.db");
    fill(&path);
    let idle = while_writing(&path, || std::thread::sleep(Duration::from_secs(2)));
    report(
        "writer commit, nothing else running: p50 / p99 / max",
        &idle.0,
    );

    for step_pages in [32_u32, 128, 1024] {
        let path = dir.path().join(format!("vacuum-{step_pages}.db"));
        fill(&path);
        let conn = db::open(&path, Durability::Normal).expect("open");
        let started = Instant::now();
        let deleted = db::cleanup(&conn, &Config::default(), rfidl_runtime::store::now_ms())
            .expect("cleanup")
            .inbox_deleted;
        let cleanup = started.elapsed();
        let free = db::freelist_count(&conn).expect("freelist");
        let mut config = VacuumConfig::default();
        config.step_pages = step_pages;
        let mut vacuumed = None;
        let (latencies, _) = while_writing(&path, || {
            let started = Instant::now();
            let report = db::vacuum_freed(&conn, &config, &|| false).expect("vacuum");
            vacuumed = Some((report, started.elapsed()));
        });
        let (vacuum, elapsed) = vacuumed.expect("vacuumed");
        println!(
            "{:<60} {:>28}",
            format!("retention deleted {deleted} rows in"),
            format!("{:.2} s, {free} pages free", cleanup.as_secs_f64())
        );
        report_line(
            &format!("vacuum, {step_pages} pages a step: pages, steps, total"),
            format!(
                "{} / {} / {:.2} s",
                vacuum.pages,
                vacuum.steps,
                elapsed.as_secs_f64()
            ),
        );
        report_line(
            &format!("vacuum, {step_pages} pages a step: longest step (lock held)"),
            format!("{:.2} ms", vacuum.longest_step.as_secs_f64() * 1e3),
        );
        report(
            &format!("writer commit during it ({step_pages}): p50 / p99 / max"),
            &latencies,
        );
        drop(conn);
        let _ = std::fs::remove_file(&path);
    }

    let folder = dir.path().join("backups");
    let mut config = BackupConfig::default();
    config.directory = Some(folder);
    let backups = Backups::new(&path, &config, Arc::default()).expect("backups");
    let mut written = None;
    let (latencies, commits) = while_writing(&path, || {
        written = Some(backups.run().expect("backup"));
    });
    let written = written.expect("written");
    report_line(
        "backup (256 pages a step, 5 ms apart): size, time",
        format!(
            "{:.0} MiB / {:.2} s",
            written.size as f64 / 1048576.0,
            written.elapsed.as_secs_f64()
        ),
    );
    report(
        &format!("writer commit during it ({commits} commits): p50 / p99 / max"),
        &latencies,
    );
}

/// `ROWS` inbox rows processed long ago (expired), with 1 KiB answers.
fn fill(path: &Path) {
    let mut conn = db::open(path, Durability::Normal).expect("open");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)",
    )
    .expect("orders");
    for start in (0..ROWS).step_by(10_000) {
        let tx = conn.transaction().expect("tx");
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2) \
             INSERT INTO inbox_messages (source_service_id, message_id, endpoint, \
             payload_sha256, processed_at, response, expires_at) \
             SELECT 'billing', printf('m-%09d', i), 'Credit', randomblob(32), 1, \
             hex(randomblob(500)), 2 FROM n",
            rusqlite::params![start, start + 10_000],
        )
        .expect("rows");
        tx.commit().expect("commit");
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
}

/// Runs `work` while a writer thread commits one small row at a time;
/// returns each commit's latency, sorted, and how many there were.
fn while_writing(path: &Path, work: impl FnOnce()) -> (Vec<Duration>, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path) = (Arc::clone(&stop), path.to_path_buf());
        std::thread::spawn(move || {
            let conn = db::open(&path, Durability::Normal).expect("open");
            let mut latencies = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                conn.execute("INSERT INTO orders (note) VALUES (hex(randomblob(50)))", [])
                    .expect("commit");
                latencies.push(started.elapsed());
                std::thread::sleep(Duration::from_micros(100));
            }
            latencies
        })
    };
    work();
    stop.store(true, Ordering::SeqCst);
    let mut latencies = writer.join().expect("writer");
    latencies.sort();
    let commits = latencies.len();
    (latencies, commits)
}

fn report(label: &str, sorted: &[Duration]) {
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    report_line(
        label,
        format!("{:.3} / {:.3} / {:.2} ms", at(0.5), at(0.99), at(1.0)),
    );
}

fn report_line(label: &str, value: String) {
    println!("{label:<60} {value:>28}");
}
