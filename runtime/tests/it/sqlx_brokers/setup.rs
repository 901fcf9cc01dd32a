//! What the tests of the broker consumers on the sqlx stores share: the
//! async handlers on both stores, each store's fresh database and
//! statements, each broker's consumers and hand-made publishes, and the
//! pair of services they run.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rfidl_runtime::BoxFuture;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{
    AsyncHostedService, HandlerError, HostedInterface, IncomingCall, Receiver,
};
use rfidl_runtime::responses::{Answer, AsyncResponseHandler};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::AsyncStore;
use rfidl_runtime::store::Location;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use rfidl_runtime::store::sqlx_sqlite::SqliteStore;
use serde_json::json;
use sqlx::AssertSqlSafe;

use crate::dispatcher::{message, sender_config};
use crate::support::amqp::RabbitNode;
use crate::support::nats::NatsServer;
use crate::support::postgres::{TestDatabase, database};
use crate::support::{self, INTERFACE, SOURCE};

pub(super) const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: INTERFACE,
    version: 1,
    fingerprint: support::FINGERPRINT,
    endpoints: &["Credit", "Slow"],
    manifest_json: r#"{"interface":"test.Ledger","version":1}"#,
}];

/// What the handlers did: ledger handler runs, response handler runs, and
/// the gate a `Slow` credit waits at.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) credits: AtomicU32,
    pub(super) answers: AtomicU32,
    pub(super) gate: tokio::sync::Notify,
}

/// Credits a ledger row through the receiver's connection and answers the
/// amount as the balance; `Slow` waits at the gate after writing.
pub(super) struct AsyncLedger(pub(super) Arc<Counts>);

/// Writes each answer's balance through the sender's connection, in the
/// transaction that sets the row's answer marker.
pub(super) struct AsyncBalances(pub(super) Arc<Counts>);

/// The handlers on one sqlx store: `$conn` its connection, `$insert_*` the
/// statements in its dialect.
macro_rules! handlers_on {
    ($store:ty, $conn:ty, $insert_ledger:literal, $insert_answer:literal) => {
        impl AsyncHostedService<$store> for AsyncLedger {
            fn interfaces(&self) -> &[HostedInterface] {
                HOSTED
            }

            fn handle<'a>(
                &'a self,
                call: &'a IncomingCall<'a>,
                conn: &'a mut $conn,
            ) -> BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
                Box::pin(async move {
                    self.0.credits.fetch_add(1, Ordering::SeqCst);
                    let amount = call.payload["amount"].as_i64().unwrap_or(0);
                    sqlx::query($insert_ledger)
                        .bind(call.message_id)
                        .bind(amount)
                        .execute(&mut *conn)
                        .await
                        .map_err(HandlerError::retryable)?;
                    if call.endpoint == "Slow" {
                        self.0.gate.notified().await;
                    }
                    Ok(json!({ "balance": amount }))
                })
            }
        }

        impl AsyncResponseHandler<$store> for AsyncBalances {
            fn interface(&self) -> (&'static str, u32) {
                (INTERFACE, 1)
            }

            fn handle<'a>(
                &'a self,
                answer: &'a Answer<'a>,
                conn: &'a mut $conn,
            ) -> BoxFuture<'a, Result<(), HandlerError>> {
                Box::pin(async move {
                    self.0.answers.fetch_add(1, Ordering::SeqCst);
                    sqlx::query($insert_answer)
                        .bind(answer.message_id)
                        .bind(answer.payload["balance"].as_i64())
                        .execute(&mut *conn)
                        .await
                        .map_err(HandlerError::retryable)?;
                    Ok(())
                })
            }
        }
    };
}

handlers_on!(
    sqlx::Postgres,
    sqlx::PgConnection,
    "INSERT INTO ledger (message_id, amount) VALUES ($1, $2)",
    "INSERT INTO answers (message_id, balance) VALUES ($1, $2)"
);
handlers_on!(
    sqlx::Sqlite,
    sqlx::SqliteConnection,
    "INSERT INTO ledger (message_id, amount) VALUES (?1, ?2)",
    "INSERT INTO answers (message_id, balance) VALUES (?1, ?2)"
);

