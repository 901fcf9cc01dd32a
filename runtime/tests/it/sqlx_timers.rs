//! Durable timers on the two sqlx stores: a message enqueued with a due time
//! in the caller's own `sqlx::Transaction` is stored with that due time (its
//! TTL counted from it), is not sent before it, and leaves within a second
//! of it although the dispatcher polls once a minute: the next-due look-up
//! of each sqlx store wakes it. (`timers.rs` runs the same story, with the
//! health check and a SIGKILL, on the blocking stores.)

use std::time::Duration;

use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::{AnyStore, Location};
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{Dispatcher, dispatcher::DispatcherHandle};
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::support::postgres::database;
use crate::timers::{Arrivals, POLL, due_in, receiver, unix_ms, wait_until};

const TTL: Duration = Duration::from_secs(3600);

/// The outbox of a sending service on `store`, with a one-minute poll.
fn outbox_on<S: AnyStore>(store: impl Location<Store = S>) -> Outbox<S> {
    let mut config = sender_config(POLL);
    config.outbox.ttl = TTL;
    Outbox::new(config, store)
}

fn start<S: AnyStore>(outbox: &Outbox<S>, url: &str) -> DispatcherHandle {
    Dispatcher::builder(outbox)
        .route(
            "peer",
            HttpTransport::new(url, Duration::from_secs(2)).expect("transport"),
            Secret::generate(),
        )
        .start()
        .expect("dispatcher")
}

/// A timer due 3 s from now (room for a loaded machine) beside a message
/// for now; `row` reads the timer's stored `(next_retry_at, created_at,
/// expires_at)`.
async fn timer_story(
    store: &str,
    arrivals: &Arrivals,
    mut enqueue: impl AsyncFnMut(OutgoingMessage) -> Uuid,
    mut row: impl AsyncFnMut(Uuid) -> (i64, i64, i64),
) {
    let (at, due) = due_in(Duration::from_secs(3));
    let id = enqueue(message("peer", "S200", json!({})).deliver_at(at)).await;
    let now_id = enqueue(message("peer", "S200", json!({}))).await;

    let ttl = TTL.as_millis() as i64;
    assert_eq!(
        row(id).await,
        (due, due, due + ttl),
        "{store}: the row's times"
    );
    wait_until("the undelayed message", Duration::from_secs(5), || {
        arrivals.of(&now_id).len() == 1
    })
    .await;
    assert!(
        unix_ms(std::time::SystemTime::now()) < due,
        "{store}: the machine was too slow to look before the due time"
    );
    assert!(
        arrivals.of(&id).is_empty(),
        "{store}: sent before its due time"
    );

    wait_until("the timer", Duration::from_secs(10), || {
        !arrivals.of(&id).is_empty()
    })
    .await;
    let late = arrivals.of(&id)[0] - due;
    assert!(late >= 0, "{store}: sent {} ms early", -late);
    // A poll would be a minute late; generous for a loaded machine.
    assert!(late < 1_000, "{store}: sent {late} ms after due");
    eprintln!("{store}: timer sent {late} ms after its due time");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(arrivals.of(&id).len(), 1, "{store}: sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_in_the_callers_sqlx_sqlite_transaction_leaves_at_its_due_time() {
    use rfidl_runtime::store::sqlx_sqlite::SqliteStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("sender.db"))
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.expect("pool");
    let store = SqliteStore::open(pool.clone()).await.expect("store");
    let (url, arrivals, _server) = receiver().await;
    let outbox = outbox_on::<sqlx::Sqlite>(&store);
    let handle = start(&outbox, &url);
    timer_story(
        "sqlx SQLite",
        &arrivals,
        async |message| {
            let mut tx = pool.begin().await.expect("begin");
            let id = outbox
                .enqueue_async(&mut tx, message)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
            id
        },
        async |id| {
            sqlx::query_as(
                "SELECT next_retry_at, created_at, expires_at FROM outbox_messages \
                 WHERE message_id = ?",
            )
            .bind(id.to_string())
            .fetch_one(&pool)
            .await
            .expect("row")
        },
    )
    .await;
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_in_the_callers_sqlx_postgres_transaction_leaves_at_its_due_time() {
    use rfidl_runtime::store::sqlx_postgres::PgStore;
    let Some(db) = database() else {
        return;
    };
    let pool = sqlx::PgPool::connect(db.url()).await.expect("pool");
    let store = PgStore::open(pool.clone()).await.expect("store");
    let (url, arrivals, _server) = receiver().await;
    let outbox = outbox_on::<sqlx::Postgres>(&store);
    let handle = start(&outbox, &url);
    timer_story(
        "sqlx PostgreSQL",
        &arrivals,
        async |message| {
            let mut tx = pool.begin().await.expect("begin");
            let id = outbox
                .enqueue_async(&mut tx, message)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
            id
        },
        async |id| {
            sqlx::query_as(
                "SELECT next_retry_at, created_at, expires_at FROM outbox_messages \
                 WHERE message_id = $1",
            )
            .bind(id.to_string())
            .fetch_one(&pool)
            .await
            .expect("row")
        },
    )
    .await;
    handle.shutdown().await;
}
