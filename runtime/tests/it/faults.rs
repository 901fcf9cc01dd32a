//! The dispatcher under faults, end to end on loopback with a real receiver:
//! an outage shorter than the TTL needs no human and resumes at once when
//! the receiver is back (circuit breaker), a batch whose answer keeps getting
//! lost is split until every message goes through, a message older than the
//! receiver's dedup horizon is refused and fails at the sender (and a manual
//! retry warns), and clock skew is reported as such. Each body runs on
//! every store (`on_every_store!`): none of these faults is about the
//! SQLite file (those are in `powerloss.rs`, `disk_full.rs`, `faultfs.rs`
//! and `operations.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rfidl_runtime::outbox::Status;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;

use crate::dispatcher::{message, sender_config};
use crate::stores::{TestStore, on_every_store};
use crate::support::{receiver_config, serve};

/// A loopback front door for a receiver: forwards connections while up;
/// while down, accepts and drops each one at once (counted), as a host
/// whose service is gone does.
struct Front {
    url: String,
    up: Arc<AtomicBool>,
    dropped: Arc<AtomicU32>,
    _task: tokio::task::JoinHandle<()>,
}

async fn front(target: SocketAddr) -> Front {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let up = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicU32::new(0));
    let task = {
        let (up, dropped) = (up.clone(), dropped.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up.load(Ordering::SeqCst) {
                    dropped.fetch_add(1, Ordering::SeqCst);
                    drop(inbound);
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        })
    };
    Front {
        url,
        up,
        dropped,
        _task: task,
    }
}

fn address_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().expect("address")
}

