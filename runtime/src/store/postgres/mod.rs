//! The PostgreSQL store (cargo feature `postgres`): connection set-up,
//! schema migrations, and the outbox and inbox statements in PostgreSQL's
//! dialect.
//!
//! **Client.** The synchronous `postgres` crate (the blocking face of
//! `tokio-postgres`). Handlers are synchronous and run on dedicated writer
//! threads, as on SQLite, and they are handed a `postgres::Transaction`; the
//! dispatcher's statements run on the blocking pool like its SQLite ones.
//! Each part owns its connections (the dispatcher one, the receiver one per
//! writer thread, the outbox's `send` one, diagnostics and retention one
//! each), so no pool is needed. A connection that broke is opened again
//! before its next use; the work it was doing is retried (claims and results
//! are fenced by the lease token, inbox writes by the primary key).
//!
//! **Schema.** The same tables and columns as on SQLite, times as BIGINT
//! milliseconds, ids as TEXT. Migrations are data, as on SQLite, applied in
//! one transaction under an advisory lock, so replicas starting together
//! migrate once; `rfidl_schema.version` records how many ran, and a database
//! at a version this build does not know is refused, never altered.

#[cfg(any(feature = "nats", feature = "amqp"))]
mod answers;
pub(crate) mod diagnostics;
mod dispatch;
mod inbox;
pub(crate) mod lifecycle;
pub(crate) mod retention;

pub(crate) use dispatch::PostgresDispatch;
pub(crate) use inbox::start_receiver;

use std::time::Duration;

use postgres::types::Type;
use postgres::{Client, NoTls};
use uuid::Uuid;

use crate::config::Config;
use crate::outbox::{OutboxError, OutgoingMessage};
use crate::store::DatabaseError;
use crate::store::StoreError;

/// A PostgreSQL connection URL (`postgres://user:password@host:port/db`).
/// Its `Display` and `Debug` forms hide the password.
#[derive(Clone)]
pub struct PostgresUrl {
    text: String,
    config: postgres::Config,
}

impl PartialEq for PostgresUrl {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for PostgresUrl {}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", crate::redact::url_password(&self.text))
    }
}

impl std::fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::redact::url_password(&self.text))
    }
}

/// How long a connection attempt may take when the URL does not say
/// (`connect_timeout=`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl PostgresUrl {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn parse(text: &str) -> Result<Self, DatabaseError> {
        let mut config: postgres::Config =
            text.parse()
                .map_err(|error: postgres::Error| DatabaseError::InvalidUrl {
                    url: crate::redact::url_password(text),
                    reason: error_text(&error),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("rfidl");
        }
        Ok(Self {
            text: text.to_owned(),
            config,
        })
    }

    /// The URL as given, password included: pass it on, never log it (the
    /// `Display` form hides the password).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `host:port/database`, for error messages.
    pub fn target(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|host| match host {
                postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports = self.config.get_ports();
        let port = ports.first().copied().unwrap_or(5432);
        let host = if hosts.is_empty() {
            "localhost".to_owned()
        } else {
            hosts.join(",")
        };
        let database = self
            .config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or("postgres");
        format!("{host}:{port}/{database}")
    }

    /// Opens a connection (no TLS: reach the database over a private
    /// network, a unix socket or a TLS-terminating proxy). May be called on
    /// an async executor (it then connects on a thread of its own).
    pub fn connect(&self) -> Result<Client, StoreError> {
        off_runtime(|| {
            self.config
                .connect(NoTls)
                .map_err(|error| StoreError::Postgres {
                    target: self.target(),
                    cause: format!("cannot connect: {}", error_text(&error)),
                })
        })
    }
}

/// An error's message with its causes (`postgres::Error`'s own `Display`
/// says only "error connecting to server" or "db error").
/// A failed statement on a connection a part holds.
pub(crate) fn statement(error: &postgres::Error) -> StoreError {
    StoreError::PostgresStatement(error_text(error))
}

pub(crate) fn error_text(error: &postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!("{} ({})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            text.push_str(": ");
            text.push_str(detail);
        }
        return text;
    }
    crate::chain::with_causes(error)
}

use super::pg_schema::MIGRATION_LOCK;
pub use super::pg_schema::MIGRATIONS;

/// Connects and migrates: the start-up of every part on PostgreSQL. May be
/// called on an async executor.
pub fn open(url: &PostgresUrl) -> Result<Client, StoreError> {
    off_runtime(|| {
        let mut client = url.connect()?;
        migrate(&mut client, url, MIGRATIONS)?;
        Ok(client)
    })
}

