//! The sending side's storage: messages are written to `outbox_messages` in
//! the caller's own transaction, so a business change and its message commit
//! or roll back together.
//!
//! **Waking the dispatcher.** `enqueue` runs before the caller commits, so
//! the row is not visible yet when the dispatcher is told about it. The
//! outbox therefore notifies the dispatcher and the dispatcher, when a
//! wake-up finds nothing due, looks again a few times over a short backoff
//! (1, 2, 4 … 64 ms) before it falls back to its poll interval. A committed
//! message is thus sent within milliseconds; a rolled-back one costs a few
//! cheap index look-ups. The poll (default 1 s) remains the safety net for
//! rows written by other processes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Transaction, params};
use tokio::sync::Notify;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::config::{Config, Durability};
use crate::envelope::MessageType;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::store::Database;
use crate::store::sqlite as db;

/// A message to send, as generated clients build it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingMessage {
    /// A destination name, mapped to a transport and URL by the dispatcher.
    pub destination: String,
    pub message_type: MessageType,
    pub interface: String,
    pub version: u32,
    pub fingerprint: String,
    pub endpoint: String,
    pub correlation_id: Option<String>,
    /// One member per method parameter.
    pub payload: serde_json::Value,
    /// Free-form envelope headers. Enqueueing adds `traceparent` (W3C Trace
    /// Context) unless one is already here, which is then kept as it is:
    /// see [`crate::trace`].
    pub headers: BTreeMap<String, String>,
    /// `@delivery(max_retries)`; the configured default when `None`.
    pub max_retries: Option<u32>,
    /// `@delivery(ttl)`; the configured default when `None`.
    pub ttl: Option<Duration>,
}

/// Why a message could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    #[error("outbox database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[cfg(feature = "postgres")]
    #[error("outbox database: {}", crate::store::postgres::error_text(.0))]
    Postgres(#[from] postgres::Error),
    #[error("cannot encode the payload: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Db(#[from] crate::store::StoreError),
    #[error("the outbox writer stopped")]
    Stopped,
    /// A shared commit failed; no message of that group was written.
    #[error("outbox write failed: {0}")]
    Write(String),
    /// `outbox.durability` is `full`, but the transaction given to
    /// [`Outbox::enqueue`] belongs to a connection that commits with a lower
    /// `synchronous` level. Under `full` the dispatcher's claim does not
    /// fsync (the enqueuing commit already did), so such a transaction could
    /// be sent and then undone by a power cut. Nothing was written.
    #[error(
        "outbox.durability is `full`, but this transaction's connection commits with \
         PRAGMA synchronous={found} (not durable at commit): open it with `Durability::Full` \
         (`rfidl_runtime::db::open(path, Durability::Full)`) or set `outbox.durability: normal`"
    )]
    NotDurable { found: &'static str },
}

/// A handle to write messages. Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    metrics: Arc<Metrics>,
    circuits: Arc<crate::circuit::Circuits>,
    wake: Arc<Notify>,
    database: Database,
    sender: std::sync::Mutex<Option<tokio::sync::mpsc::Sender<SendJob>>>,
    /// The dispatcher started on this outbox, for readiness probes.
    dispatcher: std::sync::Mutex<Option<Liveness>>,
    /// Decommissioned interface versions (`crate::lifecycle`).
    lifecycle: crate::lifecycle::Lifecycle,
    /// The destinations clients send to, checked against the dispatcher's
    /// routes ([`Outbox::declare_destination`]).
    destinations: std::sync::Mutex<DestinationCheck>,
}

/// What [`Outbox::declare_destination`] checks against.
#[derive(Default)]
struct DestinationCheck {
    declared: std::collections::BTreeSet<String>,
    /// The started dispatcher's routes; `None` before it starts, or when
    /// it routes any name (`DispatcherBuilder::route_by`).
    routable: Option<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("database", &self.inner.database)
            .finish()
    }
}

/// The `send` writer thread's commit of one group, on its store.
type GroupWriter = Box<dyn FnMut(&[SendJob]) -> Vec<Result<Uuid, OutboxError>> + Send>;

pub(crate) type SendJob = (
    OutgoingMessage,
    tokio::sync::oneshot::Sender<Result<Uuid, OutboxError>>,
);

