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
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::config::Config;
use crate::envelope::MessageType;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::store::sqlite as db;
use crate::store::{AnyStore, AsyncStore, Database, Location, Sqlite, Store};

/// A message to send, as generated clients build it.
///
/// The envelope fields (`messageType` … `endpoint`, `correlationId`) are
/// stored in the outbox row as given and sent unchanged on every retry; the
/// receiver routes on (`interface`, `version`, `endpoint`).
///
/// Not `#[non_exhaustive]`: generated clients and the registry build it with
/// a struct literal.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingMessage {
    /// A destination name, mapped to a transport and URL by the dispatcher.
    pub destination: String,
    /// The method's kind. The answer to any message is stored in its row;
    /// that of a `Command` or `PushCall` declaring a response is also
    /// passed to a [`ResponseHandler`](crate::responses::ResponseHandler)
    /// registered with the dispatcher.
    pub message_type: MessageType,
    /// The receiving interface, `package.Service` (e.g.
    /// `hr.employees.EmpService`).
    pub interface: String,
    /// The contract's service version the message is written against.
    pub version: u32,
    /// `sha256:<hex>` of the sender's manifest of that interface version;
    /// a receiver with another one logs and counts it, but decoding decides.
    pub fingerprint: String,
    /// The method name within the interface version.
    pub endpoint: String,
    /// The `@correlate` key's value, if the method declares one; carried in
    /// the envelope and given back with the answer
    /// ([`responses::Answer`](crate::responses::Answer)). Not unique.
    pub correlation_id: Option<String>,
    /// One member per method parameter.
    pub payload: serde_json::Value,
    /// Free-form envelope headers. Enqueueing adds `traceparent` (W3C Trace
    /// Context) unless one is already here, which is then kept as it is:
    /// see [`crate::trace`].
    pub headers: BTreeMap<String, String>,
    /// `@delivery(max_retries)`; the configured default when `None`.
    pub max_retries: Option<u32>,
    /// `@delivery(ttl)`; the configured default when `None`. Counted from
    /// the message's due time: [`deliver_at`](Self::deliver_at), or the
    /// enqueue.
    pub ttl: Option<Duration>,
    /// A durable timer: the row waits in the outbox, through restarts, and
    /// is first sent at this time (within milliseconds of it, not at the
    /// dispatcher's next poll); `None`, or a time already past, sends it at
    /// once. Set it with [`deliver_at`](Self::deliver_at) or
    /// [`deliver_after`](Self::deliver_after). Until it is due the row counts
    /// as `scheduled` in the outbox stats, not as backlog.
    pub deliver_at: Option<SystemTime>,
}

impl OutgoingMessage {
    /// The same message, first sent at `when` (a [`SystemTime`] or a
    /// contract [`Timestamp`](crate::types::Timestamp)) instead of at once:
    /// a durable timer (see [`deliver_at`](Self::deliver_at)).
    #[must_use]
    pub fn deliver_at(mut self, when: impl Into<SystemTime>) -> Self {
        self.deliver_at = Some(when.into());
        self
    }

    /// The same message, first sent `delay` from now: [`deliver_at`](Self::deliver_at)
    /// `SystemTime::now() + delay`.
    #[must_use]
    pub fn deliver_after(self, delay: Duration) -> Self {
        self.deliver_at(SystemTime::now() + delay)
    }

    /// When the row is due (Unix milliseconds): its `deliver_at`, or `now`
    /// when that is unset or past. Stored as the row's first `next_retry_at`
    /// and as its `created_at` (the envelope's `createdAt`: nothing can have
    /// processed the message before it was due, so a receiver's dedup
    /// horizon counts from then), and the start of its TTL.
    pub(crate) fn due_ms(&self, now: i64) -> i64 {
        let at = self.deliver_at.map(|at| {
            at.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| {
                i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
            })
        });
        at.map_or(now, |at| at.max(now))
    }

    /// `expires_at` of a row due at `due`: its TTL (or the configured one)
    /// after that.
    pub(crate) fn expires_ms(&self, config: &Config, due: i64) -> i64 {
        let ttl = self.ttl.unwrap_or(config.outbox.ttl);
        due.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
    }
}

