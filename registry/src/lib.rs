//! `rfidl-registry`: a server that stores versioned, immutable interface
//! manifests (`docs/registry.md`).
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let registry = rfidl_registry::Registry::open("registry.db".as_ref())?
//!     .publish_token("s3cret")
//!     .registration_token("hr-s3cret")
//!     .operator_token("op-s3cret");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7300").await?;
//! rfidl_runtime::serve(listener, registry.router()).await?;
//! # Ok(()) }
//! ```
//!
//! Order of checks on `PUT /v1/interfaces/{interface}/v{version}`: token
//! (401) → body size (413) → the body is a manifest (422
//! `invalid_manifest`) → it is the interface version the path names (422
//! `path_mismatch`) → its fingerprint matches its content (422
//! `fingerprint_mismatch`) → it is a manifest a contract could produce
//! (422 `manifest_rejected`, with the `M0001`… problems) → stored already (200) / first revision (201) /
//! a compatible next revision (201) / a breaking one (409
//! `breaking_change`, with the changes). Every error body is
//! `{"error": code, "message": text}`. SQLite runs on the blocking pool.
//!
//! Reads answer `ETag`s and honour `If-None-Match` (304, [`conditional`]);
//! `POST /v1/compatibility/…` runs a publish's checks and stores nothing
//! ([`routes`]); `/livez` and `/readyz` are the probes.
//! Nothing is stored for a refused publish.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod access;
pub mod aggregator;
pub mod commands;
pub mod conditional;
mod dashboard;
pub mod decommission;
pub mod directory;
pub mod keys;
pub mod liveness;
pub mod rollup;
mod routes;
pub mod store;

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{OriginalUri, Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use rfidl_contract::manifest::Manifest;
use rfidl_contract::manifest::compat::BreakingChange;
use rfidl_contract::validate::InvalidManifest;
use rfidl_contract::validate::{ManifestProblem, shown};
use rusqlite::Connection;
use serde::Serialize;

pub use store::StoreError;

/// Largest manifest accepted by a publish.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// A refused registry request; each has a status and a documented code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// 401 `unauthorized`: the request lacks the credential it needs.
    #[error("a valid `Authorization: Bearer` {} is required for this", .0.credential())]
    Unauthorized(access::Access),
    /// 403 `operation_disabled`: the registry is closed (it has a
    /// credential) and the one this operation needs is not configured.
    #[error(
        "this registry has no {} configured, so this operation is disabled; start it with {}",
        .0.credential(),
        .0.flag()
    )]
    OperationDisabled(access::Access),
    /// 403 `instance_owned`: the instance was registered with another
    /// credential.
    #[error("{0}")]
    InstanceOwned(String),
    /// 403 `keys_owned`: the service's issued keys are bound to another
    /// registration credential.
    #[error("{0}")]
    KeysOwned(String),
    /// 409 `registration_changed`: a heartbeat's registration digest is not
    /// the stored registration's; register again.
    #[error("{0}")]
    RegistrationChanged(String),
    /// 429 `rate_limited`: too many registrations of one service.
    #[error(
        "more than {per_minute} registrations of service `{service}` in a minute; retry in \
         {retry_after} s"
    )]
    RateLimited {
        service: String,
        per_minute: u32,
        retry_after: u64,
    },
    /// 422 `network_not_allowed`: a registration's base URL is outside the
    /// registry's allowed networks.
    #[error("{0}")]
    NetworkNotAllowed(String),
    #[error("the manifest is larger than the {BODY_LIMIT}-byte limit")]
    PayloadTooLarge,
    #[error("{0}")]
    BadRequest(String),
    /// 408 `body_timeout`: the body did not arrive within the server's body
    /// read timeout.
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("the body is not a manifest: {0}")]
    InvalidManifest(String),
    #[error("the path names {path}, the manifest is {manifest}")]
    PathMismatch { path: String, manifest: String },
    #[error("the manifest says {stated}, its content has {computed}")]
    FingerprintMismatch { stated: String, computed: String },
    #[error("no contract could produce this manifest: {0}")]
    ManifestRejected(InvalidManifest),
    #[error("{interface} v{version}: {} change(s) break the published revision", changes.len())]
    BreakingChange {
        interface: String,
        version: u32,
        changes: Vec<BreakingChange>,
    },
    /// The message names what is missing (and a close name, if any).
    #[error("{0}")]
    NotFound(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// 422 `invalid_registration`: the body is not a registration (or
    /// deploy check) of this format.
    #[error("the body is not a valid registration: {0}")]
    InvalidRegistration(String),
    /// 422 `unknown_interface`: a hosted interface version or revision is
    /// not published.
    #[error("{0}")]
    UnknownInterface(String),
    /// 404 `unknown_instance`: a heartbeat from an instance that is not
    /// registered.
    #[error("{0}")]
    UnknownInstance(String),
    /// 409 `unsatisfied_dependencies`: the manifest scan found called
    /// versions no active provider hosts (listed in `missing`).
    #[error("{} called interface version(s) have no compatible provider", .0.len())]
    Unsatisfied(Vec<directory::Unmet>),
    /// 502 `instance_unreachable`: the instance did not answer what the
    /// registry asked it on the operator's behalf (its failed list).
    #[error("the instance did not answer: {0}")]
    InstanceUnreachable(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::OperationDisabled(_)
            | ApiError::InstanceOwned(_)
            | ApiError::KeysOwned(_) => StatusCode::FORBIDDEN,
            ApiError::RegistrationChanged(_) => StatusCode::CONFLICT,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NetworkNotAllowed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::InvalidManifest(_)
            | ApiError::PathMismatch { .. }
            | ApiError::FingerprintMismatch { .. }
            | ApiError::ManifestRejected(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BreakingChange { .. } => StatusCode::CONFLICT,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::InvalidRegistration(_) | ApiError::UnknownInterface(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::UnknownInstance(_) => StatusCode::NOT_FOUND,
            ApiError::Unsatisfied(_) => StatusCode::CONFLICT,
            ApiError::InstanceUnreachable(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The `error` member of the body.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::OperationDisabled(_) => "operation_disabled",
            ApiError::InstanceOwned(_) => "instance_owned",
            ApiError::KeysOwned(_) => "keys_owned",
            ApiError::RegistrationChanged(_) => "registration_changed",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::NetworkNotAllowed(_) => "network_not_allowed",
            ApiError::PayloadTooLarge => "payload_too_large",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::BodyTimeout => "body_timeout",
            ApiError::InvalidManifest(_) => "invalid_manifest",
            ApiError::PathMismatch { .. } => "path_mismatch",
            ApiError::FingerprintMismatch { .. } => "fingerprint_mismatch",
            ApiError::ManifestRejected(_) => "manifest_rejected",
            ApiError::BreakingChange { .. } => "breaking_change",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::InvalidRegistration(_) => "invalid_registration",
            ApiError::UnknownInterface(_) => "unknown_interface",
            ApiError::UnknownInstance(_) => "unknown_instance",
            ApiError::Unsatisfied(_) => "unsatisfied_dependencies",
            ApiError::InstanceUnreachable(_) => "instance_unreachable",
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'static str,
    message: String,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    changes: &'a [BreakingChange],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    problems: &'a [ManifestProblem],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    missing: &'a [directory::Unmet],
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let changes = match &self {
            ApiError::BreakingChange { changes, .. } => changes.as_slice(),
            _ => &[],
        };
        let problems = match &self {
            ApiError::ManifestRejected(invalid) => invalid.problems.as_slice(),
            _ => &[],
        };
        let missing = match &self {
            ApiError::Unsatisfied(missing) => missing.as_slice(),
            _ => &[],
        };
        let body = ErrorBody {
            error: self.code(),
            message: self.to_string(),
            changes,
            problems,
            missing,
        };
        let mut response = (self.status(), Json(&body)).into_response();
        match &self {
            ApiError::Unauthorized(access) => {
                let headers = response.headers_mut();
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                // A browser asks for Basic (any user, the token as the
                // password): how an operator opens the failed-list page.
                if *access == access::Access::Operator {
                    headers.append(
                        header::WWW_AUTHENTICATE,
                        header::HeaderValue::from_static(
                            "Basic realm=\"rfidl-registry operator\", charset=\"UTF-8\"",
                        ),
                    );
                }
            }
            ApiError::RateLimited { retry_after, .. } => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from(*retry_after));
            }
            _ => {}
        }
        response
    }
}

impl From<rusqlite::Error> for ApiError {
    fn from(error: rusqlite::Error) -> Self {
        ApiError::Unavailable(error.to_string())
    }
}

/// A registry on one SQLite file. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    conn: Arc<Mutex<Connection>>,
    credentials: access::Credentials,
    networks: access::Networks,
    limiter: Arc<access::RateLimiter>,
    refresh_secs: u64,
    commands: Option<commands::CommandSender>,
    keys: Option<Arc<keys::KeyAuthority>>,
    liveness: liveness::Liveness,
}

