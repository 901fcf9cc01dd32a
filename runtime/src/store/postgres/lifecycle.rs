//! The lifecycle's statements on PostgreSQL (see the SQLite file beside
//! `store/sqlite/lifecycle.rs` for what each does). The row lock of
//! `rf_lifecycle_applied` orders two replicas applying commands of one
//! version at once.

use postgres::{GenericClient, Transaction};

use crate::lifecycle::{Applied, HELD_DUE_MS};

/// The rows of `rf_decommissioned`: (interface, version, decommissioned at).
pub(crate) fn read(
    client: &mut impl GenericClient,
) -> Result<Vec<(String, u32, i64)>, postgres::Error> {
    Ok(client
        .query(
            "SELECT interface, version, decommissioned_at FROM rf_decommissioned",
            &[],
        )?
        .into_iter()
        .map(|row| {
            let version: i64 = row.get(1);
            (
                row.get(0),
                u32::try_from(version).unwrap_or(u32::MAX),
                row.get(2),
            )
        })
        .collect())
}

pub(crate) fn record_applied(
    tx: &mut Transaction<'_>,
    applied: &Applied<'_>,
) -> Result<Option<(i64, String)>, postgres::Error> {
    let version = i64::from(applied.version);
    let recorded = tx.execute(
        "INSERT INTO rf_lifecycle_applied \
         (interface, version, generation, command, applied_at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (interface, version) DO UPDATE SET generation = excluded.generation, \
         command = excluded.command, applied_at = excluded.applied_at \
         WHERE rf_lifecycle_applied.generation < excluded.generation \
         OR (rf_lifecycle_applied.generation = excluded.generation \
             AND rf_lifecycle_applied.command = excluded.command)",
        &[
            &applied.interface,
            &version,
            &applied.generation,
            &applied.command,
            &applied.at,
        ],
    )?;
    if recorded > 0 {
        return Ok(None);
    }
    // The conflict that wrote nothing was on this row: it exists.
    let row = tx.query_one(
        "SELECT generation, command FROM rf_lifecycle_applied \
         WHERE interface = $1 AND version = $2",
        &[&applied.interface, &version],
    )?;
    Ok(Some((row.get(0), row.get(1))))
}

pub(crate) fn hold_version(
    tx: &mut Transaction<'_>,
    interface: &str,
    version: u32,
    now: i64,
    reason: &str,
) -> Result<(i64, u64), postgres::Error> {
    let version = i64::from(version);
    tx.execute(
        "INSERT INTO rf_decommissioned (interface, version, decommissioned_at) \
         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        &[&interface, &version, &now],
    )?;
    let at: i64 = tx
        .query_one(
            "SELECT decommissioned_at FROM rf_decommissioned \
             WHERE interface = $1 AND version = $2",
            &[&interface, &version],
        )?
        .get(0);
    let held = tx.execute(
        "UPDATE outbox_messages SET next_retry_at = $3, last_error = $4 \
         WHERE status = 'Pending' AND interface = $1 AND version = $2 \
         AND next_retry_at < $3",
        &[&interface, &version, &HELD_DUE_MS, &reason],
    )?;
    Ok((at, held))
}

pub(crate) fn release_version(
    tx: &mut Transaction<'_>,
    interface: &str,
    version: u32,
    now: i64,
    reason: &str,
) -> Result<u64, postgres::Error> {
    let version = i64::from(version);
    let since: Option<i64> = tx
        .query_opt(
            "DELETE FROM rf_decommissioned WHERE interface = $1 AND version = $2 \
             RETURNING decommissioned_at",
            &[&interface, &version],
        )?
        .map(|row| row.get(0));
    let shift = since.map_or(0, |since| (now - since).max(0));
    tx.execute(
        "UPDATE outbox_messages SET next_retry_at = $3, expires_at = expires_at + $4, \
         last_error = $5 \
         WHERE status = 'Pending' AND interface = $1 AND version = $2 \
         AND next_retry_at >= $6",
        &[&interface, &version, &now, &shift, &reason, &HELD_DUE_MS],
    )
}