/// `GET /_rf/health` of the diagnostics served at `url`.
async fn health_of(url: &str) -> serde_json::Value {
    reqwest::get(format!("{url}/_rf/health"))
        .await
        .expect("health")
        .json()
        .await
        .expect("json")
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

on_every_store!(
    an_outage_shorter_than_the_ttl_needs_no_human_and_the_backlog_resumes_at_once,
    outage
);
async fn outage(store: &TestStore) {
    let secret = rfidl_runtime::signing::Secret::generate();
    let receiver_store = store.another();
    let receiver = receiver_store
        .start_receiver(receiver_config(&[&secret]))
        .await;
    let front = front(address_of(&receiver.url)).await;
    // Two counted retries would fail every message within ~100 ms of outage.
    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.max_retries = 2;
    config.outbox.probe_interval_max = Duration::from_millis(200);
    config.outbox.jitter = Duration::from_millis(20);
    let outbox = store.outbox(config);
    let dispatcher = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&front.url, Duration::from_millis(300)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    let messages = 300;
    // In one transaction: the outage below starts when they are all due
    // (one at a time, on a busy machine, the enqueues alone took seconds).
    store.enqueue_many(
        &outbox,
        (0..messages)
            .map(|i| {
                message(
                    "ledger",
                    "Credit",
                    json!({"account": "outage", "amount": i}),
                )
            })
            .collect(),
    );
    let outage = Duration::from_secs(2);
    tokio::time::sleep(outage).await;
    let attempts_during_outage = front.dropped.load(Ordering::SeqCst);
    assert_eq!(
        store.count(
            "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')"
        ),
        0,
        "an outage shorter than the TTL needs no human: {:?}",
        store.status_counts()
    );
    assert_eq!(
        store.count("SELECT MAX(retry_count) FROM outbox_messages"),
        0,
        "an unreachable receiver is not counted against max_retries"
    );
    // One probe per interval (≤ 200 ms) after the circuit opened, not one
    // request per message and backoff: a few dozen connections at most.
    assert!(
        attempts_during_outage <= 30,
        "{attempts_during_outage} connections in {outage:?} of outage"
    );
    let health = outbox
        .watched_by(store.diagnostics())
        .build()
        .expect("diagnostics");
    let (health_url, _health_server) = serve(health.router()).await;
    let during: serde_json::Value = health_of(&health_url).await;
    assert_eq!(during["status"], "warning", "{during}");
    assert!(
        during["reasons"]
            .to_string()
            .contains("destination `ledger` unreachable"),
        "{during}"
    );

    front.up.store(true, Ordering::SeqCst);
    let drained = wait_until("drain after the outage", Duration::from_secs(10), || {
        store.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'") == messages
    })
    .await;
    // The waiting rows were due all along; only the next probe (≤ 200 ms
    // plus jitter) stood between the receiver's return and the drain.
    assert!(
        drained < Duration::from_secs(3),
        "the backlog resumed at once: drained in {drained:?}"
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        messages
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        messages,
        "each message took effect once"
    );
    let after: serde_json::Value = health_of(&health_url).await;
    assert_eq!(after["status"], "healthy", "{after}");
    eprintln!(
        "outage {outage:?}: {attempts_during_outage} connection attempts ({:.1}/s), drained {messages} in {drained:?}",
        f64::from(attempts_during_outage) / outage.as_secs_f64()
    );
    dispatcher.shutdown().await;
}

/// Lets the receiver process every batch, but answers a batch of more than
/// `LOSSY_ABOVE` messages only after the sender has given up on it.
const LOSSY_ABOVE: usize = 4;

async fn lose_answers_of_big_batches(request: Request, next: Next) -> Response {
    if request.uri().path() != "/_rf/receive/batch" {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return axum::http::StatusCode::BAD_REQUEST.into_response();
    };
    let items = serde_json::from_slice::<Vec<serde_json::Value>>(&bytes).map_or(0, |v| v.len());
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if items > LOSSY_ABOVE {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    response
}

on_every_store!(
    a_batch_whose_answer_keeps_getting_lost_is_split_until_every_message_goes_through,
    lost_batch_answers
);
async fn lost_batch_answers(store: &TestStore) {
    let secret = rfidl_runtime::signing::Secret::generate();
    let receiver_store = store.another();
    let receiver = receiver_store
        .start_receiver(receiver_config(&[&secret]))
        .await;
    let lossy = receiver
        .receiver
        .router()
        .layer(axum::middleware::from_fn(lose_answers_of_big_batches));
    let (url, _server) = serve(lossy).await;
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.max_retries = 1;
    config.outbox.batch_size = 32;
    let outbox = store.outbox(config);
    let messages = 64;
    store.enqueue_many(
        &outbox,
        (0..messages)
            .map(|i| message("ledger", "Credit", json!({"account": "lossy", "amount": i})))
            .collect(),
    );
    let dispatcher = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&url, Duration::from_millis(300)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    wait_until(
        "every message acknowledged",
        Duration::from_secs(30),
        || store.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'") == messages,
    )
    .await;
    assert_eq!(
        store.status_counts(),
        vec![("Sent".to_owned(), messages)],
        "none failed for the company it travelled in"
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        messages
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        messages,
        "answers were lost, effects were not doubled"
    );
    dispatcher.shutdown().await;
}

on_every_store!(
    a_message_older_than_the_receivers_dedup_horizon_is_refused_and_fails_at_the_sender,
    dedup_horizon
);
async fn dedup_horizon(store: &TestStore) {
    let secret = rfidl_runtime::signing::Secret::generate();
    let mut config = receiver_config(&[&secret]);
    config.inbox.retention = Duration::from_secs(60);
    config.inbox.signature_tolerance = Duration::from_secs(5);
    let receiver_store = store.another();
    let receiver = receiver_store.start_receiver(config).await;
    let mut sender = sender_config(Duration::from_millis(20));
    // The sender assumes the same horizon for its manual-retry warning.
    sender.inbox.retention = Duration::from_secs(60);
    sender.inbox.signature_tolerance = Duration::from_secs(5);
    let outbox = store.outbox(sender);
    let fresh = store.enqueue(
        &outbox,
        message("ledger", "Credit", json!({"account": "h", "amount": 1})),
    );
    let old = store.enqueue(
        &outbox,
        message("ledger", "Credit", json!({"account": "h", "amount": 2})),
    );
    // Restored from an old backup: created two minutes ago, never acknowledged.
    store.execute(&format!(
        "UPDATE outbox_messages SET created_at = created_at - 120000 WHERE message_id = '{old}'"
    ));
    let dispatcher = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_millis(300)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    store.wait_for(&fresh, Status::Sent).await;
    let row = store.wait_for(&old, Status::Failed).await;
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("beyond_dedup_horizon"), "{error}");
    assert_eq!(row.retry_count, 0, "refused at once, not retried");
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger WHERE amount = 2"),
        0,
        "never processed"
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM inbox_messages"),
        1,
        "only the fresh message left an inbox row"
    );

    // An operator retries it: the answer warns, and it comes back Failed.
    let diagnostics = outbox
        .watched_by(store.diagnostics())
        .bearer_token("ops-token")
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(diagnostics.router()).await;
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/_rf/outbox/{old}/retry"))
        .bearer_auth("ops-token")
        .send()
        .await
        .expect("retry")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["retried"], 1, "{answer}");
    assert!(
        answer["warning"]
            .as_str()
            .is_some_and(|w| w.contains("beyond_dedup_horizon")),
        "{answer}"
    );
    let bulk: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/_rf/outbox/retry?status=Failed"))
        .bearer_auth("ops-token")
        .send()
        .await
        .expect("bulk retry")
        .json()
        .await
        .expect("json");
    assert!(bulk["retried"].as_u64().is_some(), "{bulk}");
    store.wait_for(&old, Status::Failed).await;
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger WHERE amount = 2"),
        0,
        "still never processed"
    );
    let no_warning: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/_rf/outbox/{fresh}/retry"))
        .bearer_auth("ops-token")
        .send()
        .await
        .expect("retry")
        .json()
        .await
        .expect("json");
    assert_eq!(
        no_warning["error"], "not_retryable",
        "a Sent message is not retried: {no_warning}"
    );
    dispatcher.shutdown().await;
}

