//! The incremental vacuum of a service file.
//!
//! Every file the runtime opens uses `auto_vacuum=INCREMENTAL`: a new file
//! gets it before its first table ([`request_incremental`]); a file created
//! before it (or by another tool) is converted once, by one `VACUUM` at its
//! first open in a process ([`convert_once`]). Then [`vacuum_freed`], run by
//! retention after a pass, returns the free pages to the file system in
//! steps of `vacuum.step_pages` pages, each its own short write transaction.
//!
//! It never deletes rows (that is `retention`) and never holds the write
//! lock longer than one step; the measured stall is in BENCHMARKS.md.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::config::VacuumConfig;

/// `PRAGMA auto_vacuum` of a file in incremental mode.
const INCREMENTAL: i64 = 2;

/// What one [`vacuum_freed`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VacuumReport {
    /// Free pages returned to the file system (the file shrinks by as many
    /// at the next checkpoint).
    pub pages: u64,
    /// Write transactions it took.
    pub steps: u32,
    /// The longest of them: how long a writer waited at most.
    pub longest_step: Duration,
}

/// Asks for `auto_vacuum=INCREMENTAL`: on a file with no table yet it takes
/// effect with the first one; on an existing file it only records the wish,
/// which [`convert_once`] carries out. Must run before `journal_mode=WAL`,
/// which writes the header of a new file. A file already incremental is
/// left alone: setting the pragma there writes its header, and an open
/// must not write (a full disk would refuse it).
pub(super) fn request_incremental(conn: &Connection) -> rusqlite::Result<()> {
    let mode: i64 = conn.pragma_query_value(None, "auto_vacuum", |row| row.get(0))?;
    if mode == INCREMENTAL {
        return Ok(());
    }
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
}

/// Converts a file that is not in incremental mode yet with one `VACUUM`
/// (it rewrites the file: it needs as much free disk as the file's size and
/// holds the write lock meanwhile), once per file and process, at its first
/// open, before the service's other connections start. A failure (no disk
/// space, a lock held elsewhere) is logged and leaves the file as it was:
/// the vacuum then does nothing, and the next start tries again.
pub(super) fn convert_once(conn: &Connection, path: &Path) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static TRIED: OnceLock<Mutex<HashSet<std::path::PathBuf>>> = OnceLock::new();
    let file = super::preflight::file_of(path);
    let key = std::fs::canonicalize(&file).unwrap_or(file);
    let tried = TRIED.get_or_init(Default::default);
    let first = tried.lock().is_ok_and(|mut set| set.insert(key));
    if !first {
        return;
    }
    let mode = conn.pragma_query_value(None, "auto_vacuum", |row| row.get::<_, i64>(0));
    if mode.is_ok_and(|mode| mode == INCREMENTAL) {
        return;
    }
    let started = Instant::now();
    match conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;") {
        Ok(()) => tracing::info!(
            path = %path.display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "converted the database file to auto_vacuum=INCREMENTAL (one VACUUM)"
        ),
        Err(error) => tracing::warn!(
            path = %path.display(),
            %error,
            "could not convert the database file to auto_vacuum=INCREMENTAL; \
             freed pages stay in the file until a later start converts it"
        ),
    }
}

/// Free pages in the file.
pub fn freelist_count(conn: &Connection) -> rusqlite::Result<u64> {
    conn.pragma_query_value(None, "freelist_count", |row| row.get::<_, i64>(0))
        .map(|count| count.max(0) as u64)
}

/// Returns free pages to the file system when more than
/// `config.threshold_pages` are free: `PRAGMA incremental_vacuum(step_pages)`
/// repeatedly, `step_pause` apart (or as long as the last step took, if
/// longer), until fewer than `step_pages` are free, a step frees nothing, or `stop` says so; a passive checkpoint (it never
/// waits for a writer) after each step makes the file shorter. Does
/// nothing on a file not in incremental mode or with `threshold_pages`
/// `0`. `conn` must not be inside a transaction. Blocking.
pub fn vacuum_freed(
    conn: &Connection,
    config: &VacuumConfig,
    stop: &dyn Fn() -> bool,
) -> rusqlite::Result<VacuumReport> {
    let mut report = VacuumReport::default();
    if config.threshold_pages == 0 {
        return Ok(report);
    }
    let mode: i64 = conn.pragma_query_value(None, "auto_vacuum", |row| row.get(0))?;
    let mut free = freelist_count(conn)?;
    if mode != INCREMENTAL || free < u64::from(config.threshold_pages) {
        return Ok(report);
    }
    let step = config.step_pages.max(1);
    let sql = format!("PRAGMA incremental_vacuum({step})");
    loop {
        let started = Instant::now();
        {
            // One row per page freed; the transaction commits when the
            // statement finishes, so it must be stepped to its end.
            let mut statement = conn.prepare_cached(&sql)?;
            let mut rows = statement.query([])?;
            while rows.next()?.is_some() {}
        }
        let step_took = started.elapsed();
        report.longest_step = report.longest_step.max(step_took);
        report.steps += 1;
        // Copies the step's pages from the WAL into the file (which then
        // shrinks) off the write lock: a passive checkpoint never waits for
        // a writer, and the WAL never grows to the size at which a writer's
        // commit would run the checkpoint itself.
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
        let before = free;
        free = freelist_count(conn)?;
        report.pages += before.saturating_sub(free);
        if free < u64::from(step) || free >= before || stop() {
            break;
        }
        // At least as long as the step held the lock: on a slow or loaded
        // machine, writers still get the lock half the time or more.
        std::thread::sleep(config.step_pause.max(step_took));
    }
    Ok(report)
}
