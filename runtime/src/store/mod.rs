//! Which database a service keeps its outbox and inbox in: SQLite (the
//! embedded default, blocking [`rusqlite`] transactions), or on sqlx (cargo
//! features `sqlx-postgres`, for services that run as several replicas on
//! one database, and `sqlx-sqlite`) with async transactions.
//!
//! Application code meets the store in two places, and both are typed by a
//! [`Store`]:
//!
//! * a generated client enqueues in the caller's own transaction, and
//! * a generated handler trait (and a hand-written
//!   [`HostedService`](crate::receiver::HostedService) or
//!   [`ResponseHandler`](crate::responses::ResponseHandler)) is given the
//!   open transaction of the receiver's store, so the handler's business
//!   writes and the inbox row commit together.
//!
//! That transaction is [`Store::Handle`], `&rusqlite::Transaction` for
//! [`Sqlite`]; on the sqlx stores ([`AsyncStore`]) it is the connection of
//! the caller's `sqlx::Transaction` (`&mut sqlx::PgConnection`,
//! `&mut sqlx::SqliteConnection`), and the generated code is async (the
//! `aio` modules). Every trait and client that takes one has a type
//! parameter `S`, `Sqlite` by default, so code written against SQLite
//! compiles unchanged, and a service on sqlx names its store once
//! (`impl aio::EngineHandler<sqlx::Postgres> for MyEngine`).
//!
//! Where the database is: [`Database`], a file path, or a sqlx store opened
//! on the caller's pool.

mod error;
#[cfg(feature = "sqlx-postgres")]
mod pg_schema;
pub mod sqlite;
#[cfg(feature = "sqlx-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-postgres")))]
pub mod sqlx_postgres;
#[cfg(feature = "sqlx-sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-sqlite")))]
pub mod sqlx_sqlite;

pub use error::StoreError;

use std::path::{Path, PathBuf};

// `Common` and `Backend` are public only as supertraits; nothing outside the
// crate can name them, so their crate-private argument types never leak.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use std::sync::Arc;

    use uuid::Uuid;

    use super::StoreError;
    use crate::config::Config;
    use crate::dispatcher::records::DispatchDb;
    use crate::outbox::{OutboxError, OutgoingMessage};
    use crate::receiver::{ReceiverError, Started, WriterParts};

    /// What every store gives the parts above it (outbox, dispatcher,
    /// receiver), whether its transactions block ([`Store`](super::Store))
    /// or are async ([`AsyncStore`](super::AsyncStore)): written once per
    /// store, in its folder. Private to the crate, so the stores are sealed.
    pub trait Common: Send + Sync + Sized + 'static {
        /// A hosted service as the receiver runs it:
        /// `dyn HostedService<Self>` or `dyn AsyncHostedService<Self>`.
        type Service: ?Sized + Send + Sync + 'static;
        /// A response handler as the dispatcher runs it:
        /// `dyn ResponseHandler<Self>` or `dyn AsyncResponseHandler<Self>`.
        type Responder: ?Sized + Send + Sync + 'static;
        /// A failure handler as the dispatcher runs it:
        /// `dyn FailureHandler<Self>` or `dyn AsyncFailureHandler<Self>`.
        type OnFailure: ?Sized + Send + Sync + 'static;

        /// The interface versions `service` hosts.
        fn interfaces(service: &Self::Service) -> &[crate::receiver::HostedInterface];

        /// Opens the dispatcher's claims and results on `database`.
        fn open_dispatch(
            database: &super::Database,
            config: &Config,
            responses: Vec<Arc<Self::Responder>>,
            failures: crate::failures::FailureHandlers<Self::OnFailure>,
        ) -> Result<Arc<dyn DispatchDb>, StoreError>;

        /// Wakes `wake` when another process commits an enqueue, until
        /// `stop`, where the store can tell (PostgreSQL's `LISTEN`); else
        /// the dispatcher's poll finds such rows.
        fn wake_on_commit(
            database: &super::Database,
            wake: Arc<tokio::sync::Notify>,
            stop: tokio_util::sync::CancellationToken,
        ) {
            let _ = (database, wake, stop);
        }

        /// Opens the sender's database for a broker answers consumer that
        /// runs `handlers` (`store/<name>/answers.rs`).
        #[cfg(any(feature = "nats", feature = "amqp"))]
        fn open_answers(
            database: &super::Database,
            handlers: Vec<Arc<Self::Responder>>,
        ) -> Result<Arc<dyn crate::broker::AnswerStore>, StoreError>;

        /// Opens the table an inbound broker consumer records the
        /// deliveries it gives up on in (`rf_terminated`).
        #[cfg(any(feature = "nats", feature = "amqp"))]
        fn open_terminated(
            database: &super::Database,
        ) -> Result<Arc<dyn crate::broker::TerminatedStore>, StoreError>;

        /// The control service (`crate::lifecycle`) as this store's
        /// receiver runs it, writing to `database`.
        fn lifecycle_service(
            service: crate::lifecycle::LifecycleService,
            database: &super::Database,
        ) -> crate::receiver::Registered<Self::Service>;

        /// Writers a receiver runs when it is not told.
        const DEFAULT_WRITERS: usize;

        /// Opens (and migrates) the inbox on `database`, starts `writers`
        /// writers.
        fn start_inbox(
            database: &super::Database,
            writers: usize,
            parts: WriterParts<Self>,
        ) -> Result<Started, ReceiverError>;
    }

    /// What a store with blocking transactions adds: the statements that
    /// run in the caller's transaction.
    pub trait Backend: Common {
        /// Writes `message` to the outbox in `tx` (the caller's transaction);
        /// the part above adds the span, the metrics and the wake-up.
        fn enqueue(
            config: &Config,
            tx: <Self as super::Store>::Handle<'_, '_>,
            message: &OutgoingMessage,
        ) -> Result<Uuid, OutboxError>
        where
            Self: super::Store;

        /// Records a lifecycle command as its version's last applied; the
        /// newer one recorded (nothing written) when there is one.
        fn record_applied(
            tx: &mut <Self as super::Store>::Handle<'_, '_>,
            applied: &crate::lifecycle::Applied<'_>,
        ) -> Result<Option<(i64, String)>, StoreError>
        where
            Self: super::Store;

        /// Decommissions a version and holds its pending rows:
        /// (decommissioned at, rows held).
        fn hold_version(
            tx: &mut <Self as super::Store>::Handle<'_, '_>,
            interface: &str,
            version: u32,
            now: i64,
            reason: &str,
        ) -> Result<(i64, u64), StoreError>
        where
            Self: super::Store;

        /// Re-commissions a version and releases its held rows: how many.
        fn release_version(
            tx: &mut <Self as super::Store>::Handle<'_, '_>,
            interface: &str,
            version: u32,
            now: i64,
            reason: &str,
        ) -> Result<u64, StoreError>
        where
            Self: super::Store;
    }

    /// What an async store adds: the statements that run in the caller's
    /// transaction, awaited.
    pub trait AsyncBackend: Common {
        /// Writes `message` to the outbox on `conn` (the caller's
        /// transaction); the part above adds the span, the metrics and the
        /// wake-up.
        fn enqueue<'a>(
            database: &'a super::Database,
            config: &'a Config,
            conn: &'a mut <Self as super::AsyncStore>::Connection,
            message: &'a OutgoingMessage,
        ) -> crate::BoxFuture<'a, Result<Uuid, OutboxError>>
        where
            Self: super::AsyncStore;
    }
}

