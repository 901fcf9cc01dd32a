//! The async PostgreSQL store on sqlx (cargo feature `sqlx-postgres`): the
//! store is `sqlx::Postgres`, its transactions are the caller's own.
//!
//! **One pool, the caller's.** [`PgStore::open`] takes the service's
//! `PgPool` (its size is the service's connection budget: the dispatcher
//! holds one connection while it claims or records, the wake-up listener
//! one, each receiver writer one while it commits), checks the server, the
//! credentials and the schema, and migrates. Generated async clients
//! enqueue on the connection of the caller's own `sqlx::Transaction`
//! (`client.hired(&mut *tx, …).await?`), so the message commits with the
//! caller's rows; async handlers run in the receiver's transaction on a
//! connection of the same pool.
//!
//! **Schema.** The tables of the blocking PostgreSQL store
//! (`store::pg_schema`), in the schema given to
//! [`open_in_schema`](PgStore::open_in_schema) (`public` by default): every
//! statement names its tables with that schema, so the caller's
//! `search_path` never matters. The schema must exist; rfidl creates its
//! tables in it, never the schema itself.
//!
//! **Wake-ups.** The enqueuing statement also `NOTIFY`s a channel of the
//! schema at commit, and the dispatcher `LISTEN`s on it: a message
//! enqueued by any replica wakes every dispatcher at once, without waiting
//! for a poll.
//!
//! **TLS.** What the pool's URL says: `sslmode=require` encrypts,
//! `sslmode=verify-full&sslrootcert=ca.pem` also checks the server's
//! certificate and name (rustls; the CA file or the webpki roots).

#[cfg(any(feature = "nats", feature = "amqp"))]
mod answers;
pub(crate) mod diagnostics;
mod dispatch;
mod inbox;
mod lifecycle;
pub(crate) mod retention;

/// The schema's migrations, in order: a database at version `n` has run
/// the first `n` (`rfidl_schema.version`).
pub use super::pg_schema::MIGRATIONS;

use std::sync::Arc;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Row as _};
use uuid::Uuid;

use crate::config::Config;
use crate::outbox::{OutboxError, OutgoingMessage};
use crate::store::{AnyStore, AsyncStore, Database, Location, StoreError};

/// A PostgreSQL database opened on a sqlx pool: what the outbox, the
/// dispatcher and the receiver of a `sqlx::Postgres` service are built on
/// (`Outbox::new(config, &store)`, `Receiver::builder(config, &store)`).
/// Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    target: String,
    statements: Vec<Arc<str>>,
    channel: String,
}

impl PartialEq for PgStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for PgStore {}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.inner.target)
            .field("schema", &self.inner.schema)
            .finish()
    }
}

impl std::fmt::Display for PgStore {
    /// `host:port/database (schema …)`: never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (schema {})", self.inner.target, self.inner.schema)
    }
}

impl PgStore {
    /// Opens the store in the schema `public` of `pool`'s database: see
    /// [`open_in_schema`](Self::open_in_schema).
    ///
    /// # Errors
    ///
    /// As [`open_in_schema`](Self::open_in_schema).
    pub async fn open(pool: PgPool) -> Result<Self, StoreError> {
        Self::open_in_schema(pool, "public").await
    }

