//! Retention's statements on SQLite: one clean-up pass, in batches of
//! [`CLEANUP_BATCH`] rows that each commit on their own.

use rusqlite::{Connection, params};

use crate::config::Config;

use crate::retention::{CLEANUP_BATCH, CleanupReport};

/// Runs one clean-up pass at `now_ms` on `conn`, which must not be inside a
/// transaction (each batch commits on its own). Blocking.
pub fn cleanup(conn: &Connection, config: &Config, now_ms: i64) -> rusqlite::Result<CleanupReport> {
    cleanup_with_failure_handlers(conn, config, now_ms, &[])
}

/// [`cleanup`] for a database whose dispatcher runs failure handlers
/// for the interface versions `handled` (`package.Service`, version):
/// their `Pending` rows past the TTL are made due at once instead of
/// expired, so the dispatcher expires them in the transaction where the
/// handler runs ([`crate::failures`]).
pub fn cleanup_with_failure_handlers(
    conn: &Connection,
    config: &Config,
    now_ms: i64,
    handled: &[(&str, u32)],
) -> rusqlite::Result<CleanupReport> {
    let handled = crate::retention::version_keys(handled);
    let sent_before = now_ms.saturating_sub(config.outbox.sent_retention.as_millis() as i64);
    // `LIMIT +?2`: a bare bound `LIMIT` is re-prepared on every execution
    // (see the dispatcher's `CLAIM_SELECT`).
    let sent_deleted = repeat_in_batches(|| {
        conn.prepare_cached(
            "DELETE FROM outbox_messages WHERE seq IN \
             (SELECT seq FROM outbox_messages \
              WHERE status = 'Sent' AND sent_at < ?1 ORDER BY sent_at LIMIT +?2)",
        )?
        .execute(params![sent_before, CLEANUP_BATCH])
    })?;
    // Undelivered rows, `outbox.failed_retention` after they stopped. The
    // first condition is `outbox_attention`'s predicate, the second
    // `outbox_discarded`'s: each statement reads one partial index.
    let failed_before = now_ms.saturating_sub(config.outbox.failed_retention.as_millis() as i64);
    let mut undelivered_deleted = repeat_in_batches(|| {
        conn.prepare_cached(concat!(
            "DELETE FROM outbox_messages WHERE seq IN \
             (SELECT seq FROM outbox_messages WHERE ",
            crate::store::sqlite::attention!(),
            " AND CASE WHEN status = 'Expired' THEN expires_at \
                   ELSE COALESCE(last_attempt_at, created_at) END < ?1 LIMIT +?2)"
        ))?
        .execute(params![failed_before, CLEANUP_BATCH])
    })?;
    undelivered_deleted += repeat_in_batches(|| {
        conn.prepare_cached(
            "DELETE FROM outbox_messages WHERE seq IN \
             (SELECT seq FROM outbox_messages \
              WHERE status = 'Discarded' AND discarded_at < ?1 ORDER BY discarded_at LIMIT +?2)",
        )?
        .execute(params![failed_before, CLEANUP_BATCH])
    })?;
    // Held rows (due at `lifecycle::HELD_DUE_MS`, 2^62) never expire: their
    // version is decommissioned and they wait for its re-commission.
    // `status IN ('Pending', 'Sending')` repeats the condition of the partial
    // index `outbox_due`, so SQLite uses it instead of scanning the table.
    // `?3`: the versions whose rows are left to the dispatcher, a JSON array
    // of `interface:version`.
    let expired = repeat_in_batches(|| {
        conn.prepare_cached(
            "UPDATE outbox_messages \
             SET status = 'Expired', last_error = 'time to live exceeded' \
             WHERE seq IN \
             (SELECT seq FROM outbox_messages \
              WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
              AND expires_at <= ?1 AND next_retry_at < 4611686018427387904 \
              AND interface || ':' || version NOT IN (SELECT value FROM json_each(?3)) \
              LIMIT +?2)",
        )?
        .execute(params![now_ms, CLEANUP_BATCH, handled])
    })?;
    let made_due = if handled == "[]" {
        0
    } else {
        repeat_in_batches(|| {
            conn.prepare_cached(
                "UPDATE outbox_messages SET next_retry_at = ?1 WHERE seq IN \
                 (SELECT seq FROM outbox_messages \
                  WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
                  AND expires_at <= ?1 AND next_retry_at > ?1 \
                  AND next_retry_at < 4611686018427387904 \
                  AND interface || ':' || version IN (SELECT value FROM json_each(?3)) \
                  LIMIT +?2)",
            )?
            .execute(params![now_ms, CLEANUP_BATCH, handled])
        })?
    };
    let inbox_deleted = super::inbox::delete_all_expired(conn, now_ms)?;
    Ok(CleanupReport {
        sent_deleted,
        expired,
        made_due,
        undelivered_deleted,
        inbox_deleted,
    })
}

fn repeat_in_batches(
    mut batch: impl FnMut() -> rusqlite::Result<usize>,
) -> rusqlite::Result<usize> {
    let mut total = 0;
    loop {
        let done = batch()?;
        total += done;
        if done < CLEANUP_BATCH as usize {
            return Ok(total);
        }
    }
}
