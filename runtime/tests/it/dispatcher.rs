//! The sender side over real HTTP: outbox rows move to the status the wire
//! protocol's response table names; retries, TTL, leases, fencing, the
//! enqueue fast path, every transport, and sender -> receiver exactly once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rfidl_runtime::Config;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage, Status};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::{HttpTransport, InProcessTransport, UnixSocketTransport};
use serde_json::json;
use uuid::Uuid;

use crate::support::{self, count, serve};

/// Fast settings: 10 ms backoff, no jitter, 2 retries, 200 ms request timeout.
pub(crate) fn sender_config(poll: Duration) -> Config {
    let mut config = Config {
        service_id: support::SOURCE.into(),
        ..Config::default()
    };
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
    }
}

pub(crate) fn enqueue(outbox: &Outbox, db: &Path, message: OutgoingMessage) -> Uuid {
    let mut conn = rfidl_runtime::db::open(db, rfidl_runtime::Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    let id = outbox.enqueue(&tx, message).expect("enqueue");
    tx.commit().expect("commit");
    id
}

pub(crate) fn status_of(db: &Path, id: &Uuid) -> rfidl_runtime::outbox::OutboxRow {
    let conn = rusqlite::Connection::open(db).expect("open");
    rfidl_runtime::outbox::row(&conn, id)
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

/// Answers by endpoint name: `S200`, `S409`, `S503`, … ; `Slow` never in time.
#[derive(Clone, Default)]
struct Scripted {
    deliveries: Arc<Mutex<HashMap<String, u32>>>,
}

async fn scripted(
    State(script): State<Scripted>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let id = envelope["messageId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    *script
        .deliveries
        .lock()
        .expect("lock")
        .entry(id)
        .or_default() += 1;
    let endpoint = envelope["endpoint"].as_str().unwrap_or_default();
    match endpoint {
        "S200" => {
            axum::Json(json!({"acknowledged": true, "duplicate": false, "payload": {"ok": 1}}))
                .into_response()
        }
        "S200dup" => {
            axum::Json(json!({"acknowledged": true, "duplicate": true, "payload": {"ok": 2}}))
                .into_response()
        }
        "Slow" => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            StatusCode::OK.into_response()
        }
        other => {
            let code: u16 = other.trim_start_matches('S').parse().unwrap_or(500);
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (
                status,
                axum::Json(json!({"error": "scripted", "message": other})),
            )
                .into_response()
        }
    }
}

async fn scripted_server() -> (String, Scripted) {
    let script = Scripted::default();
    let router = axum::Router::new()
        .route("/_rf/receive", axum::routing::post(scripted))
        .with_state(script.clone());
    let (url, _server) = serve(router).await;
    (url, script)
}

#[tokio::test]
async fn enqueue_follows_the_callers_transaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_secs(1)), &db);
    let mut conn = rfidl_runtime::db::open(&db, rfidl_runtime::Durability::Normal).expect("open");
    conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .expect("table");
    {
        let tx = conn.transaction().expect("tx");
        tx.execute("INSERT INTO orders DEFAULT VALUES", [])
            .expect("business row");
        outbox
            .enqueue(&tx, message("x", "S200", json!({})))
            .expect("enqueue");
        tx.rollback().expect("rollback");
    }
    assert_eq!(count(&db, "SELECT COUNT(*) FROM outbox_messages"), 0);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM orders"), 0);
    let tx = conn.transaction().expect("tx");
    tx.execute("INSERT INTO orders DEFAULT VALUES", [])
        .expect("business row");
    outbox
        .enqueue(&tx, message("x", "S200", json!({})))
        .expect("enqueue");
    tx.commit().expect("commit");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM outbox_messages"), 1);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM orders"), 1);
}

