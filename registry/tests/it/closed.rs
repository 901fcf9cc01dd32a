//! A registry closed by default (issue 26): the separate credentials, an
//! instance bound to the credential that registered it (the `hosts: []`
//! hijack refused), credential rotation, heartbeats that carry the
//! registration's digest (a change behind an instance's back is put back),
//! and the open binary refusing a non-loopback address. Bounded reads and
//! forgery: `bounded.rs`.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rfidl_registry::Registry;
use serde_json::{Value, json};

use crate::support::{Server, manifest_path, put, schema_manifest};

pub(crate) fn send(
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut request = reqwest::blocking::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    )
}

pub(crate) fn register(
    server: &Server,
    service: &str,
    body: &Value,
    token: Option<&str>,
) -> (u16, Value) {
    let url = format!("{}/v1/services/{service}/instances", server.url);
    let (status, answer, _) = send(reqwest::Method::POST, &url, Some(body), token);
    (status, answer)
}

fn heartbeat(
    server: &Server,
    service: &str,
    id: &str,
    digest: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    let url = format!(
        "{}/v1/services/{service}/instances/{id}/heartbeat",
        server.url
    );
    let body = digest.map(|d| json!({ "registrationDigest": d }));
    let (status, answer, _) = send(reqwest::Method::PUT, &url, body.as_ref(), token);
    (status, answer)
}

/// The hosts the registry lists for the one instance of `service`.
fn hosts_of(server: &Server, service: &str) -> Value {
    let (_, listed, _) = send(
        reqwest::Method::GET,
        &format!("{}/v1/services", server.url),
        None,
        None,
    );
    listed["services"]
        .as_array()
        .expect("services")
        .iter()
        .find(|s| s["service"] == service)
        .map(|s| s["instances"][0]["hosts"].clone())
        .unwrap_or(Value::Null)
}

fn emp_v1() -> (rfidl_codegen::manifest::Manifest, Value) {
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    let reference = json!({"interface": v1.interface, "version": 1, "fingerprint": v1.fingerprint});
    (v1, reference)
}

// ---------------------------------------------------------------------
// Credentials and the binding of an instance to its credential.

/// The finding: re-registering a running instance's base URL with
/// `hosts: []` was accepted (`created: false`) and stayed so. Now another
/// credential gets 403 `instance_owned` and nothing changes.
#[test]
fn a_registration_by_another_credential_cannot_hijack_an_instance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .publish_token("pub")
            .registration_token("hr-credential")
            .registration_token("someone-else"),
    );
    let (v1, emp) = emp_v1();
    assert_eq!(
        put(
            &server.url,
            &manifest_path(&v1),
            v1.to_pretty_json(),
            Some("pub")
        )
        .0,
        201
    );
    let real =
        json!({"baseUrl": "http://127.0.0.1:7001", "hosts": [emp], "diagnosticsToken": "diag"});
    let (status, registered) = register(&server, "hr", &real, Some("hr-credential"));
    assert_eq!(status, 201, "{registered}");
    let id = registered["instanceId"].as_str().expect("id").to_owned();
    let digest = registered["registrationDigest"]
        .as_str()
        .expect("digest")
        .to_owned();
    assert!(digest.starts_with("sha256:"), "{digest}");

    for hijack in [
        json!({"baseUrl": "http://127.0.0.1:7001", "hosts": []}),
        json!({"baseUrl": "http://127.0.0.1:7001/", "hosts": [emp]}),
        // Even an identical one: the owner's credential is still accepted.
        real.clone(),
    ] {
        let (status, answer) = register(&server, "hr", &hijack, Some("someone-else"));
        assert_eq!(
            (status, answer["error"].as_str()),
            (403, Some("instance_owned")),
            "{hijack}: {answer}"
        );
    }
    assert_eq!(hosts_of(&server, "hr"), json!([emp]), "unchanged");
    let (status, answer) = heartbeat(&server, "hr", &id, None, Some("someone-else"));
    assert_eq!(
        (status, answer["error"].as_str()),
        (403, Some("instance_owned"))
    );

    // The owner renews and changes it as before; a stale digest is answered
    // 409 registration_changed (the runtime then registers again).
    assert_eq!(
        heartbeat(&server, "hr", &id, Some(&digest), Some("hr-credential")).0,
        200
    );
    assert_eq!(
        heartbeat(&server, "hr", &id, None, Some("hr-credential")).0,
        200
    );
    let (status, answer) = register(
        &server,
        "hr",
        &json!({"baseUrl": "http://127.0.0.1:7001", "hosts": []}),
        Some("hr-credential"),
    );
    assert_eq!((status, answer["created"].as_bool()), (200, Some(false)));
    let (status, answer) = heartbeat(&server, "hr", &id, Some(&digest), Some("hr-credential"));
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("registration_changed")),
        "{answer}"
    );
    let (status, answer) = heartbeat(&server, "hr", &id, Some("sha256:00"), Some("hr-credential"));
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("registration_changed"))
    );
    // The credential is never stored: only its SHA-256.
    let conn = rusqlite::Connection::open(dir.path().join("registry.db")).expect("open");
    let owner: String = conn
        .query_row("SELECT credential_sha256 FROM instance_owners", [], |row| {
            row.get(0)
        })
        .expect("owner");
    assert!(owner.starts_with("sha256:") && !owner.contains("hr-credential"));
}

