//! The receiver: an axum [`Router`] that takes signed envelopes, processes
//! each exactly once, and answers as `wire-protocol.md` prescribes.
//!
//! Owns the routes `POST /_rf/receive`, `POST /_rf/receive/batch` and
//! `GET /_rf/metadata` (plus JSON 404/405 answers for anything else under
//! `/_rf/`), the order of checks before a handler runs, and the writer thread
//! that runs handlers and group-commits (module `writer`).
//!
//! ```no_run
//! # use rfidl_runtime::{Config, receiver::{Receiver, HostedService}};
//! # async fn demo(config: Config, service: impl HostedService) -> Result<(), Box<dyn std::error::Error>> {
//! let receiver = Receiver::builder(config, "service.db").service(service).build()?;
//! let app = axum::Router::new().merge(receiver.router()); // beside your own routes
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! rfidl_runtime::serve(listener, app).await?;
//! receiver.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Nothing before the handler's transaction writes anything; nothing is
//! acknowledged before its commit is durable (`synchronous=FULL` unless the
//! configuration says otherwise).
//!
//! A request waits for the writer at most `inbox.in_progress_wait` (5 s by
//! default); past it, it is answered 503 `in_progress` with `Retry-After`
//! (never 409: the message may still roll back). The writer still finishes
//! the message, so the sender's retry gets the duplicate answer, or, if it
//! rolled back, processes it then.

pub(crate) mod answer;
mod duplicates;
pub mod handler;
pub(crate) mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, warn};
use uuid::Uuid;

pub use answer::{Answer, KEYS_PENDING, ReceiveError};
pub use handler::{
    HandlerError, HostedInterface, HostedService, IncomingCall, decode_payload, encode_response,
};

use crate::config::Config;
use crate::envelope::{BatchItem, BatchResult, Envelope};
use crate::inbox::{InboxLookup, InboxReader, payload_digest};
use crate::metrics::Metrics;
use crate::signing::{self, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, Secret};
use crate::store::{Sqlite, Store};
use writer::{Command, Delivery, Handlers, Job, Writer};

/// Path of the single-message endpoint.
pub const RECEIVE_PATH: &str = "/_rf/receive";
/// Path of the batch endpoint.
pub const RECEIVE_BATCH_PATH: &str = "/_rf/receive/batch";
/// The wire code (422) of a message older than the receiver's dedup horizon
/// that it has no inbox record of; the sender marks it `Failed`.
pub const BEYOND_DEDUP_HORIZON: &str = "beyond_dedup_horizon";
/// The wire code of 410: the interface version is decommissioned here
/// ([`crate::lifecycle`]).
pub const VERSION_DECOMMISSIONED: &str = "version_decommissioned";
/// `Retry-After` of a 410 `version_decommissioned`: how often a sender
/// looks again whether the version came back.
pub const DECOMMISSIONED_RETRY_AFTER_SECS: u32 = 30;
/// Path of the hosted-interfaces listing.
pub const METADATA_PATH: &str = "/_rf/metadata";

/// Default most deliveries per group commit.
pub const DEFAULT_GROUP_COMMIT_LIMIT: usize = 512;
/// Default largest batch request body (each item is still held to `inbox.body_limit`).
pub const DEFAULT_BATCH_BODY_LIMIT: usize = 32 * 1024 * 1024;
/// Requests queued for the writer before new ones wait for room.
const QUEUE_CAPACITY: usize = 4096;
/// What [`Shared::admit_batch`] found: an answer for each refused item, the
/// admitted deliveries, and their positions in the batch.
type BatchAdmission = (Vec<Option<Answer>>, Vec<Delivery>, Vec<usize>);

/// Requests whose body is larger than this are admitted (JSON parse and
/// HMAC) on the blocking pool, so that a few large bodies cannot hold the
/// async workers that answer `/_rf/livez` and every other request. Smaller
/// ones are admitted in place: a hop to the pool would cost more than the
/// work.
const ADMIT_INLINE_LIMIT: usize = 64 * 1024;
/// How long a request body may take to arrive whole, from the end of its
/// headers; a slower one is answered 408 `body_timeout` and its connection
/// closed. [`crate::serve`] applies the same bound to every route.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a receiver could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    #[error(transparent)]
    Database(#[from] crate::db::DbError),
    #[error(transparent)]
    Inbox(#[from] crate::inbox::InboxError),
    #[error("secret #{index} of peer `{peer}` is invalid: {source}")]
    InvalidSecret {
        peer: String,
        index: usize,
        source: crate::signing::SecretError,
    },
    #[error("interface `{interface}` v{version} is hosted twice")]
    DuplicateInterface { interface: String, version: u32 },
    #[error("the manifest of `{interface}` v{version} is not valid JSON: {source}")]
    InvalidManifest {
        interface: String,
        version: u32,
        source: serde_json::Error,
    },
    #[error("cannot start the receiver's writer thread: {0}")]
    WriterThread(std::io::Error),
}

/// Where a hosted (interface, version) is routed.
#[derive(Debug)]
struct Route {
    service: usize,
    hosted: HostedInterface,
}

/// Whether the receiver checks signatures (see
/// [`ReceiverBuilder::danger_accept_unsigned_messages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verification {
    Required,
    DisabledForLocalDevelopment,
}

