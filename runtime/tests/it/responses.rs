//! Acting on answers exactly once (`rfidl_runtime::responses`): a real
//! receiver on loopback answers `Credit` with the new balance; the sender's
//! response handler writes a row in the transaction that marks the message
//! `Sent`. A handler that fails rolls back with that status and runs again
//! on the next attempt (the receiver answers the duplicate from its inbox).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, Status};
use rfidl_runtime::receiver::HandlerError;
use rfidl_runtime::responses::{Answer, ResponseHandler};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;

use crate::dispatcher::{enqueue, message, sender_config, wait_for};
use crate::support::{self, count, receiver_config, start_receiver};

/// Records each answer's balance; fails the first `fail_first` times after
/// writing its row (which must then be rolled back).
struct Balances {
    fail_first: AtomicU32,
    calls: AtomicU32,
}

impl ResponseHandler for Balances {
    fn interface(&self) -> (&'static str, u32) {
        (support::INTERFACE, 1)
    }

    fn handle(
        &self,
        answer: &Answer<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tx.execute(
            "INSERT INTO balances (message_id, correlation_id, balance) VALUES (?1, ?2, ?3)",
            rusqlite::params![
                answer.message_id,
                answer.correlation_id,
                answer.payload["balance"].as_i64()
            ],
        )?;
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

fn create_balances(db: &Path) {
    rfidl_runtime::db::open(db, rfidl_runtime::Durability::Normal)
        .expect("open")
        .execute_batch(
            "CREATE TABLE balances (message_id TEXT NOT NULL, correlation_id TEXT, balance INTEGER)",
        )
        .expect("table");
}

#[tokio::test]
async fn a_failing_answer_handler_rolls_back_and_acts_exactly_once_on_the_retry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = start_receiver(dir.path(), receiver_config(&[&secret])).await;
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    create_balances(&db);
    let id = enqueue(
        &outbox,
        &db,
        message("ledger", "Credit", json!({"account": "a-1", "amount": 42})),
    );
    let handler = std::sync::Arc::new(Balances {
        fail_first: AtomicU32::new(1),
        calls: AtomicU32::new(0),
    });
    struct Shared(std::sync::Arc<Balances>);
    impl ResponseHandler for Shared {
        fn interface(&self) -> (&'static str, u32) {
            self.0.interface()
        }
        fn handle(
            &self,
            answer: &Answer<'_>,
            tx: &rusqlite::Transaction<'_>,
        ) -> Result<(), HandlerError> {
            self.0.handle(answer, tx)
        }
    }
    let dispatcher = Dispatcher::builder(&outbox, &db)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            secret.clone(),
        )
        .responses(Shared(handler.clone()))
        .start()
        .expect("dispatcher");

    let row = wait_for(&db, &id, Status::Sent).await;
    dispatcher.shutdown().await;
    assert_eq!(row.response, Some(json!({"balance": 42})));
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        2,
        "failed once, then acted on the answer of the second attempt"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM balances"),
        1,
        "the failed attempt's row was rolled back"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM balances WHERE correlation_id = 'c-1' AND balance = 42"
        ),
        1
    );
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM ledger"),
        1,
        "the receiver's effect happened once; the retry got the stored answer"
    );
    assert!(
        row.retry_count >= 1,
        "the failure scheduled a retry: {row:?}"
    );
}
