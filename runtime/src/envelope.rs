//! The wire envelope and the receiver's answers (see `wire-protocol.md`).
//!
//! This module only describes shapes; it does no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The kind of a message, as carried in `messageType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MessageType {
    /// A `signal` method: service to engine, "something happened". It
    /// declares no response.
    Signal,
    /// A `command` method: engine to service, "do this"; a declared
    /// response is stored in the sender's outbox row and handed to its
    /// [`ResponseHandler`](crate::responses::ResponseHandler).
    Command,
    /// A `pushcall` method: service to engine, a call the engine records
    /// and matches to what it waits for; optionally answered like a command.
    PushCall,
    /// Reserved by the wire protocol for an answer sent as a message of its
    /// own; no contract method has this kind and generated code never sends
    /// it.
    Response,
}

impl MessageType {
    /// The wire and database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageType::Signal => "Signal",
            MessageType::Command => "Command",
            MessageType::PushCall => "PushCall",
            MessageType::Response => "Response",
        }
    }

    /// Inverse of [`MessageType::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "Signal" => Some(MessageType::Signal),
            "Command" => Some(MessageType::Command),
            "PushCall" => Some(MessageType::PushCall),
            "Response" => Some(MessageType::Response),
            _ => None,
        }
    }
}

/// `POST {base}/_rf/receive` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// `messageId`: a UUID v7 set when the message entered the outbox, the
    /// same on every retry. With `sourceServiceId`, the receiver's inbox
    /// key; it must equal the signed `webhook-id` header.
    pub message_id: Uuid,
    /// `correlationId`: the method's `@correlate` key, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// `sourceServiceId`: the sending service. Chooses the secrets the
    /// signature is checked against; authenticated once that succeeds.
    pub source_service_id: String,
    /// `messageType`: the kind of method.
    pub message_type: MessageType,
    /// `package.Service`, e.g. `hr.employees.EmpService`.
    pub interface: String,
    /// `version`: the contract's service version; routed with `interface`.
    pub version: u32,
    /// `sha256:<hex>` of the sender's manifest for this interface version.
    pub fingerprint: String,
    /// `endpoint`: the method name.
    pub endpoint: String,
    /// One member per method parameter.
    pub payload: serde_json::Value,
    /// `headers`: free-form string pairs; rfidl senders always set a W3C
    /// `traceparent` ([`crate::trace`]). Optional on the wire: missing
    /// reads as empty.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// When the message entered the sender's outbox (RFC 3339, UTC); the
    /// same on every retry. A receiver refuses a message it has no inbox
    /// record of that is older than its dedup horizon (`inbox.retention`):
    /// 422 `beyond_dedup_horizon`. Optional for senders outside rfidl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<jiff::Timestamp>,
}

/// An [`Envelope`] written from a stored outbox row: the same JSON (same
/// members, same order), with `payload` and `headers` copied as the JSON
/// text the row holds instead of parsed into values and printed again. The
/// dispatcher builds every request body this way (BENCHMARKS.md has what it
/// saves); `stored_envelope_is_the_envelope`
/// pins it to [`Envelope`]'s serialisation.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoredEnvelope<'a> {
    pub message_id: &'a Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<&'a str>,
    pub source_service_id: &'a str,
    pub message_type: MessageType,
    pub interface: &'a str,
    pub version: u32,
    pub fingerprint: &'a str,
    pub endpoint: &'a str,
    pub payload: &'a serde_json::value::RawValue,
    pub headers: &'a serde_json::value::RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<jiff::Timestamp>,
}

/// A 200 answer: processed now, or processed before (`duplicate`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Acknowledgement {
    /// Always `true` from an rfidl receiver. A 2xx without it is not an
    /// acknowledgement: the sender retries (counted).
    pub acknowledged: bool,
    /// `true` when the message had been processed before (the inbox held
    /// it with the same payload) and the handler did not run again.
    pub duplicate: bool,
    /// The handler's answer payload (the method's response, or `null`);
    /// for a duplicate, the one stored when it was first processed.
    #[serde(default)]
    pub payload: serde_json::Value,
}

/// Every error answer's body: `{"error": code, "message": text}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The stable wire code, e.g. `payload_mismatch`; what senders decide
    /// on (`docs/wire-protocol.md` lists them).
    pub error: String,
    /// Text for people: names fields and types, never payload values. Not
    /// stable; do not match on it.
    pub message: String,
}

/// One item of `POST {base}/_rf/receive/batch`: the envelope as raw JSON text
/// (signatures cover exact bytes) with its own Standard Webhooks headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    /// The item's own `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature` (the batch request's headers are not used).
    pub headers: BTreeMap<String, String>,
    /// The envelope's JSON text, exactly as signed.
    pub body: String,
}

/// One per-message result of a batch, in request order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResult {
    /// The HTTP status this message would have got on the single endpoint.
    pub status: u16,
    /// The [`Acknowledgement`] or [`ErrorBody`] it would have got.
    pub body: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_envelope_is_the_envelope() {
        let payload = serde_json::json!({
            "amount": 12.5,
            "name": "Zoë \"Z\" <z@example.com>",
            "nested": {"b": [1, 2, {"c": null}], "a": true},
        });
        let headers: BTreeMap<String, String> = [
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("x-tenant", "acme"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (correlation_id, created_at) in [
            (
                Some("order-1"),
                Some(jiff::Timestamp::from_millisecond(1_700_000_000_123).expect("time")),
            ),
            (None, None),
        ] {
            let envelope = Envelope {
                message_id: Uuid::now_v7(),
                correlation_id: correlation_id.map(str::to_owned),
                source_service_id: "hiring".to_owned(),
                message_type: MessageType::PushCall,
                interface: "hr.employees.EmpService".to_owned(),
                version: 2,
                fingerprint: "sha256:ab".to_owned(),
                endpoint: "Hire".to_owned(),
                payload: payload.clone(),
                headers: headers.clone(),
                created_at,
            };
            // As the outbox stores them.
            let payload_text = serde_json::to_string(&envelope.payload).expect("payload");
            let headers_text = serde_json::to_string(&envelope.headers).expect("headers");
            let stored = StoredEnvelope {
                message_id: &envelope.message_id,
                correlation_id: envelope.correlation_id.as_deref(),
                source_service_id: &envelope.source_service_id,
                message_type: envelope.message_type,
                interface: &envelope.interface,
                version: envelope.version,
                fingerprint: &envelope.fingerprint,
                endpoint: &envelope.endpoint,
                payload: serde_json::from_str(&payload_text).expect("raw payload"),
                headers: serde_json::from_str(&headers_text).expect("raw headers"),
                created_at: envelope.created_at,
            };
            assert_eq!(
                serde_json::to_string(&stored).expect("stored"),
                serde_json::to_string(&envelope).expect("envelope")
            );
        }
    }
}
