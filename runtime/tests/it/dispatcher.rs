//! The sender side's SQLite-only cases: sender -> receiver exactly once over
//! the transports that are not HTTP (in process, a unix socket), and the
//! helpers other SQLite-only modules share. Everything that holds on every
//! store (the wire protocol's statuses, TTL expiry, leases and fencing,
//! competing dispatchers, the enqueue wake-up, the caller's transaction,
//! HTTP end to end) runs on SQLite and PostgreSQL in `store_delivery.rs`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rfidl_runtime::Config;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage, Status};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::{InProcessTransport, UnixSocketTransport};
use serde_json::json;
use uuid::Uuid;

use crate::support::{self, count};

/// Fast settings: 10 ms backoff, no jitter, 2 retries, 200 ms request timeout.
pub(crate) fn sender_config(poll: Duration) -> Config {
    let mut config = Config::for_service(support::SOURCE);
    config.outbox.poll_interval = poll;
    config.outbox.backoff_base = Duration::from_millis(10);
    config.outbox.backoff_max = Duration::from_millis(40);
    config.outbox.jitter = Duration::ZERO;
    config.outbox.max_retries = 2;
    config.outbox.request_timeout = Duration::from_millis(300);
    config.outbox.lease_timeout = Duration::from_secs(30);
    config.outbox.probe_interval_max = Duration::from_millis(100);
    config
}

pub(crate) fn message(
    destination: &str,
    endpoint: &str,
    payload: serde_json::Value,
) -> OutgoingMessage {
    OutgoingMessage {
        destination: destination.into(),
        message_type: rfidl_runtime::MessageType::Command,
        interface: support::INTERFACE.into(),
        version: 1,
        fingerprint: support::FINGERPRINT.into(),
        endpoint: endpoint.into(),
        correlation_id: Some("c-1".into()),
        payload,
        headers: Default::default(),
        max_retries: None,
        ttl: None,
        deliver_at: None,
    }
}

pub(crate) fn enqueue(outbox: &Outbox, db: &Path, message: OutgoingMessage) -> Uuid {
    let mut conn =
        rfidl_runtime::store::sqlite::open(db, rfidl_runtime::Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    let id = outbox.enqueue(&tx, message).expect("enqueue");
    tx.commit().expect("commit");
    id
}

pub(crate) fn status_of(db: &Path, id: &Uuid) -> rfidl_runtime::outbox::OutboxRow {
    let conn = rusqlite::Connection::open(db).expect("open");
    rfidl_runtime::store::sqlite::outbox_row(&conn, id)
        .expect("query")
        .expect("row exists")
}

pub(crate) async fn wait_for(
    db: &Path,
    id: &Uuid,
    wanted: Status,
) -> rfidl_runtime::outbox::OutboxRow {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let row = status_of(db, id);
        if row.status == wanted || Instant::now() > deadline {
            assert_eq!(row.status, wanted, "{row:?}");
            return row;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn end_to_end(transport_for: impl FnOnce(&support::TestReceiver, &Path) -> TransportChoice) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sender_secret = Secret::generate();
    let receiver =
        support::start_receiver(dir.path(), support::receiver_config(&[&sender_secret])).await;
    let db: PathBuf = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(50)), &db);
    let builder = Dispatcher::builder(&outbox);
    let builder = match transport_for(&receiver, dir.path()) {
        TransportChoice::InProcess(router) => {
            builder.route("ledger", InProcessTransport::new(router), sender_secret)
        }
        TransportChoice::Unix(path) => builder.route(
            "ledger",
            UnixSocketTransport::new(path, Duration::from_secs(2)),
            sender_secret,
        ),
    };
    let handle = builder.start().expect("dispatcher");
    let ids: Vec<Uuid> = (0..20)
        .map(|i| {
            enqueue(
                &outbox,
                &db,
                message("ledger", "Credit", json!({"account": "e2e", "amount": i})),
            )
        })
        .collect();
    for id in &ids {
        wait_for(&db, id, Status::Sent).await;
    }
    assert_eq!(count(&receiver.db, "SELECT COUNT(*) FROM ledger"), 20);
    assert_eq!(
        count(&receiver.db, "SELECT SUM(amount) FROM ledger"),
        (0..20).sum::<i64>()
    );
    // Responses come back into the sender's outbox. Sends run concurrently,
    // so the receiver may process them in any order: the one it processed
    // last saw the whole balance.
    let balances: Vec<i64> = ids
        .iter()
        .map(|id| {
            status_of(&db, id)
                .response
                .and_then(|r| r["balance"].as_i64())
                .expect("a balance in every response")
        })
        .collect();
    assert_eq!(balances.iter().max(), Some(&(0..20).sum::<i64>()));
    // A lost acknowledgement: the sender re-sends Sent rows; the receiver answers duplicate.
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute(
        "UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0",
        [],
    )
    .expect("reset");
    outbox
        .send(message(
            "ledger",
            "Credit",
            json!({"account": "e2e", "amount": 0}),
        ))
        .await
        .expect("send");
    for id in &ids {
        wait_for(&db, id, Status::Sent).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM ledger"),
        21,
        "re-sent messages had no second effect"
    );
    assert!(receiver.receiver.metrics().inbox_duplicates.get() >= 20);
    handle.shutdown().await;
}

