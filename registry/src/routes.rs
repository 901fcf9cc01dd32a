//! The read routes of manifests: the list of interfaces, an interface's
//! versions and revisions, one manifest (its latest or an exact revision,
//! with its `ETag` and cache headers), the dry-run compatibility check, the
//! readiness probe, and the 404 messages that say what exists instead.
//!
//! Never: writes to the database (the readiness probe opens a write
//! transaction and rolls it back).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rusqlite::Connection;

use crate::{ApiError, Shared, conditional, store, verified_manifest, version_of, with_db};

/// How long `/readyz` waits for another writer before it answers 503.
const READY_BUSY: Duration = Duration::from_millis(250);

/// `GET /readyz`: 200 `{"status": "ready"}` when a write transaction on the
/// database succeeds and its schema version is this build's; 503
/// `{"status": "not_ready", "reason": …}` otherwise.
pub(crate) async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    match with_db(&shared, |conn| Ok(store::readiness(conn, READY_BUSY))).await {
        Ok(Ok(())) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Ok(Err(reason)) | Err(ApiError::Unavailable(reason)) => {
            tracing::warn!(%reason, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"status": "not_ready", "reason": reason})),
            )
                .into_response()
        }
        Err(other) => other.into_response(),
    }
}

/// `GET /v1/interfaces/{interface}`: its versions, each with every revision
/// (fingerprint, publish time), oldest first.
pub(crate) async fn versions(
    State(shared): State<Arc<Shared>>,
    UrlPath(interface): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (interface, versions) = with_db(&shared, move |conn| {
        let versions = store::versions(conn, &interface)?;
        if versions.is_empty() {
            return Err(missing(conn, &interface, 0, None));
        }
        Ok((interface, versions))
    })
    .await?;
    Ok(conditional::json_response(
        &headers,
        &serde_json::json!({"interface": interface, "versions": versions}),
    ))
}

/// `GET /v1/interfaces`: every published interface.
pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let interfaces = with_db(&shared, |conn| Ok(store::list(conn)?)).await?;
    Ok(conditional::json_response(
        &headers,
        &serde_json::json!({ "interfaces": interfaces }),
    ))
}

/// A manifest with `ETag: "<fingerprint>"`, or 304 if the client has it.
/// An exact revision never changes, so it may be cached for a year; the
/// latest revision must be revalidated.
fn manifest_response(
    headers: &HeaderMap,
    text: String,
    fingerprint: &str,
    immutable: bool,
) -> Response {
    let etag = format!("\"{fingerprint}\"");
    let cache_control = if immutable {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    if conditional::none_match(headers, &etag) {
        return conditional::not_modified(&etag, Some(cache_control));
    }
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, cache_control.to_owned()),
        ],
        text,
    )
        .into_response()
}

/// `GET /v1/interfaces/{interface}/v{version}`: its latest revision.
pub(crate) async fn latest(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let version = version_of(&version)?;
    let found = with_db(&shared, move |conn| {
        match store::latest(conn, &interface, version)? {
            Some(found) => Ok(found),
            None => Err(missing(conn, &interface, version, None)),
        }
    })
    .await?;
    let (text, fingerprint) = found;
    Ok(manifest_response(&headers, text, &fingerprint, false))
}

/// `GET /v1/interfaces/{interface}/v{version}/{fingerprint}`: one
/// revision.
pub(crate) async fn exact(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version, fingerprint)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let version = version_of(&version)?;
    let wanted = fingerprint.clone();
    let text = with_db(&shared, move |conn| {
        match store::exact(conn, &interface, version, &wanted)? {
            Some(text) => Ok(text),
            None => Err(missing(conn, &interface, version, Some(&wanted))),
        }
    })
    .await?;
    Ok(manifest_response(&headers, text, &fingerprint, true))
}

/// `POST /v1/compatibility/interfaces/{interface}/v{version}`: would this
/// manifest be accepted as the next revision? The checks of a publish,
/// without the token (nothing is stored); 200 `{"compatible", "changes",
/// "against"}`.
pub(crate) async fn compatibility(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let manifest = verified_manifest(&interface, &version, body).await?;
    let answer = with_db(&shared, move |conn| {
        store::compatibility(conn, &manifest).map_err(|e| ApiError::Unavailable(e.to_string()))
    })
    .await?;
    Ok(Json(answer).into_response())
}

/// The 404 for `interface` (`version` 0: the interface as a whole), `v
/// version` or one revision of it, saying what is published instead.
pub(crate) fn missing(
    conn: &Connection,
    interface: &str,
    version: u32,
    fingerprint: Option<&str>,
) -> ApiError {
    let versions = match store::versions(conn, interface) {
        Ok(versions) => versions,
        Err(error) => return error.into(),
    };
    if versions.is_empty() {
        let names = match store::interface_names(conn) {
            Ok(names) => names,
            Err(error) => return error.into(),
        };
        let hint =
            rfidl_contract::diagnostics::suggest(interface, names.iter().map(String::as_str))
                .map(|close| format!("; did you mean `{close}`?"))
                .unwrap_or_default();
        return ApiError::NotFound(format!("interface `{interface}` is not published{hint}"));
    }
    let Some(found) = versions.iter().find(|v| v.version == version) else {
        let published: Vec<String> = versions.iter().map(|v| format!("v{}", v.version)).collect();
        return ApiError::NotFound(format!(
            "`{interface}` v{version} is not published; its published versions are {}",
            published.join(", ")
        ));
    };
    let latest = found.revisions.last().expect("a version has a revision");
    ApiError::NotFound(format!(
        "`{interface}` v{version} has no revision with fingerprint `{}`; it has {} revision{}, \
         the latest is {}",
        fingerprint.unwrap_or_default(),
        found.revisions.len(),
        if found.revisions.len() == 1 { "" } else { "s" },
        latest.fingerprint
    ))
}
