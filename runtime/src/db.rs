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

/// The rows that need a human (`Failed`, `DeadLetter`, `Expired`), written
/// as the `outbox_attention` index's predicate: SQLite uses a partial index
/// only for a query that repeats its predicate term for term, so queries
/// splice this in with `concat!`.
macro_rules! attention {
    () => {
        "(status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired')"
    };
}
pub(crate) use attention;

/// A `GLOB` pattern that matches a lower-case hyphenated UUID.
macro_rules! uuid_glob {
    () => {
        "[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
         [0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
         [0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
         [0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]"
    };
}

/// The value of the hexadecimal digit at 1-based `$position` of
/// `message_id`, shifted left `$shift` bits.
macro_rules! hex_digit_sql {
    ($position:literal, $shift:literal) => {
        concat!(
            "((instr('0123456789abcdef', substr(message_id, ",
            $position,
            ", 1)) - 1) << ",
            $shift,
            ")"
        )
    };
}

/// [`outbox_seq`] of the column `message_id` in SQL, for a value that
/// matches `uuid_glob!()`: the 12 hexadecimal digits of the time (text
/// positions 1-8 and 10-13) shifted left 15 bits, or'ed with the low 15
/// bits of the 4 digits at positions 25-28.
macro_rules! outbox_seq_sql {
    () => {
        concat!(
            "((",
            hex_digit_sql!(1, 44),
            " | ",
            hex_digit_sql!(2, 40),
            " | ",
            hex_digit_sql!(3, 36),
            " | ",
            hex_digit_sql!(4, 32),
            " | ",
            hex_digit_sql!(5, 28),
            " | ",
            hex_digit_sql!(6, 24),
            " | ",
            hex_digit_sql!(7, 20),
            " | ",
            hex_digit_sql!(8, 16),
            " | ",
            hex_digit_sql!(10, 12),
            " | ",
            hex_digit_sql!(11, 8),
            " | ",
            hex_digit_sql!(12, 4),
            " | ",
            hex_digit_sql!(13, 0),
            ") << 15) | ((",
            hex_digit_sql!(25, 12),
            " | ",
            hex_digit_sql!(26, 8),
            " | ",
            hex_digit_sql!(27, 4),
            " | ",
            hex_digit_sql!(28, 0),
            ") & 32767)"
        )
    };
}

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
    // 2: the dispatcher claims destination by destination (circuit
    //    breakers, fairness between destinations), so the index of waiting
    //    rows leads with the destination. Same number of indexes: enqueue
    //    costs the same.
    r#"
    DROP INDEX outbox_due;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    "#,
    // 3: decommissioned interface versions (`crate::lifecycle`): the
    // versions this service must not dispatch, set by the registry's
    // `Decommission` command.
    r#"
    CREATE TABLE rf_decommissioned (
        interface         TEXT NOT NULL,
        version           INTEGER NOT NULL,
        decommissioned_at INTEGER NOT NULL,
        PRIMARY KEY (interface, version)
    ) STRICT;
    "#,
    // 4: the same outbox without IN-lists of more than two values in its
    //    CHECK and partial indexes. SQLite evaluates such a list (outside a
    //    WHERE clause) through a temporary b-tree it builds for every row
    //    written: two per enqueue (the status CHECK and the attention index's
    //    predicate), and more per status update, about a quarter of an
    //    enqueue's instructions (BENCHMARKS.md, "Outbox::enqueue"). Equality
    //    chains are evaluated in place. SQLite cannot change a CHECK in
    //    place: the table is rebuilt (same columns in the same order), as its
    //    documented procedure for schema changes says.
    concat!(
        r#"
    CREATE TABLE outbox_messages_v4 (
        message_id      TEXT PRIMARY KEY NOT NULL,
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,
        destination     TEXT NOT NULL,
        interface       TEXT NOT NULL,
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,
        headers         TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status = 'Pending' OR status = 'Sending' OR status = 'Sent'
                               OR status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired'),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,
        lease_token     TEXT,
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER
    ) STRICT, WITHOUT ROWID;
    INSERT INTO outbox_messages_v4 SELECT * FROM outbox_messages;
    DROP TABLE outbox_messages;
    ALTER TABLE outbox_messages_v4 RENAME TO outbox_messages;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    -- Queries that want this index repeat its predicate: `attention!()`.
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE "#,
        attention!(),
        r#";
    "#
    ),
    // 5: the JetStream transport (`crate::nats`). `answered_at`: when the
    //    answer to a message sent through a broker arrived and its response
    //    handler ran (the marker that makes a redelivered answer a no-op).
    //    `rf_terminated`: broker deliveries refused for good (never
    //    redelivered), kept for an operator.
    r#"
    ALTER TABLE outbox_messages ADD COLUMN answered_at INTEGER;
    CREATE TABLE rf_terminated (
        stream_sequence INTEGER NOT NULL,
        stream          TEXT NOT NULL,
        message_id      TEXT,                -- Nats-Msg-Id, when the message had one
        subject         TEXT NOT NULL,
        error           TEXT NOT NULL,       -- `<status> <code>: <message>`
        at              INTEGER NOT NULL,
        PRIMARY KEY (stream, stream_sequence)
    ) STRICT;
    "#,
    // 6: the outbox as a rowid table. A `WITHOUT ROWID` table is an index
    //    b-tree: a full leaf splits by redistributing cells over up to three
    //    siblings (`balance_nonroot`), and with about six 650-byte rows to a
    //    4 KiB page an enqueue wrote 3.6 WAL frames per commit. A rowid
    //    table appended at its right edge splits by adding one page
    //    (`balance_quick`): 2.4 frames, as the raw-insert reference writes.
    //    The rowid `seq` is derived from the message id (`outbox_seq`:
    //    the id's millisecond time and the low 15 bits of its counter, so
    //    time-ordered ids append), and every look-up by id binds both, so
    //    no index on `message_id` is needed and an enqueue still writes two
    //    b-trees (the table and `outbox_due`). Same columns, `seq` last;
    //    rows whose id is not a lower-case UUID get a rowid past all others
    //    (look-ups by id do not find them; the dispatcher, which works on
    //    `seq`, still sends them). Rebuilt as SQLite's documented procedure
    //    for schema changes says.
    concat!(
        r#"
    CREATE TABLE outbox_messages_v6 (
        message_id      TEXT NOT NULL,
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,
        destination     TEXT NOT NULL,
        interface       TEXT NOT NULL,
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,
        headers         TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status = 'Pending' OR status = 'Sending' OR status = 'Sent'
                               OR status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired'),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,
        lease_token     TEXT,
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER,
        answered_at     INTEGER,
        seq             INTEGER PRIMARY KEY   -- outbox_seq(message_id), see above
    ) STRICT;
    WITH keyed AS (
        SELECT *, CASE WHEN message_id GLOB '"#,
        uuid_glob!(),
        r#"' THEN "#,
        outbox_seq_sql!(),
        r#" END AS k FROM outbox_messages
    ), shared AS (
        SELECT k FROM keyed WHERE k IS NOT NULL GROUP BY k HAVING COUNT(*) > 1
    )
    INSERT INTO outbox_messages_v6 (message_id, correlation_id, message_type, destination,
        interface, version, fingerprint, endpoint, payload, headers, status, retry_count,
        max_retries, next_retry_at, lease_token, last_attempt_at, last_error, response,
        created_at, expires_at, sent_at, answered_at, seq)
    SELECT message_id, correlation_id, message_type, destination, interface, version,
        fingerprint, endpoint, payload, headers, status, retry_count, max_retries,
        next_retry_at, lease_token, last_attempt_at, last_error, response, created_at,
        expires_at, sent_at, answered_at, CASE WHEN k IN shared THEN NULL ELSE k END
    FROM keyed ORDER BY (k IS NULL OR k IN shared), message_id;
    DROP TABLE outbox_messages;
    ALTER TABLE outbox_messages_v6 RENAME TO outbox_messages;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    -- Queries that want this index repeat its predicate: `attention!()`.
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE "#,
        attention!(),
        r#";
    "#
    ),
    // 7: the last lifecycle command applied per interface version
    //    (`crate::lifecycle`): the registry's generation and which command,
    //    so that a command older than the state held (a replay, a late
    //    retry) is refused (`stale_command`), also after a restart.
    r#"
    CREATE TABLE rf_lifecycle_applied (
        interface   TEXT NOT NULL,
        version     INTEGER NOT NULL,
        generation  INTEGER NOT NULL,
        command     TEXT NOT NULL,
        applied_at  INTEGER NOT NULL,
        PRIMARY KEY (interface, version)
    ) STRICT;
    "#,
];

/// The `seq` (rowid) of an outbox row whose `message_id` is `message_id`:
/// for a lower-case hyphenated UUID, its 48-bit millisecond time shifted
/// left 15 bits, or'ed with the low 15 bits of its 32 bits after the
/// variant field, where `Uuid::now_v7`'s 42-bit counter ends (so that the
/// ids one process makes within a millisecond get distinct, increasing
/// values); `None` for any other text, which no enqueued row carries.
/// Migration 6 computes the same in SQL (`outbox_seq_sql!`); a unit test
/// checks that the two agree.
pub(crate) fn outbox_seq(message_id: &str) -> Option<i64> {
    let bytes = message_id.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut value: u128 = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        if matches!(index, 8 | 13 | 18 | 23) {
            if byte != b'-' {
                return None;
            }
            continue;
        }
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        value = value << 4 | u128::from(digit);
    }
    let millis = (value >> 80) as i64;
    let counter = ((value >> 32) & 0x7FFF) as i64;
    Some(millis << 15 | counter)
}

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
         refusing to touch it (upgrade this program)"
    )]
    TooNew {
        path: String,
        found: i64,
        supported: i64,
    },
    /// A PostgreSQL database that cannot be reached or used.
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL database at {target}: {cause}")]
    Postgres { target: String, cause: String },
    #[error(
        "database {path} is damaged ({detail}); refusing to start on it. The file was not \
         changed: restore it from a backup, or inspect it with `sqlite3 {path} \"PRAGMA integrity_check\"`"
    )]
    Corrupt { path: String, detail: String },
}