/// The transports only SQLite tests cover (HTTP runs on every store in
/// `store_delivery.rs`).
enum TransportChoice {
    InProcess(axum::Router),
    Unix(PathBuf),
}

#[tokio::test]
async fn sender_to_receiver_in_process() {
    end_to_end(|receiver, _| TransportChoice::InProcess(receiver.receiver.router())).await;
}

#[tokio::test]
async fn sender_to_receiver_over_a_unix_socket() {
    end_to_end(|receiver, dir| {
        let path = dir.join("ledger.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind unix socket");
        let router = receiver.receiver.router();
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        TransportChoice::Unix(path)
    })
    .await;
}

/// Under `outbox.durability: full` a claim hands its rows to the sender
/// before it commits. A claim whose commit then fails (here a deferred
/// constraint the test adds; a full disk or an I/O error in production) has
/// already sent its message: the row must stay due, the next claims must
/// commit before they send (no loop of re-sends while commits keep
/// failing), and once a claim commits the message goes again, is answered
/// as a duplicate and recorded `Sent`: one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_fails_to_commit_after_sending_loses_nothing_and_does_not_loop() {
    use rfidl_runtime::Durability;
    use std::sync::atomic::Ordering;

    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), support::receiver_config(&[&secret])).await;
    let db = dir.path().join("sender.db");
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.durability = Durability::Full;
    let outbox = Outbox::new(config, &db);
    let conn = rfidl_runtime::store::sqlite::open(&db, Durability::Full).expect("open");
    // Every claim's commit fails while this trigger exists.
    conn.execute_batch(
        "CREATE TABLE guard_parent (id INTEGER PRIMARY KEY);
         CREATE TABLE guard (parent INTEGER REFERENCES guard_parent (id) DEFERRABLE INITIALLY DEFERRED);
         CREATE TRIGGER fail_claims AFTER UPDATE OF status ON outbox_messages
         WHEN NEW.status = 'Sending' BEGIN INSERT INTO guard (parent) VALUES (1); END;",
    )
    .expect("trigger");
    let mut sending = rfidl_runtime::store::sqlite::open(&db, Durability::Full).expect("open");
    let tx = sending.transaction().expect("tx");
    let id = outbox
        .enqueue(
            &tx,
            message("ledger", "Credit", json!({"account": "acme", "amount": 7})),
        )
        .expect("enqueue");
    tx.commit().expect("commit");

    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            rfidl_runtime::transport::HttpTransport::new(&receiver.url, Duration::from_secs(2))
                .expect("transport"),
            secret.clone(),
        )
        .start()
        .expect("dispatcher");
    let deadline = Instant::now() + Duration::from_secs(5);
    while receiver.ledger.calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the message was never sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Claims keep failing for a while (a poll every 20 ms): nothing more
    // is sent, and the row is still there, due.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = receiver.receiver.metrics();
    assert_eq!(receiver.ledger.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        metrics.inbox_duplicates.get(),
        0,
        "re-sent while claims fail"
    );
    let row = status_of(&db, &id);
    assert_eq!(row.status, Status::Pending, "{row:?}");

    conn.execute_batch("DROP TRIGGER fail_claims")
        .expect("drop trigger");
    let row = wait_for(&db, &id, Status::Sent).await;
    assert_eq!(row.response.and_then(|r| r["balance"].as_i64()), Some(7));
    dispatcher.shutdown().await;
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM ledger"),
        1,
        "one effect"
    );
    assert_eq!(receiver.ledger.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        metrics.inbox_duplicates.get(),
        1,
        "sent again, answered as a duplicate"
    );
    assert_eq!(outbox.metrics().outbox_sent.get(), 1);
    receiver.receiver.shutdown().await;
}

/// A receiver serving on a runtime of its own (a service of its own), for
/// the tests whose sending side controls its runtime itself; and an HTTP
/// dispatcher builder for `outbox` routed to it.
struct ReceiverApart {
    receiver: support::TestReceiver,
    secret: Secret,
    _runtime: tokio::runtime::Runtime,
}

