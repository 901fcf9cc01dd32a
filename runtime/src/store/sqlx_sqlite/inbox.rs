//! The receiver on sqlx SQLite: the statements of the async writer
//! (`receiver::async_writer`, which runs async handlers in transactions on
//! the caller's pool), and the committed-inbox look-up (the blocking
//! store's `InboxReader`, on the file).
//!
//! Each transaction begins `IMMEDIATE`: it holds the file's write lock from
//! its first statement, so no other writer (the dispatcher, a caller's
//! transaction, another process) commits between its claim and its commit.
//! A claim inserts the message's inbox row (`INSERT OR IGNORE`, no answer
//! yet); a copy processed already is answered from its row.

use std::sync::Arc;

use sqlx::Row as _;
use sqlx::sqlite::{Sqlite, SqliteConnection};

use crate::BoxFuture;
use crate::config::Durability;
use crate::inbox::{InboxLookup, RawEntry};
use crate::receiver::async_writer::AsyncInboxStep;
use crate::receiver::writer::{Claim, Delivery};
use crate::receiver::{ReceiverError, Started, WriterParts};
use crate::store::StoreError;

use super::SqliteStore;

const CLAIM: &str = "INSERT OR IGNORE INTO inbox_messages (source_service_id, message_id, \
     endpoint, payload_sha256, processed_at, response, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6)";

const LOOKUP: &str = "SELECT endpoint, payload_sha256, processed_at, response, expires_at \
     FROM inbox_messages WHERE source_service_id = ?1 AND message_id = ?2";

const RECORD: &str =
    "UPDATE inbox_messages SET response = ?3 WHERE source_service_id = ?1 AND message_id = ?2";

/// Starts `writers` writer tasks on the current runtime (the pool's).
pub(crate) fn start(
    store: SqliteStore,
    writers: usize,
    parts: WriterParts<Sqlite>,
) -> Result<Started, ReceiverError> {
    let fail = |cause: String| {
        ReceiverError::Database(StoreError::SqlxSqlite {
            path: store.path().display().to_string(),
            cause,
        })
    };
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        fail("a receiver on a sqlx pool must be built on the pool's tokio runtime".to_owned())
    })?;
    if parts.durability == Durability::Full && store.inner.synchronous < 2 {
        return Err(fail(format!(
            "the pool's connections commit with `PRAGMA synchronous` {}, but \
             `inbox.durability: full` needs FULL: open the pool with \
             `.synchronous(SqliteSynchronous::Full)`, or set `inbox.durability: normal`",
            store.inner.synchronous
        )));
    }
    let path = store.location();
    if let Some(lifecycle) = &parts.lifecycle {
        let conn = crate::store::sqlite::open(path, Durability::Normal)?;
        let rows =
            crate::store::sqlite::lifecycle::read(&conn).map_err(|source| StoreError::Sqlite {
                path: path.display().to_string(),
                source,
            })?;
        lifecycle.replace(rows);
    }
    let reader = crate::store::sqlite::InboxReader::open(path)?;
    crate::receiver::async_writer::start(SqliteStep(store), &runtime, writers, parts);
    Ok((Arc::new(reader) as Arc<dyn InboxLookup>, Vec::new()))
}

/// The writer's statements on the store.
struct SqliteStep(SqliteStore);

impl AsyncInboxStep for SqliteStep {
    type Store = Sqlite;
    type Tx = sqlx::Transaction<'static, Sqlite>;

    fn begin(&self) -> BoxFuture<'_, Result<Self::Tx, sqlx::Error>> {
        Box::pin(self.0.pool().begin_with("BEGIN IMMEDIATE"))
    }

    fn commit(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>> {
        Box::pin(tx.commit())
    }

    fn rollback(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>> {
        Box::pin(tx.rollback())
    }

    fn batch<'a>(
        conn: &'a mut SqliteConnection,
        sql: &'static str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { sqlx::raw_sql(sql).execute(conn).await.map(drop) })
    }

    fn claim<'a>(
        &'a self,
        conn: &'a mut SqliteConnection,
        delivery: &'a Delivery,
        now: i64,
        expires_at: i64,
    ) -> BoxFuture<'a, Result<Claim, sqlx::Error>> {
        Box::pin(async move {
            let source = delivery.envelope.source_service_id.as_str();
            let claimed = sqlx::query(CLAIM)
                .bind(source)
                .bind(&delivery.message_id)
                .bind(&delivery.envelope.endpoint)
                .bind(&delivery.payload_sha256[..])
                .bind(now)
                .bind(expires_at)
                .execute(&mut *conn)
                .await?;
            if claimed.rows_affected() > 0 {
                return Ok(Claim::Fresh);
            }
            let found = sqlx::query(LOOKUP)
                .bind(source)
                .bind(&delivery.message_id)
                .fetch_optional(&mut *conn)
                .await?;
            Ok(match found {
                Some(row) => Claim::Done(RawEntry {
                    endpoint: row.try_get(0)?,
                    payload_sha256: row.try_get(1)?,
                    processed_at_ms: row.try_get(2)?,
                    response: row.try_get(3)?,
                    expires_at_ms: row.try_get(4)?,
                }),
                // Not reached: the transaction holds the write lock.
                None => Claim::InProgress,
            })
        })
    }

    fn record<'a>(
        &'a self,
        conn: &'a mut SqliteConnection,
        delivery: &'a Delivery,
        response: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(RECORD)
                .bind(delivery.envelope.source_service_id.as_str())
                .bind(&delivery.message_id)
                .bind(response)
                .execute(conn)
                .await
                .map(drop)
        })
    }
}
