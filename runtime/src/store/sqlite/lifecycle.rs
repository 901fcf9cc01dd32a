//! The lifecycle's statements on SQLite: the decommissioned versions
//! (`rf_decommissioned`), the last command applied per version
//! (`rf_lifecycle_applied`), and holding or releasing a version's outbox rows.

use rusqlite::{OptionalExtension as _, Transaction, params};

use crate::lifecycle::{Applied, HELD_DUE_MS};

/// The rows of `rf_decommissioned`: (interface, version, decommissioned at).
pub(crate) fn read(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<(String, u32, i64)>> {
    let mut statement =
        conn.prepare_cached("SELECT interface, version, decommissioned_at FROM rf_decommissioned")?;
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect()
}

/// Records `applied` as the last command of its version, unless the one
/// recorded is newer (or as new, but the other command): then returns that
/// one and writes nothing.
pub(crate) fn record_applied(
    tx: &Transaction<'_>,
    applied: &Applied<'_>,
) -> rusqlite::Result<Option<(i64, String)>> {
    let recorded = tx.execute(
        "INSERT INTO rf_lifecycle_applied \
         (interface, version, generation, command, applied_at) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (interface, version) DO UPDATE SET generation = excluded.generation, \
         command = excluded.command, applied_at = excluded.applied_at \
         WHERE rf_lifecycle_applied.generation < excluded.generation \
         OR (rf_lifecycle_applied.generation = excluded.generation \
             AND rf_lifecycle_applied.command = excluded.command)",
        params![
            applied.interface,
            applied.version,
            applied.generation,
            applied.command,
            applied.at
        ],
    )?;
    if recorded > 0 {
        return Ok(None);
    }
    // The conflict that wrote nothing was on this row: it exists.
    tx.query_row(
        "SELECT generation, command FROM rf_lifecycle_applied WHERE interface = ?1 AND version = ?2",
        params![applied.interface, applied.version],
        |row| Ok(Some((row.get(0)?, row.get(1)?))),
    )
}

/// Marks the version decommissioned (kept if it was) and holds its pending
/// outbox rows: (decommissioned at, rows held).
pub(crate) fn hold_version(
    tx: &Transaction<'_>,
    interface: &str,
    version: u32,
    now: i64,
    reason: &str,
) -> rusqlite::Result<(i64, u64)> {
    tx.execute(
        "INSERT INTO rf_decommissioned (interface, version, decommissioned_at) \
         VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
        params![interface, version, now],
    )?;
    let at: i64 = tx.query_row(
        "SELECT decommissioned_at FROM rf_decommissioned WHERE interface = ?1 AND version = ?2",
        params![interface, version],
        |row| row.get(0),
    )?;
    let held = tx.execute(
        "UPDATE outbox_messages SET next_retry_at = ?3, last_error = ?4 \
         WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
         AND interface = ?1 AND version = ?2 AND next_retry_at < ?3",
        params![interface, version, HELD_DUE_MS, reason],
    )?;
    Ok((at, held as u64))
}

/// Re-commissions the version and releases its held rows, due now and with
/// their expiry moved by the time they were held: rows released.
pub(crate) fn release_version(
    tx: &Transaction<'_>,
    interface: &str,
    version: u32,
    now: i64,
    reason: &str,
) -> rusqlite::Result<u64> {
    let since: Option<i64> = tx
        .query_row(
            "DELETE FROM rf_decommissioned WHERE interface = ?1 AND version = ?2 \
             RETURNING decommissioned_at",
            params![interface, version],
            |row| row.get(0),
        )
        .optional()?;
    let shift = since.map_or(0, |since| (now - since).max(0));
    let released = tx.execute(
        "UPDATE outbox_messages SET next_retry_at = ?3, expires_at = expires_at + ?4, \
         last_error = ?5 \
         WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
         AND interface = ?1 AND version = ?2 AND next_retry_at >= ?6",
        params![interface, version, now, shift, reason, HELD_DUE_MS],
    )?;
    Ok(released as u64)
}
