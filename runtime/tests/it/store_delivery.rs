//! Delivery, exactly-once, leases and failures with the same test bodies on
//! every store (SQLite and PostgreSQL): real databases, real HTTP on
//! loopback. See `stores.rs` for the harness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rfidl_runtime::outbox::{OutgoingMessage, Status};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, serve};

on_every_store!(
    enqueue_commits_and_rolls_back_with_the_callers_transaction,
    enqueue_follows_the_transaction
);
async fn enqueue_follows_the_transaction(store: &TestStore) {
    let outbox = store.outbox(sender_config(Duration::from_secs(60)));
    // The business row and the message commit or roll back together.
    let business = "INSERT INTO ledger (message_id, account, amount) VALUES ('order', 'orders', 1)";
    store.enqueue_with(&outbox, message("peer", "S200", json!({})), business, false);
    assert_eq!(store.count("SELECT COUNT(*) FROM outbox_messages"), 0);
    assert_eq!(store.count("SELECT COUNT(*) FROM ledger"), 0);
    let kept = store.enqueue_with(&outbox, message("peer", "S200", json!({})), business, true);
    assert_eq!(store.count("SELECT COUNT(*) FROM ledger"), 1);
    store.enqueue_then(&outbox, message("peer", "S200", json!({})), false);
    assert_eq!(store.count("SELECT COUNT(*) FROM outbox_messages"), 1);
    let row = store.row(&kept);
    assert_eq!(row.status, Status::Pending);
    assert_eq!(row.max_retries, 2);
    // `send` commits a transaction of its own.
    let sent = outbox
        .send(message("peer", "S200", json!({})))
        .await
        .expect("send");
    assert_eq!(store.row(&sent).status, Status::Pending);
    assert_eq!(store.count("SELECT COUNT(*) FROM outbox_messages"), 2);
}

/// Answers by endpoint name: `S200`, `S409`, `S503`, … ; `Slow` never in time.
#[derive(Clone, Default)]
struct Scripted {
    deliveries: Arc<Mutex<HashMap<String, u32>>>,
}

impl Scripted {
    fn of(&self, id: &Uuid) -> u32 {
        self.deliveries
            .lock()
            .expect("lock")
            .get(&id.to_string())
            .copied()
            .unwrap_or(0)
    }
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
        // `S<status>` or `S<status><wire code>`, e.g. `S503in_progress`.
        other => {
            let digits = other.trim_start_matches('S');
            let (code, error) = digits.split_at(digits.len().min(3));
            let code: u16 = code.parse().unwrap_or(500);
            let error = if error.is_empty() { "scripted" } else { error };
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (
                status,
                axum::Json(json!({"error": error, "message": other})),
            )
                .into_response()
        }
    }
}

async fn scripted_server() -> (String, Scripted) {
    scripted_server_via(Via::Http).await
}

/// The transport a table-driven test runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Http,
    /// `rfidl.RFReceiver/Receive` on a tonic server (`grpc.rs`).
    Grpc,
}

impl Via {
    /// A transport to `url` (`http://…` or `grpc://…`).
    pub(crate) fn transport(
        self,
        url: &str,
        timeout: Duration,
    ) -> std::sync::Arc<dyn rfidl_runtime::transport::Transport> {
        match self {
            Via::Http => std::sync::Arc::new(HttpTransport::new(url, timeout).expect("client")),
            Via::Grpc => std::sync::Arc::new(
                rfidl_runtime::transport::GrpcTransport::new(url, timeout).expect("client"),
            ),
        }
    }

    /// A URL on which nothing listens.
    fn nobody(self) -> &'static str {
        match self {
            Via::Http => "http://127.0.0.1:9",
            Via::Grpc => "grpc://127.0.0.1:9",
        }
    }
}

/// The scripted receiver, served over `via`.
async fn scripted_server_via(via: Via) -> (String, Scripted) {
    let script = Scripted::default();
    let router = axum::Router::new()
        .route("/_rf/receive", axum::routing::post(scripted))
        .with_state(script.clone());
    let url = match via {
        Via::Http => serve(router).await.0,
        Via::Grpc => crate::grpc::serve_router(router).await,
    };
    (url, script)
}

