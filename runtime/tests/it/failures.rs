//! Code that reacts when a message will never be delivered (issue 30,
//! `rfidl_runtime::failures`), on every store: a real HTTP receiver on
//! loopback answers each message as its payload asks (a refusal, one beyond
//! the dedup horizon, a handler that keeps failing), and a message outlives
//! its time to live. The sender's failure handler writes one
//! `compensations` row per terminal transition, with the request and the
//! error, in the transaction that writes the status; a handler that fails
//! leaves no row and the message still ends; an operator's retry that fails
//! again is a new transition; two handlers for one version stop the start.
//! The sqlx stores' async handlers: `failures_sqlx.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rfidl_runtime::dispatcher::DispatcherError;
use rfidl_runtime::failures::{AsyncFailureHandler, Failure, FailureHandler};
use rfidl_runtime::outbox::{OutgoingMessage, Status};
use rfidl_runtime::receiver::HandlerError;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{BoxFuture, Config, Sqlite};
use serde_json::json;

use crate::dispatcher::{message, sender_config};
use crate::operations::{call, json_of};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, serve};

/// What the failure handlers write: one row per terminal transition.
pub(crate) const COMPENSATIONS: &str = "CREATE TABLE compensations (\
     message_id TEXT NOT NULL, status TEXT NOT NULL, endpoint TEXT NOT NULL, \
     code TEXT, error TEXT NOT NULL, retries BIGINT NOT NULL, account TEXT)";

/// The account whose compensation fails (after writing its row).
pub(crate) const CURSED: &str = "cursed";

/// A receiver on loopback that answers each message as its payload's
/// `answer` says: `refuse` (422 `invalid_payload`: dead letter), `beyond`
/// (422 `beyond_dedup_horizon`: failed), `crash` (500 `handler_failed`,
/// retried until failed); anything else is acknowledged. It checks no
/// signature: only the sender is under test.
pub(crate) async fn scripted_receiver() -> (String, tokio::task::JoinHandle<()>) {
    let router = axum::Router::new().fallback(|body: axum::body::Bytes| async move {
        let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let (status, code, text) = match envelope["payload"]["answer"].as_str() {
            Some("refuse") => (422, "invalid_payload", "no such account"),
            Some("beyond") => (422, "beyond_dedup_horizon", "too old to tell"),
            Some("crash") => (500, "handler_failed", "the ledger is down"),
            _ => {
                let ack = json!({"acknowledged": true, "duplicate": false, "payload": null});
                return (axum::http::StatusCode::OK, ack.to_string());
            }
        };
        let status = axum::http::StatusCode::from_u16(status).expect("status");
        (status, json!({"error": code, "message": text}).to_string())
    });
    serve(router).await
}

/// The sender's config for these tests: one message per request, fast
/// retries, two of them.
pub(crate) fn config() -> Config {
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.batch_size = 1;
    config
}

/// A `Credit` of `account` that the scripted receiver answers with `answer`.
pub(crate) fn credit(account: &str, answer: &str) -> OutgoingMessage {
    message(
        "ledger",
        "Credit",
        json!({"account": account, "answer": answer}),
    )
}

/// Counts its calls; writes a `compensations` row, then fails for
/// [`CURSED`].
#[derive(Default)]
struct Compensations {
    calls: AtomicU32,
}

struct Compensate(Arc<Compensations>);

impl Compensate {
    /// The row's values, and whether to fail after writing it.
    fn row<'a>(&self, failure: &'a Failure<'a>) -> (i64, Option<&'a str>, bool) {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        let account = failure.payload["account"].as_str();
        (i64::from(failure.retries), account, account == Some(CURSED))
    }
}

fn refuse_if(cursed: bool) -> Result<(), HandlerError> {
    if cursed {
        return Err(HandlerError::retryable("the compensation service is down"));
    }
    Ok(())
}

impl FailureHandler<Sqlite> for Compensate {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle(
        &self,
        failure: &Failure<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        let (retries, account, cursed) = self.row(failure);
        tx.execute(
            "INSERT INTO compensations VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            rusqlite::params![
                failure.message_id,
                failure.status.as_str(),
                failure.endpoint,
                failure.code(),
                failure.error,
                retries,
                account
            ],
        )?;
        refuse_if(cursed)
    }
}

