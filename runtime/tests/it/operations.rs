//! Operations: the retention clean-up on a real database file, and the
//! diagnostics routes over real HTTP, including an operator retrying a
//! failed message into exactly one effect at a real receiver.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rfidl_runtime::diagnostics::{self, AttentionFilter, Diagnostics, DiagnosticsError};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::metrics::Metrics;
use rfidl_runtime::outbox::{Outbox, Status};
use rfidl_runtime::retention::{CleanupReport, Retention};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{Config, Durability};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::dispatcher::{enqueue, message, sender_config, status_of, wait_for};
use crate::support::{self, count, serve};

const DAY_MS: i64 = 86_400_000;

/// Enqueues `n` messages for `destination` in one transaction.
fn enqueue_many(outbox: &Outbox, db: &Path, destination: &str, n: usize) -> Vec<Uuid> {
    let mut conn = db::open(db, Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    let ids = (0..n)
        .map(|i| {
            outbox
                .enqueue(&tx, message(destination, "Credit", json!({"amount": i})))
                .expect("enqueue")
        })
        .collect();
    tx.commit().expect("commit");
    ids
}

/// Runs `sql` with `?1` bound to each id.
fn update_each(db: &Path, ids: &[Uuid], sql: &str) {
    let mut conn = rusqlite::Connection::open(db).expect("open");
    let tx = conn.transaction().expect("tx");
    for id in ids {
        tx.execute(sql, [id.to_string()]).expect("update");
    }
    tx.commit().expect("commit");
}

fn insert_inbox_rows(db: &Path, prefix: &str, n: usize, expires_at: i64) {
    let mut conn = rusqlite::Connection::open(db).expect("open");
    let tx = conn.transaction().expect("tx");
    for i in 0..n {
        tx.execute(
            "INSERT INTO inbox_messages \
             (source_service_id, message_id, endpoint, payload_sha256, processed_at, response, expires_at) \
             VALUES ('billing', ?1, 'Credit', x'00', ?2, NULL, ?3)",
            rusqlite::params![format!("{prefix}-{i}"), expires_at - DAY_MS, expires_at],
        )
        .expect("insert inbox row");
    }
    tx.commit().expect("commit");
}

fn status_count(db: &Path, status: &str) -> i64 {
    count(
        db,
        &format!("SELECT COUNT(*) FROM outbox_messages WHERE status = '{status}'"),
    )
}

#[tokio::test]
async fn cleanup_deletes_what_served_its_purpose_and_keeps_what_needs_a_human() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("service.db");
    let config = sender_config(Duration::from_secs(60));
    let outbox = Outbox::new(config.clone(), &db);
    let now = rfidl_runtime::store::now_ms();

    // More old Sent rows than one clean-up batch, so batching is exercised.
    let old_sent = enqueue_many(&outbox, &db, "ledger", 2_500);
    update_each(
        &db,
        &old_sent,
        &format!(
            "UPDATE outbox_messages SET status = 'Sent', sent_at = {} WHERE message_id = ?1",
            now - 8 * DAY_MS
        ),
    );
    let recent_sent = enqueue_many(&outbox, &db, "ledger", 3);
    update_each(
        &db,
        &recent_sent,
        &format!(
            "UPDATE outbox_messages SET status = 'Sent', sent_at = {} WHERE message_id = ?1",
            now - DAY_MS
        ),
    );
    let past_ttl = enqueue_many(&outbox, &db, "ledger", 2);
    update_each(
        &db,
        &past_ttl,
        &format!(
            "UPDATE outbox_messages SET expires_at = {}, next_retry_at = {} WHERE message_id = ?1",
            now - 1,
            now + DAY_MS
        ),
    );
    let waiting = enqueue_many(&outbox, &db, "ledger", 1);
    let leased = enqueue_many(&outbox, &db, "ledger", 1);
    update_each(
        &db,
        &leased,
        &format!(
            "UPDATE outbox_messages SET status = 'Sending', lease_token = 'l', expires_at = {} WHERE message_id = ?1",
            now - 1
        ),
    );
    let failed_long_ago = enqueue_many(&outbox, &db, "ledger", 2);
    update_each(
        &db,
        &failed_long_ago,
        &format!(
            "UPDATE outbox_messages SET status = 'Failed', created_at = {0}, expires_at = {0}, \
             last_attempt_at = {1} WHERE message_id = ?1",
            now - 30 * DAY_MS,
            now - DAY_MS
        ),
    );
    insert_inbox_rows(&db, "old", 1_500, now - 1);
    insert_inbox_rows(&db, "fresh", 5, now + DAY_MS);

    let conn = db::open(&db, Durability::Normal).expect("open");
    let report = rfidl_runtime::store::sqlite::cleanup(&conn, &config, now).expect("cleanup");
    assert_eq!(
        report,
        CleanupReport {
            sent_deleted: 2_500,
            expired: 2,
            made_due: 0,
            undelivered_deleted: 0,
            inbox_deleted: 1_500,
        }
    );
    assert_eq!(status_count(&db, "Sent"), 3, "recent Sent rows stay");
    assert_eq!(status_count(&db, "Expired"), 2);
    assert_eq!(status_count(&db, "Pending"), 1, "{waiting:?} stays due");
    assert_eq!(
        status_count(&db, "Sending"),
        1,
        "a leased row belongs to its dispatcher"
    );
    assert_eq!(
        status_count(&db, "Failed"),
        2,
        "failed rows wait for a human within outbox.failed_retention"
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM inbox_messages"), 5);
    for id in &past_ttl {
        assert_eq!(
            status_of(&db, id).last_error.as_deref(),
            Some("time to live exceeded")
        );
    }

    let again = rfidl_runtime::store::sqlite::cleanup(&conn, &config, now).expect("second cleanup");
    assert_eq!(
        again,
        CleanupReport::default(),
        "a second pass finds nothing"
    );
}

#[tokio::test]
async fn the_retention_task_cleans_on_its_interval_and_counts_what_it_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("service.db");
    let mut config = Config::default();
    config.cleanup_interval = Duration::from_millis(50);
    let metrics = std::sync::Arc::new(Metrics::default());
    let task = Retention::spawn(config, &db, metrics.clone()).expect("spawn");
    // Written after the first pass ran: a later pass must find them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    insert_inbox_rows(&db, "expired", 40, rfidl_runtime::store::now_ms() - 1);
    insert_inbox_rows(&db, "fresh", 2, rfidl_runtime::store::now_ms() + DAY_MS);
    let deadline = Instant::now() + Duration::from_secs(5);
    // The counter moves right after the delete commits: wait for both (a
    // loaded machine can read between the two).
    while count(&db, "SELECT COUNT(*) FROM inbox_messages") > 2 || metrics.inbox_deleted.get() < 40
    {
        assert!(Instant::now() < deadline, "the task never cleaned up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count(&db, "SELECT COUNT(*) FROM inbox_messages"), 2);
    assert_eq!(metrics.inbox_deleted.get(), 40);
    task.shutdown().await;
    assert!(
        metrics
            .render(&Default::default())
            .contains("rf_inbox_deleted_total 40\n"),
        "the clean-up is visible in the metrics"
    );
}

/// `GET`/`POST` `path` with an optional bearer token; (status, content type, body).
pub(crate) async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
) -> (u16, String, String) {
    let mut request = client.request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, content_type, response.text().await.expect("body"))
}

