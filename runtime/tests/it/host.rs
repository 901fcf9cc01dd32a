//! `rfidl_runtime::Host`: a service's parts started, served and stopped
//! together, on real databases (SQLite files, PostgreSQL) and real HTTP on
//! loopback. One host receives (the ledger), another sends to it; a stop
//! asked for by a token leaves no row `Sending`, ends within its bound, and
//! the stopped receiver refuses; both start again on the same databases and
//! every message takes effect once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use rfidl_runtime::Config;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::host::{Host, HostError};
use rfidl_runtime::outbox::Status;
use rfidl_runtime::receiver::{HandlerError, HostedInterface, HostedService, IncomingCall};
use rfidl_runtime::signing::{Secret, SignatureHeaders};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::stores::{AnyOutbox, TestStore, on_every_store};
use crate::support::{self, Ledger, LedgerService};

/// The bound every host here stops within.
const BOUND: Duration = Duration::from_secs(5);

fn secret() -> Secret {
    Secret::parse("whsec_c2VjcmV0LWtleS1mb3ItdGhlLWhvc3QtdGVzdHM=").expect("secret")
}

/// The ledger service, hosted on `store`, on a free loopback port.
async fn ledger_host(store: &TestStore, ledger: Arc<Ledger>) -> Host {
    let config = support::receiver_config(&[&secret()]);
    /// The same on every store's builder.
    macro_rules! host {
        ($location:expr) => {
            Host::builder(config, $location)
                .service(LedgerService(ledger))
                .shutdown_timeout(BOUND)
                .listen("127.0.0.1:0")
                .await
        };
    }
    match store {
        TestStore::Sqlite { path, .. } => host!(path),
        TestStore::Postgres { store, .. } => host!(store),
        TestStore::SqlxSqlite { store, .. } => host!(store),
    }
    .expect("the ledger's host starts")
}

/// The sender (`billing`) on `store`, sending to the ledger at `ledger_url`;
/// its outbox, and the host serving its diagnostics with `ops_token`.
async fn sender_host(store: &TestStore, ledger_url: &str) -> (AnyOutbox, Host) {
    let mut config = sender_config(Duration::from_millis(50));
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(ledger_url, secret().to_whsec()),
    );
    config.outbox.max_retries = 1_000;
    /// The same on every store's builder.
    macro_rules! sender {
        ($location:expr, $kind:ident) => {{
            let builder = Host::builder(config, $location);
            let outbox = AnyOutbox::$kind(builder.outbox().clone());
            (outbox, sender_start(builder).await)
        }};
    }
    let (outbox, host) = match store {
        TestStore::Sqlite { path, .. } => sender!(path, Sqlite),
        TestStore::Postgres { store, .. } => sender!(store, Postgres),
        TestStore::SqlxSqlite { store, .. } => sender!(store, SqlxSqlite),
    };
    (outbox, host.expect("the sender's host starts"))
}

async fn sender_start<S: rfidl_runtime::AnyStore>(
    builder: rfidl_runtime::host::HostBuilder<S>,
) -> Result<Host, HostError> {
    builder
        .ops_token("ops-t0ken")
        .shutdown_timeout(BOUND)
        .listen("127.0.0.1:0")
        .await
}

fn credits(store: &TestStore, outbox: &AnyOutbox, from: i64, to: i64) -> Vec<Uuid> {
    store.enqueue_many(
        outbox,
        (from..to)
            .map(|n| message("ledger", "Credit", json!({"account": "host", "amount": n})))
            .collect(),
    )
}

on_every_store!(
    a_host_receives_and_sends_and_its_stop_leaves_nothing_sending,
    receives_sends_and_stops
);
async fn receives_sends_and_stops(store: &TestStore) {
    let sending = store.another();
    let ledger = Arc::new(Ledger::default());
    let receiving = ledger_host(store, ledger.clone()).await;
    let (outbox, sender) = sender_host(&sending, receiving.url()).await;

    // Delivered over HTTP, once each.
    let first = credits(&sending, &outbox, 0, 20);
    sending.wait_for_all(&first, Status::Sent).await;
    assert_eq!(store.count("SELECT COUNT(*) FROM ledger"), 20);

    // The diagnostics are served beside the receiver, behind the token.
    let http = reqwest::Client::new();
    let health = format!("{}/_rf/health", sender.url());
    let refused = http.get(&health).send().await.expect("health");
    assert_eq!(refused.status(), 401);
    let health = http
        .get(&health)
        .bearer_auth("ops-t0ken")
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
    let metadata = http
        .get(format!("{}/_rf/metadata", receiving.url()))
        .send()
        .await
        .expect("metadata");
    assert_eq!(metadata.status(), 200);

    // A stop asked for by one token in the middle of a burst.
    let stop = CancellationToken::new();
    let receiver = receiving.receiver().clone();
    let receiving_url = receiving.url().to_owned();
    let burst = credits(&sending, &outbox, 20, 220);
    let running = [
        tokio::spawn(timed(sender.run_until(stop.clone().cancelled_owned()))),
        tokio::spawn(timed(receiving.run_until(stop.clone().cancelled_owned()))),
    ];
    tokio::time::sleep(Duration::from_millis(30)).await;
    stop.cancel();
    for run in running {
        let (stopped, took) = run.await.expect("join");
        stopped.expect("stopped gracefully");
        assert!(took < BOUND, "stopped in {took:?}, the bound is {BOUND:?}");
    }
    assert_eq!(
        sending.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sending'"),
        0,
        "{}: {:?}",
        sending.name(),
        sending.status_counts()
    );

    // The stopped receiver takes nothing more: no listener, and a delivery
    // handed to it directly is answered 503.
    assert!(
        http.post(format!("{receiving_url}/_rf/receive"))
            .body("{}")
            .send()
            .await
            .is_err(),
        "the listener is closed"
    );
    let id = Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&support::envelope(
        &id,
        "Credit",
        json!({"account": "late", "amount": 1}),
    ))
    .expect("body");
    let signed =
        SignatureHeaders::sign(&id, rfidl_runtime::signing::unix_now(), &body, &[secret()]);
    let mut headers = HeaderMap::new();
    for (name, value) in signed.to_pairs() {
        headers.insert(
            axum::http::HeaderName::from_static(name),
            value.parse().expect("value"),
        );
    }
    let answer = receiver.receive(&headers, body.into()).await;
    assert_eq!(answer.status(), 503);

    // Both start again on the same databases: what the stop left Pending
    // is delivered, and every message took effect exactly once.
    let receiving = ledger_host(store, ledger).await;
    let (_outbox, sender) = sender_host(&sending, receiving.url()).await;
    let all: Vec<Uuid> = first.into_iter().chain(burst).collect();
    sending.wait_for_all(&all, Status::Sent).await;
    assert_eq!(store.count("SELECT COUNT(*) FROM ledger"), 220);
    assert_eq!(
        store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        220
    );
    sender.shutdown().await.expect("sender stops");
    receiving.shutdown().await.expect("receiver stops");
}