/// Builds a [`Receiver`]. Created by [`Receiver::builder`].
#[must_use = "call .build() to get a Receiver"]
pub struct ReceiverBuilder<S: Store = Sqlite> {
    config: Config,
    /// The database, as shown in logs.
    shown: String,
    start: StartWriters<S>,
    services: Vec<Arc<dyn HostedService<S>>>,
    metrics: Option<Arc<Metrics>>,
    group_commit_limit: usize,
    batch_body_limit: usize,
    verification: Verification,
    lifecycle: Option<crate::lifecycle::Lifecycle>,
    issued: Option<crate::keys::IssuedKeys>,
}

impl<S: Store> std::fmt::Debug for ReceiverBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverBuilder")
            .field("database", &self.shown)
            .field("services", &self.services.len())
            .field("verification", &self.verification)
            .finish_non_exhaustive()
    }
}

/// What a store's writers are started with.
pub(crate) struct WriterParts<S: Store> {
    pub commands: mpsc::Receiver<Command>,
    pub handlers: Handlers<S>,
    pub retention: Duration,
    pub group_limit: usize,
    pub durability: crate::config::Durability,
    /// Dropped when the last writer thread ends.
    pub alive: Arc<crate::liveness::LivenessGuard>,
    /// Loaded from the database before the first delivery, when set.
    pub lifecycle: Option<crate::lifecycle::Lifecycle>,
}

/// Started writers: the inbox look-up and the writer threads.
pub(crate) type Started = (Arc<dyn InboxLookup>, Vec<JoinHandle<()>>);

/// Opens the store and starts its writer threads, once the builder builds.
type StartWriters<S> = Box<dyn FnOnce(WriterParts<S>) -> Result<Started, ReceiverError> + Send>;

impl<S: Store> ReceiverBuilder<S> {
    /// Hosts a service (generated `…Receiver(handler)` or hand-written).
    pub fn service(self, service: impl HostedService<S>) -> Self {
        self.shared_service(Arc::new(service))
    }

    /// Hosts a service that is shared with other parts of the program.
    pub fn shared_service(mut self, service: Arc<dyn HostedService<S>>) -> Self {
        self.services.push(service);
        self
    }

    /// Counts into these metrics (e.g. the ones the outbox side also uses, so
    /// one `/_rf/metrics` page shows both). Default: a fresh set.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Most deliveries the writer commits in one transaction (one fsync).
    pub fn group_commit_limit(mut self, deliveries: usize) -> Self {
        self.group_commit_limit = deliveries.max(1);
        self
    }

    /// Largest body of `POST /_rf/receive/batch`.
    pub fn batch_body_limit(mut self, bytes: usize) -> Self {
        self.batch_body_limit = bytes;
        self
    }

    /// Turns signature verification OFF: any source is accepted and no
    /// `webhook-*` header is checked. Anyone who can reach the receiver can
    /// then make it run handlers. For local development only; logged as a
    /// warning at build time.
    pub fn danger_accept_unsigned_for_local_development(mut self) -> Self {
        self.verification = Verification::DisabledForLocalDevelopment;
        self
    }

    /// Hosts the control interface `rfidl.control.Lifecycle` v2 (commands
    /// from the registry's source id [`crate::lifecycle::DEFAULT_REGISTRY_SOURCE`]
    /// only; configure a `peers` secret for it) and answers the routes of
    /// every version in `lifecycle` 410 `version_decommissioned`. Pass the
    /// outbox's set ([`Outbox::lifecycle`](crate::outbox::Outbox::lifecycle))
    /// so that its dispatcher holds what the commands decommission, and
    /// bind it to this instance's id when it registers
    /// ([`DirectoryClient::lifecycle`](crate::directory::DirectoryClient::lifecycle)):
    /// a command addressed to another instance is refused.
    pub fn lifecycle(self, lifecycle: &crate::lifecycle::Lifecycle) -> Self
    where
        crate::lifecycle::LifecycleService: HostedService<S>,
    {
        self.lifecycle_from(lifecycle, crate::lifecycle::DEFAULT_REGISTRY_SOURCE)
    }

    /// [`lifecycle`](Self::lifecycle) with commands accepted from the source
    /// id `registry` instead.
    pub fn lifecycle_from(mut self, lifecycle: &crate::lifecycle::Lifecycle, registry: &str) -> Self
    where
        crate::lifecycle::LifecycleService: HostedService<S>,
    {
        self.lifecycle = Some(lifecycle.clone());
        self.service(crate::lifecycle::LifecycleService::new(
            lifecycle.clone(),
            registry,
        ))
    }