// The same handler on both sqlx stores.
crate::stores::on_each_sqlx_store! {
impl AsyncFailureHandler<Db> for Compensate {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle<'a>(
        &'a self,
        failure: &'a Failure<'a>,
        conn: &'a mut Conn,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let (retries, account, cursed) = self.row(failure);
            sqlx::query("INSERT INTO compensations VALUES ($1, $2, $3, $4, $5, $6, $7)")
                .bind(failure.message_id)
                .bind(failure.status.as_str())
                .bind(failure.endpoint)
                .bind(failure.code())
                .bind(failure.error)
                .bind(retries)
                .bind(account)
                .execute(conn)
                .await
                .map_err(HandlerError::retryable)?;
            refuse_if(cursed)
        })
    }
}
}

/// A dispatcher for `outbox` that sends to the scripted receiver at `url`
/// and runs [`Compensate`] around `handler`.
fn start_dispatcher(
    store: &TestStore,
    outbox: &crate::stores::AnyOutbox,
    url: &str,
    handler: &Arc<Compensations>,
) -> rfidl_runtime::dispatcher::DispatcherHandle {
    store
        .dispatcher(outbox)
        .route(
            "ledger",
            HttpTransport::new(url, Duration::from_secs(2)).expect("client"),
            Secret::generate(),
        )
        .failures(Compensate(Arc::clone(handler)))
        .start()
        .expect("dispatcher")
}

on_every_store!(
    each_terminal_status_runs_the_failure_handler_once_with_the_request_and_the_error,
    every_terminal_status
);
async fn every_terminal_status(store: &TestStore) {
    let (url, _server) = scripted_receiver().await;
    let outbox = store.outbox(config());
    store.execute(COMPENSATIONS);
    let refused = store.enqueue(&outbox, credit("a-refused", "refuse"));
    let beyond = store.enqueue(&outbox, credit("a-beyond", "beyond"));
    let crashing = store.enqueue(&outbox, credit("a-crash", "crash"));
    let mut late = credit("a-late", "ok");
    late.ttl = Some(Duration::from_millis(1));
    let expired = store.enqueue(&outbox, late);
    // Another version: no handler of its own, so none runs.
    let mut other = credit("a-other", "refuse");
    other.version = 2;
    let unhandled = store.enqueue(&outbox, other);
    let delivered = store.enqueue(&outbox, credit("a-ok", "ok"));
    tokio::time::sleep(Duration::from_millis(20)).await;

    let handler = Arc::new(Compensations::default());
    let dispatcher = start_dispatcher(store, &outbox, &url, &handler);
    for (id, status) in [
        (&refused, Status::DeadLetter),
        (&beyond, Status::Failed),
        (&crashing, Status::Failed),
        (&expired, Status::Expired),
        (&unhandled, Status::DeadLetter),
        (&delivered, Status::Sent),
    ] {
        store.wait_for(id, status).await;
    }
    // Time for a second run, should anything run it again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    dispatcher.shutdown().await;

    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        4,
        "once per transition"
    );
    assert_eq!(store.count("SELECT COUNT(*) FROM compensations"), 4);
    let row = |id: &uuid::Uuid| {
        store
            .text(&format!(
                "SELECT status || '|' || endpoint || '|' || COALESCE(code, '-') || '|' || \
                 retries || '|' || account || '|' || error \
                 FROM compensations WHERE message_id = '{id}'"
            ))
            .unwrap_or_default()
    };
    assert_eq!(
        row(&refused),
        "DeadLetter|Credit|invalid_payload|0|a-refused|422 invalid_payload: no such account"
    );
    assert_eq!(
        row(&beyond),
        "Failed|Credit|beyond_dedup_horizon|0|a-beyond|422 beyond_dedup_horizon: too old to tell"
    );
    assert_eq!(
        row(&crashing),
        "Failed|Credit|handler_failed|2|a-crash|500 handler_failed: the ledger is down",
        "after its two retries"
    );
    assert_eq!(
        row(&expired),
        "Expired|Credit|-|0|a-late|time to live exceeded"
    );
    // The rows' own last_error is what the handler saw.
    assert_eq!(
        store.row(&refused).last_error.as_deref(),
        Some("422 invalid_payload: no such account")
    );
    assert_eq!(
        store.row(&expired).last_error.as_deref(),
        Some("time to live exceeded")
    );
    assert_eq!(
        outbox.metrics().outbox_expired.get(),
        1,
        "the expiry is counted once"
    );
}