/// `run`'s outcome and how long it took once asked to stop (the start of
/// the future is the moment of the token, give or take the 30 ms above).
async fn timed<F: std::future::Future<Output = Result<(), HostError>>>(
    run: F,
) -> (Result<(), HostError>, Duration) {
    let started = Instant::now();
    let outcome = run.await;
    (outcome, started.elapsed())
}

const SLOW: &[HostedInterface] = &[HostedInterface {
    interface: "test.Slow",
    version: 1,
    fingerprint: "sha256:slow-v1",
    endpoints: &["Wait"],
    manifest_json: r#"{"interface":"test.Slow","version":1}"#,
}];

/// A handler that takes `0` to answer.
struct Slow(Duration);

impl HostedService for Slow {
    fn interfaces(&self) -> &[HostedInterface] {
        SLOW
    }

    fn handle(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        std::thread::sleep(self.0);
        Ok(json!({}))
    }
}

/// A stop that cannot finish in time (a handler holds a request for 3 s)
/// ends at the bound with `ShutdownTimedOut`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_cannot_finish_ends_at_its_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_service("slow").with_peer("billing", secret().to_whsec());
    let bound = Duration::from_millis(500);
    let host = Host::builder(config, dir.path().join("slow.db"))
        .service(Slow(Duration::from_secs(3)))
        .shutdown_timeout(bound)
        .listen("127.0.0.1:0")
        .await
        .expect("host");
    let url = host.url().to_owned();
    let id = Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&json!({
        "messageId": id,
        "sourceServiceId": "billing",
        "messageType": "Command",
        "interface": "test.Slow",
        "version": 1,
        "fingerprint": "sha256:slow-v1",
        "endpoint": "Wait",
        "payload": {},
    }))
    .expect("body");
    let request = tokio::spawn(async move {
        let http = reqwest::Client::new();
        support::post_signed(
            &http,
            &url,
            &body,
            &id,
            &secret(),
            rfidl_runtime::signing::unix_now(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let outcome = host.shutdown().await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(HostError::ShutdownTimedOut(b)) if b == bound),
        "{outcome:?}"
    );
    assert!(
        took >= bound && took < bound + Duration::from_millis(400),
        "gave up after {took:?}"
    );
    request.abort();
}

/// Secure by default: beyond loopback only with an ops token, never an
/// empty one; a part that refuses to start stops those started before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_refuses_open_diagnostics_and_cleans_up_a_failed_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("service.db");
    let open = Host::builder(Config::default(), &db)
        .listen("0.0.0.0:0")
        .await;
    assert!(
        matches!(open, Err(HostError::OpenDiagnostics { .. })),
        "{open:?}"
    );
    let empty = Host::builder(Config::default(), &db)
        .ops_token("")
        .listen("127.0.0.1:0")
        .await;
    assert!(matches!(empty, Err(HostError::EmptyOpsToken)), "{empty:?}");

    // A client sends to a destination nothing routes: the dispatcher
    // refuses, after the receiver started; the receiver is stopped again.
    let builder = Host::builder(Config::default(), &db);
    builder.outbox().declare_destination("nowhere");
    let refused = builder.listen("127.0.0.1:0").await;
    assert!(
        matches!(refused, Err(HostError::Dispatcher(_))),
        "{refused:?}"
    );
    // The same file serves again at once.
    let host: Host = Host::builder(Config::default(), &db)
        .listen("127.0.0.1:0")
        .await
        .expect("host");
    let ready = reqwest::get(format!("{}/_rf/readyz", host.url()))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    host.shutdown().await.expect("stops");
}

/// The application's routes are served beside the host's; a host starts
/// and runs inside a spawned task (its futures are `Send`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_serves_the_applications_routes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let builder = Host::builder(Config::default(), dir.path().join("spawned.db"));
    let stop = CancellationToken::new();
    let until = stop.clone().cancelled_owned();
    let running = tokio::spawn(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        builder.serve_with_shutdown(listener, until).await
    });
    stop.cancel();
    running.await.expect("join").expect("served and stopped");

    let app = axum::Router::new().route("/hello", axum::routing::get(|| async { "hello" }));
    let host = Host::builder(Config::default(), dir.path().join("app.db"))
        .router(app)
        .listen("127.0.0.1:0")
        .await
        .expect("host");
    let hello = reqwest::get(format!("{}/hello", host.url()))
        .await
        .expect("hello")
        .text()
        .await
        .expect("text");
    assert_eq!(hello, "hello");
    host.shutdown().await.expect("stops");
}
