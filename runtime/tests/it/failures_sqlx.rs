//! Async failure handlers (`rfidl_runtime::failures::AsyncFailureHandler`)
//! on both sqlx stores, against the scripted receiver of `failures.rs`: a
//! refusal and a time to live that passes each run the handler once, on the
//! connection of the transaction that writes the status (on sqlx SQLite a
//! claim runs on a connection of its own, so the expiry is recorded apart
//! from it, on the pool); a handler that fails leaves no row and the
//! message still ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rfidl_runtime::failures::{AsyncFailureHandler, Failure};
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::HandlerError;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use rfidl_runtime::store::sqlx_sqlite::SqliteStore;
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{AsyncStore, BoxFuture, Dispatcher};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};
use uuid::Uuid;

use crate::failures::{COMPENSATIONS, CURSED, config, credit, scripted_receiver};
use crate::support::{self, postgres::database};

/// Writes a `compensations` row per failure; fails after writing it for
/// [`CURSED`].
struct AsyncCompensate(Arc<AtomicU32>);

impl AsyncCompensate {
    fn fail_if_cursed(&self, failure: &Failure<'_>) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        if failure.payload["account"].as_str() == Some(CURSED) {
            return Err(HandlerError::retryable("the compensation service is down"));
        }
        Ok(())
    }
}

/// The insert, in either dialect (`?N` or `$N`).
macro_rules! compensation {
    ($sql:literal, $failure:expr) => {
        sqlx::query($sql)
            .bind($failure.message_id.to_owned())
            .bind($failure.status.as_str())
            .bind($failure.endpoint.to_owned())
            .bind($failure.code().map(str::to_owned))
            .bind($failure.error.to_owned())
            .bind(i64::from($failure.retries))
            .bind($failure.payload["account"].as_str().map(str::to_owned))
    };
}

impl AsyncFailureHandler<sqlx::Sqlite> for AsyncCompensate {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle<'a>(
        &'a self,
        failure: &'a Failure<'a>,
        conn: &'a mut SqliteConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            compensation!(
                "INSERT INTO compensations VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                failure
            )
            .execute(&mut *conn)
            .await
            .map_err(HandlerError::retryable)?;
            tokio::task::yield_now().await;
            self.fail_if_cursed(failure)
        })
    }
}

impl AsyncFailureHandler<sqlx::Postgres> for AsyncCompensate {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle<'a>(
        &'a self,
        failure: &'a Failure<'a>,
        conn: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            compensation!(
                "INSERT INTO compensations VALUES ($1, $2, $3, $4, $5, $6, $7)",
                failure
            )
            .execute(&mut *conn)
            .await
            .map_err(HandlerError::retryable)?;
            tokio::task::yield_now().await;
            self.fail_if_cursed(failure)
        })
    }
}

/// What the story needs of a sqlx sender: enqueue in its own transaction,
/// read a text, run a statement.
trait Sender {
    async fn enqueue(&self, message: OutgoingMessage) -> Uuid;
    async fn text(&self, sql: String) -> Option<String>;
    async fn execute(&self, sql: &'static str);
}

struct OnSqlite(SqlitePool, Outbox<sqlx::Sqlite>);
struct OnPostgres(PgPool, Outbox<sqlx::Postgres>);

/// The same three statements on either pool.
macro_rules! sender_on {
    ($sender:ty) => {
        impl Sender for $sender {
            async fn enqueue(&self, message: OutgoingMessage) -> Uuid {
                let mut tx = self.0.begin().await.expect("begin");
                let id = self
                    .1
                    .enqueue_async(&mut tx, message)
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
                id
            }

            async fn text(&self, sql: String) -> Option<String> {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_optional(&self.0)
                    .await
                    .expect("query")
            }

            async fn execute(&self, sql: &'static str) {
                sqlx::query(sql).execute(&self.0).await.expect("execute");
            }
        }
    };
}
sender_on!(OnSqlite);
sender_on!(OnPostgres);

/// Waits until the row of `id` has `status`; returns its `last_error`.
async fn wait_for(sender: &impl Sender, id: &Uuid, status: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = sender
            .text(format!(
                "SELECT status FROM outbox_messages WHERE message_id = '{id}'"
            ))
            .await;
        if found.as_deref() == Some(status) {
            return sender
                .text(format!(
                    "SELECT last_error FROM outbox_messages WHERE message_id = '{id}'"
                ))
                .await;
        }
        assert!(Instant::now() < deadline, "{id}: {found:?}, not {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn story<S: AsyncStore>(sender: impl Sender, outbox: &Outbox<S>)
where
    AsyncCompensate: AsyncFailureHandler<S>,
{
    let (url, _server) = scripted_receiver().await;
    sender.execute(COMPENSATIONS).await;
    let refused = sender.enqueue(credit("a-refused", "refuse")).await;
    let mut late = credit("a-late", "ok");
    late.ttl = Some(Duration::from_millis(1));
    let expired = sender.enqueue(late).await;
    let cursed = sender.enqueue(credit(CURSED, "refuse")).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let calls = Arc::new(AtomicU32::new(0));
    let dispatcher = Dispatcher::builder(outbox)
        .route(
            "ledger",
            HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
            Secret::generate(),
        )
        .failures(AsyncCompensate(Arc::clone(&calls)))
        .start()
        .expect("dispatcher");
    let refused_error = wait_for(&sender, &refused, "DeadLetter").await;
    let expired_error = wait_for(&sender, &expired, "Expired").await;
    let cursed_error = wait_for(&sender, &cursed, "DeadLetter").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    dispatcher.shutdown().await;

    assert_eq!(calls.load(Ordering::SeqCst), 3, "once per transition");
    let row = |id: Uuid| {
        sender.text(format!(
            "SELECT status || '|' || COALESCE(code, '-') || '|' || account || '|' || error \
             FROM compensations WHERE message_id = '{id}'"
        ))
    };
    assert_eq!(
        row(refused).await.as_deref(),
        Some("DeadLetter|invalid_payload|a-refused|422 invalid_payload: no such account")
    );
    assert_eq!(
        row(expired).await.as_deref(),
        Some("Expired|-|a-late|time to live exceeded")
    );
    assert_eq!(
        row(cursed).await,
        None,
        "the failing handler's row rolled back"
    );
    assert_eq!(
        refused_error.as_deref(),
        Some("422 invalid_payload: no such account")
    );
    assert_eq!(expired_error.as_deref(), Some("time to live exceeded"));
    assert_eq!(
        cursed_error.as_deref(),
        Some(
            "422 invalid_payload: no such account; failure handler: handler failed: the compensation \
             service is down"
        )
    );
    assert_eq!(outbox.metrics().outbox_expired.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_failure_handlers_run_once_per_transition_on_sqlx_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("billing.db"))
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("pool");
    let store = SqliteStore::open(pool.clone()).await.expect("store");
    let outbox = Outbox::new(config(), &store);
    story(OnSqlite(pool, outbox.clone()), &outbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_failure_handlers_run_once_per_transition_on_sqlx_postgres() {
    let Some(db) = database() else {
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(db.url())
        .await
        .expect("pool");
    let store = PgStore::open(pool.clone()).await.expect("store");
    let outbox = Outbox::new(config(), &store);
    story(OnPostgres(pool, outbox.clone()), &outbox).await;
}
