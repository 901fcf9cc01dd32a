//! Decommissioning on the provider side (`rfidl_runtime::lifecycle`), on
//! every store: the registry's signed `Decommission` command, processed
//! through the inbox, holds the version's outbox rows (not sent, not
//! expired), its routes answer 410, `/_rf/health` shows it; `Recommission`
//! releases every held row, delivered exactly once. A command is bound to
//! its target: one for another instance is refused `wrong_target`, one
//! older than the state held `stale_command`, also after a restart. Real
//! databases, real HTTP on loopback.

use std::time::{Duration, Instant};

use rfidl_runtime::lifecycle::{self, HELD_DUE_MS};
use rfidl_runtime::outbox::Status;
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, post_signed, serve};

const TOKEN: &str = "ops-token";

/// The instance id the registry assigned the provider.
const INSTANCE: &str = "0123456789abcdef";

/// A lifecycle command envelope from `source` for `interface` v`version`,
/// addressed to `instance` at `generation`.
fn command(
    id: &str,
    source: &str,
    endpoint: &str,
    (interface, version): (&str, u32),
    instance: &str,
    generation: u64,
) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "messageId": id,
        "sourceServiceId": source,
        "messageType": "Command",
        "interface": lifecycle::INTERFACE,
        "version": lifecycle::VERSION,
        "fingerprint": lifecycle::FINGERPRINT,
        "endpoint": endpoint,
        "payload": {
            "interface": interface,
            "version": version,
            "instanceId": instance,
            "baseUrl": "http://provider.invalid",
            "generation": generation,
        },
    }))
    .expect("json")
}

