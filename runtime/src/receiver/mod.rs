//! The receiving side: an axum [`Router`] for `POST /_rf/receive` (and
//! `/_rf/receive/batch`, `GET /_rf/metadata`) that verifies signatures,
//! de-duplicates on the inbox and runs each handler together with its inbox
//! row in one transaction, which makes processing exactly-once.
//!
//! Checks run in the order of the wire protocol, and each answers and stops
//! at the first failure; nothing before the writer's transaction writes.
//! The router can be merged into the user's own axum app.

pub mod handler;
mod writer;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
pub use handler::{
    HandlerError, HostedInterface, HostedService, IncomingCall, decode_payload, encode_response,
};
use tokio::sync::oneshot;

use crate::config::Config;
use crate::envelope::{Acknowledgement, BatchItem, BatchResult, Envelope, ErrorBody};
use crate::metrics::Metrics;
use crate::signing::{self, Secret};
use crate::{db, inbox};

/// Why a receiver could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error("secret #{index} for peer `{peer}`: {source}")]
    Secret {
        peer: String,
        index: usize,
        source: signing::SecretError,
    },
    #[error("two services host {interface} v{version}")]
    DuplicateInterface { interface: String, version: u32 },
    #[error("cannot start the inbox writer thread: {0}")]
    Thread(std::io::Error),
}

/// Builds a [`Receiver`].
#[must_use]
pub struct ReceiverBuilder {
    config: Config,
    db_path: std::path::PathBuf,
    services: Vec<Arc<dyn HostedService>>,
    metrics: Arc<Metrics>,
    verify_signatures: bool,
}

impl ReceiverBuilder {
    /// Hosts a service (generated receivers: `EmpServiceV1::ServiceReceiver(handler)`).
    pub fn service(mut self, service: impl HostedService) -> Self {
        self.services.push(Arc::new(service));
        self
    }

    /// Shares a metrics registry (e.g. with the dispatcher of the same process).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Accepts unsigned requests from any source. For local development only:
    /// anyone who can reach the port can then inject messages.
    pub fn danger_accept_unsigned_for_local_development(mut self) -> Self {
        self.verify_signatures = false;
        self
    }

    /// Opens the inbox database (creating and migrating it) and starts the writer.
    pub fn build(self) -> Result<Receiver, ReceiverError> {
        let mut routes = BTreeMap::new();
        for (index, service) in self.services.iter().enumerate() {
            for hosted in service.interfaces() {
                let key = (hosted.interface.to_owned(), hosted.version);
                if routes.insert(key, (index, *hosted)).is_some() {
                    return Err(ReceiverError::DuplicateInterface {
                        interface: hosted.interface.to_owned(),
                        version: hosted.version,
                    });
                }
            }
        }
        let mut peers = BTreeMap::new();
        for (peer, texts) in &self.config.peers {
            let mut secrets = Vec::new();
            for (index, text) in texts.iter().enumerate() {
                let secret = Secret::parse(text).map_err(|source| ReceiverError::Secret {
                    peer: peer.clone(),
                    index,
                    source,
                })?;
                secrets.push(secret);
            }
            peers.insert(peer.clone(), secrets);
        }
        if !self.verify_signatures {
            tracing::warn!(
                "signature verification is OFF: this receiver accepts unsigned messages from anyone"
            );
        }
        let write_conn = db::open(&self.db_path, self.config.inbox.durability)?;
        let read_conn = db::open(&self.db_path, self.config.inbox.durability)?;
        let services = Arc::new(self.services);
        let writer = writer::start(
            write_conn,
            services.clone(),
            self.metrics.clone(),
            self.config.inbox.retention,
        )
        .map_err(ReceiverError::Thread)?;
        Ok(Receiver {
            inner: Arc::new(Inner {
                config: self.config,
                routes,
                peers,
                verify_signatures: self.verify_signatures,
                read_conn: std::sync::Mutex::new(read_conn),
                writer: writer.sender,
                writer_thread: std::sync::Mutex::new(Some(writer.thread)),
                metrics: self.metrics,
            }),
        })
    }
}

