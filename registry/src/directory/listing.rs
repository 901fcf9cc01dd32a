//! `GET /v1/services` as data: every registered instance, grouped by
//! service, with its interface lists, when it was last seen, whether it is
//! gone ([`crate::liveness`]) and its last health check ([`LastHealth`]).
//!
//! Never: writes, or shows an instance's diagnostics token.

use rusqlite::{Connection, params};
use serde::Serialize;

use super::InterfaceRef;
use crate::liveness::ActiveAt;

/// The last health check of an instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastHealth {
    /// The dashboard's colour: `healthy`, `warning` or `critical`.
    pub status: String,
    /// The service's own `/_rf/health` status; absent when unreachable.
    pub reported: Option<String>,
    /// When it was checked, RFC 3339 (UTC).
    pub checked_at: String,
    /// Messages pending or sending in its outbox; absent when unreachable.
    pub outbox_depth: Option<u64>,
    /// Dead-lettered messages; absent when unreachable.
    pub dead_letter: Option<u64>,
    /// Messages that need a human: failed, dead-lettered and expired;
    /// absent when unreachable.
    pub attention: Option<u64>,
    /// Age in milliseconds of the oldest pending or sending message;
    /// absent when there is none or it was unreachable.
    pub oldest_pending_age_ms: Option<i64>,
    /// Why it has its colour (bounded, [`crate::aggregator::judge`]); a
    /// failure is one generic reason, never its precise cause.
    pub reasons: Vec<String>,
}

/// One instance in `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceEntry {
    /// Its id ([`super::instance_id`]).
    pub instance_id: String,
    /// Where it serves, as registered.
    pub base_url: String,
    /// The interface versions it provides, by interface and version.
    pub hosts: Vec<InterfaceRef>,
    /// The interface versions it sends to, at their locked revisions.
    pub calls: Vec<InterfaceRef>,
    /// When it first registered, RFC 3339 (UTC).
    pub registered_at: String,
    /// When it last registered or heartbeated, RFC 3339 (UTC).
    pub last_seen_at: String,
    /// `last_seen_at` in milliseconds since the Unix epoch, for the
    /// dashboard; not serialised.
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
    /// The service id.
    pub service: String,
    /// Its registered instances, by base URL; gone ones included.
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
