//! The receiver over real HTTP on SQLite: the durability it defaults to,
//! signatures, and every step of the wire protocol's order of checks.
//! Exactly-once processing, rollback on handler failure, panics and batch
//! items run on every store in `exactly_once.rs` and `store_delivery.rs`.

use std::sync::atomic::Ordering;

use rfidl_runtime::signing::{Secret, unix_now};
use serde_json::json;

use crate::support::*;

fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[tokio::test]
async fn an_answered_effect_is_visible_from_a_fresh_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = start_receiver(dir.path(), receiver_config(&[&Secret::generate()])).await;
    let id = new_id();
    let body = serde_json::to_vec(&envelope(
        &id,
        "Credit",
        json!({"account": "a", "amount": 1}),
    ))
    .expect("json");
    let (status, _) = post_signed(
        &reqwest::Client::new(),
        &receiver.url,
        &body,
        &id,
        &receiver.secret,
        unix_now(),
    )
    .await;
    assert_eq!(status, 200);
    // Committed before the answer: another connection sees it at once.
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM inbox_messages"),
        1
    );
    let sync: i64 = rusqlite::Connection::open(&receiver.db)
        .and_then(|c| {
            rfidl_runtime::store::sqlite::configure(&c, rfidl_runtime::Durability::Full)?;
            c.query_row("PRAGMA synchronous", [], |r| r.get(0))
        })
        .expect("pragma");
    assert_eq!(sync, 2, "receivers default to synchronous=FULL");
}

#[tokio::test]
async fn signature_problems_are_401_and_write_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = Secret::generate();
    let new = Secret::generate();
    let receiver = start_receiver(dir.path(), receiver_config(&[&new, &old])).await;
    let client = reqwest::Client::new();
    let wrong = Secret::generate();
    let now = unix_now();
    // (case, body signed and sent, secret, timestamp, expected code). The
    // tolerance is 300 s; 310 leaves the receiver's clock 9 s to move on
    // before it reads its own (301 once failed on a loaded machine: the
    // receiver's second had turned, so `now + 301` was 300 s ahead).
    type Case = (&'static str, Secret, i64, &'static str);
    let cases: [Case; 3] = [
        ("wrong secret", wrong.clone(), now, "bad_signature"),
        (
            "stale timestamp",
            new.clone(),
            now - 310,
            "timestamp_out_of_range",
        ),
        (
            "future timestamp",
            new.clone(),
            now + 310,
            "timestamp_out_of_range",
        ),
    ];
    for (name, secret, ts, code) in cases {
        let id = new_id();
        let body = serde_json::to_vec(&envelope(
            &id,
            "Credit",
            json!({"account": "a", "amount": 1}),
        ))
        .expect("json");
        let (status, answer) = post_signed(&client, &receiver.url, &body, &id, &secret, ts).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (401, Some(code)),
            "{name}: {answer}"
        );
    }
    // Tampered body: signed one thing, sent another.
    let id = new_id();
    let signed = serde_json::to_vec(&envelope(
        &id,
        "Credit",
        json!({"account": "a", "amount": 1}),
    ))
    .expect("json");
    let sent = serde_json::to_vec(&envelope(
        &id,
        "Credit",
        json!({"account": "a", "amount": 1000}),
    ))
    .expect("json");
    let headers = rfidl_runtime::signing::SignatureHeaders::sign(
        &id,
        now,
        &signed,
        std::slice::from_ref(&new),
    );
    let mut request = client.post(format!("{}/_rf/receive", receiver.url));
    for (name, value) in headers.to_pairs() {
        request = request.header(name, value);
    }
    let response = request.body(sent).send().await.expect("send");
    assert_eq!(response.status(), 401);
    // Missing headers.
    let body = serde_json::to_vec(&envelope(
        &new_id(),
        "Credit",
        json!({"account": "a", "amount": 1}),
    ))
    .expect("json");
    let response = client
        .post(format!("{}/_rf/receive", receiver.url))
        .body(body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 401);
    let answer: serde_json::Value = response.json().await.expect("json");
    assert_eq!(answer["error"], "missing_header");
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM ledger"),
        0,
        "nothing written by refused requests"
    );
    assert_eq!(
        count(&receiver.db, "SELECT COUNT(*) FROM inbox_messages"),
        0
    );
    assert_eq!(
        receiver.ledger.calls.load(Ordering::SeqCst),
        0,
        "the handler never ran"
    );

    // Rotation: both the old and the new secret are accepted.
    for secret in [&old, &new] {
        let id = new_id();
        let body = serde_json::to_vec(&envelope(
            &id,
            "Credit",
            json!({"account": "r", "amount": 1}),
        ))
        .expect("json");
        let (status, _) = post_signed(&client, &receiver.url, &body, &id, secret, now).await;
        assert_eq!(status, 200);
    }
    assert_eq!(count(&receiver.db, "SELECT COUNT(*) FROM ledger"), 2);
}