/// A running receiver: its writer thread and the router that feeds it.
/// Cheap to clone.
#[derive(Clone)]
pub struct Receiver {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    /// (interface, version) -> (service index, what it hosts).
    routes: BTreeMap<(String, u32), (usize, HostedInterface)>,
    peers: BTreeMap<String, Vec<Secret>>,
    verify_signatures: bool,
    /// For the duplicate fast path; the writer checks again in its transaction.
    read_conn: std::sync::Mutex<rusqlite::Connection>,
    writer: tokio::sync::mpsc::Sender<writer::Job>,
    writer_thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    metrics: Arc<Metrics>,
}

impl Receiver {
    /// Starts building a receiver whose inbox lives in `db_path`.
    pub fn builder(config: Config, db_path: impl AsRef<Path>) -> ReceiverBuilder {
        ReceiverBuilder {
            config,
            db_path: db_path.as_ref().to_path_buf(),
            services: Vec::new(),
            metrics: Arc::new(Metrics::default()),
            verify_signatures: true,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The routes: `POST /_rf/receive`, `POST /_rf/receive/batch`,
    /// `GET /_rf/metadata`; every other path or method answers a JSON error.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/_rf/receive", post(receive))
            .route("/_rf/receive/batch", post(receive_batch))
            .route("/_rf/metadata", get(metadata))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self.clone())
    }

    /// Stops the writer after the deliveries already queued. Requests that
    /// arrive afterwards are answered 503.
    pub async fn shutdown(self) {
        let thread = self
            .inner
            .writer_thread
            .lock()
            .ok()
            .and_then(|mut t| t.take());
        drop(self);
        if let Some(thread) = thread {
            // The thread ends once every sender (router clones included) is gone.
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// An answer with the wire protocol's JSON error body.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        error: code.to_owned(),
        message: message.into(),
    };
    (status, axum::Json(body)).into_response()
}

fn retry_later(code: &str, message: impl Into<String>) -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, code, message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such path; messages go to POST /_rf/receive",
    )
}

async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this path",
    )
}

async fn metadata(State(receiver): State<Receiver>) -> Response {
    let hosted: Vec<serde_json::Value> = receiver
        .inner
        .routes
        .values()
        .map(|(_, hosted)| {
            serde_json::json!({
                "interface": hosted.interface,
                "version": hosted.version,
                "fingerprint": hosted.fingerprint,
                "endpoints": hosted.endpoints,
                "manifest": serde_json::from_str::<serde_json::Value>(hosted.manifest_json).unwrap_or_default(),
            })
        })
        .collect();
    axum::Json(serde_json::json!({ "interfaces": hosted })).into_response()
}

async fn receive(State(receiver): State<Receiver>, request: Request) -> Response {
    let limit = receiver.inner.config.inbox.body_limit;
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, limit).await else {
        receiver.inner.metrics.inbox_rejected.inc();
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body exceeds {limit} bytes"),
        );
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let signature = SignedHeaders {
        id: header(signing::HEADER_ID),
        timestamp: header(signing::HEADER_TIMESTAMP),
        signature: header(signing::HEADER_SIGNATURE),
    };
    match receiver.admit(&signature, &body) {
        Ok(admitted) => {
            let pending = receiver.enqueue(admitted).await;
            receiver.finish(pending).await
        }
        Err(rejection) => rejection.into_response(),
    }
}

async fn receive_batch(State(receiver): State<Receiver>, request: Request) -> Response {
    let limit = receiver.inner.config.inbox.body_limit;
    let Ok(body) = axum::body::to_bytes(request.into_body(), limit.saturating_mul(64)).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the batch is too large",
        );
    };
    let Ok(items) = serde_json::from_slice::<Vec<BatchItem>>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "malformed_envelope",
            "a batch is a JSON array of {headers, body} items",
        );
    };
    // Admit every item first, so all admitted ones reach the writer together
    // and share one commit.
    let admitted: Vec<Result<Admitted, Rejection>> = items
        .iter()
        .map(|item| {
            if item.body.len() > limit {
                return Err(Rejection {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "payload_too_large",
                    message: format!("the item exceeds {limit} bytes"),
                });
            }
            let get = |name: &str| item.headers.get(name).cloned();
            let signature = SignedHeaders {
                id: get(signing::HEADER_ID),
                timestamp: get(signing::HEADER_TIMESTAMP),
                signature: get(signing::HEADER_SIGNATURE),
            };
            receiver.admit(&signature, item.body.as_bytes())
        })
        .collect();
    // Queue every admitted delivery before awaiting any, so they share commits.
    let mut pending = Vec::with_capacity(admitted.len());
    for admitted in admitted {
        pending.push(match admitted {
            Ok(admitted) => receiver.enqueue(admitted).await,
            Err(rejection) => Pending::Done(rejection.into_response()),
        });
    }
    let mut results = Vec::with_capacity(pending.len());
    for pending in pending {
        let response = receiver.finish(pending).await;
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        results.push(BatchResult { status, body });
    }
    axum::Json(results).into_response()
}

