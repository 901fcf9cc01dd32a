//! The service directory: which instance of which service runs where, the
//! interface versions it hosts and the ones it calls, and when it was last
//! seen (`docs/registry.md`, "Service directory").
//!
//! An instance is keyed by its service id and base URL; its id is the first
//! 16 hex digits of SHA-256(`service`, NUL, `base URL`), so a restarted
//! instance registers again under the same id. A registration replaces the
//! instance's interface lists (one `IMMEDIATE` transaction) and is refused,
//! with nothing stored, when it hosts a version or revision that is not
//! published (422 `unknown_interface`) or calls one that no active
//! registered provider ([`crate::liveness`]) hosts in the locked or a later
//! revision (409
//! `unsatisfied_dependencies`, the manifest scan; `POST /v1/deploy-check`
//! runs the same scan without registering).
//!
//! An instance is bound to the credential that first registered it
//! (`instance_owners`, the SHA-256 of the credential): a registration or
//! heartbeat of it with another credential is refused (403
//! `instance_owned`), except an identical re-registration once the owner's
//! credential is retired (how credentials rotate). Each registration has a
//! digest (hosts, calls, diagnostics token) that the answer gives and every
//! heartbeat carries back: a heartbeat whose digest is not the stored one is
//! answered 409 `registration_changed`, and the runtime registers again.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::access::{Access, Registrant};
use crate::liveness::ActiveAt;
use crate::{ApiError, Shared, authorize, conditional, now_ms, with_db};

/// Largest registration or deploy-check body.
pub const REGISTRATION_LIMIT: usize = 256 * 1024;
/// Largest heartbeat body (`{"registrationDigest": "sha256:…"}`).
pub const HEARTBEAT_LIMIT: usize = 1024;

/// One interface version at one revision, by its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterfaceRef {
    /// `package.Service`, e.g. `hr.employees.EmpService`.
    pub interface: String,
    pub version: u32,
    /// `sha256:…` of the manifest revision.
    pub fingerprint: String,
}

/// The body of `POST /v1/services/{service}/instances`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registration {
    /// Where the instance serves its receiver and `/_rf/…` routes.
    pub base_url: String,
    /// The interface versions it provides.
    #[serde(default)]
    pub hosts: Vec<InterfaceRef>,
    /// The interface versions it sends to, at their locked fingerprints.
    #[serde(default)]
    pub calls: Vec<InterfaceRef>,
    /// The bearer token of its diagnostics routes, if it has one; the
    /// aggregator sends it. Stored, never served.
    #[serde(default)]
    pub diagnostics_token: Option<String>,
    /// How often it heartbeats, in milliseconds (100 to 3,600,000); it is
    /// gone after missing `--missed-heartbeats` of them
    /// ([`crate::liveness`]). Without it, the registry's
    /// `--heartbeat-interval`.
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
}

impl Registration {
    /// `sha256:<hex>` of what a registration says about the instance
    /// (hosts and calls, each sorted, and the diagnostics token): equal for
    /// equal registrations, whatever the order of the lists.
    pub fn digest(&self) -> String {
        fn sorted(list: &[InterfaceRef]) -> Vec<(&str, u32, &str)> {
            let mut list: Vec<(&str, u32, &str)> = list
                .iter()
                .map(|r| (r.interface.as_str(), r.version, r.fingerprint.as_str()))
                .collect();
            list.sort_unstable();
            list
        }
        let canonical = serde_json::json!([
            sorted(&self.hosts),
            sorted(&self.calls),
            self.diagnostics_token,
        ]);
        format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(canonical.to_string().as_bytes()))
        )
    }
}

/// The body of a heartbeat (optional: an empty body renews without the
/// check).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    /// The `registrationDigest` the registration was answered with.
    #[serde(default)]
    pub registration_digest: Option<String>,
}

/// The body of `POST /v1/deploy-check`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployCheck {
    pub calls: Vec<InterfaceRef>,
}

