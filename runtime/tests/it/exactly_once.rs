//! Exactly-once processing on every store (`on_every_store!`): duplicates
//! (concurrent and sequential), rollback of failed and panicking handlers,
//! the writer surviving them, shutdown, inbox expiry and the in-progress
//! answer. A real receiver hosting [`Employees`] on loopback, its inbox and
//! business rows in a SQLite file or a PostgreSQL database.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rfidl_runtime::Config;
use rfidl_runtime::metrics::Metrics;
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::{Secret, unix_now};

use crate::receiver_fixture::{Employees, Message, Reply, SOURCE, employees_receiver, sign};
use crate::stores::{TestStore, on_every_store};

/// A receiver hosting [`Employees`] on a test store, served on loopback.
struct StoreFixture<'s> {
    store: &'s TestStore,
    poster: Poster,
    receiver: Receiver,
    service_failures: Arc<AtomicU32>,
    handler_runs: Arc<AtomicU32>,
    server: tokio::task::JoinHandle<()>,
}

/// Posts signed messages to the fixture's receiver (from any task).
#[derive(Clone)]
struct Poster {
    base: String,
    secret: Secret,
    client: reqwest::Client,
}

impl Poster {
    /// Signs `message` with the peer's secret, now, and posts it.
    async fn post(&self, message: &Message) -> Reply {
        let body = message.body();
        let mut request = self
            .client
            .post(format!("{}/_rf/receive", self.base))
            .header("content-type", "application/json")
            .body(body.clone());
        for (name, value) in sign(&message.id.to_string(), unix_now(), &body, &self.secret) {
            request = request.header(name, value);
        }
        Reply::from(request.send().await.expect("send")).await
    }
}

/// Posts every message of `messages` at once (a task each); the replies
/// in the same order.
async fn post_all(poster: &Poster, messages: Vec<Message>) -> Vec<Reply> {
    let tasks: Vec<_> = messages
        .into_iter()
        .map(|message| {
            let poster = poster.clone();
            tokio::spawn(async move { poster.post(&message).await })
        })
        .collect();
    let mut replies = Vec::with_capacity(tasks.len());
    for task in tasks {
        replies.push(task.await.expect("post task"));
    }
    replies
}

impl Drop for StoreFixture<'_> {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl<'s> StoreFixture<'s> {
    async fn start(store: &'s TestStore) -> Self {
        Self::start_with_config(store, |_| {}).await
    }

    async fn start_with_config(store: &'s TestStore, configure: impl FnOnce(&mut Config)) -> Self {
        let employees = Employees::default();
        let service_failures = Arc::clone(&employees.failures_left);
        let handler_runs = Arc::clone(&employees.handler_runs);
        let (receiver, secret) = employees_receiver(store, configure, employees);
        let (base, server) = crate::support::serve(receiver.router()).await;
        Self {
            store,
            poster: Poster {
                base,
                secret,
                client: reqwest::Client::new(),
            },
            receiver,
            service_failures,
            handler_runs,
            server,
        }
    }

    async fn post(&self, message: &Message) -> Reply {
        self.poster.post(message).await
    }

    /// The committed rows of `table`.
    fn count(&self, table: &str) -> i64 {
        self.store.count(&format!("SELECT COUNT(*) FROM {table}"))
    }

    fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(self.receiver.metrics())
    }
}

on_every_store!(
    processes_a_signed_message_and_answers_only_after_its_commit,
    answers_after_commit
);
async fn answers_after_commit(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    let message = Message::hired("Ada");
    let reply = fixture.post(&message).await;
    reply.assert_acknowledged(false);
    assert_eq!(reply.body["payload"]["welcomed"], "Ada");
    assert_eq!(reply.body["payload"]["version"], 1);
    // A fresh connection sees both rows as soon as the answer arrived.
    let row = format!(
        "FROM inbox_messages WHERE source_service_id = '{SOURCE}' AND message_id = '{}'",
        message.id
    );
    assert_eq!(
        store.text(&format!("SELECT endpoint {row}")).as_deref(),
        Some("EmployeeHired"),
        "inbox row committed before the answer"
    );
    let response = store
        .text(&format!("SELECT response {row}"))
        .expect("a stored response");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&response).expect("json"),
        reply.body["payload"]
    );
    assert_eq!(fixture.count("employees"), 1);
    assert_eq!(fixture.metrics().inbox_processed.get(), 1);
}