/// A delivery handed to the writer, or already answered.
enum Pending {
    Done(Response),
    Waiting(oneshot::Receiver<writer::Outcome>),
}

/// A refused delivery: status, stable code, human message.
struct Rejection {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Rejection {
    fn into_response(self) -> Response {
        error(self.status, self.code, self.message)
    }
}

struct SignedHeaders {
    id: Option<String>,
    timestamp: Option<String>,
    signature: Option<String>,
}

/// A delivery that passed every check before the inbox.
enum Admitted {
    /// Answered from the inbox without the writer.
    Known(Response),
    Job(Box<writer::Job>, oneshot::Receiver<writer::Outcome>),
}

impl Receiver {
    /// Steps 2–7 of the wire protocol's order of checks.
    fn admit(&self, headers: &SignedHeaders, body: &[u8]) -> Result<Admitted, Rejection> {
        let inner = &self.inner;
        let rejected = |status: StatusCode, code: &'static str, message: String| {
            if status == StatusCode::UNAUTHORIZED {
                inner.metrics.inbox_signature_failures.inc();
            } else {
                inner.metrics.inbox_rejected.inc();
            }
            Rejection {
                status,
                code,
                message,
            }
        };
        // 2. A JSON object with a string sourceServiceId (read unverified, only to pick secrets).
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
            rejected(
                StatusCode::BAD_REQUEST,
                "malformed_envelope",
                format!("the body is not JSON: {e}"),
            )
        })?;
        let Some(source) = value
            .get("sourceServiceId")
            .and_then(|s| s.as_str())
            .map(str::to_owned)
        else {
            return Err(rejected(
                StatusCode::BAD_REQUEST,
                "malformed_envelope",
                "the body must be a JSON object with a string `sourceServiceId`".to_owned(),
            ));
        };
        // 3 + 4. Secrets for that source, then the Standard Webhooks signature.
        if inner.verify_signatures {
            let Some(secrets) = inner.peers.get(&source) else {
                return Err(rejected(
                    StatusCode::UNAUTHORIZED,
                    "unknown_source",
                    format!("no secret is configured for source `{source}`"),
                ));
            };
            signing::verify(
                headers.id.as_deref(),
                headers.timestamp.as_deref(),
                headers.signature.as_deref(),
                body,
                secrets,
                signing::unix_now(),
                inner.config.inbox.signature_tolerance,
            )
            .map_err(|e| {
                tracing::warn!(source = %source, "signature verification failed: {e}");
                rejected(StatusCode::UNAUTHORIZED, e.code(), e.to_string())
            })?;
        }
        // 5. The whole envelope, and the id the signature covered.
        let envelope: Envelope = serde_json::from_value(value).map_err(|e| {
            rejected(
                StatusCode::BAD_REQUEST,
                "malformed_envelope",
                format!("invalid envelope: {e}"),
            )
        })?;
        let message_id = envelope.message_id.to_string();
        if inner.verify_signatures && headers.id.as_deref() != Some(message_id.as_str()) {
            return Err(rejected(
                StatusCode::BAD_REQUEST,
                "id_mismatch",
                "`webhook-id` differs from the envelope's `messageId`".to_owned(),
            ));
        }
        // 6. Routing.
        let route = inner
            .routes
            .get(&(envelope.interface.clone(), envelope.version));
        let Some((service, hosted)) = route else {
            let known_interface = inner
                .routes
                .keys()
                .any(|(interface, _)| *interface == envelope.interface);
            let (code, message) = if known_interface {
                (
                    "unknown_version",
                    format!(
                        "{} v{} is not hosted here",
                        envelope.interface, envelope.version
                    ),
                )
            } else {
                (
                    "unknown_interface",
                    format!("interface `{}` is not hosted here", envelope.interface),
                )
            };
            return Err(rejected(StatusCode::NOT_FOUND, code, message));
        };
        if !hosted.endpoints.contains(&envelope.endpoint.as_str()) {
            return Err(rejected(
                StatusCode::NOT_FOUND,
                "unknown_endpoint",
                format!(
                    "{} v{} has no endpoint `{}`",
                    envelope.interface, envelope.version, envelope.endpoint
                ),
            ));
        }
        if envelope.fingerprint != hosted.fingerprint {
            inner.metrics.inbox_fingerprint_mismatches.inc();
            tracing::info!(
                interface = %envelope.interface, version = envelope.version,
                sender = %envelope.fingerprint, hosted = %hosted.fingerprint,
                "fingerprint differs from the hosted one; decoding decides"
            );
        }
        // 7. Inbox fast path (the writer checks again inside its transaction).
        let digest = inbox::payload_digest(&envelope.payload);
        let known = inner
            .read_conn
            .lock()
            .ok()
            .and_then(|conn| inbox::lookup(&conn, &source, &message_id).ok().flatten());
        if let Some(record) = known {
            if record.payload_sha256 == digest {
                inner.metrics.inbox_duplicates.inc();
                return Ok(Admitted::Known(acknowledged(true, record.response)));
            }
            return Err(rejected(
                StatusCode::UNPROCESSABLE_ENTITY,
                "message_id_reused",
                format!("message {message_id} was processed before with a different payload"),
            ));
        }
        let (reply, outcome) = oneshot::channel();
        let job = writer::Job {
            service: *service,
            source,
            message_id,
            correlation_id: envelope.correlation_id,
            interface: envelope.interface,
            version: envelope.version,
            endpoint: envelope.endpoint,
            payload: envelope.payload,
            payload_sha256: digest,
            reply,
        };
        Ok(Admitted::Job(Box::new(job), outcome))
    }

    /// Hands an admitted delivery to the writer (steps 8–9 run there: decode,
    /// handler and inbox row in one transaction).
    async fn enqueue(&self, admitted: Admitted) -> Pending {
        let (job, outcome) = match admitted {
            Admitted::Known(response) => return Pending::Done(response),
            Admitted::Job(job, outcome) => (job, outcome),
        };
        if self.inner.writer.send(*job).await.is_err() {
            return Pending::Done(retry_later(
                "shutting_down",
                "the receiver is shutting down",
            ));
        }
        Pending::Waiting(outcome)
    }

    /// Waits for the writer's verdict (given only after the commit) and answers.
    async fn finish(&self, pending: Pending) -> Response {
        let outcome = match pending {
            Pending::Done(response) => return response,
            Pending::Waiting(outcome) => outcome,
        };
        let wait = self.inner.config.inbox.in_progress_wait;
        let outcome = match tokio::time::timeout(wait, outcome).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => return retry_later("shutting_down", "the receiver is shutting down"),
            Err(_) => {
                return retry_later(
                    "in_progress",
                    "the message is still being processed; retry later",
                );
            }
        };
        let metrics = &self.inner.metrics;
        match outcome {
            writer::Outcome::Processed(payload) => acknowledged(false, payload),
            writer::Outcome::Duplicate(payload) => acknowledged(true, payload),
            writer::Outcome::IdReused => {
                metrics.inbox_rejected.inc();
                error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "message_id_reused",
                    "this message id was processed with a different payload",
                )
            }
            writer::Outcome::Failed(HandlerError::PayloadMismatch(message)) => {
                metrics.inbox_rejected.inc();
                error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "payload_mismatch",
                    message,
                )
            }
            writer::Outcome::Failed(HandlerError::Poison(message)) => {
                metrics.inbox_rejected.inc();
                error(StatusCode::UNPROCESSABLE_ENTITY, "poison", message)
            }
            writer::Outcome::Failed(HandlerError::UnknownEndpoint(endpoint)) => {
                metrics.inbox_rejected.inc();
                error(
                    StatusCode::NOT_FOUND,
                    "unknown_endpoint",
                    format!("no endpoint `{endpoint}`"),
                )
            }
            writer::Outcome::Failed(HandlerError::Retryable(message)) => {
                error(StatusCode::INTERNAL_SERVER_ERROR, "handler_failed", message)
            }
            writer::Outcome::Storage(message) => retry_later("storage_unavailable", message),
        }
    }
}

fn acknowledged(duplicate: bool, payload: serde_json::Value) -> Response {
    axum::Json(Acknowledgement {
        acknowledged: true,
        duplicate,
        payload,
    })
    .into_response()
}