#[tokio::test]
async fn every_step_of_the_order_of_checks_answers_its_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = start_receiver(dir.path(), receiver_config(&[&Secret::generate()])).await;
    let client = reqwest::Client::new();
    let now = unix_now();
    let url = &receiver.url;
    let secret = &receiver.secret;

    // 1. Too large (2 MiB against the 1 MiB default).
    let big = vec![b' '; 2 * 1024 * 1024];
    let response = client
        .post(format!("{url}/_rf/receive"))
        .body(big)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 413);
    assert_eq!(
        response.json::<serde_json::Value>().await.expect("json")["error"],
        "payload_too_large"
    );

    // 2. Not an object / no source.
    let (status, answer) = post_signed(&client, url, b"[1,2]", "x", secret, now).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("malformed_envelope"))
    );

    // 3. Unknown source.
    let id = new_id();
    let mut stranger = envelope(&id, "Credit", json!({"account": "a", "amount": 1}));
    stranger["sourceServiceId"] = json!("stranger");
    let body = serde_json::to_vec(&stranger).expect("json");
    let (status, answer) = post_signed(&client, url, &body, &id, secret, now).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("unknown_source"))
    );

    // 5. Envelope fields wrong; webhook-id differs from messageId.
    let id = new_id();
    let mut broken = envelope(&id, "Credit", json!({}));
    broken["version"] = json!("one");
    let body = serde_json::to_vec(&broken).expect("json");
    let (status, answer) = post_signed(&client, url, &body, &id, secret, now).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("malformed_envelope"))
    );
    let body = serde_json::to_vec(&envelope(&new_id(), "Credit", json!({}))).expect("json");
    let (status, answer) = post_signed(&client, url, &body, "another-id", secret, now).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("id_mismatch"))
    );

    // 6. Routing.
    for (field, value, code) in [
        ("interface", json!("test.Nope"), "unknown_interface"),
        ("version", json!(2), "unknown_version"),
        ("endpoint", json!("Debit"), "unknown_endpoint"),
    ] {
        let id = new_id();
        let mut message = envelope(&id, "Credit", json!({"account": "a", "amount": 1}));
        message[field] = value;
        let body = serde_json::to_vec(&message).expect("json");
        let (status, answer) = post_signed(&client, url, &body, &id, secret, now).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (404, Some(code)),
            "{field}"
        );
    }

    // 8. Payload that does not fit; poison.
    let id = new_id();
    let body = serde_json::to_vec(&envelope(&id, "Credit", json!({"account": "a"}))).expect("json");
    let (status, answer) = post_signed(&client, url, &body, &id, secret, now).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("payload_mismatch"))
    );
    let id = new_id();
    let body = serde_json::to_vec(&envelope(&id, "Poison", json!({}))).expect("json");
    let (status, answer) = post_signed(&client, url, &body, &id, secret, now).await;
    assert_eq!((status, answer["error"].as_str()), (422, Some("poison")));

    // 7. Same id, different payload.
    let id = new_id();
    let first = serde_json::to_vec(&envelope(
        &id,
        "Credit",
        json!({"account": "a", "amount": 1}),
    ))
    .expect("json");
    let second = serde_json::to_vec(&envelope(
        &id,
        "Credit",
        json!({"account": "a", "amount": 2}),
    ))
    .expect("json");
    assert_eq!(
        post_signed(&client, url, &first, &id, secret, now).await.0,
        200
    );
    let (status, answer) = post_signed(&client, url, &second, &id, secret, now).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("message_id_reused"))
    );

    // A different fingerprint of the same version is accepted and counted.
    let id = new_id();
    let mut revised = envelope(
        &id,
        "Credit",
        json!({"account": "f", "amount": 1, "note": "new optional member"}),
    );
    revised["fingerprint"] = json!("sha256:compatible-revision");
    let body = serde_json::to_vec(&revised).expect("json");
    assert_eq!(
        post_signed(&client, url, &body, &id, secret, now).await.0,
        200
    );
    assert_eq!(
        receiver
            .receiver
            .metrics()
            .inbox_fingerprint_mismatches
            .get(),
        1
    );

    // Framework errors are JSON too.
    let response = client
        .get(format!("{url}/_rf/nope"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(
        response.json::<serde_json::Value>().await.expect("json")["error"],
        "not_found"
    );
    let response = client
        .get(format!("{url}/_rf/receive"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 405);
    assert_eq!(
        response.json::<serde_json::Value>().await.expect("json")["error"],
        "method_not_allowed"
    );
    let metadata: serde_json::Value = client
        .get(format!("{url}/_rf/metadata"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(metadata["interfaces"][0]["interface"], INTERFACE);

    // Only the good credits wrote: the first of the reused id and the revision.
    assert_eq!(count(&receiver.db, "SELECT COUNT(*) FROM ledger"), 2);
}
