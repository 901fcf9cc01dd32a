//! What the receiver answers: one [`Reply`] per message, rendered either as
//! an HTTP response (single endpoint) or as a [`BatchResult`] (batch endpoint).
//!
//! Every refusal is a [`ReceiveError`] with a fixed status and wire code
//! (`wire-protocol.md`, order of checks); its body is always
//! `{"error": code, "message": text}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::envelope::{Acknowledgement, BatchResult, ErrorBody};
use crate::signing::VerifyError;

/// The code of [`ReceiveError::KeysPending`].
pub const KEYS_PENDING: &str = "keys_pending";

/// Why a delivery was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    #[error("request body is larger than the {limit}-byte limit")]
    PayloadTooLarge { limit: usize },
    #[error("malformed envelope: {0}")]
    MalformedEnvelope(String),
    #[error("the request body did not arrive within {seconds} s")]
    BodyTimeout { seconds: u64 },
    #[error("no secret is configured for source service `{0}`")]
    UnknownSource(String),
    /// Keys are issued by the registry and none is held for this source
    /// yet (a peer that registered after the last renewal): the receiver
    /// asked for its keys; retry shortly (503, not counted by senders).
    #[error(
        "no key issued for source service `{0}` yet; this receiver asked the registry for its \
         keys, retry shortly"
    )]
    KeysPending(String),
    #[error("{0}")]
    Signature(VerifyError),
    #[error("webhook-id `{header}` differs from the envelope's messageId `{body}`")]
    IdMismatch { header: String, body: String },
    #[error("interface `{0}` is not hosted here")]
    UnknownInterface(String),
    #[error("interface `{interface}` is hosted, but not version {version} (hosted: {hosted})")]
    UnknownVersion {
        interface: String,
        version: u32,
        hosted: String,
    },
    #[error("interface `{interface}` v{version} has no endpoint `{endpoint}`")]
    UnknownEndpoint {
        interface: String,
        version: u32,
        endpoint: String,
    },
    #[error(
        "message `{message_id}` from `{source_service_id}` was processed before with a different payload"
    )]
    MessageIdReused {
        source_service_id: String,
        message_id: String,
    },
    #[error(
        "message `{message_id}` was created {age_secs} s ago, beyond this receiver's dedup horizon \
         of {horizon_secs} s, and no record of it is kept: it may have been processed before, so it \
         is not processed now (an operator decides)"
    )]
    BeyondDedupHorizon {
        message_id: String,
        age_secs: u64,
        horizon_secs: u64,
    },
    #[error(
        "interface `{interface}` v{version} is decommissioned on this service; \
         it is answered again once the registry re-commissions it"
    )]
    VersionDecommissioned { interface: String, version: u32 },
    #[error("{0}")]
    PayloadMismatch(String),
    #[error("{0}")]
    Poison(String),
    /// A handler's refusal with a code of its own
    /// ([`HandlerError::Refused`](super::HandlerError::Refused)).
    #[error("{message}")]
    Refused { code: &'static str, message: String },
    #[error("{0}")]
    HandlerFailed(String),
    #[error("a copy of this message is still being processed; retry later")]
    InProgress,
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("the receiver is shutting down")]
    ShuttingDown,
    #[error("no route for {0}")]
    NotFound(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
}

impl ReceiveError {
    /// The HTTP status of this refusal.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MalformedEnvelope(_) | Self::IdMismatch { .. } => StatusCode::BAD_REQUEST,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::UnknownSource(_) | Self::Signature(_) => StatusCode::UNAUTHORIZED,
            Self::UnknownInterface(_)
            | Self::UnknownVersion { .. }
            | Self::UnknownEndpoint { .. }
            | Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MessageIdReused { .. }
            | Self::BeyondDedupHorizon { .. }
            | Self::PayloadMismatch(_)
            | Self::Poison(_)
            | Self::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::VersionDecommissioned { .. } => StatusCode::GONE,
            Self::HandlerFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::InProgress | Self::Unavailable(_) | Self::ShuttingDown | Self::KeysPending(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The wire error code (`error` member of the body).
    pub fn code(&self) -> &'static str {
        match self {
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::MalformedEnvelope(_) => "malformed_envelope",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::UnknownSource(_) => "unknown_source",
            Self::KeysPending(_) => KEYS_PENDING,
            Self::Signature(e) => e.code(),
            Self::IdMismatch { .. } => "id_mismatch",
            Self::UnknownInterface(_) => "unknown_interface",
            Self::UnknownVersion { .. } => "unknown_version",
            Self::UnknownEndpoint { .. } => "unknown_endpoint",
            Self::MessageIdReused { .. } => "message_id_reused",
            Self::BeyondDedupHorizon { .. } => super::BEYOND_DEDUP_HORIZON,
            Self::VersionDecommissioned { .. } => super::VERSION_DECOMMISSIONED,
            Self::PayloadMismatch(_) => "payload_mismatch",
            Self::Poison(_) => "poison",
            Self::Refused { code, .. } => code,
            Self::HandlerFailed(_) => "handler_failed",
            Self::InProgress => "in_progress",
            Self::Unavailable(_) => "storage_unavailable",
            Self::ShuttingDown => "shutting_down",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
        }
    }

    /// `Retry-After` seconds for the refusals that ask for a later retry.
    pub fn retry_after_secs(&self) -> Option<u32> {
        match self {
            Self::InProgress | Self::Unavailable(_) | Self::ShuttingDown | Self::KeysPending(_) => {
                Some(1)
            }
            Self::VersionDecommissioned { .. } => Some(super::DECOMMISSIONED_RETRY_AFTER_SECS),
            _ => None,
        }
    }

    /// The JSON error body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
        }
    }
}

impl IntoResponse for ReceiveError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The outcome of one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// 200: processed now (`duplicate: false`) or before (`duplicate: true`).
    Acknowledged {
        duplicate: bool,
        payload: serde_json::Value,
    },
    Refused(ReceiveError),
}

impl Reply {
    pub fn status(&self) -> StatusCode {
        match self {
            Reply::Acknowledged { .. } => StatusCode::OK,
            Reply::Refused(error) => error.status(),
        }
    }

    /// This answer as one entry of a batch's result array.
    pub fn into_batch_result(self) -> BatchResult {
        let status = self.status().as_u16();
        let body = match self {
            Reply::Acknowledged { duplicate, payload } => serde_json::to_value(Acknowledgement {
                acknowledged: true,
                duplicate,
                payload,
            }),
            Reply::Refused(error) => serde_json::to_value(error.body()),
        };
        BatchResult {
            status,
            body: body.unwrap_or(serde_json::Value::Null),
        }
    }
}

impl From<ReceiveError> for Reply {
    fn from(error: ReceiveError) -> Self {
        Reply::Refused(error)
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Acknowledged { duplicate, payload } => axum::Json(Acknowledgement {
                acknowledged: true,
                duplicate,
                payload,
            })
            .into_response(),
            Reply::Refused(error) => error.into_response(),
        }
    }
}