pub(crate) struct Shared {
    conn: Arc<Mutex<Connection>>,
    /// Who may do what ([`access`]).
    credentials: access::Credentials,
    /// Where registered base URLs may point (empty: anywhere).
    networks: access::Networks,
    /// Registrations per service.
    limiter: Arc<access::RateLimiter>,
    /// How often the dashboard reloads itself.
    refresh_secs: u64,
    /// Sends lifecycle commands to providers, when configured.
    commands: Option<commands::CommandSender>,
    /// Issues keys at registration, when configured ([`keys`]).
    keys: Option<Arc<keys::KeyAuthority>>,
    /// When an instance that stopped heartbeating is gone.
    pub(crate) liveness: liveness::Liveness,
}

impl Registry {
    /// Opens (creating and migrating if needed) the registry database.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            conn: Arc::new(Mutex::new(store::open(path)?)),
            credentials: access::Credentials::default(),
            networks: access::Networks::default(),
            limiter: Arc::new(access::RateLimiter::new(
                access::DEFAULT_REGISTRATIONS_PER_MINUTE,
            )),
            refresh_secs: 60,
            commands: None,
            keys: None,
            liveness: liveness::Liveness::default(),
        })
    }

    /// An instance that misses this many heartbeats in a row is gone: it
    /// no longer counts as a provider ([`liveness`]); 3 by default, at
    /// least 1.
    #[must_use]
    pub fn missed_heartbeats(mut self, missed: u32) -> Self {
        self.liveness.missed = missed.max(1);
        self
    }

    /// The heartbeat interval of an instance whose registration does not
    /// say its own (`heartbeatMs`); 30 s by default, the runtime's.
    #[must_use]
    pub fn heartbeat_interval(mut self, interval: std::time::Duration) -> Self {
        self.liveness.heartbeat = interval;
        self
    }

    /// Issues keys at registration ([`keys`]): every registration and
    /// heartbeat answer gives the instance its service's signing secrets
    /// and its peers', sealed at rest under `authority`'s key file. Fails
    /// when the database holds keys sealed under another key file.
    pub fn issue_keys(mut self, authority: keys::KeyAuthority) -> Result<Self, keys::KeyError> {
        {
            let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            authority.check(&conn)?;
        }
        self.keys = Some(Arc::new(authority));
        Ok(self)
    }

    /// Sends `Decommission` / `Recommission` commands to the provider
    /// instances of a version through `sender` ([`commands`]). Without it,
    /// a decommission is recorded here only.
    #[must_use]
    pub fn commands(mut self, sender: commands::CommandSender) -> Self {
        self.commands = Some(sender);
        self
    }

    /// Requires `Authorization: Bearer <token>` to publish (reads stay open).
    /// An empty token fails closed: nothing can be published. Any
    /// credential closes the registry: an operation whose own credential is
    /// not configured is then refused ([`access`]).
    #[must_use]
    pub fn publish_token(mut self, token: impl Into<String>) -> Self {
        self.credentials.publish = Some(token.into());
        self
    }

    /// Requires this bearer token to decommission, re-commission, delete an
    /// instance and open an instance's failed list (a browser may send it
    /// as the password of `Basic`). An empty token fails closed.
    #[must_use]
    pub fn operator_token(mut self, token: impl Into<String>) -> Self {
        self.credentials.operator = Some(token.into());
        self
    }

    /// Accepts this bearer token for registrations and heartbeats; call it
    /// once per credential (one per service, or per instance). An instance
    /// is bound to the credential that registered it. An empty token
    /// accepts nothing.
    #[must_use]
    pub fn registration_token(mut self, token: impl Into<String>) -> Self {
        self.credentials.registration.push(token.into());
        self
    }

    /// Accepts registrations only of base URLs inside `network` (call once
    /// per network; none: any address), and the registry's own requests to
    /// instances reach only addresses inside.
    #[must_use]
    pub fn allow_network(mut self, network: access::Network) -> Self {
        let mut networks = self.networks.0.as_ref().clone();
        networks.push(network);
        self.networks = access::Networks(Arc::new(networks));
        self
    }

    /// At most this many registrations of one service per minute (a burst
    /// of as many); [`access::DEFAULT_REGISTRATIONS_PER_MINUTE`] by default.
    /// Beyond: 429 `rate_limited` with `Retry-After`.
    #[must_use]
    pub fn registrations_per_minute(mut self, per_minute: u32) -> Self {
        self.limiter = Arc::new(access::RateLimiter::new(per_minute));
        self
    }

    /// Whether no credential is configured: every operation is open (a
    /// dev registry; the binary serves it on loopback only).
    pub fn is_open(&self) -> bool {
        self.credentials.is_open()
    }

    /// The health interval, so that the dashboard reloads as often as the
    /// data changes (2 to 60 seconds; 60 by default).
    #[must_use]
    pub fn health_interval(mut self, interval: std::time::Duration) -> Self {
        self.refresh_secs = interval.as_secs().clamp(2, 60);
        self
    }

    /// Polls every active registered instance's `/_rf/health` once,
    /// concurrently, and stores the results ([`aggregator`], [`rollup`]) in
    /// one transaction; returns how many it asked. Instances that went
    /// since the last round are logged once ([`liveness`]) and not asked.
    pub async fn poll_health_once(&self, interval: std::time::Duration) -> Result<usize, ApiError> {
        let conn = Arc::clone(&self.conn);
        let liveness = self.liveness;
        let targets = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let at = liveness.at(now_ms());
            liveness::log_departures(&liveness::sweep(&conn, &at)?, &liveness);
            liveness::active_targets(&conn, &at)
        })
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))??;
        let client = access::instance_client(aggregator::timeout_for(interval), &self.networks)?;
        let mut polls = tokio::task::JoinSet::new();
        for target in targets {
            let client = client.clone();
            polls.spawn(async move {
                let check = aggregator::check(&client, &target).await;
                (target, check)
            });
        }
        let mut results = Vec::new();
        while let Some(joined) = polls.join_next().await {
            results.extend(joined.ok());
        }
        let asked = results.len();
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let now = now_ms();
            // One commit for the round: a commit per instance is an fsync
            // per instance.
            let tx = conn.transaction()?;
            for (target, check) in &results {
                // An instance may have been removed meanwhile: skip it.
                match aggregator::record(&tx, &target.instance_id, check, now) {
                    Ok(previous) => rollup::log_change(target, previous.as_deref(), check),
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation => {}
                    Err(other) => return Err(other),
                }
            }
            tx.commit()
        })
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))??;
        Ok(asked)
    }

    /// Runs [`Registry::poll_health_once`] every `interval` until the task
    /// is aborted (a failed round is logged and the next one tried).
    pub fn spawn_health_aggregator(
        &self,
        interval: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let registry = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let Err(error) = registry.poll_health_once(interval).await {
                    tracing::warn!(%error, "health round failed");
                }
            }
        })
    }

    /// The HTTP API.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/health", get(health).fallback(method_not_allowed))
            .route("/livez", get(health).fallback(method_not_allowed))
            .route("/readyz", get(routes::readyz).fallback(method_not_allowed))
            .route("/v1/interfaces", get(list).fallback(method_not_allowed))
            .route(
                "/v1/interfaces/{interface}",
                get(routes::versions).fallback(method_not_allowed),
            )
            .route(
                "/v1/compatibility/interfaces/{interface}/{version}",
                post(routes::compatibility).fallback(method_not_allowed),
            )
            .route(
                "/v1/interfaces/{interface}/{version}",
                get(latest).put(publish).fallback(method_not_allowed),
            )
            .route(
                "/v1/interfaces/{interface}/{version}/{fingerprint}",
                get(exact).fallback(method_not_allowed),
            )
            .route(
                "/v1/services",
                get(directory::serve_services).fallback(method_not_allowed),
            )
            .route(
                "/v1/services/{service}/instances",
                post(directory::serve_register).fallback(method_not_allowed),
            )
            .route(
                "/v1/services/{service}/instances/{instance}",
                delete(directory::serve_deregister).fallback(method_not_allowed),
            )
            .route(
                "/v1/services/{service}/instances/{instance}/heartbeat",
                put(directory::serve_heartbeat).fallback(method_not_allowed),
            )
            .route(
                "/v1/decommissioned",
                get(decommission::serve_list).fallback(method_not_allowed),
            )
            .route(
                "/v1/decommissioned/{interface}/{version}",
                put(decommission::serve_decommission)
                    .delete(decommission::serve_recommission)
                    .fallback(method_not_allowed),
            )
            .route(
                "/v1/deploy-check",
                post(directory::serve_deploy_check).fallback(method_not_allowed),
            )
            .route("/", get(dashboard::serve).fallback(method_not_allowed))
            .route(
                "/instances/{instance}/failed",
                get(dashboard::serve_failed).fallback(method_not_allowed),
            )
            .fallback(not_found)
            .with_state(Arc::new(Shared {
                conn: Arc::clone(&self.conn),
                credentials: self.credentials.clone(),
                networks: self.networks.clone(),
                limiter: Arc::clone(&self.limiter),
                refresh_secs: self.refresh_secs,
                commands: self.commands.clone(),
                keys: self.keys.clone(),
                liveness: self.liveness,
            }))
    }
}