/// Posts a fresh registry command and returns the answer.
async fn post_command(
    client: &reqwest::Client,
    url: &str,
    secret: &Secret,
    endpoint: &str,
    instance: &str,
    generation: u64,
) -> (u16, serde_json::Value) {
    let id = Uuid::now_v7().to_string();
    let body = command(
        &id,
        lifecycle::DEFAULT_REGISTRY_SOURCE,
        endpoint,
        (support::INTERFACE, 1),
        instance,
        generation,
    );
    post_signed(
        client,
        url,
        &body,
        &id,
        secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await
}

async fn get_health(client: &reqwest::Client, ops_url: &str) -> serde_json::Value {
    client
        .get(format!("{ops_url}/_rf/health"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("health")
        .json()
        .await
        .expect("health json")
}

/// Rows of test.Ledger v1 that are held (Pending, due never, saying why).
fn held_rows(store: &TestStore) -> i64 {
    store.count(&format!(
        "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Pending' \
         AND next_retry_at = {HELD_DUE_MS} \
         AND last_error = 'held: test.Ledger v1 is decommissioned'"
    ))
}

on_every_store!(
    decommission_holds_the_versions_rows_answers_410_and_recommission_delivers_each_once,
    decommission_and_recommission
);
async fn decommission_and_recommission(store: &TestStore) {
    let now = || Instant::now();
    let client = reqwest::Client::new();
    // The sink the provider's outbox sends test.Ledger v1 messages to.
    let sink_store = TestStore::sqlite();
    let to_sink = Secret::generate();
    let sink = sink_store
        .start_receiver(support::receiver_config(&[&to_sink]))
        .await;

    // The provider: an outbox, and a receiver hosting test.Ledger v1 and the
    // control interface, with secrets for `billing` and the registry.
    let registry_secret = Secret::generate();
    let billing_secret = Secret::generate();
    let mut config = sender_config(Duration::from_millis(50));
    config.peers = [
        (support::SOURCE.to_owned(), vec![billing_secret.to_whsec()]),
        (
            lifecycle::DEFAULT_REGISTRY_SOURCE.to_owned(),
            vec![registry_secret.to_whsec()],
        ),
    ]
    .into();
    let outbox = store.outbox(config.clone());
    let ledger = std::sync::Arc::new(support::Ledger::default());
    let lifecycle_set = outbox.lifecycle().clone();
    let provider = store
        .receiver_with_lifecycle(config.clone(), ledger, &lifecycle_set)
        .expect("provider receiver");
    let (provider_url, _provider_server) = serve(provider.router()).await;
    let ops = outbox
        .watched_by(store.diagnostics())
        .bearer_token(TOKEN)
        .build()
        .expect("diagnostics");
    let (ops_url, _ops_server) = serve(ops.router()).await;

    // Five messages wait before the command arrives.
    let mut ids: Vec<Uuid> = (0..5)
        .map(|i| {
            store.enqueue(
                &outbox,
                message("ledger", "Credit", json!({"account": "d", "amount": i})),
            )
        })
        .collect();

    // Only the registry may send lifecycle commands: a known peer is refused
    // for good (422 poison), an unknown source is 401; nothing changes.
    let id = Uuid::now_v7().to_string();
    let body = command(
        &id,
        support::SOURCE,
        lifecycle::DECOMMISSION,
        (support::INTERFACE, 1),
        INSTANCE,
        1,
    );
    let (status, answer) = post_signed(
        &client,
        &provider_url,
        &body,
        &id,
        &billing_secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("poison")),
        "{answer}"
    );
    let id = Uuid::now_v7().to_string();
    let body = command(
        &id,
        "intruder",
        lifecycle::DECOMMISSION,
        (support::INTERFACE, 1),
        INSTANCE,
        1,
    );
    let (status, answer) = post_signed(
        &client,
        &provider_url,
        &body,
        &id,
        &registry_secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("unknown_source")),
        "{answer}"
    );
    assert_eq!(held_rows(store), 0);

    // Before the instance knows its id (it registers at start-up), a
    // command cannot be checked: 500, the registry retries.
    let (status, answer) = post_command(
        &client,
        &provider_url,
        &registry_secret,
        lifecycle::DECOMMISSION,
        INSTANCE,
        1,
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (500, Some("handler_failed")),
        "{answer}"
    );
    assert_eq!(held_rows(store), 0);
    lifecycle_set.bind_instance(INSTANCE);

    // A command the registry addressed to another instance (a copy a fake
    // registered instance received) is refused for good: 422 wrong_target.
    let (status, answer) = post_command(
        &client,
        &provider_url,
        &registry_secret,
        lifecycle::DECOMMISSION,
        "fedcba9876543210",
        1,
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some(lifecycle::WRONG_TARGET)),
        "{answer}"
    );
    assert_eq!(held_rows(store), 0);

    // The registry's Decommission: the five rows are held in its transaction.
    let decommission_id = Uuid::now_v7().to_string();
    let decommission = command(
        &decommission_id,
        lifecycle::DEFAULT_REGISTRY_SOURCE,
        lifecycle::DECOMMISSION,
        (support::INTERFACE, 1),
        INSTANCE,
        1,
    );
    let (status, answer) = post_signed(
        &client,
        &provider_url,
        &decommission,
        &decommission_id,
        &registry_secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["payload"]["held"], 5, "{answer}");
    assert_eq!(held_rows(store), 5);
    assert_eq!(store.count("SELECT COUNT(*) FROM rf_decommissioned"), 1);

    // The dispatcher starts; three more messages are enqueued after the
    // command: claimed, then held too. None reaches the sink.
    let handle = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&sink.url, Duration::from_secs(2)).expect("client"),
            to_sink,
        )
        .start()
        .expect("dispatcher");
    for i in 5..8 {
        ids.push(store.enqueue(
            &outbox,
            message("ledger", "Credit", json!({"account": "d", "amount": i})),
        ));
    }
    let deadline = now() + Duration::from_secs(10);
    while held_rows(store) < 8 && now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held_rows(store), 8, "{}", store.name());
    assert_eq!(sink_store.count("SELECT COUNT(*) FROM ledger"), 0);
    assert_eq!(sink.receiver.metrics().inbox_processed.get(), 0);

    // The version's routes answer 410 version_decommissioned, Retry-After.
    let id = Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&support::envelope(
        &id,
        "Credit",
        json!({"account": "x", "amount": 1}),
    ))
    .expect("json");
    let headers = rfidl_runtime::signing::SignatureHeaders::sign(
        &id,
        rfidl_runtime::signing::unix_now(),
        &body,
        std::slice::from_ref(&billing_secret),
    );
    let mut request = client
        .post(format!("{provider_url}/_rf/receive"))
        .header("content-type", "application/json");
    for (name, value) in headers.to_pairs() {
        request = request.header(name, value);
    }
    let response = request.body(body).send().await.expect("send");
    assert_eq!(response.status().as_u16(), 410);
    assert_eq!(
        response.headers()["retry-after"].to_str().expect("ascii"),
        "30"
    );
    let refusal: serde_json::Value = response.json().await.expect("json");
    assert_eq!(refusal["error"], "version_decommissioned", "{refusal}");

    // A consumer's dispatcher that meets the 410 waits: the row stays
    // Pending, uncounted, and says why (not dead-lettered: nothing lost).
    let consumer_store = TestStore::sqlite();
    let consumer = consumer_store.outbox(sender_config(Duration::from_millis(50)));
    let consumer_dispatcher = consumer_store
        .dispatcher(&consumer)
        .route(
            "provider",
            HttpTransport::new(&provider_url, Duration::from_secs(2)).expect("client"),
            billing_secret.clone(),
        )
        .start()
        .expect("consumer dispatcher");
    let waiting = consumer_store.enqueue(
        &consumer,
        message("provider", "Credit", json!({"account": "c", "amount": 1})),
    );
    let deadline = now() + Duration::from_secs(10);
    let row = loop {
        let row = consumer_store.row(&waiting);
        if row.last_error.is_some() || now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(row.status, Status::Pending, "{row:?}");
    assert_eq!(row.retry_count, 0, "{row:?}");
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("410 version_decommissioned")),
        "{row:?}"
    );
    consumer_dispatcher.shutdown().await;

    // A restarted receiver (a fresh set) reads the state from the database.
    let restarted = lifecycle::Lifecycle::new();
    let again = store
        .receiver_with_lifecycle(
            config.clone(),
            std::sync::Arc::new(support::Ledger::default()),
            &restarted,
        )
        .expect("restarted receiver");
    assert!(restarted.is_decommissioned(support::INTERFACE, 1));
    again.shutdown().await;

    // Health lists the version and its held rows, and says why it warns.
    let health = get_health(&client, &ops_url).await;
    assert_eq!(
        health["decommissioned"][0]["interface"],
        support::INTERFACE,
        "{health}"
    );
    assert_eq!(health["decommissioned"][0]["version"], 1, "{health}");
    assert_eq!(health["decommissioned"][0]["held"], 8, "{health}");
    assert_eq!(health["status"], "warning", "{health}");

    // Past their TTL, held rows are not expired by the retention task.
    let ttl_passed = rfidl_runtime::store::now_ms() - 1;
    store.execute(&format!(
        "UPDATE outbox_messages SET expires_at = {ttl_passed}"
    ));
    // An expired inbox row tells when the pass (outbox first) is done.
    store.insert_inbox_rows("old", 1, ttl_passed);
    let metrics = std::sync::Arc::new(rfidl_runtime::metrics::Metrics::default());
    let retention = store.retention(config.clone(), metrics.clone());
    let deadline = now() + Duration::from_secs(10);
    while metrics.inbox_deleted.get() == 0 {
        assert!(now() < deadline, "{}: no clean-up pass", store.name());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    retention.shutdown().await;
    assert_eq!(
        store.count("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Expired'"),
        0
    );
    assert_eq!(held_rows(store), 8);
    // (Their TTL clock restarts: give them a live expiry again.)
    let live = rfidl_runtime::store::now_ms() + 60_000;
    store.execute(&format!("UPDATE outbox_messages SET expires_at = {live}"));

    // Recommission: every held row is delivered, each exactly once.
    let recommission_id = Uuid::now_v7().to_string();
    let body = command(
        &recommission_id,
        lifecycle::DEFAULT_REGISTRY_SOURCE,
        lifecycle::RECOMMISSION,
        (support::INTERFACE, 1),
        INSTANCE,
        2,
    );
    let (status, answer) = post_signed(
        &client,
        &provider_url,
        &body,
        &recommission_id,
        &registry_secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["payload"]["released"], 8, "{answer}");
    for id in &ids {
        store.wait_for(id, Status::Sent).await;
    }
    assert_eq!(sink_store.count("SELECT COUNT(*) FROM ledger"), 8);
    assert_eq!(
        sink_store.count("SELECT CAST(SUM(amount) AS BIGINT) FROM ledger"),
        (0..8).sum::<i64>()
    );
    assert_eq!(sink.receiver.metrics().inbox_duplicates.get(), 0);
    let health = get_health(&client, &ops_url).await;
    assert!(health.get("decommissioned").is_none(), "{health}");
    assert_eq!(store.count("SELECT COUNT(*) FROM rf_decommissioned"), 0);

    // The Decommission command sent again (a lost acknowledgement) is a
    // duplicate: answered from the inbox, not applied a second time.
    let (status, answer) = post_signed(
        &client,
        &provider_url,
        &decommission,
        &decommission_id,
        &registry_secret,
        rfidl_runtime::signing::unix_now(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["duplicate"], true, "{answer}");
    assert!(!outbox.lifecycle().is_decommissioned(support::INTERFACE, 1));
    assert_eq!(store.count("SELECT COUNT(*) FROM rf_decommissioned"), 0);

    // An older Decommission under a new message id (a late retry, a
    // replay) is refused: 422 stale_command; so is the other command at
    // the generation held. The version stays commissioned.
    for (endpoint, generation) in [(lifecycle::DECOMMISSION, 1), (lifecycle::DECOMMISSION, 2)] {
        let (status, answer) = post_command(
            &client,
            &provider_url,
            &registry_secret,
            endpoint,
            INSTANCE,
            generation,
        )
        .await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (422, Some(lifecycle::STALE_COMMAND)),
            "{endpoint} at {generation}: {answer}"
        );
    }
    assert!(!outbox.lifecycle().is_decommissioned(support::INTERFACE, 1));
    assert_eq!(store.count("SELECT COUNT(*) FROM rf_decommissioned"), 0);
    // The same command at the generation held is a no-op repeat.
    let (status, answer) = post_command(
        &client,
        &provider_url,
        &registry_secret,
        lifecycle::RECOMMISSION,
        INSTANCE,
        2,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["payload"]["released"], 0, "{answer}");

    // The generation held survives a restart: a restarted receiver (a
    // fresh set, bound again at registration) refuses the old command.
    assert_eq!(
        store.count(
            "SELECT generation FROM rf_lifecycle_applied \
             WHERE interface = 'test.Ledger' AND version = 1 AND command = 'Recommission'"
        ),
        2
    );
    let restarted = lifecycle::Lifecycle::new();
    restarted.bind_instance(INSTANCE);
    let again = store
        .receiver_with_lifecycle(
            config.clone(),
            std::sync::Arc::new(support::Ledger::default()),
            &restarted,
        )
        .expect("restarted receiver");
    let (again_url, _again_server) = serve(again.router()).await;
    let (status, answer) = post_command(
        &client,
        &again_url,
        &registry_secret,
        lifecycle::DECOMMISSION,
        INSTANCE,
        1,
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some(lifecycle::STALE_COMMAND)),
        "{answer}"
    );
    assert!(!restarted.is_decommissioned(support::INTERFACE, 1));
    // A newer one is applied.
    let (status, answer) = post_command(
        &client,
        &again_url,
        &registry_secret,
        lifecycle::DECOMMISSION,
        INSTANCE,
        3,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(restarted.is_decommissioned(support::INTERFACE, 1));

    handle.shutdown().await;
}
