//! [`ApiError`]: every refused request, with its HTTP status, its
//! documented `error` code (`docs/registry.md`) and its JSON body
//! `{"error": code, "message": text}`, plus `changes` (a breaking publish),
//! `problems` (a rejected manifest) or `missing` (unmet dependencies) for
//! the errors that carry them. A 401 names the scheme to use
//! (`WWW-Authenticate`), a 429 when to retry (`Retry-After`).

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rfidl_contract::manifest::compat::BreakingChange;
use rfidl_contract::validate::{InvalidManifest, ManifestProblem};
use serde::Serialize;

use crate::{BODY_LIMIT, access, directory};

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
        /// The service id whose registrations are over the limit.
        service: String,
        /// The limit: registrations of one service per minute.
        per_minute: u32,
        /// Seconds until the next registration is accepted; also the
        /// `Retry-After` header.
        retry_after: u64,
    },
    /// 422 `network_not_allowed`: a registration's base URL is outside the
    /// registry's allowed networks.
    #[error("{0}")]
    NetworkNotAllowed(String),
    /// 413 `payload_too_large`: the body is over its route's limit
    /// ([`BODY_LIMIT`] for a manifest, [`directory::REGISTRATION_LIMIT`],
    /// [`directory::HEARTBEAT_LIMIT`]).
    #[error("the manifest is larger than the {BODY_LIMIT}-byte limit")]
    PayloadTooLarge,
    /// 400 `bad_request`: a path segment or query that is not of its form
    /// (a version like `v2`, a service id, a dashboard page), or a body whose
    /// connection failed.
    #[error("{0}")]
    BadRequest(String),
    /// 408 `body_timeout`: the body did not arrive within the server's body
    /// read timeout.
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    /// 422 `invalid_manifest`: the body does not parse as a manifest (the
    /// parser's message, cut to 300 characters).
    #[error("the body is not a manifest: {0}")]
    InvalidManifest(String),
    /// 422 `path_mismatch`: the manifest is of another interface version
    /// than the publish path names.
    #[error("the path names {path}, the manifest is {manifest}")]
    PathMismatch {
        /// `interface vN` as the path names it.
        path: String,
        /// `interface vN` as the manifest says.
        manifest: String,
    },
    /// 422 `fingerprint_mismatch`: the manifest's `fingerprint` is not the
    /// one its content hashes to.
    #[error("the manifest says {stated}, its content has {computed}")]
    FingerprintMismatch {
        /// The fingerprint the manifest states (shortened if hostile).
        stated: String,
        /// `sha256:…` computed from the manifest's content.
        computed: String,
    },
    /// 422 `manifest_rejected`: no contract could produce the manifest;
    /// its `M0001`… problems go in the body's `problems`.
    #[error("no contract could produce this manifest: {0}")]
    ManifestRejected(InvalidManifest),
    /// 409 `breaking_change`: the manifest is not a compatible next
    /// revision of the latest published one; the changes go in the body's
    /// `changes`.
    #[error("{interface} v{version}: {} change(s) break the published revision", changes.len())]
    BreakingChange {
        /// The interface, `package.Service`.
        interface: String,
        /// The interface version whose latest revision it breaks.
        version: u32,
        /// Each breaking change with its `B0001`… code.
        changes: Vec<BreakingChange>,
    },
    /// 404 `not_found`: no such route, interface, version or revision. The
    /// message names what is missing (and a close name, if any).
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`: the path exists, the method does not.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
    },
    /// 503 `unavailable`: the database, the command outbox or rendering a
    /// page failed; the request may be repeated.
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
    /// 403 `csrf_mismatch`: a dashboard form without its session's form
    /// token (`session`).
    #[error("{0}")]
    CsrfMismatch(String),
    /// 502 `instance_unreachable`: the instance did not answer what the
    /// registry asked it on the operator's behalf (its failed list).
    #[error("the instance did not answer: {0}")]
    InstanceUnreachable(String),
}

impl ApiError {
    /// The HTTP status of the answer (each variant's doc names it).
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::OperationDisabled(_)
            | ApiError::InstanceOwned(_)
            | ApiError::KeysOwned(_)
            | ApiError::CsrfMismatch(_) => StatusCode::FORBIDDEN,
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
            ApiError::CsrfMismatch(_) => "csrf_mismatch",
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