on_every_store!(
    a_row_whose_ttl_passes_in_backoff_is_expired_by_the_dispatcher_with_its_handler,
    expired_in_backoff
);
/// A failed attempt puts the row's next try an hour ahead; its TTL passes
/// first, so no claim finds it: retention does. Of a version with a failure
/// handler, retention makes the row due and the dispatcher expires it with
/// the handler (once); of a version without one, retention expires it.
async fn expired_in_backoff(store: &TestStore) {
    let (url, _server) = scripted_receiver().await;
    let mut config = config();
    config.outbox.backoff_base = Duration::from_secs(3600);
    config.outbox.backoff_max = Duration::from_secs(3600);
    let outbox = store.outbox(config.clone());
    store.execute(COMPENSATIONS);
    let ttl = Duration::from_millis(600);
    let mut handled = credit("a-late", "crash");
    handled.ttl = Some(ttl);
    let mut unhandled = credit("a-other", "crash");
    unhandled.ttl = Some(ttl);
    unhandled.version = 2;
    let handled = store.enqueue(&outbox, handled);
    let unhandled = store.enqueue(&outbox, unhandled);
    let enqueued = std::time::Instant::now();

    let calls = Arc::new(Compensations::default());
    let dispatcher = start_dispatcher(store, &outbox, &url, &calls);
    for id in [&handled, &unhandled] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.row(id).retry_count == 0 {
            assert!(std::time::Instant::now() < deadline, "no first attempt");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(store.row(id).status, Status::Pending, "waits an hour");
    }
    tokio::time::sleep((enqueued + ttl).saturating_duration_since(std::time::Instant::now())).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store.row(&handled).status,
        Status::Pending,
        "no claim found it"
    );

    let metrics = Arc::new(rfidl_runtime::metrics::Metrics::default());
    let retention =
        store.retention_beside(config, Arc::clone(&metrics), &[(support::INTERFACE, 1)]);
    store.wait_for(&unhandled, Status::Expired).await;
    store.wait_for(&handled, Status::Expired).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    retention.shutdown().await;
    dispatcher.shutdown().await;

    assert_eq!(
        calls.calls.load(Ordering::SeqCst),
        1,
        "once, for the handled version"
    );
    assert_eq!(
        store
            .text(&format!(
                "SELECT status || '|' || error FROM compensations WHERE message_id = '{handled}'"
            ))
            .as_deref(),
        Some("Expired|time to live exceeded")
    );
    assert_eq!(
        metrics.outbox_expired.get(),
        1,
        "retention expired the unhandled version's row only"
    );
    assert_eq!(
        outbox.metrics().outbox_expired.get(),
        1,
        "the dispatcher expired the handled one"
    );
}

/// The same through a [`rfidl_runtime::host::Host`]: its retention, passing
/// every 50 ms, leaves the row to the dispatcher and its failure handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_retention_leaves_the_expiry_to_the_failure_handler() {
    let (url, _server) = scripted_receiver().await;
    let store = TestStore::sqlite();
    let TestStore::Sqlite { path, .. } = &store else {
        unreachable!()
    };
    let mut config = config();
    config.outbox.backoff_base = Duration::from_secs(3600);
    config.outbox.backoff_max = Duration::from_secs(3600);
    config.cleanup_interval = Duration::from_millis(50);
    config.destinations.insert(
        "ledger".into(),
        rfidl_runtime::config::DestinationConfig::new(&url, Secret::generate().to_whsec()),
    );
    let calls = Arc::new(Compensations::default());
    let builder = rfidl_runtime::host::Host::builder(config, path);
    let outbox = crate::stores::AnyOutbox::Sqlite(builder.outbox().clone());
    store.execute(COMPENSATIONS);
    let host = builder
        .failures(Compensate(Arc::clone(&calls)))
        .listen("127.0.0.1:0")
        .await
        .expect("host");
    let mut late = credit("a-late", "crash");
    late.ttl = Some(Duration::from_millis(600));
    let id = store.enqueue(&outbox, late);
    store.wait_for(&id, Status::Expired).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    host.shutdown().await.expect("stops");
    assert_eq!(store.row(&id).retry_count, 1, "one attempt, then the wait");
    assert_eq!(calls.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        store
            .text(&format!(
                "SELECT status || '|' || error FROM compensations WHERE message_id = '{id}'"
            ))
            .as_deref(),
        Some("Expired|time to live exceeded")
    );
}

