//! The inbox: which messages this receiver has processed, and what it answered.
//!
//! What the inbox remembers of a processed message ([`InboxEntry`]), the
//! payload digest that tells a copy from a reused id, and the committed-row
//! look-up the receiver makes before a message goes to a writer
//! ([`InboxLookup`]). The statements are the stores' (`store::sqlite::inbox`,
//! `store::sqlx_*::inbox`); this module never decides what to answer (the
//! receiver does) and never writes.

use sha2::{Digest, Sha256};

/// SHA-256 of a payload, as stored in `payload_sha256`.
pub type PayloadDigest = [u8; 32];

/// The digest the inbox keeps of a payload: SHA-256 of its compact JSON text.
///
/// Object members are serialised in sorted order (serde_json's default map),
/// so two encodings of the same value, however their members were ordered on
/// the wire, get the same digest.
pub fn payload_digest(payload: &serde_json::Value) -> PayloadDigest {
    let mut hasher = Sha256::new();
    // Writing a `Value` into a hasher cannot fail: no I/O, and every key is a string.
    let _ = serde_json::to_writer(HashWriter(&mut hasher), payload);
    hasher.finalize().into()
}

struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A processed message, as the inbox remembers it.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    /// The method the message called.
    pub endpoint: String,
    /// [`payload_digest`] of the processed payload: a delivery of the same
    /// (source, id) with another digest is refused 422 `message_id_reused`.
    pub payload_sha256: PayloadDigest,
    /// When it was processed (committed), ms since the Unix epoch.
    pub processed_at_ms: i64,
    /// The answer payload given when the message was processed (JSON text).
    pub response: Option<String>,
    /// When the record may be deleted by retention, ms since the Unix epoch
    /// (processed + `inbox.retention`). Until then a copy is answered as a
    /// duplicate.
    pub expires_at_ms: i64,
}

impl InboxEntry {
    /// The cached answer payload as JSON (`null` when none was stored or it
    /// no longer parses).
    pub fn response_value(&self) -> serde_json::Value {
        self.response
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// The row written when a message has been processed.
#[derive(Debug, Clone, Copy)]
///
/// Written in the handler's transaction, so the record commits if and only
/// if the handler's effects do: this is what makes processing exactly-once.
pub struct ProcessedMessage<'a> {
    /// The sending service: with `message_id`, the inbox's primary key.
    pub source_service_id: &'a str,
    /// The message id, lower-case hyphenated UUID text.
    pub message_id: &'a str,
    /// The method the message called.
    pub endpoint: &'a str,
    /// [`payload_digest`] of the payload that was processed.
    pub payload_sha256: &'a PayloadDigest,
    /// The answer payload (JSON text).
    pub response: &'a str,
    /// Commit time, ms since the Unix epoch.
    pub processed_at_ms: i64,
    /// When retention may delete the row, ms since the Unix epoch
    /// (normally `processed_at_ms` + `inbox.retention`).
    pub expires_at_ms: i64,
}

/// An inbox query that failed. The receiver answers the message 503
/// `unavailable` (the sender retries, uncounted); nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// A SQLite inbox query failed (the file is locked past the busy
    /// timeout, unreadable, or gone).
    #[error("inbox database {path}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// A PostgreSQL inbox query failed (the server is unreachable, or the
    /// session broke).
    #[cfg(feature = "sqlx-postgres")]
    #[error("inbox database {target}: {cause}")]
    Postgres {
        /// Host, port and database (never the password).
        target: String,
        /// What the server or the client said.
        cause: String,
    },
    /// A stored row's payload digest is not 32 bytes: the row was written by
    /// something other than rfidl, or damaged. The message is not processed.
    #[error(
        "inbox row for {source_service_id}/{message_id} has a payload digest of {len} bytes, not 32"
    )]
    CorruptDigest {
        /// The sender of the message the row records.
        source_service_id: String,
        /// The message's id.
        message_id: String,
        /// The digest's length found.
        len: usize,
    },
}

/// An inbox row as read, before its digest length is checked.
#[derive(Debug, Clone, PartialEq)]
pub struct RawEntry {
    /// The method the message called.
    pub endpoint: String,
    /// The stored payload digest (32 bytes in a sound row).
    pub payload_sha256: Vec<u8>,
    /// When the message was processed, ms since the Unix epoch.
    pub processed_at_ms: i64,
    /// The answer payload given then (JSON text).
    pub response: Option<String>,
    /// When retention may delete the row, ms since the Unix epoch.
    pub expires_at_ms: i64,
}

impl RawEntry {
    /// Checks the stored digest is 32 bytes.
    pub fn into_entry(
        self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<InboxEntry, InboxError> {
        let len = self.payload_sha256.len();
        let payload_sha256: PayloadDigest =
            self.payload_sha256
                .try_into()
                .map_err(|_| InboxError::CorruptDigest {
                    source_service_id: source_service_id.to_owned(),
                    message_id: message_id.to_owned(),
                    len,
                })?;
        Ok(InboxEntry {
            endpoint: self.endpoint,
            payload_sha256,
            processed_at_ms: self.processed_at_ms,
            response: self.response,
            expires_at_ms: self.expires_at_ms,
        })
    }
}

/// The receiver's look-up of committed inbox rows, before a message goes
/// to a writer (step 7 of the order of checks). Called on the blocking pool.
pub trait InboxLookup: Send + Sync + 'static {
    /// The processed message (`source_service_id`, `message_id`), if any.
    fn lookup(
        &self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError>;
}
