//! The async SQLite store on sqlx (cargo feature `sqlx-sqlite`): the store
//! is `sqlx::Sqlite`, its transactions are the caller's own.
//!
//! **One file, the blocking store's.** [`SqliteStore::open`] takes the
//! service's `SqlitePool` and runs the blocking SQLite store's pre-flight
//! check and migrations on the pool's file: both SQLite stores share one
//! schema (`PRAGMA user_version` counts the same migrations), and a file
//! written by a newer rfidl, or a damaged one, is refused unchanged.
//! Generated async clients enqueue on the connection of the caller's own
//! `sqlx::Transaction` (`client.hired(&mut *tx, …).await?`), so the message
//! commits with the caller's rows; async handlers run in the receiver's
//! transaction on a connection of the same pool.
//!
//! **What runs on the pool, and what on connections of its own.** What
//! the user's code touches runs on the pool: the enqueue, the receiver's
//! writer (one task: SQLite has one writer per file, and more would only
//! wait for its lock), the lifecycle commands, and the dispatcher's
//! recording of answers a response handler acts on. What it never
//! touches is the blocking store's, on the same file: the dispatcher's
//! claims (with its `<db>.dispatcher-lock` file, one dispatcher per file),
//! the inbox look-up, retention and the diagnostics. SQLite's file locks
//! order them all, as they order several processes on one file; every
//! write transaction of the store's begins `IMMEDIATE`, so none fails
//! half-way for a lock another took first.
//!
//! **One SQLite.** sqlx and rusqlite link the same `libsqlite3-sys`, so
//! the process has one SQLite library, whose locks know of both.
//!
//! **Durability.** The pool's connections commit with their own `PRAGMA
//! synchronous` (SQLite's default, `FULL`, unless the pool's options say
//! otherwise). Under `outbox.durability: full` an enqueue on a connection
//! that commits with less is refused ([`OutboxError::NotDurable`]), as on
//! the blocking store; under `inbox.durability: full` (the default) a
//! receiver on a pool whose connections commit with less does not start.

#[cfg(any(feature = "nats", feature = "amqp"))]
mod answers;
mod dispatch;
mod inbox;
mod lifecycle;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sqlx::sqlite::{SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::config::{Config, Durability};
use crate::outbox::{OutboxError, OutgoingMessage};
use crate::store::{AnyStore, AsyncStore, Database, Location, StoreError};

/// A SQLite file opened on a sqlx pool: what the outbox, the dispatcher and
/// the receiver of a `sqlx::Sqlite` service are built on
/// (`Outbox::new(config, &store)`, `Receiver::builder(config, &store)`).
/// Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    path: PathBuf,
    /// What the store's own connections open: `path`, or its `file:` URI
    /// naming the pool's VFS when the pool's options name one.
    location: PathBuf,
    /// `PRAGMA synchronous` of the pool's connections when it was opened.
    synchronous: i64,
}

impl PartialEq for SqliteStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for SqliteStore {}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl std::fmt::Display for SqliteStore {
    /// The file's path.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.inner.path.display())
    }
}

impl SqliteStore {
    /// Opens the store on `pool`'s file: connects (so a missing file the
    /// pool may not create, or a directory it cannot write, stops the
    /// start-up here), then, on a blocking thread, runs the SQLite store's
    /// pre-flight check (a file written by a newer rfidl, or a damaged one,
    /// is refused and left unchanged) and applies the migrations the file
    /// lacks. Sets the file's journal to WAL, as the blocking store does.
    ///
    /// # Errors
    ///
    /// [`StoreError::SqlxSqlite`] when the pool cannot connect or its
    /// database is in memory (the dispatcher, the inbox look-up and the
    /// diagnostics read the file on connections of their own);
    /// [`StoreError::TooNew`] and [`StoreError::Corrupt`] from the
    /// pre-flight check; [`StoreError::Sqlite`] when a migration fails.
    pub async fn open(pool: SqlitePool) -> Result<Self, StoreError> {
        let named = pool.connect_options().get_filename().to_path_buf();
        let fail = |cause: String| StoreError::SqlxSqlite {
            path: named.display().to_string(),
            cause,
        };
        // The file SQLite opened, as it names it (absolute): empty for an
        // in-memory database, however the pool's options asked for one
        // (`sqlite::memory:`, `mode=memory`, `.in_memory(true)`).
        let file: String = {
            let mut conn = pool.acquire().await.map_err(|e| {
                fail(format!(
                    "cannot connect: {}",
                    crate::store::sqlx_error_text(&e)
                ))
            })?;
            sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| fail(crate::store::sqlx_error_text(&e)))?
        };
        if file.is_empty() {
            return Err(fail(IN_MEMORY.to_owned()));
        }
        let path = PathBuf::from(file);
        let location = location_of(&path, &pool);
        let migrating = location.clone();
        tokio::task::spawn_blocking(move || {
            crate::store::sqlite::open(&migrating, Durability::Normal).map(drop)
        })
        .await
        .map_err(|e| fail(format!("the migration's thread failed: {e}")))??;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&pool)
            .await
            .map_err(|e| fail(crate::store::sqlx_error_text(&e)))?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                path,
                location,
                synchronous,
            }),
        })
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// The database file (absolute, as SQLite names it).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the store's own connections on the file open (the dispatcher's
    /// claims, the inbox look-up, retention, the diagnostics, the
    /// migrations): the file, or its `file:` URI naming the pool's VFS.
    pub(crate) fn location(&self) -> &Path {
        &self.inner.location
    }

    /// A failed statement, as a [`StoreError`].
    fn statement(error: &sqlx::Error) -> StoreError {
        StoreError::SqlxSqliteStatement(crate::store::sqlx_error_text(error))
    }
}