on_every_store!(
    each_answer_drives_the_row_to_the_status_the_wire_protocol_names,
    wire_protocol_statuses
);
async fn wire_protocol_statuses(store: &TestStore) {
    wire_protocol_statuses_via(store, Via::Http).await;
}

/// Every row of the wire protocol's table, answered over `via`.
pub(crate) async fn wire_protocol_statuses_via(store: &TestStore, via: Via) {
    let (url, script) = scripted_server_via(via).await;
    let outbox = store.outbox(sender_config(Duration::from_millis(20)));
    let secret = Secret::generate();
    let handle = store
        .dispatcher(&outbox)
        .route(
            "peer",
            via.transport(&url, Duration::from_millis(300)),
            secret.clone(),
        )
        .route(
            "nobody",
            via.transport(via.nobody(), Duration::from_millis(300)),
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
        ("peer", "S401bad_signature", Status::DeadLetter, 3),
        ("peer", "S500", Status::Failed, 3),
        ("peer", "S422beyond_dedup_horizon", Status::Failed, 1),
    ];
    // An unreachable or overloaded receiver: retried until the TTL, never
    // counted, never Failed.
    let waiting = [
        ("peer", "S429"),
        ("peer", "S503"),
        ("peer", "S503in_progress"),
        ("peer", "S410version_decommissioned"),
        ("peer", "Slow"),
        ("nobody", "S200"),
    ];
    let ids: Vec<Uuid> = cases
        .iter()
        .map(|(to, endpoint, _, _)| store.enqueue(&outbox, message(to, endpoint, json!({}))))
        .collect();
    let waiting_ids: Vec<Uuid> = waiting
        .iter()
        .map(|(to, endpoint)| store.enqueue(&outbox, message(to, endpoint, json!({}))))
        .collect();
    for ((to, endpoint, wanted, attempts), id) in cases.iter().zip(&ids) {
        let row = store.wait_for(id, *wanted).await;
        assert_eq!(script.of(id), *attempts, "{to}/{endpoint}: attempts");
        if *endpoint == "S500" {
            assert_eq!(row.retry_count, 2, "{endpoint}: retried max_retries times");
            assert!(row.last_error.is_some());
        }
    }
    for ((to, endpoint), id) in waiting.iter().zip(&waiting_ids) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let row = loop {
            let row = store.row(id);
            let tried = if *to == "nobody" {
                row.last_error.is_some()
            } else {
                script.of(id) >= 3
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
        store.row(&ids[0]).response,
        Some(json!({"ok": 1})),
        "the response is stored"
    );
    handle.shutdown().await;
}

on_every_store!(
    messages_past_their_ttl_expire_instead_of_being_sent,
    ttl_expiry
);
async fn ttl_expiry(store: &TestStore) {
    let (url, script) = scripted_server().await;
    let outbox = store.outbox(sender_config(Duration::from_millis(20)));
    // The dispatcher runs first: the 150 ms of the retried message are spent
    // on attempts, not on the dispatcher's start.
    let handle = store
        .dispatcher(&outbox)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_millis(300)).expect("client"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    let id = store.enqueue(
        &outbox,
        OutgoingMessage {
            ttl: Some(Duration::ZERO),
            deliver_at: None,
            ..message("peer", "S200", json!({}))
        },
    );
    let retrying = store.enqueue(
        &outbox,
        OutgoingMessage {
            ttl: Some(Duration::from_millis(150)),
            deliver_at: None,
            max_retries: Some(1000),
            ..message("peer", "S503", json!({}))
        },
    );
    store.wait_for(&id, Status::Expired).await;
    assert_eq!(script.of(&id), 0, "never sent");
    let row = store.wait_for(&retrying, Status::Expired).await;
    assert!(
        script.of(&retrying) >= 2,
        "it was retried until its TTL ran out: {row:?}"
    );
    handle.shutdown().await;
}

on_every_store!(
    a_committed_enqueue_wakes_the_dispatcher_without_waiting_for_the_poll,
    enqueue_wakes_the_dispatcher
);
async fn enqueue_wakes_the_dispatcher(store: &TestStore) {
    let (url, _script) = scripted_server().await;
    let outbox = store.outbox(sender_config(Duration::from_secs(60)));
    let handle = store
        .dispatcher(&outbox)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    tokio::time::sleep(Duration::from_millis(200)).await; // the dispatcher is idle, polling every 60 s
    let started = Instant::now();
    let id = store.enqueue(&outbox, message("peer", "S200", json!({})));
    store.wait_for(&id, Status::Sent).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{}: took {:?}",
        store.name(),
        started.elapsed()
    );
    // `send` (its own transaction) is just as fast.
    let started = Instant::now();
    let id = outbox
        .send(message("peer", "S200", json!({})))
        .await
        .expect("send");
    store.wait_for(&id, Status::Sent).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{}: took {:?}",
        store.name(),
        started.elapsed()
    );
    handle.shutdown().await;
}

