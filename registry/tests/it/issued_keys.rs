//! Keys issued at registration (`--issue-keys`, `rfidl_registry::keys`):
//! two services with no secret configured exchange signed messages (a real
//! runtime receiver and dispatcher on loopback, each renewing its keys
//! through a real `DirectoryClient`), a rotation during traffic refuses
//! nothing, another credential cannot obtain a service's keys, the
//! database holds no plaintext secret, and the key file is what opens them
//! after a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rfidl_registry::Registry;
use rfidl_registry::keys::{KeyAuthority, KeyError};
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::directory::{DirectoryClient, InterfaceRef, Registration, RegistryConfig};
use rfidl_runtime::dispatcher::{Dispatcher, DispatcherHandle};
use rfidl_runtime::keys::IssuedKeys;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{
    HandlerError, HostedInterface, HostedService, IncomingCall, Receiver,
};
use rfidl_runtime::{Config, MessageType};
use serde_json::{Value, json};

use crate::support::{Server, manifest_path, put, schema_manifest};

const INTERFACE: &str = "hr.employees.EmpService";
const PUBLISH: &str = "publish-token";
const HR_TOKEN: &str = "hr-registration-credential";
const ENGINE_TOKEN: &str = "engine-registration-credential";
const STRANGER_TOKEN: &str = "stranger-registration-credential";

/// Hosts EmpService v1, counts the calls it handles.
struct EmpService(HostedInterface, Arc<AtomicU32>);

impl HostedService for EmpService {
    fn interfaces(&self) -> &[HostedInterface] {
        std::slice::from_ref(&self.0)
    }

    fn handle(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &rusqlite::Transaction<'_>,
    ) -> Result<Value, HandlerError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        Ok(json!({}))
    }
}

fn registry(db: &Path, key_file: &Path, rotation: Duration, overlap: Duration) -> Registry {
    let authority = KeyAuthority::load_or_create(key_file)
        .expect("key file")
        .rotation(rotation)
        .overlap(overlap);
    Registry::open(db)
        .expect("open")
        .publish_token(PUBLISH)
        .registration_token(HR_TOKEN)
        .registration_token(ENGINE_TOKEN)
        .registration_token(STRANGER_TOKEN)
        .issue_keys(authority)
        .expect("issue keys")
}

/// Publishes EmpService v1; its fingerprint.
fn publish(server: &Server) -> &'static str {
    let v1 = schema_manifest(INTERFACE, 1);
    let (status, body) = put(
        &server.url,
        &manifest_path(&v1),
        v1.to_pretty_json(),
        Some(PUBLISH),
    );
    assert_eq!(status, 201, "{body}");
    Box::leak(v1.fingerprint.clone().into_boxed_str())
}

fn emp_v1(fingerprint: &str) -> InterfaceRef {
    InterfaceRef {
        interface: INTERFACE.into(),
        version: 1,
        fingerprint: fingerprint.into(),
    }
}

/// HR: a receiver of EmpService v1 with no `peers`, registered with the
/// registry and renewing its issued keys every `heartbeat`.
struct Hr {
    url: String,
    handled: Arc<AtomicU32>,
    keys: IssuedKeys,
    _server: tokio::task::JoinHandle<()>,
    _directory: tokio::task::JoinHandle<()>,
}

fn hr(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    registry: &str,
    fingerprint: &'static str,
    heartbeat: Duration,
) -> Hr {
    let db = dir.join("hr.db");
    let config = Config::for_service("hr");
    let keys = IssuedKeys::new();
    let handled = Arc::new(AtomicU32::new(0));
    let hosted = HostedInterface {
        interface: INTERFACE,
        version: 1,
        fingerprint,
        endpoints: &["Hire"],
        manifest_json: "{}",
    };
    let receiver = Receiver::builder(config, &db)
        .service(EmpService(hosted, Arc::clone(&handled)))
        .issued_keys(&keys)
        .build()
        .expect("receiver");
    let (url, server) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let router = receiver.router();
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        (url, server)
    });
    let client = DirectoryClient::new(
        RegistryConfig::new(registry)
            .with_token(HR_TOKEN)
            .with_heartbeat(heartbeat),
        Registration {
            service_id: "hr".into(),
            base_url: url.clone(),
            hosts: vec![emp_v1(fingerprint)],
            calls: Vec::new(),
            diagnostics_token: None,
        },
    )
    .issued_keys(&keys);
    let (directory, _) = {
        let _in_runtime = rt.enter();
        client.spawn()
    };
    Hr {
        url,
        handled,
        keys,
        _server: server,
        _directory: directory,
    }
}

