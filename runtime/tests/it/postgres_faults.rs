//! PostgreSQL-only failures (SQLite has no server to lose): every session
//! of both databases ended while messages flow, and replicas that start at
//! the same moment on one fresh database.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::postgres::PostgresUrl;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::stores::TestStore;
use crate::support;

/// While 200 messages flow from a sender on one database to a receiver on
/// another, every session of both databases is ended ten times (the
/// dispatcher's, the receiver's writers' and look-ups'): each message still
/// ends `Sent`, takes effect exactly once, none is `Failed`, and no retry
/// was counted (a lost transaction is answered 503, retryable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connections_in_flight_are_retried_and_lose_nothing() {
    let (Some(sender), Some(receiver_store)) = (TestStore::postgres(), TestStore::postgres())
    else {
        return;
    };
    let secret = Secret::generate();
    let receiver = receiver_store
        .start_receiver(support::receiver_config(&[&secret]))
        .await;
    // A cut that lands between a claim and its recording leaves the rows
    // `Sending` until their lease runs out (the dispatcher cannot tell a
    // lost commit from a failed one): a short lease keeps the test short.
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.lease_timeout = Duration::from_secs(2);
    let outbox = sender.outbox(config);
    let dispatcher = sender
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    let total = 200;
    let mut ids: Vec<Uuid> = Vec::new();
    let mut ended = 0;
    // Twenty messages, then a cut of both databases, ten times over: the
    // cuts land while earlier messages are claimed, sent and recorded.
    for round in 0..10 {
        ids.extend(
            sender.enqueue_many(
                &outbox,
                (0..total / 10)
                    .map(|i| {
                        message(
                            "ledger",
                            "Credit",
                            json!({"account": "cut", "amount": round * 100 + i}),
                        )
                    })
                    .collect(),
            ),
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        ended += sender.terminate_sessions() + receiver_store.terminate_sessions();
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    loop {
        let sent = sender.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'");
        if sent == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{sent} of {total} sent: {:?}",
            sender.status_counts()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ids.len() as i64, total);
    assert_eq!(
        sender.status_counts(),
        vec![("Sent".to_owned(), total)],
        "nothing Failed, nothing left behind"
    );
    assert_eq!(
        sender.count("SELECT MAX(retry_count) FROM outbox_messages"),
        0,
        "a lost connection is answered retryable (503), not counted against max_retries"
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        total,
        "each message took effect once"
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        total
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM inbox_messages"),
        total
    );
    assert!(ended >= 10, "the cuts ended sessions: {ended}");
    // What the cuts hit (varies from run to run): deliveries sent again
    // because a cut lost the sender's record of them, answered duplicate.
    eprintln!(
        "{ended} sessions ended in 10 cuts; drained {:?} after the last; \
         {} deliveries answered duplicate",
        started.elapsed(),
        receiver.receiver.metrics().inbox_duplicates.get()
    );
    dispatcher.shutdown().await;
    receiver.receiver.shutdown().await;
}

/// Eight replicas open one fresh database at the same moment: all start,
/// the migrations ran once (the schema's version is the number of
/// migrations, its tables exist once).
#[test]
fn replicas_starting_together_migrate_once() {
    let Some(db) = crate::support::postgres::database() else {
        return;
    };
    let url = PostgresUrl::parse(db.url()).expect("url");
    let replicas = 8;
    let barrier = Arc::new(Barrier::new(replicas));
    let threads: Vec<_> = (0..replicas)
        .map(|_| {
            let (url, barrier) = (url.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                rfidl_runtime::store::postgres::open(&url).map(drop)
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("replica thread").expect("opened");
    }
    let mut client = db.connect();
    let version: i64 = client
        .query_one("SELECT version FROM rfidl_schema", &[])
        .expect("version")
        .get(0);
    assert_eq!(
        version,
        rfidl_runtime::store::postgres::MIGRATIONS.len() as i64
    );
    let rows: i64 = client
        .query_one("SELECT COUNT(*) FROM rfidl_schema", &[])
        .expect("rows")
        .get(0);
    assert_eq!(rows, 1);
    let mut tables: Vec<String> = client
        .query(
            "SELECT tablename::TEXT FROM pg_tables WHERE schemaname NOT IN \
             ('pg_catalog', 'information_schema')",
            &[],
        )
        .expect("tables")
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Sorted here: the server's collation may order `_` differently.
    tables.sort();
    assert_eq!(
        tables,
        [
            "inbox_messages",
            "outbox_messages",
            "rf_decommissioned",
            "rf_lifecycle_applied",
            "rf_terminated",
            "rfidl_schema"
        ],
        "each table once"
    );
}