#[tokio::test]
async fn each_answer_drives_the_row_to_the_status_the_wire_protocol_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let (url, script) = scripted_server().await;
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    let secret = Secret::generate();
    let handle = Dispatcher::builder(&outbox, &db)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_millis(300)).expect("client"),
            secret.clone(),
        )
        .route(
            "nobody",
            HttpTransport::new("http://127.0.0.1:9", Duration::from_millis(300)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    // Answers that end the row, or count against max_retries (2).
    let cases = [
        ("peer", "S200", Status::Sent, 1),
        ("peer", "S200dup", Status::Sent, 1),
        ("peer", "S409", Status::Sent, 1),
        ("peer", "S400", Status::DeadLetter, 1),
        ("peer", "S404", Status::DeadLetter, 1),
        ("peer", "S413", Status::DeadLetter, 1),
        ("peer", "S422", Status::DeadLetter, 1),
        ("peer", "S401", Status::DeadLetter, 3),
        ("peer", "S500", Status::Failed, 3),
    ];
    // An unreachable or overloaded receiver: retried until the TTL, never
    // counted, never Failed.
    let waiting = [
        ("peer", "S429"),
        ("peer", "S503"),
        ("peer", "Slow"),
        ("nobody", "S200"),
    ];
    let ids: Vec<Uuid> = cases
        .iter()
        .map(|(to, endpoint, _, _)| enqueue(&outbox, &db, message(to, endpoint, json!({}))))
        .collect();
    let waiting_ids: Vec<Uuid> = waiting
        .iter()
        .map(|(to, endpoint)| enqueue(&outbox, &db, message(to, endpoint, json!({}))))
        .collect();
    let deliveries_of = |id: &Uuid| {
        script
            .deliveries
            .lock()
            .expect("lock")
            .get(&id.to_string())
            .copied()
            .unwrap_or(0)
    };
    for ((to, endpoint, wanted, attempts), id) in cases.iter().zip(&ids) {
        let row = wait_for(&db, id, *wanted).await;
        assert_eq!(deliveries_of(id), *attempts, "{to}/{endpoint}: attempts");
        if *wanted == Status::Failed {
            assert_eq!(row.retry_count, 2, "{endpoint}: retried max_retries times");
            assert!(row.last_error.is_some());
        }
    }
    for ((to, endpoint), id) in waiting.iter().zip(&waiting_ids) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let row = loop {
            let row = status_of(&db, id);
            let tried = if *to == "nobody" {
                row.last_error.is_some()
            } else {
                deliveries_of(id) >= 3
            };
            if tried {
                break row;
            }
            assert!(
                Instant::now() < deadline,
                "{to}/{endpoint} never tried: {row:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            matches!(row.status, Status::Pending | Status::Sending),
            "{to}/{endpoint} waits: {row:?}"
        );
        assert_eq!(row.retry_count, 0, "{to}/{endpoint}: not counted: {row:?}");
    }
    assert_eq!(
        status_of(&db, &ids[0]).response,
        Some(json!({"ok": 1})),
        "the response is stored"
    );
    handle.shutdown().await;
}

#[tokio::test]
async fn messages_past_their_ttl_expire_instead_of_being_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let (url, script) = scripted_server().await;
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    let id = enqueue(
        &outbox,
        &db,
        OutgoingMessage {
            ttl: Some(Duration::ZERO),
            ..message("peer", "S200", json!({}))
        },
    );
    let retrying = enqueue(
        &outbox,
        &db,
        OutgoingMessage {
            ttl: Some(Duration::from_millis(150)),
            max_retries: Some(1000),
            ..message("peer", "S503", json!({}))
        },
    );
    let handle = Dispatcher::builder(&outbox, &db)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_millis(300)).expect("client"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    wait_for(&db, &id, Status::Expired).await;
    assert_eq!(
        script.deliveries.lock().expect("lock").get(&id.to_string()),
        None,
        "never sent"
    );
    let row = wait_for(&db, &retrying, Status::Expired).await;
    assert!(
        script
            .deliveries
            .lock()
            .expect("lock")
            .get(&retrying.to_string())
            .is_some_and(|attempts| *attempts >= 2),
        "it was retried until its TTL ran out: {row:?}"
    );
    handle.shutdown().await;
}

