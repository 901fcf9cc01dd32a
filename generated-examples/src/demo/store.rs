//! Which database a demo service runs on (`--db`), and reading its rows.
//!
//! A SQLite file is the default: rusqlite, synchronous handlers (the
//! demo's embedded set-up, nothing to install). A `postgres://` URL runs the
//! same services on sqlx PostgreSQL with async handlers ([`super::pg`]).
//! Each service's handlers for both stores sit side by side in `hr.rs` and
//! `engine.rs`, their statements in both dialects ([`Sql`]); this module
//! only opens, counts and reads, and never writes a business row.

use std::path::{Path, PathBuf};

use super::pg::PgDatabase;

/// The database of a demo service.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// A SQLite file (created if missing): rusqlite, the default.
    Sqlite(PathBuf),
    /// A PostgreSQL database: sqlx, async handlers; several replicas of a
    /// service may share it.
    Postgres(PgDatabase),
}

impl Database {
    /// `postgres://…` or `postgresql://…` is PostgreSQL; anything else is
    /// a SQLite file path. The error shows the URL without its password.
    pub fn parse(text: &str) -> Result<Self, String> {
        let lower = text.to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            return PgDatabase::parse(text).map(Database::Postgres);
        }
        Ok(Database::Sqlite(PathBuf::from(text)))
    }

    /// The SQLite file, if this is one.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Database::Sqlite(path) => Some(path),
            Database::Postgres(_) => None,
        }
    }
}

impl From<PathBuf> for Database {
    fn from(path: PathBuf) -> Self {
        Database::Sqlite(path)
    }
}

impl std::fmt::Display for Database {
    /// The path, or the URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(database) => write!(f, "{database}"),
        }
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            Database::Postgres(database) => f.debug_tuple("Postgres").field(database).finish(),
        }
    }
}

/// One statement, or a service's tables, in both dialects.
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    /// For rusqlite (`?1` parameters).
    pub sqlite: &'static str,
    /// For sqlx PostgreSQL (`$1` parameters).
    pub postgres: &'static str,
}

/// Creates a service's tables in a SQLite file (statements with
/// `IF NOT EXISTS`).
pub fn create_sqlite_tables(path: &Path, tables: &Sql) -> anyhow::Result<()> {
    let conn = rfidl_runtime::store::sqlite::open(path, rfidl_runtime::Durability::Normal)?;
    Ok(conn.execute_batch(tables.sqlite)?)
}

/// Opens a SQLite file to read what the services wrote: no migration (the
/// services ran it at start-up), so polling it never takes the
/// migration's write lock.
pub fn open_sqlite_to_read(path: &Path) -> anyhow::Result<rfidl_runtime::rusqlite::Connection> {
    let conn = rfidl_runtime::rusqlite::Connection::open(path)?;
    conn.busy_timeout(rfidl_runtime::store::sqlite::BUSY_TIMEOUT)?;
    Ok(conn)
}

/// Counts rows with one query (the same SQL on both stores).
pub fn count(database: &Database, sql: &str) -> anyhow::Result<i64> {
    match database {
        Database::Sqlite(path) => {
            let conn = open_sqlite_to_read(path)?;
            Ok(conn
                .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))?
                .unwrap_or(0))
        }
        Database::Postgres(database) => super::pg::count(database, sql),
    }
}

/// Outbox rows of `database` per status.
pub fn outbox_counts(
    database: &Database,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    match database {
        Database::Sqlite(path) => Ok(rfidl_runtime::store::sqlite::outbox_counts(
            &open_sqlite_to_read(path)?,
        )?),
        Database::Postgres(database) => super::pg::outbox_counts(database),
    }
}

/// Makes up to `limit` delivered messages of `database`'s outbox due again,
/// as if their acknowledgements were lost; how many.
pub fn replay_sent(database: &Database, limit: i64) -> anyhow::Result<u64> {
    match database {
        Database::Sqlite(path) => Ok(open_sqlite_to_read(path)?.execute(
            "UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0 WHERE message_id IN \
             (SELECT message_id FROM outbox_messages WHERE status = 'Sent' LIMIT ?1)",
            [limit],
        )? as u64),
        Database::Postgres(database) => super::pg::replay_sent(database, limit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_url_is_postgresql_and_anything_else_a_file() {
        assert!(matches!(
            Database::parse("postgresql://a@h/d"),
            Ok(Database::Postgres(_))
        ));
        assert!(matches!(
            Database::parse("POSTGRES://a@h/d"),
            Ok(Database::Postgres(_))
        ));
        assert_eq!(
            Database::parse("hr.db").map(|d| d.sqlite_path().map(Path::to_path_buf)),
            Ok(Some(PathBuf::from("hr.db")))
        );
    }
}
