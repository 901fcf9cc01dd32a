//! The manifest scan ([`scan`]): whether every interface version a
//! consumer calls has an active provider at its locked revision or a later
//! one, and why not (`decommissioned`, `not_published`, `no_provider`,
//! `older_provider`). A registration and `POST /v1/deploy-check` run it.
//!
//! Never: writes; it reads the directory as it is in the caller's
//! transaction.

use rusqlite::{Connection, OptionalExtension as _, params};

use super::{InterfaceRef, Unmet};
use crate::liveness::ActiveAt;

/// The revision number of a published fingerprint.
pub(super) fn revision_of(conn: &Connection, r: &InterfaceRef) -> rusqlite::Result<Option<u32>> {
    conn.query_row(
        "SELECT revision FROM manifests WHERE interface = ?1 AND version = ?2 AND fingerprint = ?3",
        params![r.interface, r.version, r.fingerprint],
        |row| row.get(0),
    )
    .optional()
}

/// The manifest scan: each of `calls` must be hosted by an active
/// registered instance ([`crate::liveness`]) at the locked revision or a
/// later one of the same version (a later revision only adds, so it is
/// compatible).
pub fn scan(
    conn: &Connection,
    calls: &[InterfaceRef],
    at: &ActiveAt,
) -> rusqlite::Result<Vec<Unmet>> {
    let mut unmet = Vec::new();
    for call in calls {
        let unmet_as = |reason: &str, message: String| Unmet {
            interface: call.interface.clone(),
            version: call.version,
            fingerprint: call.fingerprint.clone(),
            reason: reason.to_owned(),
            message,
        };
        let name = format!("`{}` v{}", call.interface, call.version);
        if let Some(at) =
            crate::decommission::decommissioned_at(conn, &call.interface, call.version)?
        {
            unmet.push(unmet_as(
                "decommissioned",
                format!(
                    "{name} was decommissioned at {}; move to a newer version (or \
                     `rfidl recommission` it)",
                    crate::store::rfc3339(at)
                ),
            ));
            continue;
        }
        let Some(locked) = revision_of(conn, call)? else {
            unmet.push(unmet_as(
                "not_published",
                format!(
                    "{name} has no published revision {}; publish it first",
                    call.fingerprint
                ),
            ));
            continue;
        };
        let hosted: Option<u32> = conn.query_row(
            &format!(
                "SELECT MAX(m.revision) FROM instance_interfaces ii JOIN manifests m \
                   ON m.interface = ii.interface AND m.version = ii.version \
                  AND m.fingerprint = ii.fingerprint \
                 JOIN instances i ON i.instance_id = ii.instance_id \
                 WHERE ii.role = 'hosts' AND ii.interface = ?1 AND ii.version = ?2 AND {}",
                at.sql("i")
            ),
            params![call.interface, call.version],
            |row| row.get(0),
        )?;
        match hosted {
            None => {
                let gone: i64 = conn.query_row(
                    "SELECT COUNT(DISTINCT instance_id) FROM instance_interfaces \
                     WHERE role = 'hosts' AND interface = ?1 AND version = ?2",
                    params![call.interface, call.version],
                    |row| row.get(0),
                )?;
                let message = if gone == 0 {
                    format!("no registered service hosts {name}")
                } else {
                    format!(
                        "no active service hosts {name}: its {gone} registered provider \
                         instance(s) missed their heartbeats (gone)"
                    )
                };
                unmet.push(unmet_as("no_provider", message));
            }
            Some(best) if best < locked => unmet.push(unmet_as(
                "older_provider",
                format!(
                    "{name}: the newest hosted revision is {best}, older than the locked \
                     revision {locked}"
                ),
            )),
            Some(_) => {}
        }
    }
    Ok(unmet)
}
