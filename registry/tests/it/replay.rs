//! A signed lifecycle command cannot be replayed (issue 26): a fake
//! instance registered for the same interface captures the `Decommission`
//! the registry sends it and posts it to the real provider after the
//! version was re-commissioned: refused 422 `wrong_target`; the provider's
//! own old `Decommission` delivered again under a new message id: refused
//! 422 `stale_command`; the registry's outbox dead-letters the fake's
//! commands once they meet such a refusal. A real registry, a real provider
//! (runtime receiver, SQLite), a fake instance: real HTTP on loopback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rfidl_registry::Registry;
use rfidl_registry::commands::CommandSender;
use rfidl_runtime::lifecycle;
use rfidl_runtime::signing::Secret;
use serde_json::{Value, json};

use crate::decommission::{INTERFACE, held, provider, register, send, wait_until};
use crate::support::{Server, manifest_path, put, schema_manifest};

/// One request the fake instance received.
#[derive(Debug, Clone)]
struct Captured {
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Captured {
    fn envelope(&self) -> Value {
        serde_json::from_slice(&self.body).expect("an envelope")
    }
}

/// A registered instance that is not what it claims: it keeps every
/// command it receives, never acknowledges the first delivery of one (so
/// the registry retries with freshly signed copies), and forwards the later
/// ones to `victim`, answering what the victim answered.
struct Fake {
    captured: Mutex<Vec<Captured>>,
    deliveries: Mutex<HashMap<String, u32>>,
    victim: String,
    http: reqwest::Client,
}

async fn fake_receive(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let pairs: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("webhook-") || *name == "content-type")
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect();
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    fake.captured.lock().expect("lock").push(Captured {
        headers: pairs.clone(),
        body: body.clone(),
    });
    let delivery = {
        let mut deliveries = fake.deliveries.lock().expect("lock");
        let count = deliveries.entry(id).or_default();
        *count += 1;
        *count
    };
    if delivery == 1 {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": "handler_failed", "message": "not now"})),
        )
            .into_response();
    }
    let mut request = fake.http.post(format!("{}/_rf/receive", fake.victim));
    for (name, value) in &pairs {
        request = request.header(name, value);
    }
    match request.body(body).send().await {
        Ok(answer) => {
            let status =
                StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, answer.bytes().await.unwrap_or_default()).into_response()
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// Posts a captured (or forged) request to `url`'s receiver.
fn post(url: &str, headers: &[(String, String)], body: Vec<u8>) -> (u16, Value) {
    let mut request = reqwest::blocking::Client::new().post(format!("{url}/_rf/receive"));
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let answer = request.body(body).send().expect("post");
    let status = answer.status().as_u16();
    (status, answer.json().unwrap_or(Value::Null))
}

/// Signs `envelope` as the registry's dispatcher does.
fn signed(envelope: &Value, secret: &Secret) -> (Vec<(String, String)>, Vec<u8>) {
    let body = serde_json::to_vec(envelope).expect("json");
    let id = envelope["messageId"].as_str().expect("messageId");
    let signature = rfidl_runtime::signing::SignatureHeaders::sign(
        id,
        rfidl_runtime::signing::unix_now(),
        &body,
        std::slice::from_ref(secret),
    );
    let mut headers: Vec<(String, String)> = signature
        .to_pairs()
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    headers.push(("content-type".into(), "application/json".into()));
    (headers, body)
}

/// The statuses (and last errors) of the registry's commands to `url`.
fn commands_to(db: &std::path::Path, url: &str) -> Vec<(String, String, Option<String>)> {
    let conn = rusqlite::Connection::open(db).expect("open");
    let mut statement = conn
        .prepare(
            "SELECT endpoint, status, last_error FROM outbox_messages \
             WHERE destination = ?1 ORDER BY seq",
        )
        .expect("prepare");
    statement
        .query_map([url], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn a_command_captured_by_a_fake_instance_or_delivered_late_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let secret = Secret::generate();
    let commands_db = dir.path().join("registry.db.commands");
    let commands = {
        let _in_runtime = rt.enter();
        CommandSender::start_with(&commands_db, secret.clone(), Duration::from_millis(50))
            .expect("command sender")
    };
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .commands(commands.clone()),
    );
    let v1 = schema_manifest(INTERFACE, 1);
    assert_eq!(
        put(&server.url, &manifest_path(&v1), v1.to_pretty_json(), None).0,
        201
    );
    let fingerprint: &'static str = Box::leak(v1.fingerprint.clone().into_boxed_str());

    // The real provider registers (and so learns its instance id).
    let real = provider(&rt, dir.path(), "hr", &secret, fingerprint);
    let real_id = register(&rt, &server.url, "hr", &real, fingerprint);

    // The fake registers for the same interface version, elsewhere.
    let fake = Arc::new(Fake {
        captured: Mutex::new(Vec::new()),
        deliveries: Mutex::new(HashMap::new()),
        victim: real.url.clone(),
        http: reqwest::Client::new(),
    });
    let (fake_url, _fake_server) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let router = axum::Router::new()
            .route("/_rf/receive", axum::routing::post(fake_receive))
            .with_state(Arc::clone(&fake));
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        (url, server)
    });
    let (status, registered) = send(
        reqwest::Method::POST,
        &format!("{}/v1/services/impostor/instances", server.url),
        Some(&json!({
            "baseUrl": fake_url,
            "hosts": [{"interface": INTERFACE, "version": 1, "fingerprint": fingerprint}],
        })),
    );
    assert_eq!(status, 201, "{registered}");
    let fake_id = registered["instanceId"].as_str().expect("id").to_owned();
    assert_ne!(fake_id, real_id);

    // Decommission: both are sent a command, each naming its instance.
    let path = format!("{}/v1/decommissioned/{INTERFACE}/v1", server.url);
    let (status, decommissioned) = send(reqwest::Method::PUT, &path, None);
    assert_eq!(status, 200, "{decommissioned}");
    let first_generation = decommissioned["generation"].as_u64().expect("generation");
    wait_until("the real provider holds its row", || held(&real) == 1);
    wait_until("the fake captured the decommission", || {
        !fake.captured.lock().expect("lock").is_empty()
    });
    let copy = fake.captured.lock().expect("lock")[0].clone();
    let payload = &copy.envelope()["payload"];
    assert_eq!(copy.envelope()["endpoint"], lifecycle::DECOMMISSION);
    assert_eq!(payload["instanceId"], fake_id.as_str(), "{payload}");
    assert_eq!(payload["baseUrl"], fake_url.as_str(), "{payload}");
    assert_eq!(payload["generation"], first_generation, "{payload}");

    // Re-commission: the registry's list is empty, the provider answers again.
    let (status, recommissioned) = send(reqwest::Method::DELETE, &path, None);
    assert_eq!(status, 200, "{recommissioned}");
    let second_generation = recommissioned["generation"].as_u64().expect("generation");
    assert!(second_generation > first_generation, "{recommissioned}");
    wait_until("the real provider released its row", || held(&real) == 0);
    assert!(!real.outbox.lifecycle().is_decommissioned(INTERFACE, 1));
    let (_, list) = send(
        reqwest::Method::GET,
        &format!("{}/v1/decommissioned", server.url),
        None,
    );
    assert_eq!(list["decommissioned"], json!([]), "{list}");

    // The fake posts its captured, validly signed Decommission to the real
    // provider: refused for good, nothing held.
    let (status, answer) = post(&real.url, &copy.headers, copy.body.to_vec());
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some(lifecycle::WRONG_TARGET)),
        "{answer}"
    );
    assert!(!real.outbox.lifecycle().is_decommissioned(INTERFACE, 1));
    assert_eq!(held(&real), 0);

    // The real provider's own Decommission, from the registry's outbox: sent
    // again as it was, it is a duplicate the inbox answers without applying
    // it; delivered late under a new message id (a retry of a registry
    // restored from a backup, a second copy), it is older than the
    // re-commission the provider holds: 422 stale_command.
    let (id, stored): (String, String) = rusqlite::Connection::open(&commands_db)
        .expect("open")
        .query_row(
            "SELECT message_id, payload FROM outbox_messages \
             WHERE destination = ?1 AND endpoint = 'Decommission'",
            [&real.url],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the provider's decommission");
    let stored: Value = serde_json::from_str(&stored).expect("payload");
    assert_eq!(stored["instanceId"], real_id.as_str(), "{stored}");
    let mut envelope = json!({
        "messageId": id,
        "sourceServiceId": lifecycle::DEFAULT_REGISTRY_SOURCE,
        "messageType": "Command",
        "interface": lifecycle::INTERFACE,
        "version": lifecycle::VERSION,
        "fingerprint": lifecycle::FINGERPRINT,
        "endpoint": lifecycle::DECOMMISSION,
        "payload": stored,
    });
    let (headers, body) = signed(&envelope, &secret);
    let (status, answer) = post(&real.url, &headers, body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["duplicate"], true, "{answer}");
    assert!(!real.outbox.lifecycle().is_decommissioned(INTERFACE, 1));
    // Another id: the last hex digit changed.
    let last = if id.ends_with('0') { "1" } else { "0" };
    envelope["messageId"] = json!(format!("{}{last}", &id[..id.len() - 1]));
    let (headers, body) = signed(&envelope, &secret);
    let (status, answer) = post(&real.url, &headers, body);
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some(lifecycle::STALE_COMMAND)),
        "{answer}"
    );
    assert!(!real.outbox.lifecycle().is_decommissioned(INTERFACE, 1));
    assert_eq!(held(&real), 0);

    // The registry retried the fake's commands with freshly signed copies;
    // the fake forwarded them live to the real provider, which refused
    // them: the registry's outbox dead-letters them (no retry forever), and
    // the real provider's own commands were acknowledged.
    wait_until("the fake's commands are dead-lettered", || {
        let rows = commands_to(&commands_db, &fake_url);
        rows.len() == 2 && rows.iter().all(|(_, status, _)| status == "DeadLetter")
    });
    for (endpoint, _, error) in commands_to(&commands_db, &fake_url) {
        let error = error.unwrap_or_default();
        assert!(error.starts_with("422 wrong_target"), "{endpoint}: {error}");
    }
    let captured = fake.captured.lock().expect("lock").clone();
    let decommissions: Vec<&Captured> = captured
        .iter()
        .filter(|c| c.envelope()["endpoint"] == lifecycle::DECOMMISSION)
        .collect();
    assert!(decommissions.len() >= 2, "retried: {captured:?}");
    for copy in decommissions {
        assert_eq!(copy.envelope()["payload"]["instanceId"], fake_id.as_str());
    }
    let real_rows = commands_to(&commands_db, &real.url);
    assert_eq!(real_rows.len(), 2, "{real_rows:?}");
    assert!(
        real_rows.iter().all(|(_, status, _)| status == "Sent"),
        "{real_rows:?}"
    );
    assert!(!real.outbox.lifecycle().is_decommissioned(INTERFACE, 1));
    assert_eq!(held(&real), 0);
    drop(server);
    rt.block_on(commands.shutdown());
}