    /// Accepts, from a source that `peers` does not list, the secrets the
    /// registry issued for it ([`crate::keys`]); the set may change while
    /// the receiver runs (the directory client renews it). Secrets in
    /// `peers` keep precedence.
    pub fn issued_keys(mut self, keys: &crate::keys::IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Opens (and migrates) the database, starts the writer thread.
    pub fn build(self) -> Result<Receiver, ReceiverError> {
        let mut secrets = HashMap::new();
        for (peer, texts) in &self.config.peers {
            let mut parsed = Vec::with_capacity(texts.len());
            for (index, text) in texts.iter().enumerate() {
                let secret =
                    Secret::parse(text).map_err(|source| ReceiverError::InvalidSecret {
                        peer: peer.clone(),
                        index,
                        source,
                    })?;
                parsed.push(secret);
            }
            secrets.insert(peer.clone(), parsed);
        }

        let mut routes: HashMap<&'static str, BTreeMap<u32, Route>> = HashMap::new();
        let mut metadata = Vec::new();
        for (index, service) in self.services.iter().enumerate() {
            for hosted in service.interfaces() {
                let versions = routes.entry(hosted.interface).or_default();
                if versions.contains_key(&hosted.version) {
                    return Err(ReceiverError::DuplicateInterface {
                        interface: hosted.interface.to_owned(),
                        version: hosted.version,
                    });
                }
                let manifest: serde_json::Value = serde_json::from_str(hosted.manifest_json)
                    .map_err(|source| ReceiverError::InvalidManifest {
                        interface: hosted.interface.to_owned(),
                        version: hosted.version,
                        source,
                    })?;
                metadata.push(serde_json::json!({
                    "interface": hosted.interface,
                    "version": hosted.version,
                    "fingerprint": hosted.fingerprint,
                    "endpoints": hosted.endpoints,
                    "manifest": manifest,
                }));
                versions.insert(
                    hosted.version,
                    Route {
                        service: index,
                        hosted: *hosted,
                    },
                );
            }
        }

        if self.verification == Verification::DisabledForLocalDevelopment {
            warn!(
                db = %self.shown,
                "SIGNATURE VERIFICATION IS OFF: this receiver accepts unsigned messages from anyone. \
                 Never run it like this outside local development."
            );
        }

        let metrics = self.metrics.unwrap_or_default();
        let services: Arc<[Arc<dyn HostedService<S>>]> = self.services.into();
        let (commands, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let (liveness, alive) = crate::liveness::Liveness::start();
        let (reader, threads) = (self.start)(WriterParts {
            commands: receiver,
            handlers: Handlers {
                services,
                metrics: Arc::clone(&metrics),
            },
            retention: self.config.inbox.retention,
            group_limit: self.group_commit_limit,
            durability: self.config.inbox.durability,
            alive: Arc::new(alive),
            lifecycle: self.lifecycle.clone(),
        })?;

        Ok(Receiver {
            shared: Arc::new(Shared {
                body_limit: self.config.inbox.body_limit,
                batch_body_limit: self.batch_body_limit,
                tolerance: self.config.inbox.signature_tolerance,
                in_progress_wait: self.config.inbox.in_progress_wait,
                dedup_horizon: self
                    .config
                    .inbox
                    .retention
                    .saturating_sub(self.config.inbox.signature_tolerance),
                verification: self.verification,
                secrets,
                issued: self.issued,
                routes,
                metadata: serde_json::json!({ "interfaces": metadata }),
                reader,
                commands,
                metrics,
                duplicates: Default::default(),
                writer_threads: Mutex::new(threads),
                liveness,
                lifecycle: self.lifecycle,
            }),
        })
    }
}

struct Shared {
    body_limit: usize,
    batch_body_limit: usize,
    tolerance: Duration,
    in_progress_wait: Duration,
    /// Messages created longer ago than this that the inbox has no record of
    /// are refused (`inbox.retention` less the signature tolerance, the
    /// clock difference a signature admits).
    dedup_horizon: Duration,
    verification: Verification,
    secrets: HashMap<String, Vec<Secret>>,
    /// Issued secrets, for sources `secrets` does not list.
    issued: Option<crate::keys::IssuedKeys>,
    routes: HashMap<&'static str, BTreeMap<u32, Route>>,
    metadata: serde_json::Value,
    reader: Arc<dyn InboxLookup>,
    commands: mpsc::Sender<Command>,
    metrics: Arc<Metrics>,
    /// One warning per duplicate delivery, rate-limited.
    duplicates: duplicates::DuplicateLog,
    writer_threads: Mutex<Vec<JoinHandle<()>>>,
    liveness: crate::liveness::Liveness,
    /// Decommissioned versions, answered 410.
    lifecycle: Option<crate::lifecycle::Lifecycle>,
}

/// A running receiver: verification, routing, the inbox and the writer
/// thread. Cheap to clone; every clone is the same receiver.
#[derive(Clone)]
pub struct Receiver {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("routes", &self.shared.routes.len())
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// Starts building a receiver that stores its inbox in the SQLite file
    /// `db_path` (created and migrated if needed; it may be the service's own
    /// database, so handlers write business rows next to the inbox).
    /// `db_path` may be a SQLite URI filename (see [`crate::db::open`]).
    pub fn builder(config: Config, db_path: impl AsRef<Path>) -> ReceiverBuilder<Sqlite> {
        let path = db_path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        Self::with_store(
            config,
            shown,
            Box::new(move |parts: WriterParts<Sqlite>| {
                let conn = crate::db::open(&path, parts.durability)?;
                if let Some(lifecycle) = &parts.lifecycle {
                    lifecycle
                        .load_sqlite(&conn)
                        .map_err(|source| crate::db::DbError::Sqlite {
                            path: path.display().to_string(),
                            source,
                        })?;
                }
                let reader = InboxReader::open(&path)?;
                let writer = Writer {
                    conn,
                    commands: parts.commands,
                    handlers: parts.handlers,
                    retention: parts.retention,
                    group_limit: parts.group_limit,
                };
                let alive = parts.alive;
                let thread = std::thread::Builder::new()
                    .name("rfidl-receiver-writer".to_owned())
                    .spawn(move || {
                        let _alive = alive;
                        crate::sched::request_short_slice();
                        writer.run();
                    })
                    .map_err(ReceiverError::WriterThread)?;
                Ok((Arc::new(reader) as Arc<dyn InboxLookup>, vec![thread]))
            }),
        )
    }

    /// Starts building a receiver whose inbox is in a PostgreSQL database
    /// (migrated if needed). Several receivers (replicas) may share one
    /// database: a message delivered to two of them at once is processed by
    /// one; the other answers it as a duplicate. Handlers get a
    /// `&mut postgres::Transaction`, and `writers` threads, each with its own
    /// connection, run them side by side.
    #[cfg(feature = "postgres")]
    pub fn postgres(
        config: Config,
        url: &crate::pg::PostgresUrl,
        writers: usize,
    ) -> ReceiverBuilder<crate::store::Postgres> {
        let url = url.clone();
        Self::with_store(
            config,
            url.to_string(),
            Box::new(move |parts| crate::pg::start_receiver(&url, writers.max(1), parts)),
        )
    }

    fn with_store<S: Store>(
        config: Config,
        shown: String,
        start: StartWriters<S>,
    ) -> ReceiverBuilder<S> {
        ReceiverBuilder {
            config,
            shown,
            start,
            services: Vec::new(),
            metrics: None,
            group_commit_limit: DEFAULT_GROUP_COMMIT_LIMIT,
            batch_body_limit: DEFAULT_BATCH_BODY_LIMIT,
            verification: Verification::Required,
            lifecycle: None,
            issued: None,
        }
    }

    /// The receiver's routes, ready to merge into an application router (or
    /// to serve: see also [`standalone_router`](Self::standalone_router)).
    /// Paths under `/_rf/` that are not routes answer a JSON 404 and wrong
    /// methods a JSON 405; other paths are left to the application.
    pub fn router(&self) -> Router {
        Router::new()
            .route(RECEIVE_PATH, post(receive_one).fallback(method_not_allowed))
            .route(
                RECEIVE_BATCH_PATH,
                post(receive_batch).fallback(method_not_allowed),
            )
            .route(
                METADATA_PATH,
                get(serve_metadata).fallback(method_not_allowed),
            )
            // `{*rest}` does not match an empty rest: `/_rf/` needs its own.
            .route("/_rf/", any(not_found))
            .route("/_rf/{*rest}", any(not_found))
            .with_state(Arc::clone(&self.shared))
    }

    /// Whether the writer thread runs (for readiness probes).
    pub fn liveness(&self) -> crate::liveness::Liveness {
        self.shared.liveness.clone()
    }

    /// The metrics this receiver counts into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// [`receive`](Self::receive) of a message a broker stored at
    /// `stored_at` (Unix seconds): its signature's timestamp is checked
    /// against that time, not now, since the message may rightly wait in
    /// the stream longer than the tolerance (the dispatcher signed it once,
    /// when it published). A replay published later gets a later time and
    /// is refused as before.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) async fn receive_stored_at(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        stored_at: i64,
    ) -> Answer {
        if body.len() > self.shared.body_limit {
            let refusal = ReceiveError::PayloadTooLarge {
                limit: self.shared.body_limit,
            };
            self.shared.count_refusal(&refusal);
            return Answer::Refused(refusal);
        }
        self.shared.receive_one_at(headers, body, stored_at).await
    }

    /// The secrets accepted from `source` (`peers`): what answers going
    /// back to it through a broker are signed with.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn peer_secrets(&self, source: &str) -> Option<Vec<Secret>> {
        self.shared.secrets.get(source).cloned().or_else(|| {
            self.shared
                .issued
                .as_ref()
                .and_then(|issued| issued.peer(source))
        })
    }