/// Runs `query` on the connection, on the blocking pool.
pub(crate) async fn with_db<T: Send + 'static>(
    shared: &Arc<Shared>,
    query: impl FnOnce(&mut Connection) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || {
        let mut conn = shared
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        query(&mut conn)
    })
    .await
    .map_err(|e| ApiError::Unavailable(e.to_string()))?
}

/// `v2` -> 2.
/// Only the canonical form: `v+2` and `v02` are refused, so one version has
/// one URL.
pub(crate) fn version_of(segment: &str) -> Result<u32, ApiError> {
    segment
        .strip_prefix('v')
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ApiError::BadRequest(format!("`{segment}` is not a version like `v2`")))
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn not_found(OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {}; the API is under /v1/interfaces (docs/registry.md)",
        uri.path()
    ))
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let interfaces = with_db(&shared, |conn| Ok(store::list(conn)?)).await?;
    Ok(conditional::json_response(
        &headers,
        &serde_json::json!({ "interfaces": interfaces }),
    ))
}

/// A manifest with `ETag: "<fingerprint>"`, or 304 if the client has it.
/// An exact revision never changes, so it may be cached for a year; the
/// latest revision must be revalidated.
fn manifest_response(
    headers: &HeaderMap,
    text: String,
    fingerprint: &str,
    immutable: bool,
) -> Response {
    let etag = format!("\"{fingerprint}\"");
    let cache_control = if immutable {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    if conditional::none_match(headers, &etag) {
        return conditional::not_modified(&etag, Some(cache_control));
    }
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, cache_control.to_owned()),
        ],
        text,
    )
        .into_response()
}