/// Runs `work` where the synchronous client may run: here, or, on a tokio
/// runtime's thread (where the client's own runtime cannot start), on a
/// scoped thread of its own. For start-up and clean-up, never a hot path.
pub(crate) fn off_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    std::thread::scope(|scope| match scope.spawn(work).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Applies the `migrations` the database lacks, in one transaction, under
/// the migration lock; refuses a database at a newer version.
pub(crate) fn migrate(
    client: &mut Client,
    url: &PostgresUrl,
    migrations: &[&str],
) -> Result<(), StoreError> {
    let wrap = |error: postgres::Error| StoreError::Postgres {
        target: url.target(),
        cause: error_text(&error),
    };
    let supported = migrations.len() as i64;
    let mut tx = client.transaction().map_err(wrap)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(wrap)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS rfidl_schema (\
             singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton), \
             version BIGINT NOT NULL)",
    )
    .map_err(wrap)?;
    let found: i64 = tx
        .query_opt("SELECT version FROM rfidl_schema", &[])
        .map_err(wrap)?
        .map(|row| row.get(0))
        .unwrap_or(0);
    if found > supported {
        return Err(StoreError::TooNew {
            path: url.target(),
            found,
            supported,
        });
    }
    for script in migrations.iter().skip(found as usize) {
        tx.batch_execute(script).map_err(wrap)?;
    }
    if found < supported {
        tx.execute(
            "INSERT INTO rfidl_schema (singleton, version) VALUES (TRUE, $1) \
             ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version",
            &[&supported],
        )
        .map_err(wrap)?;
    }
    tx.commit().map_err(wrap)
}

/// A connection that is opened again when it broke. Dropping it closes the
/// session, off any async executor.
pub(crate) struct Connection {
    url: PostgresUrl,
    client: Option<Client>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // The client's `Drop` runs its own runtime, which cannot start on
            // a runtime's thread (the dispatcher's state is dropped on one).
            if tokio::runtime::Handle::try_current().is_ok() {
                let _ = std::thread::Builder::new()
                    .name("rfidl-pg-close".into())
                    .spawn(move || drop(client));
            }
        }
    }
}

impl Connection {
    pub(crate) fn new(url: PostgresUrl, client: Client) -> Self {
        Self {
            url,
            client: Some(client),
        }
    }

    /// The client, reconnected first if the last one broke.
    pub(crate) fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let client = self.url.connect()?;
            self.client = Some(client);
        }
        self.client.as_mut().ok_or_else(|| StoreError::Postgres {
            target: self.url.target(),
            cause: "no connection".to_owned(),
        })
    }
}

/// The INSERT of [`crate::outbox::Outbox::enqueue`] and of the
/// outbox's `send` writer.
pub(crate) fn insert_outbox(
    tx: &mut postgres::Transaction<'_>,
    config: &Config,
    message: &OutgoingMessage,
) -> Result<Uuid, OutboxError> {
    let id = Uuid::now_v7();
    let due = message.due_ms(crate::store::now_ms());
    let max_retries = i64::from(message.max_retries.unwrap_or(config.outbox.max_retries));
    let (payload, headers) = (
        serde_json::to_string(&message.payload)?,
        serde_json::to_string(&message.headers)?,
    );
    let (id_text, version, expires_at) = (
        id.to_string(),
        i64::from(message.version),
        message.expires_ms(config, due),
    );
    // Typed parameters: one round trip, no prepare.
    tx.execute_typed(
        "INSERT INTO outbox_messages (message_id, correlation_id, message_type, destination, \
         interface, version, fingerprint, endpoint, payload, headers, status, max_retries, \
         next_retry_at, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'Pending', $11, $12, $12, $13)",
        &[
            (&id_text, Type::TEXT),
            (&message.correlation_id, Type::TEXT),
            (&message.message_type.as_str(), Type::TEXT),
            (&message.destination, Type::TEXT),
            (&message.interface, Type::TEXT),
            (&version, Type::INT8),
            (&message.fingerprint, Type::TEXT),
            (&message.endpoint, Type::TEXT),
            (&payload, Type::TEXT),
            (&headers, Type::TEXT),
            (&max_retries, Type::INT8),
            (&due, Type::INT8),
            (&expires_at, Type::INT8),
        ],
    )
    .map_err(OutboxError::from)?;
    Ok(id)
}

