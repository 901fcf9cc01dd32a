//! The contract between the receiver and the code that handles messages:
//! generated receivers implement [`HostedService`] with a static `match` on
//! endpoint names and call the user's handler trait.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// One interface version a [`HostedService`] answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostedInterface {
    /// `package.Service`.
    pub interface: &'static str,
    pub version: u32,
    /// The fingerprint of the manifest the code was generated from.
    pub fingerprint: &'static str,
    /// The endpoints (method names) this service handles for that version.
    pub endpoints: &'static [&'static str],
    /// The canonical manifest, served at `GET /_rf/metadata`.
    pub manifest_json: &'static str,
}

/// A delivery, as a handler sees it. The signature was verified and the
/// message was not processed before.
#[derive(Debug, Clone, Copy)]
pub struct IncomingCall<'a> {
    pub source: &'a str,
    pub message_id: &'a str,
    pub correlation_id: Option<&'a str>,
    pub interface: &'a str,
    pub version: u32,
    pub endpoint: &'a str,
    pub payload: &'a serde_json::Value,
}

/// Why a handler did not produce a response. Its transaction (savepoint) is
/// rolled back in every case, so nothing of the attempt persists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// The payload does not decode into the method's parameters: 422
    /// `payload_mismatch`; the sender dead-letters it.
    #[error("payload does not fit the contract: {0}")]
    PayloadMismatch(String),
    /// The message can never succeed (the handler says so): 422 `poison`.
    #[error("message refused as poison: {0}")]
    Poison(String),
    /// A failure worth retrying (a dependency is down, a lock timed out):
    /// 500 `handler_failed`; the sender retries with backoff.
    #[error("handler failed: {0}")]
    Retryable(String),
    /// No such endpoint in this interface version: 404 `unknown_endpoint`.
    #[error("unknown endpoint `{0}`")]
    UnknownEndpoint(String),
}

impl HandlerError {
    pub fn retryable(message: impl std::fmt::Display) -> Self {
        HandlerError::Retryable(message.to_string())
    }
    pub fn poison(message: impl std::fmt::Display) -> Self {
        HandlerError::Poison(message.to_string())
    }
    pub fn unknown_endpoint(endpoint: &str) -> Self {
        HandlerError::UnknownEndpoint(endpoint.to_owned())
    }
}

/// A database error inside a handler is worth retrying (busy, locked, I/O).
impl From<rusqlite::Error> for HandlerError {
    fn from(error: rusqlite::Error) -> Self {
        HandlerError::Retryable(format!("database: {error}"))
    }
}

/// A handler that enqueues follow-up messages can `?` outbox errors.
impl From<crate::outbox::OutboxError> for HandlerError {
    fn from(error: crate::outbox::OutboxError) -> Self {
        HandlerError::Retryable(format!("outbox: {error}"))
    }
}

/// Code that handles the messages of one or more interface versions.
///
/// `handle` runs on the receiver's database thread, inside the transaction
/// that also records the message in the inbox (one savepoint per message):
/// write effects through `tx` and they commit exactly once, with that record.
/// It must not block on the network; to call another service, enqueue
/// through the outbox in the same `tx`.
pub trait HostedService: Send + Sync + 'static {
    /// The interface versions and endpoints handled.
    fn interfaces(&self) -> &[HostedInterface];

    /// Handles one message; returns the response payload (`null` for none).
    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError>;
}

/// Decodes a payload into a method's request type; a mismatch is
/// [`HandlerError::PayloadMismatch`] (unknown members are ignored).
pub fn decode_payload<T: DeserializeOwned>(payload: &serde_json::Value) -> Result<T, HandlerError> {
    T::deserialize(payload).map_err(|e| HandlerError::PayloadMismatch(e.to_string()))
}

/// Encodes a handler's response.
pub fn encode_response<T: Serialize>(response: &T) -> Result<serde_json::Value, HandlerError> {
    serde_json::to_value(response)
        .map_err(|e| HandlerError::Retryable(format!("cannot encode the response: {e}")))
}
