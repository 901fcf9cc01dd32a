//! Decommissioned interface versions (plan §6.2): an operator retires
//! `interface` `v{version}` with `PUT /v1/decommissioned/{interface}/v{version}`
//! (`rfidl decommission`) and brings it back with `DELETE` on the same path
//! (`rfidl recommission`). The manifest scan treats a decommissioned
//! version as provided by nobody, so a registration or deploy check of a
//! consumer that calls it is refused (409, reason `decommissioned`).
//! Published revisions stay stored and readable.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use rusqlite::{Connection, OptionalExtension as _, params};
use serde::Serialize;

use crate::{ApiError, Shared, authorize, conditional, now_ms, routes, store, version_of, with_db};

/// One decommissioned interface version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decommissioned {
    pub interface: String,
    pub version: u32,
    pub decommissioned_at: String,
}

/// When `interface` `version` was decommissioned, if it is.
pub fn decommissioned_at(
    conn: &Connection,
    interface: &str,
    version: u32,
) -> rusqlite::Result<Option<i64>> {
    conn.query_row(
        "SELECT decommissioned_at FROM decommissioned WHERE interface = ?1 AND version = ?2",
        params![interface, version],
        |row| row.get(0),
    )
    .optional()
}

/// Every decommissioned version, sorted.
pub fn list(conn: &Connection) -> rusqlite::Result<Vec<Decommissioned>> {
    let mut statement = conn.prepare(
        "SELECT interface, version, decommissioned_at FROM decommissioned \
         ORDER BY interface, version",
    )?;
    statement
        .query_map([], |row| {
            Ok(Decommissioned {
                interface: row.get(0)?,
                version: row.get(1)?,
                decommissioned_at: store::rfc3339(row.get(2)?),
            })
        })?
        .collect()
}

/// Marks (`on`) or unmarks a published version; 404 when it is not
/// published. Returns whether it is decommissioned now and since when.
fn set(
    conn: &Connection,
    interface: &str,
    version: u32,
    on: bool,
    now_ms: i64,
) -> Result<Option<i64>, ApiError> {
    if store::latest(conn, interface, version)?.is_none() {
        return Err(routes::missing(conn, interface, version, None));
    }
    if on {
        conn.execute(
            "INSERT OR IGNORE INTO decommissioned (interface, version, decommissioned_at) \
             VALUES (?1, ?2, ?3)",
            params![interface, version, now_ms],
        )?;
    } else {
        conn.execute(
            "DELETE FROM decommissioned WHERE interface = ?1 AND version = ?2",
            params![interface, version],
        )?;
    }
    Ok(decommissioned_at(conn, interface, version)?)
}

async fn serve_set(
    shared: Arc<Shared>,
    interface: String,
    version: String,
    headers: HeaderMap,
    on: bool,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers, crate::access::Access::Operator)?;
    let version = version_of(&version)?;
    let name = interface.clone();
    let (at, providers) = with_db(&shared, move |conn| {
        let at = set(conn, &name, version, on, now_ms())?;
        Ok((at, crate::commands::providers(conn, &name, version)?))
    })
    .await?;
    tracing::info!(%interface, version, decommissioned = on, "decommission state changed");
    // Every provider instance is told, also on a repeated request (the
    // command is idempotent there): repeating is how a failed write is
    // recovered.
    let notified = match &shared.commands {
        Some(commands) => {
            commands
                .send(
                    &providers,
                    &interface,
                    version,
                    if on {
                        rfidl_runtime::lifecycle::Command::Decommission
                    } else {
                        rfidl_runtime::lifecycle::Command::Recommission
                    },
                )
                .await
                .map_err(|e| {
                    ApiError::Unavailable(format!(
                        "the decommission state is stored, but its commands to the providers \
                         could not be written ({e}); repeat the request"
                    ))
                })?;
            Some(providers)
        }
        None => {
            tracing::warn!(
                %interface,
                version,
                "no command secret configured: the providers are not told"
            );
            None
        }
    };
    Ok(Json(serde_json::json!({
        "interface": interface,
        "version": version,
        "decommissioned": at.is_some(),
        "decommissionedAt": at.map(store::rfc3339),
        "commandsSentTo": notified,
    }))
    .into_response())
}

/// `PUT /v1/decommissioned/{interface}/v{version}`.
pub(crate) async fn serve_decommission(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    serve_set(shared, interface, version, headers, true).await
}

/// `DELETE /v1/decommissioned/{interface}/v{version}`: re-commission.
pub(crate) async fn serve_recommission(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    serve_set(shared, interface, version, headers, false).await
}

/// `GET /v1/decommissioned`.
pub(crate) async fn serve_list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let list = with_db(&shared, |conn| Ok(list(conn)?)).await?;
    Ok(conditional::json_response(
        &headers,
        &serde_json::json!({ "decommissioned": list }),
    ))
}
