//! The probes: `GET /_rf/livez` (the process answers) and `GET /_rf/readyz`
//! (the database takes a write transaction, its schema is current, and the
//! dispatcher and the registered workers run), answered within a bound.
//!
//! No token and no data: a probe never shows outbox contents, and never
//! waits on the connection the other diagnostics routes use.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::routes::Shared;

/// `GET /_rf/readyz`: every check by name, `"ok"` or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: &'static str,
    /// The names of the checks that failed.
    pub failed: Vec<String>,
    /// Every check by name (`database`, `dispatcher` when an outbox is
    /// watched, and each registered background worker): `"ok"`, or why not
    /// (`"stopped"`, `"not started"`, the database error).
    pub checks: BTreeMap<String, String>,
}

impl Readiness {
    /// True when every check passed.
    pub fn is_ready(&self) -> bool {
        self.failed.is_empty()
    }
}

pub(super) async fn serve_livez() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "alive" }))
}

pub(super) async fn serve_readyz(State(shared): State<Arc<Shared>>) -> Response {
    let probe = Arc::clone(&shared);
    let checked = tokio::task::spawn_blocking(move || {
        let conn = probe
            .ready_conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        conn.database_checks()
    });
    // The store bounds each step by the readiness timeout; this bounds the
    // whole (a connection that hangs without an error, a probe queued
    // behind one that does).
    let limit = shared
        .readiness_timeout
        .saturating_mul(3)
        .saturating_add(Duration::from_secs(1));
    let mut checks = match tokio::time::timeout(limit, checked).await {
        Ok(Ok(checks)) => checks,
        Ok(Err(error)) => BTreeMap::from([("database".to_owned(), error.to_string())]),
        Err(_) => BTreeMap::from([(
            "database".to_owned(),
            format!(
                "no answer within {}",
                crate::duration::format_duration(limit)
            ),
        )]),
    };
    if let Some(outbox) = &shared.outbox {
        let dispatcher = match outbox.dispatcher_liveness() {
            None => "not started".to_owned(),
            Some(liveness) if liveness.is_alive() => "ok".to_owned(),
            Some(_) => "stopped".to_owned(),
        };
        checks.insert("dispatcher".to_owned(), dispatcher);
    }
    for (name, liveness) in &shared.workers {
        let state = if liveness.is_alive() { "ok" } else { "stopped" };
        checks.insert(name.clone(), state.to_owned());
    }
    let failed: Vec<String> = checks
        .iter()
        .filter(|(_, state)| state.as_str() != "ok")
        .map(|(name, _)| name.clone())
        .collect();
    let readiness = Readiness {
        status: if failed.is_empty() {
            "ready"
        } else {
            "not_ready"
        },
        failed,
        checks,
    };
    let status = if readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness)).into_response()
}
