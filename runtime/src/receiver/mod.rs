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

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) mod async_writer;
mod builder;
mod duplicates;
pub mod handler;
mod pipeline;
pub(crate) mod reply;
pub(crate) mod writer;

pub(crate) use builder::Started;
pub(crate) use builder::WriterParts;
pub use builder::{ReceiverBuilder, ReceiverError};
use builder::{Route, Verification};

use std::collections::{BTreeMap, HashMap};

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
use tracing::warn;

pub use handler::{
    AsyncHostedService, Awaited, Blocking, HandlerError, HostedInterface, HostedService,
    IncomingCall, IntoService, Registered, decode_payload, encode_response,
};
pub use reply::{KEYS_PENDING, ReceiveError, Reply};

use crate::config::Config;
use crate::envelope::BatchResult;
use crate::inbox::InboxLookup;
use crate::metrics::Metrics;
use crate::signing::Secret;
use crate::store::{AnyStore, Sqlite};
use writer::{Command, Delivery, Handlers};

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
type BatchAdmission = (Vec<Option<Reply>>, Vec<Delivery>, Vec<usize>);

/// Requests whose body is larger than this are admitted (JSON parse and
/// HMAC) on the blocking pool, so that a few large bodies cannot hold the
/// async workers that answer `/_rf/livez` and every other request. Smaller
/// ones are admitted in place: a hop to the pool would cost more than the
/// work.
const ADMIT_INLINE_LIMIT: usize = 64 * 1024;
/// How long a request body may take to arrive whole, from the end of its
/// headers; a slower one is answered 408 `body_timeout` and its connection
/// closed. [`serve()`](crate::serve()) applies the same bound to every route.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A message as a broker stored it: its headers, its body, and when the
/// broker stored it (Unix seconds).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) struct Stored {
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) stored_at: i64,
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
    /// Where the inbox is.
    database: crate::store::Database,
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
    /// Starts building a receiver whose inbox is in `database` (created and
    /// migrated if needed): a SQLite file path, or a sqlx store (`&PgStore`,
    /// `&SqliteStore`). It may be the
    /// service's own database, so handlers write business rows next to the
    /// inbox; handlers get that store's transaction.
    ///
    /// Several receivers (replicas) may share one PostgreSQL database: a
    /// message delivered to two of them at once is processed by one; the
    /// other answers it as a duplicate.
    pub fn builder<S: AnyStore>(
        config: Config,
        database: impl crate::store::Location<Store = S>,
    ) -> ReceiverBuilder<S> {
        ReceiverBuilder {
            config,
            database: database.into_database(),
            writers: None,
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

    /// The database the inbox is in.
    pub fn database(&self) -> &crate::store::Database {
        &self.shared.database
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
    #[cfg_attr(not(any(feature = "nats", feature = "amqp")), allow(dead_code))]
    pub(crate) async fn receive_stored_at(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        stored_at: i64,
    ) -> Reply {
        if body.len() > self.shared.body_limit {
            let refusal = ReceiveError::PayloadTooLarge {
                limit: self.shared.body_limit,
            };
            self.shared.count_refusal(&refusal);
            return Reply::Refused(refusal);
        }
        self.shared.receive_one_at(headers, body, stored_at).await
    }

    /// [`receive_stored_at`](Self::receive_stored_at) of several messages
    /// a broker consumer took at once: each admitted on its own, the
    /// admitted ones handed to the writer together (one group commit, as
    /// a batch request's). One answer per message, in order.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) async fn receive_many_stored_at(&self, messages: Vec<Stored>) -> Vec<Reply> {
        self.shared.receive_many_at(messages).await
    }

    /// The secrets accepted from `source` (`peers`): what answers going
    /// back to it through a broker are signed with.
    #[cfg_attr(not(any(feature = "nats", feature = "amqp")), allow(dead_code))]
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
    pub async fn receive(&self, headers: &HeaderMap, body: Bytes) -> Reply {
        if body.len() > self.shared.body_limit {
            let refusal = ReceiveError::PayloadTooLarge {
                limit: self.shared.body_limit,
            };
            self.shared.count_refusal(&refusal);
            return Reply::Refused(refusal);
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
    pub(crate) fn payload_too_large(&self, limit: usize) -> Reply {
        let refusal = ReceiveError::PayloadTooLarge { limit };
        self.shared.count_refusal(&refusal);
        Reply::Refused(refusal)
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
                answers.into_iter().map(Reply::into_batch_result).collect();
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