impl Outbox {
    /// An outbox for `enqueue` in the caller's transactions. `db_path` is the
    /// database the caller writes to (and the dispatcher reads); it is needed
    /// only by [`Outbox::send`].
    pub fn new(config: Config, db_path: impl AsRef<Path>) -> Self {
        Self::with_metrics(config, db_path, Arc::new(Metrics::default()))
    }

    pub fn with_metrics(config: Config, db_path: impl AsRef<Path>, metrics: Arc<Metrics>) -> Self {
        Self::with_database(config, db_path.as_ref(), metrics)
    }

    /// An outbox on `database`: a SQLite file, or a PostgreSQL database
    /// (enqueue there with [`Outbox::enqueue_postgres`], or through a
    /// generated client of store `Postgres`).
    pub fn with_database(
        config: Config,
        database: impl Into<Database>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let wake = Arc::new(Notify::new());
        let lifecycle = crate::lifecycle::Lifecycle::new();
        lifecycle.set_wake(wake.clone());
        Self {
            inner: Arc::new(Inner {
                circuits: Arc::new(crate::circuit::Circuits::new(&config.outbox)),
                config,
                metrics,
                wake,
                database: database.into(),
                sender: std::sync::Mutex::new(None),
                dispatcher: std::sync::Mutex::new(None),
                lifecycle,
                destinations: Default::default(),
            }),
        }
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The circuit breakers of this outbox's destinations (updated by its
    /// dispatcher, shown by the diagnostics).
    pub fn circuits(&self) -> &Arc<crate::circuit::Circuits> {
        &self.inner.circuits
    }

    /// The liveness of the dispatcher last started on this outbox, if any
    /// (`GET /_rf/readyz` reads it).
    pub fn dispatcher_liveness(&self) -> Option<Liveness> {
        self.inner
            .dispatcher
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Declares that a client sends to `destination` (generated clients do
    /// so when they are made). A dispatcher started on this outbox refuses
    /// to start while a declared destination has no route: no
    /// `destinations.<name>` in the config and no
    /// [`route`](crate::dispatcher::DispatcherBuilder::route). One declared
    /// after the dispatcher started is checked at once, and an error is
    /// logged if it has no route (its messages would wait, unroutable).
    pub fn declare_destination(&self, destination: &str) {
        let mut check = self
            .inner
            .destinations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !check.declared.insert(destination.to_owned()) {
            return;
        }
        if let Some(routable) = &check.routable
            && !routable.contains(destination)
        {
            tracing::error!(
                destination,
                "{}",
                crate::dispatcher::DispatcherError::UnknownDestination {
                    name: destination.to_owned()
                }
            );
        }
    }

    /// The declared destinations that are not in `routable`; when there are
    /// none, records `routable` (`None`: every name is routable) for later
    /// declarations.
    pub(crate) fn unroutable_destinations(
        &self,
        routable: Option<std::collections::BTreeSet<String>>,
    ) -> Vec<String> {
        let mut check = self
            .inner
            .destinations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let missing = match &routable {
            Some(routable) => check
                .declared
                .iter()
                .filter(|name| !routable.contains(*name))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        if missing.is_empty() {
            check.routable = routable;
        }
        missing
    }

    pub(crate) fn set_dispatcher_liveness(&self, liveness: Liveness) {
        *self
            .inner
            .dispatcher
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(liveness);
    }

    /// The dispatcher waits on this.
    pub(crate) fn wake_handle(&self) -> Arc<Notify> {
        self.inner.wake.clone()
    }

    /// Writes `message` in `tx`; it is sent if and only if `tx` commits.
    ///
    /// The message gets a `traceparent` header unless it has one (see
    /// [`crate::trace`]); the write runs in an `enqueue` span.
    pub fn enqueue(
        &self,
        tx: &Transaction<'_>,
        mut message: OutgoingMessage,
    ) -> Result<Uuid, OutboxError> {
        let span = enqueue_span(&mut message);
        let _entered = span.enter();
        if self.inner.config.outbox.durability == Durability::Full {
            require_durable_commit(tx)?;
        }
        let id = insert(tx, &self.inner.config, &message)?;
        span.record("message_id", tracing::field::display(id));
        self.inner.metrics.outbox_enqueued.inc();
        self.inner.wake.notify_one();
        Ok(id)
    }

    /// Writes `message` in the PostgreSQL transaction `tx`; it is sent if
    /// and only if `tx` commits.
    #[cfg(feature = "postgres")]
    pub fn enqueue_postgres(
        &self,
        tx: &mut postgres::Transaction<'_>,
        mut message: OutgoingMessage,
    ) -> Result<Uuid, OutboxError> {
        let span = enqueue_span(&mut message);
        let _entered = span.enter();
        let id = crate::store::postgres::insert_outbox(tx, &self.inner.config, &message)?;
        span.record("message_id", tracing::field::display(id));
        self.inner.metrics.outbox_enqueued.inc();
        self.inner.wake.notify_one();
        Ok(id)
    }

    /// The decommissioned interface versions this outbox's dispatcher holds
    /// (see [`crate::lifecycle`]); give it to
    /// [`ReceiverBuilder::lifecycle`](crate::receiver::ReceiverBuilder::lifecycle).
    pub fn lifecycle(&self) -> &crate::lifecycle::Lifecycle {
        &self.inner.lifecycle
    }

    /// The database this outbox writes to.
    pub fn database(&self) -> &Database {
        &self.inner.database
    }

    /// Writes `message` in a transaction of its own and commits it.
    /// Concurrent calls share commits (one writer thread, group commit), so
    /// many callers together go much faster than one commit each.
    ///
    /// The `traceparent` header is set when `send` is called (from the
    /// calling thread's [current](crate::trace::current) context), not when
    /// the future is first polled.
    pub fn send(
        &self,
        mut message: OutgoingMessage,
    ) -> impl Future<Output = Result<Uuid, OutboxError>> + Send + '_ {
        let span = enqueue_span(&mut message);
        let recorded = span.clone();
        async move {
            let sender = self.send_writer()?;
            let (reply, answer) = tokio::sync::oneshot::channel();
            sender
                .send((message, reply))
                .await
                .map_err(|_| OutboxError::Stopped)?;
            let id = answer.await.map_err(|_| OutboxError::Stopped)??;
            recorded.record("message_id", tracing::field::display(id));
            self.inner.metrics.outbox_enqueued.inc();
            self.inner.wake.notify_one();
            Ok(id)
        }
        .instrument(span)
    }

    fn send_writer(&self) -> Result<tokio::sync::mpsc::Sender<SendJob>, OutboxError> {
        let mut guard = self.inner.sender.lock().map_err(|_| OutboxError::Stopped)?;
        if let Some(sender) = guard.as_ref() {
            return Ok(sender.clone());
        }
        let config = self.inner.config.clone();
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<SendJob>(1024);
        let mut write: GroupWriter = match &self.inner.database {
            Database::Sqlite(path) => {
                let mut conn = db::open(path, self.inner.config.outbox.durability)?;
                Box::new(move |group| write_group(&mut conn, &config, group))
            }
            #[cfg(feature = "postgres")]
            Database::Postgres(url) => {
                let client = crate::store::postgres::open(url)?;
                let mut conn = crate::store::postgres::Connection::new((**url).clone(), client);
                Box::new(move |group| {
                    crate::store::postgres::write_group(&mut conn, &config, group)
                })
            }
        };
        std::thread::Builder::new()
            .name("rfidl-outbox-send".into())
            .spawn(move || {
                let mut group = Vec::new();
                while let Some(first) = receiver.blocking_recv() {
                    group.push(first);
                    while group.len() < 512 {
                        match receiver.try_recv() {
                            Ok(job) => group.push(job),
                            Err(_) => break,
                        }
                    }
                    let results = write(&group);
                    for ((_, reply), result) in group.drain(..).zip(results) {
                        let _ = reply.send(result);
                    }
                }
            })
            .map_err(|_| OutboxError::Stopped)?;
        *guard = Some(sender.clone());
        Ok(sender)
    }
}

/// Stamps the message's `traceparent` (see [`crate::trace::stamp`]) and
/// opens its `enqueue` span; `message_id` is recorded once the row is written.
fn enqueue_span(message: &mut OutgoingMessage) -> tracing::Span {
    let trace = crate::trace::stamp(&mut message.headers);
    tracing::info_span!(
        "enqueue",
        message_id = tracing::field::Empty,
        destination = %message.destination,
        interface = %message.interface,
        version = message.version,
        endpoint = %message.endpoint,
        trace_id = %crate::trace::OptionalId(trace.map(|t| t.trace_id())),
    )
}

fn write_group(
    conn: &mut rusqlite::Connection,
    config: &Config,
    group: &[SendJob],
) -> Vec<Result<Uuid, OutboxError>> {
    let tx = match conn.transaction() {
        Ok(tx) => tx,
        Err(error) => {
            return group
                .iter()
                .map(|_| Err(OutboxError::Write(error.to_string())))
                .collect();
        }
    };
    let mut ids = Vec::with_capacity(group.len());
    for (message, _) in group {
        match insert(&tx, config, message) {
            Ok(id) => ids.push(id),
            Err(error) => {
                let text = error.to_string();
                drop(tx);
                return group
                    .iter()
                    .map(|_| Err(OutboxError::Write(text.clone())))
                    .collect();
            }
        }
    }
    match tx.commit() {
        Ok(()) => ids.into_iter().map(Ok).collect(),
        Err(error) => group
            .iter()
            .map(|_| Err(OutboxError::Write(error.to_string())))
            .collect(),
    }
}

/// Under `outbox.durability: full` the dispatcher's claim relies on every
/// enqueuing transaction being durable when it commits: refuses a connection
/// whose `synchronous` level is below `FULL` (2).
fn require_durable_commit(conn: &rusqlite::Connection) -> Result<(), OutboxError> {
    let level: i64 = conn
        .prepare_cached("PRAGMA synchronous")?
        .query_row([], |row| row.get(0))?;
    match level {
        2.. => Ok(()),
        1 => Err(OutboxError::NotDurable { found: "NORMAL" }),
        _ => Err(OutboxError::NotDurable { found: "OFF" }),
    }
}

/// The INSERT itself, shared by `enqueue` and `send`.
///
/// The row's `seq` (its rowid) is derived from its id ([`db::outbox_seq`]):
/// ids made by other processes writing to the same file in the same
/// millisecond may share it, and the INSERT then fails on the primary key
/// before it wrote anything, so it is tried again with a fresh id.
fn insert(
    conn: &rusqlite::Connection,
    config: &Config,
    message: &OutgoingMessage,
) -> Result<Uuid, OutboxError> {
    insert_with_ids(conn, config, message, Uuid::now_v7)
}

/// [`insert`] with the ids drawn from `next_id`.
fn insert_with_ids(
    conn: &rusqlite::Connection,
    config: &Config,
    message: &OutgoingMessage,
    mut next_id: impl FnMut() -> Uuid,
) -> Result<Uuid, OutboxError> {
    const ATTEMPTS: usize = 8;
    let now = db::now_ms();
    let ttl = message.ttl.unwrap_or(config.outbox.ttl);
    let max_retries = message.max_retries.unwrap_or(config.outbox.max_retries);
    let payload = serde_json::to_string(&message.payload)?;
    let headers = serde_json::to_string(&message.headers)?;
    let mut statement = conn.prepare_cached(
        "INSERT INTO outbox_messages (seq, message_id, correlation_id, message_type, destination, \
         interface, version, fingerprint, endpoint, payload, headers, status, max_retries, \
         next_retry_at, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'Pending', ?12, ?13, ?13, ?14)",
    )?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let id = next_id();
        let mut text = Uuid::encode_buffer();
        let text = id.hyphenated().encode_lower(&mut text);
        let result = statement.execute(params![
            db::outbox_seq(text),
            &*text,
            message.correlation_id,
            message.message_type.as_str(),
            message.destination,
            message.interface,
            message.version,
            message.fingerprint,
            message.endpoint,
            payload,
            headers,
            max_retries,
            now,
            now + ttl.as_millis() as i64,
        ]);
        match result {
            Ok(_) => return Ok(id),
            Err(error)
                if attempt < ATTEMPTS
                    && error.sqlite_error().is_some_and(|e| {
                        e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    }) =>
            {
                continue;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// The statuses of the `outbox_messages.status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Status {
    Pending,
    Sending,
    Sent,
    Failed,
    DeadLetter,
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "Pending",
            Status::Sending => "Sending",
            Status::Sent => "Sent",
            Status::Failed => "Failed",
            Status::DeadLetter => "DeadLetter",
            Status::Expired => "Expired",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Status::Pending,
            Status::Sending,
            Status::Sent,
            Status::Failed,
            Status::DeadLetter,
            Status::Expired,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// One row, for diagnostics and tests.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OutboxRow {
    pub message_id: String,
    pub destination: String,
    pub endpoint: String,
    pub status: Status,
    pub retry_count: u32,
    pub max_retries: u32,
    pub last_error: Option<String>,
    pub response: Option<serde_json::Value>,
}

/// Reads one row.
pub fn row(conn: &rusqlite::Connection, message_id: &Uuid) -> rusqlite::Result<Option<OutboxRow>> {
    use rusqlite::OptionalExtension as _;
    conn.query_row(
        "SELECT message_id, destination, endpoint, status, retry_count, max_retries, last_error, response \
         FROM outbox_messages WHERE seq = ?2 AND message_id = ?1",
        params![message_id.to_string(), db::outbox_seq(&message_id.to_string())],
        |r| {
            let status: String = r.get(3)?;
            let response: Option<String> = r.get(7)?;
            Ok(OutboxRow {
                message_id: r.get(0)?,
                destination: r.get(1)?,
                endpoint: r.get(2)?,
                status: Status::parse(&status).unwrap_or(Status::Pending),
                retry_count: r.get(4)?,
                max_retries: r.get(5)?,
                last_error: r.get(6)?,
                response: response.and_then(|t| serde_json::from_str(&t).ok()),
            })
        },
    )
    .optional()
}

/// Row counts per status.
pub fn counts(conn: &rusqlite::Connection) -> rusqlite::Result<BTreeMap<String, u64>> {
    let mut statement =
        conn.prepare("SELECT status, COUNT(*) FROM outbox_messages GROUP BY status")?;
    let rows = statement.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Durability;

    fn message() -> OutgoingMessage {
        OutgoingMessage {
            destination: "peer".into(),
            message_type: MessageType::Signal,
            interface: "p.S".into(),
            version: 1,
            fingerprint: "sha256:f".into(),
            endpoint: "E".into(),
            correlation_id: None,
            payload: serde_json::json!({"n": 1}),
            headers: BTreeMap::new(),
            max_retries: None,
            ttl: None,
        }
    }

    #[test]
    fn an_id_whose_seq_is_taken_is_replaced_by_a_fresh_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = db::open(dir.path().join("o.db"), Durability::Normal).expect("open");
        let config = Config::default();
        let first = Uuid::parse_str("019ab5d3-7f00-7abc-8def-0123456789ab").expect("uuid");
        // Same millisecond, same low 15 counter bits: same seq, other id.
        let twin = Uuid::parse_str("019ab5d3-7f00-7fff-bfff-0123ffffffff").expect("uuid");
        let fresh = Uuid::parse_str("019ab5d3-7f01-7000-8000-000000000000").expect("uuid");
        assert_eq!(
            db::outbox_seq(&first.to_string()),
            db::outbox_seq(&twin.to_string())
        );
        let tx = conn.transaction().expect("tx");
        let mut ids = [first].into_iter();
        let written = insert_with_ids(&tx, &config, &message(), || ids.next().expect("id"));
        assert_eq!(written.expect("first"), first);
        let mut ids = [twin, fresh].into_iter();
        let written = insert_with_ids(&tx, &config, &message(), || ids.next().expect("id"));
        assert_eq!(written.expect("retried"), fresh);
        tx.commit().expect("commit");
        for id in [first, fresh] {
            assert!(row(&conn, &id).expect("row").is_some(), "{id}");
        }
        assert!(row(&conn, &twin).expect("row").is_none());
        let count: i64 = conn
            .query_row("SELECT COUNT(*) FROM outbox_messages", [], |r| r.get(0))
            .expect("count");
        assert_eq!(count, 2, "the failed attempt left nothing behind");

        // A conflict that persists is an error, after a bounded number of tries.
        let tx = conn.transaction().expect("tx");
        let error =
            insert_with_ids(&tx, &config, &message(), || twin).expect_err("the seq stays taken");
        assert!(error.to_string().contains("UNIQUE"), "{error}");
    }
}