/// Why a message could not be written.
///
/// Unless a variant says otherwise, no outbox row was written. From
/// [`enqueue`](Outbox::enqueue), the caller's transaction is still open:
/// roll it back (or do not commit) if the business change must not happen
/// without its message. From [`send`](Outbox::send), nothing was committed;
/// calling `send` again writes a new message with a new id.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// A SQLite statement failed: the `INSERT` in the caller's transaction
    /// (busy, disk full, I/O error, a schema the outbox does not know), or
    /// a check on its connection. Usually worth retrying the whole
    /// transaction when the error is transient (`SQLITE_BUSY`).
    #[error("outbox database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A sqlx statement failed in the caller's transaction (a lost
    /// connection, a serialization failure, a constraint): roll the
    /// transaction back and retry it.
    #[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
    #[error("outbox database: {}", crate::store::sqlx_error_text(.0))]
    Sqlx(#[from] sqlx::Error),
    /// The payload or headers could not be serialized as JSON (a map with
    /// non-string keys, a `Serialize` impl that failed). Not transient: fix
    /// the value.
    #[error("cannot encode the payload: {0}")]
    Encode(#[from] serde_json::Error),
    /// Opening the outbox's own database for [`send`](Outbox::send)
    /// failed: see [`StoreError`](crate::store::StoreError) (a file too new
    /// or damaged, an unreachable server).
    #[error(transparent)]
    Db(#[from] crate::store::StoreError),
    /// The `send` writer thread could not be started or has ended (the
    /// process is shutting down, or the thread panicked). The message may
    /// or may not have been committed if this happened while waiting for
    /// the answer; later calls fail the same way.
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
         (`rfidl_runtime::store::sqlite::open(path, Durability::Full)`) or set `outbox.durability: normal`"
    )]
    NotDurable {
        /// The connection's level, `NORMAL` or `OFF`.
        found: &'static str,
    },
}

/// A handle to write messages to the outbox of one database. Cheap to clone.
///
/// Typed by its store, which the database given to [`Outbox::new`] decides
/// (a path: [`Sqlite`], the default; a `PgStore`: `sqlx::Postgres`), so
/// [`enqueue`](Outbox::enqueue) (or `enqueue_async`) takes that store's
/// transaction, and the
/// dispatcher, clients and handlers built on it agree on the store.
pub struct Outbox<S: AnyStore = Sqlite> {
    inner: Arc<Inner>,
    store: PhantomData<fn() -> S>,
}

impl<S: AnyStore> Clone for Outbox<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            store: PhantomData,
        }
    }
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

impl<S: AnyStore> std::fmt::Debug for Outbox<S> {
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

impl<S: Store> Outbox<S> {
    /// Writes `message` in `tx`, the caller's open transaction on this
    /// outbox's database; it is sent if and only if `tx` commits.
    ///
    /// The message gets a `traceparent` header unless it has one (see
    /// [`crate::trace`]); the write runs in an `enqueue` span.
    pub fn enqueue(
        &self,
        tx: S::Handle<'_, '_>,
        mut message: OutgoingMessage,
    ) -> Result<Uuid, OutboxError> {
        let span = enqueue_span(&mut message);
        let _entered = span.enter();
        let id = S::enqueue(&self.inner.config, tx, &message)?;
        span.record("message_id", tracing::field::display(id));
        self.inner.metrics.outbox_enqueued.inc();
        self.inner.wake.notify_one();
        Ok(id)
    }
}

impl<S: AsyncStore> Outbox<S> {
    /// Writes `message` on `conn`, the connection of the caller's open
    /// sqlx transaction on this outbox's database (`&mut *tx`); it is sent
    /// if and only if that transaction commits. Generated async clients
    /// call this.
    ///
    /// The message gets a `traceparent` header unless it has one (see
    /// [`crate::trace`]); the write runs in an `enqueue` span.
    pub async fn enqueue_async(
        &self,
        conn: &mut S::Connection,
        mut message: OutgoingMessage,
    ) -> Result<Uuid, OutboxError> {
        let span = enqueue_span(&mut message);
        let id = S::enqueue(&self.inner.database, &self.inner.config, conn, &message)
            .instrument(span.clone())
            .await?;
        span.record("message_id", tracing::field::display(id));
        self.inner.metrics.outbox_enqueued.inc();
        self.inner.wake.notify_one();
        Ok(id)
    }
}

impl<S: AnyStore> Outbox<S> {
    /// An outbox on `database`, the database the caller writes to (and the
    /// dispatcher reads): a SQLite file path, or a sqlx store (`&PgStore`,
    /// `&SqliteStore`). Nothing is
    /// opened until [`send`](Outbox::send) or a dispatcher needs it.
    pub fn new(config: Config, database: impl Location<Store = S>) -> Self {
        Self::with_metrics(config, database, Arc::new(Metrics::default()))
    }