async fn latest(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let version = version_of(&version)?;
    let found = with_db(&shared, move |conn| {
        match store::latest(conn, &interface, version)? {
            Some(found) => Ok(found),
            None => Err(routes::missing(conn, &interface, version, None)),
        }
    })
    .await?;
    let (text, fingerprint) = found;
    Ok(manifest_response(&headers, text, &fingerprint, false))
}

async fn exact(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version, fingerprint)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let version = version_of(&version)?;
    let wanted = fingerprint.clone();
    let text = with_db(&shared, move |conn| {
        match store::exact(conn, &interface, version, &wanted)? {
            Some(text) => Ok(text),
            None => Err(routes::missing(conn, &interface, version, Some(&wanted))),
        }
    })
    .await?;
    Ok(manifest_response(&headers, text, &fingerprint, true))
}

async fn publish(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers, access::Access::Publish)?;
    let manifest = verified_manifest(&interface, &version, body).await?;
    let published = with_db(&shared, move |conn| {
        store::publish(conn, &manifest, now_ms()).map_err(|error| match error {
            store::PublishError::Breaking(changes) => ApiError::BreakingChange {
                interface: manifest.interface.clone(),
                version: manifest.version,
                changes,
            },
            store::PublishError::Invalid(problems) => ApiError::ManifestRejected(problems),
            other => ApiError::Unavailable(other.to_string()),
        })
    })
    .await?;
    let status = if published.created {
        tracing::info!(
            interface = %published.interface,
            version = published.version,
            revision = published.revision,
            fingerprint = %published.fingerprint,
            "published"
        );
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(published)).into_response())
}

