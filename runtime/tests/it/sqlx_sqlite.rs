//! The async SQLite store on sqlx, on real files in a temp dir and real
//! HTTP on loopback: messages enqueued in the caller's own
//! `sqlx::Transaction` are sent if and only if it commits; async handlers
//! run in the receiver's transaction, exactly once; async response
//! handlers write in the transaction that marks a message `Sent`; a file of
//! a newer schema is refused untouched; durability the configuration asks
//! for and the pool does not give is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rfidl_runtime::config::{DestinationConfig, Durability};
use rfidl_runtime::outbox::{Outbox, OutboxError, OutgoingMessage};
use rfidl_runtime::receiver::{
    AsyncHostedService, HandlerError, HostedInterface, IncomingCall, Receiver,
};
use rfidl_runtime::responses::{Answer, AsyncResponseHandler};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::StoreError;
use rfidl_runtime::store::sqlx_sqlite::SqliteStore;
use rfidl_runtime::{BoxFuture, Config, Dispatcher, MessageType};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

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
}

pub(crate) struct LedgerService(pub(crate) Arc<Ledger>);

impl AsyncHostedService<sqlx::Sqlite> for LedgerService {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut SqliteConnection,
    ) -> BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            self.0.runs.fetch_add(1, Ordering::SeqCst);
            let amount = call.payload["amount"].as_i64().unwrap_or(0);
            sqlx::query("INSERT INTO ledger (message_id, amount) VALUES (?1, ?2)")
                .bind(call.message_id)
                .bind(amount)
                .execute(&mut *conn)
                .await
                .map_err(HandlerError::retryable)?;
            // Yields to the runtime mid-handler, as real handlers do.
            tokio::task::yield_now().await;
            match call.endpoint {
                "Refuse" => Err(HandlerError::poison("refused after writing")),
                _ => Ok(serde_json::json!({ "credited": amount })),
            }
        })
    }
}

fn credit(amount: i64) -> OutgoingMessage {
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

fn options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
}

async fn pool_with(options: SqliteConnectOptions) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("pool")
}

async fn pool(path: &Path) -> SqlitePool {
    pool_with(options(path)).await
}

