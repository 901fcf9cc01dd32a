//! One destination, several base URLs (`SpreadTransport`), over real HTTP on
//! loopback: two receivers (two `Receiver`s and two axum servers sharing one
//! inbox database, as two instances of one service do) each get a share;
//! one stopped mid-run loses nothing and duplicates nothing; a destination
//! whose every URL is down is retried behind its circuit as before, and
//! drains once one URL answers again. The two runs with receivers run on
//! every store (`on_every_store!`: on PostgreSQL the instances share one
//! database, as replicas do); the URL checks and the transport's own
//! failover rules need no store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::{Dispatcher, DispatcherError};
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::{HttpTransport, OutgoingRequest, SpreadTransport, Transport};
use serde_json::json;
use tokio::sync::oneshot;

use crate::dispatcher::{message, sender_config};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, Ledger};

/// A receiver instance whose server can be stopped for real: the listener
/// closes (connections refused) and open connections end.
struct Instance {
    url: String,
    ledger: Arc<Ledger>,
    receiver: Receiver,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

/// An instance on `store` (shared by every instance of the service), on a
/// free port or on `port`.
async fn instance(store: &TestStore, secret: &Secret, port: u16) -> Instance {
    let ledger = Arc::new(Ledger::default());
    let receiver = store
        .receiver(support::receiver_config(&[secret]), ledger.clone())
        .expect("receiver");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = oneshot::channel::<()>();
    let router = receiver.router();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
    });
    Instance {
        url,
        ledger,
        receiver,
        stop: Some(stop),
        server,
    }
}

impl Instance {
    /// Stops the server (in-flight requests finish; then the port refuses).
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), &mut self.server)
            .await
            .expect("server stopped within 5 s")
            .expect("server task");
        self.receiver.shutdown().await;
    }
}

/// A loopback port nothing listens on (bound, then closed).
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("addr").port()
}

