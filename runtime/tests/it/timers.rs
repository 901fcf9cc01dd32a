//! Durable timers (`OutgoingMessage::deliver_at`): a row that waits in the
//! outbox until its due time, leaves within milliseconds of it (not at the
//! next poll: the dispatchers here poll once a minute), survives a SIGKILL
//! of the process that wrote it, counts its TTL from the due time, and shows
//! in the health check as scheduled, not as backlog. Real databases, real
//! HTTP on loopback, a real child process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rfidl_runtime::diagnostics::HealthThresholds;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage, Status};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::operations::{call, json_of};
use crate::stores::{TestStore, on_every_store};
use crate::support::serve;

/// Long enough that a row sent in time was woken by its due time.
pub(crate) const POLL: Duration = Duration::from_secs(60);

/// A receiver that notes when each message arrived (Unix ms) and answers
/// by endpoint: `S200` acknowledges, `S503` asks for a retry.
#[derive(Clone, Default)]
pub(crate) struct Arrivals(Arc<Mutex<HashMap<String, Vec<i64>>>>);

impl Arrivals {
    pub(crate) fn of(&self, id: &Uuid) -> Vec<i64> {
        let arrivals = self.0.lock().expect("lock");
        arrivals.get(&id.to_string()).cloned().unwrap_or_default()
    }
}

async fn arrive(
    State(arrivals): State<Arrivals>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let at = unix_ms(SystemTime::now());
    let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let id = envelope["messageId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    arrivals
        .0
        .lock()
        .expect("lock")
        .entry(id)
        .or_default()
        .push(at);
    match envelope["endpoint"].as_str() {
        Some("S200") => {
            axum::Json(json!({"acknowledged": true, "duplicate": false, "payload": {}}))
                .into_response()
        }
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": "busy", "message": "later"})),
        )
            .into_response(),
    }
}

pub(crate) async fn receiver() -> (String, Arrivals, tokio::task::JoinHandle<()>) {
    let arrivals = Arrivals::default();
    let router = axum::Router::new()
        .route("/_rf/receive", axum::routing::post(arrive))
        .with_state(arrivals.clone());
    let (url, server) = serve(router).await;
    (url, arrivals, server)
}

pub(crate) fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// A due time `ahead` from now, whole milliseconds (as stored).
pub(crate) fn due_in(ahead: Duration) -> (SystemTime, i64) {
    let due = unix_ms(SystemTime::now() + ahead);
    (
        SystemTime::UNIX_EPOCH + Duration::from_millis(due as u64),
        due,
    )
}

