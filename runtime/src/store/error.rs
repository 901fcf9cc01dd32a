//! [`StoreError`]: why a service database could not be opened, migrated or
//! trusted. Data only; it never retries or repairs anything.

/// Errors opening or migrating a database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
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
    /// A statement failed on a connection the part already holds (shown
    /// without the database's name: such errors may reach a peer).
    #[error("{0}")]
    SqliteStatement(#[source] rusqlite::Error),
    /// The same on PostgreSQL.
    #[cfg(feature = "postgres")]
    #[error("{0}")]
    PostgresStatement(String),
    /// A connection's lock was poisoned: a thread panicked while using it.
    #[error("the database connection is unusable: a thread panicked while using it")]
    Poisoned,
    /// A part of one store was given another store's database.
    #[error("`{database}` is not a {expected} database")]
    WrongStore {
        expected: &'static str,
        database: String,
    },
}