/// A sqlx store as these tests use it: a fresh database, statements on its
/// pool, and the enqueue in a transaction of the pool.
pub(super) trait SqlxStore: AsyncStore
where
    AsyncLedger: AsyncHostedService<Self>,
    AsyncBalances: AsyncResponseHandler<Self>,
{
    /// `PgStore` or `SqliteStore`.
    type Opened: Clone + Location<Store = Self>;
    /// What keeps the database (a PostgreSQL database is dropped with it).
    type Keep;

    /// A fresh database named `name` (in `dir` for SQLite), migrated, or
    /// `None` when the test's server is missing.
    async fn fresh(dir: &Path, name: &str) -> Option<(Self::Opened, Self::Keep)>;

    async fn execute(store: &Self::Opened, sql: &str);

    async fn count(store: &Self::Opened, sql: &str) -> i64;

    async fn text(store: &Self::Opened, sql: &str) -> String;

    /// Enqueues `messages` in one transaction of the store's pool.
    async fn enqueue_all(
        store: &Self::Opened,
        outbox: &Outbox<Self>,
        messages: Vec<OutgoingMessage>,
    );
}

/// The statements of [`SqlxStore`] on the store's pool: the same text on
/// both stores.
macro_rules! on_the_pool {
    () => {
        async fn execute(store: &Self::Opened, sql: &str) {
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(store.pool())
                .await
                .expect("statement");
        }

        async fn count(store: &Self::Opened, sql: &str) -> i64 {
            sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
                .fetch_one(store.pool())
                .await
                .expect("count")
        }

        async fn text(store: &Self::Opened, sql: &str) -> String {
            sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
                .fetch_one(store.pool())
                .await
                .expect("text")
        }

        async fn enqueue_all(
            store: &Self::Opened,
            outbox: &Outbox<Self>,
            messages: Vec<OutgoingMessage>,
        ) {
            let mut tx = store.pool().begin().await.expect("begin");
            for message in messages {
                outbox
                    .enqueue_async(&mut tx, message)
                    .await
                    .expect("enqueue");
            }
            tx.commit().await.expect("commit");
        }
    };
}

impl SqlxStore for sqlx::Postgres {
    type Opened = PgStore;
    type Keep = TestDatabase;

    async fn fresh(_: &Path, _: &str) -> Option<(PgStore, TestDatabase)> {
        let db = database()?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(12)
            .connect(db.url())
            .await
            .expect("pool");
        Some((PgStore::open(pool).await.expect("store"), db))
    }

    on_the_pool!();
}

impl SqlxStore for sqlx::Sqlite {
    type Opened = SqliteStore;
    type Keep = ();

    async fn fresh(dir: &Path, name: &str) -> Option<(SqliteStore, ())> {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.join(format!("{name}.db")))
            .create_if_missing(true);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("pool");
        Some((SqliteStore::open(pool).await.expect("store"), ()))
    }

    on_the_pool!();
}

/// The broker of a test: a `nats-server` or a RabbitMQ node of its own.
pub(super) enum Broker {
    Nats(NatsServer),
    Amqp(RabbitNode),
}

/// An inbound consumer, of either broker.
pub(super) enum Inbound {
    Nats(rfidl_runtime::nats::ConsumerHandle),
    Amqp(rfidl_runtime::amqp::AmqpConsumerHandle),
}

impl Inbound {
    pub(super) async fn shutdown(self) {
        match self {
            Inbound::Nats(consumer) => consumer.shutdown().await,
            Inbound::Amqp(consumer) => consumer.shutdown().await,
        }
    }

    pub(super) fn abort(self) {
        match self {
            Inbound::Nats(consumer) => consumer.abort(),
            Inbound::Amqp(consumer) => consumer.abort(),
        }
    }
}

/// An answers consumer, of either broker.
pub(super) enum Answers {
    Nats(rfidl_runtime::nats::AnswersHandle),
    Amqp(rfidl_runtime::amqp::AmqpAnswersHandle),
}

impl Answers {
    pub(super) async fn shutdown(self) {
        match self {
            Answers::Nats(answers) => answers.shutdown().await,
            Answers::Amqp(answers) => answers.shutdown().await,
        }
    }
}

/// The inbound queue (AMQP) and its answers queue.
pub(super) const QUEUE: &str = "ledger";

impl Broker {
    pub(super) fn nats() -> Option<Self> {
        NatsServer::start().map(Broker::Nats)
    }

    pub(super) fn amqp() -> Option<Self> {
        RabbitNode::start().map(Broker::Amqp)
    }