/// The engine: an outbox and a dispatcher sending to `hr` with no secret
/// configured, registered as a caller of EmpService v1.
struct Engine {
    db: PathBuf,
    outbox: Outbox,
    keys: IssuedKeys,
    dispatcher: Option<DispatcherHandle>,
    _directory: tokio::task::JoinHandle<()>,
}

fn engine(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    registry: &str,
    hr_url: &str,
    fingerprint: &'static str,
    heartbeat: Duration,
) -> Engine {
    let db = dir.join("engine.db");
    let mut config =
        Config::for_service("engine").with_destination("hr", DestinationConfig::new(hr_url, ""));
    config.outbox.poll_interval = Duration::from_millis(20);
    config.outbox.backoff_base = Duration::from_millis(50);
    config.outbox.backoff_max = Duration::from_millis(200);
    config.outbox.jitter = Duration::from_millis(10);
    let keys = IssuedKeys::new();
    let outbox = Outbox::new(config, &db);
    let dispatcher = {
        let _in_runtime = rt.enter();
        Dispatcher::builder(&outbox)
            .issued_keys(&keys)
            .start()
            .expect("dispatcher")
    };
    let client = DirectoryClient::new(
        RegistryConfig::new(registry)
            .with_token(ENGINE_TOKEN)
            .with_heartbeat(heartbeat),
        Registration {
            service_id: "engine".into(),
            base_url: "http://127.0.0.1:9".into(),
            hosts: Vec::new(),
            calls: vec![emp_v1(fingerprint)],
            diagnostics_token: None,
        },
    )
    .issued_keys(&keys);
    let (directory, _) = {
        let _in_runtime = rt.enter();
        client.spawn()
    };
    Engine {
        db,
        outbox,
        keys,
        dispatcher: Some(dispatcher),
        _directory: directory,
    }
}

impl Engine {
    fn send(&self, fingerprint: &str) {
        let mut conn =
            rfidl_runtime::store::sqlite::open(&self.db, rfidl_runtime::Durability::Normal)
                .expect("open");
        let tx = conn.transaction().expect("tx");
        self.outbox
            .enqueue(
                &tx,
                OutgoingMessage {
                    destination: "hr".into(),
                    message_type: MessageType::Command,
                    interface: INTERFACE.into(),
                    version: 1,
                    fingerprint: fingerprint.into(),
                    endpoint: "Hire".into(),
                    correlation_id: None,
                    payload: json!({}),
                    headers: Default::default(),
                    max_retries: None,
                    ttl: None,
                    deliver_at: None,
                },
            )
            .expect("enqueue");
        tx.commit().expect("commit");
    }

    /// (status, retry_count) of every row.
    fn rows(&self) -> Vec<(String, i64)> {
        let conn = rusqlite::Connection::open(&self.db).expect("open");
        let mut statement = conn
            .prepare("SELECT status, retry_count FROM outbox_messages ORDER BY message_id")
            .expect("prepare");
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows")
    }
}

fn wait_until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn post(url: &str, token: &str, body: &Value) -> (u16, String) {
    let response = reqwest::blocking::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .expect("post");
    (
        response.status().as_u16(),
        response.text().unwrap_or_default(),
    )
}

#[test]
fn two_services_with_issued_keys_exchange_a_signed_message_with_no_secret_configured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = Server::start(registry(
        &dir.path().join("registry.db"),
        &dir.path().join("registry.key"),
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ));
    let fingerprint = publish(&server);
    // A heartbeat far longer than the test: HR learns the engine's key only
    // because its receiver, meeting an unknown source, asks for a renewal.
    let hr = hr(
        &rt,
        dir.path(),
        &server.url,
        fingerprint,
        Duration::from_secs(600),
    );
    wait_until("hr has its signing key", Duration::from_secs(10), || {
        !hr.keys.snapshot().signing.is_empty()
    });
    let engine = engine(
        &rt,
        dir.path(),
        &server.url,
        &hr.url,
        fingerprint,
        Duration::from_secs(600),
    );
    engine.send(fingerprint);
    wait_until("the message is sent", Duration::from_secs(15), || {
        engine.rows().iter().all(|(status, _)| status == "Sent")
    });
    assert_eq!(hr.handled.load(Ordering::SeqCst), 1);
    // HR answered 503 `keys_pending` until it had the engine's key: a
    // wait, never a counted (dead-lettering) retry.
    assert_eq!(engine.rows()[0].1, 0);
    // Each holds the other's secret, and its own is the one the other has.
    let (hr_keys, engine_keys) = (hr.keys.snapshot(), engine.keys.snapshot());
    assert_eq!(hr_keys.peers.get("engine"), Some(&engine_keys.signing));
    assert_eq!(engine_keys.peers.get("hr"), Some(&hr_keys.signing));
    assert_ne!(hr_keys.signing, engine_keys.signing);
    rt.block_on(engine.dispatcher.expect("running").shutdown());
}