on_every_store!(
    the_same_message_100_times_concurrently_then_sequentially_runs_once,
    hundred_copies
);
async fn hundred_copies(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    let message = Message::hired("Ada");
    let mut replies = post_all(&fixture.poster, vec![message.clone(); 100]).await;
    for _ in 0..100 {
        replies.push(fixture.post(&message).await);
    }
    let fresh = replies
        .iter()
        .filter(|r| r.status == 200 && r.body["duplicate"] == false)
        .count();
    assert_eq!(fresh, 1, "exactly one delivery processed the message");
    for reply in &replies {
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(reply.body["acknowledged"], true);
        assert_eq!(
            reply.body["payload"], replies[0].body["payload"],
            "every copy gets the same answer"
        );
    }
    assert_eq!(fixture.count("employees"), 1);
    assert_eq!(fixture.count("inbox_messages"), 1);
    assert_eq!(fixture.handler_runs.load(Ordering::SeqCst), 1);
    let metrics = fixture.metrics();
    assert_eq!(metrics.inbox_processed.get(), 1);
    assert_eq!(metrics.inbox_duplicates.get(), 199);
}

on_every_store!(
    many_messages_at_once_are_group_committed_each_exactly_once,
    many_at_once
);
async fn many_at_once(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    let messages: Vec<Message> = (0..200).map(|i| Message::hired(&format!("n{i}"))).collect();
    let twice = [messages.clone(), messages].concat();
    for reply in post_all(&fixture.poster, twice).await {
        reply.assert_acknowledged(reply.body["duplicate"] == true);
    }
    assert_eq!(fixture.count("employees"), 200);
    assert_eq!(fixture.count("inbox_messages"), 200);
    assert_eq!(fixture.metrics().inbox_processed.get(), 200);
}

on_every_store!(
    a_failed_handler_rolls_back_and_the_retry_succeeds_once,
    failed_handler
);
async fn failed_handler(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    fixture.service_failures.store(1, Ordering::SeqCst);
    let message = Message::hired("flaky Bob");
    let failed = fixture.post(&message).await;
    failed.assert_error(500, "handler_failed");
    assert_eq!(fixture.count("employees"), 0, "business row rolled back");
    assert_eq!(fixture.count("inbox_messages"), 0, "no inbox row");

    let retried = fixture.post(&message).await;
    retried.assert_acknowledged(false);
    let again = fixture.post(&message).await;
    again.assert_acknowledged(true);
    assert_eq!(again.body["payload"], retried.body["payload"]);
    assert_eq!(fixture.count("employees"), 1);
    assert_eq!(fixture.count("inbox_messages"), 1);
}

on_every_store!(
    a_panicking_handler_is_answered_500_and_the_writer_keeps_serving,
    panicking_handler
);
async fn panicking_handler(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    let panics = fixture.post(&Message::hired("panic now")).await;
    panics.assert_error(500, "handler_failed");
    assert!(
        panics.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("panicked")),
        "{:?}",
        panics.body
    );
    assert_eq!(fixture.count("employees"), 0);
    assert_eq!(fixture.count("inbox_messages"), 0);
    fixture
        .post(&Message::hired("after the panic"))
        .await
        .assert_acknowledged(false);
    assert_eq!(fixture.count("employees"), 1);
}