async fn count(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Two services, each on a file of its own: `billing` sends, `ledger`
/// receives.
struct Pair {
    sender: SqliteStore,
    receiver_pool: SqlitePool,
    outbox: Outbox<sqlx::Sqlite>,
    ledger: Arc<Ledger>,
    receiver: Receiver,
    dispatcher: rfidl_runtime::dispatcher::DispatcherHandle,
    _server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// The receiving service's store, with its ledger table.
pub(crate) async fn ledger_store(path: &Path) -> (SqliteStore, SqlitePool) {
    let receiver_pool = pool(path).await;
    let receiving = SqliteStore::open(receiver_pool.clone())
        .await
        .expect("receiver store");
    sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(&receiver_pool)
        .await
        .expect("ledger table");
    (receiving, receiver_pool)
}

impl Pair {
    async fn start() -> Self {
        Self::start_with(|builder| builder).await
    }

    async fn start_with(
        dispatcher: impl FnOnce(
            rfidl_runtime::dispatcher::DispatcherBuilder<sqlx::Sqlite>,
        ) -> rfidl_runtime::dispatcher::DispatcherBuilder<sqlx::Sqlite>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sender = SqliteStore::open(pool(&dir.path().join("billing.db")).await)
            .await
            .expect("sender store");
        let (receiving, receiver_pool) = ledger_store(&dir.path().join("ledger.db")).await;
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
        let config = Config::for_service("billing")
            .with_destination("ledger", DestinationConfig::new(url, secret.to_whsec()));
        let outbox = Outbox::new(config, &sender);
        let dispatcher = dispatcher(Dispatcher::builder(&outbox))
            .start()
            .expect("dispatcher");
        Self {
            sender,
            receiver_pool,
            outbox,
            ledger,
            receiver,
            dispatcher,
            _server: server,
            _dir: dir,
        }
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

/// Waits until `sql` (one text column, or no row) gives `want`.
async fn wait_for(pool: &SqlitePool, sql: &'static str, bind: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Option<String> = sqlx::query_scalar(sql)
            .bind(bind)
            .fetch_optional(pool)
            .await
            .expect("query");
        if found.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: {found:?}, never {want} after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_sent_if_and_only_if_the_callers_sqlx_transaction_commits() {
    let pair = Pair::start().await;
    let pool = pair.sender.pool().clone();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
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
    let id = pair
        .outbox
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
    wait_for(
        &pool,
        "SELECT response FROM outbox_messages WHERE message_id = ?1 AND status = 'Sent'",
        &id.to_string(),
        r#"{"credited":2}"#,
    )
    .await;
    // The same file and schema as the blocking SQLite store.
    let conn = rfidl_runtime::store::sqlite::open(pair.sender.path(), Durability::Normal)
        .expect("the blocking store opens the file");
    let row = rfidl_runtime::store::sqlite::outbox_row(&conn, &id)
        .expect("row")
        .expect("found");
    assert_eq!(row.status, rfidl_runtime::outbox::Status::Sent);
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&pool)
        .await
        .expect("user_version");
    assert_eq!(
        version,
        rfidl_runtime::store::sqlite::MIGRATIONS.len() as i64
    );
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_from_concurrent_transactions_are_each_handled_exactly_once() {
    let pair = Pair::start().await;
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
    assert_eq!(pair.ledger.runs.load(Ordering::SeqCst), 200);
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_async_handler_leaves_no_effect_and_a_duplicate_does_not_run_it_again() {
    let pair = Pair::start().await;
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
    wait_for(
        &pool,
        "SELECT status FROM outbox_messages WHERE message_id = ?1",
        &id.to_string(),
        "DeadLetter",
    )
    .await;
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
    wait_for(
        &pool,
        "SELECT status FROM outbox_messages WHERE message_id = ?1",
        &id.to_string(),
        "Sent",
    )
    .await;
    let runs = pair.ledger.runs.load(Ordering::SeqCst);
    sqlx::query(
        "UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0, response = NULL \
         WHERE message_id = ?1 AND status = 'Sent'",
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
    wait_for(
        &pool,
        "SELECT response FROM outbox_messages WHERE message_id = ?1 AND status = 'Sent'",
        &id.to_string(),
        r#"{"credited":9}"#,
    )
    .await;
    assert_eq!(
        pair.ledger.runs.load(Ordering::SeqCst),
        runs + 1,
        "the duplicate did not run the handler (only `send`'s message did)"
    );
    pair.stop().await;
}

/// Records each answer in the sender's `answers` table, in the transaction
/// that marks the message `Sent`; refuses the first answer of amount 13.
#[derive(Default)]
struct Answers {
    refused_once: std::sync::atomic::AtomicBool,
}

struct AnswerBook(Arc<Answers>);

impl AsyncResponseHandler<sqlx::Sqlite> for AnswerBook {
    fn interface(&self) -> (&'static str, u32) {
        (INTERFACE, 1)
    }

    fn handle<'a>(
        &'a self,
        answer: &'a Answer<'a>,
        conn: &'a mut SqliteConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let credited = answer.payload["credited"].as_i64().unwrap_or(-1);
            sqlx::query("INSERT INTO answers (message_id, credited) VALUES (?1, ?2)")
                .bind(answer.message_id)
                .bind(credited)
                .execute(&mut *conn)
                .await
                .map_err(HandlerError::retryable)?;
            tokio::task::yield_now().await;
            if credited == 13 && !self.0.refused_once.swap(true, Ordering::SeqCst) {
                return Err(HandlerError::retryable("not yet"));
            }
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_response_handler_writes_in_the_transaction_that_marks_the_message_sent() {
    let answers = Arc::new(Answers::default());
    let book = AnswerBook(Arc::clone(&answers));
    let pair = Pair::start_with(move |builder| builder.responses(book)).await;
    let pool = pair.sender.pool().clone();
    sqlx::query("CREATE TABLE answers (message_id TEXT NOT NULL, credited INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .expect("answers table");
    let mut ids = Vec::new();
    for amount in [5, 13] {
        let mut tx = pool.begin().await.expect("begin");
        ids.push(
            pair.outbox
                .enqueue_async(&mut tx, credit(amount))
                .await
                .expect("enqueue"),
        );
        tx.commit().await.expect("commit");
    }
    for id in &ids {
        wait_for(
            &pool,
            "SELECT status FROM outbox_messages WHERE message_id = ?1",
            &id.to_string(),
            "Sent",
        )
        .await;
    }
    // One row per answer: the refused first try of 13 rolled back with its
    // `Sent`, and the copy sent again was answered from the inbox.
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT message_id, credited FROM answers ORDER BY credited")
            .fetch_all(&pool)
            .await
            .expect("answers");
    assert_eq!(
        rows,
        vec![(ids[0].to_string(), 5), (ids[1].to_string(), 13)],
        "one answer row per message"
    );
    assert!(answers.refused_once.load(Ordering::SeqCst));
    assert_eq!(
        pair.ledger.runs.load(Ordering::SeqCst),
        2,
        "the re-sent copy was a duplicate"
    );
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diagnostics_routes_list_and_retry_a_dead_letter_on_the_sqlx_store() {
    let pair = Pair::start().await;
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
        sqlx::query_scalar("SELECT retry_count FROM outbox_messages WHERE message_id = ?1")
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
    assert_eq!(ready["checks"]["database"], "ok", "{ready}");
    server.abort();
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_sqlx_sqlite_stores_deliver_exactly_once_and_serve_their_diagnostics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sending = SqliteStore::open(pool(&dir.path().join("billing.db")).await)
        .await
        .expect("sender store");
    let (receiving, receiver_pool) = ledger_store(&dir.path().join("ledger.db")).await;
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
    let stats: serde_json::Value = reqwest::get(format!("{}/_rf/outbox/stats", sender.url()))
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert!(stats.is_object(), "{stats}");
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
    assert!(
        Path::new(&format!("{}.dispatcher-lock", sending.path().display())).exists(),
        "the dispatcher took the file's dispatcher lock"
    );
}

/// A SQLite file whose schema is newer than this build's.
fn newer_file(dir: &Path) -> PathBuf {
    let path = dir.join("newer.db");
    let conn = rusqlite::Connection::open(&path).expect("create");
    conn.execute_batch(
        "CREATE TABLE outbox_messages (message_id TEXT PRIMARY KEY);
         PRAGMA user_version = 999;",
    )
    .expect("schema");
    drop(conn);
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_a_newer_schema_is_refused_at_open_and_left_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = newer_file(dir.path());
    let before = std::fs::read(&path).expect("read");
    let pool = pool(&path).await;
    let error = SqliteStore::open(pool.clone())
        .await
        .expect_err("a newer schema");
    assert!(
        matches!(error, StoreError::TooNew { found: 999, .. }),
        "{error:?}"
    );
    pool.close().await;
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "the file is byte-for-byte unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_database_is_refused_with_a_clear_error() {
    for url in ["sqlite::memory:", "sqlite://ignored.db?mode=memory"] {
        let pool = SqlitePool::connect(url).await.expect("pool");
        let error = SqliteStore::open(pool).await.expect_err("in memory");
        assert!(matches!(error, StoreError::SqlxSqlite { .. }), "{error:?}");
        assert!(error.to_string().contains("in-memory"), "{url}: {error}");
    }
    // However the options ask for it.
    let pool = pool_with(SqliteConnectOptions::new().in_memory(true)).await;
    let error = SqliteStore::open(pool).await.expect_err("in memory");
    assert!(error.to_string().contains("in-memory"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_durability_refuses_a_pool_whose_connections_commit_with_normal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("normal.db");
    let pool = pool_with(options(&path).synchronous(SqliteSynchronous::Normal)).await;
    let store = SqliteStore::open(pool.clone()).await.expect("store");

    // The enqueue, under `outbox.durability: full`, as on the blocking store.
    let mut config = Config::for_service("billing");
    config.outbox.durability = Durability::Full;
    let outbox = Outbox::new(config, &store);
    let mut tx = pool.begin().await.expect("begin");
    let error = outbox
        .enqueue_async(&mut tx, credit(1))
        .await
        .expect_err("not durable");
    assert!(
        matches!(error, OutboxError::NotDurable { found: "NORMAL" }),
        "{error:?}"
    );
    tx.rollback().await.expect("rollback");
    // `normal` (the outbox's default) takes it.
    let outbox = Outbox::new(Config::for_service("billing"), &store);
    let mut tx = pool.begin().await.expect("begin");
    outbox
        .enqueue_async(&mut tx, credit(1))
        .await
        .expect("enqueue under normal");
    tx.commit().await.expect("commit");

    // The receiver, under `inbox.durability: full` (the default).
    let error = Receiver::builder(Config::for_service("ledger"), &store)
        .service(LedgerService(Arc::default()))
        .build()
        .expect_err("the receiver does not start");
    assert!(error.to_string().contains("inbox.durability"), "{error}");
    let mut config = Config::for_service("ledger");
    config.inbox.durability = Durability::Normal;
    let receiver = Receiver::builder(config, &store)
        .service(LedgerService(Arc::default()))
        .build()
        .expect("a receiver under normal");
    receiver.shutdown().await;
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
    let pair = Pair::start().await;
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
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM rf_decommissioned").await,
        1
    );
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
