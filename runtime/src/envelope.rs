//! The wire envelope and the receiver's answers (see `wire-protocol.md`).
//!
//! This module only describes shapes; it does no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The kind of a message, as carried in `messageType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MessageType {
    Signal,
    Command,
    PushCall,
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
    pub message_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    pub source_service_id: String,
    pub message_type: MessageType,
    /// `package.Service`, e.g. `hr.employees.EmpService`.
    pub interface: String,
    pub version: u32,
    /// `sha256:<hex>` of the sender's manifest for this interface version.
    pub fingerprint: String,
    pub endpoint: String,
    /// One member per method parameter.
    pub payload: serde_json::Value,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// When the message entered the sender's outbox (RFC 3339, UTC); the
    /// same on every retry. A receiver refuses a message it has no inbox
    /// record of that is older than its dedup horizon (`inbox.retention`):
    /// 422 `beyond_dedup_horizon`. Optional for senders outside rfidl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<jiff::Timestamp>,
}

/// A 200 answer: processed now, or processed before (`duplicate`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Acknowledgement {
    pub acknowledged: bool,
    pub duplicate: bool,
    #[serde(default)]
    pub payload: serde_json::Value,
}

/// Every error answer's body: `{"error": code, "message": text}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

/// One item of `POST {base}/_rf/receive/batch`: the envelope as raw JSON text
/// (signatures cover exact bytes) with its own Standard Webhooks headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
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