#[test]
fn a_rotation_during_traffic_refuses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let db = dir.path().join("registry.db");
    // A new secret every second, the old one issued 3 s more (room for a
    // slow machine's late heartbeats). The receiver renews every 500 ms,
    // the sender every 100 ms: a sender that switched to the new secret at
    // once would be refused by a receiver that has not renewed yet.
    let server = Server::start(registry(
        &db,
        &dir.path().join("registry.key"),
        Duration::from_secs(1),
        Duration::from_secs(3),
    ));
    let fingerprint = publish(&server);
    let hr = hr(
        &rt,
        dir.path(),
        &server.url,
        fingerprint,
        Duration::from_millis(500),
    );
    wait_until("hr has its signing key", Duration::from_secs(10), || {
        !hr.keys.snapshot().signing.is_empty()
    });
    let engine = engine(
        &rt,
        dir.path(),
        &server.url,
        &hr.url,
        fingerprint,
        Duration::from_millis(100),
    );
    wait_until("hr has the engine's key", Duration::from_secs(10), || {
        hr.keys.peer("engine").is_some()
    });
    let sent = 120;
    let mut most_signing = 0;
    for _ in 0..sent {
        engine.send(fingerprint);
        most_signing = most_signing.max(engine.keys.snapshot().signing.len());
        std::thread::sleep(Duration::from_millis(30));
    }
    // The engine signed with the old and the new secret during overlaps.
    assert!(most_signing >= 2, "no overlap seen");
    wait_until("every message is sent", Duration::from_secs(20), || {
        engine.rows().iter().all(|(status, _)| status == "Sent")
    });
    let rows = engine.rows();
    assert_eq!(rows.len(), sent);
    // Not one attempt was refused: a 401 would have counted a retry.
    assert!(
        rows.iter().all(|(_, retries)| *retries == 0),
        "refused attempts: {:?}",
        rows.iter().filter(|(_, r)| *r > 0).count()
    );
    assert_eq!(hr.handled.load(Ordering::SeqCst), sent as u32);
    let rotated: i64 = rusqlite::Connection::open(&db)
        .expect("open")
        .query_row(
            "SELECT MAX(key_id) FROM service_keys WHERE service = 'engine'",
            [],
            |row| row.get(0),
        )
        .expect("keys");
    assert!(
        rotated >= 3,
        "the engine's secret has only {rotated} generations"
    );
    rt.block_on(engine.dispatcher.expect("running").shutdown());
}

#[test]
fn another_credential_cannot_obtain_a_services_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(registry(
        &dir.path().join("registry.db"),
        &dir.path().join("registry.key"),
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ));
    let fingerprint = publish(&server);
    let instances = format!("{}/v1/services/hr/instances", server.url);
    let registration =
        |base_url: &str| json!({"baseUrl": base_url, "hosts": [emp_v1(fingerprint)]});
    let (status, body) = post(&instances, HR_TOKEN, &registration("http://127.0.0.1:7001"));
    assert_eq!(status, 201, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    assert!(
        answer["keys"]["signing"][0]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec_"))
    );
    let id = answer["instanceId"].as_str().expect("id").to_owned();

    // The same instance, another instance of the service, a heartbeat: all
    // refused, and no answer carries a secret.
    for base_url in ["http://127.0.0.1:7001", "http://127.0.0.1:7002"] {
        let (status, body) = post(&instances, STRANGER_TOKEN, &registration(base_url));
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("keys_owned"), "{body}");
        assert!(!body.contains("whsec_"), "{body}");
    }
    let response = reqwest::blocking::Client::new()
        .put(format!("{instances}/{id}/heartbeat"))
        .bearer_auth(STRANGER_TOKEN)
        .send()
        .expect("heartbeat");
    assert_eq!(response.status().as_u16(), 403);
    assert!(!response.text().unwrap_or_default().contains("whsec_"));
    // The owner's heartbeat renews them.
    let response = reqwest::blocking::Client::new()
        .put(format!("{instances}/{id}/heartbeat"))
        .bearer_auth(HR_TOKEN)
        .send()
        .expect("heartbeat");
    let renewed: Value = response.json().expect("json");
    assert_eq!(renewed["keys"]["signing"], answer["keys"]["signing"]);
}