/// How long a statement waits for another connection's lock before `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (creating if needed) a database file, sets the pragmas and migrates it.
///
/// The first open of an existing file in a process runs [`preflight`]
/// first: a file written by a newer schema, or a damaged one, is refused
/// before anything writes to it.
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
    preflight_once(path, MIGRATIONS.len() as i64)?;
    let mut conn = Connection::open(path).map_err(wrap)?;
    configure(&conn, durability).map_err(wrap)?;
    migrate(&mut conn, &shown)?;
    Ok(conn)
}

/// Checks an existing database file before anything may write to it, through
/// a read-only connection: its schema version must be one this build knows
/// (`supported` migrations or fewer), and `PRAGMA quick_check` must pass
/// (b-tree structure and page consistency, linear in the file's size; see
/// BENCHMARKS.md for its cost). A missing or empty file passes (it is
/// created). The file is never changed, whatever the outcome: setting
/// `journal_mode=WAL` rewrites the header of a rollback-journal database, so
/// it must not run before this check.
pub fn preflight(path: &Path, supported: i64) -> Result<(), DbError> {
    use rusqlite::OpenFlags;
    let shown = path.display().to_string();
    if std::fs::metadata(file_of(path)).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    let corrupt = |detail: String| DbError::Corrupt {
        path: shown.clone(),
        detail,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|source| DbError::Sqlite {
        path: shown.clone(),
        source,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|source| DbError::Sqlite {
            path: shown.clone(),
            source,
        })?;
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| classify_open_error(e, &shown))?;
    if found > supported {
        return Err(DbError::TooNew {
            path: shown,
            found,
            supported,
        });
    }
    let mut statement = conn
        .prepare("PRAGMA quick_check(10)")
        .map_err(|e| classify_open_error(e, &shown))?;
    let problems: Vec<String> = statement
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| classify_open_error(e, &shown))?;
    if problems != ["ok"] {
        return Err(corrupt(problems.join("; ")));
    }
    Ok(())
}