/// The checks of a publish after the token, in order: body size, a
/// manifest, the one the path names, its fingerprint matches its content,
/// a manifest a contract could produce (`rfidl_contract::validate`). A dry run
/// (`POST /v1/compatibility/…`) makes the same ones. Messages never echo a
/// hostile value in full (serde quotes what it could not read; names can be
/// a megabyte long).
/// Reads a request body of at most `limit` bytes: 413 over it, 408
/// `body_timeout` when it does not arrive within the server's body read
/// timeout (`rfidl_runtime::serve`), 400 when the connection fails.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::PayloadTooLarge)
        }
        Err(error) if rfidl_runtime::serve::is_body_timeout(&*error) => Err(ApiError::BodyTimeout),
        Err(error) => Err(ApiError::BadRequest(format!(
            "cannot read the request body: {error}"
        ))),
    }
}

pub(crate) async fn verified_manifest(
    interface: &str,
    version: &str,
    body: Body,
) -> Result<Manifest, ApiError> {
    let body = read_body(body, BODY_LIMIT).await?;
    let version = version_of(version)?;
    let manifest: Manifest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::InvalidManifest(cut(&e.to_string())))?;
    if manifest.interface != interface || manifest.version != version {
        return Err(ApiError::PathMismatch {
            path: format!("{} v{version}", shown(interface)),
            manifest: format!("{} v{}", shown(&manifest.interface), manifest.version),
        });
    }
    let computed = manifest.compute_fingerprint();
    if manifest.fingerprint != computed {
        return Err(ApiError::FingerprintMismatch {
            stated: shown(&manifest.fingerprint),
            computed,
        });
    }
    manifest.validate().map_err(ApiError::ManifestRejected)?;
    Ok(manifest)
}

/// At most 300 characters of `text`, marked when cut.
fn cut(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}… ({} bytes)", &text[..at], text.len()),
        None => text.to_owned(),
    }
}

/// 401 unless the request carries the credential `access` needs, 403
/// `operation_disabled` when the registry is closed and that credential is
/// not configured ([`access::Credentials::authorize`]).
pub(crate) fn authorize(
    shared: &Shared,
    headers: &HeaderMap,
    access: access::Access,
) -> Result<(), ApiError> {
    shared.credentials.authorize(headers, access)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
