//! Writes of the directory: a registration ([`register`], one
//! `IMMEDIATE` transaction that replaces the instance's interface lists, or
//! stores nothing) and a heartbeat ([`heartbeat`]), each checked against
//! the credential the instance is bound to ([`Owner`]). An instance that
//! comes back after being gone is logged once.
//!
//! Never: touches an instance registered with another live credential.

use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use serde::Serialize;

use super::dependencies::{revision_of, scan};
use super::{Registration, instance_id};
use crate::ApiError;
use crate::access::Registrant;
use crate::liveness::ActiveAt;

/// What a registration stored.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registered {
    /// The service id of the path.
    pub service: String,
    /// The instance's id ([`super::instance_id`]): the same for every
    /// registration of this service at this base URL.
    pub instance_id: String,
    /// The base URL as stored (normalised: no trailing `/`).
    pub base_url: String,
    /// False when the instance was registered already (its lists replaced).
    pub created: bool,
    /// The registration's digest; heartbeats carry it back.
    pub registration_digest: String,
    /// The keys issued to this instance, when the registry issues keys
    /// ([`crate::keys`]); `Debug` shows counts only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<rfidl_runtime::keys::WireKeys>,
}

/// Who registers, for the binding of an instance to its credential.
pub struct Owner<'a> {
    /// The SHA-256 of the credential this request presented.
    pub registrant: &'a Registrant,
    /// Whether a stored owner's credential is still accepted.
    pub is_live: &'a dyn Fn(&str) -> bool,
}

/// The owner and registration digest stored for `id`, if any.
fn owner_of(conn: &Connection, id: &str) -> rusqlite::Result<Option<(String, String)>> {
    conn.query_row(
        "SELECT credential_sha256, registration_digest FROM instance_owners WHERE instance_id = ?1",
        params![id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
}

fn owned_elsewhere(service: &str, id: &str) -> ApiError {
    ApiError::InstanceOwned(format!(
        "instance `{id}` of service `{service}` was registered with another credential; \
         register it with that one, or have an operator delete it first \
         (DELETE /v1/services/{service}/instances/{id})"
    ))
}

/// Stores `registration` of `service` in one transaction, or refuses it
/// with nothing stored.
pub fn register(
    conn: &mut Connection,
    service: &str,
    registration: &Registration,
    base_url: &str,
    owner: &Owner<'_>,
    at: &ActiveAt,
) -> Result<Registered, ApiError> {
    let now_ms = at.now_ms;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let id = instance_id(service, base_url);
    let digest = registration.digest();
    // Before anything else: another credential's instance is not touched,
    // whatever the body (a hijack with `hosts: []` included).
    if let Some((stored_owner, stored_digest)) = owner_of(&tx, &id)?
        && stored_owner != owner.registrant.0
        && ((owner.is_live)(&stored_owner) || stored_digest != digest)
    {
        return Err(owned_elsewhere(service, &id));
    }
    let unknown: Vec<String> = registration
        .hosts
        .iter()
        .map(|r| Ok((r, revision_of(&tx, r)?)))
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .filter(|(_, revision)| revision.is_none())
        .map(|(r, _)| format!("`{}` v{} {}", r.interface, r.version, r.fingerprint))
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::UnknownInterface(format!(
            "hosted interface version(s) not published in this registry: {}",
            unknown.join(", ")
        )));
    }
    let unmet = scan(&tx, &registration.calls, at)?;
    if !unmet.is_empty() {
        return Err(ApiError::Unsatisfied(unmet));
    }
    let before = seen(&tx, "instance_id = ?1", params![id])?;
    let created = before.is_none();
    tx.execute(
        "INSERT INTO instances (instance_id, service, base_url, diagnostics_token, registered_at, \
         last_seen_at, heartbeat_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6) \
         ON CONFLICT (instance_id) DO UPDATE SET diagnostics_token = excluded.diagnostics_token, \
         last_seen_at = excluded.last_seen_at, heartbeat_ms = excluded.heartbeat_ms, \
         gone_at = NULL",
        params![
            id,
            service,
            base_url,
            registration.diagnostics_token,
            now_ms,
            registration.heartbeat_ms.map(|ms| ms as i64)
        ],
    )?;
    tx.execute(
        "INSERT INTO instance_owners (instance_id, credential_sha256, registration_digest) \
         VALUES (?1, ?2, ?3) ON CONFLICT (instance_id) DO UPDATE SET \
         credential_sha256 = excluded.credential_sha256, \
         registration_digest = excluded.registration_digest",
        params![id, owner.registrant.0, digest],
    )?;
    tx.execute(
        "DELETE FROM instance_interfaces WHERE instance_id = ?1",
        params![id],
    )?;
    for (role, list) in [
        ("hosts", &registration.hosts),
        ("calls", &registration.calls),
    ] {
        for r in list {
            tx.execute(
                "INSERT OR REPLACE INTO instance_interfaces \
                 (instance_id, role, interface, version, fingerprint) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, role, r.interface, r.version, r.fingerprint],
            )?;
        }
    }
    tx.commit()?;
    if let Some((last_seen, heartbeat_ms)) = before {
        log_return(service, &id, last_seen, heartbeat_ms, at);
    }
    Ok(Registered {
        service: service.to_owned(),
        instance_id: id,
        base_url: base_url.to_owned(),
        created,
        registration_digest: digest,
        keys: None,
    })
}

