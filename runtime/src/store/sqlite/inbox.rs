//! The inbox on SQLite: the duplicate look-up keyed on (`sourceServiceId`,
//! `messageId`), the insert the receiver's writer makes in the handler's own
//! transaction, and the deletion of expired rows (called by retention).
//!
//! The duplicate check is the receiver's hottest read. [`InboxReader`] keeps a
//! few read-only connections, each with the look-up statement prepared and
//! cached, so a check is one primary-key probe of the `WITHOUT ROWID` table.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::BUSY_TIMEOUT;
use crate::inbox::{InboxEntry, InboxError, InboxLookup, ProcessedMessage, RawEntry};
use crate::receiver::writer::{Claim, Delivery, InboxStep};
use crate::store::{Sqlite, StoreError};

const LOOKUP_SQL: &str = "SELECT endpoint, payload_sha256, processed_at, response, expires_at \
     FROM inbox_messages WHERE source_service_id = ?1 AND message_id = ?2";

const INSERT_SQL: &str = "INSERT INTO inbox_messages \
     (source_service_id, message_id, endpoint, payload_sha256, processed_at, response, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// Looks a message up on any connection (inside a transaction, it sees that
/// transaction's own uncommitted rows). The statement is prepared once per
/// connection and cached.
pub fn lookup(
    conn: &Connection,
    source_service_id: &str,
    message_id: &str,
) -> rusqlite::Result<Option<RawEntry>> {
    let mut statement = conn.prepare_cached(LOOKUP_SQL)?;
    statement
        .query_row(params![source_service_id, message_id], |row| {
            Ok(RawEntry {
                endpoint: row.get(0)?,
                payload_sha256: row.get(1)?,
                processed_at_ms: row.get(2)?,
                response: row.get(3)?,
                expires_at_ms: row.get(4)?,
            })
        })
        .optional()
}

/// Records a processed message. Call it in the transaction that holds the
/// handler's effects; a second row for the same (source, id) is a
/// primary-key error.
pub fn record_processed(conn: &Connection, message: &ProcessedMessage<'_>) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(INSERT_SQL)?;
    statement.execute(params![
        message.source_service_id,
        message.message_id,
        message.endpoint,
        &message.payload_sha256[..],
        message.processed_at_ms,
        message.response,
        message.expires_at_ms,
    ])?;
    Ok(())
}

/// Deletes at most `limit` rows whose `expires_at` is at or before `now_ms`;
/// returns how many went. Small batches keep each write transaction short, so
/// the receiver's writer never waits long behind a clean-up: call it in a loop
/// until it returns less than `limit`. (`LIMIT +?2`: a bare bound `LIMIT` is
/// re-prepared on every execution, see the dispatcher's `CLAIM_SELECT`.)
pub fn delete_expired(conn: &Connection, now_ms: i64, limit: u32) -> rusqlite::Result<usize> {
    let mut statement = conn.prepare_cached(
        "DELETE FROM inbox_messages WHERE (source_service_id, message_id) IN \
         (SELECT source_service_id, message_id FROM inbox_messages \
          WHERE expires_at <= ?1 ORDER BY expires_at LIMIT +?2)",
    )?;
    statement.execute(params![now_ms, limit])
}

/// Rows deleted per statement by [`delete_all_expired`].
pub const EXPIRY_BATCH: u32 = 1000;

/// Deletes every row expired at `now_ms`, [`EXPIRY_BATCH`] rows per
/// statement. Run it outside a transaction (each batch then commits on its
/// own, and the receiver's writer waits at most one batch); returns the total.
pub fn delete_all_expired(conn: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    let mut total = 0;
    loop {
        let deleted = delete_expired(conn, now_ms, EXPIRY_BATCH)?;
        total += deleted;
        if deleted < EXPIRY_BATCH as usize {
            return Ok(total);
        }
    }
}

