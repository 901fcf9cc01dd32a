//! Regression tests for what the hostile-input fuzz (`hostile.rs`) found,
//! one each, on every store: the diagnostics routes answer a wrong method,
//! a retry id that is not UTF-8 and the bare `/_rf/` path with a JSON error
//! and its code.

use serde_json::Value;

use crate::receiver_fixture::employees_app;
use crate::stores::{TestStore, on_every_store};

/// The diagnostics token of [`with_diagnostics`] (its retries refuse to
/// run without one).
const TOKEN: &str = "hostile-tests-token";

/// `(status, body as JSON)` of one request over real HTTP.
async fn json_answer(method: reqwest::Method, url: String) -> (u16, Value) {
    let response = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status} without a JSON body ({e}): {text:?}"));
    (status, body)
}

/// A receiver on `store` with its diagnostics routes behind [`TOKEN`],
/// served: its base URL and the server task (the receiver lives as long as
/// its router).
async fn with_diagnostics(store: &TestStore) -> (String, tokio::task::JoinHandle<()>) {
    let (app, _, _receiver) = employees_app(store, |_| {}, Some(TOKEN));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    (base, server)
}

on_every_store!(
    hostile_regression_a_wrong_method_on_a_diagnostics_route_is_a_json_405,
    wrong_method_is_a_json_405
);
async fn wrong_method_is_a_json_405(store: &TestStore) {
    let (base, server) = with_diagnostics(store).await;
    for (method, path) in [
        (reqwest::Method::DELETE, "/_rf/health"),
        (reqwest::Method::POST, "/_rf/outbox/stats"),
        (reqwest::Method::PUT, "/_rf/outbox/failed"),
        (reqwest::Method::GET, "/_rf/outbox/retry"),
        (
            reqwest::Method::GET,
            "/_rf/outbox/0192f0c4-6c1e-7c7a-9b1e-3f1d2a4b5c6d/retry",
        ),
        (reqwest::Method::PATCH, "/_rf/inbox/stats"),
        (reqwest::Method::POST, "/_rf/metrics"),
    ] {
        let (status, body) = json_answer(method.clone(), format!("{base}{path}")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (405, Some("method_not_allowed")),
            "{method} {path}: {body}"
        );
    }
    server.abort();
}

on_every_store!(
    hostile_regression_a_retry_id_that_is_not_utf8_is_a_json_400,
    non_utf8_retry_id_is_a_json_400
);
async fn non_utf8_retry_id_is_a_json_400(store: &TestStore) {
    let (base, server) = with_diagnostics(store).await;
    let (status, body) = json_answer(
        reqwest::Method::POST,
        format!("{base}/_rf/outbox/%FF%FE/retry"),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    server.abort();
}

on_every_store!(
    hostile_regression_the_bare_rf_path_is_a_json_404,
    bare_rf_path_is_a_json_404
);
async fn bare_rf_path_is_a_json_404(store: &TestStore) {
    let (base, server) = with_diagnostics(store).await;
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let (status, body) = json_answer(method, format!("{base}/_rf/")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (404, Some("not_found")),
            "{body}"
        );
    }
    server.abort();
}
