//! A registry closed by default against a hostile network (issue 26): the
//! separate credentials, an instance bound to the credential that
//! registered it (the `hosts: []` hijack refused), heartbeats that carry
//! the registration's digest, the open binary refusing a non-loopback
//! address, health and failed-list answers read up to a bound, redirects
//! not followed, the failed-list page behind the operator token, the
//! allow-list of networks and the registration rate limit. Every instance
//! here is a real HTTP server on 127.0.0.1.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use rfidl_registry::Registry;
use rfidl_registry::aggregator::{MAX_REASON_CHARS, MAX_REASONS, UNREACHABLE};
use serde_json::{Value, json};

use crate::support::{Server, manifest_path, put, schema_manifest};

fn send(
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

fn register(server: &Server, service: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
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
        RegistryConfig {
            url: server.url.clone(),
            token: None,
            heartbeat: Duration::from_millis(100),
        },
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

// ---------------------------------------------------------------------
// Bounded reads and no forgery.

/// A raw HTTP server that answers every request with a 200 whose body
/// (no length, until the connection closes) is `prefix` then `filler`
/// bytes up to `total`; counts the bytes it managed to write.
fn streaming_server(prefix: &'static str, total: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let written = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&written);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let counter = Arc::clone(&counter);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
                if stream.write_all(head.as_bytes()).is_err()
                    || stream.write_all(prefix.as_bytes()).is_err()
                {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                let mut sent = prefix.len();
                while sent < total {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                    sent += chunk.len();
                    counter.store(sent, Ordering::Relaxed);
                }
            });
        }
    });
    (url, written)
}

fn poll_once(registry: &Registry) {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(registry.poll_health_once(Duration::from_secs(5)))
        .expect("poll");
}

