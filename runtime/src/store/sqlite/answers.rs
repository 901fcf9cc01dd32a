//! The broker consumers' statements on SQLite: an answer, its marker on
//! the outbox row and the response handler's writes, in one transaction
//! (run on the blocking pool), and the deliveries an inbound consumer
//! gives up on (`rf_terminated`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::OptionalExtension as _;

use crate::broker::{
    AnswerStore, BlockingAnswers, BlockingTerminated, OnBlockingPool, Published, Recorded, Row,
    TerminatedRow, TerminatedStore, precheck, run_handler,
};
use crate::responses::ResponseHandler;
use crate::store::{Sqlite, StoreError};

/// The answers of the outbox in `path`, on a connection of their own,
/// running `handlers`.
pub(crate) fn open(
    path: &Path,
    handlers: Vec<Arc<dyn ResponseHandler<Sqlite>>>,
) -> Result<Arc<dyn AnswerStore>, StoreError> {
    let conn = super::open(path, crate::config::Durability::Full)?;
    let statements = SqliteAnswers(Mutex::new(conn));
    Ok(Arc::new(OnBlockingPool::new(statements, handlers)))
}

/// `rf_terminated` in `path`, on a connection of its own.
pub(crate) fn open_terminated(path: &Path) -> Result<Arc<dyn TerminatedStore>, StoreError> {
    let conn = super::open(path, crate::config::Durability::Full)?;
    Ok(Arc::new(BlockingTerminated::new(conn, insert_terminated)))
}

/// Records a delivery a consumer gave up on (idempotent per stream
/// sequence).
fn insert_terminated(conn: &mut rusqlite::Connection, row: &TerminatedRow) -> Result<(), String> {
    conn.execute(
        "INSERT OR IGNORE INTO rf_terminated \
         (stream_sequence, stream, message_id, subject, error, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        rusqlite::params![
            row.stream_sequence,
            row.stream,
            row.message_id,
            row.subject,
            row.error,
            row.at
        ],
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

/// The outbox row an answer belongs to, by id.
const SELECT_ROW: &str = "SELECT status, answered_at IS NOT NULL, interface, version, endpoint, \
     correlation_id, headers FROM outbox_messages WHERE message_id = ";

struct SqliteAnswers(Mutex<rusqlite::Connection>);

impl BlockingAnswers<Sqlite> for SqliteAnswers {
    fn record(
        &self,
        handlers: &[Arc<dyn ResponseHandler<Sqlite>>],
        published: &Published,
    ) -> Recorded {
        let Ok(mut conn) = self.0.lock() else {
            return Recorded::Failed("connection lock poisoned".to_owned());
        };
        let result = (|| -> Result<Recorded, rusqlite::Error> {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let row = tx
                .query_row(
                    &format!("{SELECT_ROW}?1 AND seq = ?2"),
                    rusqlite::params![
                        published.message_id,
                        crate::store::sqlite::outbox_seq(&published.message_id)
                    ],
                    |r| {
                        Ok(Row {
                            status: r.get(0)?,
                            answered: r.get(1)?,
                            interface: r.get(2)?,
                            version: r.get(3)?,
                            endpoint: r.get(4)?,
                            correlation_id: r.get(5)?,
                            headers: r.get(6)?,
                        })
                    },
                )
                .optional()?;
            let (row, payload) = match precheck(row, published) {
                Ok(ready) => ready,
                Err(done) => return Ok(done),
            };
            tx.execute(
                "UPDATE outbox_messages SET answered_at = ?1, response = ?2 \
                 WHERE message_id = ?3 AND seq = ?4",
                rusqlite::params![
                    crate::store::now_ms(),
                    serde_json::to_string(&payload).unwrap_or_default(),
                    published.message_id,
                    crate::store::sqlite::outbox_seq(&published.message_id)
                ],
            )?;
            if let Err(error) = run_handler(handlers, &row, &published.message_id, &payload, &tx) {
                // Dropping `tx` rolls the marker back too.
                return Ok(Recorded::Failed(format!("response handler: {error}")));
            }
            tx.commit()?;
            Ok(Recorded::Done)
        })();
        result.unwrap_or_else(|error| Recorded::Failed(format!("database: {error}")))
    }

    fn note_failure(&self, message_id: &str, error: &str) {
        if let Ok(conn) = self.0.lock() {
            let _ = conn.execute(
                "UPDATE outbox_messages SET last_error = ?1 WHERE message_id = ?2 AND seq = ?3",
                rusqlite::params![
                    error,
                    message_id,
                    crate::store::sqlite::outbox_seq(message_id)
                ],
            );
        }
    }
}