    /// Opens the store in `schema` of `pool`'s database: connects (so a
    /// server that is down, refuses TLS or the credentials stops the
    /// start-up here), checks that the schema exists, and applies the
    /// migrations its tables lack (in one transaction, under an advisory
    /// lock, so replicas starting together migrate once).
    ///
    /// # Errors
    ///
    /// [`StoreError::Postgres`], naming the host, port and database and the
    /// cause (never the password); [`StoreError::TooNew`] when the schema
    /// was migrated by a newer rfidl.
    pub async fn open_in_schema(pool: PgPool, schema: &str) -> Result<Self, StoreError> {
        let target = target_of(&pool);
        let fail = |cause: String| StoreError::Postgres {
            target: target.clone(),
            cause,
        };
        if !is_identifier(schema) {
            return Err(fail(format!(
                "`{schema}` is not a schema name rfidl accepts (letters, digits and `_`, \
                 not starting with a digit, at most 63 bytes)"
            )));
        }
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| fail(format!("cannot connect: {}", error_text(&e))))?;
        let exists = sqlx::query("SELECT 1 FROM pg_namespace WHERE nspname = $1")
            .bind(schema)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| fail(error_text(&e)))?
            .is_some();
        if !exists {
            return Err(fail(format!(
                "schema `{schema}` does not exist: create it (`CREATE SCHEMA {schema}`) \
                 or open the store in another one"
            )));
        }
        migrate(&mut conn, schema, &target).await?;
        let prefix = format!("\"{schema}\".");
        Ok(Self {
            inner: Arc::new(Inner {
                statements: SQL
                    .iter()
                    .map(|template| Arc::from(template.replace("{t}", &prefix)))
                    .collect(),
                channel: format!("rfidl_outbox_{schema}"),
                pool,
                schema: schema.to_owned(),
                target,
            }),
        })
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema of rfidl's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// `host:port/database`, for messages.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The statement `index` of [`SQL`], its tables in the store's schema.
    fn sql(&self, index: usize) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(Arc::clone(&self.inner.statements[index]))
    }

    /// A failed statement, as a [`StoreError`].
    fn statement(&self, error: &sqlx::Error) -> StoreError {
        StoreError::PostgresStatement(error_text(error))
    }
}

