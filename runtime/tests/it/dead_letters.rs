//! Dead letters end to end (issue 30), on every store: an operator discards
//! failed messages over real HTTP (one, or every one matching a filter), the
//! health check stops counting them, bad requests change nothing, and
//! retention deletes undelivered rows `outbox.failed_retention` after they
//! stopped, counting them in a metric.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::metrics::Metrics;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::operations::{call, json_of};
use crate::stores::{TestStore, on_every_store};
use crate::support::serve;

const DAY_MS: i64 = 86_400_000;
const TOKEN: &str = "ops-token";

/// Every (status, rows) of the outbox, sorted, as one comparable value.
fn statuses(store: &TestStore) -> Vec<(String, i64)> {
    let mut counts = store.status_counts();
    counts.sort();
    counts
}

on_every_store!(
    an_operator_discards_failed_messages_and_health_recovers,
    discard_story
);
async fn discard_story(store: &TestStore) {
    let outbox = store.outbox(sender_config(Duration::from_secs(60)));
    let ids = store.enqueue_many(
        &outbox,
        vec![
            message("ledger", "Credit", json!({"amount": 1})),
            message("ledger", "Credit", json!({"amount": 2})),
            message("billing", "Charge", json!({})),
            message("billing", "Charge", json!({})),
            message("billing", "Charge", json!({})),
        ],
    );
    let set = |id: &Uuid, assignments: &str| {
        store.execute(&format!(
            "UPDATE outbox_messages SET {assignments} WHERE message_id = '{id}'"
        ));
    };
    set(&ids[0], "status = 'Failed', last_error = '500 boom: x'");
    set(&ids[1], "status = 'DeadLetter', last_error = '400 bad'");
    set(&ids[2], "status = 'Failed', last_error = '500 boom: y'");
    set(
        &ids[3],
        "status = 'Expired', last_error = 'time to live exceeded'",
    );
    // ids[4] stays Pending.

    // Without a token, a discard is refused and changes nothing.
    let open_ops = outbox
        .watched_by(store.diagnostics())
        .build()
        .expect("diagnostics");
    let (open_url, _open_server) = serve(open_ops.router()).await;
    let client = reqwest::Client::new();
    let before = statuses(store);
    for path in [
        format!("/_rf/outbox/{}/discard", ids[0]),
        "/_rf/outbox/discard".to_owned(),
    ] {
        let (status, _, body) = call(
            &client,
            reqwest::Method::POST,
            &format!("{open_url}{path}"),
            None,
        )
        .await;
        assert_eq!(
            (status, json_of(&body)["error"].clone()),
            (403, json!("token_required")),
            "{path}: {body}"
        );
    }
    assert_eq!(statuses(store), before, "a refused discard changes nothing");

    let metrics = Arc::clone(outbox.metrics());
    let ops = outbox
        .watched_by(store.diagnostics())
        .bearer_token(TOKEN)
        .build()
        .expect("diagnostics");
    let (ops_url, _server) = serve(ops.router()).await;
    let request = |method: reqwest::Method, path: String| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move { call(&client, method, &url, Some(TOKEN)).await }
    };
    let post = |path: String| request(reqwest::Method::POST, path);
    let health = || async {
        let (status, _, body) = request(reqwest::Method::GET, "/_rf/health".into()).await;
        assert_eq!(status, 200, "{body}");
        json_of(&body)
    };
    assert_eq!(health().await["status"], "critical");

    // Bad requests: each its code, nothing changed.
    let unknown = Uuid::now_v7();
    for (path, wanted_status, wanted_code) in [
        (format!("/_rf/outbox/{unknown}/discard"), 404, "not_found"),
        (
            "/_rf/outbox/not-a-uuid/discard".to_owned(),
            400,
            "bad_request",
        ),
        (
            format!("/_rf/outbox/{}/discard", ids[4]),
            409,
            "not_discardable",
        ),
        (
            "/_rf/outbox/discard?status=Sent".to_owned(),
            400,
            "bad_request",
        ),
        (
            "/_rf/outbox/discard?colour=red".to_owned(),
            400,
            "bad_request",
        ),
    ] {
        let (status, _, body) = post(path.clone()).await;
        assert_eq!(
            (status, json_of(&body)["error"].clone()),
            (wanted_status, json!(wanted_code)),
            "{path}: {body}"
        );
    }
    let (status, _, body) = request(
        reqwest::Method::GET,
        format!("/_rf/outbox/{}/discard", ids[0]),
    )
    .await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (405, json!("method_not_allowed"))
    );
    assert_eq!(statuses(store), before, "bad requests change nothing");

    // One message.
    let (status, _, body) = post(format!("/_rf/outbox/{}/discard", ids[0])).await;
    assert_eq!(
        (status, json_of(&body)),
        (200, json!({"discarded": 1})),
        "{body}"
    );
    let row = store.row(&ids[0]);
    assert_eq!(row.status.as_str(), "Discarded");
    assert_eq!(
        row.last_error.as_deref(),
        Some("500 boom: x"),
        "kept for investigation"
    );
    // Already discarded: not again, and not retried either.
    let (status, _, body) = post(format!("/_rf/outbox/{}/discard", ids[0])).await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (409, json!("not_discardable"))
    );
    let (status, _, body) = post(format!("/_rf/outbox/{}/retry", ids[0])).await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (409, json!("not_retryable"))
    );
    // The failed list no longer shows it.
    let (_, _, body) = request(reqwest::Method::GET, "/_rf/outbox/failed".into()).await;
    assert!(!body.contains(&ids[0].to_string()), "{body}");

    // Every Failed message of billing: one; the Expired one stays.
    let (status, _, body) =
        post("/_rf/outbox/discard?status=Failed&destination=billing".into()).await;
    assert_eq!(
        (status, json_of(&body)),
        (200, json!({"discarded": 1})),
        "{body}"
    );
    assert_eq!(store.row(&ids[2]).status.as_str(), "Discarded");
    assert_eq!(store.row(&ids[3]).status.as_str(), "Expired");
    assert_eq!(
        health().await["status"],
        "critical",
        "two still need a human"
    );

    // The rest: the DeadLetter and the Expired one; the Pending one stays.
    let (status, _, body) = post("/_rf/outbox/discard".into()).await;
    assert_eq!(
        (status, json_of(&body)),
        (200, json!({"discarded": 2})),
        "{body}"
    );
    assert_eq!(store.row(&ids[4]).status.as_str(), "Pending");
    let health = health().await;
    assert_ne!(health["status"], "critical", "{health}");
    for key in ["failed", "deadLetter", "expired"] {
        assert_eq!(health["outbox"][key], 0, "{key}: {health}");
    }
    assert_eq!(
        store.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Discarded'"),
        4,
        "discarded rows are kept, never deleted by a discard"
    );
    assert_eq!(metrics.outbox_discarded.get(), 4);
    let (_, _, text) = request(reqwest::Method::GET, "/_rf/metrics".into()).await;
    assert!(text.contains("rf_outbox_discarded_total 4\n"), "{text}");
}