on_every_store!(
    sender_to_receiver_over_http_processes_each_message_once,
    end_to_end
);
async fn end_to_end(store: &TestStore) {
    let receiver_store = store.another();
    let sender_secret = Secret::generate();
    let receiver = receiver_store
        .start_receiver(support::receiver_config(&[&sender_secret]))
        .await;
    let outbox = store.outbox(sender_config(Duration::from_millis(50)));
    let handle = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            sender_secret,
        )
        .start()
        .expect("dispatcher");
    let ids: Vec<Uuid> = (0..20)
        .map(|i| {
            store.enqueue(
                &outbox,
                message("ledger", "Credit", json!({"account": "e2e", "amount": i})),
            )
        })
        .collect();
    store.wait_for_all(&ids, Status::Sent).await;
    assert_eq!(receiver_store.count("SELECT COUNT(*) FROM ledger"), 20);
    assert_eq!(
        receiver_store.count("SELECT CAST(SUM(amount) AS BIGINT) FROM ledger"),
        (0..20).sum::<i64>()
    );
    // Every answer came back into the sender's outbox: the balance its
    // handler saw, its own credit included. (Not "the last saw the whole
    // sum": PostgreSQL's receiver runs handlers side by side, and two
    // committing together do not see each other's row.)
    for (amount, id) in ids.iter().enumerate() {
        let balance = store
            .row(id)
            .response
            .and_then(|r| r["balance"].as_i64())
            .expect("a balance in every response");
        assert!(
            (amount as i64..=(0..20).sum::<i64>()).contains(&balance),
            "{}: credit {amount} answered balance {balance}",
            store.name()
        );
    }
    // Lost acknowledgements: every row is sent again; the receiver answers
    // duplicate and nothing is processed twice.
    store.execute("UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0");
    store.wait_for_all(&ids, Status::Sent).await;
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        20,
        "re-sent messages had no second effect"
    );
    assert_eq!(receiver.receiver.metrics().inbox_duplicates.get(), 20);
    handle.shutdown().await;
    receiver.receiver.shutdown().await;
}