pub(crate) fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[tokio::test]
async fn an_operator_sees_a_failed_message_and_retries_it_into_exactly_one_effect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sender_secret = Secret::generate();
    let receiver =
        support::start_receiver(dir.path(), support::receiver_config(&[&sender_secret])).await;
    // The first attempt and both retries fail (and roll back) at the receiver.
    receiver.ledger.fail_next.store(3, Ordering::SeqCst);
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(50)), &db);
    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            sender_secret,
        )
        .start()
        .expect("dispatcher");
    let ops = Diagnostics::builder(&db)
        .outbox(&outbox)
        .bearer_token("ops-token")
        .build()
        .expect("diagnostics");
    let (ops_url, _server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    let get = |path: &str| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move { call(&client, reqwest::Method::GET, &url, Some("ops-token")).await }
    };
    let post = |path: &str| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move { call(&client, reqwest::Method::POST, &url, Some("ops-token")).await }
    };

    let id = enqueue(
        &outbox,
        &db,
        message(
            "ledger",
            "Credit",
            json!({"account": "private-account-7", "amount": 5}),
        ),
    );
    wait_for(&db, &id, Status::Failed).await;
    assert_eq!(count(&receiver.db, "SELECT COUNT(*) FROM ledger"), 0);

    // Without the token, or with a wrong one: 401 and the JSON error body.
    for token in [None, Some("guess")] {
        let (status, _, body) = call(
            &client,
            reqwest::Method::GET,
            &format!("{ops_url}/_rf/health"),
            token,
        )
        .await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(json_of(&body)["error"], "unauthorized");
    }

    let (status, _, body) = get("/_rf/health").await;
    assert_eq!(status, 200, "{body}");
    let health = json_of(&body);
    assert_eq!(health["status"], "critical", "{health}");
    assert_eq!(health["outbox"]["failed"], 1);

    let (_, _, body) = get("/_rf/outbox/stats").await;
    let stats = json_of(&body);
    assert_eq!(stats["destinations"]["ledger"]["Failed"], 1, "{stats}");
    assert_eq!(stats["pending"], 0);

    let (status, _, body) = get("/_rf/outbox/failed").await;
    assert_eq!(status, 200, "{body}");
    let listed = &json_of(&body)["messages"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["messageId"], id.to_string());
    assert_eq!(listed[0]["status"], "Failed");
    assert_eq!(listed[0]["retryCount"], 2);
    assert_eq!(listed[0]["endpoint"], "Credit");
    assert!(
        listed[0]["lastError"]
            .as_str()
            .is_some_and(|e| !e.is_empty())
    );
    assert!(
        !body.contains("private-account-7"),
        "payloads are never shown: {body}"
    );

    let (status, _, body) = post(&format!("/_rf/outbox/{id}/retry")).await;
    assert_eq!((status, json_of(&body)), (200, json!({"retried": 1})));
    wait_for(&db, &id, Status::Sent).await;
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM ledger"),
        1,
        "exactly one effect"
    );

    // The message is Sent now: a second retry is refused, and so are bad ids.
    let (status, _, body) = post(&format!("/_rf/outbox/{id}/retry")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(json_of(&body)["error"], "not_retryable");
    let (status, _, body) = post(&format!("/_rf/outbox/{}/retry", Uuid::now_v7())).await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (404, json!("not_found"))
    );
    let (status, _, body) = post("/_rf/outbox/not-a-uuid/retry").await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (400, json!("bad_request"))
    );
    let (status, _, body) = get("/_rf/outbox/failed?status=Sent").await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (400, json!("bad_request"))
    );
    let (status, _, body) = get("/_rf/outbox/failed?colour=red").await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (400, json!("bad_request"))
    );

    let (_, _, body) = get("/_rf/health").await;
    let health = json_of(&body);
    assert_eq!(health["status"], "healthy", "{health}");
    assert!(health["outbox"]["lastSentAt"].is_string(), "{health}");
    assert!(
        health["outbox"].get("sent").is_none(),
        "the health check does not count Sent rows: {health}"
    );
    let (_, _, body) = get("/_rf/outbox/stats").await;
    assert_eq!(json_of(&body)["sent"], 1, "{body}");

    let (status, content_type, text) = get("/_rf/metrics").await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    for line in [
        "rf_outbox_sent_total 1\n",
        "rf_outbox_failed_total 1\n",
        "rf_inbox_messages 0\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }

    // The receiver's side of the same story.
    let receiver_ops = Diagnostics::builder(&receiver.db)
        .metrics(receiver.receiver.metrics().clone())
        .build()
        .expect("receiver diagnostics");
    let (receiver_ops_url, _receiver_ops_server) = serve(receiver_ops.router()).await;
    let (_, _, body) = call(
        &client,
        reqwest::Method::GET,
        &format!("{receiver_ops_url}/_rf/inbox/stats"),
        None,
    )
    .await;
    let inbox = json_of(&body);
    assert_eq!(inbox["size"], 1, "{inbox}");
    assert_eq!(inbox["processed"], 1, "{inbox}");
    dispatcher.shutdown().await;
}