on_every_store!(
    one_failing_message_in_a_group_rolls_back_alone,
    one_failure_in_a_group
);
async fn one_failure_in_a_group(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    let messages = (0..60)
        .map(|i| match i % 3 {
            0 => Message::hired(&format!("broken {i}")),
            1 => Message::hired(&format!("panic {i}")),
            _ => Message::hired(&format!("good {i}")),
        })
        .collect();
    for (i, reply) in post_all(&fixture.poster, messages)
        .await
        .into_iter()
        .enumerate()
    {
        if i % 3 == 2 {
            reply.assert_acknowledged(false);
        } else {
            reply.assert_error(500, "handler_failed");
        }
    }
    assert_eq!(fixture.count("employees"), 20);
    assert_eq!(fixture.count("inbox_messages"), 20);
    assert_eq!(
        store.count("SELECT COUNT(*) FROM employees WHERE name NOT LIKE 'good %'"),
        0,
        "a failed handler's row leaked"
    );
}

on_every_store!(shutdown_finishes_and_later_requests_are_retryable, shutdown);
async fn shutdown(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    fixture
        .post(&Message::hired("before shutdown"))
        .await
        .assert_acknowledged(false);
    fixture.receiver.shutdown().await;
    let after = fixture.post(&Message::hired("after shutdown")).await;
    after.assert_error(503, "shutting_down");
    assert_eq!(after.retry_after.as_deref(), Some("1"));
    assert_eq!(fixture.count("inbox_messages"), 1);
}

on_every_store!(inbox_rows_expire_after_the_retention, inbox_expiry);
async fn inbox_expiry(store: &TestStore) {
    let fixture = StoreFixture::start(store).await;
    let message = Message::hired("old");
    fixture.post(&message).await.assert_acknowledged(false);
    let kept_for = store.count(&format!(
        "SELECT expires_at - processed_at FROM inbox_messages WHERE source_service_id = '{SOURCE}'"
    ));
    assert_eq!(kept_for, 25 * 3600 * 1000, "default retention 25 h");
    // A pass before the row expires keeps it.
    assert_eq!(retention_pass(store).await, 0);
    assert_eq!(fixture.count("inbox_messages"), 1);
    // Twenty-five hours later (moved back, not waited for), a pass deletes it.
    store.execute(&format!(
        "UPDATE inbox_messages SET processed_at = processed_at - {kept_for} - 1, \
         expires_at = expires_at - {kept_for} - 1"
    ));
    assert_eq!(retention_pass(store).await, 1);
    assert_eq!(fixture.count("inbox_messages"), 0);
    // Once expired and deleted, the same message is processed again: this
    // is why retention must exceed the sender's retry window.
    fixture.post(&message).await.assert_acknowledged(false);
    assert_eq!(fixture.count("employees"), 2);
}

/// One pass of the retention task on `store`; the inbox rows it deleted.
async fn retention_pass(store: &TestStore) -> u64 {
    let metrics = Arc::new(Metrics::default());
    let mut config = Config::default();
    config.cleanup_interval = Duration::from_secs(3600);
    // The task runs its first pass before it looks at the cancellation, and
    // `shutdown` waits for the pass in progress: exactly one pass.
    store.retention(config, metrics.clone()).shutdown().await;
    metrics.inbox_deleted.get()
}

on_every_store!(
    a_copy_that_waits_too_long_is_told_in_progress_never_409,
    in_progress
);
async fn in_progress(store: &TestStore) {
    let fixture = StoreFixture::start_with_config(store, |config| {
        config.inbox.in_progress_wait = Duration::from_millis(200);
    })
    .await;
    let message = Message::hired("slow Sam");
    let first = {
        let (poster, message) = (fixture.poster.clone(), message.clone());
        tokio::spawn(async move { poster.post(&message).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = fixture.post(&message).await;
    second.assert_error(503, "in_progress");
    assert_eq!(second.retry_after.as_deref(), Some("1"));
    let first = first.await.expect("task");
    first.assert_error(503, "in_progress");
    // The writer finishes and commits; the sender's retry is a duplicate
    // (retried like a dispatcher would, as long as it hears in_progress).
    let mut retried = fixture.post(&message).await;
    for _ in 0..20 {
        if retried.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        retried = fixture.post(&message).await;
    }
    retried.assert_acknowledged(true);
    assert_eq!(retried.body["payload"]["welcomed"], "slow Sam");
    assert_eq!(fixture.handler_runs.load(Ordering::SeqCst), 1);
    assert_eq!(fixture.count("employees"), 1);
}