/// `path` as the store's own connections open it: through the VFS the
/// pool's options name (`SqliteConnectOptions::vfs`, `?vfs=` in its URL),
/// as a `file:` URI, so that they lock, read and write the file as the
/// pool's connections do (two VFSes with different locks on one file would
/// let two writers in at once); the path itself without one.
fn location_of(path: &Path, pool: &SqlitePool) -> PathBuf {
    use sqlx::ConnectOptions as _;
    let url = pool.connect_options().to_url_lossy();
    let Some((_, vfs)) = url.query_pairs().find(|(name, _)| name == "vfs") else {
        return path.to_path_buf();
    };
    // `file_of` (`store/sqlite/preflight.rs`) decodes `%XX` in the path.
    let escape = |text: &str, special: &[char]| -> String {
        text.chars()
            .map(|c| match c {
                c if c == '%' || special.contains(&c) => format!("%{:02X}", c as u32),
                c => c.to_string(),
            })
            .collect()
    };
    PathBuf::from(format!(
        "file:{}?vfs={}",
        escape(&path.to_string_lossy(), &['?', '#']),
        escape(&vfs, &['&', '#'])
    ))
}

const IN_MEMORY: &str = "an in-memory SQLite database cannot hold an rfidl store: the \
     dispatcher, the inbox look-up and the diagnostics read the file on connections of their \
     own; open the pool on a file";

/// The enqueue: the blocking store's INSERT (`store/sqlite/outbox.rs`).
/// `seq` (the rowid) is derived from the id; another process's id of the
/// same millisecond may take it, and the INSERT is then tried again with a
/// fresh id.
const INSERT_OUTBOX: &str = "INSERT INTO outbox_messages (seq, message_id, correlation_id, \
     message_type, destination, interface, version, fingerprint, endpoint, payload, headers, \
     status, max_retries, next_retry_at, created_at, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'Pending', ?12, ?13, ?13, ?14)";

/// The store of `database`, when it is one.
pub(crate) fn store_of(database: &Database) -> Result<&SqliteStore, StoreError> {
    match database {
        Database::SqlxSqlite(store) => Ok(store),
        other => Err(StoreError::WrongStore {
            expected: "sqlx SQLite",
            database: other.to_string(),
        }),
    }
}

impl Location for SqliteStore {
    type Store = sqlx::Sqlite;

    fn into_database(self) -> Database {
        Database::SqlxSqlite(self)
    }
}

impl Location for &SqliteStore {
    type Store = sqlx::Sqlite;

    fn into_database(self) -> Database {
        Database::SqlxSqlite(self.clone())
    }
}

impl From<SqliteStore> for Database {
    fn from(store: SqliteStore) -> Self {
        Database::SqlxSqlite(store)
    }
}

impl From<&SqliteStore> for Database {
    fn from(store: &SqliteStore) -> Self {
        Database::SqlxSqlite(store.clone())
    }
}

impl AnyStore for sqlx::Sqlite {
    const NAME: &'static str = "sqlx-sqlite";
}

impl AsyncStore for sqlx::Sqlite {
    type Connection = SqliteConnection;
}

#[allow(private_interfaces)] // see `store::sealed`
impl crate::store::sealed::Common for sqlx::Sqlite {
    type Service = dyn crate::receiver::AsyncHostedService<Self>;
    type Responder = dyn crate::responses::AsyncResponseHandler<Self>;
    type OnFailure = dyn crate::failures::AsyncFailureHandler<Self>;

