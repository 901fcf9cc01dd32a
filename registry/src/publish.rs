//! `PUT /v1/interfaces/{interface}/v{version}`: publishing a manifest, and
//! the request checks it shares with other routes: [`verified_manifest`]
//! (also the dry run, `POST /v1/compatibility/…`), [`read_body`] (every
//! bounded body read, the directory's too) and [`version_of`] (the one
//! canonical `v2` path segment).
//!
//! Never: stores a refused manifest, or echoes a hostile value in full.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rfidl_contract::manifest::Manifest;
use rfidl_contract::validate::shown;

use crate::{ApiError, BODY_LIMIT, Shared, access, authorize, now_ms, store, with_db};

/// `PUT /v1/interfaces/{interface}/v{version}`: 201 for a new revision,
/// 200 for one stored already (the order of checks: the crate docs).
pub(crate) async fn publish(
    State(shared): State<Arc<Shared>>,
    UrlPath((interface, version)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers, access::Access::Publish)?;
    let manifest = verified_manifest(&interface, &version, body).await?;
    let published = with_db(&shared, move |conn| {
        store::publish(conn, &manifest, now_ms()).map_err(|error| match error {
            store::PublishError::Breaking(changes) => ApiError::BreakingChange {
                interface: manifest.interface.clone(),
                version: manifest.version,
                changes,
            },
            store::PublishError::Invalid(problems) => ApiError::ManifestRejected(problems),
            other => ApiError::Unavailable(other.to_string()),
        })
    })
    .await?;
    let status = if published.created {
        tracing::info!(
            interface = %published.interface,
            version = published.version,
            revision = published.revision,
            fingerprint = %published.fingerprint,
            "published"
        );
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(published)).into_response())
}

/// Reads a request body of at most `limit` bytes: 413 over it, 408
/// `body_timeout` when it does not arrive within the server's body read
/// timeout (`rfidl_runtime::serve`), 400 when the connection fails.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::PayloadTooLarge)
        }
        Err(error) if rfidl_runtime::serve::is_body_timeout(&*error) => Err(ApiError::BodyTimeout),
        Err(error) => Err(ApiError::BadRequest(format!(
            "cannot read the request body: {error}"
        ))),
    }
}

/// The checks of a publish after the token, in order: body size, a
/// manifest, the one the path names, its fingerprint matches its content,
/// a manifest a contract could produce (`rfidl_contract::validate`). A dry run
/// (`POST /v1/compatibility/…`) makes the same ones. Messages never echo a
/// hostile value in full (serde quotes what it could not read; names can be
/// a megabyte long).
pub(crate) async fn verified_manifest(
    interface: &str,
    version: &str,
    body: Body,
) -> Result<Manifest, ApiError> {
    let body = read_body(body, BODY_LIMIT).await?;
    let version = version_of(version)?;
    let manifest: Manifest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::InvalidManifest(cut(&e.to_string())))?;
    if manifest.interface != interface || manifest.version != version {
        return Err(ApiError::PathMismatch {
            path: format!("{} v{version}", shown(interface)),
            manifest: format!("{} v{}", shown(&manifest.interface), manifest.version),
        });
    }
    let computed = manifest.compute_fingerprint();
    if manifest.fingerprint != computed {
        return Err(ApiError::FingerprintMismatch {
            stated: shown(&manifest.fingerprint),
            computed,
        });
    }
    manifest.validate().map_err(ApiError::ManifestRejected)?;
    Ok(manifest)
}

/// At most 300 characters of `text`, marked when cut.
fn cut(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}… ({} bytes)", &text[..at], text.len()),
        None => text.to_owned(),
    }
}

/// `v2` -> 2.
/// Only the canonical form: `v+2` and `v02` are refused, so one version has
/// one URL.
pub(crate) fn version_of(segment: &str) -> Result<u32, ApiError> {
    segment
        .strip_prefix('v')
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ApiError::BadRequest(format!("`{segment}` is not a version like `v2`")))
}