on_every_store!(
    retention_deletes_undelivered_rows_after_their_retention,
    undelivered_retention_story
);
async fn undelivered_retention_story(store: &TestStore) {
    let outbox = store.outbox(sender_config(Duration::from_secs(60)));
    let now = rfidl_runtime::store::now_ms();
    let group = |destination: &str, n: usize| {
        store.enqueue_many(
            &outbox,
            (0..n)
                .map(|i| message(destination, "Credit", json!({"amount": i})))
                .collect(),
        )
    };
    // More old Failed rows than one clean-up batch (1000).
    for (destination, n) in [
        ("old-failed", 1_001),
        ("recent-failed", 2),
        ("old-created-recent-attempt", 1),
        ("never-attempted", 1),
        ("old-dead", 1),
        ("old-expired", 1),
        ("recent-expired", 1),
        ("old-discarded", 2),
        ("recent-discarded", 1),
    ] {
        group(destination, n);
    }
    let update = |destination: &str, assignments: String| {
        store.execute(&format!(
            "UPDATE outbox_messages SET {assignments} WHERE destination = '{destination}'"
        ));
    };
    let old = now - 8 * DAY_MS;
    let recent = now - DAY_MS;
    update(
        "old-failed",
        format!("status = 'Failed', last_attempt_at = {old}"),
    );
    update(
        "recent-failed",
        format!("status = 'Failed', last_attempt_at = {recent}"),
    );
    update(
        "old-created-recent-attempt",
        format!("status = 'Failed', created_at = {old}, last_attempt_at = {recent}"),
    );
    update(
        "never-attempted",
        format!("status = 'DeadLetter', created_at = {old}, last_attempt_at = NULL"),
    );
    update(
        "old-dead",
        format!("status = 'DeadLetter', last_attempt_at = {old}"),
    );
    update(
        "old-expired",
        format!("status = 'Expired', expires_at = {old}"),
    );
    update(
        "recent-expired",
        format!("status = 'Expired', created_at = {old}, expires_at = {recent}"),
    );
    update(
        "old-discarded",
        format!("status = 'Discarded', last_attempt_at = {recent}, discarded_at = {old}"),
    );
    update(
        "recent-discarded",
        format!("status = 'Discarded', last_attempt_at = {old}, discarded_at = {recent}"),
    );

    let metrics = Arc::new(Metrics::default());
    let mut config = sender_config(Duration::from_secs(60));
    config.cleanup_interval = Duration::from_secs(3600);
    let task = store.retention(config, metrics.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics.outbox_undelivered_deleted.get() == 0 {
        assert!(
            Instant::now() < deadline,
            "{}: no clean-up pass",
            store.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.shutdown().await;
    assert_eq!(
        metrics.outbox_undelivered_deleted.get(),
        1_001 + 1 + 1 + 1 + 2,
        "{}",
        store.name()
    );
    let left = |destination: &str| {
        store.count(&format!(
            "SELECT COUNT(*) FROM outbox_messages WHERE destination = '{destination}'"
        ))
    };
    for (destination, wanted) in [
        ("old-failed", 0),
        ("recent-failed", 2),
        ("old-created-recent-attempt", 1),
        ("never-attempted", 0),
        ("old-dead", 0),
        ("old-expired", 0),
        ("recent-expired", 1),
        ("old-discarded", 0),
        ("recent-discarded", 1),
    ] {
        assert_eq!(
            left(destination),
            wanted,
            "{destination} on {}",
            store.name()
        );
    }
    assert!(
        metrics
            .render(&Default::default())
            .contains("rf_outbox_undelivered_deleted_total 1006\n")
    );
}
