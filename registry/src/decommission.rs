//! Decommissioned interface versions (plan §6.2): an operator retires
//! `interface` `v{version}` with `PUT /v1/decommissioned/{interface}/v{version}`
//! (`rfidl decommission`) and brings it back with `DELETE` on the same path
//! (`rfidl recommission`). The manifest scan treats a decommissioned
//! version as provided by nobody, so a registration or deploy check of a
//! consumer that calls it is refused (409, reason `decommissioned`).
//! Published revisions stay stored and readable.
//!
//! Every change of a version's state gives it a new **generation**
//! (`lifecycle_generations`, written in the change's transaction), which
//! every command for it carries: a provider refuses a command older than
//! the state it holds (`stale_command`), so a captured `Decommission`
//! cannot undo a later re-commission. The next generation is the larger
//! of the last one plus 1 and the time in ms: it grows also after the
//! database is restored from an older backup.

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
    /// The interface, `package.Service`.
    pub interface: String,
    /// The retired interface version (the `N` of `vN`).
    pub version: u32,
    /// When it was decommissioned, RFC 3339 (UTC).
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

/// The generation of `interface` `version`'s lifecycle: 0 when it was
/// never decommissioned.
pub fn generation(conn: &Connection, interface: &str, version: u32) -> rusqlite::Result<u64> {
    let generation: Option<i64> = conn
        .query_row(
            "SELECT generation FROM lifecycle_generations WHERE interface = ?1 AND version = ?2",
            params![interface, version],
            |row| row.get(0),
        )
        .optional()?;
    Ok(generation.map_or(0, |g| u64::try_from(g).unwrap_or(0)))
}

/// Marks (`on`) or unmarks a published version and moves its generation
/// on, in one transaction; 404 when it is not published. Returns whether
/// it is decommissioned now and since when, and the new generation.
fn set(
    conn: &mut Connection,
    interface: &str,
    version: u32,
    on: bool,
    now_ms: i64,
) -> Result<(Option<i64>, u64), ApiError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if store::latest(&tx, interface, version)?.is_none() {
        return Err(routes::missing(&tx, interface, version, None));
    }
    if on {
        tx.execute(
            "INSERT OR IGNORE INTO decommissioned (interface, version, decommissioned_at) \
             VALUES (?1, ?2, ?3)",
            params![interface, version, now_ms],
        )?;
    } else {
        tx.execute(
            "DELETE FROM decommissioned WHERE interface = ?1 AND version = ?2",
            params![interface, version],
        )?;
    }
    let generation: i64 = tx.query_row(
        "INSERT INTO lifecycle_generations (interface, version, generation) \
         VALUES (?1, ?2, MAX(?3, 1)) \
         ON CONFLICT (interface, version) DO UPDATE \
         SET generation = MAX(lifecycle_generations.generation + 1, excluded.generation) \
         RETURNING generation",
        params![interface, version, now_ms],
        |row| row.get(0),
    )?;
    let at = decommissioned_at(&tx, interface, version)?;
    tx.commit()?;
    Ok((at, u64::try_from(generation).unwrap_or(0)))
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
    let (at, generation, providers) = with_db(&shared, move |conn| {
        let (at, generation) = set(conn, &name, version, on, now_ms())?;
        Ok((
            at,
            generation,
            crate::commands::providers(conn, &name, version)?,
        ))
    })
    .await?;
    tracing::info!(
        %interface,
        version,
        generation,
        decommissioned = on,
        "decommission state changed"
    );
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
                    generation,
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
            Some(
                providers
                    .into_iter()
                    .map(|target| target.base_url)
                    .collect::<Vec<_>>(),
            )
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
        "generation": generation,
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