/// The stored reasons of the instance at `base_url` (its last check).
fn stored_check(db: &Path, base_url: &str) -> (String, String, i64) {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.query_row(
        "SELECT h.colour, h.reasons, length(h.reasons) FROM health_checks h \
         JOIN instances i ON i.instance_id = h.instance_id WHERE i.base_url = ?1 \
         ORDER BY h.id DESC LIMIT 1",
        [base_url],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
    .expect("a check")
}

/// The finding: a 30 MB health answer was stored every poll. Now at most
/// 64 KiB is read (critical, "larger than 64 KiB"), whether the instance
/// states its length (axum, 30 MB) or streams without one; and the reasons
/// of an answer under the bound are cut in count and length.
#[test]
fn health_answers_are_read_up_to_64_kib_and_reasons_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let registry = Registry::open(&db).expect("open");
    let server = Server::start(registry.clone());

    let huge = Arc::new(format!(
        "{{\"status\":\"healthy\",\"reasons\":[\"{}\"],\"outbox\":{{}}}}",
        "x".repeat(30 * 1024 * 1024)
    ));
    let stated = Server::serve(Router::new().route(
        "/_rf/health",
        get(move || {
            let huge = Arc::clone(&huge);
            async move {
                (
                    [("content-type", "application/json")],
                    huge.as_str().to_owned(),
                )
            }
        }),
    ));
    let (streamed, written) =
        streaming_server("{\"status\":\"healthy\",\"reasons\":[\"", 30 * 1024 * 1024);
    let many: Vec<String> = (0..100)
        .map(|i| format!("{i}:{}", "y".repeat(500)))
        .collect();
    let chatty_body = json!({"status": "warning", "reasons": many, "outbox": {}}).to_string();
    assert!(chatty_body.len() < 64 * 1024);
    let chatty = Server::serve(Router::new().route(
        "/_rf/health",
        get(move || {
            let body = chatty_body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    ));
    for (service, url) in [
        ("stated", &stated.url),
        ("streamed", &streamed),
        ("chatty", &chatty.url),
    ] {
        assert_eq!(
            register(&server, service, &json!({"baseUrl": url}), None).0,
            201
        );
    }
    let started = std::time::Instant::now();
    poll_once(&registry);
    let took = started.elapsed();
    for url in [&stated.url, &streamed] {
        let (colour, reasons, length) = stored_check(&db, url);
        assert_eq!(colour, "critical");
        assert_eq!(reasons, r#"["the health answer is larger than 64 KiB"]"#);
        assert!(length < 100);
    }
    let sent = written.load(Ordering::Relaxed);
    eprintln!(
        "one poll of three instances (two answering 30 MB): {took:?}; the streaming one wrote \
         {sent} bytes before the registry hung up"
    );
    assert!(sent < 30 * 1024 * 1024, "the registry read it all");
    let (colour, reasons, length) = stored_check(&db, &chatty.url);
    assert_eq!(colour, "warning");
    let reasons: Vec<String> = serde_json::from_str(&reasons).expect("json");
    assert_eq!(reasons.len(), MAX_REASONS + 1, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| r.chars().count() <= MAX_REASON_CHARS + 1)
    );
    assert_eq!(reasons[MAX_REASONS], "… and 84 more reason(s)");
    assert!(length < 6000, "{length}");
    // The dashboard stays small.
    let (status, page, _) = send(
        reqwest::Method::GET,
        &format!("{}/", server.url),
        None,
        None,
    );
    assert_eq!(status, 200);
    assert!(page.as_str().expect("html").len() < 64 * 1024);
}

/// The finding: the aggregator followed redirects to any host and port.
/// A 302 to another local port is an answer like any other: the second
/// server sees no request, and the instance shows as unreachable.
#[test]
fn redirects_are_not_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let registry = Registry::open(&db).expect("open");
    let server = Server::start(registry.clone());
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let target = Server::serve(Router::new().fallback(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            (
                [("content-type", "application/json")],
                r#"{"status":"healthy","outbox":{},"messages":[]}"#,
            )
        }
    }));
    let location = format!("{}/_rf/health", target.url);
    let failed_location = format!("{}/_rf/outbox/failed", target.url);
    let redirector = Server::serve(
        Router::new()
            .route(
                "/_rf/health",
                get(move || {
                    let location = location.clone();
                    async move { (axum::http::StatusCode::FOUND, [("location", location)]) }
                }),
            )
            .route(
                "/_rf/outbox/failed",
                get(move || {
                    let location = failed_location.clone();
                    async move {
                        (
                            axum::http::StatusCode::TEMPORARY_REDIRECT,
                            [("location", location)],
                        )
                    }
                }),
            ),
    );
    let (status, registered) = register(&server, "hr", &json!({"baseUrl": redirector.url}), None);
    assert_eq!(status, 201);
    poll_once(&registry);
    let (colour, reasons, _) = stored_check(&db, &redirector.url);
    assert_eq!(colour, "critical");
    assert_eq!(reasons, json!([UNREACHABLE]).to_string());
    let (status, answer, _) = send(
        reqwest::Method::GET,
        &format!(
            "{}/instances/{}/failed",
            server.url,
            registered["instanceId"].as_str().expect("id")
        ),
        None,
        None,
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (502, Some("instance_unreachable"))
    );
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the redirect was followed");
}

