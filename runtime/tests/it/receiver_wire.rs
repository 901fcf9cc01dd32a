//! The receiver's order of checks and codes (`wire-protocol.md`), signatures,
//! framework errors as JSON, metadata, fingerprint mismatches and batches,
//! against a real server and a real SQLite file. (That an answer comes only
//! after its commit runs on every store in `exactly_once.rs`.)

use rfidl_runtime::signing::unix_now;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Headers = Vec<(&'static str, String)>;

use crate::receiver_fixture::{FINGERPRINT_V1, Fixture, INTERFACE, Message, SOURCE, sign};

#[tokio::test]
async fn hosts_v1_and_v2_side_by_side() {
    let fixture = Fixture::start().await;
    let mut v2 = Message::hired("Grace");
    v2.version = 2;
    v2.fingerprint = crate::receiver_fixture::FINGERPRINT_V2.to_owned();
    fixture.post(&v2).await.assert_acknowledged(false);
    let v1 = fixture.post(&Message::hired("Ada")).await;
    v1.assert_acknowledged(false);
    assert_eq!(v1.body["payload"]["version"], 1);
    let versions: Vec<i64> = fixture
        .conn()
        .prepare("SELECT version FROM employees ORDER BY row")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(versions, vec![2, 1]);
    // v2 does not host EmployeeLeft.
    let mut left = Message::hired("x");
    left.version = 2;
    left.endpoint = "EmployeeLeft".to_owned();
    left.payload = serde_json::json!({"id": "e-Grace"});
    fixture
        .post(&left)
        .await
        .assert_error(404, "unknown_endpoint");
}

#[tokio::test]
async fn signatures_are_checked_and_refusals_write_nothing() {
    let fixture = Fixture::start().await;
    let now = unix_now();

    // Valid with the current secret and with the old one (rotation).
    let message = Message::hired("current");
    let body = message.body();
    fixture
        .post_raw(
            &sign(&message.id.to_string(), now, &body, &fixture.secret),
            body,
        )
        .await
        .assert_acknowledged(false);
    let message = Message::hired("rotated");
    let body = message.body();
    fixture
        .post_raw(
            &sign(&message.id.to_string(), now, &body, &fixture.old_secret),
            body,
        )
        .await
        .assert_acknowledged(false);
    // Both signatures in one header (the sender rotating): accepted.
    let message = Message::hired("both");
    let body = message.body();
    let id = message.id.to_string();
    let mut headers = sign(&id, now, &body, &fixture.secret);
    let old = sign(&id, now, &body, &fixture.old_secret);
    headers[2].1 = format!("{} {}", old[2].1, headers[2].1);
    fixture
        .post_raw(&headers, body)
        .await
        .assert_acknowledged(false);
    assert_eq!(fixture.count("employees"), 3);
    assert_eq!(fixture.count("inbox_messages"), 3);

    let runs_before = fixture
        .handler_runs
        .load(std::sync::atomic::Ordering::SeqCst);
    let message = Message::hired("refused");
    let id = message.id.to_string();
    let body = message.body();
    let stranger = rfidl_runtime::signing::Secret::generate();
    // (case, headers, body, expected code)
    let cases: Vec<(&str, Headers, String, &str)> = vec![
        (
            "wrong secret",
            sign(&id, now, &body, &stranger),
            body.clone(),
            "bad_signature",
        ),
        (
            "tampered body",
            sign(&id, now, &body, &fixture.secret),
            body.replace("refused", "tampered"),
            "bad_signature",
        ),
        (
            "stale timestamp",
            sign(&id, now - 301, &body, &fixture.secret),
            body.clone(),
            "timestamp_out_of_range",
        ),
        (
            "future timestamp",
            sign(&id, now + 400, &body, &fixture.secret),
            body.clone(),
            "timestamp_out_of_range",
        ),
        ("no headers", vec![], body.clone(), "missing_header"),
        (
            "no signature header",
            sign(&id, now, &body, &fixture.secret)[..2].to_vec(),
            body.clone(),
            "missing_header",
        ),
        (
            "no timestamp header",
            {
                let h = sign(&id, now, &body, &fixture.secret);
                vec![h[0].clone(), h[2].clone()]
            },
            body.clone(),
            "missing_header",
        ),
        (
            "no id header",
            sign(&id, now, &body, &fixture.secret)[1..].to_vec(),
            body.clone(),
            "missing_header",
        ),
        (
            "signature for another id",
            sign("other-id", now, &body, &fixture.secret),
            body.clone(),
            // The signature covers webhook-id: made for another id, it fails.
            "bad_signature",
        ),
    ];
    for (name, mut headers, body, code) in cases {
        if name == "signature for another id" {
            // Send the right id header with a signature made for another id.
            headers[0].1 = id.clone();
        }
        let reply = fixture.post_raw(&headers, body).await;
        assert_eq!(
            (reply.status, reply.code()),
            (401, code),
            "case {name}: {:?}",
            reply.body
        );
    }
    // Unknown source: 401 before any signature check.
    let body = message.body().replace(SOURCE, "stranger-service");
    let reply = fixture
        .post_raw(&sign(&id, now, &body, &fixture.secret), body)
        .await;
    reply.assert_error(401, "unknown_source");

    assert_eq!(fixture.count("employees"), 3, "nothing written by a 401");
    assert_eq!(
        fixture.count("inbox_messages"),
        3,
        "nothing written by a 401"
    );
    assert_eq!(
        fixture
            .handler_runs
            .load(std::sync::atomic::Ordering::SeqCst),
        runs_before,
        "no handler ran for a 401"
    );
    assert_eq!(fixture.metrics().inbox_signature_failures.get(), 10);
}

#[tokio::test]
async fn every_check_answers_its_code() {
    let fixture = Fixture::start().await;
    let now = unix_now();
    let signed = |body: String, id: &str| (sign(id, now, &body, &fixture.secret), body);

    // 413: a 2 MiB body, before anything else is looked at.
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2 * 1024 * 1024));
    fixture
        .post_raw(&[], big)
        .await
        .assert_error(413, "payload_too_large");

    // 400 malformed_envelope: not JSON, not an object, no source.
    for body in [
        "not json",
        "[1,2]",
        r#"{"messageId":"x"}"#,
        r#"{"sourceServiceId":7}"#,
    ] {
        fixture
            .post_raw(&[], body)
            .await
            .assert_error(400, "malformed_envelope");
    }

    // 400 malformed_envelope after verification: missing or mistyped fields.
    let message = Message::hired("fields");
    let id = message.id.to_string();
    for (field, value) in [
        ("version", serde_json::json!("one")),
        ("messageId", serde_json::json!("not-a-uuid")),
        ("messageType", serde_json::json!("Telegram")),
        ("payload", serde_json::json!([1])),
    ] {
        let mut envelope = message.envelope();
        envelope[field] = value;
        let (headers, body) = signed(envelope.to_string(), &id);
        fixture
            .post_raw(&headers, body)
            .await
            .assert_error(400, "malformed_envelope");
    }
    let mut envelope = message.envelope();
    envelope.as_object_mut().expect("object").remove("endpoint");
    let (headers, body) = signed(envelope.to_string(), &id);
    fixture
        .post_raw(&headers, body)
        .await
        .assert_error(400, "malformed_envelope");

    // 400 id_mismatch: a valid signature for another webhook-id.
    let other = uuid::Uuid::now_v7().to_string();
    let (headers, body) = signed(message.body(), &other);
    fixture
        .post_raw(&headers, body)
        .await
        .assert_error(400, "id_mismatch");

    // 404s.
    let mut envelope = message.envelope();
    envelope["interface"] = serde_json::json!("hr.other.Nope");
    let (headers, body) = signed(envelope.to_string(), &id);
    fixture
        .post_raw(&headers, body)
        .await
        .assert_error(404, "unknown_interface");
    let mut envelope = message.envelope();
    envelope["version"] = serde_json::json!(3);
    let (headers, body) = signed(envelope.to_string(), &id);
    fixture
        .post_raw(&headers, body)
        .await
        .assert_error(404, "unknown_version");
    let mut envelope = message.envelope();
    envelope["endpoint"] = serde_json::json!("EmployeePromoted");
    let (headers, body) = signed(envelope.to_string(), &id);
    fixture
        .post_raw(&headers, body)
        .await
        .assert_error(404, "unknown_endpoint");

    // 422 payload_mismatch: a required member missing; unknown members are fine.
    let mut mismatch = Message::hired("m");
    mismatch.payload = serde_json::json!({"employee": {"id": "e1"}});
    fixture
        .post(&mismatch)
        .await
        .assert_error(422, "payload_mismatch");
    let mut extra = Message::hired("extra");
    extra.payload["employee"]["nickname"] = serde_json::json!("x");
    extra.payload["newField"] = serde_json::json!(true);
    fixture.post(&extra).await.assert_acknowledged(false);

    // 422 message_id_reused: same id, different payload.
    let first = Message::hired("first");
    fixture.post(&first).await.assert_acknowledged(false);
    let mut reused = first.clone();
    reused.payload = serde_json::json!({"employee": {"id": "e-2", "name": "second"}});
    fixture
        .post(&reused)
        .await
        .assert_error(422, "message_id_reused");

    // 422 poison: the handler refuses it; its business row is rolled back.
    fixture
        .post(&Message::hired("poison pill"))
        .await
        .assert_error(422, "poison");

    // Only the two accepted messages wrote anything.
    assert_eq!(fixture.count("employees"), 2);
    assert_eq!(fixture.count("inbox_messages"), 2);
    let metrics = fixture.metrics();
    assert_eq!(metrics.inbox_signature_failures.get(), 0);
    assert!(
        metrics.inbox_rejected.get() >= 15,
        "{}",
        metrics.inbox_rejected.get()
    );
}