    fn interfaces(service: &Self::Service) -> &[crate::receiver::HostedInterface] {
        service.interfaces()
    }

    fn open_dispatch(
        database: &Database,
        config: &Config,
        responses: Vec<Arc<Self::Responder>>,
        failures: crate::failures::FailureHandlers<Self::OnFailure>,
    ) -> Result<Arc<dyn crate::dispatcher::records::DispatchDb>, StoreError> {
        let store = store_of(database)?.clone();
        dispatch::open(store, config, responses, failures)
    }

    #[cfg(any(feature = "nats", feature = "amqp"))]
    fn open_answers(
        database: &Database,
        handlers: Vec<Arc<Self::Responder>>,
    ) -> Result<Arc<dyn crate::broker::AnswerStore>, StoreError> {
        Ok(answers::open(store_of(database)?, handlers))
    }

    #[cfg(any(feature = "nats", feature = "amqp"))]
    fn open_terminated(
        database: &Database,
    ) -> Result<Arc<dyn crate::broker::TerminatedStore>, StoreError> {
        Ok(answers::open_terminated(store_of(database)?))
    }

    fn lifecycle_service(
        service: crate::lifecycle::LifecycleService,
        _: &Database,
    ) -> crate::receiver::Registered<Self::Service> {
        crate::receiver::Registered(Arc::new(lifecycle::AsyncLifecycle { service }))
    }

    /// One: SQLite has one writer per file.
    const DEFAULT_WRITERS: usize = 1;

    fn start_inbox(
        database: &Database,
        writers: usize,
        parts: crate::receiver::WriterParts<Self>,
    ) -> Result<crate::receiver::Started, crate::receiver::ReceiverError> {
        inbox::start(store_of(database)?.clone(), writers, parts)
    }
}

#[allow(private_interfaces)] // see `store::sealed`
impl crate::store::sealed::AsyncBackend for sqlx::Sqlite {
    fn enqueue<'a>(
        database: &'a Database,
        config: &'a Config,
        conn: &'a mut SqliteConnection,
        message: &'a OutgoingMessage,
    ) -> crate::BoxFuture<'a, Result<Uuid, OutboxError>> {
        Box::pin(async move {
            store_of(database)?;
            if config.outbox.durability == Durability::Full {
                require_durable_commit(conn).await?;
            }
            insert(conn, config, message).await
        })
    }
}

/// Under `outbox.durability: full` the dispatcher's claim relies on every
/// enqueuing transaction being durable when it commits: refuses a
/// connection whose `synchronous` level is below `FULL` (2), as the
/// blocking store does.
async fn require_durable_commit(conn: &mut SqliteConnection) -> Result<(), OutboxError> {
    let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await?;
    match level {
        2.. => Ok(()),
        1 => Err(OutboxError::NotDurable { found: "NORMAL" }),
        _ => Err(OutboxError::NotDurable { found: "OFF" }),
    }
}

/// The blocking store's INSERT, on `conn`.
async fn insert(
    conn: &mut SqliteConnection,
    config: &Config,
    message: &OutgoingMessage,
) -> Result<Uuid, OutboxError> {
    const ATTEMPTS: usize = 8;
    let primary_key = rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY.to_string();
    let due = message.due_ms(crate::store::now_ms());
    let expires_at = message.expires_ms(config, due);
    let max_retries = i64::from(message.max_retries.unwrap_or(config.outbox.max_retries));
    let payload = serde_json::to_string(&message.payload)?;
    let headers = serde_json::to_string(&message.headers)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let id = Uuid::now_v7();
        let text = id.to_string();
        let result = sqlx::query(INSERT_OUTBOX)
            .bind(crate::store::sqlite::outbox_seq(&text))
            .bind(&text)
            .bind(message.correlation_id.as_deref())
            .bind(message.message_type.as_str())
            .bind(&message.destination)
            .bind(&message.interface)
            .bind(i64::from(message.version))
            .bind(&message.fingerprint)
            .bind(&message.endpoint)
            .bind(&payload)
            .bind(&headers)
            .bind(max_retries)
            .bind(due)
            .bind(expires_at)
            .execute(&mut *conn)
            .await;
        match result {
            Ok(_) => return Ok(id),
            Err(error)
                if attempt < ATTEMPTS
                    && error
                        .as_database_error()
                        .and_then(|e| e.code())
                        .is_some_and(|code| code == primary_key) =>
            {
                continue;
            }
            Err(error) => return Err(error.into()),
        }
    }
}
