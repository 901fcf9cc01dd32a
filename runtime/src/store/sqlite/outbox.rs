//! The outbox's statements on SQLite: the INSERT of `enqueue` (in the
//! caller's transaction) and of `send` (group commits on the outbox's own
//! connection), and the row reads tools use.

use std::collections::BTreeMap;

use rusqlite::params;
use uuid::Uuid;

use crate::config::Config;
use crate::outbox::{OutboxError, OutboxRow, OutgoingMessage, SendJob, Status};
use crate::store::sqlite as db;

pub(crate) fn write_group(
    conn: &mut rusqlite::Connection,
    config: &Config,
    group: &[SendJob],
) -> Vec<Result<Uuid, OutboxError>> {
    let tx = match conn.transaction() {
        Ok(tx) => tx,
        Err(error) => {
            return group
                .iter()
                .map(|_| Err(OutboxError::Write(error.to_string())))
                .collect();
        }
    };
    let mut ids = Vec::with_capacity(group.len());
    for (message, _) in group {
        match insert(&tx, config, message) {
            Ok(id) => ids.push(id),
            Err(error) => {
                let text = error.to_string();
                drop(tx);
                return group
                    .iter()
                    .map(|_| Err(OutboxError::Write(text.clone())))
                    .collect();
            }
        }
    }
    match tx.commit() {
        Ok(()) => ids.into_iter().map(Ok).collect(),
        Err(error) => group
            .iter()
            .map(|_| Err(OutboxError::Write(error.to_string())))
            .collect(),
    }
}

/// Under `outbox.durability: full` the dispatcher's claim relies on every
/// enqueuing transaction being durable when it commits: refuses a connection
/// whose `synchronous` level is below `FULL` (2).
pub(crate) fn require_durable_commit(conn: &rusqlite::Connection) -> Result<(), OutboxError> {
    let level: i64 = conn
        .prepare_cached("PRAGMA synchronous")?
        .query_row([], |row| row.get(0))?;
    match level {
        2.. => Ok(()),
        1 => Err(OutboxError::NotDurable { found: "NORMAL" }),
        _ => Err(OutboxError::NotDurable { found: "OFF" }),
    }
}

/// The INSERT itself, shared by `enqueue` and `send`.
///
/// The row's `seq` (its rowid) is derived from its id ([`db::outbox_seq`]):
/// ids made by other processes writing to the same file in the same
/// millisecond may share it, and the INSERT then fails on the primary key
/// before it wrote anything, so it is tried again with a fresh id.
pub(crate) fn insert(
    conn: &rusqlite::Connection,
    config: &Config,
    message: &OutgoingMessage,
) -> Result<Uuid, OutboxError> {
    insert_with_ids(conn, config, message, Uuid::now_v7)
}

