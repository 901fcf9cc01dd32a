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

on_every_store!(the_failed_list_pages_filters_and_groups, paging_story);
async fn paging_story(store: &TestStore) {
    let outbox = store.outbox(sender_config(Duration::from_secs(60)));
    let now = rfidl_runtime::store::now_ms();
    let ids = store.enqueue_many(
        &outbox,
        (0..7)
            .map(|i| {
                let (destination, method) = if i < 5 {
                    ("ledger", "Credit")
                } else {
                    ("billing", "Charge")
                };
                message(destination, method, json!({"n": i}))
            })
            .collect(),
    );
    let set = |id: &Uuid, assignments: String| {
        store.execute(&format!(
            "UPDATE outbox_messages SET {assignments} WHERE message_id = '{id}'"
        ));
    };
    // ids[0..3] share one created_at: the cursor orders them by id.
    for (n, id) in ids.iter().enumerate() {
        let created = if n < 3 {
            now - 3 * DAY_MS
        } else {
            now - n as i64 * 60_000
        };
        let error = if n % 2 == 0 {
            "500 handler_failed: x"
        } else {
            "400 bad_payload: y"
        };
        set(
            id,
            format!("status = 'Failed', created_at = {created}, last_error = '{error}'"),
        );
    }
    let ops = outbox
        .watched_by(store.diagnostics())
        .bearer_token(TOKEN)
        .build()
        .expect("diagnostics");
    let (ops_url, _server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    let get = |path: String| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move {
            let (status, _, body) = call(&client, reqwest::Method::GET, &url, Some(TOKEN)).await;
            (status, json_of(&body))
        }
    };
    let page_ids = |page: &serde_json::Value| -> Vec<String> {
        page["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["messageId"].as_str().expect("id").to_owned())
            .collect()
    };

    // Pages of two under one filter: every ledger message once, oldest first.
    let mut seen = Vec::new();
    let mut path = "/_rf/outbox/failed?destination=ledger&limit=2".to_owned();
    let mut first_cursor = None;
    loop {
        let (status, page) = get(path.clone()).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(page_ids(&page));
        let Some(cursor) = page["nextCursor"].as_str() else {
            break;
        };
        first_cursor.get_or_insert_with(|| cursor.to_owned());
        path = format!("/_rf/outbox/failed?destination=ledger&limit=2&cursor={cursor}");
    }
    let mut oldest_first: Vec<String> = ids[..3].iter().map(Uuid::to_string).collect();
    oldest_first.sort();
    oldest_first.extend(ids[3..5].iter().rev().map(Uuid::to_string));
    assert_eq!(seen, oldest_first, "{}", store.name());

    // A cursor under another filter, or a made-up one: refused.
    let cursor = first_cursor.expect("more than one page");
    let (status, answer) = get(format!(
        "/_rf/outbox/failed?destination=billing&cursor={cursor}"
    ))
    .await;
    assert_eq!(
        (status, answer["error"].clone()),
        (400, json!("cursor_mismatch")),
        "{answer}"
    );
    let (status, answer) = get("/_rf/outbox/failed?cursor=bm9wZQ".into()).await;
    assert_eq!(
        (status, answer["error"].clone()),
        (400, json!("invalid_cursor")),
        "{answer}"
    );

    // Filters.
    let listed = |query: &'static str| {
        let get = &get;
        async move {
            let (status, page) = get(format!("/_rf/outbox/failed?{query}")).await;
            assert_eq!(status, 200, "{query}: {page}");
            page_ids(&page).len()
        }
    };
    assert_eq!(listed("method=Charge").await, 2);
    assert_eq!(listed("interface=nobody.Nothing").await, 0);
    assert_eq!(listed("error=handler_failed").await, 4);
    assert_eq!(listed("olderThan=1d").await, 3);
    assert_eq!(listed("olderThan=1d&error=bad_payload").await, 1);
    for (query, code) in [
        ("olderThan=soon", "bad_request"),
        ("status=Discarded", "bad_request"),
        ("colour=red", "bad_request"),
        // PostgreSQL's TEXT cannot hold a NUL: refused, not a failed statement.
        ("error=time%00out", "bad_request"),
        ("destination=%00", "bad_request"),
    ] {
        let (status, answer) = get(format!("/_rf/outbox/failed?{query}")).await;
        assert_eq!(
            (status, answer["error"].clone()),
            (400, json!(code)),
            "{query}"
        );
    }

    // Groups: per destination and error code, with the oldest and newest.
    let (status, answer) = get("/_rf/outbox/failed/groups".into()).await;
    assert_eq!(status, 200, "{answer}");
    let groups: Vec<(String, String, u64)> = answer["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            assert!(g["oldest"].as_str() <= g["newest"].as_str(), "{g}");
            (
                g["destination"].as_str().expect("d").to_owned(),
                g["errorCode"].as_str().expect("e").to_owned(),
                g["count"].as_u64().expect("n"),
            )
        })
        .collect();
    let group = |d: &str, e: &str, n: u64| (d.to_owned(), e.to_owned(), n);
    assert_eq!(
        groups,
        [
            group("billing", "bad_payload", 1),
            group("billing", "handler_failed", 1),
            group("ledger", "handler_failed", 3),
            group("ledger", "bad_payload", 2),
        ],
        "{}",
        store.name()
    );
    let (_, answer) = get("/_rf/outbox/failed/groups?method=Charge&error=bad_payload".into()).await;
    assert_eq!(
        answer["groups"].as_array().map(Vec::len),
        Some(1),
        "{answer}"
    );
    let (status, answer) = get(format!("/_rf/outbox/failed/groups?cursor={cursor}")).await;
    assert_eq!(
        (status, answer["error"].clone()),
        (400, json!("bad_request")),
        "{answer}"
    );

    // The bulk routes take the list's filters, not its paging: a cursor or
    // a limit there is refused and changes nothing.
    let post = |path: &str| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move {
            let (status, _, body) = call(&client, reqwest::Method::POST, &url, Some(TOKEN)).await;
            (status, json_of(&body))
        }
    };
    let before = statuses(store);
    for path in [
        "/_rf/outbox/discard?method=Charge&limit=5".to_owned(),
        format!("/_rf/outbox/retry?destination=ledger&cursor={cursor}"),
    ] {
        let (status, answer) = post(&path).await;
        assert_eq!(
            (status, answer["error"].clone()),
            (400, json!("bad_request")),
            "{path}"
        );
    }
    assert_eq!(statuses(store), before);

    // Every filter narrows them: billing's Charge that failed with
    // bad_payload is n = 5 alone; ledger's messages older than a day are
    // the first three.
    let (status, answer) = post("/_rf/outbox/discard?method=Charge&error=bad_payload").await;
    assert_eq!((status, answer), (200, json!({"discarded": 1})));
    let (status, answer) = post("/_rf/outbox/retry?destination=ledger&olderThan=1d").await;
    assert_eq!(
        (status, answer["retried"].clone()),
        (200, json!(3)),
        "{answer}"
    );
    let after: Vec<&str> = (0..7).map(|n| store.row(&ids[n]).status.as_str()).collect();
    assert_eq!(
        after,
        [
            "Pending",
            "Pending",
            "Pending",
            "Failed",
            "Failed",
            "Discarded",
            "Failed"
        ],
        "{}",
        store.name()
    );
}

