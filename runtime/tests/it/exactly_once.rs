//! Exactly-once processing: duplicates (concurrent and sequential), rollback
//! of failed and panicking handlers, and the writer surviving them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::receiver_fixture::{Fixture, Message, SOURCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_message_100_times_concurrently_then_sequentially_runs_once() {
    let fixture = Arc::new(Fixture::start().await);
    let message = Message::hired("Ada");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let fixture = Arc::clone(&fixture);
        let message = message.clone();
        tasks.spawn(async move { fixture.post(&message).await });
    }
    let mut replies = Vec::new();
    while let Some(reply) = tasks.join_next().await {
        replies.push(reply.expect("task"));
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_messages_at_once_are_group_committed_each_exactly_once() {
    let fixture = Arc::new(Fixture::start().await);
    let messages: Vec<Message> = (0..200).map(|i| Message::hired(&format!("n{i}"))).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for round in 0..2 {
        for message in &messages {
            let fixture = Arc::clone(&fixture);
            let message = message.clone();
            tasks.spawn(async move { (round, fixture.post(&message).await) });
        }
    }
    while let Some(done) = tasks.join_next().await {
        let (_, reply) = done.expect("task");
        reply.assert_acknowledged(reply.body["duplicate"] == true);
    }
    assert_eq!(fixture.count("employees"), 200);
    assert_eq!(fixture.count("inbox_messages"), 200);
    assert_eq!(fixture.metrics().inbox_processed.get(), 200);
}

#[tokio::test]
async fn a_failed_handler_rolls_back_and_the_retry_succeeds_once() {
    let fixture = Fixture::start().await;
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

#[tokio::test]
async fn a_panicking_handler_is_answered_500_and_the_writer_keeps_serving() {
    let fixture = Fixture::start().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_failing_message_in_a_group_rolls_back_alone() {
    let fixture = Arc::new(Fixture::start().await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..60 {
        let fixture = Arc::clone(&fixture);
        let name = match i % 3 {
            0 => format!("broken {i}"),
            1 => format!("panic {i}"),
            _ => format!("good {i}"),
        };
        tasks.spawn(async move { (i, fixture.post(&Message::hired(&name)).await) });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, reply) = done.expect("task");
        if i % 3 == 2 {
            reply.assert_acknowledged(false);
        } else {
            reply.assert_error(500, "handler_failed");
        }
    }
    assert_eq!(fixture.count("employees"), 20);
    assert_eq!(fixture.count("inbox_messages"), 20);
    let leaked: i64 = fixture
        .conn()
        .query_row(
            "SELECT count(*) FROM employees WHERE name NOT LIKE 'good %'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(leaked, 0);
}

#[tokio::test]
async fn shutdown_finishes_and_later_requests_are_retryable() {
    let fixture = Fixture::start().await;
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

#[tokio::test]
async fn inbox_rows_expire_after_the_retention() {
    let fixture = Fixture::start().await;
    let message = Message::hired("old");
    fixture.post(&message).await.assert_acknowledged(false);
    let conn = fixture.conn();
    let expires: i64 = conn
        .query_row(
            "SELECT expires_at - processed_at FROM inbox_messages WHERE source_service_id = ?1",
            [SOURCE],
            |r| r.get(0),
        )
        .expect("row");
    assert_eq!(expires, 25 * 3600 * 1000, "default retention 25 h");
    let now = rfidl_runtime::db::now_ms();
    assert_eq!(
        rfidl_runtime::inbox::delete_expired(&conn, now, 100).expect("delete"),
        0
    );
    assert_eq!(
        rfidl_runtime::inbox::delete_expired(&conn, now + expires + 1, 100).expect("delete"),
        1
    );
    // Once expired and deleted, the same message would be processed again:
    // this is why retention must exceed the sender's retry window.
    assert_eq!(fixture.count("inbox_messages"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_waits_too_long_is_told_in_progress_never_409() {
    let fixture = Arc::new(
        Fixture::start_with_config(|config| {
            config.inbox.in_progress_wait = std::time::Duration::from_millis(200);
        })
        .await,
    );
    let message = Message::hired("slow Sam");
    let first = {
        let fixture = Arc::clone(&fixture);
        let message = message.clone();
        tokio::spawn(async move { fixture.post(&message).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
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
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        retried = fixture.post(&message).await;
    }
    retried.assert_acknowledged(true);
    assert_eq!(retried.body["payload"]["welcomed"], "slow Sam");
    assert_eq!(fixture.handler_runs.load(Ordering::SeqCst), 1);
    assert_eq!(fixture.count("employees"), 1);
}