on_every_store!(
    a_crashed_dispatchers_lease_expires_and_its_stale_update_is_refused,
    lease_recovery
);
async fn lease_recovery(store: &TestStore) {
    let (url, deliveries) = counting_server().await;
    let outbox = store.outbox(sender_config(Duration::from_millis(20)));
    let id = store.enqueue(&outbox, message("peer", "S200", json!({})));
    // A dispatcher claimed the row and died: Sending, lease already expired.
    store.execute(&format!(
        "UPDATE outbox_messages SET status = 'Sending', lease_token = 'crashed', next_retry_at = {}",
        rfidl_runtime::store::now_ms() - 1
    ));
    let handle = store
        .dispatcher(&outbox)
        .route(
            "peer",
            HttpTransport::new(&url, Duration::from_millis(500)).expect("client"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher");
    store.wait_for(&id, Status::Sent).await;
    assert_eq!(deliveries.of(&id), 1, "re-sent once");
    // The crashed dispatcher wakes up and records its old attempt: fenced out.
    store.execute(&format!(
        "UPDATE outbox_messages SET status = 'Failed' WHERE message_id = '{id}' \
         AND lease_token = 'crashed' AND status = 'Sending'"
    ));
    assert_eq!(store.row(&id).status, Status::Sent);
    handle.shutdown().await;
}

on_every_store!(
    three_dispatchers_on_one_database_never_send_a_message_twice,
    competing_dispatchers
);
async fn competing_dispatchers(store: &TestStore) {
    let (url, deliveries) = counting_server().await;
    let outbox = store.outbox(sender_config(Duration::from_millis(5)));
    let ids = store.enqueue_many(
        &outbox,
        (0..300)
            .map(|_| message("peer", "S200", json!({})))
            .collect(),
    );
    let start = || {
        store
            .dispatcher(&outbox)
            .route(
                "peer",
                HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
                Secret::generate(),
            )
            .start()
            .expect("dispatcher")
    };
    let dispatchers = [start(), start(), start()];
    store.wait_for_all(&ids, Status::Sent).await;
    assert_eq!(deliveries.distinct(), 300);
    assert_eq!(deliveries.total(), 300, "a message was sent twice");
    for handle in dispatchers {
        handle.shutdown().await;
    }
}

on_every_store!(
    a_failed_handler_rolls_back_and_the_retry_commits_once,
    handler_failure
);
async fn handler_failure(store: &TestStore) {
    let receiver_store = store.another();
    let sender_secret = Secret::generate();
    let receiver = receiver_store
        .start_receiver(support::receiver_config(&[&sender_secret]))
        .await;
    // The first two attempts write their row, then fail: rolled back.
    receiver
        .ledger
        .fail_next
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let outbox = store.outbox(sender_config(Duration::from_millis(20)));
    let handle = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            sender_secret,
        )
        .start()
        .expect("dispatcher");
    let id = store.enqueue(
        &outbox,
        message("ledger", "Credit", json!({"account": "a", "amount": 5})),
    );
    let row = store.wait_for(&id, Status::Sent).await;
    assert_eq!(row.retry_count, 2);
    assert_eq!(
        receiver
            .ledger
            .calls
            .load(std::sync::atomic::Ordering::SeqCst),
        3
    );
    assert_eq!(receiver_store.count("SELECT COUNT(*) FROM ledger"), 1);
    // A poisoned message is dead-lettered, its effects rolled back.
    let poison = store.enqueue(&outbox, message("ledger", "Poison", json!({})));
    store.wait_for(&poison, Status::DeadLetter).await;
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM inbox_messages"),
        1
    );
    handle.shutdown().await;
    receiver.receiver.shutdown().await;
}

on_every_store!(
    copies_of_one_message_on_two_receivers_of_one_database_run_the_handler_once,
    two_replicas
);
async fn two_replicas(store: &TestStore) {
    let secret = Secret::generate();
    let config = support::receiver_config(&[&secret]);
    let ledgers = [
        Arc::new(support::Ledger::default()),
        Arc::new(support::Ledger::default()),
    ];
    let mut urls = Vec::new();
    let mut receivers = Vec::new();
    for ledger in &ledgers {
        let receiver = store
            .receiver(config.clone(), ledger.clone())
            .expect("receiver");
        let (url, _server) = serve(receiver.router()).await;
        urls.push(url);
        receivers.push(receiver);
    }
    let client = reqwest::Client::new();
    for round in 0..10 {
        let id = Uuid::now_v7().to_string();
        let body = serde_json::to_vec(&support::envelope(
            &id,
            "Credit",
            json!({"account": "r", "amount": round}),
        ))
        .expect("json");
        // Eight copies at once, four to each replica.
        let copies = (0..8).map(|i| {
            let (client, url, body, id, secret) = (
                client.clone(),
                urls[i % 2].clone(),
                body.clone(),
                id.clone(),
                secret.clone(),
            );
            tokio::spawn(async move {
                support::post_signed(&client, &url, &body, &id, &secret, now_secs()).await
            })
        });
        let answers = futures_join(copies.collect()).await;
        let fresh = answers
            .iter()
            .filter(|(status, body)| *status == 200 && body["duplicate"] == json!(false))
            .count();
        assert_eq!(fresh, 1, "{} round {round}: {answers:?}", store.name());
        for (status, body) in &answers {
            assert!(
                *status == 200 || (*status == 503 && body["error"] == "in_progress"),
                "{status} {body}"
            );
        }
    }
    assert_eq!(store.count("SELECT COUNT(*) FROM ledger"), 10);
    assert_eq!(store.count("SELECT COUNT(*) FROM inbox_messages"), 10);
    for receiver in receivers {
        receiver.shutdown().await;
    }
}