/// Rotating credentials: once the owner's credential is retired (no longer
/// configured), an identical registration with the new one re-binds the
/// instance; a changed one is still refused.
#[test]
fn a_retired_credential_hands_its_instances_over_only_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let body = json!({"baseUrl": "http://127.0.0.1:7001", "diagnosticsToken": "diag"});
    {
        let old = Server::start(Registry::open(&db).expect("open").registration_token("old"));
        assert_eq!(register(&old, "hr", &body, Some("old")).0, 201);
    }
    let new = Server::start(Registry::open(&db).expect("open").registration_token("new"));
    let mut changed = body.clone();
    changed["diagnosticsToken"] = json!("attacker");
    let (status, answer) = register(&new, "hr", &changed, Some("new"));
    assert_eq!(
        (status, answer["error"].as_str()),
        (403, Some("instance_owned"))
    );
    let (status, answer) = register(&new, "hr", &body, Some("new"));
    assert_eq!(status, 200, "{answer}");
    let (status, _) = register(&new, "hr", &changed, Some("new"));
    assert_eq!(status, 200, "the new owner may change it");
}

/// On an open (dev) registry a hijack by the same (absent) credential is
/// possible, but it does not stay: the real instance's next heartbeat
/// carries the digest of its own registration, is answered 409
/// `registration_changed`, and the runtime registers again.
#[test]
fn the_runtime_restores_a_registration_changed_behind_its_back() {
    use rfidl_runtime::directory::{DirectoryClient, InterfaceRef, Registration, RegistryConfig};

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(Registry::open(&dir.path().join("registry.db")).expect("open"));
    let (v1, emp) = emp_v1();
    assert_eq!(
        put(&server.url, &manifest_path(&v1), v1.to_pretty_json(), None).0,
        201
    );
    let client = DirectoryClient::new(
        RegistryConfig::new(server.url.clone()).with_heartbeat(Duration::from_millis(100)),
        Registration {
            service_id: "hr".into(),
            base_url: "http://127.0.0.1:7001".into(),
            hosts: vec![InterfaceRef {
                interface: v1.interface.clone(),
                version: 1,
                fingerprint: v1.fingerprint.clone(),
            }],
            calls: vec![],
            diagnostics_token: Some("diag".into()),
        },
    );
    // The client runs on the runtime's workers while this thread plays
    // the attacker with blocking requests.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (task, mut state) = rt.block_on(async { client.spawn() });
    rt.block_on(async {
        let state = tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| s.complete))
            .await
            .expect("registered")
            .expect("state")
            .clone();
        assert!(state.registration_digest.is_some(), "{state:?}");
    });
    assert_eq!(hosts_of(&server, "hr"), json!([emp]));
    let (status, answer) = register(
        &server,
        "hr",
        &json!({"baseUrl": "http://127.0.0.1:7001", "hosts": []}),
        None,
    );
    assert_eq!((status, answer["created"].as_bool()), (200, Some(false)));
    // Within a few heartbeats (100 ms) the instance has put itself back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hosts_of(&server, "hr") != json!([emp]) {
        assert!(
            std::time::Instant::now() < deadline,
            "the heartbeats never restored the registration"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    task.abort();
}