/// When an instance was last seen and the heartbeat interval it gave.
fn seen(
    conn: &Connection,
    condition: &str,
    values: impl rusqlite::Params,
) -> rusqlite::Result<Option<(i64, Option<i64>)>> {
    conn.query_row(
        &format!("SELECT last_seen_at, heartbeat_ms FROM instances WHERE {condition}"),
        values,
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
}

/// Logs, once, that an instance that was gone is back.
fn log_return(
    service: &str,
    instance: &str,
    last_seen: i64,
    heartbeat_ms: Option<i64>,
    at: &ActiveAt,
) {
    if !at.is_active(last_seen, heartbeat_ms) {
        tracing::info!(
            %service,
            %instance,
            last_seen_at = %crate::store::rfc3339(last_seen),
            "instance back: it counts as a provider again"
        );
    }
}

/// Marks the instance seen now (bringing back a gone one); 404
/// `unknown_instance` if it is not registered, 403 `instance_owned` if
/// another credential registered it, 409 `registration_changed` if `digest`
/// is not the stored registration's.
pub fn heartbeat(
    conn: &Connection,
    service: &str,
    instance: &str,
    registrant: &Registrant,
    digest: Option<&str>,
    at: &ActiveAt,
) -> Result<(), ApiError> {
    let stored = conn
        .query_row(
            "SELECT o.credential_sha256, o.registration_digest FROM instances i \
             JOIN instance_owners o ON o.instance_id = i.instance_id \
             WHERE i.service = ?1 AND i.instance_id = ?2",
            params![service, instance],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
        )
        .optional()?;
    if let Some((owner, stored_digest)) = stored {
        if owner != registrant.0 {
            return Err(owned_elsewhere(service, instance));
        }
        if digest.is_some_and(|d| d != stored_digest) {
            return Err(ApiError::RegistrationChanged(format!(
                "the registration stored for instance `{instance}` of service `{service}` is \
                 not the one this instance sent; register again \
                 (POST /v1/services/{service}/instances)"
            )));
        }
    }
    let before = seen(
        conn,
        "service = ?1 AND instance_id = ?2",
        params![service, instance],
    )?;
    let changed = conn.execute(
        "UPDATE instances SET last_seen_at = ?3, gone_at = NULL \
         WHERE service = ?1 AND instance_id = ?2",
        params![service, instance, at.now_ms],
    )?;
    if changed == 0 {
        return Err(ApiError::UnknownInstance(format!(
            "no instance `{instance}` of service `{service}` is registered; register it with \
             POST /v1/services/{service}/instances"
        )));
    }
    if let Some((last_seen, heartbeat_ms)) = before {
        log_return(service, instance, last_seen, heartbeat_ms, at);
    }
    Ok(())
}
