//! The registry's HTTP answers that its server (`rfidl-registry`) writes
//! and its client (`rfidl-codegen`'s `registry` module) reads: one
//! definition, so the two cannot drift. Plain serde types, no behaviour.

use serde::{Deserialize, Serialize};

/// What a publish did: the registry's answer to `PUT /v1/interfaces/…`
/// (the server answers with this type, the client reads it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub interface: String,
    pub version: u32,
    pub fingerprint: String,
    pub revision: u32,
    /// False when this exact fingerprint was published before (nothing written).
    pub created: bool,
}

/// One published version of an interface with its revisions, oldest first
/// (an entry of the registry's `GET /v1/interfaces/{interface}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedVersion {
    pub version: u32,
    pub revisions: Vec<PublishedRevision>,
}

/// One published revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedRevision {
    pub revision: u32,
    pub fingerprint: String,
    /// RFC 3339, as the registry says it.
    pub published_at: String,
}