pub(crate) async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A dispatcher on `store` sending `peer` to `url`, polling once a minute.
fn start_dispatcher(
    store: &TestStore,
    outbox: &crate::stores::AnyOutbox,
    url: &str,
) -> rfidl_runtime::dispatcher::DispatcherHandle {
    store
        .dispatcher(outbox)
        .route(
            "peer",
            HttpTransport::new(url, Duration::from_secs(2)).expect("transport"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher")
}

on_every_store!(
    a_timer_waits_then_leaves_at_its_due_time_and_is_scheduled_meanwhile,
    timer_fires_at_due
);
async fn timer_fires_at_due(store: &TestStore) {
    let (url, arrivals, _server) = receiver().await;
    let mut config = sender_config(POLL);
    config.outbox.ttl = Duration::from_secs(3600);
    let outbox = store.outbox(config);
    let handle = start_dispatcher(store, &outbox, &url);
    let (at, due) = due_in(Duration::from_millis(1500));
    let id = store.enqueue(&outbox, message("peer", "S200", json!({})).deliver_at(at));
    let now_id = store.enqueue(&outbox, message("peer", "S200", json!({})));

    // The TTL (and the envelope's createdAt) count from the due time.
    let stored = store.count(&format!(
        "SELECT COUNT(*) FROM outbox_messages WHERE message_id = '{id}' \
         AND next_retry_at = {due} AND created_at = {due} AND expires_at = {}",
        due + 3_600_000
    ));
    assert_eq!(stored, 1, "{}: the row's times", store.name());

    // Before it is due: scheduled, not backlog, however strict the thresholds.
    let mut strict = HealthThresholds::default();
    strict.backlog = 1;
    strict.oldest_pending_age = Duration::from_millis(1);
    let ops = outbox
        .watched_by(store.diagnostics())
        .thresholds(strict)
        .build()
        .expect("diagnostics");
    let (ops_url, _ops_server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    wait_until("the undelayed message", Duration::from_secs(5), || {
        arrivals.of(&now_id).len() == 1
    })
    .await;
    store.wait_for(&now_id, Status::Sent).await;
    let (status, _, body) = call(
        &client,
        reqwest::Method::GET,
        &format!("{ops_url}/_rf/health"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let health = json_of(&body);
    assert!(
        unix_ms(SystemTime::now()) < due,
        "{}: the health check ran too late to see the timer",
        store.name()
    );
    assert_eq!(health["status"], "healthy", "{}: {health}", store.name());
    assert_eq!(health["outbox"]["scheduled"], 1, "{health}");
    assert_eq!(health["outbox"]["pending"], 0, "{health}");
    assert!(health["outbox"]["oldestPendingAgeMs"].is_null(), "{health}");
    assert!(arrivals.of(&id).is_empty(), "sent before its due time");

    wait_until("the timer", Duration::from_secs(10), || {
        !arrivals.of(&id).is_empty()
    })
    .await;
    let late = arrivals.of(&id)[0] - due;
    assert!(late >= 0, "{}: sent {} ms early", store.name(), -late);
    // Generous for a loaded CI machine; a poll would be a minute late.
    assert!(late < 1_000, "{}: sent {late} ms after due", store.name());
    eprintln!("{}: timer sent {late} ms after its due time", store.name());
    store.wait_for(&id, Status::Sent).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(arrivals.of(&id).len(), 1, "sent once");
    handle.shutdown().await;
}

on_every_store!(a_timers_ttl_counts_from_its_due_time, ttl_from_due);
async fn ttl_from_due(store: &TestStore) {
    let (url, arrivals, _server) = receiver().await;
    let outbox = store.outbox(sender_config(POLL));
    let handle = start_dispatcher(store, &outbox, &url);
    // Due in 800 ms, 400 ms to live: counted from the enqueue it would
    // expire unsent at its first claim.
    let (at, due) = due_in(Duration::from_millis(800));
    let timer = OutgoingMessage {
        ttl: Some(Duration::from_millis(400)),
        max_retries: Some(10_000),
        ..message("peer", "S503", json!({}))
    };
    let id = store.enqueue(&outbox, timer.deliver_at(at));
    let row = store.wait_for(&id, Status::Expired).await;
    assert_eq!(row.status, Status::Expired, "{}", store.name());
    let tried = arrivals.of(&id);
    assert!(!tried.is_empty(), "{}: expired unsent", store.name());
    assert!(tried[0] >= due, "{}: tried before due", store.name());
    handle.shutdown().await;
}

/// The child process of the kill test: set by the parent, read by the child.
const CHILD_ENV: &str = "RFIDL_TIMER_TEST_CHILD";

/// Not a test of its own: the child process that
/// `a_timer_survives_…` starts (this test binary, re-executed with
/// [`CHILD_ENV`] set) and SIGKILLs. It runs a dispatcher, enqueues a timer,
/// says so, and waits to be killed. Without the variable it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_service_of_the_timer_kill_test() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec: serde_json::Value = serde_json::from_str(&spec).expect("child spec");
    let db = PathBuf::from(spec["db"].as_str().expect("db"));
    let outbox = Outbox::new(sender_config(POLL), &db);
    let _dispatcher = Dispatcher::builder(&outbox)
        .route(
            "peer",
            HttpTransport::new(spec["url"].as_str().expect("url"), Duration::from_secs(2))
                .expect("transport"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    let due = spec["due"].as_u64().expect("due");
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(due);
    let id = crate::dispatcher::enqueue(
        &outbox,
        &db,
        message("peer", "S200", json!({})).deliver_at(at),
    );
    std::fs::write(spec["marker"].as_str().expect("marker"), id.to_string()).expect("marker");
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the parent did not kill this child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_survives_a_sigkill_before_due_and_is_sent_once_after() {
    let (url, arrivals, _server) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("service.db");
    let marker = dir.path().join("enqueued");
    let (_, due) = due_in(Duration::from_secs(4));
    let spec = json!({"db": db, "url": url, "due": due, "marker": marker});
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "timers::child_service_of_the_timer_kill_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("child process");
    wait_until("the child enqueues", Duration::from_secs(30), || {
        marker.exists() && std::fs::read_to_string(&marker).is_ok_and(|t| t.len() == 36)
    })
    .await;
    // SIGKILL, with the timer committed and not due.
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    assert!(
        unix_ms(SystemTime::now()) < due - 500,
        "the child took too long: killed after the timer was due"
    );
    let id: Uuid = std::fs::read_to_string(&marker)
        .expect("marker")
        .parse()
        .expect("id");
    assert_eq!(
        crate::dispatcher::status_of(&db, &id).status,
        Status::Pending
    );
    assert!(arrivals.of(&id).is_empty(), "sent before its due time");

    // The next process: a dispatcher on the same file sends it once, at due.
    let outbox = Outbox::new(sender_config(POLL), &db);
    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_secs(2)).expect("transport"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    wait_until(
        "the timer after the restart",
        Duration::from_secs(15),
        || !arrivals.of(&id).is_empty(),
    )
    .await;
    let late = arrivals.of(&id)[0] - due;
    assert!((0..1_000).contains(&late), "sent {late} ms after due");
    crate::dispatcher::wait_for(&db, &id, Status::Sent).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(arrivals.of(&id).len(), 1, "sent exactly once");
    assert_eq!(crate::dispatcher::status_of(&db, &id).status, Status::Sent);
    dispatcher.shutdown().await;
}
