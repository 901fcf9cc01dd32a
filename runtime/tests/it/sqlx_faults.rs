//! PostgreSQL's own failures (SQLite has no server to lose), on the sqlx
//! store: every session of the sender's and the receiver's databases ended,
//! again and again, while messages flow through `Outbox<sqlx::Postgres>`,
//! the dispatcher, the receiver's async handler and its inbox; and replicas
//! that open one fresh database at the same moment.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use rfidl_runtime::{Config, Dispatcher};
use sqlx::postgres::PgPool;

use crate::sqlx_postgres::{Ledger, LedgerService, count, credit, pool};
use crate::support::postgres::{TestDatabase, database};
use crate::support::serve;

/// Ends every session of `db` but the caller's own (a fresh connection):
/// the pools', the dispatcher's `LISTEN` session, the receiver's writers'.
/// Returns how many it ended.
async fn terminate_sessions(db: &TestDatabase) -> i64 {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(db.url())
        .await
        .expect("admin session");
    let ended: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()) AS ended",
    )
    .bind(db.name())
    .fetch_one(&pool)
    .await
    .expect("terminate");
    pool.close().await;
    ended
}

/// While 200 messages flow from a sender on one database to a receiver on
/// another (both sqlx PostgreSQL), every session of both databases is
/// ended ten times: each message still ends `Sent`, its handler's row
/// commits exactly once with its inbox row, none is `Failed`, and no retry
/// is counted against `max_retries` (a transaction lost with its connection
/// is answered 503, retryable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connections_mid_transaction_on_sqlx_are_retried_without_a_duplicate_effect() {
    let (Some(sender_db), Some(receiver_db)) = (database(), database()) else {
        return;
    };
    let sender = PgStore::open(pool(&sender_db).await)
        .await
        .expect("sender store");
    let receiver_pool: PgPool = pool(&receiver_db).await;
    let receiving = PgStore::open(receiver_pool.clone())
        .await
        .expect("receiver store");
    sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL, amount BIGINT NOT NULL)")
        .execute(&receiver_pool)
        .await
        .expect("ledger table");
    let secret = Secret::generate();
    let ledger = Arc::new(Ledger::default());
    // Each handler run holds its transaction open 5 ms: the cuts land in
    // transactions that wrote their ledger row and not yet committed it.
    ledger
        .pause_ms
        .store(5, std::sync::atomic::Ordering::SeqCst);
    let receiver = Receiver::builder(
        Config::for_service("ledger").with_peer("billing", secret.to_whsec()),
        &receiving,
    )
    .service(LedgerService(Arc::clone(&ledger)))
    .build()
    .expect("receiver");
    let (url, _server) = serve(receiver.router()).await;
    let mut config = Config::for_service("billing")
        .with_destination("ledger", DestinationConfig::new(url, secret.to_whsec()));
    config.outbox.poll_interval = Duration::from_millis(20);
    // A cut between a claim and its recording leaves rows `Sending` until
    // their lease runs out: a short lease keeps the test short.
    config.outbox.lease_timeout = Duration::from_secs(2);
    let outbox = Outbox::new(config, &sender);
    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");

    let total: i64 = 200;
    let mut ended = 0;
    for round in 0..10 {
        // Twenty messages, each in a transaction of the caller's; the
        // pool replaces the connections the last cut ended.
        for i in 0..total / 10 {
            let mut tx = loop {
                match sender.pool().begin().await {
                    Ok(tx) => break tx,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            };
            outbox
                .enqueue_async(&mut tx, credit(round * 100 + i))
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        ended += terminate_sessions(&sender_db).await + terminate_sessions(&receiver_db).await;
    }

    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let sent = |pool: PgPool| async move {
        count(
            &pool,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
        )
        .await
    };
    loop {
        let done = sent(sender.pool().clone()).await;
        if done == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {total} sent after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sender_pool = sender.pool().clone();
    assert_eq!(
        count(&sender_pool, "SELECT COUNT(*) FROM outbox_messages").await,
        total,
        "nothing Failed, nothing left behind"
    );
    assert_eq!(
        count(
            &sender_pool,
            "SELECT COALESCE(MAX(retry_count), 0)::bigint FROM outbox_messages"
        )
        .await,
        0,
        "a lost connection is answered retryable (503), not counted against max_retries"
    );
    assert_eq!(
        count(&receiver_pool, "SELECT COUNT(*) FROM ledger").await,
        total,
        "each message took effect once"
    );
    assert_eq!(
        count(
            &receiver_pool,
            "SELECT COUNT(DISTINCT message_id) FROM ledger"
        )
        .await,
        total
    );
    assert_eq!(
        count(&receiver_pool, "SELECT COUNT(*) FROM inbox_messages").await,
        total
    );
    assert!(ended >= 10, "the cuts ended sessions: {ended}");
    assert!(
        ledger.runs() > total as u32,
        "some cut landed inside a handler's transaction (its run was lost, then run \
         again): {} runs for {total} messages",
        ledger.runs()
    );
    eprintln!(
        "{ended} sessions ended in 10 cuts; drained {:?} after the last; {} handler runs \
         for {total} messages",
        started.elapsed(),
        ledger.runs()
    );
    dispatcher.shutdown().await;
    receiver.shutdown().await;
}

/// Eight replicas open one fresh database at the same moment, each on a
/// pool of its own: all open, the migrations ran once (the schema's version
/// is the number of migrations, its tables exist once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_migrate_once() {
    let Some(db) = database() else {
        return;
    };
    let replicas = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(replicas));
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..replicas {
        let (url, barrier) = (db.url().to_owned(), barrier.clone());
        opening.spawn(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(&url)
                .await
                .expect("pool");
            barrier.wait().await;
            PgStore::open(pool).await.map(drop)
        });
    }
    while let Some(opened) = opening.join_next().await {
        opened.expect("replica task").expect("opened");
    }
    let admin = pool(&db).await;
    assert_eq!(
        count(&admin, "SELECT version FROM rfidl_schema").await,
        rfidl_runtime::store::sqlx_postgres::MIGRATIONS.len() as i64
    );
    assert_eq!(count(&admin, "SELECT COUNT(*) FROM rfidl_schema").await, 1);
    let mut tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::TEXT FROM pg_tables WHERE schemaname NOT IN \
         ('pg_catalog', 'information_schema')",
    )
    .fetch_all(&admin)
    .await
    .expect("tables");
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