/// A called interface version that no active provider satisfies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unmet {
    pub interface: String,
    pub version: u32,
    pub fingerprint: String,
    /// `decommissioned`, `not_published`, `no_provider` or `older_provider`.
    pub reason: String,
    pub message: String,
}

/// The id of the instance of `service` at `base_url`.
pub fn instance_id(service: &str, base_url: &str) -> String {
    let mut hash = sha2::Sha256::new();
    hash.update(service.as_bytes());
    hash.update([0]);
    hash.update(base_url.as_bytes());
    hex::encode(&hash.finalize()[..8])
}

/// A service id: 1 to 128 of `A-Z a-z 0-9 . _ -`.
pub(crate) fn check_service(service: &str) -> Result<(), ApiError> {
    let ok = !service.is_empty()
        && service.len() <= 128
        && service
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "`{service}` is not a service id (1 to 128 of A-Z a-z 0-9 . _ -)"
        )))
    }
}

/// `http://host:port[/path]` without query or fragment, trailing `/` dropped.
fn normalise_base_url(text: &str) -> Result<String, ApiError> {
    let invalid = |why: &str| ApiError::InvalidRegistration(format!("baseUrl `{text}` {why}"));
    let url = reqwest::Url::parse(text).map_err(|e| invalid(&format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("is not http:// or https://"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(invalid("must not have a query, fragment or user name"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

async fn json_body<T: serde::de::DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let body: Bytes = crate::read_body(body, REGISTRATION_LIMIT).await?;
    serde_json::from_slice(&body).map_err(|e| ApiError::InvalidRegistration(e.to_string()))
}

/// The revision number of a published fingerprint.
fn revision_of(conn: &Connection, r: &InterfaceRef) -> rusqlite::Result<Option<u32>> {
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

/// What a registration stored.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registered {
    pub service: String,
    pub instance_id: String,
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

/// The last health check of an instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastHealth {
    /// The dashboard's colour: `healthy`, `warning` or `critical`.
    pub status: String,
    /// The service's own `/_rf/health` status; absent when unreachable.
    pub reported: Option<String>,
    pub checked_at: String,
    pub outbox_depth: Option<u64>,
    pub dead_letter: Option<u64>,
    pub attention: Option<u64>,
    pub oldest_pending_age_ms: Option<i64>,
    pub reasons: Vec<String>,
}

/// One instance in `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceEntry {
    pub instance_id: String,
    pub base_url: String,
    pub hosts: Vec<InterfaceRef>,
    pub calls: Vec<InterfaceRef>,
    pub registered_at: String,
    pub last_seen_at: String,
    /// Milliseconds since the Unix epoch, for the dashboard.
    #[serde(skip)]
    pub last_seen_ms: i64,
    /// True when it missed its heartbeats ([`crate::liveness`]): it no
    /// longer counts as a provider.
    pub gone: bool,
    /// `None` until the aggregator has checked it.
    pub health: Option<LastHealth>,
}

/// One service in `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntry {
    pub service: String,
    pub instances: Vec<InstanceEntry>,
}

/// Every service with its instances, sorted by service and base URL.
pub fn services(conn: &Connection, at: &ActiveAt) -> rusqlite::Result<Vec<ServiceEntry>> {
    let mut statement = conn.prepare(&format!(
        "SELECT instance_id, service, base_url, registered_at, last_seen_at, NOT {} \
         FROM instances ORDER BY service, base_url",
        at.sql("instances")
    ))?;
    let rows = statement
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, bool>(5)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut interfaces = conn.prepare(
        "SELECT role, interface, version, fingerprint FROM instance_interfaces \
         WHERE instance_id = ?1 ORDER BY interface, version",
    )?;
    let mut services: Vec<ServiceEntry> = Vec::new();
    for (id, service, base_url, registered, seen, gone) in rows {
        let (mut hosts, mut calls) = (Vec::new(), Vec::new());
        for row in interfaces.query_map(params![id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                InterfaceRef {
                    interface: row.get(1)?,
                    version: row.get(2)?,
                    fingerprint: row.get(3)?,
                },
            ))
        })? {
            let (role, r) = row?;
            if role == "hosts" {
                hosts.push(r);
            } else {
                calls.push(r);
            }
        }
        let entry = InstanceEntry {
            health: crate::aggregator::last_health(conn, &id)?,
            instance_id: id,
            base_url,
            hosts,
            calls,
            registered_at: crate::store::rfc3339(registered),
            last_seen_at: crate::store::rfc3339(seen),
            last_seen_ms: seen,
            gone,
        };
        match services.last_mut() {
            Some(last) if last.service == service => last.instances.push(entry),
            _ => services.push(ServiceEntry {
                service,
                instances: vec![entry],
            }),
        }
    }
    Ok(services)
}

/// `POST /v1/services/{service}/instances`: registers (or renews) an
/// instance; 201 when new, 200 when it was registered already.
pub(crate) async fn serve_register(
    State(shared): State<Arc<Shared>>,
    UrlPath(service): UrlPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let registrant = shared.credentials.registrant(&headers)?;
    check_service(&service)?;
    let registration: Registration = json_body(body).await?;
    let base_url = normalise_base_url(&registration.base_url)?;
    shared.networks.check_base_url(&base_url).await?;
    shared.limiter.take(&service)?;
    if registration
        .diagnostics_token
        .as_deref()
        .is_some_and(str::is_empty)
    {
        return Err(ApiError::InvalidRegistration(
            "diagnosticsToken is empty; leave it out when the service has none".into(),
        ));
    }
    if registration
        .heartbeat_ms
        .is_some_and(|ms| !crate::liveness::HEARTBEAT_MS_RANGE.contains(&ms))
    {
        return Err(ApiError::InvalidRegistration(format!(
            "heartbeatMs must be from {} to {} (milliseconds)",
            crate::liveness::HEARTBEAT_MS_RANGE.start(),
            crate::liveness::HEARTBEAT_MS_RANGE.end()
        )));
    }
    let credentials = shared.credentials.clone();
    let authority = shared.keys.clone();
    let at = shared.liveness.at(now_ms());
    let registered = with_db(&shared, move |conn| {
        let is_live = |owner: &str| credentials.is_live(owner);
        let owner = Owner {
            registrant: &registrant,
            is_live: &is_live,
        };
        // Before anything is stored: another credential's keys are refused.
        if authority.is_some() {
            crate::keys::KeyAuthority::check_owner(conn, &service, &registrant, &is_live)?;
        }
        let mut registered = register(conn, &service, &registration, &base_url, &owner, &at)?;
        if let Some(authority) = &authority {
            registered.keys =
                Some(authority.issue(conn, &service, &registrant, &is_live, at.now_ms)?);
        }
        // Hosted versions that are decommissioned: the new instance is told.
        let mut retired = Vec::new();
        for hosted in &registration.hosts {
            if crate::decommission::decommissioned_at(conn, &hosted.interface, hosted.version)?
                .is_some()
            {
                let generation =
                    crate::decommission::generation(conn, &hosted.interface, hosted.version)?;
                retired.push((hosted.interface.clone(), hosted.version, generation));
            }
        }
        Ok((registered, retired))
    })
    .await?;
    let (registered, retired) = registered;
    if let Some(commands) = &shared.commands {
        let target = crate::commands::Target {
            instance_id: registered.instance_id.clone(),
            base_url: registered.base_url.clone(),
        };
        for (interface, version, generation) in &retired {
            commands
                .send(
                    std::slice::from_ref(&target),
                    interface,
                    *version,
                    *generation,
                    rfidl_runtime::lifecycle::Command::Decommission,
                )
                .await
                .map_err(|e| {
                    ApiError::Unavailable(format!(
                        "registered, but the decommission command for {interface} v{version} \
                         could not be written ({e}); register again"
                    ))
                })?;
        }
    }
    tracing::info!(
        service = %registered.service,
        instance = %registered.instance_id,
        base_url = %registered.base_url,
        created = registered.created,
        "registered"
    );
    let status = if registered.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(registered)).into_response())
}