/// [`insert`] with the ids drawn from `next_id`.
fn insert_with_ids(
    conn: &rusqlite::Connection,
    config: &Config,
    message: &OutgoingMessage,
    mut next_id: impl FnMut() -> Uuid,
) -> Result<Uuid, OutboxError> {
    const ATTEMPTS: usize = 8;
    let due = message.due_ms(db::now_ms());
    let expires_at = message.expires_ms(config, due);
    let max_retries = message.max_retries.unwrap_or(config.outbox.max_retries);
    let payload = serde_json::to_string(&message.payload)?;
    let headers = serde_json::to_string(&message.headers)?;
    let mut statement = conn.prepare_cached(
        "INSERT INTO outbox_messages (seq, message_id, correlation_id, message_type, destination, \
         interface, version, fingerprint, endpoint, payload, headers, status, max_retries, \
         next_retry_at, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'Pending', ?12, ?13, ?13, ?14)",
    )?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let id = next_id();
        let mut text = Uuid::encode_buffer();
        let text = id.hyphenated().encode_lower(&mut text);
        let result = statement.execute(params![
            db::outbox_seq(text),
            &*text,
            message.correlation_id,
            message.message_type.as_str(),
            message.destination,
            message.interface,
            message.version,
            message.fingerprint,
            message.endpoint,
            payload,
            headers,
            max_retries,
            due,
            expires_at,
        ]);
        match result {
            Ok(_) => return Ok(id),
            Err(error)
                if attempt < ATTEMPTS
                    && error.sqlite_error().is_some_and(|e| {
                        e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    }) =>
            {
                continue;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Reads one outbox row (for tools and tests).
pub fn outbox_row(
    conn: &rusqlite::Connection,
    message_id: &Uuid,
) -> rusqlite::Result<Option<OutboxRow>> {
    use rusqlite::OptionalExtension as _;
    conn.query_row(
        "SELECT message_id, destination, endpoint, status, retry_count, max_retries, last_error, response \
         FROM outbox_messages WHERE seq = ?2 AND message_id = ?1",
        params![message_id.to_string(), db::outbox_seq(&message_id.to_string())],
        |r| {
            let status: String = r.get(3)?;
            let response: Option<String> = r.get(7)?;
            Ok(OutboxRow {
                message_id: r.get(0)?,
                destination: r.get(1)?,
                endpoint: r.get(2)?,
                status: Status::parse(&status).unwrap_or(Status::Pending),
                retry_count: r.get(4)?,
                max_retries: r.get(5)?,
                last_error: r.get(6)?,
                response: response.and_then(|t| serde_json::from_str(&t).ok()),
            })
        },
    )
    .optional()
}

/// Outbox row counts per status (for tools and tests).
pub fn outbox_counts(conn: &rusqlite::Connection) -> rusqlite::Result<BTreeMap<String, u64>> {
    let mut statement =
        conn.prepare("SELECT status, COUNT(*) FROM outbox_messages GROUP BY status")?;
    let rows = statement.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Durability;
    use crate::envelope::MessageType;

    fn message() -> OutgoingMessage {
        OutgoingMessage {
            destination: "peer".into(),
            message_type: MessageType::Signal,
            interface: "p.S".into(),
            version: 1,
            fingerprint: "sha256:f".into(),
            endpoint: "E".into(),
            correlation_id: None,
            payload: serde_json::json!({"n": 1}),
            headers: BTreeMap::new(),
            max_retries: None,
            ttl: None,
            deliver_at: None,
        }
    }

    #[test]
    fn an_id_whose_seq_is_taken_is_replaced_by_a_fresh_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = db::open(dir.path().join("o.db"), Durability::Normal).expect("open");
        let config = Config::default();
        let first = Uuid::parse_str("019ab5d3-7f00-7abc-8def-0123456789ab").expect("uuid");
        // Same millisecond, same low 15 counter bits: same seq, other id.
        let twin = Uuid::parse_str("019ab5d3-7f00-7fff-bfff-0123ffffffff").expect("uuid");
        let fresh = Uuid::parse_str("019ab5d3-7f01-7000-8000-000000000000").expect("uuid");
        assert_eq!(
            db::outbox_seq(&first.to_string()),
            db::outbox_seq(&twin.to_string())
        );
        let tx = conn.transaction().expect("tx");
        let mut ids = [first].into_iter();
        let written = insert_with_ids(&tx, &config, &message(), || ids.next().expect("id"));
        assert_eq!(written.expect("first"), first);
        let mut ids = [twin, fresh].into_iter();
        let written = insert_with_ids(&tx, &config, &message(), || ids.next().expect("id"));
        assert_eq!(written.expect("retried"), fresh);
        tx.commit().expect("commit");
        for id in [first, fresh] {
            assert!(outbox_row(&conn, &id).expect("row").is_some(), "{id}");
        }
        assert!(outbox_row(&conn, &twin).expect("row").is_none());
        let count: i64 = conn
            .query_row("SELECT COUNT(*) FROM outbox_messages", [], |r| r.get(0))
            .expect("count");
        assert_eq!(count, 2, "the failed attempt left nothing behind");

        // A conflict that persists is an error, after a bounded number of tries.
        let tx = conn.transaction().expect("tx");
        let error =
            insert_with_ids(&tx, &config, &message(), || twin).expect_err("the seq stays taken");
        assert!(error.to_string().contains("UNIQUE"), "{error}");
    }
}