/// Any store rfidl can keep its outbox and inbox in: one whose
/// transactions block ([`Store`]: [`Sqlite`]) or one driven by
/// an async sqlx pool ([`AsyncStore`]: `sqlx::Postgres`, `sqlx::Sqlite`).
/// The outbox, the dispatcher and the receiver are typed by it. Sealed.
pub trait AnyStore: sealed::Common {
    /// The store's name, as shown in diagnostics (`sqlite`,
    /// `sqlx-postgres`, `sqlx-sqlite`).
    const NAME: &'static str;
}

/// A store whose transactions block: handlers and clients are synchronous
/// functions. Sealed: [`Sqlite`].
pub trait Store:
    AnyStore
    + sealed::Backend
    + sealed::Common<
        Service = dyn crate::receiver::HostedService<Self>,
        Responder = dyn crate::responses::ResponseHandler<Self>,
        OnFailure = dyn crate::failures::FailureHandler<Self>,
    >
{
    /// The open transaction that handlers write through and clients enqueue
    /// in: `&'a rusqlite::Transaction<'c>`.
    type Handle<'a, 'c: 'a>;

    /// A shorter-lived copy of `handle`, so code generic over the store can
    /// pass its transaction on more than once (to a client, then to its own
    /// statements): `S::reborrow(&mut tx)`. (With a concrete store the
    /// compiler reborrows by itself.)
    fn reborrow<'s, 'a: 's, 'c: 'a>(handle: &'s mut Self::Handle<'a, 'c>) -> Self::Handle<'s, 'c>;
}

/// A store on an async sqlx pool: clients enqueue on the caller's own
/// `sqlx::Transaction` (the connection behind it, `&mut *tx`), and handlers
/// are `async fn`s that write through the receiver's transaction. Sealed:
/// `sqlx::Postgres` (cargo feature `sqlx-postgres`) and `sqlx::Sqlite`
/// (`sqlx-sqlite`).
pub trait AsyncStore:
    AnyStore
    + sealed::AsyncBackend
    + sealed::Common<
        Service = dyn crate::receiver::AsyncHostedService<Self>,
        Responder = dyn crate::responses::AsyncResponseHandler<Self>,
        OnFailure = dyn crate::failures::AsyncFailureHandler<Self>,
    >
{
    /// The connection a transaction runs on: `sqlx::PgConnection` or
    /// `sqlx::SqliteConnection`. A `sqlx::Transaction` dereferences to it.
    type Connection: Send + 'static;
}