/// The statements, `{t}` standing for the schema (`"public".`). Indexes
/// below.
const SQL: &[&str] = &[
    // INSERT_OUTBOX: the row, and a wake-up for the dispatchers at commit.
    "WITH m AS (INSERT INTO {t}outbox_messages (message_id, correlation_id, message_type, \
     destination, interface, version, fingerprint, endpoint, payload, headers, status, \
     max_retries, next_retry_at, created_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'Pending', $11, $12, $12, $13) RETURNING 1) \
     SELECT pg_notify($14, '') FROM m",
    // DISCOVER: a loose index scan, one probe per distinct destination.
    "WITH RECURSIVE d(destination) AS ( \
       (SELECT destination FROM {t}outbox_messages \
        WHERE status IN ('Pending', 'Sending') ORDER BY destination LIMIT 1) \
       UNION ALL \
       SELECT (SELECT o.destination FROM {t}outbox_messages o \
               WHERE o.status IN ('Pending', 'Sending') AND o.destination > d.destination \
               ORDER BY o.destination LIMIT 1) \
       FROM d WHERE d.destination IS NOT NULL) \
     SELECT destination FROM d WHERE destination IS NOT NULL",
    // DECOMMISSIONED
    "SELECT interface, version, decommissioned_at FROM {t}rf_decommissioned \
     ORDER BY interface, version",
    // CLAIM_DUE
    "UPDATE {t}outbox_messages SET status = 'Sending', lease_token = $1, next_retry_at = $2, \
     last_attempt_at = $3 \
     WHERE message_id IN (SELECT message_id FROM {t}outbox_messages \
         WHERE destination = $5 AND status IN ('Pending', 'Sending') AND next_retry_at <= $3 \
         ORDER BY next_retry_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
     RETURNING message_id, correlation_id, message_type, interface, version, fingerprint, \
         endpoint, payload, headers, retry_count, max_retries, created_at, expires_at",
    // EXPIRE
    "UPDATE {t}outbox_messages SET status = 'Expired', lease_token = NULL, \
     last_error = 'time to live exceeded' WHERE message_id = $1 AND lease_token = $2",
    // RELEASE
    "UPDATE {t}outbox_messages SET status = 'Pending', lease_token = NULL, next_retry_at = $3 \
     WHERE message_id = $1 AND lease_token = $2",
    // MARK_FINAL
    "UPDATE {t}outbox_messages SET status = $3, last_error = $4, lease_token = NULL \
     WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
    // SCHEDULE_RETRY
    "UPDATE {t}outbox_messages SET status = 'Pending', retry_count = $3, next_retry_at = $4, \
     last_error = $5, lease_token = NULL \
     WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
    // STILL_DECOMMISSIONED
    "SELECT 1 FROM {t}rf_decommissioned WHERE interface = $1 AND version = $2 FOR SHARE",
    // HOLD
    "UPDATE {t}outbox_messages SET status = 'Pending', next_retry_at = $3, \
     last_error = COALESCE($4, last_error), lease_token = NULL \
     WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
    // MARK_SENT_MANY
    "UPDATE {t}outbox_messages AS o SET status = 'Sent', sent_at = $1, \
     response = u.response, lease_token = NULL, last_error = NULL \
     FROM unnest($2::text[], $3::text[], $4::text[]) AS u(message_id, lease, response) \
     WHERE o.message_id = u.message_id AND o.lease_token = u.lease AND o.status = 'Sending'",
    // MARK_SENT
    "UPDATE {t}outbox_messages SET status = 'Sent', sent_at = $3, response = $4, \
     lease_token = NULL, last_error = NULL \
     WHERE message_id = $1 AND lease_token = $2 AND status = 'Sending'",
    // INBOX_CLAIM: waits for a concurrent copy's transaction to end.
    "INSERT INTO {t}inbox_messages (source_service_id, message_id, endpoint, payload_sha256, \
     processed_at, response, expires_at) VALUES ($1, $2, $3, $4, $5, NULL, $6) \
     ON CONFLICT (source_service_id, message_id) DO NOTHING",
    // INBOX_LOOKUP
    "SELECT endpoint, payload_sha256, processed_at, response, expires_at \
     FROM {t}inbox_messages WHERE source_service_id = $1 AND message_id = $2",
    // INBOX_RECORD
    "UPDATE {t}inbox_messages SET response = $3 WHERE source_service_id = $1 AND message_id = $2",
    // NEXT_DUE: when the next waiting row of a destination is due, after $2.
    "SELECT next_retry_at FROM {t}outbox_messages \
     WHERE destination = $1 AND status IN ('Pending', 'Sending') AND next_retry_at > $2 \
     ORDER BY next_retry_at LIMIT 1",
    // INBOX_CLAIM_ALL: INBOX_CLAIM for a group, in the order given (the
    // writers' one order, so two groups never wait on each other in a cycle).
    "INSERT INTO {t}inbox_messages (source_service_id, message_id, endpoint, payload_sha256, \
     processed_at, response, expires_at) \
     SELECT s, m, e, h, $5, NULL, $6 \
     FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bytea[]) WITH ORDINALITY AS u(s, m, e, h, n) \
     ORDER BY n \
     ON CONFLICT (source_service_id, message_id) DO NOTHING \
     RETURNING source_service_id, message_id",
    // INBOX_UNCLAIM
    "DELETE FROM {t}inbox_messages WHERE source_service_id = $1 AND message_id = $2",
];

const INSERT_OUTBOX: usize = 0;
const DISCOVER: usize = 1;
const DECOMMISSIONED: usize = 2;
const CLAIM_DUE: usize = 3;
const EXPIRE: usize = 4;
const RELEASE: usize = 5;
const MARK_FINAL: usize = 6;
const SCHEDULE_RETRY: usize = 7;
const STILL_DECOMMISSIONED: usize = 8;
const HOLD: usize = 9;
const MARK_SENT_MANY: usize = 10;
const MARK_SENT: usize = 11;
const INBOX_CLAIM: usize = 12;
const INBOX_LOOKUP: usize = 13;
const INBOX_RECORD: usize = 14;
const NEXT_DUE: usize = 15;
const INBOX_CLAIM_ALL: usize = 16;
const INBOX_UNCLAIM: usize = 17;