/// The outbox `send` writer's group commit: every message of `group` in one
/// transaction, all written or none.
pub(crate) fn write_group(
    conn: &mut Connection,
    config: &Config,
    group: &[crate::outbox::SendJob],
) -> Vec<Result<Uuid, OutboxError>> {
    let fail = |text: String| {
        group
            .iter()
            .map(|_| Err(OutboxError::Write(text.clone())))
            .collect()
    };
    let client = match conn.client() {
        Ok(client) => client,
        Err(error) => return fail(error.to_string()),
    };
    let mut tx = match client.transaction() {
        Ok(tx) => tx,
        Err(error) => return fail(error_text(&error)),
    };
    let mut ids = Vec::with_capacity(group.len());
    for (message, _) in group {
        match insert_outbox(&mut tx, config, message) {
            Ok(id) => ids.push(id),
            Err(error) => return fail(error.to_string()),
        }
    }
    match tx.commit() {
        Ok(()) => ids.into_iter().map(Ok).collect(),
        Err(error) => fail(error_text(&error)),
    }
}

#[allow(private_interfaces)] // see `store::sealed`
impl crate::store::sealed::Common for crate::store::Postgres {
    type Service = dyn crate::receiver::HostedService<Self>;
    type Responder = dyn crate::responses::ResponseHandler<Self>;
    type OnFailure = dyn crate::failures::FailureHandler<Self>;

    fn interfaces(service: &Self::Service) -> &[crate::receiver::HostedInterface] {
        service.interfaces()
    }

    fn open_dispatch(
        database: &crate::store::Database,
        _: &Config,
        responses: Vec<std::sync::Arc<Self::Responder>>,
        failures: crate::failures::FailureHandlers<Self::OnFailure>,
    ) -> Result<std::sync::Arc<dyn crate::dispatcher::records::DispatchDb>, StoreError> {
        let url = url_of(database)?;
        let client = open(url)?;
        Ok(std::sync::Arc::new(PostgresDispatch::new(
            Connection::new(url.clone(), client),
            responses,
            failures,
        )))
    }

    #[cfg(any(feature = "nats", feature = "amqp"))]
    fn open_answers(
        database: &crate::store::Database,
        handlers: Vec<std::sync::Arc<Self::Responder>>,
    ) -> Result<std::sync::Arc<dyn crate::broker::AnswerStore>, StoreError> {
        answers::open(url_of(database)?, handlers)
    }

    #[cfg(any(feature = "nats", feature = "amqp"))]
    fn open_terminated(
        database: &crate::store::Database,
    ) -> Result<std::sync::Arc<dyn crate::broker::TerminatedStore>, StoreError> {
        answers::open_terminated(url_of(database)?)
    }

    fn lifecycle_service(
        service: crate::lifecycle::LifecycleService,
        _: &crate::store::Database,
    ) -> crate::receiver::Registered<Self::Service> {
        crate::receiver::Registered(std::sync::Arc::new(service))
    }

    const DEFAULT_WRITERS: usize = 4;

    fn start_inbox(
        database: &crate::store::Database,
        writers: usize,
        parts: crate::receiver::WriterParts<Self>,
    ) -> Result<crate::receiver::Started, crate::receiver::ReceiverError> {
        start_receiver(url_of(database)?, writers, parts)
    }
}

#[allow(private_interfaces)] // see `store::sealed`
impl crate::store::sealed::Backend for crate::store::Postgres {
    fn enqueue(
        config: &Config,
        tx: &mut postgres::Transaction<'_>,
        message: &OutgoingMessage,
    ) -> Result<Uuid, OutboxError> {
        insert_outbox(tx, config, message)
    }

    fn record_applied(
        tx: &mut &mut postgres::Transaction<'_>,
        applied: &crate::lifecycle::Applied<'_>,
    ) -> Result<Option<(i64, String)>, StoreError> {
        lifecycle::record_applied(tx, applied)
            .map_err(|e| StoreError::PostgresStatement(error_text(&e)))
    }

    fn hold_version(
        tx: &mut &mut postgres::Transaction<'_>,
        interface: &str,
        version: u32,
        now: i64,
        reason: &str,
    ) -> Result<(i64, u64), StoreError> {
        lifecycle::hold_version(tx, interface, version, now, reason)
            .map_err(|e| StoreError::PostgresStatement(error_text(&e)))
    }

    fn release_version(
        tx: &mut &mut postgres::Transaction<'_>,
        interface: &str,
        version: u32,
        now: i64,
        reason: &str,
    ) -> Result<u64, StoreError> {
        lifecycle::release_version(tx, interface, version, now, reason)
            .map_err(|e| StoreError::PostgresStatement(error_text(&e)))
    }
}

/// The PostgreSQL URL of `database`.
pub(crate) fn url_of(database: &crate::store::Database) -> Result<&PostgresUrl, StoreError> {
    match database {
        crate::store::Database::Postgres(url) => Ok(url),
        other => Err(StoreError::WrongStore {
            expected: "PostgreSQL",
            database: other.to_string(),
        }),
    }
}