impl ReceiverApart {
    fn start(dir: &Path) -> Self {
        let secret = Secret::generate();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let receiver = runtime.block_on(support::start_receiver(
            dir,
            support::receiver_config(&[&secret]),
        ));
        Self {
            receiver,
            secret,
            _runtime: runtime,
        }
    }

    fn dispatcher(&self, outbox: &Outbox) -> rfidl_runtime::dispatcher::DispatcherHandle {
        Dispatcher::builder(outbox)
            .route(
                "ledger",
                rfidl_runtime::transport::HttpTransport::new(
                    &self.receiver.url,
                    Duration::from_secs(2),
                )
                .expect("transport"),
                self.secret.clone(),
            )
            .start()
            .expect("dispatcher")
    }
}

/// The dispatcher runs on a runtime of its own: an application whose
/// executor is blocked (here its only thread, which waits synchronously for
/// the message to be `Sent`) does not hold up its deliveries.
#[test]
fn deliveries_go_on_while_the_application_executor_is_blocked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let apart = ReceiverApart::start(dir.path());
    let application = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let db = dir.path().join("sender.db");
    // Only the enqueue's wake-up can find the row within the test's time.
    let outbox = Outbox::new(sender_config(Duration::from_secs(60)), &db);
    application.block_on(async {
        let dispatcher = apart.dispatcher(&outbox);
        let id = enqueue(
            &outbox,
            &db,
            message("ledger", "Credit", json!({"account": "busy", "amount": 3})),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while status_of(&db, &id).status != Status::Sent {
            assert!(
                Instant::now() < deadline,
                "not delivered while the application's executor was blocked: {:?}",
                status_of(&db, &id)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        dispatcher.shutdown().await;
    });
    assert_eq!(
        count(&apart.receiver.db, "SELECT SUM(amount) FROM ledger"),
        3
    );
}

/// A dispatcher stops with the runtime it was started on, as a task of
/// that runtime would, even though it runs on a runtime of its own: a
/// message enqueued afterwards stays `Pending`.
#[test]
fn a_dispatcher_stops_with_the_runtime_that_started_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let apart = ReceiverApart::start(dir.path());
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    let starting = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dispatcher = starting.block_on(async { apart.dispatcher(&outbox) });
    let liveness = dispatcher.liveness();
    assert!(liveness.is_alive());
    drop(starting);
    let deadline = Instant::now() + Duration::from_secs(5);
    while liveness.is_alive() {
        assert!(Instant::now() < deadline, "still running");
        std::thread::sleep(Duration::from_millis(5));
    }
    let id = enqueue(
        &outbox,
        &db,
        message("ledger", "Credit", json!({"account": "gone", "amount": 1})),
    );
    // Twenty of its polls.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(status_of(&db, &id).status, Status::Pending);
    assert_eq!(count(&apart.receiver.db, "SELECT COUNT(*) FROM ledger"), 0);
    drop(dispatcher);
}

/// Under `outbox.durability: full` an idle dispatcher's claim sends its rows
/// before it commits, and commits once their requests are written, not
/// when the answers come back: while the receiver holds the request, the
/// row reads `Sending` from another connection, and another writer gets the
/// write lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_claim_commits_while_its_request_is_in_flight() {
    use rfidl_runtime::Durability;
    use std::sync::Arc;
    use tokio::sync::Notify;

    let dir = tempfile::tempdir().expect("tempdir");
    let arrived = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let router = axum::Router::new().fallback({
        let (arrived, release) = (arrived.clone(), release.clone());
        move || async move {
            arrived.notify_one();
            release.notified().await;
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        }
    });
    let (url, server) = support::serve(router).await;
    let db = dir.path().join("sender.db");
    let mut config = sender_config(Duration::from_secs(60));
    config.outbox.durability = Durability::Full;
    let outbox = Outbox::new(config, &db);
    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            rfidl_runtime::transport::HttpTransport::new(&url, Duration::from_secs(30))
                .expect("transport"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    let mut sending = rfidl_runtime::store::sqlite::open(&db, Durability::Full).expect("open");
    let tx = sending.transaction().expect("tx");
    let id = outbox
        .enqueue(
            &tx,
            message("ledger", "Credit", json!({"account": "held", "amount": 1})),
        )
        .expect("enqueue");
    tx.commit().expect("commit");

    tokio::time::timeout(Duration::from_secs(5), arrived.notified())
        .await
        .expect("the request never arrived");
    let other = rusqlite::Connection::open(&db).expect("open");
    other
        .busy_timeout(Duration::from_millis(500))
        .expect("busy timeout");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the claim still holds the write lock while its request is in flight");
    other.execute_batch("ROLLBACK").expect("rollback");
    assert_eq!(status_of(&db, &id).status, Status::Sending);

    release.notify_one();
    dispatcher.shutdown().await;
    server.abort();
}

/// A row left `Sending` under a long lease is due at once for a dispatcher
/// that holds the file's dispatcher lock (its claimer is gone), and waits
/// for its lease while another live dispatcher holds the lock (it may be
/// that dispatcher's row, in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_left_sending_are_reclaimed_at_once_only_when_no_live_dispatcher_holds_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sender_secret = Secret::generate();
    let receiver =
        support::start_receiver(dir.path(), support::receiver_config(&[&sender_secret])).await;
    let db: PathBuf = dir.path().join("sender.db");
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.lease_timeout = Duration::from_secs(600);
    let outbox = Outbox::new(config, &db);
    let id = enqueue(
        &outbox,
        &db,
        message("ledger", "Credit", json!({"account": "lease", "amount": 1})),
    );
    // What a claimer killed mid-send leaves: `Sending`, due at its lease.
    let leased_until = rfidl_runtime::store::now_ms() + 600_000;
    rusqlite::Connection::open(&db)
        .expect("open")
        .execute(
            "UPDATE outbox_messages SET status = 'Sending', lease_token = 'dead', next_retry_at = ?1",
            [leased_until],
        )
        .expect("leave it Sending");
    let start = || {
        Dispatcher::builder(&outbox)
            .route(
                "ledger",
                InProcessTransport::new(receiver.receiver.router()),
                sender_secret.clone(),
            )
            .start()
            .expect("dispatcher")
    };

    // Another process's live dispatcher holds the lock: the row waits.
    let holder = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.path().join("sender.db.dispatcher-lock"))
        .expect("lock file");
    holder.try_lock().expect("the lock is free");
    let waiting = start();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_of(&db, &id).status, Status::Sending);
    waiting.shutdown().await;

    // That dispatcher is gone (the kernel released its lock): at once.
    drop(holder);
    let started = Instant::now();
    let handle = start();
    wait_for(&db, &id, Status::Sent).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(count(&receiver.db, "SELECT COUNT(*) FROM ledger"), 1);
    handle.shutdown().await;
}

