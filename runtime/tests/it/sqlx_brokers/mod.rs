//! The broker consumers on the sqlx stores (sqlx PostgreSQL on the tests'
//! server, sqlx SQLite on files in a temp dir), over a real `nats-server`
//! JetStream and a real RabbitMQ node: commands sent through the broker
//! are handled once by an async handler whose write commits with the
//! inbox row; the same message published twice has one effect; a delivery
//! that never succeeds is recorded in the receiver's `rf_terminated`; the
//! answers come back to the sender's async response handler once, a copy
//! of one included; a consumer killed before its acknowledgement leaves
//! the message to the next, which answers it from the inbox.

mod setup;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::receiver::AsyncHostedService;
use rfidl_runtime::responses::AsyncResponseHandler;
use rfidl_runtime::signing::Secret;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::support;
use crate::support::nats::NatsServer;
use setup::{AsyncBalances, AsyncLedger, Broker, Counts, Pair, SqlxStore, wait_until};

/// Commands through `broker` between two databases of the store `S`:
/// handled once, answered once, a message published twice and a copy of
/// an answer without a second effect, a poison recorded.
async fn exactly_once<S: SqlxStore>(broker: Option<Broker>)
where
    AsyncLedger: AsyncHostedService<S>,
    AsyncBalances: AsyncResponseHandler<S>,
{
    let Some(broker) = broker else {
        return;
    };
    let Some(pair) = Pair::<S>::start(&broker).await else {
        return;
    };
    let consumer = broker.inbound(pair.receiver.clone());
    let messages = 30;
    pair.credits(0..messages).await;
    wait_until("every answer handled", Duration::from_secs(30), || async {
        pair.sender_count("SELECT COUNT(*) FROM answers").await == messages
    })
    .await;
    assert_eq!(
        pair.receiver_count("SELECT COUNT(*) FROM ledger").await,
        messages
    );
    assert_eq!(
        pair.receiver_count("SELECT COUNT(DISTINCT message_id) FROM ledger")
            .await,
        messages
    );
    // Each ledger row committed with its message's inbox row.
    assert_eq!(
        pair.receiver_count(
            "SELECT COUNT(*) FROM ledger l JOIN inbox_messages i ON i.message_id = l.message_id \
             WHERE i.response IS NOT NULL"
        )
        .await,
        messages
    );
    assert_eq!(
        pair.sender_count(
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent' AND answered_at IS NOT NULL"
        )
        .await,
        messages
    );
    // Each answer carries the receiver's response: the amount credited.
    assert_eq!(
        pair.sender_count(
            "SELECT COUNT(*) FROM answers a JOIN outbox_messages o ON o.message_id = a.message_id \
             WHERE a.balance IS NOT NULL"
        )
        .await,
        messages
    );

    // The same message published twice: one effect, the copy answered by
    // the inbox. A message for an endpoint the service does not host:
    // recorded in the receiver's `rf_terminated`, never redelivered.
    let id = Uuid::now_v7().to_string();
    let (headers, body) =
        crate::nats::signed(&id, "Credit", json!({ "amount": 1000 }), &pair.secret);
    broker.publish(&headers, &body, &id, 1).await;
    broker.publish(&headers, &body, &id, 2).await;
    let poison = Uuid::now_v7().to_string();
    let (headers, body) = crate::nats::signed(&poison, "Refund", json!({}), &pair.secret);
    broker.publish(&headers, &body, &poison, 1).await;
    let duplicates = || pair.receiver.metrics().inbox_duplicates.get();
    wait_until(
        "the copy answered and the poison recorded",
        Duration::from_secs(20),
        || async {
            duplicates() >= 1
                && pair
                    .receiver_count("SELECT COUNT(*) FROM rf_terminated")
                    .await
                    == 1
        },
    )
    .await;
    assert_eq!(
        pair.receiver_count(&format!(
            "SELECT COUNT(*) FROM ledger WHERE message_id = '{id}'"
        ))
        .await,
        1,
        "one effect of the message published twice"
    );
    assert_eq!(duplicates(), 1);
    assert_eq!(
        pair.receiver_count(&format!(
            "SELECT COUNT(*) FROM rf_terminated WHERE message_id = '{poison}' \
             AND error LIKE '404 unknown_endpoint%'"
        ))
        .await,
        1
    );

    // A copy of an answer already applied: acknowledged, not applied again.
    let first = S::text(&pair.sender, "SELECT MIN(message_id) FROM answers").await;
    broker.publish_answer(&first, -1, &pair.secret).await;
    broker.assert_drained().await;
    assert_eq!(
        pair.sender_count("SELECT COUNT(*) FROM answers").await,
        messages
    );
    assert_eq!(
        pair.sender_count("SELECT COUNT(*) FROM answers WHERE balance < 0")
            .await,
        0
    );
    assert_eq!(pair.counts.answers.load(Ordering::SeqCst), messages as u32);
    assert_eq!(
        pair.counts.credits.load(Ordering::SeqCst),
        messages as u32 + 1
    );
    pair.stop(consumer).await;
}

