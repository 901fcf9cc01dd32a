//! The JetStream answers consumer's statements on SQLite: an answer, its
//! marker on the outbox row and the response handler's writes, in one
//! transaction.

use std::sync::{Arc, Mutex};

use rusqlite::OptionalExtension as _;

use crate::broker::{AnswerStore, Published, Recorded, Row, precheck, run_handler};
use crate::responses::ResponseHandler;
use crate::store::Sqlite;

/// The outbox row an answer belongs to, by id.
const SELECT_ROW: &str = "SELECT status, answered_at IS NOT NULL, interface, version, endpoint, \
     correlation_id, headers FROM outbox_messages WHERE message_id = ";

pub(crate) struct SqliteAnswers(pub(crate) Mutex<rusqlite::Connection>);

impl AnswerStore<Sqlite> for SqliteAnswers {
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
