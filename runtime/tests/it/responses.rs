//! Acting on answers exactly once (`rfidl_runtime::responses`), on every
//! store: a real receiver on loopback answers `Credit` with the new balance;
//! the sender's response handler writes a row in the transaction that marks
//! the message `Sent`. A handler that fails rolls back with that status and
//! runs again on the next attempt (the receiver answers the duplicate from
//! its inbox).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rfidl_runtime::outbox::Status;
use rfidl_runtime::receiver::HandlerError;
use rfidl_runtime::responses::{Answer, AsyncResponseHandler, ResponseHandler};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{BoxFuture, Sqlite};
use serde_json::json;

use crate::dispatcher::{message, sender_config};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, receiver_config};

/// Records each answer's balance; fails the first `fail_first` times after
/// writing its row (which must then be rolled back).
struct Balances {
    fail_first: AtomicU32,
    calls: AtomicU32,
}

impl Balances {
    /// Counts the call; `Err` while the failure budget lasts.
    fn after_write(&self) -> Result<(), HandlerError> {
        if self
            .fail_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(HandlerError::retryable("the books are locked"));
        }
        Ok(())
    }
}

/// One shared [`Balances`], registered with the dispatcher.
struct Shared(Arc<Balances>);

impl ResponseHandler<Sqlite> for Shared {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle(
        &self,
        answer: &Answer<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        tx.execute(
            "INSERT INTO balances (message_id, correlation_id, balance) VALUES (?1, ?2, ?3)",
            rusqlite::params![
                answer.message_id,
                answer.correlation_id,
                answer.payload["balance"].as_i64()
            ],
        )?;
        self.0.after_write()
    }
}

// The same handler on both sqlx stores.
crate::stores::on_each_sqlx_store! {
impl AsyncResponseHandler<Db> for Shared {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle<'a>(
        &'a self,
        answer: &'a Answer<'a>,
        conn: &'a mut Conn,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.0.calls.fetch_add(1, Ordering::SeqCst);
            sqlx::query(
                "INSERT INTO balances (message_id, correlation_id, balance) VALUES ($1, $2, $3)",
            )
            .bind(answer.message_id)
            .bind(answer.correlation_id)
            .bind(answer.payload["balance"].as_i64())
            .execute(conn)
            .await
            .map_err(HandlerError::retryable)?;
            self.0.after_write()
        })
    }
}
}

on_every_store!(
    a_failing_answer_handler_rolls_back_and_acts_exactly_once_on_the_retry,
    answer_handler_exactly_once
);
async fn answer_handler_exactly_once(store: &TestStore) {
    let receiver_store = store.another();
    let secret = Secret::generate();
    let receiver = receiver_store
        .start_receiver(receiver_config(&[&secret]))
        .await;
    let outbox = store.outbox(sender_config(Duration::from_millis(20)));
    store.execute(
        "CREATE TABLE balances (message_id TEXT NOT NULL, correlation_id TEXT, balance BIGINT)",
    );
    let id = store.enqueue(
        &outbox,
        message("ledger", "Credit", json!({"account": "a-1", "amount": 42})),
    );
    let handler = Arc::new(Balances {
        fail_first: AtomicU32::new(1),
        calls: AtomicU32::new(0),
    });
    let dispatcher = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            secret.clone(),
        )
        .responses(Shared(handler.clone()))
        .start()
        .expect("dispatcher");

    let row = store.wait_for(&id, Status::Sent).await;
    dispatcher.shutdown().await;
    assert_eq!(row.response, Some(json!({"balance": 42})));
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        2,
        "failed once, then acted on the answer of the second attempt"
    );
    assert_eq!(
        store.count("SELECT COUNT(*) FROM balances"),
        1,
        "the failed attempt's row was rolled back"
    );
    assert_eq!(
        store.count("SELECT COUNT(*) FROM balances WHERE correlation_id = 'c-1' AND balance = 42"),
        1
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        1,
        "the receiver's effect happened once; the retry got the stored answer"
    );
    assert!(
        row.retry_count >= 1,
        "the failure scheduled a retry: {row:?}"
    );
    receiver.receiver.shutdown().await;
}