/// Registers `hr` and returns the signing secret issued.
fn issued_secret(server: &Server, fingerprint: &str) -> String {
    let (status, body) = post(
        &format!("{}/v1/services/hr/instances", server.url),
        HR_TOKEN,
        &json!({"baseUrl": "http://127.0.0.1:7001", "hosts": [emp_v1(fingerprint)]}),
    );
    assert!(status == 200 || status == 201, "{status} {body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    answer["keys"]["signing"][0]
        .as_str()
        .expect("a signing secret")
        .to_owned()
}

#[test]
fn the_database_holds_no_plaintext_secret_and_only_its_key_file_opens_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let key_file = dir.path().join("registry.key");
    let hour = Duration::from_secs(3600);
    let (secret, fingerprint) = {
        let server = Server::start(registry(&db, &key_file, hour, hour));
        let fingerprint = publish(&server);
        (issued_secret(&server, fingerprint), fingerprint)
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_file)
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // Neither the base64 form nor the raw key bytes, in the database or
    // its write-ahead log.
    let encoded = secret.trim_start_matches("whsec_");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64");
    for file in [db.clone(), dir.path().join("registry.db-wal")] {
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        assert!(
            !bytes
                .windows(encoded.len())
                .any(|w| w == encoded.as_bytes()),
            "{} holds the secret in base64",
            file.display()
        );
        assert!(
            !bytes.windows(raw.len()).any(|w| w == raw.as_slice()),
            "{} holds the raw secret",
            file.display()
        );
    }

    // The same key file: the same secret after a restart.
    let server = Server::start(registry(&db, &key_file, hour, hour));
    assert_eq!(issued_secret(&server, fingerprint), secret);
    drop(server);

    // Another key file: the registry refuses to start, and says why.
    let other = dir.path().join("other.key");
    let authority = KeyAuthority::load_or_create(&other).expect("new key file");
    let refused = Registry::open(&db)
        .expect("open")
        .issue_keys(authority)
        .err()
        .expect("a wrong key file is refused");
    assert!(
        matches!(refused, KeyError::WrongKeyFile { .. }),
        "{refused}"
    );
    let message = refused.to_string();
    assert!(message.contains("cannot decrypt"), "{message}");
    assert!(message.contains("other.key"), "{message}");
}

#[test]
fn the_binary_refuses_to_start_with_another_key_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    {
        let _registry = registry(
            &db,
            &dir.path().join("registry.key"),
            Duration::from_secs(3600),
            Duration::from_secs(60),
        );
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--issue-keys",
            "--key-file",
        ])
        .arg(dir.path().join("other.key"))
        .arg("--db")
        .arg(&db)
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot decrypt the issued keys"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "it never listened");
}

#[test]
fn providers_are_issued_the_registrys_command_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let command = rfidl_runtime::signing::Secret::generate();
    let authority = KeyAuthority::load_or_create(&dir.path().join("registry.key"))
        .expect("key file")
        .command_secret(command.clone());
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .publish_token(PUBLISH)
            .registration_token(HR_TOKEN)
            .registration_token(ENGINE_TOKEN)
            .issue_keys(authority)
            .expect("issue keys"),
    );
    let fingerprint = publish(&server);
    let register = |service: &str, token: &str, body: Value| -> Value {
        let (status, text) = post(
            &format!("{}/v1/services/{service}/instances", server.url),
            token,
            &body,
        );
        assert_eq!(status, 201, "{text}");
        serde_json::from_str(&text).expect("json")
    };
    let provider = register(
        "hr",
        HR_TOKEN,
        json!({"baseUrl": "http://127.0.0.1:7001", "hosts": [emp_v1(fingerprint)]}),
    );
    let source = rfidl_runtime::lifecycle::DEFAULT_REGISTRY_SOURCE;
    assert_eq!(provider["keys"]["peers"][source][0], command.to_whsec());
    let caller = register(
        "engine",
        ENGINE_TOKEN,
        json!({"baseUrl": "http://127.0.0.1:7002", "calls": [emp_v1(fingerprint)]}),
    );
    assert!(caller["keys"]["peers"].get(source).is_none(), "{caller}");
    assert!(caller["keys"]["peers"].get("hr").is_some(), "{caller}");
}
