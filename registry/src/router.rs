//! The route table of [`Registry::router`]: every path and method of the
//! HTTP API (`docs/registry.md`) and the module whose handler answers it,
//! and the answers for everything else (404 `not_found`, 405
//! `method_not_allowed`).
//!
//! Never: holds a handler beyond the liveness probe and the fallbacks.

use axum::extract::OriginalUri;
use axum::http::Method;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};

use crate::{ApiError, Registry, dashboard, decommission, directory, failures, publish, routes};

impl Registry {
    /// The HTTP API.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/health", get(health).fallback(method_not_allowed))
            .route("/livez", get(health).fallback(method_not_allowed))
            .route("/readyz", get(routes::readyz).fallback(method_not_allowed))
            .route(
                "/v1/interfaces",
                get(routes::list).fallback(method_not_allowed),
            )
            .route(
                "/v1/interfaces/{interface}",
                get(routes::versions).fallback(method_not_allowed),
            )
            .route(
                "/v1/compatibility/interfaces/{interface}/{version}",
                post(routes::compatibility).fallback(method_not_allowed),
            )
            .route(
                "/v1/interfaces/{interface}/{version}",
                get(routes::latest)
                    .put(publish::publish)
                    .fallback(method_not_allowed),
            )
            .route(
                "/v1/interfaces/{interface}/{version}/{fingerprint}",
                get(routes::exact).fallback(method_not_allowed),
            )
            .route(
                "/v1/services",
                get(directory::serve_services).fallback(method_not_allowed),
            )
            .route(
                "/v1/services/{service}/instances",
                post(directory::serve_register).fallback(method_not_allowed),
            )
            .route(
                "/v1/services/{service}/instances/{instance}",
                delete(directory::serve_deregister).fallback(method_not_allowed),
            )
            .route(
                "/v1/services/{service}/instances/{instance}/heartbeat",
                put(directory::serve_heartbeat).fallback(method_not_allowed),
            )
            .route(
                "/v1/decommissioned",
                get(decommission::serve_list).fallback(method_not_allowed),
            )
            .route(
                "/v1/decommissioned/{interface}/{version}",
                put(decommission::serve_decommission)
                    .delete(decommission::serve_recommission)
                    .fallback(method_not_allowed),
            )
            .route(
                "/v1/deploy-check",
                post(directory::serve_deploy_check).fallback(method_not_allowed),
            )
            .route("/", get(dashboard::serve).fallback(method_not_allowed))
            .route(
                "/instances/{instance}/failed",
                get(dashboard::serve_failed).fallback(method_not_allowed),
            )
            .route(
                "/dashboard/sign-in",
                get(failures::serve_sign_in_page)
                    .post(failures::serve_sign_in)
                    .fallback(method_not_allowed),
            )
            .route(
                "/dashboard/sign-out",
                post(failures::serve_sign_out).fallback(method_not_allowed),
            )
            .route(
                "/services/{service}/failures",
                get(failures::serve_page).fallback(method_not_allowed),
            )
            .route(
                "/services/{service}/failures/{action}",
                post(failures::serve_action).fallback(method_not_allowed),
            )
            .fallback(not_found)
            .with_state(self.shared())
    }
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn not_found(OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {}; the API is under /v1/interfaces (docs/registry.md)",
        uri.path()
    ))
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}