on_every_store!(
    clock_skew_is_retried_without_counting_and_reported_as_a_clock_problem,
    clock_skew
);
async fn clock_skew(store: &TestStore) {
    // A receiver whose clock is far from ours refuses every timestamp.
    let router = axum::Router::new().route(
        "/_rf/receive",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::UNAUTHORIZED,
                axum::Json(json!({
                    "error": "timestamp_out_of_range",
                    "message": "webhook-timestamp is 3600 s away from this receiver's clock"
                })),
            )
        }),
    );
    let (url, _server) = serve(router).await;
    let outbox = store.outbox(sender_config(Duration::from_millis(20)));
    let id = store.enqueue(&outbox, message("skewed", "Credit", json!({})));
    let dispatcher = store
        .dispatcher(&outbox)
        .route(
            "skewed",
            HttpTransport::new(&url, Duration::from_millis(300)).expect("client"),
            rfidl_runtime::signing::Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    // The first refusal, then well past sender_config's 2 counted retries
    // (attempts every 20-40 ms; under load the first may take a while).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.row(&id).last_error.is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let row = store.row(&id);
    assert!(
        matches!(row.status, Status::Pending | Status::Sending),
        "{row:?}"
    );
    assert_eq!(row.retry_count, 0, "{row:?}");
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("clock problem")),
        "{row:?}"
    );
    let diagnostics = outbox
        .watched_by(store.diagnostics())
        .build()
        .expect("diagnostics");
    let (health_url, _health) = serve(diagnostics.router()).await;
    let health: serde_json::Value = health_of(&health_url).await;
    assert_eq!(health["status"], "warning", "{health}");
    assert!(
        health["reasons"].to_string().contains("clock problem"),
        "{health}"
    );
    dispatcher.shutdown().await;
}