/// Applies the migrations the schema lacks, in one transaction, under the
/// migration lock; refuses a schema at a newer version.
async fn migrate(conn: &mut PgConnection, schema: &str, target: &str) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    let wrap = |error: sqlx::Error| StoreError::Postgres {
        target: target.to_owned(),
        cause: error_text(&error),
    };
    let migrations = super::pg_schema::MIGRATIONS;
    let supported = migrations.len() as i64;
    let mut tx = conn.begin().await.map_err(wrap)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(super::pg_schema::MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(wrap)?;
    // The migrations name no schema: they run with it as the search path.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET LOCAL search_path TO \"{schema}\";
         CREATE TABLE IF NOT EXISTS rfidl_schema (
             singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
             version BIGINT NOT NULL)"
    )))
    .execute(&mut *tx)
    .await
    .map_err(wrap)?;
    let found: i64 = sqlx::query("SELECT version FROM rfidl_schema")
        .fetch_optional(&mut *tx)
        .await
        .map_err(wrap)?
        .map(|row| row.get(0))
        .unwrap_or(0);
    if found > supported {
        return Err(StoreError::TooNew {
            path: format!("{target} (schema {schema})"),
            found,
            supported,
        });
    }
    for script in migrations.iter().skip(found as usize) {
        sqlx::raw_sql(*script)
            .execute(&mut *tx)
            .await
            .map_err(wrap)?;
    }
    if found < supported {
        sqlx::query(
            "INSERT INTO rfidl_schema (singleton, version) VALUES (TRUE, $1) \
             ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version",
        )
        .bind(supported)
        .execute(&mut *tx)
        .await
        .map_err(wrap)?;
    }
    tx.commit().await.map_err(wrap)
}

/// `host:port/database` of the pool's server.
fn target_of(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username())
    )
}

/// A PostgreSQL identifier rfidl puts in its statements unquoted-safe.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An error's message with its causes and, from the server, its SQLSTATE.
pub(crate) use crate::store::sqlx_error_text as error_text;

/// The store of `database`, when it is one.
pub(crate) fn store_of(database: &Database) -> Result<&PgStore, StoreError> {
    match database {
        Database::SqlxPostgres(store) => Ok(store),
        other => Err(StoreError::WrongStore {
            expected: "sqlx PostgreSQL",
            database: other.to_string(),
        }),
    }
}

impl Location for PgStore {
    type Store = sqlx::Postgres;

    fn into_database(self) -> Database {
        Database::SqlxPostgres(self)
    }
}

impl Location for &PgStore {
    type Store = sqlx::Postgres;

    fn into_database(self) -> Database {
        Database::SqlxPostgres(self.clone())
    }
}

impl From<PgStore> for Database {
    fn from(store: PgStore) -> Self {
        Database::SqlxPostgres(store)
    }
}

impl From<&PgStore> for Database {
    fn from(store: &PgStore) -> Self {
        Database::SqlxPostgres(store.clone())
    }
}

impl AnyStore for sqlx::Postgres {
    const NAME: &'static str = "sqlx-postgres";
}

impl AsyncStore for sqlx::Postgres {
    type Connection = PgConnection;
}

#[allow(private_interfaces)] // see `store::sealed`
impl crate::store::sealed::Common for sqlx::Postgres {
    type Service = dyn crate::receiver::AsyncHostedService<Self>;
    type Responder = dyn crate::responses::AsyncResponseHandler<Self>;
    type OnFailure = dyn crate::failures::AsyncFailureHandler<Self>;

    fn interfaces(service: &Self::Service) -> &[crate::receiver::HostedInterface] {
        service.interfaces()
    }

    fn open_dispatch(
        database: &Database,
        _: &Config,
        responses: Vec<Arc<Self::Responder>>,
        failures: crate::failures::FailureHandlers<Self::OnFailure>,
    ) -> Result<Arc<dyn crate::dispatcher::records::DispatchDb>, StoreError> {
        let store = store_of(database)?.clone();
        Ok(Arc::new(dispatch::SqlxDispatch::new(
            store, responses, failures,
        )?))
    }

    fn wake_on_commit(
        database: &Database,
        wake: Arc<tokio::sync::Notify>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        if let Ok(store) = store_of(database) {
            dispatch::listen(store.clone(), wake, stop);
        }
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
        database: &Database,
    ) -> crate::receiver::Registered<Self::Service> {
        crate::receiver::Registered(Arc::new(lifecycle::AsyncLifecycle {
            service,
            database: database.clone(),
        }))
    }

