//! Inbox queries: the record of every processed message, keyed on
//! (`source_service_id`, `message_id`), with the SHA-256 of its payload and
//! the cached response.
//!
//! Reads here are for the fast duplicate check outside the writer; the
//! authoritative check happens again inside the writer's transaction.

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

/// What the inbox knows about one message.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxRecord {
    pub payload_sha256: [u8; 32],
    pub response: serde_json::Value,
}

/// SHA-256 of a payload's canonical JSON text (serde_json's map order is
/// sorted, so equal payloads hash equal whatever their member order).
pub fn payload_digest(payload: &serde_json::Value) -> [u8; 32] {
    let text = serde_json::to_vec(payload).expect("a JSON value always serialises");
    Sha256::digest(&text).into()
}

const LOOKUP: &str = "SELECT payload_sha256, response FROM inbox_messages WHERE source_service_id = ?1 AND message_id = ?2";

/// Looks a message up (a prepared, cached statement).
pub fn lookup(
    conn: &Connection,
    source: &str,
    message_id: &str,
) -> rusqlite::Result<Option<InboxRecord>> {
    let mut statement = conn.prepare_cached(LOOKUP)?;
    statement
        .query_row(params![source, message_id], |row| {
            let digest: Vec<u8> = row.get(0)?;
            let response: Option<String> = row.get(1)?;
            let mut payload_sha256 = [0u8; 32];
            if digest.len() == 32 {
                payload_sha256.copy_from_slice(&digest);
            }
            let response = response
                .and_then(|r| serde_json::from_str(&r).ok())
                .unwrap_or(serde_json::Value::Null);
            Ok(InboxRecord {
                payload_sha256,
                response,
            })
        })
        .optional()
}

/// A processed message, as the writer records it.
#[derive(Debug, Clone, Copy)]
pub struct Processed<'a> {
    pub source: &'a str,
    pub message_id: &'a str,
    pub endpoint: &'a str,
    pub payload_sha256: &'a [u8; 32],
    pub response: &'a serde_json::Value,
    pub processed_at_ms: i64,
    pub expires_at_ms: i64,
}

/// Records a processed message (inside the handler's transaction).
pub fn insert(conn: &Connection, record: &Processed<'_>) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO inbox_messages \
         (source_service_id, message_id, endpoint, payload_sha256, processed_at, response, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    statement.execute(params![
        record.source,
        record.message_id,
        record.endpoint,
        &record.payload_sha256[..],
        record.processed_at_ms,
        serde_json::to_string(record.response).expect("a JSON value always serialises"),
        record.expires_at_ms
    ])?;
    Ok(())
}

/// Deletes records past their expiry; returns how many.
pub fn delete_expired(conn: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    conn.execute(
        "DELETE FROM inbox_messages WHERE expires_at < ?1",
        params![now_ms],
    )
}

/// Number of records (the `rf_inbox_size` gauge).
pub fn count(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("SELECT COUNT(*) FROM inbox_messages", [], |row| {
        row.get::<_, i64>(0)
    })
    .map(|n| n as u64)
}