on_every_store!(
    batch_items_keep_their_own_exactly_once_semantics,
    batch_items
);
async fn batch_items(store: &TestStore) {
    let receiver = store
        .start_receiver(support::receiver_config(&[&Secret::generate()]))
        .await;
    let now = now_secs();
    let item = |id: &str, endpoint: &str, payload: serde_json::Value, secret: &Secret| {
        support::batch_item(id, endpoint, payload, secret, now)
    };
    let new_id = || Uuid::now_v7().to_string();
    let repeated = new_id();
    let items = json!([
        item(
            &new_id(),
            "Credit",
            json!({"account": "b", "amount": 1}),
            &receiver.secret
        ),
        item(
            &repeated,
            "Credit",
            json!({"account": "b", "amount": 2}),
            &receiver.secret
        ),
        item(
            &repeated,
            "Credit",
            json!({"account": "b", "amount": 2}),
            &receiver.secret
        ),
        item(
            &new_id(),
            "Credit",
            json!({"account": "b"}),
            &receiver.secret
        ),
        item(
            &new_id(),
            "Credit",
            json!({"account": "b", "amount": 4}),
            &Secret::generate()
        ),
    ]);
    let results: Vec<serde_json::Value> = reqwest::Client::new()
        .post(format!("{}/_rf/receive/batch", receiver.url))
        .json(&items)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [200, 200, 200, 422, 401]);
    assert_eq!(results[1]["body"]["duplicate"], false);
    assert_eq!(results[2]["body"]["duplicate"], true);
    assert_eq!(store.count("SELECT COUNT(*) FROM ledger"), 2);
    receiver.receiver.shutdown().await;
}

fn now_secs() -> i64 {
    rfidl_runtime::signing::unix_now()
}

async fn futures_join<T: Send + 'static>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("join"));
    }
    out
}

/// A receiver stand-in that acknowledges everything and counts deliveries
/// per message id.
#[derive(Clone, Default)]
struct Deliveries(Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>);

impl Deliveries {
    fn of(&self, id: &Uuid) -> u32 {
        self.0
            .lock()
            .expect("lock")
            .get(&id.to_string())
            .copied()
            .unwrap_or(0)
    }
    fn distinct(&self) -> usize {
        self.0.lock().expect("lock").len()
    }
    fn total(&self) -> u32 {
        self.0.lock().expect("lock").values().sum()
    }
}

async fn counting_server() -> (String, Deliveries) {
    let deliveries = Deliveries::default();
    let state = deliveries.clone();
    let router = axum::Router::new().route(
        "/_rf/receive",
        axum::routing::post(move |body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let id = envelope["messageId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                *state.0.lock().expect("lock").entry(id).or_default() += 1;
                axum::Json(json!({"acknowledged": true, "duplicate": false, "payload": null}))
            }
        }),
    );
    let (url, _server) = serve(router).await;
    (url, deliveries)
}

/// A `postgres://` URL is not a database of its own (the sqlx store opens
/// on the caller's pool), and a PostgreSQL database written by a newer
/// version is refused when the
/// sqlx store opens it, untouched (the start-up errors that name the host
/// and the cause are in `sqlx_postgres`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_database_of_a_newer_version_is_refused_untouched() {
    // A URL is refused with the way to open the database, its password
    // never shown.
    let url = rfidl_runtime::Database::parse("postgres://app:s3cret@db/x").expect_err("a URL");
    assert!(url.to_string().contains("PgStore::open"), "{url}");
    assert!(!url.to_string().contains("s3cret"), "{url}");

    let Some(store) = TestStore::postgres() else {
        return;
    };
    store.execute("UPDATE rfidl_schema SET version = 99");
    let pool = store.pg_store().pool().clone();
    let error = match rfidl_runtime::store::sqlx_postgres::PgStore::open(pool).await {
        Err(error) => error.to_string(),
        Ok(_) => panic!("opened a newer database"),
    };
    assert!(error.contains("schema version 99"), "{error}");
    assert_eq!(store.count("SELECT version FROM rfidl_schema"), 99);
}