    const DEFAULT_WRITERS: usize = 4;

    fn start_inbox(
        database: &Database,
        writers: usize,
        parts: crate::receiver::WriterParts<Self>,
    ) -> Result<crate::receiver::Started, crate::receiver::ReceiverError> {
        inbox::start(store_of(database)?.clone(), writers, parts)
    }
}

#[allow(private_interfaces)] // see `store::sealed`
impl crate::store::sealed::AsyncBackend for sqlx::Postgres {
    fn enqueue<'a>(
        database: &'a Database,
        config: &'a Config,
        conn: &'a mut PgConnection,
        message: &'a OutgoingMessage,
    ) -> crate::BoxFuture<'a, Result<Uuid, OutboxError>> {
        Box::pin(async move {
            let store = store_of(database)?;
            let id = Uuid::now_v7();
            let due = message.due_ms(crate::store::now_ms());
            let expires_at = message.expires_ms(config, due);
            let max_retries = i64::from(message.max_retries.unwrap_or(config.outbox.max_retries));
            sqlx::query(store.sql(INSERT_OUTBOX))
                .bind(id.to_string())
                .bind(message.correlation_id.as_deref())
                .bind(message.message_type.as_str())
                .bind(&message.destination)
                .bind(&message.interface)
                .bind(i64::from(message.version))
                .bind(&message.fingerprint)
                .bind(&message.endpoint)
                .bind(serde_json::to_string(&message.payload)?)
                .bind(serde_json::to_string(&message.headers)?)
                .bind(max_retries)
                .bind(due)
                .bind(expires_at)
                .bind(&store.inner.channel)
                .execute(&mut *conn)
                .await?;
            Ok(id)
        })
    }
}

/// Runs `work` on a connection of its own (not the pool's), on a thread
/// with a runtime of its own: for the synchronous start of a part, which
/// may be called on an executor's thread, where the pool's runtime cannot
/// be blocked on. Never a hot path.
pub(crate) fn off_runtime<T: Send>(
    store: &PgStore,
    work: impl for<'c> FnOnce(&'c mut PgConnection) -> crate::BoxFuture<'c, Result<T, sqlx::Error>>
    + Send,
) -> Result<T, StoreError> {
    use sqlx::ConnectOptions as _;
    let options = store.pool().connect_options();
    let fail = |cause: String| StoreError::Postgres {
        target: store.target().to_owned(),
        cause,
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| fail(format!("cannot start a runtime: {e}")))?;
                runtime.block_on(async {
                    let mut conn = options
                        .connect()
                        .await
                        .map_err(|e| fail(format!("cannot connect: {}", error_text(&e))))?;
                    let done = work(&mut conn).await.map_err(|e| fail(error_text(&e)));
                    let _ = sqlx::Connection::close(conn).await;
                    done
                })
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The outbox `send` writer's group commit, on its own thread: every
/// message of `group` in one transaction on the pool, all written or none.
pub(crate) fn write_group(
    runtime: &tokio::runtime::Handle,
    database: &Database,
    config: &Config,
    group: &[crate::outbox::SendJob],
) -> Vec<Result<Uuid, OutboxError>> {
    use crate::store::sealed::AsyncBackend as _;
    let written = runtime.block_on(async {
        let store = store_of(database)?;
        let mut tx = store.pool().begin().await?;
        let mut ids = Vec::with_capacity(group.len());
        for (message, _) in group {
            ids.push(sqlx::Postgres::enqueue(database, config, &mut tx, message).await?);
        }
        tx.commit().await?;
        Ok::<_, OutboxError>(ids)
    });
    match written {
        Ok(ids) => ids.into_iter().map(Ok).collect(),
        Err(error) => {
            let text = error.to_string();
            group
                .iter()
                .map(|_| Err(OutboxError::Write(text.clone())))
                .collect()
        }
    }
}