/// A destination a client declared and nothing routes stops the dispatcher
/// at start, naming the destination and the config key; one declared after
/// the start is checked at once (logged) and never blocks a routed one.
#[tokio::test]
async fn a_declared_destination_without_a_route_stops_the_start_with_its_config_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db: PathBuf = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(50)), &db);
    outbox.declare_destination("ledger");
    outbox.declare_destination("billing-eu");
    let router = axum::Router::new();
    let error = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            InProcessTransport::new(router.clone()),
            Secret::generate(),
        )
        .start()
        .err()
        .expect("billing-eu has no route");
    let text = error.to_string();
    assert!(
        matches!(
            &error,
            rfidl_runtime::dispatcher::DispatcherError::UnknownDestination { name } if name == "billing-eu"
        ),
        "{text}"
    );
    assert!(text.contains("destinations.billing-eu"), "{text}");
    assert!(text.contains("RFIDL_DESTINATIONS_BILLING_EU_URL"), "{text}");

    // Routed, it starts; a later declaration does not stop a running one.
    let handle = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            InProcessTransport::new(router.clone()),
            Secret::generate(),
        )
        .route(
            "billing-eu",
            InProcessTransport::new(router),
            Secret::generate(),
        )
        .start()
        .expect("every declared destination has a route");
    outbox.declare_destination("audit");
    handle.shutdown().await;
}

/// A destination URL no transport serves stops the start, naming the field
/// (issue 30: `inproc://` used to fall through to the HTTP client and fail
/// on every send).
#[tokio::test]
async fn a_destination_url_no_transport_serves_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db: PathBuf = dir.path().join("sender.db");
    for (url, expected) in [
        ("inproc://ledger", "InProcessTransport"),
        (
            "ftp://ledger.example",
            "has the scheme `ftp`, which no transport serves",
        ),
        // No scheme: nothing of the URL is quoted (it may hold credentials).
        ("user:hunter2@ledger.example:8080", "has no `scheme://`"),
        ("user:hunter2@ledger/x://y", "has no `scheme://`"),
    ] {
        let mut config = sender_config(Duration::from_millis(50));
        config.destinations.insert(
            "ledger".into(),
            rfidl_runtime::config::DestinationConfig::new(url, Secret::generate().to_whsec()),
        );
        let outbox = Outbox::new(config, &db);
        let error = Dispatcher::builder(&outbox)
            .start()
            .err()
            .expect("refused at start");
        let text = error.to_string();
        assert!(
            matches!(
                &error,
                rfidl_runtime::dispatcher::DispatcherError::Destination { name, .. } if name == "ledger"
            ),
            "{error:?}"
        );
        assert!(text.contains("destination `ledger`"), "{text}");
        assert!(text.contains(expected), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{url}: {text}");
    }
}