/// The finding: the dashboard's failed list bypassed each service's ops
/// token. Now it needs the registry's operator token (a bearer token, or
/// a browser's Basic password, which a 401 asks for), and it reads at most
/// 1 MiB from the instance.
#[test]
fn the_failed_list_page_needs_the_operator_token_and_reads_at_most_1_mib() {
    use base64::Engine as _;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .registration_token("reg")
            .operator_token("op"),
    );
    let instance = Server::serve(Router::new().route(
        "/_rf/outbox/failed",
        get(|| async { ([("content-type", "application/json")], r#"{"messages":[]}"#) }),
    ));
    let big = Server::serve(Router::new().route(
        "/_rf/outbox/failed",
        get(|| async {
            let filler = "z".repeat(2 * 1024 * 1024);
            (
                [("content-type", "application/json")],
                format!(r#"{{"messages":[],"pad":"{filler}"}}"#),
            )
        }),
    ));
    let page = |id: &Value, authorization: Option<&str>| {
        let mut request = reqwest::blocking::Client::new().get(format!(
            "{}/instances/{}/failed",
            server.url,
            id.as_str().expect("id")
        ));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let response = request.send().expect("page");
        let status = response.status().as_u16();
        let challenge: Vec<String> = response
            .headers()
            .get_all("www-authenticate")
            .iter()
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .collect();
        (status, challenge, response.text().expect("body"))
    };
    let (_, small) = register(
        &server,
        "hr",
        &json!({"baseUrl": instance.url}),
        Some("reg"),
    );
    let (_, large) = register(&server, "big", &json!({"baseUrl": big.url}), Some("reg"));
    for wrong in [None, Some("Bearer reg"), Some("Bearer wrong")] {
        let (status, challenge, body) = page(&small["instanceId"], wrong);
        assert_eq!(status, 401, "{wrong:?}: {body}");
        assert!(
            challenge.iter().any(|c| c.starts_with("Basic ")),
            "{challenge:?}"
        );
    }
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("anyone:op")
    );
    for right in ["Bearer op", basic.as_str()] {
        let (status, _, body) = page(&small["instanceId"], Some(right));
        assert_eq!(status, 200, "{right}: {body}");
        assert!(body.contains("Nothing needs a human"), "{body}");
    }
    let (status, _, body) = page(&large["instanceId"], Some("Bearer op"));
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("larger than 1 MiB"), "{body}");
}

/// Registrations of one service are rate-limited: 429 `rate_limited`
/// with `Retry-After`; another service is not affected.
#[test]
fn registrations_per_service_are_rate_limited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .registrations_per_minute(3),
    );
    for port in 1..=3 {
        let body = json!({"baseUrl": format!("http://127.0.0.1:{port}")});
        assert_eq!(register(&server, "hr", &body, None).0, 201);
    }
    let url = format!("{}/v1/services/hr/instances", server.url);
    let body = json!({"baseUrl": "http://127.0.0.1:4"});
    let (status, answer, headers) = send(reqwest::Method::POST, &url, Some(&body), None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (429, Some("rate_limited")),
        "{answer}"
    );
    let retry: u64 = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(
        register(
            &server,
            "engine",
            &json!({"baseUrl": "http://127.0.0.1:5"}),
            None
        )
        .0,
        201
    );
}

/// With an allow-list, a base URL outside it is refused (422
/// `network_not_allowed`), by address or by what its host name resolves to.
#[test]
fn registrations_outside_the_allowed_networks_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let only_ten = Server::start(
        Registry::open(&dir.path().join("a.db"))
            .expect("open")
            .allow_network("10.0.0.0/8".parse().expect("cidr")),
    );
    for url in [
        "http://127.0.0.1:7001",
        "http://[::1]:7001",
        "http://localhost:7001",
    ] {
        let (status, answer) = register(&only_ten, "hr", &json!({"baseUrl": url}), None);
        assert_eq!(
            (status, answer["error"].as_str()),
            (422, Some("network_not_allowed")),
            "{url}: {answer}"
        );
    }
    assert_eq!(
        register(
            &only_ten,
            "hr",
            &json!({"baseUrl": "http://10.1.2.3:7001"}),
            None
        )
        .0,
        201
    );
    let loopback = Server::start(
        Registry::open(&dir.path().join("b.db"))
            .expect("open")
            .allow_network("127.0.0.0/8".parse().expect("cidr"))
            .allow_network("::1".parse().expect("address")),
    );
    for url in [
        "http://127.0.0.1:7001",
        "http://[::1]:7001",
        "http://localhost:7001",
    ] {
        assert_eq!(
            register(&loopback, "hr", &json!({"baseUrl": url}), None).0,
            201,
            "{url}"
        );
    }
    // The aggregator's resolver lets a host name inside through.
    let db = dir.path().join("c.db");
    let registry = Registry::open(&db)
        .expect("open")
        .allow_network("127.0.0.0/8".parse().expect("cidr"))
        .allow_network("::1".parse().expect("address"));
    let server = Server::start(registry.clone());
    let instance = Server::serve(Router::new().route(
        "/_rf/health",
        get(|| async {
            (
                [("content-type", "application/json")],
                r#"{"status":"healthy","reasons":[],"outbox":{}}"#,
            )
        }),
    ));
    let by_name = instance.url.replace("127.0.0.1", "localhost");
    assert_eq!(
        register(&server, "hr", &json!({"baseUrl": by_name}), None).0,
        201
    );
    poll_once(&registry);
    assert_eq!(stored_check(&db, &by_name).0, "healthy");
}
