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
///
/// Each variant has a fixed HTTP [`status`](Self::status), wire
/// [`code`](Self::code) and, for the "retry later" ones,
/// [`retry_after_secs`](Self::retry_after_secs). The variants are listed
/// roughly in the receiver's order of checks (`docs/wire-protocol.md`).
/// A refusal means nothing of the delivery was written: no inbox row, no
/// handler effect. What an rfidl sender's dispatcher does with each is
/// said per variant ("the sender"; `docs/wire-protocol.md`, "What the
/// sender does with an answer"). Messages name fields and types, never
/// payload values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// 413 `payload_too_large`: the body (or one batch item) is larger than
    /// `inbox.body_limit`, or a batch body larger than the batch limit. It is
    /// refused before it is parsed. The sender dead-letters the message: it
    /// will never fit; raise the receiver's limit or send smaller payloads.
    #[error("request body is larger than the {limit}-byte limit")]
    PayloadTooLarge {
        /// The limit that was exceeded, in bytes.
        limit: usize,
    },
    /// 400 `malformed_envelope`: the body is not JSON, not an object, has no
    /// string `sourceServiceId`, an envelope field is missing or of the
    /// wrong type, or `payload` is not an object. The text says which
    /// (field names and JSON kinds only). The sender dead-letters it: a
    /// sender bug, not a transient failure.
    #[error("malformed envelope: {0}")]
    MalformedEnvelope(String),
    /// 408 `body_timeout`: the body did not arrive whole within
    /// [`BODY_READ_TIMEOUT`](super::BODY_READ_TIMEOUT) of the headers; the
    /// connection is closed. The sender retries it (counted): usually a slow
    /// or stalled network.
    #[error("the request body did not arrive within {seconds} s")]
    BodyTimeout {
        /// The deadline that passed, in seconds.
        seconds: u64,
    },
    /// 401 `unknown_source`: no secret is configured for this
    /// `sourceServiceId` (the variant's value), and no issued keys are in
    /// use. The sender retries it (counted), then dead-letters it: add the
    /// peer's secret to `peers` in the receiver's configuration.
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
    /// 401 with the [`VerifyError`]'s own code (`missing_header`,
    /// `bad_signature`, `too_many_signatures`, `timestamp_out_of_range`):
    /// the Standard Webhooks signature did not verify against any of the
    /// source's secrets. The sender retries it (counted, so a rotating
    /// secret can catch up), then dead-letters it; a timestamp out of range
    /// is retried uncounted as a clock problem.
    #[error("{0}")]
    Signature(VerifyError),
    /// 400 `id_mismatch`: the signed `webhook-id` header is not the
    /// envelope's `messageId`, so the inbox key would not be the signed one.
    /// The sender dead-letters it: a sender bug.
    #[error("webhook-id `{header}` differs from the envelope's messageId `{body}`")]
    IdMismatch {
        /// The `webhook-id` header, as received.
        header: String,
        /// The envelope's `messageId` text, as received.
        body: String,
    },
    /// 404 `unknown_interface`: no hosted service serves this interface
    /// (`package.Service`, the variant's value). The sender dead-letters it: the
    /// destination points at the wrong service, or the receiver is not
    /// deployed with it.
    #[error("interface `{0}` is not hosted here")]
    UnknownInterface(String),
    /// 404 `unknown_version`: the interface is hosted, but not in this
    /// version. The sender dead-letters it; deploy the version, or move the
    /// client to a hosted one.
    #[error("interface `{interface}` is hosted, but not version {version} (hosted: {hosted})")]
    UnknownVersion {
        /// The envelope's interface, `package.Service`.
        interface: String,
        /// The version asked for.
        version: u32,
        /// The versions hosted here, e.g. `v1, v2`.
        hosted: String,
    },
    /// 404 `unknown_endpoint`: the version is hosted but has no such method,
    /// or the hosted service's `handle` does not route one it listed
    /// ([`HandlerError::UnknownEndpoint`](super::HandlerError::UnknownEndpoint)).
    /// The sender dead-letters it.
    #[error("interface `{interface}` v{version} has no endpoint `{endpoint}`")]
    UnknownEndpoint {
        /// The envelope's interface, `package.Service`.
        interface: String,
        /// The envelope's version.
        version: u32,
        /// The method name that is not routed.
        endpoint: String,
    },
    /// 422 `message_id_reused`: the inbox holds this (source, message id)
    /// with a different payload digest (SHA-256), so this is not a copy of
    /// the processed message but another message with a reused id. Nothing
    /// runs; the sender dead-letters it. A sender bug (ids must be unique
    /// per source; rfidl's outbox uses UUID v7).
    #[error(
        "message `{message_id}` from `{source_service_id}` was processed before with a different payload"
    )]
    MessageIdReused {
        /// The sending service, the first half of the inbox key.
        source_service_id: String,
        /// The reused message id, the second half of the inbox key.
        message_id: String,
    },
    /// 422 `beyond_dedup_horizon`: the inbox has no record of the message
    /// and its `createdAt` is older than the dedup horizon, so it may have
    /// been processed and its record already expired. It is not processed
    /// (that could run it twice); the sender marks it `Failed`, and an
    /// operator decides whether to retry it by hand.
    #[error(
        "message `{message_id}` was created {age_secs} s ago, beyond this receiver's dedup horizon \
         of {horizon_secs} s, and no record of it is kept: it may have been processed before, so it \
         is not processed now (an operator decides)"
    )]
    BeyondDedupHorizon {
        /// The message refused.
        message_id: String,
        /// Its age (now less the envelope's `createdAt`), in seconds.
        age_secs: u64,
        /// The receiver's dedup horizon (`inbox.retention` less
        /// `inbox.signature_tolerance`), in seconds.
        horizon_secs: u64,
    },
    /// 410 `version_decommissioned` with `Retry-After:`
    /// [`DECOMMISSIONED_RETRY_AFTER_SECS`](super::DECOMMISSIONED_RETRY_AFTER_SECS):
    /// the registry decommissioned this hosted version here
    /// ([`crate::lifecycle`]). Checked after routing, before the inbox. The
    /// sender holds the message, uncounted, until the version is
    /// re-commissioned or the message's TTL passes (`Expired`).
    #[error(
        "interface `{interface}` v{version} is decommissioned on this service; \
         it is answered again once the registry re-commissions it"
    )]
    VersionDecommissioned {
        /// The decommissioned interface, `package.Service`.
        interface: String,
        /// The decommissioned version.
        version: u32,
    },
    /// 422 `payload_mismatch`: the payload does not decode into the
    /// method's parameters ([`HandlerError::PayloadMismatch`](super::HandlerError::PayloadMismatch));
    /// the text names the interface, version, endpoint and the field. The
    /// handler's transaction is rolled back; the sender dead-letters it.
    #[error("{0}")]
    PayloadMismatch(String),
    /// 422 `poison`: the handler refused the message for good
    /// ([`HandlerError::Poison`](super::HandlerError::Poison)), with its
    /// text. Rolled back; the sender dead-letters it.
    #[error("{0}")]
    Poison(String),
    /// A handler's refusal with a code of its own
    /// ([`HandlerError::Refused`](super::HandlerError::Refused)).
    /// 422 with the handler's `code`; rolled back, and the sender
    /// dead-letters it.
    #[error("{message}")]
    Refused {
        /// The wire code, chosen by the handler (not one of the protocol's).
        code: &'static str,
        /// The handler's text, sent as the body's `message`.
        message: String,
    },
    /// 500 `handler_failed`: the handler returned
    /// [`HandlerError::Retryable`](super::HandlerError::Retryable) or
    /// panicked (the text says which). Its transaction is rolled back, so no
    /// inbox row exists; the sender retries with backoff (counted) and marks
    /// the message `Failed` after `max_retries`.
    #[error("{0}")]
    HandlerFailed(String),
    /// 503 `in_progress`, `Retry-After: 1`: a copy of this message is being
    /// processed right now (here or on another replica of the database), or
    /// the writer did not answer this delivery within
    /// `inbox.in_progress_wait` (it may still commit it). Never 409: the
    /// processing may still roll back. The sender retries uncounted and
    /// then gets the duplicate answer (or, after a rollback, processes it).
    #[error("a copy of this message is still being processed; retry later")]
    InProgress,
    /// 503 `storage_unavailable`, `Retry-After: 1`: the inbox database is
    /// locked, full or failing, or the writer could not take the message;
    /// anything done is rolled back. The sender treats it as a destination
    /// outage (uncounted, feeds the circuit breaker); operators look at
    /// `/_rf/health` and the database.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// 503 `shutting_down`, `Retry-After: 1`: the receiver is stopping and
    /// takes no new message. A destination-level outage for the sender
    /// (uncounted); another replica or the restarted one takes it.
    #[error("the receiver is shutting down")]
    ShuttingDown,
    /// 404 `not_found`: a path under `/_rf/` the receiver does not serve
    /// (the variant's value). The sender dead-letters it: its base URL is wrong.
    #[error("no route for {0}")]
    NotFound(String),
    /// 405 `method_not_allowed`: a receiver path with another method than
    /// the one it serves (`POST` for the receive endpoints).
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
    },
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
    /// Only answered once the handler's transaction and its inbox row are
    /// committed (durably, unless `durability` says otherwise).
    Acknowledged {
        /// `true` when the inbox already held the message with the same
        /// payload and the handler did not run again.
        duplicate: bool,
        /// The handler's answer payload (the method's response, or `null`);
        /// for a duplicate, the one stored in the inbox row.
        payload: serde_json::Value,
    },
    /// Not acknowledged; nothing of the delivery was written.
    Refused(ReceiveError),
}

impl Reply {
    /// The HTTP status: 200 when acknowledged, else the refusal's
    /// [`ReceiveError::status`]. A batch item carries the same status.
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