/// A read error of the pre-flight check: damage, or something else (locked,
/// permissions) that is reported as it is.
fn classify_open_error(error: rusqlite::Error, shown: &str) -> DbError {
    use rusqlite::ffi::ErrorCode;
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => DbError::Corrupt {
            path: shown.to_owned(),
            detail: error.to_string(),
        },
        _ => DbError::Sqlite {
            path: shown.to_owned(),
            source: error,
        },
    }
}

/// The file a database path names: the path itself, or the file of a SQLite
/// URI filename (`file:/srv/app.db?vfs=name`, `file:///srv/app.db`,
/// `file://localhost/srv/app.db`; `%XX` escapes decoded), which every
/// connection the runtime opens accepts.
fn file_of(path: &Path) -> std::path::PathBuf {
    let Some(uri) = path.to_str().and_then(|text| text.strip_prefix("file:")) else {
        return path.to_path_buf();
    };
    let uri = uri.split(['?', '#']).next().unwrap_or_default();
    let uri = match uri.strip_prefix("//") {
        Some(rest) => rest.strip_prefix("localhost").unwrap_or(rest),
        None => uri,
    };
    let bytes = uri.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    std::path::PathBuf::from(String::from_utf8_lossy(&decoded).into_owned())
}

/// [`preflight`] once per file and process: the runtime opens several
/// connections to one file (writer, dispatcher, readers), and the check
/// reads the whole file.
fn preflight_once(path: &Path, supported: i64) -> Result<(), DbError> {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static CHECKED: OnceLock<Mutex<HashSet<std::path::PathBuf>>> = OnceLock::new();
    let file = file_of(path);
    let key = std::fs::canonicalize(&file).unwrap_or(file);
    let checked = CHECKED.get_or_init(Default::default);
    if checked.lock().is_ok_and(|set| set.contains(&key)) {
        return Ok(());
    }
    preflight(path, supported)?;
    if let Ok(mut set) = checked.lock() {
        set.insert(key);
    }
    Ok(())
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

    /// The opcodes of `sql`'s program.
    fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
        let mut statement = conn.prepare(&format!("EXPLAIN {sql}")).expect("explain");
        let nulls = vec![rusqlite::types::Null; statement.parameter_count()];
        statement
            .query_map(rusqlite::params_from_iter(nulls), |row| {
                row.get::<_, String>(1)
            })
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    #[test]
    fn writing_an_outbox_row_builds_no_temporary_btree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(dir.path().join("o.db"), Durability::Normal).expect("open");
        for sql in [
            "INSERT INTO outbox_messages (seq, message_id, correlation_id, message_type, \
             destination, interface, version, fingerprint, endpoint, payload, headers, status, \
             max_retries, next_retry_at, created_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'Pending', ?12, ?13, ?13, ?14)",
            "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3 WHERE seq = ?1 AND lease_token = ?2",
            "UPDATE outbox_messages SET status = ?2 WHERE seq = ?1",
        ] {
            let ops = opcodes(&conn, sql);
            assert!(
                !ops.iter().any(|op| op == "OpenEphemeral"),
                "{sql}\nevaluates an IN-list through a temporary b-tree per row: {ops:?}"
            );
        }
    }

    #[test]
    fn queries_for_rows_that_need_a_human_use_the_attention_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(dir.path().join("o.db"), Durability::Normal).expect("open");
        let sql = concat!(
            "SELECT message_id FROM outbox_messages WHERE ",
            attention!(),
            " AND (?1 IS NULL OR status = ?1) ORDER BY created_at LIMIT 10"
        );
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plan")
            .query_map([rusqlite::types::Null], |row| row.get(3))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            plan.iter().any(|step| step.contains("outbox_attention")),
            "{plan:?}"
        );
    }

    #[test]
    fn the_outbox_rebuild_keeps_every_row_and_its_indexes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v3.db");
        let statuses = [
            "Pending",
            "Sending",
            "Sent",
            "Failed",
            "DeadLetter",
            "Expired",
        ];
        {
            let mut conn = Connection::open(&path).expect("create");
            let tx = conn.transaction().expect("tx");
            for script in &MIGRATIONS[..3] {
                tx.execute_batch(script).expect("migrate to 3");
            }
            tx.pragma_update(None, "user_version", 3).expect("version");
            for (n, status) in statuses.iter().enumerate() {
                tx.execute(
                    "INSERT INTO outbox_messages (message_id, correlation_id, message_type, \
                     destination, interface, version, fingerprint, endpoint, payload, headers, \
                     status, retry_count, max_retries, next_retry_at, lease_token, \
                     last_attempt_at, last_error, response, created_at, expires_at, sent_at) \
                     VALUES (?1, 'c', 'Command', 'peer', 'p.S', 1, 'sha256:f', 'E', '{}', '{}', \
                     ?2, 2, 5, 100, 'lease', 90, 'boom', '{\"ok\":1}', ?3, 1000, 95)",
                    rusqlite::params![format!("id-{n}"), status, n as i64],
                )
                .expect("row");
            }
            tx.commit().expect("commit");
        }
        let dump = |conn: &Connection| -> Vec<String> {
            let mut statement = conn
                .prepare(
                    "SELECT message_id, correlation_id, message_type, destination, interface, \
                     version, fingerprint, endpoint, payload, headers, status, retry_count, \
                     max_retries, next_retry_at, lease_token, last_attempt_at, last_error, \
                     response, created_at, expires_at, sent_at \
                     FROM outbox_messages ORDER BY message_id",
                )
                .expect("select");
            let columns = statement.column_count();
            statement
                .query_map([], |row| {
                    (0..columns)
                        .map(|i| {
                            row.get::<_, rusqlite::types::Value>(i)
                                .map(|v| format!("{v:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map(|values| values.join("|"))
                })
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        let before = dump(&Connection::open(&path).expect("reopen"));
        let conn = open(&path, Durability::Normal).expect("migrate");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .expect("version");
        assert_eq!(version, MIGRATIONS.len() as i64);
        assert_eq!(dump(&conn), before, "every row and column kept");
        assert_eq!(before.len(), statuses.len());
        let indexes: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'index' \
                 AND tbl_name = 'outbox_messages' AND sql IS NOT NULL ORDER BY name",
            )
            .expect("indexes")
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(indexes, ["outbox_attention", "outbox_due", "outbox_sent"]);
        let refused = conn.execute(
            "UPDATE outbox_messages SET status = 'Lost' WHERE message_id = 'id-0'",
            [],
        );
        assert!(
            refused
                .expect_err("the CHECK still holds")
                .to_string()
                .contains("CHECK"),
        );
    }

    #[test]
    fn the_claim_and_the_look_ups_by_id_use_their_indexes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(dir.path().join("o.db"), Durability::Normal).expect("open");
        let plan = |sql: &str| -> String {
            let mut statement = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("plan");
            let nulls = vec![rusqlite::types::Null; statement.parameter_count()];
            let steps: Vec<String> = statement
                .query_map(rusqlite::params_from_iter(nulls), |row| row.get(3))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows");
            steps.join("; ")
        };
        let claim = plan(
            "UPDATE outbox_messages SET status = 'Sending' WHERE seq IN \
             (SELECT seq FROM outbox_messages WHERE destination = ?1 \
              AND status IN ('Pending', 'Sending') AND next_retry_at <= ?2 \
              ORDER BY next_retry_at LIMIT ?3)",
        );
        assert!(
            claim.contains("INDEX outbox_due (destination=? AND next_retry_at<?)"),
            "{claim}"
        );
        assert!(!claim.contains("SCAN outbox_messages"), "{claim}");
        let by_id = plan("SELECT status FROM outbox_messages WHERE message_id = ?1 AND seq = ?2");
        assert!(by_id.contains("INTEGER PRIMARY KEY (rowid=?)"), "{by_id}");
    }

    #[test]
    fn the_seq_of_an_id_is_the_same_in_rust_and_in_the_migration_sql() {
        let conn = Connection::open_in_memory().expect("memory");
        let sql = concat!(
            "SELECT CASE WHEN message_id GLOB '",
            uuid_glob!(),
            "' THEN ",
            outbox_seq_sql!(),
            " END FROM (SELECT ?1 AS message_id)"
        );
        let mut ids: Vec<String> = (0..2_000)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let mut state: u128 = 0x2545_f491_4f6c_dd1d;
        ids.extend((0..200).map(|_| {
            state = state
                .wrapping_mul(0x2d99_7879_26d4_6932_a4c1_f326_80f5_abfd)
                .wrapping_add(0x0123_4567_89ab_cdef);
            uuid::Uuid::from_u128(state).to_string()
        }));
        ids.extend(
            [
                "ffffffff-ffff-7fff-bfff-ffffffffffff",
                "00000000-0000-7000-8000-000000000000",
                "019ab5d3-7f00-7abc-8def-0123456789ab",
            ]
            .map(String::from),
        );
        for id in &ids {
            let in_sql: Option<i64> = conn.query_row(sql, [id], |row| row.get(0)).expect("sql");
            assert_eq!(in_sql, outbox_seq(id), "{id}");
            assert!(in_sql.is_some_and(|seq| seq >= 0), "{id}");
        }
        for text in [
            "id-0",
            "",
            "019AB5D3-7F00-7ABC-8DEF-0123456789AB",
            "019ab5d3-7f00-7abc-8def-0123456789ag",
            "019ab5d37f007abc8def0123456789ab",
            "019ab5d3-7f00-7abc-8def-0123456789abc",
        ] {
            let in_sql: Option<i64> = conn.query_row(sql, [text], |row| row.get(0)).expect("sql");
            assert_eq!((in_sql, outbox_seq(text)), (None, None), "{text:?}");
        }
        // The ids one process makes get distinct values, in their order
        // but for the rare wrap of the counter's low 15 bits.
        let seqs: Vec<i64> = ids[..2_000]
            .iter()
            .map(|id| outbox_seq(id).expect("uuid"))
            .collect();
        let distinct: std::collections::HashSet<_> = seqs.iter().collect();
        assert_eq!(distinct.len(), seqs.len());
        let in_order = seqs.windows(2).filter(|pair| pair[0] < pair[1]).count();
        assert!(in_order >= seqs.len() - 10, "{in_order} of {}", seqs.len());
    }

    #[test]
    fn migration_6_keeps_every_row_findable_and_dispatchable() {
        use crate::circuit::Admission;
        use crate::dispatcher::records::DispatchDb as _;
        use crate::dispatcher::{Outcome, Verdict};

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v5.db");
        let statuses = [
            "Pending",
            "Sending",
            "Sent",
            "Failed",
            "DeadLetter",
            "Expired",
        ];
        let now = now_ms();
        let mut ids: Vec<String> = statuses
            .iter()
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        // Two ids of one millisecond whose counters end alike share a seq;
        // and an id that is no UUID at all (written by hand).
        ids.push("00000000-0001-7000-8aaa-000000000000".to_owned());
        ids.push("00000000-0001-7000-9bbb-000000000001".to_owned());
        ids.push("hand-written".to_owned());
        {
            let mut conn = Connection::open(&path).expect("create");
            let tx = conn.transaction().expect("tx");
            for script in &MIGRATIONS[..5] {
                tx.execute_batch(script).expect("migrate to 5");
            }
            tx.pragma_update(None, "user_version", 5).expect("version");
            for (n, id) in ids.iter().enumerate() {
                let status = statuses.get(n).copied().unwrap_or("Pending");
                // Due now; a Sending row's lease ran out.
                tx.execute(
                    "INSERT INTO outbox_messages (message_id, correlation_id, message_type, \
                     destination, interface, version, fingerprint, endpoint, payload, headers, \
                     status, retry_count, max_retries, next_retry_at, lease_token, \
                     last_attempt_at, last_error, response, created_at, expires_at, sent_at, \
                     answered_at) \
                     VALUES (?1, 'c', 'Command', 'peer', 'p.S', 1, 'sha256:f', 'E', '{}', '{}', \
                     ?2, 2, 5, ?3, 'lease', 90, 'boom', '{\"ok\":1}', ?4, ?5, 95, 96)",
                    rusqlite::params![id, status, now - 1_000, n as i64, now + 3_600_000],
                )
                .expect("row");
            }
            tx.commit().expect("commit");
        }
        let columns = "message_id, correlation_id, message_type, destination, interface, \
            version, fingerprint, endpoint, payload, headers, status, retry_count, max_retries, \
            next_retry_at, lease_token, last_attempt_at, last_error, response, created_at, \
            expires_at, sent_at, answered_at";
        let dump = |conn: &Connection| -> Vec<String> {
            let mut statement = conn
                .prepare(&format!(
                    "SELECT {columns} FROM outbox_messages ORDER BY message_id"
                ))
                .expect("select");
            let count = statement.column_count();
            statement
                .query_map([], |row| {
                    (0..count)
                        .map(|i| {
                            row.get::<_, rusqlite::types::Value>(i)
                                .map(|v| format!("{v:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map(|values| values.join("|"))
                })
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        let before = dump(&Connection::open(&path).expect("reopen"));
        assert_eq!(before.len(), ids.len());
        let conn = open(&path, Durability::Normal).expect("migrate");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .expect("version");
        assert_eq!(version, MIGRATIONS.len() as i64, "migrated to the latest");
        assert_eq!(dump(&conn), before, "every row and column kept");
        let seq_of = |id: &str| -> i64 {
            conn.query_row(
                "SELECT seq FROM outbox_messages WHERE message_id = ?1",
                [id],
                |row| row.get(0),
            )
            .expect("seq")
        };
        let max_derived = ids[..statuses.len()]
            .iter()
            .map(|id| seq_of(id))
            .max()
            .expect("rows");
        for (n, id) in ids.iter().enumerate() {
            if n < statuses.len() {
                assert_eq!(Some(seq_of(id)), outbox_seq(id), "{id}");
                let parsed = uuid::Uuid::parse_str(id).expect("uuid");
                let found = crate::outbox::row(&conn, &parsed).expect("row");
                assert_eq!(found.map(|row| row.status.as_str()), Some(statuses[n]));
            } else {
                // Shared or no derived seq: a rowid past every derived one.
                assert!(seq_of(id) > max_derived, "{id}");
            }
        }
        let indexes: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'index' \
                 AND tbl_name = 'outbox_messages' AND sql IS NOT NULL ORDER BY name",
            )
            .expect("indexes")
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(indexes, ["outbox_attention", "outbox_due", "outbox_sent"]);
        assert!(
            conn.execute(
                "UPDATE outbox_messages SET status = 'Lost' WHERE message_id = ?1",
                [&ids[0]],
            )
            .expect_err("the CHECK still holds")
            .to_string()
            .contains("CHECK")
        );

        // The dispatcher claims the Pending rows and the Sending row whose
        // lease ran out (not the others), and records them Sent.
        let dispatch = crate::dispatcher::sqlite::SqliteDispatch::new(
            conn,
            None,
            Durability::Normal,
            Vec::new(),
        );
        let (claimed, result) = tokio::sync::oneshot::channel();
        dispatch.claim(
            &[("peer".to_owned(), Admission::Closed { batch_limit: 50 })],
            30_000,
            100,
            4,
            claimed,
            crate::dispatcher::records::ClaimCommit::Now,
        );
        let (groups, expired) = result.blocking_recv().expect("an answer").expect("claim");
        assert_eq!(expired, 0);
        let claimed: Vec<crate::dispatcher::Claimed> =
            groups.into_iter().flat_map(|group| group.rows).collect();
        let mut claimed_ids: Vec<&str> =
            claimed.iter().map(|row| row.message_id.as_str()).collect();
        claimed_ids.sort_unstable();
        let mut expected: Vec<&str> = vec![&ids[0], &ids[1]];
        expected.extend(ids[statuses.len()..].iter().map(String::as_str));
        expected.sort_unstable();
        assert_eq!(claimed_ids, expected);
        let attempts: Vec<_> = claimed
            .into_iter()
            .map(|row| {
                (
                    (row, Outcome::Unsendable(String::new()), Duration::ZERO),
                    Verdict::Sent {
                        response: serde_json::json!({"ok": true}),
                    },
                )
            })
            .collect();
        let counts = dispatch
            .record(&attempts, &crate::config::Config::default())
            .expect("record");
        assert_eq!(counts.sent, expected.len() as u64);
        let conn = open(&path, Durability::Normal).expect("reopen");
        let sent: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
                [],
                |row| row.get(0),
            )
            .expect("count");
        assert_eq!(sent, 1 + expected.len() as i64);
    }

    fn sha256_of(path: &Path) -> Vec<u8> {
        use sha2::Digest as _;
        sha2::Sha256::digest(std::fs::read(path).expect("read")).to_vec()
    }

    #[test]
    fn a_newer_rollback_journal_database_is_refused_unchanged() {
        let newer = MIGRATIONS.len() as i64 + 1;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("newer.db");
        {
            // Written by a "newer version": rollback journal, a
            // user_version one past this build's.
            let conn = Connection::open(&path).expect("create");
            conn.execute_batch(&format!(
                "CREATE TABLE t (x); PRAGMA user_version = {};",
                newer
            ))
            .expect("schema");
        }
        let before = sha256_of(&path);
        match open(&path, Durability::Full) {
            Err(error @ DbError::TooNew { found, .. }) if found == newer => {
                assert!(
                    error.to_string().contains("refusing to touch it"),
                    "{error}"
                );
            }
            other => panic!("expected TooNew, got {other:?}"),
        }
        assert_eq!(
            sha256_of(&path),
            before,
            "the file is byte-for-byte unchanged"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("newer.db")],
            "no -wal or -shm created"
        );
    }

    #[test]
    fn garbage_in_the_middle_of_a_database_is_refused_unchanged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("damaged.db");
        {
            let conn = open(&path, Durability::Normal).expect("create");
            conn.execute_batch(
                "CREATE TABLE business (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
                 CREATE INDEX business_text ON business (text);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
                 INSERT INTO business (text) SELECT printf('row %d %s', i, hex(randomblob(40))) FROM n;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .expect("fill");
        }
        let len = std::fs::metadata(&path).expect("size").len();
        assert!(len > 100_000, "a file of some size: {len}");
        {
            use std::io::{Seek as _, SeekFrom, Write as _};
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open for damage");
            file.seek(SeekFrom::Start(len / 2)).expect("seek");
            file.write_all(&[0xA5; 8192]).expect("garbage");
        }
        let before = sha256_of(&path);
        match preflight(&path, MIGRATIONS.len() as i64) {
            Err(error @ DbError::Corrupt { .. }) => {
                assert!(error.to_string().contains("damaged"), "{error}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(
            sha256_of(&path),
            before,
            "the file is byte-for-byte unchanged"
        );
    }

    #[test]
    fn uri_filenames_are_opened_and_preflighted_like_paths() {
        assert_eq!(
            file_of(Path::new("file:///srv/a%20b.db?vfs=unix#x")),
            Path::new("/srv/a b.db")
        );
        assert_eq!(
            file_of(Path::new("file://localhost/srv/a.db")),
            Path::new("/srv/a.db")
        );
        assert_eq!(file_of(Path::new("/srv/a.db")), Path::new("/srv/a.db"));
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.db");
        let uri = |file: &Path| format!("file:{}?vfs=unix", file.display());
        drop(open(uri(&good), Durability::Normal).expect("open through a URI"));
        assert!(good.exists());
        let notes = dir.path().join("notes.db");
        std::fs::write(&notes, vec![b'x'; 4096]).expect("write");
        assert!(matches!(
            open(uri(&notes), Durability::Normal),
            Err(DbError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused_unchanged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notes.db");
        std::fs::write(&path, vec![b'x'; 4096]).expect("write");
        let before = sha256_of(&path);
        assert!(matches!(
            open(&path, Durability::Normal),
            Err(DbError::Corrupt { .. })
        ));
        assert_eq!(sha256_of(&path), before);
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