    /// The destination's URL.
    pub(super) fn url(&self) -> String {
        match self {
            Broker::Nats(server) => server.url(crate::nats::SUBJECT),
            Broker::Amqp(node) => node.url(QUEUE),
        }
    }

    pub(super) fn inbound(&self, receiver: Receiver) -> Inbound {
        match self {
            Broker::Nats(_) => Inbound::Nats(
                rfidl_runtime::nats::JetStreamConsumer::builder(receiver, &self.url())
                    .durable("ledger")
                    .ack_wait(Duration::from_secs(2))
                    .timeout(Duration::from_secs(2))
                    .spawn()
                    .expect("consumer"),
            ),
            Broker::Amqp(_) => Inbound::Amqp(
                rfidl_runtime::amqp::AmqpConsumer::builder(receiver, &self.url())
                    .timeout(Duration::from_secs(2))
                    .spawn()
                    .expect("consumer"),
            ),
        }
    }

    pub(super) fn answers<S: SqlxStore>(
        &self,
        store: &S::Opened,
        secret: &Secret,
        counts: &Arc<Counts>,
    ) -> Answers
    where
        AsyncLedger: AsyncHostedService<S>,
        AsyncBalances: AsyncResponseHandler<S>,
    {
        let handler = AsyncBalances(Arc::clone(counts));
        match self {
            Broker::Nats(_) => Answers::Nats(
                rfidl_runtime::nats::AnswersConsumer::builder(SOURCE, &self.url(), store.clone())
                    .responses(handler)
                    .secret(secret.clone())
                    .ack_wait(Duration::from_secs(2))
                    .timeout(Duration::from_secs(2))
                    .spawn()
                    .expect("answers consumer"),
            ),
            Broker::Amqp(_) => Answers::Amqp(
                rfidl_runtime::amqp::AmqpAnswersConsumer::builder(
                    SOURCE,
                    &self.url(),
                    store.clone(),
                )
                .responses(handler)
                .secret(secret.clone())
                .backoff(Duration::from_millis(20), Duration::from_millis(100))
                .timeout(Duration::from_secs(2))
                .spawn()
                .expect("answers consumer"),
            ),
        }
    }

    /// Publishes an inbound message by hand, `copy` telling the broker's
    /// de-duplication apart (the envelope's id stays the same).
    pub(super) async fn publish(
        &self,
        headers: &[(&str, String)],
        body: &[u8],
        id: &str,
        copy: u32,
    ) {
        match self {
            Broker::Nats(server) => {
                let context = crate::nats::jetstream(server).await;
                crate::nats::publish_raw(&context, headers, body, &format!("{id}-{copy}")).await;
            }
            Broker::Amqp(_) => {
                crate::amqp::send_raw(&self.url(), "/queue/ledger", headers, body, id).await;
            }
        }
    }

    /// Publishes a copy of the answer to `id`, signed with `secret`.
    pub(super) async fn publish_answer(&self, id: &str, balance: i64, secret: &Secret) {
        let copy = serde_json::to_vec(&json!({"messageId": id, "status": 200,
            "body": {"acknowledged": true, "duplicate": true, "payload": {"balance": balance}}}))
        .expect("json");
        let headers = rfidl_runtime::signing::SignatureHeaders::sign(
            &format!("answer-{id}"),
            rfidl_runtime::signing::unix_now(),
            &copy,
            std::slice::from_ref(secret),
        )
        .to_pairs()
        .to_vec();
        match self {
            Broker::Nats(server) => {
                let context = crate::nats::jetstream(server).await;
                let mut map = async_nats::HeaderMap::new();
                for (name, value) in &headers {
                    map.insert(*name, value.as_str());
                }
                map.insert(async_nats::header::NATS_MESSAGE_ID, "answer-again");
                let subject = format!("{}.answers.{SOURCE}", crate::nats::SUBJECT);
                context
                    .publish_with_headers(subject, map, copy.into())
                    .await
                    .expect("publish")
                    .await
                    .expect("ack");
            }
            Broker::Amqp(_) => {
                let address = format!("/queue/{QUEUE}.answers.{SOURCE}");
                crate::amqp::send_raw(
                    &self.url(),
                    &address,
                    &headers,
                    &copy,
                    &format!("answer-{id}"),
                )
                .await;
            }
        }
    }

