//! SQLite connection set-up and schema migrations.
//!
//! Owns the pragmas and the schema of the `outbox_messages` and
//! `inbox_messages` tables. Migrations are an ordered list of SQL scripts;
//! `PRAGMA user_version` records how many ran. A database written by a newer
//! schema than this binary knows is refused, never altered.
//!
//! Times are stored as INTEGER milliseconds since the Unix epoch (UTC): compact,
//! indexable, and compared without parsing.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use crate::config::Durability;

/// Schema migrations, applied in order; index + 1 is the resulting `user_version`.
/// Never edit a released entry: append a new one.
pub const MIGRATIONS: &[&str] = &[
    // 1: outbox and inbox.
    r#"
    CREATE TABLE outbox_messages (
        message_id      TEXT PRIMARY KEY NOT NULL,   -- UUID v7, time-ordered
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,               -- Signal | Command | PushCall | Response
        destination     TEXT NOT NULL,               -- logical peer name, mapped to a transport
        interface       TEXT NOT NULL,               -- package.Service
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,               -- JSON object, one member per parameter
        headers         TEXT NOT NULL DEFAULT '{}',  -- JSON object of string -> string
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status IN ('Pending','Sending','Sent','Failed','DeadLetter','Expired')),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,            -- due time (ms); for Sending: lease expiry
        lease_token     TEXT,                        -- set by a claim; later updates are fenced on it
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,                        -- the receiver's answer payload (JSON)
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER
    ) STRICT, WITHOUT ROWID;  -- one b-tree keyed on the time-ordered id: appends stay sequential
    -- The dispatcher's claim query: due rows that are Pending or whose lease ran out.
    CREATE INDEX outbox_due ON outbox_messages (next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    -- Retention: delete Sent rows by age.
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    -- Diagnostics: list rows that need a human.
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE status IN ('Failed', 'DeadLetter', 'Expired');

    CREATE TABLE inbox_messages (
        source_service_id TEXT NOT NULL,
        message_id        TEXT NOT NULL,
        endpoint          TEXT NOT NULL,
        payload_sha256    BLOB NOT NULL,             -- to detect a reused id with another payload
        processed_at      INTEGER NOT NULL,
        response          TEXT,                      -- cached answer payload (JSON)
        expires_at        INTEGER NOT NULL,
        PRIMARY KEY (source_service_id, message_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX inbox_expiry ON inbox_messages (expires_at);
    "#,
];

/// Errors opening or migrating a database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    #[error("database {path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
    #[error(
        "database {path} has schema version {found}, newer than the {supported} this build knows; \
         refusing to touch it (upgrade rfidl-runtime)"
    )]
    TooNew {
        path: String,
        found: i64,
        supported: i64,
    },
}

/// How long a statement waits for another connection's lock before `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (creating if needed) a database file, sets the pragmas and migrates it.
///
/// `path` may also be a SQLite URI filename, e.g.
/// `file:/srv/app/service.db?vfs=name` to open it through a registered VFS
/// (the power-loss and disk-full tests open receivers and outboxes through a
/// fault-injecting one this way). Every connection the runtime opens on a
/// path it was given (receiver, inbox reader, outbox, dispatcher, retention,
/// diagnostics) accepts the same URI.
pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Connection, DbError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let wrap = |source| DbError::Sqlite {
        path: shown.clone(),
        source,
    };
    let mut conn = Connection::open(path).map_err(wrap)?;
    configure(&conn, durability).map_err(wrap)?;
    migrate(&mut conn, &shown)?;
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

fn migrate(conn: &mut Connection, shown: &str) -> Result<(), DbError> {
    let wrap = |source| DbError::Sqlite {
        path: shown.to_owned(),
        source,
    };
    let supported = MIGRATIONS.len() as i64;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(wrap)?;
    let found: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(wrap)?;
    if found > supported {
        return Err(DbError::TooNew {
            path: shown.to_owned(),
            found,
            supported,
        });
    }
    for (index, script) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(script).map_err(wrap)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(wrap)?;
    }
    tx.commit().map_err(wrap)
}

/// Milliseconds since the Unix epoch, the unit of every stored time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_schema_and_refuses_newer_versions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rt.db");
        let conn = open(&path, Durability::Normal).expect("open");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, MIGRATIONS.len() as i64);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("mode");
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "user_version", 99).expect("bump");
        drop(conn);
        match open(&path, Durability::Full) {
            Err(DbError::TooNew { found: 99, .. }) => {}
            other => panic!("expected TooNew, got {other:?}"),
        }
    }

    #[test]
    fn reopening_is_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rt.db");
        drop(open(&path, Durability::Normal).expect("first open"));
        let conn = open(&path, Durability::Full).expect("second open");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .expect("sync");
        assert_eq!(sync, 2, "FULL");
    }
}