#[tokio::test]
async fn a_crashed_dispatchers_lease_expires_and_its_stale_update_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let (url, script) = scripted_server().await;
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    let id = enqueue(&outbox, &db, message("peer", "S200", json!({})));
    // A dispatcher claimed the row and died: Sending, with a lease already expired.
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute(
        "UPDATE outbox_messages SET status = 'Sending', lease_token = 'crashed', next_retry_at = ?1",
        [rfidl_runtime::db::now_ms() - 1],
    )
    .expect("simulate crash");
    let handle = Dispatcher::builder(&outbox, &db)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_millis(300)).expect("client"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    wait_for(&db, &id, Status::Sent).await;
    assert_eq!(
        script.deliveries.lock().expect("lock").get(&id.to_string()),
        Some(&1),
        "re-sent once"
    );
    // The crashed dispatcher wakes up and tries to record its old attempt: fenced out.
    let changed = conn
        .execute(
            "UPDATE outbox_messages SET status = 'Failed' WHERE message_id = ?1 AND lease_token = 'crashed' AND status = 'Sending'",
            [id.to_string()],
        )
        .expect("update");
    assert_eq!(changed, 0);
    assert_eq!(status_of(&db, &id).status, Status::Sent);
    handle.shutdown().await;
}

#[tokio::test]
async fn two_dispatchers_on_one_database_never_send_a_message_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let (url, script) = scripted_server().await;
    let outbox = Outbox::new(sender_config(Duration::from_millis(5)), &db);
    let ids: Vec<Uuid> = (0..300)
        .map(|_| enqueue(&outbox, &db, message("peer", "S200", json!({}))))
        .collect();
    let start = || {
        Dispatcher::builder(&outbox, &db)
            .route(
                "peer",
                HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
                Secret::generate(),
            )
            .start()
            .expect("dispatcher")
    };
    let (first, second) = (start(), start());
    for id in &ids {
        wait_for(&db, id, Status::Sent).await;
    }
    {
        let deliveries = script.deliveries.lock().expect("lock");
        assert_eq!(deliveries.len(), 300);
        assert!(
            deliveries.values().all(|n| *n == 1),
            "a message was sent twice"
        );
    }
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn a_committed_enqueue_wakes_the_dispatcher_without_waiting_for_the_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let (url, _script) = scripted_server().await;
    let outbox = Outbox::new(sender_config(Duration::from_secs(60)), &db);
    let handle = Dispatcher::builder(&outbox, &db)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    tokio::time::sleep(Duration::from_millis(200)).await; // the dispatcher is idle, polling every 60 s
    let started = Instant::now();
    let id = enqueue(&outbox, &db, message("peer", "S200", json!({})));
    wait_for(&db, &id, Status::Sent).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    // `send` (its own transaction) is just as fast.
    let started = Instant::now();
    let id = outbox
        .send(message("peer", "S200", json!({})))
        .await
        .expect("send");
    wait_for(&db, &id, Status::Sent).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    handle.shutdown().await;
}

async fn end_to_end(transport_for: impl FnOnce(&support::TestReceiver, &Path) -> TransportChoice) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sender_secret = Secret::generate();
    let receiver =
        support::start_receiver(dir.path(), support::receiver_config(&[&sender_secret])).await;
    let db: PathBuf = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(50)), &db);
    let builder = Dispatcher::builder(&outbox, &db);
    let builder = match transport_for(&receiver, dir.path()) {
        TransportChoice::Http(url) => builder.route(
            "ledger",
            HttpTransport::new(url, Duration::from_secs(2)).expect("client"),
            sender_secret,
        ),
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

enum TransportChoice {
    Http(String),
    InProcess(axum::Router),
    Unix(PathBuf),
}

#[tokio::test]
async fn sender_to_receiver_over_http_processes_each_message_once() {
    end_to_end(|receiver, _| TransportChoice::Http(receiver.url.clone())).await;
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