/// Each operation takes its own credential, and a closed registry refuses
/// what it has no credential for (403 `operation_disabled`).
#[test]
fn operator_publish_and_registration_credentials_are_separate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .publish_token("pub")
            .registration_token("reg")
            .operator_token("op"),
    );
    let (v1, _) = emp_v1();
    let path = manifest_path(&v1);
    for wrong in [None, Some("op"), Some("reg")] {
        assert_eq!(put(&server.url, &path, v1.to_pretty_json(), wrong).0, 401);
    }
    assert_eq!(
        put(&server.url, &path, v1.to_pretty_json(), Some("pub")).0,
        201
    );
    let (status, registered) = register(
        &server,
        "hr",
        &json!({"baseUrl": "http://127.0.0.1:7001"}),
        Some("reg"),
    );
    assert_eq!(status, 201);
    let instance = format!(
        "{}/v1/services/hr/instances/{}",
        server.url,
        registered["instanceId"].as_str().expect("id")
    );
    let decommission = format!(
        "{}/v1/decommissioned/hr.employees.EmpService/v1",
        server.url
    );
    for wrong in [None, Some("pub"), Some("reg")] {
        let (status, answer, headers) = send(reqwest::Method::PUT, &decommission, None, wrong);
        assert_eq!(
            (status, answer["error"].as_str()),
            (401, Some("unauthorized"))
        );
        assert!(
            answer["message"]
                .as_str()
                .unwrap_or("")
                .contains("operator token")
        );
        assert_eq!(headers.get_all("www-authenticate").iter().count(), 2);
        assert_eq!(send(reqwest::Method::DELETE, &instance, None, wrong).0, 401);
    }
    assert_eq!(
        send(reqwest::Method::PUT, &decommission, None, Some("op")).0,
        200
    );
    assert_eq!(
        send(reqwest::Method::DELETE, &decommission, None, Some("op")).0,
        200
    );
    assert_eq!(
        send(reqwest::Method::DELETE, &instance, None, Some("op")).0,
        204
    );

    // Only a publish token: registrations and operator actions are off.
    let publish_only = Server::start(
        Registry::open(&dir.path().join("other.db"))
            .expect("open")
            .publish_token("pub"),
    );
    let (status, answer) = register(
        &publish_only,
        "hr",
        &json!({"baseUrl": "http://127.0.0.1:7001"}),
        Some("pub"),
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (403, Some("operation_disabled")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or("")
            .contains("--registration-token-file")
    );
    let (status, answer, _) = send(
        reqwest::Method::PUT,
        &format!(
            "{}/v1/decommissioned/hr.employees.EmpService/v1",
            publish_only.url
        ),
        None,
        Some("pub"),
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (403, Some("operation_disabled"))
    );
}

// ---------------------------------------------------------------------
// The binary: closed by default.

fn registry_binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"));
    for var in [
        "RFIDL_REGISTRY_DB",
        "RFIDL_REGISTRY_LISTEN",
        "RFIDL_REGISTRY_TOKEN",
        "RFIDL_REGISTRY_TOKEN_FILE",
        "RFIDL_REGISTRY_OPERATOR_TOKEN",
        "RFIDL_REGISTRY_OPERATOR_TOKEN_FILE",
        "RFIDL_REGISTRY_REGISTRATION_TOKEN",
        "RFIDL_REGISTRY_REGISTRATION_TOKEN_FILE",
        "RFIDL_REGISTRY_ALLOW_NETWORKS",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command
}

/// Starts the binary with `args`; its first stdout line and, after a kill,
/// its stderr.
fn first_line_and_stderr(db: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut command = registry_binary();
    command
        .args(["serve", "--db"])
        .arg(db)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("start rfidl-registry");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    (line, stderr)
}

#[test]
fn an_open_registry_refuses_to_listen_beyond_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let output = registry_binary()
            .args(["serve", "--listen", listen, "--db"])
            .arg(&db)
            .output()
            .expect("run");
        assert!(!output.status.success(), "{listen}: started open");
        assert!(output.stdout.is_empty(), "{listen}: it never listened");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("refusing to listen on {listen}"))
                && stderr.contains("--operator-token-file"),
            "{stderr}"
        );
    }
    // On loopback it starts, and says that it is open.
    let (line, stderr) = first_line_and_stderr(&db, &["--listen", "127.0.0.1:0"], &[]);
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    assert!(stderr.contains("open to anyone"), "{stderr}");
    // With a credential it is closed and may listen anywhere; the
    // credentials never show, in --help or in the log.
    const SECRET: &str = "op-5e1f-never-print";
    let tokens = dir.path().join("registration.tokens");
    std::fs::write(
        &tokens,
        format!("# one per service\n{SECRET}-hr\n\n{SECRET}-engine\n"),
    )
    .expect("write");
    let (line, stderr) = {
        let path = tokens.to_str().expect("utf-8");
        first_line_and_stderr(
            &db,
            &["--listen", "0.0.0.0:0", "--registration-token-file", path],
            &[
                ("RFIDL_REGISTRY_OPERATOR_TOKEN", SECRET),
                ("RUST_LOG", "trace"),
            ],
        )
    };
    assert!(
        line.starts_with("listening on http://0.0.0.0:"),
        "{line} {stderr}"
    );
    assert!(!stderr.contains("open to anyone"), "{stderr}");
    assert!(!stderr.contains(SECRET), "{stderr}");
    let help = registry_binary()
        .args(["serve", "--help"])
        .env("RFIDL_REGISTRY_OPERATOR_TOKEN", SECRET)
        .env("RFIDL_REGISTRY_REGISTRATION_TOKEN", SECRET)
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("RFIDL_REGISTRY_OPERATOR_TOKEN"), "{help}");
    assert!(!help.contains(SECRET), "{help}");
}