    /// Waits until the inbound and answers consumers have nothing left
    /// unacknowledged; fails saying what is left.
    pub(super) async fn assert_drained(&self) {
        match self {
            Broker::Nats(server) => {
                assert_eq!(crate::nats::drained(server, "ledger").await, (0, 0));
                let answers = format!("rfidl-answers-{SOURCE}");
                assert_eq!(crate::nats::drained(server, &answers).await, (0, 0));
            }
            Broker::Amqp(node) => {
                assert_eq!(crate::amqp::drained(node, QUEUE).await, Some((0, 0)));
                let answers = format!("{QUEUE}.answers.{SOURCE}");
                assert_eq!(crate::amqp::drained(node, &answers).await, Some((0, 0)));
            }
        }
    }
}

/// Polls `done` every 20 ms until it holds, failing after `limit`.
pub(super) async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> F,
) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sender and a receiver, each on a database of its own of the store
/// `S`: the sender's dispatcher and answers consumer on `broker`, the
/// receiver (its consumer started by the test).
pub(super) struct Pair<S: SqlxStore>
where
    AsyncLedger: AsyncHostedService<S>,
    AsyncBalances: AsyncResponseHandler<S>,
{
    pub(super) sender: S::Opened,
    pub(super) receiving: S::Opened,
    pub(super) outbox: Outbox<S>,
    pub(super) secret: Secret,
    pub(super) counts: Arc<Counts>,
    pub(super) receiver: Receiver,
    pub(super) answers: Answers,
    pub(super) dispatcher: rfidl_runtime::dispatcher::DispatcherHandle,
    pub(super) _keep: (S::Keep, S::Keep, tempfile::TempDir),
}

impl<S: SqlxStore> Pair<S>
where
    AsyncLedger: AsyncHostedService<S>,
    AsyncBalances: AsyncResponseHandler<S>,
{
    pub(super) async fn start(broker: &Broker) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let ((sender, sender_keep), (receiving, receiver_keep)) = databases::<S>(&dir).await?;
        let secret = Secret::generate();
        let mut config = sender_config(Duration::from_millis(50));
        config.outbox.request_timeout = Duration::from_secs(2);
        config.destinations.insert(
            "ledger".into(),
            DestinationConfig::new(broker.url(), secret.to_whsec()),
        );
        let outbox = Outbox::new(config, sender.clone());
        let counts = Arc::new(Counts::default());
        let receiver = Receiver::builder(support::receiver_config(&[&secret]), receiving.clone())
            .service(AsyncLedger(Arc::clone(&counts)))
            .build()
            .expect("receiver");
        let answers = broker.answers::<S>(&sender, &secret, &counts);
        let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
        Some(Self {
            sender,
            receiving,
            outbox,
            secret,
            counts,
            receiver,
            answers,
            dispatcher,
            _keep: (sender_keep, receiver_keep, dir),
        })
    }

    /// Stops the parts, `consumer` (the receiver's) before the receiver.
    pub(super) async fn stop(self, consumer: Inbound) {
        self.dispatcher.shutdown().await;
        self.answers.shutdown().await;
        consumer.shutdown().await;
        self.receiver.shutdown().await;
    }

    pub(super) async fn credits(&self, amounts: std::ops::Range<i64>) {
        let messages = amounts
            .map(|amount| message("ledger", "Credit", json!({ "amount": amount })))
            .collect();
        S::enqueue_all(&self.sender, &self.outbox, messages).await;
    }

    pub(super) async fn sender_count(&self, sql: &str) -> i64 {
        S::count(&self.sender, sql).await
    }

    pub(super) async fn receiver_count(&self, sql: &str) -> i64 {
        S::count(&self.receiving, sql).await
    }
}

/// The sender's and the receiver's databases (in `dir` for SQLite), with
/// the answers and the ledger table; `None` without the test's server.
pub(super) async fn databases<S: SqlxStore>(
    dir: &tempfile::TempDir,
) -> Option<((S::Opened, S::Keep), (S::Opened, S::Keep))>
where
    AsyncLedger: AsyncHostedService<S>,
    AsyncBalances: AsyncResponseHandler<S>,
{
    let sender = S::fresh(dir.path(), "billing").await?;
    let receiving = S::fresh(dir.path(), "ledger").await?;
    S::execute(
        &receiving.0,
        "CREATE TABLE ledger (message_id TEXT NOT NULL, amount BIGINT NOT NULL)",
    )
    .await;
    S::execute(
        &sender.0,
        "CREATE TABLE answers (message_id TEXT PRIMARY KEY, balance BIGINT)",
    )
    .await;
    Some((sender, receiving))
}
