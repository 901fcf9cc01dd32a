//! The registry's HTTP answers that its server (`rfidl-registry`) writes
//! and its client (`rfidl-codegen`'s `registry` module) reads: one
//! definition, so the two cannot drift. Plain serde types, no behaviour.

use serde::{Deserialize, Serialize};

/// What a publish did: the registry's answer to `PUT /v1/interfaces/…`
/// (the server answers with this type, the client reads it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// The interface published, `package.Service`.
    pub interface: String,
    /// Its version, the `N` of `vN`.
    pub version: u32,
    /// The fingerprint of the manifest stored (`sha256:<hex>`), which
    /// identifies the revision.
    pub fingerprint: String,
    /// The revision number of that manifest within the version, from 1: each
    /// compatible change published to a version is a new revision.
    pub revision: u32,
    /// False when this exact fingerprint was published before (nothing written).
    pub created: bool,
}

/// One published version of an interface with its revisions, oldest first
/// (an entry of the registry's `GET /v1/interfaces/{interface}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedVersion {
    /// The `N` of `vN`.
    pub version: u32,
    /// Every revision stored for this version, oldest (revision 1) first;
    /// the last is the one a fetch without a fingerprint gets.
    pub revisions: Vec<PublishedRevision>,
}

/// One published revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedRevision {
    /// The revision number within its version, from 1.
    pub revision: u32,
    /// The fingerprint of the manifest stored as this revision
    /// (`sha256:<hex>`).
    pub fingerprint: String,
    /// RFC 3339, as the registry says it.
    pub published_at: String,
}
