//! Diagnostics are secure by default (`docs/operations.md`, "Access"):
//! without a token the retries refuse (403 `token_required`) and nothing
//! changes; with one, every route needs it, through the check shared with
//! the registry (`rfidl_runtime::auth`): any case of the scheme, and an
//! empty token refuses everything, even a request without a header.

use rfidl_runtime::config::Durability;
use rfidl_runtime::diagnostics::Diagnostics;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage, Status};
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::{Config, MessageType};
use serde_json::json;

use crate::support::serve;

/// One `Failed` message in a real outbox at `path`; its id.
fn failed_message(path: &std::path::Path) -> String {
    let outbox = Outbox::new(Config::default(), path);
    let mut conn = db::open(path, Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    let id = outbox
        .enqueue(
            &tx,
            OutgoingMessage {
                destination: "ledger".into(),
                message_type: MessageType::Command,
                interface: "billing.Ledger".into(),
                version: 1,
                fingerprint: "sha256:test".into(),
                endpoint: "Credit".into(),
                correlation_id: None,
                payload: json!({"amount": 1}),
                headers: Default::default(),
                max_retries: None,
                ttl: None,
                deliver_at: None,
            },
        )
        .expect("enqueue")
        .to_string();
    tx.execute(
        "UPDATE outbox_messages SET status = 'Failed' WHERE message_id = ?1",
        [&id],
    )
    .expect("fail");
    tx.commit().expect("commit");
    id
}

fn status_of(path: &std::path::Path, id: &str) -> String {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.query_row(
        "SELECT status FROM outbox_messages WHERE message_id = ?1",
        [id],
        |row| row.get(0),
    )
    .expect("row")
}

async fn send(method: reqwest::Method, url: String, authorization: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let body = response.text().await.expect("body");
    (status, body)
}

#[tokio::test]
async fn without_a_token_reads_answer_and_retries_refuse_changing_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("service.db");
    let id = failed_message(&path);
    let ops = Diagnostics::builder(&path).build().expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;
    for retry in [
        format!("{url}/_rf/outbox/{id}/retry"),
        format!("{url}/_rf/outbox/retry?status=Failed"),
    ] {
        let (status, body) = send(reqwest::Method::POST, retry, None).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).expect("json")["error"],
            "token_required"
        );
    }
    assert_eq!(
        status_of(&path, &id),
        Status::Failed.as_str(),
        "nothing retried"
    );
    let (status, body) = send(reqwest::Method::GET, format!("{url}/_rf/health"), None).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn with_a_token_every_route_needs_it_in_any_case_of_the_scheme() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("service.db");
    let id = failed_message(&path);
    let ops = Diagnostics::builder(&path)
        .bearer_token("s3cret")
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;
    for (authorization, wanted) in [
        (None, 401),
        (Some("Bearer wrong"), 401),
        (Some("Basic s3cret"), 401),
        (Some("Bearer s3cret"), 200),
        (Some("bearer s3cret"), 200),
        (Some("BEARER   s3cret"), 200),
    ] {
        for path in ["/_rf/health", "/_rf/outbox/failed", "/_rf/metrics"] {
            let (status, body) =
                send(reqwest::Method::GET, format!("{url}{path}"), authorization).await;
            assert_eq!(status, wanted, "{authorization:?} {path}: {body}");
        }
    }
    let (status, _) = send(
        reqwest::Method::POST,
        format!("{url}/_rf/outbox/{id}/retry"),
        Some("Bearer wrong"),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(status_of(&path, &id), "Failed");
    let (status, body) = send(
        reqwest::Method::POST,
        format!("{url}/_rf/outbox/{id}/retry"),
        Some("bearer s3cret"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(status_of(&path, &id), "Pending");
}

#[tokio::test]
async fn an_empty_token_refuses_everything_even_without_a_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("service.db");
    let id = failed_message(&path);
    let ops = Diagnostics::builder(&path)
        .bearer_token("")
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;
    for authorization in [None, Some("Bearer "), Some("Bearer x")] {
        let (status, body) = send(
            reqwest::Method::GET,
            format!("{url}/_rf/outbox/failed"),
            authorization,
        )
        .await;
        assert_eq!(status, 401, "{authorization:?}: {body}");
        let (status, _) = send(
            reqwest::Method::POST,
            format!("{url}/_rf/outbox/retry?status=Failed"),
            authorization,
        )
        .await;
        assert_eq!(status, 401, "{authorization:?}");
    }
    assert_eq!(status_of(&path, &id), "Failed");
}