    /// The same routes plus a JSON 404 for every other path: for a server
    /// whose only job is receiving. (Axum refuses to merge two routers that
    /// both have a fallback, so [`router`](Self::router) leaves the
    /// application's own fallback alone.)
    pub fn standalone_router(&self) -> Router {
        self.router().fallback(not_found)
    }

    /// `{"interfaces": [{interface, version, fingerprint, endpoints, manifest}]}`,
    /// as served by `GET /_rf/metadata`.
    pub fn metadata(&self) -> &serde_json::Value {
        &self.shared.metadata
    }

    /// The largest body [`receive`](Self::receive) takes (`inbox.body_limit`);
    /// larger ones are answered 413 `payload_too_large`.
    pub fn body_limit(&self) -> usize {
        self.shared.body_limit
    }

    /// Processes one envelope as `POST /_rf/receive` would, without HTTP (for
    /// in-process transports and tests).
    pub async fn receive(&self, headers: &HeaderMap, body: Bytes) -> Answer {
        if body.len() > self.shared.body_limit {
            let refusal = ReceiveError::PayloadTooLarge {
                limit: self.shared.body_limit,
            };
            self.shared.count_refusal(&refusal);
            return Answer::Refused(refusal);
        }
        self.shared.receive_one(headers, body).await
    }