/// Current number of inbox rows (the `rf_inbox_size` gauge).
pub fn count(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("SELECT count(*) FROM inbox_messages", [], |row| {
        row.get::<_, i64>(0)
    })
    .map(|n| n.max(0) as u64)
}

impl InboxLookup for InboxReader {
    fn lookup(
        &self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError> {
        InboxReader::lookup(self, source_service_id, message_id)
    }
}

/// How many idle read connections [`InboxReader`] keeps.
const READ_POOL_SIZE: usize = 32;

/// Read-only connections for the duplicate check, each with its look-up
/// statement cached. Blocking: call it from `spawn_blocking` or a thread of
/// your own, never on an async executor.
#[derive(Debug)]
pub struct InboxReader {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl InboxReader {
    /// A reader of the database at `path` (which must exist and be migrated:
    /// open it with [`crate::store::sqlite::open`] first). Opens one connection now, so a
    /// wrong path fails here rather than on the first request.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, InboxError> {
        let reader = Self {
            path: path.as_ref().to_path_buf(),
            idle: Mutex::new(Vec::new()),
        };
        let conn = reader.connect()?;
        reader.give_back(conn);
        Ok(reader)
    }

    fn wrap(&self, source: rusqlite::Error) -> InboxError {
        InboxError::Sqlite {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn connect(&self) -> Result<Connection, InboxError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|e| self.wrap(e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| self.wrap(e))?;
        conn.set_prepared_statement_cache_capacity(16);
        // Prepare now so the first look-up on this connection is as fast as the rest.
        conn.prepare_cached(LOOKUP_SQL).map_err(|e| self.wrap(e))?;
        Ok(conn)
    }

    fn take(&self) -> Result<Connection, InboxError> {
        let idle = self.idle.lock().map(|mut idle| idle.pop()).ok().flatten();
        match idle {
            Some(conn) => Ok(conn),
            None => self.connect(),
        }
    }

    fn give_back(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < READ_POOL_SIZE
        {
            idle.push(conn);
        }
    }

    /// A look-up's row as an [`InboxEntry`].
    fn entry(
        &self,
        found: rusqlite::Result<Option<RawEntry>>,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError> {
        match found.map_err(|e| self.wrap(e))? {
            Some(raw) => raw.into_entry(source_service_id, message_id).map(Some),
            None => Ok(None),
        }
    }

    /// The committed inbox entry of (source, id), if any.
    pub fn lookup(
        &self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError> {
        let conn = self.take()?;
        let found = lookup(&conn, source_service_id, message_id);
        self.give_back(conn);
        self.entry(found, source_service_id, message_id)
    }
}

/// The SQLite writer's step: one writer, which group-commits under
/// `BEGIN IMMEDIATE`. A claim is a look-up (the single writer is the only
/// one that inserts), the record is the insert.
pub(crate) struct SqliteStep {
    pub conn: Connection,
    pub group_limit: usize,
}

fn statement(error: rusqlite::Error) -> StoreError {
    StoreError::SqliteStatement(error)
}

impl InboxStep for SqliteStep {
    type Store = Sqlite;
    type Tx<'c> = rusqlite::Transaction<'c>;

    fn group_limit(&self) -> usize {
        self.group_limit
    }

    fn begin(&mut self) -> Result<Self::Tx<'_>, StoreError> {
        self.conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(statement)
    }

    fn handle<'a, 'c>(tx: &'a mut Self::Tx<'c>) -> &'a rusqlite::Transaction<'c> {
        tx
    }

    fn batch(tx: &mut Self::Tx<'_>, sql: &str) -> Result<(), StoreError> {
        tx.execute_batch(sql).map_err(statement)
    }

    fn claim(
        tx: &mut Self::Tx<'_>,
        delivery: &Delivery,
        _now: i64,
        _expires_at: i64,
    ) -> Result<Claim, StoreError> {
        let source = delivery.envelope.source_service_id.as_str();
        Ok(
            match lookup(tx, source, &delivery.message_id).map_err(statement)? {
                Some(entry) => Claim::Done(entry),
                None => Claim::Fresh,
            },
        )
    }

    fn record(
        tx: &mut Self::Tx<'_>,
        delivery: &Delivery,
        response: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let row = ProcessedMessage {
            source_service_id: &delivery.envelope.source_service_id,
            message_id: &delivery.message_id,
            endpoint: &delivery.envelope.endpoint,
            payload_sha256: &delivery.payload_sha256,
            response,
            processed_at_ms: now,
            expires_at_ms: expires_at,
        };
        record_processed(tx, &row).map_err(statement)
    }

    fn lost(tx: &Self::Tx<'_>) -> bool {
        tx.is_autocommit()
    }

    fn commit(tx: Self::Tx<'_>) -> Result<(), StoreError> {
        tx.commit().map_err(statement)
    }

    fn rollback(tx: Self::Tx<'_>) -> Result<(), StoreError> {
        tx.rollback().map_err(statement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Durability;
    use crate::inbox::{PayloadDigest, payload_digest};

    fn processed<'a>(id: &'a str, digest: &'a PayloadDigest, expires: i64) -> ProcessedMessage<'a> {
        ProcessedMessage {
            source_service_id: "hr",
            message_id: id,
            endpoint: "EmployeeHired",
            payload_sha256: digest,
            response: "{\"ok\":true}",
            processed_at_ms: 1,
            expires_at_ms: expires,
        }
    }

    #[test]
    fn digest_ignores_member_order() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[1,2]}"#).expect("json");
        let b: serde_json::Value = serde_json::from_str(r#"{ "b":[1,2], "a":1 }"#).expect("json");
        let c: serde_json::Value = serde_json::from_str(r#"{"a":2,"b":[1,2]}"#).expect("json");
        assert_eq!(payload_digest(&a), payload_digest(&b));
        assert_ne!(payload_digest(&a), payload_digest(&c));
    }

    #[test]
    fn insert_lookup_and_expire() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("inbox.db");
        let conn = crate::store::sqlite::open(&path, Durability::Normal).expect("open");
        let reader = InboxReader::open(&path).expect("reader");
        let digest = [7u8; 32];
        assert_eq!(reader.lookup("hr", "m1").expect("lookup"), None);
        record_processed(&conn, &processed("m1", &digest, 100)).expect("insert");
        record_processed(&conn, &processed("m2", &digest, 200)).expect("insert");
        assert!(record_processed(&conn, &processed("m1", &digest, 100)).is_err());
        let entry = reader.lookup("hr", "m1").expect("lookup").expect("found");
        assert_eq!(entry.payload_sha256, digest);
        assert_eq!(entry.response_value(), serde_json::json!({"ok": true}));
        assert_eq!(reader.lookup("other", "m1").expect("lookup"), None);
        assert_eq!(delete_expired(&conn, 150, 10).expect("delete"), 1);
        assert_eq!(delete_all_expired(&conn, 150).expect("delete"), 0);
        assert_eq!(reader.lookup("hr", "m1").expect("lookup"), None);
        assert!(reader.lookup("hr", "m2").expect("lookup").is_some());
        assert_eq!(count(&conn).expect("count"), 1);
    }

    #[test]
    fn delete_all_expired_goes_batch_by_batch_to_the_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = crate::store::sqlite::open(dir.path().join("inbox.db"), Durability::Normal)
            .expect("open");
        let digest = [1u8; 32];
        let tx = conn.transaction().expect("tx");
        let rows = EXPIRY_BATCH as usize * 2 + 500;
        for i in 0..rows {
            let id = format!("m{i}");
            record_processed(&tx, &processed(&id, &digest, 10)).expect("insert");
        }
        record_processed(&tx, &processed("keep", &digest, 1000)).expect("insert");
        tx.commit().expect("commit");
        assert_eq!(delete_all_expired(&conn, 10).expect("delete"), rows);
        assert_eq!(count(&conn).expect("count"), 1);
    }
}