/// The generation is stored in the registry's database: it grows with
/// every change, across a restart, and also after the database went back
/// to an older state (a restore from a backup), so a provider never sees a
/// new command as older than one it applied.
#[test]
fn the_generation_is_stored_and_only_grows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let v1 = schema_manifest(INTERFACE, 1);
    let change = |server: &Server, method: reqwest::Method| -> u64 {
        let path = format!("{}/v1/decommissioned/{INTERFACE}/v1", server.url);
        let (status, answer) = send(method, &path, None);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["commandsSentTo"], Value::Null, "no command secret");
        answer["generation"].as_u64().expect("generation")
    };
    let server = Server::on_file(&db);
    assert_eq!(
        put(&server.url, &manifest_path(&v1), v1.to_pretty_json(), None).0,
        201
    );
    let first = change(&server, reqwest::Method::PUT);
    let repeated = change(&server, reqwest::Method::PUT);
    assert!(repeated > first, "{first} {repeated}");
    drop(server);

    let server = Server::on_file(&db);
    let after_restart = change(&server, reqwest::Method::DELETE);
    assert!(after_restart > repeated, "{repeated} {after_restart}");
    drop(server);

    // An older copy of the database: the stored generation went back. (The
    // next one is taken from the clock; a few ms pass first, so the test
    // does not depend on the restart's speed.)
    std::thread::sleep(Duration::from_millis(10));
    rusqlite::Connection::open(&db)
        .expect("open")
        .execute("UPDATE lifecycle_generations SET generation = 1", [])
        .expect("roll back");
    let server = Server::on_file(&db);
    let after_restore = change(&server, reqwest::Method::PUT);
    assert!(
        after_restore > after_restart,
        "{after_restart} {after_restore}"
    );
}
