//! rfidl's (c) on the async PostgreSQL store (`sqlx::Postgres`), each run on
//! fresh databases of one server (`RFIDL_POSTGRES_URL`): shared by the
//! delivery benchmark's PostgreSQL figures and the peers benchmark, which
//! measures apalis-postgres beside it on the same server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rfidl_runtime::config::{Config, DestinationConfig};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::{DELIVERIES, DeliveryRun, Ledger};

/// Receiver writers (each a transaction, and a connection, at a time).
const WRITERS: usize = 8;

/// A fresh, empty database `rfidl_bench_<name>` on `server`: its URL.
pub fn database(server: &str, name: &str) -> String {
    let name = format!("rfidl_bench_{name}");
    let mut admin = ::postgres::Client::connect(server, ::postgres::NoTls)
        .expect("connect to RFIDL_POSTGRES_URL");
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .expect("drop");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create");
    let (scheme, rest) = server.split_once("://").expect("a URL");
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    format!("{scheme}://{authority}/{name}")
}

/// A pool of `connections` on a fresh database `rfidl_bench_<name>`.
pub async fn pool(server: &str, name: &str, connections: u32) -> PgPool {
    let (server, name) = (server.to_owned(), name.to_owned());
    let url = tokio::task::spawn_blocking(move || database(&server, &name))
        .await
        .expect("database");
    PgPoolOptions::new()
        .max_connections(connections)
        .connect(url.as_str())
        .await
        .expect("pool")
}

/// A sender and a receiver on databases of their own, over HTTP loopback.
pub struct SqlxPair {
    pub outbox: Outbox<sqlx::Postgres>,
    pub sender: PgPool,
    pub receiver: PgPool,
    pub effects: Arc<Mutex<Vec<Instant>>>,
    _receiver: Receiver,
    _stores: (PgStore, PgStore),
}

/// The pair of run `name`: (c)'s settings (batch 256, 64 in flight).
pub async fn pair(server: &str, name: &str) -> SqlxPair {
    let secret = Secret::generate();
    let receiver_pool = pool(server, &format!("{name}_sqlx_receiver"), WRITERS as u32 + 2).await;
    let receiving = PgStore::open(receiver_pool.clone()).await.expect("store");
    sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL, amount BIGINT NOT NULL)")
        .execute(&receiver_pool)
        .await
        .expect("table");
    let effects = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::builder(
        Config::for_service("ledger").with_peer("bench", secret.to_whsec()),
        &receiving,
    )
    .writers(WRITERS)
    .service(Ledger {
        effects: Some(effects.clone()),
    })
    .build()
    .expect("receiver");
    let router = receiver.router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    let sender_pool = pool(server, &format!("{name}_sqlx_sender"), 4).await;
    let sending = PgStore::open(sender_pool.clone()).await.expect("store");
    let mut config = Config::for_service("bench")
        .with_destination("ledger", DestinationConfig::new(url, secret.to_whsec()));
    config.outbox.max_in_flight = 64;
    config.outbox.batch_size = 256;
    SqlxPair {
        outbox: Outbox::new(config, &sending),
        sender: sender_pool,
        receiver: receiver_pool,
        effects,
        _receiver: receiver,
        _stores: (sending, receiving),
    }
}

/// The one number `sql` selects.
pub async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// (c) on the sqlx store: a backlog of [`DELIVERIES`] messages made by
/// `make`, enqueued in one sqlx transaction, then delivered and processed
/// exactly once (checked by counting ledger rows).
pub async fn delivery_run(
    server: &str,
    name: &str,
    make: fn(&str, usize) -> OutgoingMessage,
) -> DeliveryRun {
    let pair = pair(server, name).await;
    let enqueuing = Instant::now();
    let mut tx = pair.sender.begin().await.expect("tx");
    for n in 0..DELIVERIES {
        pair.outbox
            .enqueue_async(&mut tx, make("ledger", n))
            .await
            .expect("enqueue");
    }
    tx.commit().await.expect("commit");
    let enqueue = enqueuing.elapsed();
    let started = Instant::now();
    let dispatcher = Dispatcher::builder(&pair.outbox)
        .start()
        .expect("dispatcher");
    loop {
        let sent = count(
            &pair.sender,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
        )
        .await;
        if sent as usize == DELIVERIES {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliver = started.elapsed();
    dispatcher.shutdown().await;
    let effects = count(&pair.receiver, "SELECT COUNT(*) FROM ledger").await;
    assert_eq!(effects as usize, DELIVERIES, "exactly once");
    DeliveryRun { enqueue, deliver }
}
