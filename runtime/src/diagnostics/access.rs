//! Who may call the diagnostics routes: the bearer token on every route
//! (the check shared with the registry, [`crate::auth`]) and the refusal of
//! the routes that change state when no token is configured.
//!
//! Middleware only: it never reads the database or shapes an answer beyond
//! the refusal.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::DiagnosticsError;
use super::routes::Shared;

pub(super) async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    // The check shared with the registry (`crate::auth`). Without a token,
    // the read-only routes answer (serve them on an internal address); the
    // ones that change state refuse (`require_token_for_changes`).
    if let Some(token) = &shared.token
        && !crate::auth::authorized(request.headers(), token)
    {
        return DiagnosticsError::Unauthorized.into_response();
    }
    next.run(request).await
}

/// On the routes that change state (the manual retries): a `POST` without a
/// configured token is refused with 403 `token_required`. Other methods
/// there get the JSON 405 as anywhere else.
pub(super) async fn require_token_for_changes(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if shared.token.is_none() && *request.method() == Method::POST {
        return DiagnosticsError::TokenRequired.into_response();
    }
    next.run(request).await
}
