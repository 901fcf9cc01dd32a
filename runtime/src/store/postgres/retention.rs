//! Retention's statements on PostgreSQL: one clean-up pass, in batches
//! that skip rows another replica's pass has locked.

use postgres::types::Type;

use super::{Connection, statement};
use crate::config::Config;
use crate::retention::CleanupReport;
use crate::store::StoreError;

/// One retention pass on PostgreSQL: the statements of
/// [`crate::store::sqlite::cleanup`], each batch committing on its own and
/// skipping rows another pass (replica) holds.
pub(crate) fn cleanup(
    conn: &mut Connection,
    config: &Config,
    now_ms: i64,
) -> Result<CleanupReport, StoreError> {
    let batch = i64::from(crate::retention::CLEANUP_BATCH);
    let client = conn.client()?;
    let mut repeat = |sql: &str, at: i64| -> Result<usize, StoreError> {
        let mut total = 0;
        loop {
            let done = client
                .execute_typed(sql, &[(&at, Type::INT8), (&batch, Type::INT8)])
                .map_err(|e| statement(&e))? as usize;
            total += done;
            if done < batch as usize {
                return Ok(total);
            }
        }
    };
    let sent_before = now_ms.saturating_sub(config.outbox.sent_retention.as_millis() as i64);
    let sent_deleted = repeat(
        "DELETE FROM outbox_messages WHERE message_id IN \
         (SELECT message_id FROM outbox_messages \
          WHERE status = 'Sent' AND sent_at < $1 ORDER BY sent_at LIMIT $2 \
          FOR UPDATE SKIP LOCKED)",
        sent_before,
    )?;
    // Undelivered rows, `outbox.failed_retention` after they stopped (as on
    // SQLite).
    let failed_before = now_ms.saturating_sub(config.outbox.failed_retention.as_millis() as i64);
    let undelivered_deleted = repeat(
        "DELETE FROM outbox_messages WHERE message_id IN \
         (SELECT message_id FROM outbox_messages \
          WHERE status IN ('Failed', 'DeadLetter', 'Expired') \
          AND CASE WHEN status = 'Expired' THEN expires_at \
              ELSE COALESCE(last_attempt_at, created_at) END < $1 \
          LIMIT $2 FOR UPDATE SKIP LOCKED)",
        failed_before,
    )? + repeat(
        "DELETE FROM outbox_messages WHERE message_id IN \
         (SELECT message_id FROM outbox_messages \
          WHERE status = 'Discarded' AND discarded_at < $1 ORDER BY discarded_at LIMIT $2 \
          FOR UPDATE SKIP LOCKED)",
        failed_before,
    )?;
    let expired = repeat(
        "UPDATE outbox_messages SET status = 'Expired', last_error = 'time to live exceeded' \
         WHERE message_id IN (SELECT message_id FROM outbox_messages \
          WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
          AND expires_at <= $1 AND next_retry_at < 4611686018427387904 \
          LIMIT $2 FOR UPDATE SKIP LOCKED)",
        now_ms,
    )?;
    let inbox_deleted = repeat(
        "DELETE FROM inbox_messages WHERE (source_service_id, message_id) IN \
         (SELECT source_service_id, message_id FROM inbox_messages \
          WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        now_ms,
    )?;
    Ok(CleanupReport {
        sent_deleted,
        expired,
        undelivered_deleted,
        inbox_deleted,
    })
}
