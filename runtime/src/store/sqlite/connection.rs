//! Opening a service database: the connection pragmas (WAL, the
//! durability's `synchronous`, the busy timeout) and [`open`], which runs the
//! pre-flight check once per file and the migrations.
//!
//! It holds no schema (that is `migrations`) and never opens a file the
//! pre-flight check refused.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::MIGRATIONS;
use super::migrations::migrate;
use super::preflight::preflight_once;
use crate::config::Durability;
use crate::store::StoreError;

/// How long a statement waits for another connection's lock before `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (creating if needed) a database file, sets the pragmas and migrates it.
///
/// The first open of an existing file in a process runs [`preflight`](fn@super::preflight)
/// first: a file written by a newer schema, or a damaged one, is refused
/// before anything writes to it.
///
/// A new file is created with `auto_vacuum=INCREMENTAL`; an existing file
/// without it is converted by one `VACUUM` at its first open in a process
/// (see `vacuum`, and docs/operations.md#vacuum).
///
/// `path` may also be a SQLite URI filename, e.g.
/// `file:/srv/app/service.db?vfs=name` to open it through a registered VFS
/// (the power-loss and disk-full tests open receivers and outboxes through a
/// fault-injecting one this way). Every connection the runtime opens on a
/// path it was given (receiver, inbox reader, outbox, dispatcher, retention,
/// diagnostics) accepts the same URI.
pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Connection, StoreError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let wrap = |source| StoreError::Sqlite {
        path: shown.clone(),
        source,
    };
    preflight_once(path, MIGRATIONS.len() as i64)?;
    let mut conn = Connection::open(path).map_err(wrap)?;
    // Before `journal_mode=WAL`, which writes a new file's header.
    super::vacuum::request_incremental(&conn).map_err(wrap)?;
    configure(&conn, durability).map_err(wrap)?;
    migrate(&mut conn, &shown)?;
    super::vacuum::convert_once(&conn, path);
    Ok(conn)
}
/// Applies the connection pragmas. WAL lets readers (diagnostics, the
/// dispatcher's claim) proceed while one writer commits.
pub fn configure(conn: &Connection, durability: Durability) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous(durability))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "cache_size", -8000)?;
    Ok(())
}

/// The `PRAGMA synchronous` value of a durability setting.
pub(crate) fn synchronous(durability: Durability) -> &'static str {
    match durability {
        Durability::Normal => "NORMAL",
        Durability::Full => "FULL",
    }
}