#[tokio::test]
async fn framework_errors_have_json_bodies() {
    let fixture = Fixture::start().await;
    let get = Reply::from(
        fixture
            .client
            .get(fixture.url("/_rf/receive"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    get.assert_error(405, "method_not_allowed");
    assert_eq!(get.content_type.as_deref(), Some("application/json"));
    let unknown = Reply::from(
        fixture
            .client
            .post(fixture.url("/_rf/nothing-here"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    unknown.assert_error(404, "not_found");
    let put_batch = Reply::from(
        fixture
            .client
            .put(fixture.url("/_rf/receive/batch"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    put_batch.assert_error(405, "method_not_allowed");
    // A 2 MiB body streamed in chunks, without Content-Length, is still
    // refused with JSON.
    let address = fixture.base.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    let head = format!(
        "POST /_rf/receive HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    let chunk = vec![b'x'; 64 * 1024];
    for _ in 0..32 {
        let frame = format!("{:x}\r\n", chunk.len());
        // The server may answer and close before reading it all.
        if stream.write_all(frame.as_bytes()).await.is_err()
            || stream.write_all(&chunk).await.is_err()
            || stream.write_all(b"\r\n").await.is_err()
        {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains(r#""error":"payload_too_large""#),
        "{answer}"
    );
}

use crate::receiver_fixture::Reply;

#[tokio::test]
async fn fingerprint_mismatch_is_accepted_and_counted() {
    let fixture = Fixture::start().await;
    let mut message = Message::hired("drift");
    message.fingerprint = "sha256:ffff".to_owned();
    assert_ne!(message.fingerprint, FINGERPRINT_V1);
    fixture.post(&message).await.assert_acknowledged(false);
    assert_eq!(fixture.metrics().inbox_fingerprint_mismatches.get(), 1);
    // The duplicate does not run the handler, so it is not counted again.
    fixture.post(&message).await.assert_acknowledged(true);
    assert_eq!(fixture.metrics().inbox_fingerprint_mismatches.get(), 1);
}

#[tokio::test]
async fn metadata_lists_hosted_interfaces_with_manifests() {
    let fixture = Fixture::start().await;
    let reply = Reply::from(
        fixture
            .client
            .get(fixture.url("/_rf/metadata"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(reply.status, 200);
    let list = reply.body["interfaces"].as_array().expect("array");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["interface"], INTERFACE);
    assert_eq!(list[0]["version"], 1);
    assert_eq!(list[0]["fingerprint"], FINGERPRINT_V1);
    assert_eq!(
        list[0]["endpoints"],
        serde_json::json!(["EmployeeHired", "EmployeeLeft"])
    );
    assert_eq!(list[1]["manifest"]["version"], 2);
}

#[tokio::test]
async fn batch_answers_each_item_in_order() {
    let fixture = Fixture::start().await;
    let now = unix_now();
    let done_before = Message::hired("before");
    fixture.post(&done_before).await.assert_acknowledged(false);

    let item = |message: &Message, secret: &rfidl_runtime::signing::Secret| {
        let body = message.body();
        let headers: std::collections::BTreeMap<String, String> =
            sign(&message.id.to_string(), now, &body, secret)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        serde_json::json!({"headers": headers, "body": body})
    };
    let fresh = Message::hired("fresh");
    let mut fresh_reused = fresh.clone();
    fresh_reused.payload = serde_json::json!({"employee": {"id": "e-other", "name": "other"}});
    let stranger = rfidl_runtime::signing::Secret::generate();
    let mut mismatch = Message::hired("mismatch");
    mismatch.payload = serde_json::json!({"employee": {}});
    let batch = serde_json::json!([
        item(&fresh, &fixture.secret),
        item(&done_before, &fixture.secret),
        item(&Message::hired("forged"), &stranger),
        item(&mismatch, &fixture.secret),
        item(&fresh, &fixture.secret),
        item(&Message::hired("broken"), &fixture.secret),
        {"headers": {}, "body": "not json"},
        item(&Message::hired("second fresh"), &fixture.old_secret),
        item(&fresh_reused, &fixture.secret),
    ]);
    let reply = Reply::from(
        fixture
            .client
            .post(fixture.url("/_rf/receive/batch"))
            .json(&batch)
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let results = reply.body.as_array().expect("array");
    let summary: Vec<(u64, String)> = results
        .iter()
        .map(|r| {
            let body = &r["body"];
            let what = match body["error"].as_str() {
                Some(code) => code.to_owned(),
                None => format!("duplicate={}", body["duplicate"]),
            };
            (r["status"].as_u64().expect("status"), what)
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (200, "duplicate=false".to_owned()),
            (200, "duplicate=true".to_owned()),
            (401, "bad_signature".to_owned()),
            (422, "payload_mismatch".to_owned()),
            (200, "duplicate=true".to_owned()),
            (500, "handler_failed".to_owned()),
            (400, "malformed_envelope".to_owned()),
            (200, "duplicate=false".to_owned()),
            (422, "message_id_reused".to_owned()),
        ]
    );
    assert_eq!(results[0]["body"]["payload"], results[4]["body"]["payload"]);
    // before + fresh + second fresh.
    assert_eq!(fixture.count("employees"), 3);
    assert_eq!(fixture.count("inbox_messages"), 3);

    let not_a_batch = Reply::from(
        fixture
            .client
            .post(fixture.url("/_rf/receive/batch"))
            .body("{}")
            .send()
            .await
            .expect("send"),
    )
    .await;
    not_a_batch.assert_error(400, "malformed_envelope");
}

#[tokio::test]
async fn verification_is_off_only_when_asked_loudly() {
    let fixture = Fixture::start_with(|b| b.danger_accept_unsigned_for_local_development()).await;
    let message = Message::hired("unsigned");
    fixture
        .post_raw(&[], message.body())
        .await
        .assert_acknowledged(false);
    // Any source, not only configured peers.
    let body = message.body().replace(SOURCE, "anyone");
    fixture.post_raw(&[], body).await.assert_acknowledged(false);
}

/// A client the project did not write: Python's `standardwebhooks` signs the
/// envelope and `urllib` posts it; the receiver must accept it, answer a
/// duplicate for the same bytes again, and refuse a tampered copy.
const PYTHON_CLIENT: &str = r#"
import json, sys, time, urllib.request, urllib.error
from datetime import datetime, timezone
from standardwebhooks.webhooks import Webhook
url, secret, msg_id, body = sys.argv[1:5]
results = []
for tamper in (False, False, True):
    now = datetime.fromtimestamp(int(time.time()), tz=timezone.utc)
    signature = Webhook(secret).sign(msg_id, now, body)
    sent = body.replace("Ada", "Eve") if tamper else body
    request = urllib.request.Request(url, data=sent.encode("utf-8"), method="POST", headers={
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    })
    try:
        with urllib.request.urlopen(request) as response:
            results.append([response.status, json.loads(response.read())])
    except urllib.error.HTTPError as error:
        results.append([error.code, json.loads(error.read())])
print(json.dumps(results))
"#;

#[tokio::test]
async fn a_client_signed_by_the_reference_library_is_accepted() {
    let Some(python) = crate::interop::python() else {
        return;
    };
    let fixture = Fixture::start().await;
    let message = Message::hired("Ada Lovelace ✓");
    let url = fixture.url("/_rf/receive");
    let secret = fixture.secret.to_whsec();
    let id = message.id.to_string();
    let body = message.body();
    let output = tokio::task::spawn_blocking(move || {
        crate::interop::run_python(&python, PYTHON_CLIENT, &[&url, &secret, &id, &body])
    })
    .await
    .expect("python");
    let results: Vec<(u16, serde_json::Value)> = serde_json::from_str(&output).expect("json");
    assert_eq!(results[0].0, 200, "{results:?}");
    assert_eq!(results[0].1["duplicate"], false);
    assert_eq!(results[0].1["payload"]["welcomed"], "Ada Lovelace ✓");
    assert_eq!(results[1].0, 200, "{results:?}");
    assert_eq!(results[1].1["duplicate"], true);
    assert_eq!(results[2].0, 401, "{results:?}");
    assert_eq!(results[2].1["error"], "bad_signature");
    assert_eq!(fixture.count("employees"), 1);
}

#[tokio::test]
async fn receive_without_http_follows_the_same_checks() {
    use rfidl_runtime::receiver::{ReceiveError, Reply};
    let fixture = Fixture::start().await;
    let message = Message::hired("direct");
    let body = message.body();
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in sign(&message.id.to_string(), unix_now(), &body, &fixture.secret) {
        headers.insert(name, value.parse().expect("header value"));
    }
    let answer = fixture
        .receiver
        .receive(&headers, body.clone().into())
        .await;
    assert!(
        matches!(&answer, Reply::Acknowledged { duplicate: false, payload } if payload["welcomed"] == "direct"),
        "{answer:?}"
    );
    let again = fixture.receiver.receive(&headers, body.into()).await;
    assert!(
        matches!(
            again,
            Reply::Acknowledged {
                duplicate: true,
                ..
            }
        ),
        "{again:?}"
    );
    let huge = vec![b' '; 1024 * 1024 + 1];
    let refused = fixture.receiver.receive(&headers, huge.into()).await;
    assert_eq!(
        refused,
        Reply::Refused(ReceiveError::PayloadTooLarge { limit: 1024 * 1024 })
    );
}

#[tokio::test]
async fn the_router_merges_into_an_app_with_its_own_fallback() {
    use tower::ServiceExt as _;
    let fixture = Fixture::start().await;
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "hi" }))
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "app's own 404") })
        .merge(fixture.receiver.router());
    let get = |path: &str| {
        axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request")
    };
    let body = |response: axum::response::Response| async move {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let response = app.clone().oneshot(get("/elsewhere")).await.expect("call");
    assert_eq!(body(response).await, "app's own 404");
    let response = app
        .clone()
        .oneshot(get("/_rf/elsewhere"))
        .await
        .expect("call");
    assert_eq!(response.status(), 404);
    assert!(body(response).await.contains(r#""error":"not_found""#));
    let response = app.oneshot(get("/_rf/metadata")).await.expect("call");
    assert_eq!(response.status(), 200);

    // Standalone: every unknown path answers the JSON 404.
    let response = fixture
        .receiver
        .standalone_router()
        .oneshot(get("/elsewhere"))
        .await
        .expect("call");
    assert_eq!(response.status(), 404);
    assert!(body(response).await.contains(r#""error":"not_found""#));
}
