//! `POST /_rf/backup`: an on-demand backup of the service's SQLite file
//! ([`crate::backup`]), answered with the file's name and size once it is
//! written.
//!
//! Behind the ops token like the retries (403 `token_required` without
//! one). It takes no query and no body: anything there is 400
//! `bad_request` and nothing is written. One backup at a time: 409
//! `backup_running` while one (scheduled or on demand) is being written.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use serde::Serialize;

use super::DiagnosticsError;
use super::routes::Shared;
use crate::backup::BackupError;

/// The answer: the backup written.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BackupTaken {
    /// The file's name in the backup folder.
    file: String,
    size_bytes: u64,
    /// RFC 3339, UTC: the backup holds every transaction committed before.
    taken_at: String,
    elapsed_ms: u64,
    /// Older backups deleted after it (`backup.keep`).
    rotated: usize,
}

pub(super) async fn serve_backup(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Json<BackupTaken>, DiagnosticsError> {
    if query.is_some_and(|query| !query.is_empty()) {
        return Err(DiagnosticsError::BadRequest(
            "POST /_rf/backup takes no query parameters".to_owned(),
        ));
    }
    if !body.is_empty() {
        return Err(DiagnosticsError::BadRequest(
            "POST /_rf/backup takes no body".to_owned(),
        ));
    }
    let Some(backups) = shared.backups.clone() else {
        return Err(DiagnosticsError::BackupNotConfigured);
    };
    if backups.is_running() {
        return Err(DiagnosticsError::BackupRunning);
    }
    let file = tokio::task::spawn_blocking(move || backups.run())
        .await
        .map_err(|error| DiagnosticsError::BackupFailed(error.to_string()))?
        .map_err(|error| match error {
            BackupError::Running => DiagnosticsError::BackupRunning,
            other => DiagnosticsError::BackupFailed(other.to_string()),
        })?;
    tracing::info!(file = %file.name, "backup taken on demand by an operator");
    Ok(Json(BackupTaken {
        file: file.name,
        size_bytes: file.size,
        taken_at: file.taken_at.to_string(),
        elapsed_ms: file.elapsed.as_millis() as u64,
        rotated: file.rotated,
    }))
}