    /// The largest batch request body (`POST /_rf/receive/batch`); larger
    /// ones are answered 413 `payload_too_large`.
    pub fn batch_body_limit(&self) -> usize {
        self.shared.batch_body_limit
    }

    /// The answer to a body over `limit` (this receiver's body or batch
    /// body limit) that was refused before it was read whole (counted like
    /// any refusal).
    #[cfg(feature = "grpc")]
    pub(crate) fn payload_too_large(&self, limit: usize) -> Answer {
        let refusal = ReceiveError::PayloadTooLarge { limit };
        self.shared.count_refusal(&refusal);
        Answer::Refused(refusal)
    }

    /// Stops taking messages, lets the writer finish what is queued, and waits
    /// for its thread to end. Requests after this answer 503 `unavailable`.
    pub async fn shutdown(&self) {
        self.shared.liveness.stop();
        let (done, finished) = oneshot::channel();
        if self
            .shared
            .commands
            .send(Command::Stop { done })
            .await
            .is_ok()
        {
            let _ = finished.await;
        }
        let threads = self
            .shared
            .writer_threads
            .lock()
            .map(|mut slot| std::mem::take(&mut *slot))
            .unwrap_or_default();
        if !threads.is_empty() {
            let _ = tokio::task::spawn_blocking(move || {
                for thread in threads {
                    let _ = thread.join();
                }
            })
            .await;
        }
    }
}

/// A JSON 404 for any path: use it as your application's fallback if you
/// want every unknown path to answer like the receiver does.
pub async fn not_found(OriginalUri(uri): OriginalUri) -> Response {
    ReceiveError::NotFound(uri.path().to_owned()).into_response()
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    ReceiveError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into_response()
}

async fn serve_metadata(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(shared.metadata.clone()).into_response()
}

async fn receive_one(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let bytes = match read_limited(&headers, body, shared.body_limit).await {
        Ok(bytes) => bytes,
        Err(refusal) => {
            shared.count_refusal(&refusal);
            return refusal.into_response();
        }
    };
    shared.receive_one(&headers, bytes).await.into_response()
}

async fn receive_batch(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let bytes = match read_limited(&headers, body, shared.batch_body_limit).await {
        Ok(bytes) => bytes,
        Err(refusal) => {
            shared.count_refusal(&refusal);
            return refusal.into_response();
        }
    };
    match shared.receive_batch(bytes).await {
        Ok(answers) => {
            let results: Vec<BatchResult> =
                answers.into_iter().map(Answer::into_batch_result).collect();
            axum::Json(results).into_response()
        }
        Err(refusal) => {
            shared.count_refusal(&refusal);
            refusal.into_response()
        }
    }
}

/// Reads a body, refusing (413) one larger than `limit`, early when
/// `Content-Length` already says so.
async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ReceiveError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ReceiveError::PayloadTooLarge { limit });
    }
    // The timer is armed only if the body is not all there at the first
    // poll: a body that came with its headers costs no timer.
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(body, limit).collect());
    match read.await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(ReceiveError::PayloadTooLarge { limit }),
        Ok(Err(e)) if crate::serve::is_body_timeout(&*e) => Err(ReceiveError::BodyTimeout {
            seconds: BODY_READ_TIMEOUT.as_secs(),
        }),
        Ok(Err(e)) => Err(ReceiveError::MalformedEnvelope(format!(
            "cannot read the request body: {e}"
        ))),
        Err(_) => Err(ReceiveError::BodyTimeout {
            seconds: BODY_READ_TIMEOUT.as_secs(),
        }),
    }
}

impl Shared {
    async fn receive_one(self: &Arc<Self>, headers: &HeaderMap, body: Bytes) -> Answer {
        self.receive_one_at(headers, body, signing::unix_now())
            .await
    }

