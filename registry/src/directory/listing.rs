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
