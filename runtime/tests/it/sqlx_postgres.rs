//! The async PostgreSQL store on sqlx, on the tests' real server: messages
//! enqueued in the caller's own `sqlx::Transaction` are sent if and only if
//! it commits; async handlers run in the receiver's transaction, exactly
//! once; a commit by another process wakes the dispatcher through
//! `LISTEN`/`NOTIFY`; a custom schema; start-up errors that name the host
//! and the cause, never the password.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{
    AsyncHostedService, HandlerError, HostedInterface, IncomingCall, Receiver,
};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::StoreError;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use rfidl_runtime::{BoxFuture, Config, Dispatcher, MessageType};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};

use crate::support::postgres::{TestDatabase, database};
use crate::support::serve;

const INTERFACE: &str = "test.Ledger";
const FINGERPRINT: &str = "sha256:ledger-v1";

const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: INTERFACE,
    version: 1,
    fingerprint: FINGERPRINT,
    endpoints: &["Credit", "Refuse"],
    manifest_json: r#"{"interface":"test.Ledger","version":1}"#,
}];

/// Credits a ledger row through the receiver's connection; `Refuse` writes
/// a row, then refuses (so the row must roll back).
#[derive(Default)]
pub(crate) struct Ledger {
    runs: AtomicU32,
    /// Milliseconds each run waits in its transaction after its insert (0:
    /// none), so that a fault can land mid-transaction.
    pub(crate) pause_ms: AtomicU32,
}

impl Ledger {
    /// How many times the handler ran (a run whose transaction rolled back
    /// counts too).
    pub(crate) fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

pub(crate) struct LedgerService(pub(crate) Arc<Ledger>);

impl AsyncHostedService<sqlx::Postgres> for LedgerService {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            self.0.runs.fetch_add(1, Ordering::SeqCst);
            let amount = call.payload["amount"].as_i64().unwrap_or(0);
            sqlx::query("INSERT INTO ledger (message_id, amount) VALUES ($1, $2)")
                .bind(call.message_id)
                .bind(amount)
                .execute(&mut *conn)
                .await
                .map_err(HandlerError::retryable)?;
            // Yields to the runtime mid-handler, as real handlers do.
            tokio::task::yield_now().await;
            let pause = self.0.pause_ms.load(Ordering::SeqCst);
            if pause > 0 {
                sqlx::query("SELECT pg_sleep($1)")
                    .bind(f64::from(pause) / 1000.0)
                    .execute(&mut *conn)
                    .await
                    .map_err(HandlerError::retryable)?;
            }
            match call.endpoint {
                "Refuse" => Err(HandlerError::poison("refused after writing")),
                _ => Ok(serde_json::json!({ "credited": amount })),
            }
        })
    }
}

pub(crate) fn credit(amount: i64) -> OutgoingMessage {
    OutgoingMessage {
        destination: "ledger".to_owned(),
        message_type: MessageType::Command,
        interface: INTERFACE.to_owned(),
        version: 1,
        fingerprint: FINGERPRINT.to_owned(),
        endpoint: "Credit".to_owned(),
        correlation_id: None,
        payload: serde_json::json!({ "amount": amount }),
        headers: Default::default(),
        max_retries: None,
        ttl: None,
        deliver_at: None,
    }
}

pub(crate) async fn pool(db: &TestDatabase) -> PgPool {
    PgPoolOptions::new()
        .max_connections(12)
        .connect(db.url())
        .await
        .expect("pool")
}

pub(crate) async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Two services, each on a database of its own: `billing` sends, `ledger`
/// receives; a dispatcher with a long poll, so only wake-ups deliver fast.
struct Pair {
    sender: PgStore,
    receiver_pool: PgPool,
    outbox: Outbox<sqlx::Postgres>,
    ledger: Arc<Ledger>,
    receiver: Receiver,
    dispatcher: rfidl_runtime::dispatcher::DispatcherHandle,
    _server: tokio::task::JoinHandle<()>,
    _dbs: (TestDatabase, TestDatabase),
}

