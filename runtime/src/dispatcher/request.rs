//! A claimed row made into the signed request that carries it: the envelope
//! built from the row's stored JSON as it is (not parsed and printed
//! again), then signed with the destination's secrets.

use serde_json::value::RawValue;

use super::{Claimed, State};
use crate::envelope::{MessageType, StoredEnvelope};
use crate::signing::{self, Secret, SignatureHeaders};
use crate::transport::OutgoingRequest;

/// The signed single-message request for a claimed row. Its payload and
/// headers go into the body as the row stores them ([`StoredEnvelope`]).
pub(super) fn signed_request(
    state: &State,
    secrets: &[Secret],
    row: &Claimed,
) -> Result<OutgoingRequest, RequestError> {
    let message_id: uuid::Uuid = row
        .message_id
        .parse()
        .map_err(|_| RequestError::MessageId(row.message_id.clone()))?;
    let envelope = StoredEnvelope {
        message_id: &message_id,
        correlation_id: row.correlation_id.as_deref(),
        source_service_id: &state.config.service_id,
        message_type: MessageType::parse(&row.message_type).unwrap_or(MessageType::Signal),
        interface: &row.interface,
        version: row.version,
        fingerprint: &row.fingerprint,
        endpoint: &row.endpoint,
        payload: stored_json("payload", &row.payload)?,
        headers: stored_json("headers", &row.headers)?,
        created_at: jiff::Timestamp::from_millisecond(row.created_at_ms).ok(),
    };
    let body = serde_json::to_vec(&envelope).map_err(RequestError::Encode)?;
    let signature = SignatureHeaders::sign(&row.message_id, signing::unix_now(), &body, secrets);
    Ok(OutgoingRequest {
        path: crate::receiver::RECEIVE_PATH,
        headers: signature.to_pairs().to_vec(),
        body,
    })
}

/// A row's JSON column, checked (a row the outbox wrote always is JSON) but
/// not parsed into a value.
fn stored_json<'r>(column: &'static str, text: &'r str) -> Result<&'r RawValue, RequestError> {
    serde_json::from_str(text).map_err(|source| RequestError::NotJson { column, source })
}

/// Why a claimed row could not be made into a request (it goes into the
/// row's `last_error`; the row is retried).
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    #[error("stored message id `{0}` is not a UUID")]
    MessageId(String),
    #[error("stored {column} is not JSON: {source}")]
    NotJson {
        column: &'static str,
        source: serde_json::Error,
    },
    #[error("cannot encode: {0}")]
    Encode(serde_json::Error),
}