fn credit(amount: i64) -> OutgoingMessage {
    message(
        "ledger",
        "Credit",
        json!({"account": "spread", "amount": amount}),
    )
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

fn sent(store: &TestStore) -> i64 {
    store.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")
}

/// Rows that are not `Sent` or `Pending`/`Sending` (would need a human).
fn needing_a_human(store: &TestStore) -> i64 {
    store.count(
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
    )
}

on_every_store!(
    messages_spread_over_two_receivers_and_one_stopping_mid_run_loses_and_repeats_nothing,
    one_instance_stops
);
async fn one_instance_stops(store: &TestStore) {
    let secret = Secret::generate();
    let inbox = store.another();
    let a = instance(&inbox, &secret, 0).await;
    let mut b = instance(&inbox, &secret, 0).await;
    // A timeout well above a loaded machine's slowest batch: a request
    // that timed out would be failed over while its transaction is still
    // open on the first instance, and the second would answer 503
    // `in_progress` (a retry this test does not expect; a stopped
    // instance refuses at once, whatever the timeout).
    let spread = Arc::new(SpreadTransport::new(vec![
        HttpTransport::new(&a.url, Duration::from_secs(5)).expect("client"),
        HttpTransport::new(&b.url, Duration::from_secs(5)).expect("client"),
    ]));
    let outbox = store.outbox(sender_config(Duration::from_millis(50)));
    let dispatcher = store
        .dispatcher(&outbox)
        .route("ledger", spread.clone(), secret.clone())
        .start()
        .expect("dispatcher");

    // Both up: singles (paced) and batches (one transaction of 100) are
    // spread over both.
    for i in 0..30 {
        store.enqueue(&outbox, credit(i));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    store.enqueue_many(&outbox, (30..130).map(credit).collect());
    wait_until("the first 130 sent", Duration::from_secs(10), || {
        sent(store) == 130
    })
    .await;
    let (a_before, b_before) = (
        a.ledger.calls.load(Ordering::SeqCst),
        b.ledger.calls.load(Ordering::SeqCst),
    );
    assert!(
        a_before > 0 && b_before > 0,
        "each receiver got a share: {a_before} and {b_before}"
    );
    assert_eq!(a_before + b_before, 130, "one delivery per message");

    // B stops while messages are flowing: enqueued one by one, B stopped
    // after the 20th, then a batch of 100 with B gone.
    let started = Instant::now();
    for i in 130..190 {
        store.enqueue(&outbox, credit(i));
        if i == 150 {
            b.stop().await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let b_at_stop = b.ledger.calls.load(Ordering::SeqCst);
    store.enqueue_many(&outbox, (190..290).map(credit).collect());
    let drained = wait_until("all 290 sent", Duration::from_secs(10), || {
        sent(store) == 290
    })
    .await;
    eprintln!(
        "spread: before the stop A {a_before} / B {b_before}; B stopped after {b_at_stop}; \
         160 more sent {:?} after the run's start ({drained:?} after the last enqueue); endpoints {:?}",
        started.elapsed(),
        spread.endpoints()
    );
    assert_eq!(needing_a_human(store), 0);
    assert_eq!(
        outbox.metrics().outbox_retries.get(),
        0,
        "no message needed a second attempt: a refused endpoint was failed over in the same one"
    );
    assert_eq!(
        b.ledger.calls.load(Ordering::SeqCst),
        b_at_stop,
        "nothing reached the stopped instance"
    );
    let endpoints = spread.endpoints();
    assert!(
        endpoints[0].up && endpoints[0].failures == 0,
        "{endpoints:?}"
    );
    assert!(
        endpoints[1].failures >= 1,
        "the stopped instance was tried and marked down: {endpoints:?}"
    );
    assert_eq!(inbox.count("SELECT COUNT(*) FROM ledger"), 290);
    assert_eq!(
        inbox.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        290,
        "each message took effect exactly once"
    );
    assert_eq!(
        inbox.count("SELECT CAST(SUM(amount) AS BIGINT) FROM ledger"),
        (0..290).sum::<i64>()
    );
    dispatcher.shutdown().await;
    a.receiver.shutdown().await;
}

on_every_store!(
    a_destination_whose_every_url_is_down_is_retried_behind_its_circuit_and_drains_when_one_returns,
    every_url_down
);
async fn every_url_down(store: &TestStore) {
    let secret = Secret::generate();
    let (first, second) = (closed_port().await, closed_port().await);
    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.probe_interval_max = Duration::from_millis(200);
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(format!("http://127.0.0.1:{first}"), secret.to_whsec())
            .with_urls(vec![format!("http://127.0.0.1:{second}/")]),
    );
    let outbox = store.outbox(config);
    let dispatcher = store.dispatcher(&outbox).start().expect("dispatcher");
    let ids = store.enqueue_many(&outbox, (0..20).map(credit).collect());
    let circuit_open = || {
        outbox
            .circuit_states()
            .iter()
            .any(|s| s.destination == "ledger" && s.circuit == "open")
    };
    wait_until("the circuit opens", Duration::from_secs(5), circuit_open).await;
    // A few probes while everything is down.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(circuit_open(), "still open while every URL is down");
    assert_eq!(sent(store), 0);
    assert_eq!(
        needing_a_human(store),
        0,
        "an outage is not the messages' fault"
    );
    assert_eq!(
        store.count("SELECT MAX(retry_count) FROM outbox_messages"),
        0,
        "an unreachable destination is not counted against max_retries"
    );
    let last_error = ids
        .iter()
        .find_map(|id| store.row(id).last_error)
        .expect("a row with last_error");
    assert!(last_error.contains("cannot connect"), "{last_error}");

    // The second URL comes back: the next probe finds it, the backlog drains.
    let inbox = store.another();
    let back = instance(&inbox, &secret, second).await;
    let drained = wait_until("drain after the outage", Duration::from_secs(10), || {
        sent(store) == 20
    })
    .await;
    eprintln!("every URL down, then one back: 20 drained in {drained:?}");
    assert_eq!(
        inbox.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        20
    );
    assert_eq!(inbox.count("SELECT COUNT(*) FROM ledger"), 20);
    wait_until("the circuit closes", Duration::from_secs(5), || {
        !circuit_open()
    })
    .await;
    dispatcher.shutdown().await;
    back.receiver.shutdown().await;
}

#[tokio::test]
async fn several_urls_must_all_be_http_and_distinct() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    for (url, urls, expected) in [
        (
            "http://127.0.0.1:1",
            vec!["unix:///run/x.sock"],
            "`urls[0]` is not an http:// or https:// URL",
        ),
        (
            "unix:///run/x.sock",
            vec!["http://127.0.0.1:1"],
            "`url` is not an http:// or https:// URL",
        ),
        (
            "http://127.0.0.1:1",
            vec!["http://127.0.0.1:2", "http://127.0.0.1:1/"],
            "`urls[1]` repeats an earlier base URL",
        ),
    ] {
        let mut config = sender_config(Duration::from_millis(50));
        config.destinations.insert(
            "ledger".into(),
            DestinationConfig::new(url, Secret::generate().to_whsec()).with_urls(urls),
        );
        let outbox = Outbox::new(config, &db);
        let Err(error) = Dispatcher::builder(&outbox).start() else {
            panic!("{url} {expected}: the dispatcher started");
        };
        assert!(
            matches!(&error, DispatcherError::Destination { name, .. } if name == "ledger"),
            "{error:?}"
        );
        assert!(error.to_string().contains(expected), "{error}");
    }
}

fn unsigned(body: &str) -> OutgoingRequest {
    OutgoingRequest {
        path: rfidl_runtime::receiver::RECEIVE_PATH,
        headers: Vec::new(),
        body: body.as_bytes().to_vec(),
    }
}

#[tokio::test]
async fn an_http_answer_of_any_status_is_not_failed_over_but_no_answer_is() {
    // `busy` answers 503 to everything; `counted` answers 200 and counts.
    let hits = Arc::new(AtomicU32::new(0));
    let busy = axum::Router::new().fallback(|| async { (StatusCode::SERVICE_UNAVAILABLE, "busy") });
    let counted = {
        let hits = hits.clone();
        axum::Router::new().fallback(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            async { "[]" }
        })
    };
    let (busy_url, _busy) = support::serve(busy).await;
    let (counted_url, _counted) = support::serve(counted).await;
    let client = |url: &str| HttpTransport::new(url, Duration::from_secs(2)).expect("client");
    let spread = SpreadTransport::new(vec![client(&busy_url), client(&counted_url)]);
    // Turns: busy, counted, busy.
    let first = spread.send(unsigned("{}")).await.expect("an answer");
    assert_eq!(first.status, 503, "the 503 is returned, not failed over");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(
        spread.send(unsigned("{}")).await.expect("answer").status,
        200
    );
    let batch = spread
        .send_batch(vec![unsigned("{}"), unsigned("{}")])
        .await;
    assert_eq!(batch.len(), 2);
    assert!(
        batch.iter().all(|answer| answer
            .as_ref()
            .is_err_and(|e| e.to_string().contains("batch answered 503"))),
        "{batch:?}"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the batch was not failed over"
    );
    assert!(
        spread.endpoints().iter().all(|e| e.up && e.failures == 0),
        "{:?}",
        spread.endpoints()
    );

    // No answer (refused) moves the whole batch to the next endpoint: a
    // real receiver, which answers each (unsigned) item on its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver =
        support::start_receiver(dir.path(), support::receiver_config(&[&Secret::generate()])).await;
    let refused = format!("http://127.0.0.1:{}", closed_port().await);
    let spread = SpreadTransport::new(vec![client(&refused), client(&receiver.url)]);
    let answers = spread
        .send_batch(vec![unsigned("{}"), unsigned("{}"), unsigned("{}")])
        .await;
    let statuses: Vec<u16> = answers
        .iter()
        .map(|answer| answer.as_ref().expect("answered by the receiver").status)
        .collect();
    assert_eq!(
        statuses,
        [400, 400, 400],
        "each item (no signature headers) answered on its own"
    );
    let endpoints = spread.endpoints();
    assert!(
        !endpoints[0].up && endpoints[0].failures == 1,
        "{endpoints:?}"
    );
    assert!(endpoints[1].up, "{endpoints:?}");
    // The same for a single request; the refused endpoint, down, is tried last.
    let single = spread.send(unsigned("{}")).await.expect("answered");
    assert_eq!(single.status, 400);
    assert_eq!(
        spread.endpoints()[0].failures,
        1,
        "not tried again while down"
    );
}
