//! Operations with the same test bodies on every store (SQLite and
//! PostgreSQL): the diagnostics routes over real HTTP (counts, the failed
//! list and its filters, manual retries delivered to a real receiver, the
//! metrics' destination gauges, readiness, inbox size) and the retention
//! task. See `stores.rs` for the harness, `operations.rs` for the SQLite-only
//! cases (batching of one pass, a locked database, merged routers).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::metrics::Metrics;
use rfidl_runtime::outbox::Status;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::operations::{call, json_of};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, serve};

const DAY_MS: i64 = 86_400_000;
const TOKEN: &str = "ops-token";

/// The message ids listed by a `GET /_rf/outbox/failed` answer.
fn listed_ids(body: &str) -> BTreeSet<String> {
    json_of(body)["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages in {body}"))
        .iter()
        .map(|m| m["messageId"].as_str().expect("messageId").to_owned())
        .collect()
}

fn ids_of(ids: &[&Uuid]) -> BTreeSet<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

/// The value of the metrics line that starts with `series ` (e.g.
/// `rf_outbox_pending_messages{destination="ledger"}`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
        .parse()
        .expect("a number")
}

on_every_store!(
    an_operator_reads_the_counts_and_retries_failed_messages_into_one_effect_each,
    operator_story
);
async fn operator_story(store: &TestStore) {
    let receiver_store = store.another();
    let sender_secret = Secret::generate();
    let receiver = receiver_store
        .start_receiver(support::receiver_config(&[&sender_secret]))
        .await;
    let outbox = store.outbox(sender_config(Duration::from_millis(50)));
    let credit = |amount: i64| {
        message(
            "ledger",
            "Credit",
            json!({"account": "private-account-7", "amount": amount}),
        )
    };
    let ids = store.enqueue_many(
        &outbox,
        vec![
            credit(1),
            credit(2),
            credit(3),
            credit(4),
            credit(100),
            message("billing", "Charge", json!({})),
            message("billing", "Charge", json!({})),
        ],
    );
    let now = rfidl_runtime::store::now_ms();
    let set = |id: &Uuid, assignments: &str| {
        store.execute(&format!(
            "UPDATE outbox_messages SET {assignments} WHERE message_id = '{id}'"
        ));
    };
    for failed in &ids[..2] {
        set(
            failed,
            "status = 'Failed', retry_count = 2, last_error = 'HTTP 500 from ledger'",
        );
    }
    // Waiting for five minutes: the oldest-pending age shows it.
    for waiting in &ids[2..4] {
        set(waiting, &format!("created_at = {}", now - 300_000));
    }
    set(&ids[4], &format!("status = 'Sent', sent_at = {now}"));
    set(&ids[5], "status = 'DeadLetter', last_error = 'HTTP 400'");
    set(
        &ids[6],
        "status = 'Expired', last_error = 'time to live exceeded'",
    );

    let ops = outbox
        .watched_by(store.diagnostics())
        .bearer_token(TOKEN)
        .build()
        .expect("diagnostics");
    let (ops_url, _server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    let get = |path: &str| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move { call(&client, reqwest::Method::GET, &url, Some(TOKEN)).await }
    };
    let post = |path: &str| {
        let url = format!("{ops_url}{path}");
        let client = client.clone();
        async move { call(&client, reqwest::Method::POST, &url, Some(TOKEN)).await }
    };

    // Health: the counts per status, without the Sent count.
    let (status, _, body) = get("/_rf/health").await;
    assert_eq!(status, 200, "{body}");
    let health = json_of(&body);
    assert_eq!(health["status"], "critical", "{health}");
    let outbox_counts = &health["outbox"];
    for (key, wanted) in [
        ("pending", 2),
        ("sending", 0),
        ("failed", 2),
        ("deadLetter", 1),
        ("expired", 1),
    ] {
        assert_eq!(outbox_counts[key], wanted, "{key}: {health}");
    }
    assert!(outbox_counts.get("sent").is_none(), "{health}");
    assert!(outbox_counts["lastSentAt"].is_string(), "{health}");
    let age = outbox_counts["oldestPendingAgeMs"].as_i64().expect("age");
    assert!((300_000..400_000).contains(&age), "{health}");

    // Stats: per destination and status, and the Sent rows.
    let (status, _, body) = get("/_rf/outbox/stats").await;
    assert_eq!(status, 200, "{body}");
    let stats = json_of(&body);
    assert_eq!(stats["sent"], 1, "{stats}");
    assert_eq!(
        stats["destinations"],
        json!({
            "billing": {"DeadLetter": 1, "Expired": 1},
            "ledger": {"Pending": 2, "Failed": 2},
        }),
        "{stats}"
    );

    // The failed list and its filters; never a payload.
    let (status, _, body) = get("/_rf/outbox/failed").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        listed_ids(&body),
        ids_of(&[&ids[0], &ids[1], &ids[5], &ids[6]])
    );
    assert!(!body.contains("private-account-7"), "{body}");
    let (_, _, body) = get("/_rf/outbox/failed?status=Failed").await;
    assert_eq!(listed_ids(&body), ids_of(&[&ids[0], &ids[1]]));
    let first = &json_of(&body)["messages"][0];
    assert_eq!(first["destination"], "ledger");
    assert_eq!(first["endpoint"], "Credit");
    assert_eq!(first["retryCount"], 2);
    assert_eq!(first["maxRetries"], 2);
    assert_eq!(first["lastError"], "HTTP 500 from ledger");
    assert_eq!(first["correlationId"], "c-1");
    let (_, _, body) = get("/_rf/outbox/failed?destination=billing").await;
    assert_eq!(listed_ids(&body), ids_of(&[&ids[5], &ids[6]]));
    let (_, _, body) = get("/_rf/outbox/failed?status=Expired&destination=billing").await;
    assert_eq!(listed_ids(&body), ids_of(&[&ids[6]]));
    let (_, _, body) = get("/_rf/outbox/failed?limit=1").await;
    assert_eq!(listed_ids(&body).len(), 1, "{body}");
    let (status, _, body) = get("/_rf/outbox/failed?status=Sent").await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (400, json!("bad_request"))
    );

    // The metrics' destination gauges.
    let (status, _, text) = get("/_rf/metrics").await;
    assert_eq!(status, 200, "{text}");
    let pending = "rf_outbox_pending_messages";
    let attention = "rf_outbox_attention_messages";
    for (series, wanted) in [
        (format!("{pending}{{destination=\"ledger\"}}"), 2.0),
        (format!("{pending}{{destination=\"billing\"}}"), 0.0),
        (
            format!("{attention}{{destination=\"ledger\",status=\"Failed\"}}"),
            2.0,
        ),
        (
            format!("{attention}{{destination=\"ledger\",status=\"DeadLetter\"}}"),
            0.0,
        ),
        (
            format!("{attention}{{destination=\"billing\",status=\"DeadLetter\"}}"),
            1.0,
        ),
        (
            format!("{attention}{{destination=\"billing\",status=\"Expired\"}}"),
            1.0,
        ),
        ("rf_inbox_messages".to_owned(), 0.0),
    ] {
        assert_eq!(metric(&text, &series), wanted, "{series}");
    }
    let oldest = metric(
        &text,
        "rf_outbox_oldest_pending_age_seconds{destination=\"ledger\"}",
    );
    assert!((300.0..400.0).contains(&oldest), "{oldest}");

    // Readiness: the database and its schema are fine; no dispatcher yet.
    let (status, _, body) = call(
        &client,
        reqwest::Method::GET,
        &format!("{ops_url}/_rf/readyz"),
        None,
    )
    .await;
    let readiness = json_of(&body);
    assert_eq!(status, 503, "{body}");
    assert_eq!(readiness["failed"], json!(["dispatcher"]), "{body}");
    assert_eq!(readiness["checks"]["database"], "ok", "{body}");
    assert_eq!(readiness["checks"]["migrations"], "ok", "{body}");

    // Manual retries: one by id, then the matching ones; each row is back
    // to Pending, due, with its retry count reset.
    let (status, _, body) = post(&format!("/_rf/outbox/{}/retry", ids[0])).await;
    assert_eq!((status, json_of(&body)), (200, json!({"retried": 1})));
    let row = store.row(&ids[0]);
    assert_eq!((row.status, row.retry_count), (Status::Pending, 0));
    assert_eq!(store.row(&ids[1]).status, Status::Failed, "only that one");
    let (status, _, body) = post("/_rf/outbox/retry?status=Failed&destination=ledger").await;
    assert_eq!((status, json_of(&body)), (200, json!({"retried": 1})));
    let row = store.row(&ids[1]);
    assert_eq!((row.status, row.retry_count), (Status::Pending, 0));
    assert_eq!(
        store.row(&ids[5]).status,
        Status::DeadLetter,
        "filtered out"
    );
    assert_eq!(store.row(&ids[6]).status, Status::Expired, "filtered out");
    let (status, _, body) = post(&format!("/_rf/outbox/{}/retry", ids[2])).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(json_of(&body)["error"], "not_retryable");
    let (status, _, body) = post(&format!("/_rf/outbox/{}/retry", Uuid::now_v7())).await;
    assert_eq!(
        (status, json_of(&body)["error"].clone()),
        (404, json!("not_found"))
    );

    // The dispatcher delivers the retried and the waiting rows, once each.
    let dispatcher = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            sender_secret,
        )
        .start()
        .expect("dispatcher");
    for id in &ids[..4] {
        store.wait_for(id, Status::Sent).await;
    }
    assert_eq!(receiver_store.count("SELECT COUNT(*) FROM ledger"), 4);
    assert_eq!(
        receiver_store.count("SELECT CAST(SUM(amount) AS BIGINT) FROM ledger"),
        1 + 2 + 3 + 4
    );
    let (status, _, body) = call(
        &client,
        reqwest::Method::GET,
        &format!("{ops_url}/_rf/readyz"),
        None,
    )
    .await;
    assert_eq!(
        (status, json_of(&body)["status"].clone()),
        (200, json!("ready")),
        "{body}"
    );
    let (_, _, body) = get("/_rf/outbox/stats").await;
    let stats = json_of(&body);
    assert_eq!(stats["sent"], 5, "{stats}");
    assert_eq!(
        (stats["pending"].clone(), stats["failed"].clone()),
        (json!(0), json!(0))
    );

    // The receiver's side: its inbox holds one row per message processed.
    let receiver_ops = receiver_store
        .diagnostics()
        .metrics(receiver.receiver.metrics().clone())
        .build()
        .expect("receiver diagnostics");
    let (receiver_ops_url, _receiver_ops_server) = serve(receiver_ops.router()).await;
    let (status, _, body) = call(
        &client,
        reqwest::Method::GET,
        &format!("{receiver_ops_url}/_rf/inbox/stats"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let inbox = json_of(&body);
    assert_eq!(
        (inbox["size"].clone(), inbox["processed"].clone()),
        (json!(4), json!(4)),
        "{inbox}"
    );
    dispatcher.shutdown().await;
    receiver.receiver.shutdown().await;
}

on_every_store!(
    retention_deletes_what_served_its_purpose_and_keeps_what_needs_a_human,
    retention_story
);
async fn retention_story(store: &TestStore) {
    let outbox = store.outbox(sender_config(Duration::from_secs(60)));
    let now = rfidl_runtime::store::now_ms();
    // One group of rows per destination, so the same UPDATE picks each group
    // on both stores. More old Sent rows than one clean-up batch (1000).
    let many = |destination: &str, n: usize| {
        store.enqueue_many(
            &outbox,
            (0..n)
                .map(|i| message(destination, "Credit", json!({"amount": i})))
                .collect(),
        )
    };
    many("old-sent", 1_100);
    many("recent-sent", 3);
    let past_ttl = many("past-ttl", 2);
    many("waiting", 1);
    many("leased", 1);
    many("failed", 2);
    let update = |destination: &str, assignments: String| {
        store.execute(&format!(
            "UPDATE outbox_messages SET {assignments} WHERE destination = '{destination}'"
        ));
    };
    update(
        "old-sent",
        format!("status = 'Sent', sent_at = {}", now - 8 * DAY_MS),
    );
    update(
        "recent-sent",
        format!("status = 'Sent', sent_at = {}", now - DAY_MS),
    );
    update(
        "past-ttl",
        format!("expires_at = {}, next_retry_at = {}", now - 1, now + DAY_MS),
    );
    update(
        "leased",
        format!(
            "status = 'Sending', lease_token = 'l', expires_at = {}",
            now - 1
        ),
    );
    // Created long ago, but failed a day ago: within outbox.failed_retention.
    update(
        "failed",
        format!(
            "status = 'Failed', created_at = {0}, expires_at = {0}, last_attempt_at = {1}",
            now - 30 * DAY_MS,
            now - DAY_MS
        ),
    );
    store.insert_inbox_rows("old", 1_100, now - 1);
    store.insert_inbox_rows("fresh", 5, now + DAY_MS);

    let metrics = Arc::new(Metrics::default());
    // One pass (at start); the next would be an hour later.
    let mut config = sender_config(Duration::from_secs(60));
    config.cleanup_interval = Duration::from_secs(3600);
    let task = store.retention(config, metrics.clone());
    // The counters move together once the pass is done.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.inbox_deleted.get() == 0 {
        assert!(
            Instant::now() < deadline,
            "{}: no clean-up pass",
            store.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.shutdown().await;
    assert_eq!(
        (
            metrics.outbox_sent_deleted.get(),
            metrics.outbox_expired.get(),
            metrics.inbox_deleted.get()
        ),
        (1_100, 2, 1_100),
        "{}",
        store.name()
    );
    let in_group = |destination: &str, status: &str| {
        store.count(&format!(
            "SELECT COUNT(*) FROM outbox_messages \
             WHERE destination = '{destination}' AND status = '{status}'"
        ))
    };
    assert_eq!(
        store.count("SELECT COUNT(*) FROM outbox_messages WHERE destination = 'old-sent'"),
        0
    );
    assert_eq!(in_group("recent-sent", "Sent"), 3, "recent Sent rows stay");
    assert_eq!(
        in_group("past-ttl", "Expired"),
        2,
        "Pending past TTL expire"
    );
    for id in &past_ttl {
        assert_eq!(
            store.row(id).last_error.as_deref(),
            Some("time to live exceeded")
        );
    }
    assert_eq!(in_group("waiting", "Pending"), 1, "a due row stays");
    assert_eq!(
        in_group("leased", "Sending"),
        1,
        "a leased row is its dispatcher's"
    );
    assert_eq!(
        in_group("failed", "Failed"),
        2,
        "Failed rows wait for a human"
    );
    assert_eq!(store.count("SELECT COUNT(*) FROM inbox_messages"), 5);
    assert_eq!(
        store.count("SELECT COUNT(*) FROM inbox_messages WHERE message_id LIKE 'fresh-%'"),
        5
    );
}

/// PostgreSQL only: the routes and the probe open their sessions again when
/// the server ended them (a restart, an administrator); readiness answers
/// within its timeout when the database does not, and says when the schema
/// is not the one this build knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_diagnostics_reconnect_and_readiness_checks_the_schema() {
    let Some(store) = TestStore::postgres() else {
        return;
    };
    let ops = store
        .diagnostics()
        .readiness_timeout(Duration::from_millis(300))
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    let get = |path: &str| {
        let url = format!("{url}{path}");
        let client = client.clone();
        async move { call(&client, reqwest::Method::GET, &url, None).await }
    };
    for path in ["/_rf/health", "/_rf/readyz"] {
        let (status, _, body) = get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    // Every other session on the test database ends, as in a restart.
    let ended = store.count(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert!(ended >= 2, "the routes' and the probe's sessions: {ended}");
    for path in ["/_rf/health", "/_rf/outbox/stats", "/_rf/readyz"] {
        let (status, _, body) = get(path).await;
        assert_eq!(status, 200, "{path} after the sessions ended: {body}");
    }

    // A session that holds the schema table locked: the probe's read of it
    // gives up at the readiness timeout (`statement_timeout`), and answers.
    let pg_url = store.pg_url().to_owned();
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let locker = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&pg_url, postgres::NoTls).expect("connect");
        let mut tx = client.transaction().expect("tx");
        tx.batch_execute("LOCK TABLE rfidl_schema IN ACCESS EXCLUSIVE MODE")
            .expect("lock");
        locked_tx.send(()).expect("signal");
        let _ = release_rx.recv();
        tx.rollback().expect("release");
    });
    locked.recv().expect("locked");
    let started = Instant::now();
    let (status, _, body) = get("/_rf/readyz").await;
    let waited = started.elapsed();
    release.send(()).expect("release");
    locker.join().expect("locker");
    assert_eq!(status, 503, "{body}");
    let readiness = json_of(&body);
    assert_eq!(readiness["failed"], json!(["migrations"]), "{body}");
    assert!(
        readiness["checks"]["migrations"]
            .as_str()
            .is_some_and(|m| m.contains("no answer within 300ms")),
        "{body}"
    );
    assert!(
        (Duration::from_millis(250)..Duration::from_secs(3)).contains(&waited),
        "answered after {waited:?}, the readiness timeout is 300ms"
    );
    let (status, _, body) = get("/_rf/readyz").await;
    assert_eq!(status, 200, "the lock is gone: {body}");

    store.execute("UPDATE rfidl_schema SET version = version + 1");
    let (status, _, body) = get("/_rf/readyz").await;
    assert_eq!(status, 503, "{body}");
    let readiness = json_of(&body);
    assert_eq!(readiness["failed"], json!(["migrations"]), "{body}");
    let known = rfidl_runtime::store::sqlx_postgres::MIGRATIONS.len();
    assert_eq!(
        readiness["checks"]["migrations"],
        format!("schema version {}, this build needs {known}", known + 1),
        "{body}"
    );
}