    /// [`new`](Outbox::new), counting into `metrics` (shared with the
    /// dispatcher and the diagnostics routes).
    pub fn with_metrics(
        config: Config,
        database: impl Location<Store = S>,
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
                database: database.into_database(),
                sender: std::sync::Mutex::new(None),
                dispatcher: std::sync::Mutex::new(None),
                lifecycle,
                destinations: Default::default(),
            }),
            store: PhantomData,
        }
    }

    /// The configuration this outbox was made with; a dispatcher started
    /// on it uses its `outbox` and `destinations` sections.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The counters this outbox and its dispatcher add to; share them with
    /// the receiver and the diagnostics so `/_rf/metrics` shows one set.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The circuit breaker of each destination (updated by the dispatcher,
    /// shown by the diagnostics): closed, open or probing.
    pub fn circuit_states(&self) -> Vec<crate::diagnostics::DestinationState> {
        self.inner.circuits.states()
    }

    /// The circuit breakers of this outbox's destinations.
    pub(crate) fn circuits(&self) -> &Arc<crate::circuit::Circuits> {
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

    /// The same outbox seen without its store, for parts that only read
    /// its state (the diagnostics' readiness).
    pub(crate) fn untyped(&self) -> Outbox {
        Outbox {
            inner: Arc::clone(&self.inner),
            store: PhantomData,
        }
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
        let sqlite = |path: &std::path::Path, config: Config| -> Result<GroupWriter, OutboxError> {
            let mut conn = db::open(path, config.outbox.durability)?;
            Ok(Box::new(move |group| {
                db::outbox::write_group(&mut conn, &config, group)
            }))
        };
        let mut write: GroupWriter = match &self.inner.database {
            Database::Sqlite(path) => sqlite(path, config)?,
            // A file on a sqlx pool: written on a connection of its own.
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(store) => sqlite(store.location(), config)?,
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(_) => {
                let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                    OutboxError::Write(
                        "`send` on a sqlx pool must be called on the pool's tokio runtime"
                            .to_owned(),
                    )
                })?;
                let database = self.inner.database.clone();
                Box::new(move |group| {
                    crate::store::sqlx_postgres::write_group(&runtime, &database, &config, group)
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

/// The statuses of the `outbox_messages.status` column.
///
/// A row starts `Pending`, is `Sending` while a dispatcher holds its lease,
/// and ends in one of the other four. `Sent` rows are deleted by
/// [`Retention`](crate::Retention) after `outbox.sent_retention`; `Failed`,
/// `DeadLetter` and `Expired` rows turn `/_rf/health` critical until an
/// operator retries them (`POST /_rf/outbox/{id}/retry`, back to `Pending`)
/// or discards them (`POST /_rf/outbox/{id}/discard`, `Discarded`);
/// retention deletes all four after `outbox.failed_retention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Status {
    /// Waiting to be sent: new, or waiting for its next attempt
    /// (`next_retry_at`) after a retryable failure, or held because the
    /// destination's version is decommissioned.
    Pending,
    /// Claimed by a dispatcher under a lease; a row whose lease expired (a
    /// crashed dispatcher) is claimed again. Never deleted or changed by
    /// anyone but the lease holder.
    Sending,
    /// Acknowledged by the receiver (2xx with `acknowledged`, or 409); the
    /// answer is stored in `response`.
    Sent,
    /// Retries exhausted on a counted failure (500, another 4xx/5xx), or a
    /// 422 `beyond_dedup_horizon`: the message may still succeed, a human
    /// decides.
    Failed,
    /// Refused for good by the receiver (400, 404, 413, 422, or 401 after
    /// `max_retries`): sending it again unchanged will not succeed.
    DeadLetter,
    /// Its TTL passed before it could be delivered (never sent, or only
    /// destination-level failures); marked by the dispatcher or retention.
    Expired,
    /// Put aside by an operator (`POST /_rf/outbox/{id}/discard`): a
    /// `Failed`, `DeadLetter` or `Expired` message nobody will retry. Kept
    /// for `outbox.failed_retention` after the discard, then deleted; no
    /// longer counted by `/_rf/health`.
    Discarded,
}

impl Status {
    /// The spelling stored in the column and used on the wire
    /// (`?status=DeadLetter`, JSON), e.g. `"DeadLetter"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "Pending",
            Status::Sending => "Sending",
            Status::Sent => "Sent",
            Status::Failed => "Failed",
            Status::DeadLetter => "DeadLetter",
            Status::Expired => "Expired",
            Status::Discarded => "Discarded",
        }
    }

    /// Inverse of [`Status::as_str`]; `None` for any other text (the match
    /// is case-sensitive).
    pub fn parse(text: &str) -> Option<Self> {
        [
            Status::Pending,
            Status::Sending,
            Status::Sent,
            Status::Failed,
            Status::DeadLetter,
            Status::Expired,
            Status::Discarded,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// One row, for diagnostics and tests.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OutboxRow {
    /// The message id (UUID v7, lower-case hyphenated), the same on every
    /// retry and the receiver's inbox key with the source.
    pub message_id: String,
    /// The destination name, as in `destinations.<name>`.
    pub destination: String,
    /// The method name the message calls.
    pub endpoint: String,
    /// Where the row is in its life.
    pub status: Status,
    /// Counted failed attempts so far; destination-level failures (outages,
    /// 503, clock problems) are not counted.
    pub retry_count: u32,
    /// Counted failures after which the row is `Failed` (or `DeadLetter`
    /// for 401s): `@delivery(max_retries)` or `outbox.max_retries`.
    pub max_retries: u32,
    /// The last failure's text, if any: the status with the receiver's code
    /// and message (an rfidl receiver names fields, never values; another
    /// receiver's body is cut to 200 characters), or the transport error.
    pub last_error: Option<String>,
    /// The receiver's answer payload once `Sent` (`null` for a method
    /// without a response).
    pub response: Option<serde_json::Value>,
}
