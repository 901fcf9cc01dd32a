//! The broker consumers' statements on PostgreSQL: an answer, its marker
//! on the (locked) outbox row and the response handler's writes, in one
//! transaction (run on the blocking pool), so replicas apply an answer
//! once; and the deliveries an inbound consumer gives up on
//! (`rf_terminated`).

use std::sync::{Arc, Mutex};

use super::{Connection, PostgresUrl};
use crate::broker::{
    AnswerStore, BlockingAnswers, BlockingTerminated, OnBlockingPool, Published, Recorded, Row,
    TerminatedRow, TerminatedStore, precheck, run_handler,
};
use crate::responses::ResponseHandler;
use crate::store::StoreError;

/// The answers of the outbox at `url`, on a connection of their own,
/// running `handlers`.
pub(crate) fn open(
    url: &PostgresUrl,
    handlers: Vec<Arc<dyn ResponseHandler<crate::store::Postgres>>>,
) -> Result<Arc<dyn AnswerStore>, StoreError> {
    let client = super::open(url)?;
    let statements = PostgresAnswers(Mutex::new(Connection::new(url.clone(), client)));
    Ok(Arc::new(OnBlockingPool::new(statements, handlers)))
}

/// `rf_terminated` at `url`, on a connection of its own.
pub(crate) fn open_terminated(url: &PostgresUrl) -> Result<Arc<dyn TerminatedStore>, StoreError> {
    let client = super::open(url)?;
    let conn = Connection::new(url.clone(), client);
    Ok(Arc::new(BlockingTerminated::new(conn, insert_terminated)))
}

/// Records a delivery a consumer gave up on (idempotent per stream
/// sequence).
fn insert_terminated(conn: &mut Connection, row: &TerminatedRow) -> Result<(), String> {
    conn.client()
        .map_err(|e| e.to_string())?
        .execute(
            "INSERT INTO rf_terminated \
             (stream_sequence, stream, message_id, subject, error, at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            &[
                &row.stream_sequence,
                &row.stream,
                &row.message_id,
                &row.subject,
                &row.error,
                &row.at,
            ],
        )
        .map(drop)
        .map_err(|e| super::error_text(&e))
}

/// The outbox row an answer belongs to, by id.
const SELECT_ROW: &str = "SELECT status, answered_at IS NOT NULL, interface, version, endpoint, \
     correlation_id, headers FROM outbox_messages WHERE message_id = ";

struct PostgresAnswers(Mutex<Connection>);

impl BlockingAnswers<crate::store::Postgres> for PostgresAnswers {
    fn record(
        &self,
        handlers: &[Arc<dyn ResponseHandler<crate::store::Postgres>>],
        published: &Published,
    ) -> Recorded {
        let Ok(mut conn) = self.0.lock() else {
            return Recorded::Failed("connection lock poisoned".to_owned());
        };
        let client = match conn.client() {
            Ok(client) => client,
            Err(error) => return Recorded::Failed(format!("database: {error}")),
        };
        let result = (|| -> Result<Recorded, postgres::Error> {
            let mut tx = client.transaction()?;
            // Locked: a replica's consumer of the same answer waits, then
            // finds the marker.
            let row = tx
                .query_opt(
                    &format!("{SELECT_ROW}$1 FOR UPDATE"),
                    &[&published.message_id],
                )?
                .map(|r| Row {
                    status: r.get(0),
                    answered: r.get(1),
                    interface: r.get(2),
                    version: u32::try_from(r.get::<_, i64>(3)).unwrap_or(0),
                    endpoint: r.get(4),
                    correlation_id: r.get(5),
                    headers: r.get(6),
                });
            let (row, payload) = match precheck(row, published) {
                Ok(ready) => ready,
                Err(done) => return Ok(done),
            };
            tx.execute(
                "UPDATE outbox_messages SET answered_at = $1, response = $2 WHERE message_id = $3",
                &[
                    &crate::store::now_ms(),
                    &serde_json::to_string(&payload).unwrap_or_default(),
                    &published.message_id,
                ],
            )?;
            if let Err(error) =
                run_handler(handlers, &row, &published.message_id, &payload, &mut tx)
            {
                return Ok(Recorded::Failed(format!("response handler: {error}")));
            }
            tx.commit()?;
            Ok(Recorded::Done)
        })();
        result.unwrap_or_else(|error| Recorded::Failed(crate::store::postgres::error_text(&error)))
    }

    fn note_failure(&self, message_id: &str, error: &str) {
        if let Ok(mut conn) = self.0.lock()
            && let Ok(client) = conn.client()
        {
            let _ = client.execute(
                "UPDATE outbox_messages SET last_error = $1 WHERE message_id = $2",
                &[&error, &message_id],
            );
        }
    }
}