#[tokio::test]
async fn a_bulk_retry_puts_back_only_the_matching_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("service.db");
    let outbox = Outbox::new(sender_config(Duration::from_secs(60)), &db);
    let billing = enqueue_many(&outbox, &db, "billing", 3);
    let ledger = enqueue_many(&outbox, &db, "ledger", 2);
    update_each(
        &db,
        &billing[..2],
        "UPDATE outbox_messages SET status = 'Failed', retry_count = 5 WHERE message_id = ?1",
    );
    update_each(
        &db,
        &billing[2..],
        "UPDATE outbox_messages SET status = 'DeadLetter' WHERE message_id = ?1",
    );
    update_each(
        &db,
        &ledger,
        "UPDATE outbox_messages SET status = 'Failed' WHERE message_id = ?1",
    );
    let conn = db::open(&db, Durability::Normal).expect("open");
    let ttl = Duration::from_secs(3600);
    let filter = AttentionFilter {
        status: Some("Failed".into()),
        destination: Some("billing".into()),
        ..AttentionFilter::default()
    };
    let listed = diagnostics::attention_messages(&conn, &filter).expect("list");
    assert_eq!(listed.len(), 2);
    let retried = diagnostics::retry_matching(&conn, &filter, ttl, rfidl_runtime::store::now_ms())
        .expect("retry");
    assert_eq!(retried, 2);
    for id in &billing[..2] {
        let row = status_of(&db, id);
        assert_eq!((row.status, row.retry_count), (Status::Pending, 0));
    }
    assert_eq!(status_of(&db, &billing[2]).status, Status::DeadLetter);
    for id in &ledger {
        assert_eq!(status_of(&db, id).status, Status::Failed);
    }
    let everything = AttentionFilter::default();
    assert_eq!(
        diagnostics::retry_matching(&conn, &everything, ttl, rfidl_runtime::store::now_ms())
            .expect("retry"),
        3
    );
    assert_eq!(status_count(&db, "Pending"), 5);
}

