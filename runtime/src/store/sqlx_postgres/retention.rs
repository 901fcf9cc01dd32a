//! Retention's statements on sqlx PostgreSQL: those of the blocking
//! PostgreSQL store, in the store's schema, each batch committing on its
//! own and skipping rows another replica's pass has locked. A pass runs on
//! the blocking pool; its statements are driven by the pool's runtime.

use tokio::runtime::Handle;

use super::PgStore;
use crate::config::Config;
use crate::retention::CleanupReport;
use crate::store::StoreError;

const DELETE_SENT: &str = "DELETE FROM {t}outbox_messages WHERE message_id IN \
     (SELECT message_id FROM {t}outbox_messages \
      WHERE status = 'Sent' AND sent_at < $1 ORDER BY sent_at LIMIT $2 \
      FOR UPDATE SKIP LOCKED)";

const DELETE_UNDELIVERED: &str = "DELETE FROM {t}outbox_messages WHERE message_id IN \
     (SELECT message_id FROM {t}outbox_messages \
      WHERE status IN ('Failed', 'DeadLetter', 'Expired') \
      AND CASE WHEN status = 'Expired' THEN expires_at \
          ELSE COALESCE(last_attempt_at, created_at) END < $1 \
      LIMIT $2 FOR UPDATE SKIP LOCKED)";

const DELETE_DISCARDED: &str = "DELETE FROM {t}outbox_messages WHERE message_id IN \
     (SELECT message_id FROM {t}outbox_messages \
      WHERE status = 'Discarded' AND discarded_at < $1 ORDER BY discarded_at LIMIT $2 \
      FOR UPDATE SKIP LOCKED)";

/// `$3`: the `interface:version`s whose failure handler a dispatcher runs;
/// their rows are left to it (`MAKE_DUE`).
const EXPIRE: &str = "UPDATE {t}outbox_messages SET status = 'Expired', \
     last_error = 'time to live exceeded' \
     WHERE message_id IN (SELECT message_id FROM {t}outbox_messages \
      WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
      AND expires_at <= $1 AND next_retry_at < 4611686018427387904 \
      AND interface || ':' || version::text <> ALL($3) \
      LIMIT $2 FOR UPDATE SKIP LOCKED)";

const MAKE_DUE: &str = "UPDATE {t}outbox_messages SET next_retry_at = $1 \
     WHERE message_id IN (SELECT message_id FROM {t}outbox_messages \
      WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
      AND expires_at <= $1 AND next_retry_at > $1 AND next_retry_at < 4611686018427387904 \
      AND interface || ':' || version::text = ANY($3) \
      LIMIT $2 FOR UPDATE SKIP LOCKED)";

const DELETE_INBOX: &str = "DELETE FROM {t}inbox_messages \
     WHERE (source_service_id, message_id) IN \
     (SELECT source_service_id, message_id FROM {t}inbox_messages \
      WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// The pass [`crate::Retention`] runs on `store`; made on the pool's runtime.
/// `handled`: the `interface:version`s whose rows past their TTL are made
/// due for the dispatcher that runs their failure handler, not expired.
pub(crate) fn pass(
    store: PgStore,
    config: Config,
    handled: Vec<String>,
) -> Result<impl FnMut(i64) -> Result<CleanupReport, StoreError> + Send, StoreError> {
    let runtime = Handle::try_current().map_err(|_| StoreError::Postgres {
        target: store.target().to_owned(),
        cause: "retention on a sqlx pool must be started on the pool's tokio runtime".to_owned(),
    })?;
    let prefix = format!("\"{}\".", store.schema());
    let [sent, undelivered, discarded, expire, make_due, inbox] = [
        DELETE_SENT,
        DELETE_UNDELIVERED,
        DELETE_DISCARDED,
        EXPIRE,
        MAKE_DUE,
        DELETE_INBOX,
    ]
    .map(|sql| sql.replace("{t}", &prefix));
    Ok(move |now_ms: i64| {
        let batch = i64::from(crate::retention::CLEANUP_BATCH);
        let repeat_for = |sql: &str, at: i64, versions: Option<&Vec<String>>| {
            let mut total = 0;
            loop {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(at).bind(batch);
                if let Some(versions) = versions {
                    query = query.bind(versions);
                }
                let done = runtime
                    .block_on(query.execute(store.pool()))
                    .map_err(|e| store.statement(&e))?
                    .rows_affected() as usize;
                total += done;
                if done < batch as usize {
                    return Ok::<_, StoreError>(total);
                }
            }
        };
        let repeat = |sql: &str, at: i64| repeat_for(sql, at, None);
        let sent_before = now_ms.saturating_sub(config.outbox.sent_retention.as_millis() as i64);
        let failed_before =
            now_ms.saturating_sub(config.outbox.failed_retention.as_millis() as i64);
        Ok(CleanupReport {
            sent_deleted: repeat(&sent, sent_before)?,
            undelivered_deleted: repeat(&undelivered, failed_before)?
                + repeat(&discarded, failed_before)?,
            expired: repeat_for(&expire, now_ms, Some(&handled))?,
            made_due: if handled.is_empty() {
                0
            } else {
                repeat_for(&make_due, now_ms, Some(&handled))?
            },
            inbox_deleted: repeat(&inbox, now_ms)?,
        })
    })
}
