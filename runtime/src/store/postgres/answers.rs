//! The JetStream answers consumer's statements on PostgreSQL: an answer,
//! its marker on the (locked) outbox row and the response handler's writes,
//! in one transaction, so replicas apply an answer once.

use std::sync::{Arc, Mutex};

use crate::broker::{AnswerStore, Published, Recorded, Row, precheck, run_handler};
use crate::responses::ResponseHandler;

/// The outbox row an answer belongs to, by id.
const SELECT_ROW: &str = "SELECT status, answered_at IS NOT NULL, interface, version, endpoint, \
     correlation_id, headers FROM outbox_messages WHERE message_id = ";

pub(crate) struct PostgresAnswers(pub(crate) Mutex<crate::store::postgres::Connection>);

impl AnswerStore<crate::store::Postgres> for PostgresAnswers {
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