/// A consumer killed before its acknowledgement, inside the handler: the
/// receiver's writer commits the handler's write with the inbox row
/// anyway; the broker delivers the message again to the next consumer,
/// which answers it from the inbox: one effect, one answer.
async fn killed_before_ack<S: SqlxStore>(broker: Option<Broker>)
where
    AsyncLedger: AsyncHostedService<S>,
    AsyncBalances: AsyncResponseHandler<S>,
{
    let Some(broker) = broker else {
        return;
    };
    let Some(pair) = Pair::<S>::start(&broker).await else {
        return;
    };
    let consumer = broker.inbound(pair.receiver.clone());
    let slow = message("ledger", "Slow", json!({ "amount": 7 }));
    S::enqueue_all(&pair.sender, &pair.outbox, vec![slow]).await;
    wait_until("the handler running", Duration::from_secs(20), || async {
        pair.counts.credits.load(Ordering::SeqCst) == 1
    })
    .await;
    consumer.abort();
    pair.counts.gate.notify_one();
    wait_until(
        "the inbox row committed",
        Duration::from_secs(10),
        || async {
            pair.receiver_count("SELECT COUNT(*) FROM inbox_messages WHERE response IS NOT NULL")
                .await
                == 1
        },
    )
    .await;
    let consumer = broker.inbound(pair.receiver.clone());
    wait_until("the answer handled", Duration::from_secs(30), || async {
        pair.sender_count("SELECT COUNT(*) FROM answers WHERE balance = 7")
            .await
            == 1
    })
    .await;
    broker.assert_drained().await;
    assert_eq!(pair.receiver_count("SELECT COUNT(*) FROM ledger").await, 1);
    assert_eq!(
        pair.counts.credits.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    assert_eq!(
        pair.receiver.metrics().inbox_duplicates.get(),
        1,
        "the delivery after the kill was answered from the inbox"
    );
    assert_eq!(pair.counts.answers.load(Ordering::SeqCst), 1);
    assert_eq!(pair.sender_count("SELECT COUNT(*) FROM answers").await, 1);
    pair.stop(consumer).await;
}

/// Two `Host`s on databases of the store `S` over JetStream, the broker
/// consumers started from their configuration: each command handled once,
/// each answer handled once by the sender's async response handler.
async fn hosts_over_jetstream<S: SqlxStore>()
where
    AsyncLedger: AsyncHostedService<S>,
    AsyncBalances: AsyncResponseHandler<S>,
{
    let Some(server) = NatsServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(((sender, _sender_db), (receiving, _receiver_db))) = setup::databases::<S>(&dir).await
    else {
        return;
    };
    let url = server.url(crate::nats::SUBJECT);
    let secret = Secret::generate();
    let counts = Arc::new(Counts::default());
    let receiver =
        rfidl_runtime::Host::builder(support::receiver_config(&[&secret]), receiving.clone())
            .service(AsyncLedger(Arc::clone(&counts)))
            .jetstream(url.clone())
            .jetstream_ack_wait(Duration::from_secs(2))
            .listen("127.0.0.1:0")
            .await
            .expect("receiving host");
    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.request_timeout = Duration::from_secs(2);
    config.destinations.insert(
        "ledger".into(),
        DestinationConfig::new(url, secret.to_whsec()),
    );
    let sending = rfidl_runtime::Host::builder(config, sender.clone())
        .responses(AsyncBalances(Arc::clone(&counts)))
        .jetstream_ack_wait(Duration::from_secs(2));
    let outbox = sending.outbox().clone();
    let sending = sending.listen("127.0.0.1:0").await.expect("sending host");
    let messages = 20;
    let credits = (0..messages)
        .map(|amount| message("ledger", "Credit", json!({ "amount": amount })))
        .collect();
    S::enqueue_all(&sender, &outbox, credits).await;
    wait_until("every answer handled", Duration::from_secs(30), || async {
        S::count(&sender, "SELECT COUNT(*) FROM answers").await == messages
    })
    .await;
    assert_eq!(
        S::count(&receiving, "SELECT COUNT(*) FROM ledger").await,
        messages
    );
    assert_eq!(counts.credits.load(Ordering::SeqCst), messages as u32);
    assert_eq!(counts.answers.load(Ordering::SeqCst), messages as u32);
    sending.shutdown().await.expect("sender stops");
    receiver.shutdown().await.expect("receiver stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_postgres_hosts_start_their_jetstream_consumers() {
    hosts_over_jetstream::<sqlx::Postgres>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_sqlite_hosts_start_their_jetstream_consumers() {
    hosts_over_jetstream::<sqlx::Sqlite>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_postgres_over_jetstream_handles_once_and_answers_once() {
    exactly_once::<sqlx::Postgres>(Broker::nats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_sqlite_over_jetstream_handles_once_and_answers_once() {
    exactly_once::<sqlx::Sqlite>(Broker::nats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_postgres_over_amqp_handles_once_and_answers_once() {
    exactly_once::<sqlx::Postgres>(Broker::amqp()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_sqlite_over_amqp_handles_once_and_answers_once() {
    exactly_once::<sqlx::Sqlite>(Broker::amqp()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_postgres_jetstream_consumer_killed_before_its_ack_leaves_one_effect() {
    killed_before_ack::<sqlx::Postgres>(Broker::nats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_sqlite_jetstream_consumer_killed_before_its_ack_leaves_one_effect() {
    killed_before_ack::<sqlx::Sqlite>(Broker::nats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_postgres_amqp_consumer_killed_before_its_settlement_leaves_one_effect() {
    killed_before_ack::<sqlx::Postgres>(Broker::amqp()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_sqlite_amqp_consumer_killed_before_its_settlement_leaves_one_effect() {
    killed_before_ack::<sqlx::Sqlite>(Broker::amqp()).await;
}
