//! [`StoreError`]: why a service database could not be opened, migrated or
//! trusted. Data only; it never retries or repairs anything.

/// Errors opening or migrating a database, or of a statement on a
/// connection a part already holds.
///
/// A SQLite file refused when it is opened ([`TooNew`](Self::TooNew),
/// [`Corrupt`](Self::Corrupt)) is left byte-for-byte unchanged: the
/// pre-flight check runs before any migration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Opening, configuring or migrating a SQLite file failed (permissions,
    /// a missing directory, the file locked by another program beyond the
    /// busy timeout, disk full). The source says which; fix the file or its
    /// directory and start again.
    #[error("database {path}: {source}")]
    Sqlite {
        /// The file's path, as given.
        path: String,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The database was written by a newer rfidl (its schema version is
    /// higher than this build knows): it is refused untouched rather than
    /// misread. Upgrade this program, or point it at another database.
    #[error(
        "database {path} has schema version {found}, newer than the {supported} this build knows; \
         refusing to touch it (upgrade this program)"
    )]
    TooNew {
        /// The SQLite file, or the PostgreSQL `host:port/database`.
        path: String,
        /// The schema version the database holds (SQLite's `user_version`,
        /// PostgreSQL's `rfidl_schema.version`).
        found: i64,
        /// The newest schema version this build migrates to.
        supported: i64,
    },
    /// A PostgreSQL database that cannot be reached or used: the
    /// connection failed (within the URL's `connect_timeout`, 10 s by
    /// default), was lost, or a migration statement failed. Parts reopen a
    /// broken connection before their next use, so a running service
    /// recovers once the server is back.
    #[cfg(feature = "sqlx-postgres")]
    #[error("PostgreSQL database at {target}: {cause}")]
    Postgres {
        /// `host:port/database`; never the password.
        target: String,
        /// The server's or the client's message.
        cause: String,
    },
    /// The SQLite file fails its pre-flight `quick_check` or is not a
    /// database at all. Nothing was written to it; restore it from a backup.
    #[error(
        "database {path} is damaged ({detail}); refusing to start on it. The file was not \
         changed: restore it from a backup, or inspect it with `sqlite3 {path} \"PRAGMA integrity_check\"`"
    )]
    Corrupt {
        /// The SQLite file.
        path: String,
        /// What the pre-flight found: SQLite's `quick_check` findings, or
        /// its open error (not a database, a damaged header).
        detail: String,
    },
    /// A statement failed on a connection the part already holds (shown
    /// without the database's name: such errors may reach a peer).
    #[error("{0}")]
    SqliteStatement(#[source] rusqlite::Error),
    /// The same on PostgreSQL.
    #[cfg(feature = "sqlx-postgres")]
    #[error("{0}")]
    PostgresStatement(String),
    /// A SQLite file on a sqlx pool that cannot be used: the pool cannot
    /// connect to it, it is an in-memory database (which the dispatcher,
    /// the receiver and the diagnostics, on connections of their own,
    /// could never see), or a connection of the pool commits with less
    /// durability than the configuration asks for.
    #[cfg(feature = "sqlx-sqlite")]
    #[error("database {path}: {cause}")]
    SqlxSqlite {
        /// The file, as the pool names it.
        path: String,
        /// What went wrong.
        cause: String,
    },
    /// A sqlx statement failed on a SQLite connection the part already
    /// holds (shown without the file's name).
    #[cfg(feature = "sqlx-sqlite")]
    #[error("{0}")]
    SqlxSqliteStatement(String),
    /// A connection's lock was poisoned: a thread panicked while using it.
    #[error("the database connection is unusable: a thread panicked while using it")]
    Poisoned,
    /// A part of one store was given another store's database.
    #[error("`{database}` is not a {expected} database")]
    WrongStore {
        /// The store the part is typed for, `SQLite` or `PostgreSQL`.
        expected: &'static str,
        /// The database it was given (a PostgreSQL URL without its
        /// password).
        database: String,
    },
}