#[tokio::test]
async fn a_locked_database_answers_503_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("service.db");
    let outbox = Outbox::new(sender_config(Duration::from_secs(60)), &db);
    let ids = enqueue_many(&outbox, &db, "ledger", 1);
    update_each(
        &db,
        &ids,
        "UPDATE outbox_messages SET status = 'Failed' WHERE message_id = ?1",
    );
    let ops = Diagnostics::builder(&db)
        .outbox(&outbox)
        .bearer_token("ops-token")
        .build()
        .expect("diagnostics");
    let (ops_url, _server) = serve(ops.router()).await;

    // Another process holds the write lock longer than the busy timeout.
    let mut locker = rusqlite::Connection::open(&db).expect("open");
    let lock = locker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("lock");
    let client = reqwest::Client::new();
    let (status, _, body) = call(
        &client,
        reqwest::Method::POST,
        &format!("{ops_url}/_rf/outbox/{}/retry", ids[0]),
        Some("ops-token"),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(json_of(&body)["error"], "unavailable");
    // Reads still work under WAL while the writer holds its lock.
    let (status, _, body) = call(
        &client,
        reqwest::Method::GET,
        &format!("{ops_url}/_rf/health"),
        Some("ops-token"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    lock.rollback().expect("release");

    assert_eq!(
        status_of(&db, &ids[0]).status,
        Status::Failed,
        "nothing lost"
    );
    let (status, _, _) = call(
        &client,
        reqwest::Method::POST,
        &format!("{ops_url}/_rf/outbox/{}/retry", ids[0]),
        Some("ops-token"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(status_of(&db, &ids[0]).status, Status::Pending);
}

#[tokio::test]
async fn diagnostics_merge_with_the_receiver_routes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), support::receiver_config(&[&secret])).await;
    let ops = Diagnostics::builder(&receiver.db)
        .metrics(receiver.receiver.metrics().clone())
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(receiver.receiver.router().merge(ops.router())).await;
    let client = reqwest::Client::new();
    for (path, wanted) in [
        ("/_rf/health", 200),
        ("/_rf/metadata", 200),
        ("/_rf/inbox/stats", 200),
        ("/_rf/no-such-route", 404),
    ] {
        let (status, _, body) =
            call(&client, reqwest::Method::GET, &format!("{url}{path}"), None).await;
        assert_eq!(status, wanted, "{path}: {body}");
        if wanted == 404 {
            assert_eq!(json_of(&body)["error"], "not_found");
        }
    }
    let message_id = Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&support::envelope(
        &message_id,
        "Credit",
        json!({"account": "merged", "amount": 1}),
    ))
    .expect("json");
    let (status, _) = support::post_signed(
        &client,
        &url,
        &body,
        &message_id,
        &secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await;
    assert_eq!(status, 200, "the receiver still receives");
}

#[test]
fn diagnostics_errors_have_documented_codes() {
    let cases = [
        (DiagnosticsError::Unauthorized, 401, "unauthorized"),
        (DiagnosticsError::BadRequest("x".into()), 400, "bad_request"),
        (DiagnosticsError::NotFound("x".into()), 404, "not_found"),
        (
            DiagnosticsError::NotRetryable {
                message_id: "x".into(),
                status: Status::Sent,
            },
            409,
            "not_retryable",
        ),
        (
            DiagnosticsError::Unavailable("x".into()),
            503,
            "unavailable",
        ),
        (
            DiagnosticsError::MethodNotAllowed {
                method: "DELETE".into(),
                path: "/_rf/health".into(),
            },
            405,
            "method_not_allowed",
        ),
    ];
    let docs = include_str!("../../../docs/operations.md");
    for (error, status, code) in cases {
        assert_eq!((error.status().as_u16(), error.code()), (status, code));
        assert!(
            docs.contains(&format!("`{code}`")),
            "docs/operations.md documents `{code}`"
        );
    }
}