on_every_store!(
    a_failing_failure_handler_leaves_no_effect_and_the_message_still_ends,
    failing_handler
);
async fn failing_handler(store: &TestStore) {
    let (url, _server) = scripted_receiver().await;
    let outbox = store.outbox(config());
    store.execute(COMPENSATIONS);
    let cursed = store.enqueue(&outbox, credit(CURSED, "refuse"));
    let mut cursed_late = credit(CURSED, "ok");
    cursed_late.ttl = Some(Duration::from_millis(1));
    let cursed_expired = store.enqueue(&outbox, cursed_late);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let handler = Arc::new(Compensations::default());
    let dispatcher = start_dispatcher(store, &outbox, &url, &handler);
    let dead = store.wait_for(&cursed, Status::DeadLetter).await;
    let gone = store.wait_for(&cursed_expired, Status::Expired).await;
    // The dispatcher goes on: later messages are delivered and handled.
    let after = store.enqueue(&outbox, credit("a-ok", "ok"));
    let refused = store.enqueue(&outbox, credit("a-refused", "refuse"));
    store.wait_for(&after, Status::Sent).await;
    store.wait_for(&refused, Status::DeadLetter).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    dispatcher.shutdown().await;

    assert_eq!(
        dead.last_error.as_deref(),
        Some(
            "422 invalid_payload: no such account; failure handler: handler failed: the compensation \
             service is down"
        )
    );
    assert_eq!(
        gone.last_error.as_deref(),
        Some(
            "time to live exceeded; failure handler: handler failed: the compensation service is down"
        )
    );
    assert_eq!(
        store.count(&format!(
            "SELECT COUNT(*) FROM compensations WHERE account = '{CURSED}'"
        )),
        0,
        "the failing handler's writes rolled back"
    );
    assert_eq!(
        store.count(&format!(
            "SELECT COUNT(*) FROM compensations WHERE message_id = '{refused}'"
        )),
        1
    );
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        3,
        "a failed handler is not run again for the same transition"
    );
}

on_every_store!(
    an_operators_retry_that_fails_again_is_a_new_transition,
    retried_by_an_operator
);
async fn retried_by_an_operator(store: &TestStore) {
    const TOKEN: &str = "ops-token";
    let (url, _server) = scripted_receiver().await;
    let outbox = store.outbox(config());
    store.execute(COMPENSATIONS);
    let refused = store.enqueue(&outbox, credit("a-refused", "refuse"));
    let handler = Arc::new(Compensations::default());
    let dispatcher = start_dispatcher(store, &outbox, &url, &handler);
    store.wait_for(&refused, Status::DeadLetter).await;
    let ops = outbox
        .watched_by(store.diagnostics())
        .bearer_token(TOKEN)
        .build()
        .expect("diagnostics");
    let (ops_url, _ops_server) = serve(ops.router()).await;
    let (status, _, body) = call(
        &reqwest::Client::new(),
        reqwest::Method::POST,
        &format!("{ops_url}/_rf/outbox/{refused}/retry"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 200, "{}", json_of(&body));
    // Refused again: a second transition, a second run.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while handler.calls.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "no second run");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.wait_for(&refused, Status::DeadLetter).await;
    dispatcher.shutdown().await;
    assert_eq!(
        store.count(&format!(
            "SELECT COUNT(*) FROM compensations WHERE message_id = '{refused}'"
        )),
        2
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

on_every_store!(
    two_failure_handlers_for_one_version_stop_the_start_and_change_nothing,
    duplicate_handlers
);
async fn duplicate_handlers(store: &TestStore) {
    let (url, _server) = scripted_receiver().await;
    let outbox = store.outbox(config());
    store.execute(COMPENSATIONS);
    let refused = store.enqueue(&outbox, credit("a-refused", "refuse"));
    let handler = Arc::new(Compensations::default());
    let error = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
            Secret::generate(),
        )
        .failures(Compensate(handler.clone()))
        .failures(Compensate(handler.clone()))
        .start()
        .err()
        .expect("two handlers for one version are refused");
    assert!(
        matches!(
            error,
            DispatcherError::DuplicateFailureHandler {
                interface: support::INTERFACE,
                version: 1
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "more than one failure handler for `test.Ledger` v1: register one per interface version"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        store.row(&refused).status,
        Status::Pending,
        "nothing was sent"
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
}