/// `PUT /v1/services/{service}/instances/{instance}/heartbeat`, with an
/// optional body `{"registrationDigest"}`.
pub(crate) async fn serve_heartbeat(
    State(shared): State<Arc<Shared>>,
    UrlPath((service, instance)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let registrant = shared.credentials.registrant(&headers)?;
    check_service(&service)?;
    let body: Bytes = crate::read_body(body, HEARTBEAT_LIMIT).await?;
    let beat: Heartbeat = if body.iter().all(u8::is_ascii_whitespace) {
        Heartbeat::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::InvalidRegistration(e.to_string()))?
    };
    let at = shared.liveness.at(now_ms());
    let now = at.now_ms;
    let credentials = shared.credentials.clone();
    let authority = shared.keys.clone();
    let (service, instance, keys) = with_db(&shared, move |conn| {
        heartbeat(
            conn,
            &service,
            &instance,
            &registrant,
            beat.registration_digest.as_deref(),
            &at,
        )?;
        // Renewed (and rotated when due) at every heartbeat.
        let keys = match &authority {
            Some(authority) => Some(authority.issue(
                conn,
                &service,
                &registrant,
                &|owner| credentials.is_live(owner),
                now,
            )?),
            None => None,
        };
        Ok((service, instance, keys))
    })
    .await?;
    let mut answer = serde_json::json!({
        "service": service,
        "instanceId": instance,
        "lastSeenAt": crate::store::rfc3339(now),
    });
    if let Some(keys) = keys {
        answer["keys"] = serde_json::to_value(keys)
            .map_err(|e| ApiError::Unavailable(format!("cannot encode the keys: {e}")))?;
    }
    Ok(Json(answer).into_response())
}