impl Pair {
    async fn start() -> Option<Self> {
        let sender_db = database()?;
        let receiver_db = database()?;
        let sender = PgStore::open(pool(&sender_db).await)
            .await
            .expect("sender store");
        let receiver_pool = pool(&receiver_db).await;
        let receiving = PgStore::open(receiver_pool.clone())
            .await
            .expect("receiver store");
        sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL, amount BIGINT NOT NULL)")
            .execute(&receiver_pool)
            .await
            .expect("ledger table");
        let secret = Secret::generate();
        let ledger = Arc::new(Ledger::default());
        let receiver = Receiver::builder(
            Config::for_service("ledger").with_peer("billing", secret.to_whsec()),
            &receiving,
        )
        .service(LedgerService(Arc::clone(&ledger)))
        .build()
        .expect("receiver");
        let (url, server) = serve(receiver.router()).await;
        let mut config = Config::for_service("billing")
            .with_destination("ledger", DestinationConfig::new(url, secret.to_whsec()));
        config.outbox.poll_interval = Duration::from_secs(30);
        let outbox = Outbox::new(config, &sender);
        let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
        Some(Self {
            sender,
            receiver_pool,
            outbox,
            ledger,
            receiver,
            dispatcher,
            _server: server,
            _dbs: (sender_db, receiver_db),
        })
    }

    async fn wait_for_ledger_rows(&self, rows: i64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found = count(&self.receiver_pool, "SELECT COUNT(*) FROM ledger").await;
            if found >= rows {
                assert_eq!(found, rows, "more ledger rows than messages");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{found} of {rows} ledger rows after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        self.dispatcher.shutdown().await;
        self.receiver.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_sent_if_and_only_if_the_callers_sqlx_transaction_commits() {
    let Some(pair) = Pair::start().await else {
        return;
    };
    let pool = pair.sender.pool().clone();
    sqlx::query("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("orders");

    // Rolled back: neither the business row nor the message.
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .expect("order");
    pair.outbox
        .enqueue_async(&mut tx, credit(1))
        .await
        .expect("enqueue");
    tx.rollback().await.expect("rollback");

    // Committed: both, and the message is delivered once.
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .expect("order");
    pair.outbox
        .enqueue_async(&mut tx, credit(2))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");

    pair.wait_for_ledger_rows(1).await;
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM orders").await, 1);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM outbox_messages").await,
        1,
        "the rolled-back message left no row"
    );
    let amount: i64 = sqlx::query_scalar("SELECT amount FROM ledger")
        .fetch_one(&pair.receiver_pool)
        .await
        .expect("amount");
    assert_eq!(amount, 2);
    // The row ends `Sent` with the handler's answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sent: Option<String> =
            sqlx::query_scalar("SELECT response FROM outbox_messages WHERE status = 'Sent'")
                .fetch_optional(&pool)
                .await
                .expect("sent");
        if let Some(response) = sent {
            assert_eq!(response, r#"{"credited":2}"#);
            break;
        }
        assert!(Instant::now() < deadline, "the row never became Sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_from_concurrent_transactions_are_each_handled_exactly_once() {
    let Some(pair) = Pair::start().await else {
        return;
    };
    let pool = pair.sender.pool().clone();
    let mut tasks = Vec::new();
    for task in 0..8_i64 {
        let (pool, outbox) = (pool.clone(), pair.outbox.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..25_i64 {
                let mut tx = pool.begin().await.expect("begin");
                outbox
                    .enqueue_async(&mut tx, credit(task * 100 + n))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    pair.wait_for_ledger_rows(200).await;
    let distinct = count(
        &pair.receiver_pool,
        "SELECT COUNT(DISTINCT message_id) FROM ledger",
    )
    .await;
    assert_eq!(distinct, 200, "one effect per message");
    assert_eq!(
        count(
            &pair.receiver_pool,
            "SELECT COUNT(*) FROM inbox_messages WHERE response IS NOT NULL"
        )
        .await,
        200
    );
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_async_handler_leaves_no_effect_and_a_duplicate_does_not_run_it_again() {
    let Some(pair) = Pair::start().await else {
        return;
    };
    let pool = pair.sender.pool().clone();
    let mut refused = credit(7);
    refused.endpoint = "Refuse".to_owned();
    let mut tx = pool.begin().await.expect("begin");
    let id = pair
        .outbox
        .enqueue_async(&mut tx, refused)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    // Poison: the row ends DeadLetter, and the handler's row rolled back.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status: String =
            sqlx::query_scalar("SELECT status FROM outbox_messages WHERE message_id = $1")
                .bind(id.to_string())
                .fetch_one(&pool)
                .await
                .expect("status");
        if status == "DeadLetter" {
            break;
        }
        assert!(Instant::now() < deadline, "still {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        count(&pair.receiver_pool, "SELECT COUNT(*) FROM ledger").await,
        0
    );
    assert_eq!(
        count(&pair.receiver_pool, "SELECT COUNT(*) FROM inbox_messages").await,
        0
    );

    // A message delivered, then sent again by hand (its row set back to
    // Pending): the receiver answers the copy from its inbox.
    let mut tx = pool.begin().await.expect("begin");
    let id = pair
        .outbox
        .enqueue_async(&mut tx, credit(9))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    pair.wait_for_ledger_rows(1).await;
    let runs = pair.ledger.runs.load(Ordering::SeqCst);
    sqlx::query(
        "UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0, response = NULL \
         WHERE message_id = $1 AND status = 'Sent'",
    )
    .bind(id.to_string())
    .execute(&pool)
    .await
    .expect("resend");
    pair.outbox
        .send(credit(10))
        .await
        .expect("send wakes the dispatcher");
    pair.wait_for_ledger_rows(2).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response: Option<String> = sqlx::query_scalar(
            "SELECT response FROM outbox_messages WHERE message_id = $1 AND status = 'Sent'",
        )
        .bind(id.to_string())
        .fetch_optional(&pool)
        .await
        .expect("response");
        if response.as_deref() == Some(r#"{"credited":9}"#) {
            break;
        }
        assert!(Instant::now() < deadline, "the copy was never answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        pair.ledger.runs.load(Ordering::SeqCst),
        runs + 1,
        "the duplicate did not run the handler (only `send`'s message did)"
    );
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_by_another_process_wakes_the_dispatcher_without_a_poll() {
    let Some(pair) = Pair::start().await else {
        return;
    };
    // Another replica: its own pool and outbox, so no in-process wake-up
    // reaches the dispatcher; only the server's NOTIFY can (poll: 30 s).
    let other_pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*pair.sender.pool().connect_options()).clone())
        .await
        .expect("other pool");
    let other_store = PgStore::open(other_pool.clone())
        .await
        .expect("other store");
    let other = Outbox::new(pair.outbox.config().clone(), &other_store);
    // The listener is up once a first message went through.
    let mut tx = other_pool.begin().await.expect("begin");
    other
        .enqueue_async(&mut tx, credit(1))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    pair.wait_for_ledger_rows(1).await;
    let mut tx = other_pool.begin().await.expect("begin");
    other
        .enqueue_async(&mut tx, credit(2))
        .await
        .expect("enqueue");
    let committed = Instant::now();
    tx.commit().await.expect("commit");
    pair.wait_for_ledger_rows(2).await;
    let took = committed.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "delivered {took:?} after the commit: no wake-up (the poll is 30 s)"
    );
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_live_in_the_configured_schema_whatever_the_search_path() {
    let Some(db) = database() else {
        return;
    };
    let pool = pool(&db).await;
    // A schema that does not exist stops the start, naming it.
    let missing = PgStore::open_in_schema(pool.clone(), "rfidl")
        .await
        .expect_err("no schema");
    let text = missing.to_string();
    assert!(text.contains("schema `rfidl` does not exist"), "{text}");
    sqlx::query("CREATE SCHEMA rfidl")
        .execute(&pool)
        .await
        .expect("schema");
    let store = PgStore::open_in_schema(pool.clone(), "rfidl")
        .await
        .expect("store");
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'rfidl' \
         AND tablename IN ('outbox_messages', 'inbox_messages', 'rfidl_schema')",
    )
    .fetch_one(&pool)
    .await
    .expect("tables");
    assert_eq!(tables, 3);
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public' \
             AND tablename = 'outbox_messages'"
        )
        .await,
        0
    );
    // The caller's search path does not matter to the enqueue.
    let outbox = Outbox::new(Config::for_service("billing"), &store);
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL search_path TO pg_catalog")
        .execute(&mut *tx)
        .await
        .expect("search path");
    outbox
        .enqueue_async(&mut tx, credit(1))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM rfidl.outbox_messages").await,
        1
    );
    // Opening again finds the schema migrated.
    PgStore::open_in_schema(pool, "rfidl")
        .await
        .expect("open again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_there_stops_the_start_naming_the_host_and_never_the_password() {
    // A free loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&format!(
            "postgres://rfidl:not-the-Password-42@127.0.0.1:{port}/orders"
        ))
        .expect("lazy pool");
    let error = PgStore::open(pool).await.expect_err("refused");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Postgres { .. }), "{error:?}");
    assert!(!text.contains("not-the-Password-42"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}/orders")), "{text}");
    assert!(text.contains("cannot connect"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diagnostics_routes_list_and_retry_a_dead_letter_on_the_sqlx_store() {
    let Some(pair) = Pair::start().await else {
        return;
    };
    let pool = pair.sender.pool().clone();
    let mut refused = credit(3);
    refused.endpoint = "Refuse".to_owned();
    let mut tx = pool.begin().await.expect("begin");
    let id = pair
        .outbox
        .enqueue_async(&mut tx, refused)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let diagnostics = rfidl_runtime::Diagnostics::builder(&pair.sender)
        .outbox(&pair.outbox)
        .bearer_token("ops-token")
        .build()
        .expect("diagnostics");
    let (base, server) = serve(diagnostics.router()).await;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let failed: serde_json::Value = client
            .get(format!("{base}/_rf/outbox/failed"))
            .bearer_auth("ops-token")
            .send()
            .await
            .expect("failed")
            .json()
            .await
            .expect("json");
        if failed.to_string().contains(&id.to_string()) {
            break failed;
        }
        assert!(Instant::now() < deadline, "never listed: {failed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(listed.to_string().contains("DeadLetter"), "{listed}");
    let health = client
        .get(format!("{base}/_rf/health"))
        .bearer_auth("ops-token")
        .send()
        .await
        .expect("health");
    let health: serde_json::Value = health.json().await.expect("json");
    assert!(
        health.to_string().contains("DeadLetter") || health.to_string().contains("critical"),
        "{health}"
    );
    let retried = client
        .post(format!("{base}/_rf/outbox/{id}/retry"))
        .bearer_auth("ops-token")
        .send()
        .await
        .expect("retry");
    assert_eq!(
        retried.status(),
        200,
        "{}",
        retried.text().await.unwrap_or_default()
    );
    let retries: i64 =
        sqlx::query_scalar("SELECT retry_count FROM outbox_messages WHERE message_id = $1")
            .bind(id.to_string())
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!(retries, 0, "set back by the retry");
    let ready = client
        .get(format!("{base}/_rf/readyz"))
        .bearer_auth("ops-token")
        .send()
        .await
        .expect("readyz");
    let ready: serde_json::Value = ready.json().await.expect("json");
    assert_eq!(ready["checks"]["migrations"], "ok", "{ready}");
    server.abort();
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_sqlx_stores_deliver_exactly_once_and_serve_their_diagnostics() {
    let (Some(sender_db), Some(receiver_db)) = (database(), database()) else {
        return;
    };
    let sending = PgStore::open(pool(&sender_db).await)
        .await
        .expect("sender store");
    let receiver_pool = pool(&receiver_db).await;
    let receiving = PgStore::open(receiver_pool.clone())
        .await
        .expect("receiver store");
    sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL, amount BIGINT NOT NULL)")
        .execute(&receiver_pool)
        .await
        .expect("ledger table");
    let secret = Secret::generate();
    let ledger = Arc::new(Ledger::default());
    let receiver = rfidl_runtime::Host::builder(
        Config::for_service("ledger").with_peer("billing", secret.to_whsec()),
        &receiving,
    )
    .service(LedgerService(Arc::clone(&ledger)))
    .listen("127.0.0.1:0")
    .await
    .expect("receiving host");
    let sender = rfidl_runtime::Host::builder(
        Config::for_service("billing").with_destination(
            "ledger",
            DestinationConfig::new(receiver.url(), secret.to_whsec()),
        ),
        &sending,
    );
    let outbox = sender.outbox().clone();
    outbox.declare_destination("ledger");
    let sender = sender.listen("127.0.0.1:0").await.expect("sending host");
    for amount in 0..20 {
        let mut tx = sending.pool().begin().await.expect("begin");
        outbox
            .enqueue_async(&mut tx, credit(amount))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&receiver_pool, "SELECT COUNT(*) FROM ledger").await < 20 {
        assert!(Instant::now() < deadline, "not delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let health: serde_json::Value = reqwest::get(format!("{}/_rf/outbox/stats", sender.url()))
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert!(health.is_object(), "{health}");
    sender.shutdown().await.expect("stop the sender");
    receiver.shutdown().await.expect("stop the receiver");
    assert_eq!(
        count(
            &receiver_pool,
            "SELECT COUNT(DISTINCT message_id) FROM ledger"
        )
        .await,
        20
    );
    assert_eq!(
        ledger.runs.load(Ordering::SeqCst),
        20,
        "each handler ran once"
    );
}

// TLS and passwords, on the throw-away cluster of `cargo xtask` (docs/
// testing.md): it speaks TLS with a certificate for `localhost` and
// `127.0.0.1` signed by the CA of `RFIDL_POSTGRES_CA`, asks `rfidl_password`
// for its password and refuses `rfidl_tls_only` without TLS.

/// The CA of the tests' server, from `RFIDL_POSTGRES_CA`, and a fresh
/// database; `None` (the test returns, having said why) when either
/// variable is missing, unless `RFIDL_REQUIRE_POSTGRES=1`.
fn tls_database() -> Option<(TestDatabase, String)> {
    let ca = match std::env::var("RFIDL_POSTGRES_CA") {
        Ok(path) if !path.is_empty() => path,
        _ if std::env::var("RFIDL_REQUIRE_POSTGRES").as_deref() == Ok("1") => panic!(
            "RFIDL_REQUIRE_POSTGRES=1 but RFIDL_POSTGRES_CA is not set: run the tests under \
             `cargo xtask test` or `cargo xtask postgres` (their cluster speaks TLS), or set it \
             to your server's CA (docs/testing.md)"
        ),
        _ => {
            eprintln!(
                "SKIPPED: no PostgreSQL with TLS (run `cargo xtask postgres <command>`, or set \
                 RFIDL_POSTGRES_URL and RFIDL_POSTGRES_CA; docs/testing.md)"
            );
            return None;
        }
    };
    Some((database()?, ca))
}

/// `url` with its user (`name` or `name:password`) and host replaced when
/// given, and its query replaced by `query`.
fn url_with(url: &str, user: Option<&str>, host: Option<&str>, query: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let location = rest.split_once('?').map_or(rest, |(location, _)| location);
    let (authority, database) = location.split_once('/').expect("a database in the URL");
    let (userinfo, address) = match authority.rsplit_once('@') {
        Some((userinfo, address)) => (Some(userinfo), address),
        None => (None, authority),
    };
    let (old_host, port) = match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
            (host, format!(":{port}"))
        }
        _ => (address, String::new()),
    };
    let user = user
        .or(userinfo)
        .map(|user| format!("{user}@"))
        .unwrap_or_default();
    let host = host.unwrap_or(old_host);
    format!("{scheme}://{user}{host}{port}/{database}?{query}")
}

/// `host:port/database` of `url`, as the store's errors name it.
fn target(url: &str) -> String {
    let location = url.split_once("://").expect("URL").1;
    let location = location.split_once('?').map_or(location, |(l, _)| l);
    location
        .rsplit_once('@')
        .map_or(location, |(_, l)| l)
        .to_owned()
}

/// A pool of one connection that connects on first use, as a service
/// builds it: the failure shows at [`PgStore::open`].
fn lazy_pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy(url)
        .expect("lazy pool")
}

/// Runs administrative statements on the test database as the URL's
/// superuser.
async fn administer(db: &TestDatabase, sql: String) {
    let pool = lazy_pool(db.url());
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .expect("administration");
    pool.close().await;
}

/// Makes sure the cluster-wide `role` exists (another test run may have
/// made it, or be making it now) with `password`, and may create the
/// store's tables in the test database.
async fn login_role(db: &TestDatabase, role: &str, password: Option<&str>) {
    let password = password.map_or("NULL".to_owned(), |p| format!("'{p}'"));
    administer(
        db,
        format!(
            "DO $$ BEGIN CREATE ROLE {role} LOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             ALTER ROLE {role} LOGIN PASSWORD {password};
             GRANT CONNECT ON DATABASE \"{db}\" TO {role};
             GRANT CREATE, USAGE ON SCHEMA public TO {role};",
            db = db.name()
        ),
    )
    .await;
}

async fn session_is_encrypted(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("pg_stat_ssl")
}

/// Opens the store on `pool` and commits one enqueued message through it.
async fn open_and_enqueue(pool: PgPool) {
    let store = PgStore::open(pool.clone()).await.expect("store");
    let outbox = Outbox::new(Config::for_service("billing"), &store);
    let mut tx = pool.begin().await.expect("begin");
    outbox
        .enqueue_async(&mut tx, credit(1))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM outbox_messages").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_the_session_and_the_store_runs_over_it() {
    let Some((db, _ca)) = tls_database() else {
        return;
    };
    // The check tells the two apart.
    let plain = lazy_pool(&url_with(db.url(), None, None, "sslmode=disable"));
    assert!(!session_is_encrypted(&plain).await, "sslmode=disable");
    plain.close().await;

    let pool = lazy_pool(&url_with(db.url(), None, None, "sslmode=require"));
    assert!(session_is_encrypted(&pool).await, "sslmode=require");
    open_and_enqueue(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_accepts_the_servers_ca_for_its_names_and_refuses_another_ca() {
    let Some((db, ca)) = tls_database() else {
        return;
    };
    // The server's certificate names `localhost` and `127.0.0.1`.
    for host in ["localhost", "127.0.0.1"] {
        let query = format!("sslmode=verify-full&sslrootcert={ca}");
        let pool = lazy_pool(&url_with(db.url(), None, Some(host), &query));
        assert!(session_is_encrypted(&pool).await, "{host}");
        pool.close().await;
    }
    let pool = lazy_pool(&url_with(
        db.url(),
        None,
        Some("localhost"),
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    open_and_enqueue(pool).await;

    // A CA that did not sign the server's certificate.
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "another CA");
    let other = params.self_signed(&key).expect("another CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, other.pem()).expect("write the other CA");
    let url = url_with(
        db.url(),
        None,
        Some("localhost"),
        &format!("sslmode=verify-full&sslrootcert={}", other_ca.display()),
    );
    let error = PgStore::open(lazy_pool(&url))
        .await
        .expect_err("a certificate of an unknown CA");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Postgres { .. }), "{error:?}");
    assert!(text.contains(&target(&url)), "{text}");
    assert!(
        text.starts_with("PostgreSQL database at localhost:"),
        "{text}"
    );
    assert!(text.contains("cannot connect"), "{text}");
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_demands_tls_of_a_role_stops_a_plain_start_naming_the_host() {
    let Some((db, _ca)) = tls_database() else {
        return;
    };
    login_role(&db, "rfidl_tls_only", None).await;
    let url = url_with(db.url(), Some("rfidl_tls_only"), None, "sslmode=disable");
    let error = PgStore::open(lazy_pool(&url))
        .await
        .expect_err("refused without TLS");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Postgres { .. }), "{error:?}");
    assert!(text.contains(&target(&url)), "{text}");
    assert!(text.contains("cannot connect"), "{text}");
    assert!(text.contains("no encryption"), "{text}");

    // Over TLS the same role is let in.
    let url = url_with(db.url(), Some("rfidl_tls_only"), None, "sslmode=require");
    open_and_enqueue(lazy_pool(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_the_start_naming_the_target_and_never_the_password() {
    let Some((db, _ca)) = tls_database() else {
        return;
    };
    let password = format!("right-{:016x}", rand::random::<u64>());
    let wrong = format!("wrong-{:016x}", rand::random::<u64>());
    login_role(&db, "rfidl_password", Some(&password)).await;
    for sslmode in ["disable", "require"] {
        let url = url_with(
            db.url(),
            Some(&format!("rfidl_password:{wrong}")),
            None,
            &format!("sslmode={sslmode}"),
        );
        let error = PgStore::open(lazy_pool(&url))
            .await
            .expect_err("a wrong password");
        let text = error.to_string();
        assert!(matches!(error, StoreError::Postgres { .. }), "{error:?}");
        assert!(text.contains(&target(&url)), "{sslmode}: {text}");
        assert!(
            text.contains("password authentication failed"),
            "{sslmode}: {text}"
        );
        assert!(!text.contains(&wrong), "{sslmode}: {text}");
        assert!(!text.contains(&password), "{sslmode}: {text}");
        assert!(!format!("{error:?}").contains(&wrong), "{error:?}");
    }
    let url = url_with(
        db.url(),
        Some(&format!("rfidl_password:{password}")),
        None,
        "sslmode=disable",
    );
    open_and_enqueue(lazy_pool(&url)).await;
}

#[test]
fn url_with_replaces_the_user_host_and_query() {
    let url = "postgres://rfidl@127.0.0.1:5432/rfidl_test_1?x=1";
    assert_eq!(
        url_with(url, Some("a:b"), Some("localhost"), "sslmode=require"),
        "postgres://a:b@localhost:5432/rfidl_test_1?sslmode=require"
    );
    assert_eq!(
        url_with("postgres://h/db", None, None, "q=1"),
        "postgres://h/db?q=1"
    );
    assert_eq!(target(url), "127.0.0.1:5432/rfidl_test_1");
    assert_eq!(target("postgres://a:b@localhost:1/d?q"), "localhost:1/d");
}

/// A lifecycle command from the registry for `test.Ledger` v1.
async fn lifecycle_command(
    url: &str,
    secret: &Secret,
    endpoint: &str,
    generation: u64,
) -> (u16, serde_json::Value) {
    let id = uuid::Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&serde_json::json!({
        "messageId": id,
        "sourceServiceId": rfidl_runtime::lifecycle::DEFAULT_REGISTRY_SOURCE,
        "messageType": "Command",
        "interface": rfidl_runtime::lifecycle::INTERFACE,
        "version": rfidl_runtime::lifecycle::VERSION,
        "fingerprint": rfidl_runtime::lifecycle::FINGERPRINT,
        "endpoint": endpoint,
        "payload": {
            "interface": INTERFACE,
            "version": 1,
            "instanceId": "0123456789abcdef",
            "baseUrl": "http://billing.invalid",
            "generation": generation,
        },
    }))
    .expect("json");
    crate::support::post_signed(
        &reqwest::Client::new(),
        url,
        &body,
        &id,
        secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decommission_holds_a_versions_rows_on_the_sqlx_store_and_recommission_delivers_them_once()
{
    let Some(pair) = Pair::start().await else {
        return;
    };
    // The sender hosts the control interface on a receiver of its own store.
    let registry = Secret::generate();
    let set = pair.outbox.lifecycle().clone();
    set.bind_instance("0123456789abcdef");
    let control = Receiver::builder(
        Config::for_service("billing").with_peer(
            rfidl_runtime::lifecycle::DEFAULT_REGISTRY_SOURCE,
            registry.to_whsec(),
        ),
        &pair.sender,
    )
    .lifecycle(&set)
    .build()
    .expect("control receiver");
    let (control_url, control_server) = serve(control.router()).await;

    let (status, answer) = lifecycle_command(
        &control_url,
        &registry,
        rfidl_runtime::lifecycle::DECOMMISSION,
        1,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let pool = pair.sender.pool().clone();
    let held_before: i64 = count(&pool, "SELECT COUNT(*) FROM rf_decommissioned").await;
    assert_eq!(held_before, 1);
    // Messages of the decommissioned version wait, held, and are not sent.
    for amount in 0..3 {
        let mut tx = pool.begin().await.expect("begin");
        pair.outbox
            .enqueue_async(&mut tx, credit(amount))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = count(
            &pool,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Pending' \
             AND next_retry_at = 4611686018427387904",
        )
        .await;
        if held == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{held} of 3 rows held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        count(&pair.receiver_pool, "SELECT COUNT(*) FROM ledger").await,
        0
    );
    // A stale command is refused; the current one re-commissions.
    let (status, answer) = lifecycle_command(
        &control_url,
        &registry,
        rfidl_runtime::lifecycle::RECOMMISSION,
        1,
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("stale_command")),
        "{answer}"
    );
    let (status, answer) = lifecycle_command(
        &control_url,
        &registry,
        rfidl_runtime::lifecycle::RECOMMISSION,
        2,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    pair.outbox
        .send(credit(100))
        .await
        .expect("wakes the dispatcher");
    pair.wait_for_ledger_rows(4).await;
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM rf_decommissioned").await,
        0
    );
    control_server.abort();
    control.shutdown().await;
    pair.stop().await;
}