    /// [`receive_one`](Self::receive_one) with the signature's timestamp
    /// checked against `now` (Unix seconds).
    async fn receive_one_at(
        self: &Arc<Self>,
        headers: &HeaderMap,
        body: Bytes,
        now: i64,
    ) -> Answer {
        let admitted = if body.len() <= ADMIT_INLINE_LIMIT {
            self.admit(headers, &body, now)
        } else {
            let shared = Arc::clone(self);
            let headers = headers.clone();
            tokio::task::spawn_blocking(move || shared.admit(&headers, &body, now))
                .await
                .unwrap_or_else(|e| {
                    Err(ReceiveError::Unavailable(format!(
                        "the admission task failed: {e}"
                    )))
                })
        };
        let answer = match admitted {
            Ok(admitted) => {
                let mut answers = self.process(vec![admitted]).await;
                answers
                    .pop()
                    .unwrap_or(Answer::Refused(ReceiveError::Unavailable(
                        "the writer gave no answer".to_owned(),
                    )))
            }
            Err(refusal) => Answer::Refused(refusal),
        };
        self.count(&answer);
        answer
    }

    /// A batch request's body: a JSON array of items, each admitted on its
    /// own, the admitted ones processed together.
    async fn receive_batch(self: &Arc<Self>, bytes: Bytes) -> Result<Vec<Answer>, ReceiveError> {
        let (mut answers, admitted, positions) = if bytes.len() <= ADMIT_INLINE_LIMIT {
            self.admit_batch(&bytes)?
        } else {
            let shared = Arc::clone(self);
            tokio::task::spawn_blocking(move || shared.admit_batch(&bytes))
                .await
                .map_err(|e| {
                    ReceiveError::Unavailable(format!("the admission task failed: {e}"))
                })??
        };
        if !admitted.is_empty() {
            let processed = self.process(admitted).await;
            for (position, answer) in positions.into_iter().zip(processed) {
                answers[position] = Some(answer);
            }
        }
        let answers: Vec<Answer> = answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or(Answer::Refused(ReceiveError::Unavailable(
                    "the writer gave no answer".to_owned(),
                )))
            })
            .collect();
        for answer in &answers {
            self.count(answer);
        }
        Ok(answers)
    }

    /// Parses a batch and [`admit`](Self::admit)s each item: an answer for
    /// each refused one, the admitted deliveries, and their positions.
    fn admit_batch(&self, bytes: &[u8]) -> Result<BatchAdmission, ReceiveError> {
        let items: Vec<BatchItem> = serde_json::from_slice(bytes).map_err(|e| {
            ReceiveError::MalformedEnvelope(format!(
                "a batch is a JSON array of {{\"headers\": {{…}}, \"body\": \"<envelope JSON>\"}}: {}",
                crate::redact::json_error(&e)
            ))
        })?;
        let mut answers: Vec<Option<Answer>> = Vec::with_capacity(items.len());
        let mut admitted = Vec::new();
        let mut positions = Vec::new();
        for item in &items {
            if item.body.len() > self.body_limit {
                answers.push(Some(Answer::Refused(ReceiveError::PayloadTooLarge {
                    limit: self.body_limit,
                })));
                continue;
            }
            match self.admit(&item.headers, item.body.as_bytes(), signing::unix_now()) {
                Ok(message) => {
                    positions.push(answers.len());
                    answers.push(None);
                    admitted.push(message);
                }
                Err(refusal) => answers.push(Some(Answer::Refused(refusal))),
            }
        }
        Ok((answers, admitted, positions))
    }

    /// Steps 2 to 6 of the order of checks: envelope, source, signature,
    /// fields, route. Pure CPU work; nothing is read or written.
    fn admit(
        &self,
        headers: &impl SignatureHeaderSource,
        body: &[u8],
        now: i64,
    ) -> Result<Delivery, ReceiveError> {
        let header = |name: &'static str| headers.header(name);
        // 1b. A bounded number of signatures, before any work on the body
        //    (a thousand entries would otherwise cost a thousand HMACs).
        if self.verification == Verification::Required {
            signing::check_signature_count(header(HEADER_SIGNATURE))
                .map_err(ReceiveError::Signature)?;
        }
        // 2. A JSON object with a string `sourceServiceId` (read unverified,
        //    only to choose the secret set).
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| ReceiveError::MalformedEnvelope(format!("body is not JSON: {e}")))?;
        let serde_json::Value::Object(members) = &value else {
            return Err(ReceiveError::MalformedEnvelope(format!(
                "the envelope must be a JSON object, found {}",
                handler::json_kind(&value)
            )));
        };
        let Some(source) = members.get("sourceServiceId").and_then(|v| v.as_str()) else {
            return Err(ReceiveError::MalformedEnvelope(
                "`sourceServiceId` is missing or not a string".to_owned(),
            ));
        };

        // 3 and 4. Source known, signature valid.
        if self.verification == Verification::Required {
            // Configured secrets first; else the issued ones (a snapshot:
            // one read lock and an `Arc` clone).
            let snapshot;
            let secrets = match self.secrets.get(source) {
                Some(secrets) => secrets.as_slice(),
                None => {
                    let Some(issued) = &self.issued else {
                        return Err(ReceiveError::UnknownSource(source.to_owned()));
                    };
                    snapshot = issued.snapshot();
                    let Some(secrets) = snapshot.peers.get(source) else {
                        // A peer that registered after our last renewal:
                        // renew now; the sender retries without counting.
                        issued.request_refresh();
                        return Err(ReceiveError::KeysPending(source.to_owned()));
                    };
                    secrets.as_slice()
                }
            };
            signing::verify(
                header(HEADER_ID),
                header(HEADER_TIMESTAMP),
                header(HEADER_SIGNATURE),
                body,
                secrets,
                now,
                self.tolerance,
            )
            .map_err(ReceiveError::Signature)?;
        }

        // 5. Envelope fields, and webhook-id = messageId.
        let raw_message_id = members
            .get("messageId")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let envelope: Envelope = serde_json::from_value(value)
            .map_err(|e| ReceiveError::MalformedEnvelope(crate::redact::json_error(&e)))?;
        if !envelope.payload.is_object() {
            return Err(ReceiveError::MalformedEnvelope(format!(
                "`payload` must be a JSON object, found {}",
                handler::json_kind(&envelope.payload)
            )));
        }
        let raw_message_id = raw_message_id.unwrap_or_default();
        match header(HEADER_ID) {
            Some(id) if id != raw_message_id => {
                return Err(ReceiveError::IdMismatch {
                    header: id.to_owned(),
                    body: raw_message_id,
                });
            }
            _ => {}
        }

        // 6. A hosted interface, version and endpoint.
        let Some(versions) = self.routes.get(envelope.interface.as_str()) else {
            return Err(ReceiveError::UnknownInterface(envelope.interface));
        };
        let Some(route) = versions.get(&envelope.version) else {
            let hosted = versions
                .keys()
                .map(|v| format!("v{v}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ReceiveError::UnknownVersion {
                interface: envelope.interface,
                version: envelope.version,
                hosted,
            });
        };
        if !route.hosted.endpoints.contains(&envelope.endpoint.as_str()) {
            return Err(ReceiveError::UnknownEndpoint {
                interface: envelope.interface,
                version: envelope.version,
                endpoint: envelope.endpoint,
            });
        }
        if let Some(lifecycle) = &self.lifecycle
            && lifecycle.is_decommissioned(&envelope.interface, envelope.version)
        {
            return Err(ReceiveError::VersionDecommissioned {
                interface: envelope.interface,
                version: envelope.version,
            });
        }
        let hosted_fingerprint_differs =
            (envelope.fingerprint != route.hosted.fingerprint).then_some(route.hosted.fingerprint);
        let message_id = canonical_id(envelope.message_id);
        let (trace, carried) = crate::trace::received(&envelope.headers);
        let span = tracing::info_span!(
            "receive",
            message_id = %message_id,
            source = %envelope.source_service_id,
            interface = %envelope.interface,
            version = envelope.version,
            endpoint = %envelope.endpoint,
            trace_id = %trace.trace_id(),
            parent_id = %crate::trace::OptionalId(carried.map(|t| t.parent_id())),
        );
        Ok(Delivery {
            trace,
            span,
            message_id,
            payload_sha256: payload_digest(&envelope.payload),
            service: route.service,
            hosted_fingerprint_differs,
            envelope,
        })
    }

    /// Step 7 (the committed-inbox look-up, off the executor), then the
    /// writer for whatever is new (steps 8 and 9 run there).
    async fn process(&self, admitted: Vec<Delivery>) -> Vec<Answer> {
        let keys: Vec<(String, String)> = admitted
            .iter()
            .map(|a| (a.envelope.source_service_id.clone(), a.message_id.clone()))
            .collect();
        // A lone message within the dedup horizon goes straight to the
        // writer, unread: the writer's transaction looks it up anyway and
        // answers a duplicate from there, so a look-up here would only put a
        // read (and, on SQLite, a page cache the writer's last commit made
        // stale) on every message's path: about 30 µs of commit -> effect on
        // the benchmark machine. Batches, and a message whose age makes the
        // look-up decide between a duplicate and `beyond_dedup_horizon`,
        // are looked up here on the blocking pool, which keeps duplicates
        // off the writer.
        let straight = matches!(admitted.as_slice(), [lone] if self.beyond_horizon(lone).is_none());
        let found = match straight {
            true => Ok(vec![Ok(None)]),
            false => {
                let reader = Arc::clone(&self.reader);
                let keys = keys.clone();
                tokio::task::spawn_blocking(move || {
                    keys.iter()
                        .map(|(source, id)| reader.lookup(source, id))
                        .collect::<Vec<_>>()
                })
                .await
            }
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                error!(error = %e, "inbox look-up task failed");
                let refusal = ReceiveError::Unavailable("inbox look-up failed".to_owned());
                return vec![Answer::Refused(refusal); admitted.len()];
            }
        };

        let mut answers: Vec<Option<Answer>> = Vec::with_capacity(admitted.len());
        let mut fresh = Vec::new();
        let mut positions = Vec::new();
        for (delivery, entry) in admitted.into_iter().zip(found) {
            match entry {
                Ok(Some(entry)) if entry.payload_sha256 == delivery.payload_sha256 => {
                    self.metrics.inbox_duplicates.inc();
                    answers.push(Some(Answer::Acknowledged {
                        duplicate: true,
                        payload: entry.response_value(),
                    }));
                }
                Ok(Some(_)) => {
                    answers.push(Some(Answer::Refused(ReceiveError::MessageIdReused {
                        source_service_id: delivery.envelope.source_service_id.clone(),
                        message_id: delivery.message_id.clone(),
                    })));
                }
                Ok(None) => {
                    if let Some(refusal) = self.beyond_horizon(&delivery) {
                        answers.push(Some(Answer::Refused(refusal)));
                        continue;
                    }
                    positions.push(answers.len());
                    answers.push(None);
                    fresh.push(delivery);
                }
                Err(e) => {
                    error!(error = %e, "inbox look-up failed");
                    answers.push(Some(Answer::Refused(ReceiveError::Unavailable(format!(
                        "inbox look-up failed: {e}"
                    )))));
                }
            }
        }

        if !fresh.is_empty() {
            let count = fresh.len();
            let written = self.write(fresh).await;
            let written = if written.len() == count {
                written
            } else {
                vec![
                    Answer::Refused(ReceiveError::Unavailable(
                        "the writer gave no answer".to_owned()
                    ));
                    count
                ]
            };
            for (position, answer) in positions.into_iter().zip(written) {
                answers[position] = Some(answer);
            }
        }
        answers
            .into_iter()
            .zip(keys)
            .map(|(answer, (source, id))| {
                let answer = answer.unwrap_or(Answer::Refused(ReceiveError::Unavailable(
                    "no answer".to_owned(),
                )));
                if matches!(
                    answer,
                    Answer::Acknowledged {
                        duplicate: true,
                        ..
                    }
                ) {
                    self.duplicates.note(&source, &id);
                }
                answer
            })
            .collect()
    }

    /// The dedup horizon: a message with no inbox record, created longer
    /// ago than the inbox keeps records, may have been processed and
    /// forgotten. It is refused rather than processed a second time.
    fn beyond_horizon(&self, delivery: &Delivery) -> Option<ReceiveError> {
        let created = delivery.envelope.created_at?;
        let age_ms = jiff::Timestamp::now()
            .as_millisecond()
            .saturating_sub(created.as_millisecond());
        let horizon_ms = self.dedup_horizon.as_millis() as i64;
        (age_ms > horizon_ms).then(|| ReceiveError::BeyondDedupHorizon {
            message_id: delivery.message_id.clone(),
            age_secs: (age_ms / 1000).max(0) as u64,
            horizon_secs: (horizon_ms / 1000) as u64,
        })
    }

    /// Hands deliveries to the writer and waits (bounded) for their answers.
    async fn write(&self, deliveries: Vec<Delivery>) -> Vec<Answer> {
        let count = deliveries.len();
        let (reply, answered) = oneshot::channel();
        let job = Job { deliveries, reply };
        let wait = async {
            if self.commands.send(Command::Deliver(job)).await.is_err() {
                return vec![Answer::Refused(ReceiveError::ShuttingDown); count];
            }
            answered
                .await
                .unwrap_or_else(|_| vec![Answer::Refused(ReceiveError::ShuttingDown); count])
        };
        match tokio::time::timeout(self.in_progress_wait, wait).await {
            Ok(answers) => answers,
            // The writer may still commit it: the sender's retry then gets a duplicate.
            Err(_) => vec![Answer::Refused(ReceiveError::InProgress); count],
        }
    }

    /// Counts a refusal and logs it: 401s at `warn` (a peer's secret may be
    /// wrong or rotating), other refusals at `debug`.
    fn count_refusal(&self, refusal: &ReceiveError) {
        let status = refusal.status();
        if status == axum::http::StatusCode::UNAUTHORIZED {
            self.metrics.inbox_signature_failures.inc();
            warn!(code = refusal.code(), "delivery refused: {refusal}");
        } else {
            if status.is_client_error() {
                self.metrics.inbox_rejected.inc();
            }
            debug!(
                status = status.as_u16(),
                code = refusal.code(),
                "delivery refused: {refusal}"
            );
        }
    }

    fn count(&self, answer: &Answer) {
        if let Answer::Refused(refusal) = answer {
            self.count_refusal(refusal);
        }
    }
}

/// Where the `webhook-*` headers of a message are read from: the request's
/// headers, or a batch item's `headers` map (names compared without case).
trait SignatureHeaderSource {
    fn header(&self, name: &str) -> Option<&str>;
}

impl SignatureHeaderSource for HeaderMap {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

impl SignatureHeaderSource for BTreeMap<String, String> {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// The inbox key of a message id: lower-case, hyphenated.
fn canonical_id(id: Uuid) -> String {
    id.hyphenated().to_string()
}