/// `DELETE /v1/services/{service}/instances/{instance}`: removes an instance
/// (a service moved or retired) with its interface lists and health
/// history; 204, or 404 `unknown_instance`.
pub(crate) async fn serve_deregister(
    State(shared): State<Arc<Shared>>,
    UrlPath((service, instance)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers, Access::Operator)?;
    check_service(&service)?;
    with_db(&shared, move |conn| {
        let removed = conn.execute(
            "DELETE FROM instances WHERE service = ?1 AND instance_id = ?2",
            params![service, instance],
        )?;
        if removed == 0 {
            return Err(ApiError::UnknownInstance(format!(
                "no instance `{instance}` of service `{service}` is registered"
            )));
        }
        tracing::info!(%service, %instance, "deregistered");
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/services`.
pub(crate) async fn serve_services(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let at = shared.liveness.at(now_ms());
    let services = with_db(&shared, move |conn| Ok(services(conn, &at)?)).await?;
    Ok(conditional::json_response(
        &headers,
        &serde_json::json!({ "services": services }),
    ))
}

/// `POST /v1/deploy-check`: the manifest scan of `calls`, storing nothing.
pub(crate) async fn serve_deploy_check(
    State(shared): State<Arc<Shared>>,
    body: Body,
) -> Result<Response, ApiError> {
    let check: DeployCheck = json_body(body).await?;
    let count = check.calls.len();
    let at = shared.liveness.at(now_ms());
    let unmet = with_db(&shared, move |conn| Ok(scan(conn, &check.calls, &at)?)).await?;
    if !unmet.is_empty() {
        return Err(ApiError::Unsatisfied(unmet));
    }
    Ok(Json(serde_json::json!({"satisfied": true, "checked": count})).into_response())
}