/// Where the database of a known store is: what the constructors of the
/// store-typed parts take, and what decides their store, so code written for
/// SQLite names no store. A SQLite file is any path (`"service.db"`,
/// `PathBuf`); a database on sqlx is its opened store (`&PgStore`,
/// `&SqliteStore`).
/// A store chosen at run time ([`Database`], from `--db`) is matched once,
/// by the caller.
pub trait Location {
    /// The store this database belongs to.
    type Store: AnyStore;

    /// The database, for the parts that are not typed by a store.
    fn into_database(self) -> Database;
}

impl<P: AsRef<Path>> Location for P {
    type Store = Sqlite;

    fn into_database(self) -> Database {
        Database::Sqlite(self.as_ref().to_path_buf())
    }
}

/// The embedded default: one SQLite file per service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sqlite {}

impl AnyStore for Sqlite {
    const NAME: &'static str = "sqlite";
}

impl Store for Sqlite {
    type Handle<'a, 'c: 'a> = &'a rusqlite::Transaction<'c>;

    fn reborrow<'s, 'a: 's, 'c: 'a>(handle: &'s mut Self::Handle<'a, 'c>) -> Self::Handle<'s, 'c> {
        handle
    }
}

/// Where a service's database is: a SQLite file, or a store on sqlx.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Database {
    /// A SQLite file (created if missing), or a SQLite URI filename.
    Sqlite(PathBuf),
    /// A PostgreSQL database on a sqlx pool, opened by
    /// [`PgStore::open`](sqlx_postgres::PgStore::open).
    #[cfg(feature = "sqlx-postgres")]
    SqlxPostgres(sqlx_postgres::PgStore),
    /// A SQLite file on a sqlx pool, opened by
    /// [`SqliteStore::open`](sqlx_sqlite::SqliteStore::open).
    #[cfg(feature = "sqlx-sqlite")]
    SqlxSqlite(sqlx_sqlite::SqliteStore),
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(store) => f.debug_tuple("SqlxPostgres").field(store).finish(),
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(store) => f.debug_tuple("SqlxSqlite").field(store).finish(),
        }
    }
}

impl std::fmt::Display for Database {
    /// The path, or the URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(store) => write!(f, "{store}"),
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(store) => write!(f, "{store}"),
        }
    }
}

/// A `--db` value that names no usable database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatabaseError {
    /// A `postgres://` URL: PostgreSQL is a store on the caller's sqlx
    /// pool, opened with `PgStore::open`, never from a URL alone.
    #[error(
        "`{0}` is a PostgreSQL URL: open the database on your `sqlx::PgPool` with \
         `rfidl_runtime::store::sqlx_postgres::PgStore::open` (cargo feature `sqlx-postgres`) \
         and give the store instead"
    )]
    PostgresUrl(String),
}

impl Database {
    /// A file path is SQLite; a `postgres://…` or `postgresql://…` URL is
    /// refused with the way to open it (a [`PgStore`](sqlx_postgres::PgStore)
    /// on the caller's pool).
    pub fn parse(text: &str) -> Result<Self, DatabaseError> {
        let lower = text.to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            return Err(DatabaseError::PostgresUrl(crate::redact::url_password(
                text,
            )));
        }
        Ok(Database::Sqlite(PathBuf::from(text)))
    }

    /// The SQLite file, if this is one of the blocking SQLite store (a
    /// file on a sqlx pool: [`SqliteStore::path`](sqlx_sqlite::SqliteStore::path)).
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Database::Sqlite(path) => Some(path),
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(_) => None,
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(_) => None,
        }
    }

    /// The store's name (`sqlite`, `sqlx-postgres`, `sqlx-sqlite`).
    pub fn store_name(&self) -> &'static str {
        match self {
            Database::Sqlite(_) => Sqlite::NAME,
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(_) => <::sqlx::Postgres as AnyStore>::NAME,
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(_) => <::sqlx::Sqlite as AnyStore>::NAME,
        }
    }
}

impl<P: AsRef<Path>> From<P> for Database {
    fn from(path: P) -> Self {
        Database::Sqlite(path.as_ref().to_path_buf())
    }
}

/// The decommissioned versions and their held rows (the same SQL on both
/// stores; `4611686018427387904` is [`crate::lifecycle::HELD_DUE_MS`]).
pub(crate) const DECOMMISSIONED_SQL: &str = "SELECT d.interface, d.version, d.decommissioned_at, \
     (SELECT COUNT(*) FROM outbox_messages o WHERE o.status IN ('Pending', 'Sending') \
      AND o.status = 'Pending' AND o.next_retry_at >= 4611686018427387904 \
      AND o.interface = d.interface AND o.version = d.version) \
     FROM rf_decommissioned d ORDER BY d.interface, d.version";

/// A sqlx error's message with its causes and, from the database, its
/// code: what both sqlx stores show.
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) fn sqlx_error_text(error: &::sqlx::Error) -> String {
    if let Some(db) = error.as_database_error() {
        return match db.code() {
            Some(code) => format!("{} ({code})", db.message()),
            None => db.message().to_owned(),
        };
    }
    crate::chain::with_causes(error)
}

/// Milliseconds since the Unix epoch, the unit of every stored time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
