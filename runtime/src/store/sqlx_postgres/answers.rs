//! The broker consumers' statements on sqlx PostgreSQL, on the caller's
//! pool: an answer, its marker on the outbox row (locked `FOR UPDATE`, so
//! replicas apply an answer once) and the async response handler's writes,
//! in one transaction (`broker::OnPool`); and the deliveries an inbound
//! consumer gives up on (`rf_terminated`).

use std::sync::Arc;

use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;
use crate::BoxFuture;
use crate::broker::{
    AnswerStore, AsyncAnswerStatements, BrokerError, OnPool, Row, TerminatedRow, TerminatedStore,
    row_of,
};
use crate::responses::AsyncResponseHandler;

/// The statements, `{t}` standing for the schema.
const SQL: [&str; 4] = [
    // ROW
    "SELECT status, answered_at IS NOT NULL, interface, version, endpoint, correlation_id, \
     headers FROM {t}outbox_messages WHERE message_id = $1 FOR UPDATE",
    // MARK
    "UPDATE {t}outbox_messages SET answered_at = $2, response = $3 WHERE message_id = $1",
    // NOTE_FAILURE
    "UPDATE {t}outbox_messages SET last_error = $2 WHERE message_id = $1",
    // TERMINATED
    "INSERT INTO {t}rf_terminated (stream_sequence, stream, message_id, subject, error, at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
];
const ROW: usize = 0;
const MARK: usize = 1;
const NOTE_FAILURE: usize = 2;
const TERMINATED: usize = 3;

/// The broker statements of `store`, its tables in its schema.
#[derive(Clone)]
struct Statements {
    store: PgStore,
    sql: Arc<[String]>,
}

impl Statements {
    fn new(store: &PgStore) -> Self {
        let prefix = format!("\"{}\".", store.schema());
        Self {
            store: store.clone(),
            sql: SQL.iter().map(|sql| sql.replace("{t}", &prefix)).collect(),
        }
    }

    fn query(&self, index: usize) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(AssertSqlSafe(self.sql[index].as_str()))
    }
}

/// The answers of the outbox in `store`, running `handlers` on its pool.
pub(crate) fn open(
    store: &PgStore,
    handlers: Vec<Arc<dyn AsyncResponseHandler<Postgres>>>,
) -> Arc<dyn AnswerStore> {
    Arc::new(OnPool::new(Statements::new(store), handlers))
}

/// `rf_terminated` in `store`, on its pool.
pub(crate) fn open_terminated(store: &PgStore) -> Arc<dyn TerminatedStore> {
    Arc::new(Statements::new(store))
}

impl AsyncAnswerStatements for Statements {
    type Store = Postgres;
    type Tx = sqlx::Transaction<'static, Postgres>;

    fn begin(&self) -> BoxFuture<'_, Result<Self::Tx, sqlx::Error>> {
        Box::pin(self.store.pool().begin())
    }

    fn commit(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>> {
        Box::pin(tx.commit())
    }

    fn row<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        message_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Row>, sqlx::Error>> {
        Box::pin(async move {
            let row = self
                .query(ROW)
                .bind(message_id)
                .fetch_optional(conn)
                .await?;
            row.as_ref().map(row_of).transpose()
        })
    }

    fn mark<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        message_id: &'a str,
        now: i64,
        response: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let query = self.query(MARK).bind(message_id).bind(now).bind(response);
        Box::pin(async move { query.execute(conn).await.map(drop) })
    }

    fn note_failure<'a>(
        &'a self,
        message_id: &'a str,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let query = self.query(NOTE_FAILURE).bind(message_id).bind(error);
        Box::pin(async move { query.execute(self.store.pool()).await.map(drop) })
    }
}

impl TerminatedStore for Statements {
    fn record(&self, row: TerminatedRow) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(async move {
            self.query(TERMINATED)
                .bind(row.stream_sequence)
                .bind(row.stream)
                .bind(row.message_id)
                .bind(row.subject)
                .bind(row.error)
                .bind(row.at)
                .execute(self.store.pool())
                .await
                .map(drop)
                .map_err(|e| BrokerError(super::error_text(&e)))
        })
    }
}