/// The sqlx PostgreSQL store's own statements (the list's filter, the
/// groups, the discards, retention): the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_on_the_sqlx_postgresql_store() {
    let Some(db) = crate::support::postgres::database() else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(db.url())
        .await
        .expect("pool");
    let store = rfidl_runtime::store::sqlx_postgres::PgStore::open(pool.clone())
        .await
        .expect("store");
    let outbox = rfidl_runtime::outbox::Outbox::new(sender_config(Duration::from_secs(60)), &store);
    let mut ids = Vec::new();
    for n in 0..3 {
        let mut tx = pool.begin().await.expect("begin");
        let id = outbox
            .enqueue_async(&mut tx, message("ledger", "Credit", json!({"n": n})))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        ids.push(id);
    }
    let now = rfidl_runtime::store::now_ms();
    for (id, assignments) in [
        (
            &ids[0],
            format!(
                "status = 'Failed', last_error = '500 handler_failed: x', last_attempt_at = {now}"
            ),
        ),
        (
            &ids[1],
            format!(
                "status = 'DeadLetter', last_error = '400 bad_payload: y', last_attempt_at = {}",
                now - 8 * DAY_MS
            ),
        ),
        (
            &ids[2],
            format!(
                "status = 'Failed', last_error = '500 handler_failed: z', last_attempt_at = {now}"
            ),
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET {assignments} WHERE message_id = '{id}'"
        )))
        .execute(&pool)
        .await
        .expect("update");
    }
    let ops = rfidl_runtime::Diagnostics::builder(&store)
        .outbox(&outbox)
        .bearer_token(TOKEN)
        .build()
        .expect("diagnostics");
    let (base, _server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    let ask = |method: reqwest::Method, path: String| {
        let url = format!("{base}{path}");
        let client = client.clone();
        async move {
            let (status, _, body) = call(&client, method, &url, Some(TOKEN)).await;
            (status, json_of(&body))
        }
    };
    let (status, page) = ask(
        reqwest::Method::GET,
        "/_rf/outbox/failed?limit=1&error=handler_failed".into(),
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let cursor = page["nextCursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let (_, page) = ask(
        reqwest::Method::GET,
        format!("/_rf/outbox/failed?limit=1&error=handler_failed&cursor={cursor}"),
    )
    .await;
    assert_eq!(
        page["messages"][0]["messageId"],
        ids[2].to_string(),
        "{page}"
    );
    assert!(page.get("nextCursor").is_none(), "{page}");
    let (status, answer) = ask(
        reqwest::Method::GET,
        format!("/_rf/outbox/failed?cursor={cursor}"),
    )
    .await;
    assert_eq!(
        (status, answer["error"].clone()),
        (400, json!("cursor_mismatch"))
    );
    let (_, groups) = ask(reqwest::Method::GET, "/_rf/outbox/failed/groups".into()).await;
    assert_eq!(
        groups["groups"][0]["errorCode"], "handler_failed",
        "{groups}"
    );
    assert_eq!(groups["groups"][0]["count"], 2, "{groups}");
    let (status, answer) = ask(
        reqwest::Method::POST,
        format!("/_rf/outbox/{}/discard", Uuid::now_v7()),
    )
    .await;
    assert_eq!((status, answer["error"].clone()), (404, json!("not_found")));
    let (status, answer) = ask(
        reqwest::Method::POST,
        format!("/_rf/outbox/{}/discard", ids[0]),
    )
    .await;
    assert_eq!((status, answer), (200, json!({"discarded": 1})));
    let (status, answer) = ask(
        reqwest::Method::POST,
        "/_rf/outbox/discard?status=Expired".into(),
    )
    .await;
    assert_eq!((status, answer), (200, json!({"discarded": 0})));

    // Retention: the DeadLetter failed 8 days ago goes; the others stay.
    let metrics = Arc::new(Metrics::default());
    let mut config = sender_config(Duration::from_secs(60));
    config.cleanup_interval = Duration::from_secs(3600);
    let task = rfidl_runtime::retention::Retention::spawn(config, &store, metrics.clone())
        .expect("retention");
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics.outbox_undelivered_deleted.get() == 0 {
        assert!(Instant::now() < deadline, "no clean-up pass");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.shutdown().await;
    assert_eq!(metrics.outbox_undelivered_deleted.get(), 1);
    let mut left: Vec<(String, String)> =
        sqlx::query_as("SELECT message_id, status FROM outbox_messages")
            .fetch_all(&pool)
            .await
            .expect("rows");
    left.sort();
    assert_eq!(
        left,
        [
            (ids[0].to_string(), "Discarded".to_owned()),
            (ids[2].to_string(), "Failed".to_owned()),
        ]
    );
}
