//! The broker consumers' statements on sqlx SQLite, on the caller's pool:
//! an answer, its marker on the outbox row and the async response
//! handler's writes, in one `BEGIN IMMEDIATE` transaction
//! (`broker::OnPool`: the file's write lock held from the first statement,
//! so a redelivered answer waits, then finds the marker); and the
//! deliveries an inbound consumer gives up on (`rf_terminated`).

use std::sync::Arc;

use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::BoxFuture;
use crate::broker::{
    AnswerStore, AsyncAnswerStatements, BrokerError, OnPool, Row, TerminatedRow, TerminatedStore,
    row_of,
};
use crate::responses::AsyncResponseHandler;
use crate::store::sqlite::outbox_seq;

const ROW: &str = "SELECT status, answered_at IS NOT NULL, interface, version, endpoint, \
     correlation_id, headers FROM outbox_messages WHERE message_id = ?1 AND seq = ?2";

const MARK: &str =
    "UPDATE outbox_messages SET answered_at = ?3, response = ?4 WHERE message_id = ?1 AND seq = ?2";

const NOTE_FAILURE: &str =
    "UPDATE outbox_messages SET last_error = ?3 WHERE message_id = ?1 AND seq = ?2";

const TERMINATED: &str = "INSERT OR IGNORE INTO rf_terminated \
     (stream_sequence, stream, message_id, subject, error, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// The broker statements on the store's pool.
struct Statements(SqliteStore);

/// The answers of the outbox in `store`, running `handlers` on its pool.
pub(crate) fn open(
    store: &SqliteStore,
    handlers: Vec<Arc<dyn AsyncResponseHandler<Sqlite>>>,
) -> Arc<dyn AnswerStore> {
    Arc::new(OnPool::new(Statements(store.clone()), handlers))
}

/// `rf_terminated` in `store`, on its pool.
pub(crate) fn open_terminated(store: &SqliteStore) -> Arc<dyn TerminatedStore> {
    Arc::new(Statements(store.clone()))
}

impl AsyncAnswerStatements for Statements {
    type Store = Sqlite;
    type Tx = sqlx::Transaction<'static, Sqlite>;

    fn begin(&self) -> BoxFuture<'_, Result<Self::Tx, sqlx::Error>> {
        Box::pin(self.0.pool().begin_with("BEGIN IMMEDIATE"))
    }

    fn commit(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>> {
        Box::pin(tx.commit())
    }

    fn row<'a>(
        &'a self,
        conn: &'a mut SqliteConnection,
        message_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Row>, sqlx::Error>> {
        Box::pin(async move {
            let row = sqlx::query(ROW)
                .bind(message_id)
                .bind(outbox_seq(message_id))
                .fetch_optional(conn)
                .await?;
            row.as_ref().map(row_of).transpose()
        })
    }

    fn mark<'a>(
        &'a self,
        conn: &'a mut SqliteConnection,
        message_id: &'a str,
        now: i64,
        response: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let query = sqlx::query(MARK)
            .bind(message_id)
            .bind(outbox_seq(message_id))
            .bind(now)
            .bind(response);
        Box::pin(async move { query.execute(conn).await.map(drop) })
    }

    fn note_failure<'a>(
        &'a self,
        message_id: &'a str,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let query = sqlx::query(NOTE_FAILURE)
            .bind(message_id)
            .bind(outbox_seq(message_id))
            .bind(error);
        Box::pin(async move { query.execute(self.0.pool()).await.map(drop) })
    }
}

impl TerminatedStore for Statements {
    fn record(&self, row: TerminatedRow) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(async move {
            sqlx::query(TERMINATED)
                .bind(row.stream_sequence)
                .bind(row.stream)
                .bind(row.message_id)
                .bind(row.subject)
                .bind(row.error)
                .bind(row.at)
                .execute(self.0.pool())
                .await
                .map(drop)
                .map_err(|e| BrokerError(crate::store::sqlx_error_text(&e)))
        })
    }
}
