//! The service directory on a real registry (SQLite file, HTTP on
//! loopback): registration, heartbeat, the manifest scan and the
//! deploy check, and every bad input answered with its documented 4xx and
//! nothing stored.

use rfidl_codegen::manifest::Manifest;
use rfidl_registry::Registry;
use serde_json::{Value, json};

use crate::support::{Server, compatible_revision, manifest_path, put, schema_manifest};

fn send(
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::blocking::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn post(url: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
    send(reqwest::Method::POST, url, Some(body), token)
}

fn reference(manifest: &Manifest) -> Value {
    json!({"interface": manifest.interface, "version": manifest.version, "fingerprint": manifest.fingerprint})
}

fn publish(server: &Server, manifest: &Manifest) {
    let (status, body) = put(
        &server.url,
        &manifest_path(manifest),
        manifest.to_pretty_json(),
        None,
    );
    assert!(status == 201 || status == 200, "{status} {body}");
}

fn services(server: &Server) -> Value {
    let (status, body) = send(
        reqwest::Method::GET,
        &format!("{}/v1/services", server.url),
        None,
        None,
    );
    assert_eq!(status, 200, "{body}");
    body
}

fn fresh() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    (dir, server)
}

#[test]
fn an_instance_registers_renews_and_heartbeats() {
    let (_dir, server) = fresh();
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    publish(&server, &v1);
    let url = format!("{}/v1/services/hr/instances", server.url);
    let registration = json!({"baseUrl": "http://127.0.0.1:7001/", "hosts": [reference(&v1)]});
    let (status, first) = post(&url, &registration, None);
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["created"], true);
    assert_eq!(
        first["baseUrl"], "http://127.0.0.1:7001",
        "trailing / dropped"
    );
    let id = first["instanceId"].as_str().expect("id").to_owned();
    assert_eq!(id.len(), 16);
    // Again (a restart): same id, 200.
    let (status, again) = post(&url, &registration, None);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["instanceId"], id.as_str());
    assert_eq!(again["created"], false);

    let listed = services(&server);
    let instances = &listed["services"][0]["instances"];
    assert_eq!(listed["services"][0]["service"], "hr");
    assert_eq!(instances.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(instances[0]["hosts"][0], reference(&v1));
    assert_eq!(instances[0]["health"], Value::Null, "not polled yet");
    let seen_before = instances[0]["lastSeenAt"].clone();

    std::thread::sleep(std::time::Duration::from_millis(5));
    let (status, beat) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/services/hr/instances/{id}/heartbeat", server.url),
        None,
        None,
    );
    assert_eq!(status, 200, "{beat}");
    let seen_after = services(&server)["services"][0]["instances"][0]["lastSeenAt"].clone();
    assert_ne!(seen_before, seen_after, "a heartbeat moves lastSeenAt");

    // Deregistered: gone, and its heartbeat is 404 from then on.
    let instance_url = format!("{}/v1/services/hr/instances/{id}", server.url);
    assert_eq!(
        send(reqwest::Method::DELETE, &instance_url, None, None).0,
        204
    );
    assert_eq!(services(&server), json!({"services": []}));
    let (status, answer) = send(reqwest::Method::DELETE, &instance_url, None, None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (404, Some("unknown_instance"))
    );
    let (status, _) = send(
        reqwest::Method::PUT,
        &format!("{instance_url}/heartbeat"),
        None,
        None,
    );
    assert_eq!(status, 404);
}

#[test]
fn bad_registrations_and_heartbeats_get_their_code_and_store_nothing() {
    let (_dir, server) = fresh();
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    publish(&server, &v1);
    let url = format!("{}/v1/services/hr/instances", server.url);
    let mut unknown = reference(&v1);
    unknown["interface"] = json!("hr.employees.Nobody");
    let mut unknown_revision = reference(&v1);
    unknown_revision["fingerprint"] = json!("sha256:00");
    let cases: Vec<(String, Value, u16, &str)> = vec![
        (
            url.clone(),
            json!({"baseUrl": "http://127.0.0.1:1", "hosts": [unknown]}),
            422,
            "unknown_interface",
        ),
        (
            url.clone(),
            json!({"baseUrl": "http://127.0.0.1:1", "hosts": [unknown_revision]}),
            422,
            "unknown_interface",
        ),
        (
            url.clone(),
            json!({"baseUrl": "ftp://127.0.0.1:1"}),
            422,
            "invalid_registration",
        ),
        (
            url.clone(),
            json!({"baseUrl": "not a url"}),
            422,
            "invalid_registration",
        ),
        (
            url.clone(),
            json!({"baseUrl": "http://127.0.0.1:1?x=1"}),
            422,
            "invalid_registration",
        ),
        (
            url.clone(),
            json!({"baseUrl": "http://127.0.0.1:1", "surprise": 1}),
            422,
            "invalid_registration",
        ),
        (
            url.clone(),
            json!({"hosts": []}),
            422,
            "invalid_registration",
        ),
        (
            url.clone(),
            json!({"baseUrl": "http://127.0.0.1:1", "diagnosticsToken": ""}),
            422,
            "invalid_registration",
        ),
        (
            format!("{}/v1/services/h%20r/instances", server.url),
            json!({"baseUrl": "http://127.0.0.1:1"}),
            400,
            "bad_request",
        ),
    ];
    for (url, body, want, code) in &cases {
        let (status, answer) = post(url, body, None);
        assert_eq!(
            (status, answer["error"].as_str()),
            (*want, Some(*code)),
            "{body}: {answer}"
        );
    }
    // Not JSON at all.
    let raw = reqwest::blocking::Client::new()
        .post(&url)
        .body("{")
        .send()
        .expect("post");
    assert_eq!(raw.status().as_u16(), 422);
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!(
            "{}/v1/services/hr/instances/0123456789abcdef/heartbeat",
            server.url
        ),
        None,
        None,
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (404, Some("unknown_instance")),
        "{answer}"
    );
    let (status, answer) = send(reqwest::Method::DELETE, &url, None, None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (405, Some("method_not_allowed"))
    );
    assert_eq!(services(&server), json!({"services": []}), "nothing stored");
}

#[test]
fn registration_and_heartbeat_need_a_registration_token_when_one_is_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .publish_token("publish-only")
            .registration_token("s3cret"),
    );
    let url = format!("{}/v1/services/hr/instances", server.url);
    let body = json!({"baseUrl": "http://127.0.0.1:9"});
    assert_eq!(post(&url, &body, None).0, 401);
    assert_eq!(post(&url, &body, Some("wrong")).0, 401);
    assert_eq!(
        post(&url, &body, Some("publish-only")).0,
        401,
        "not the publish token"
    );
    let (status, registered) = post(&url, &body, Some("s3cret"));
    assert_eq!(status, 201, "{registered}");
    let beat = format!(
        "{}/v1/services/hr/instances/{}/heartbeat",
        server.url,
        registered["instanceId"].as_str().unwrap()
    );
    assert_eq!(send(reqwest::Method::PUT, &beat, None, None).0, 401);
    assert_eq!(
        send(reqwest::Method::PUT, &beat, None, Some("s3cret")).0,
        200
    );
}

#[test]
fn the_manifest_scan_refuses_consumers_without_a_compatible_provider() {
    let (_dir, server) = fresh();
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    let v1r2 = compatible_revision(&v1, "note");
    publish(&server, &v1);
    publish(&server, &v1r2);
    let check = format!("{}/v1/deploy-check", server.url);
    let consumer = format!("{}/v1/services/engine/instances", server.url);
    let mut unpublished = reference(&v1);
    unpublished["fingerprint"] = json!("sha256:00");

    // No provider at all.
    let (status, answer) = post(&check, &json!({"calls": [reference(&v1)]}), None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("unsatisfied_dependencies"))
    );
    assert_eq!(answer["missing"][0]["reason"], "no_provider", "{answer}");
    let (status, answer) = post(
        &consumer,
        &json!({"baseUrl": "http://127.0.0.1:7002", "calls": [reference(&v1)]}),
        None,
    );
    assert_eq!(
        (status, answer["missing"][0]["reason"].as_str()),
        (409, Some("no_provider"))
    );
    assert_eq!(
        services(&server),
        json!({"services": []}),
        "a refused consumer is not stored"
    );

    // A provider of revision 1 satisfies revision 1, not revision 2.
    let provider = format!("{}/v1/services/hr/instances", server.url);
    let (status, _) = post(
        &provider,
        &json!({"baseUrl": "http://127.0.0.1:7001", "hosts": [reference(&v1)]}),
        None,
    );
    assert_eq!(status, 201);
    assert_eq!(
        post(&check, &json!({"calls": [reference(&v1)]}), None).0,
        200
    );
    let (status, answer) = post(
        &check,
        &json!({"calls": [reference(&v1r2), unpublished]}),
        None,
    );
    assert_eq!(status, 409, "{answer}");
    let reasons: Vec<&str> = answer["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["older_provider", "not_published"], "{answer}");

    // The provider upgrades to revision 2: both locks are satisfied.
    assert_eq!(
        post(
            &provider,
            &json!({"baseUrl": "http://127.0.0.1:7001", "hosts": [reference(&v1r2)]}),
            None
        )
        .0,
        200
    );
    let (status, answer) = post(
        &check,
        &json!({"calls": [reference(&v1), reference(&v1r2)]}),
        None,
    );
    assert_eq!(
        (status, answer["satisfied"].as_bool()),
        (200, Some(true)),
        "{answer}"
    );
    let (status, answer) = post(
        &consumer,
        &json!({"baseUrl": "http://127.0.0.1:7002", "calls": [reference(&v1r2)]}),
        None,
    );
    assert_eq!(status, 201, "{answer}");
    // A bad deploy-check body.
    let (status, answer) = post(&check, &json!({"call": []}), None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("invalid_registration"))
    );
}

#[test]
fn odd_dashboard_queries_are_400_and_the_page_is_html() {
    let (_dir, server) = fresh();
    for query in [
        "hours=0",
        "hours=49",
        "hours=25",
        "hours=abc",
        "hours=-1",
        "foo=1",
        "hours=1&hours=2",
        "hours=%FF",
    ] {
        let response = reqwest::blocking::get(format!("{}/?{query}", server.url)).expect("get");
        let status = response.status().as_u16();
        let body: Value = response.json().unwrap_or(Value::Null);
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("bad_request")),
            "?{query}: {body}"
        );
    }
    // More hours than the 24 of health history kept: a 400 that says so,
    // at the boundary and far past it (issue 30).
    for hours in [25, 48] {
        let response =
            reqwest::blocking::get(format!("{}/?hours={hours}", server.url)).expect("get");
        assert_eq!(response.status().as_u16(), 400);
        let body: Value = response.json().expect("json");
        assert_eq!(body["error"], "bad_request", "{body}");
        assert_eq!(
            body["message"],
            format!(
                "`hours={hours}` is more than the 24 hours of health history the registry \
                 keeps: give 1 to 24"
            ),
            "{body}"
        );
    }
    for hours in [1, 24] {
        let response =
            reqwest::blocking::get(format!("{}/?hours={hours}", server.url)).expect("get");
        assert_eq!(response.status().as_u16(), 200, "?hours={hours}");
    }
    let response = reqwest::blocking::get(format!("{}/?hours=2", server.url)).expect("get");
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let page = response.text().unwrap();
    assert!(page.contains("http-equiv=\"refresh\""), "{page}");
    assert!(page.contains("No service has registered yet"), "{page}");
    assert!(!page.contains("<script"), "no JavaScript");
}

/// The runtime's registration client against this registry: a consumer
/// that starts before its provider registers what it hosts, keeps trying
/// the full registration, and gets it once the provider is there; an
/// instance the registry forgot registers again on its next heartbeat.
#[test]
fn the_runtime_client_registers_waits_for_its_provider_and_re_registers() {
    use rfidl_runtime::directory::{DirectoryClient, InterfaceRef, Registration, RegistryConfig};

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let server = Server::start(
        Registry::open(&db)
            .expect("open")
            .publish_token("t0k")
            .registration_token("t0k"),
    );
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    let (status, _) = put(
        &server.url,
        &manifest_path(&v1),
        v1.to_pretty_json(),
        Some("t0k"),
    );
    assert_eq!(status, 201);
    let emp = InterfaceRef {
        interface: v1.interface.clone(),
        version: 1,
        fingerprint: v1.fingerprint.clone(),
    };
    let config = RegistryConfig::new(server.url.clone())
        .with_token("t0k")
        .with_heartbeat(std::time::Duration::from_millis(100));
    let client = |service: &str, port: u16, hosts: Vec<InterfaceRef>, calls: Vec<InterfaceRef>| {
        DirectoryClient::new(
            config.clone(),
            Registration {
                service_id: service.into(),
                base_url: format!("http://127.0.0.1:{port}"),
                hosts,
                calls,
                diagnostics_token: None,
            },
        )
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let within = std::time::Duration::from_secs(10);
    rt.block_on(async {
        let (engine_task, mut engine) = client("engine", 7002, vec![], vec![emp.clone()]).spawn();
        // Refused for now: registered without its calls, the reason kept.
        let state = tokio::time::timeout(within, engine.wait_for(|s| s.instance_id.is_some()))
            .await
            .expect("registered in time")
            .expect("state")
            .clone();
        assert!(!state.complete);
        assert!(
            state.last_error.as_deref().unwrap_or("").contains("no registered service hosts"),
            "{state:?}"
        );
        let (hr_task, mut hr) = client("hr", 7001, vec![emp.clone()], vec![]).spawn();
        tokio::time::timeout(within, hr.wait_for(|s| s.complete))
            .await
            .expect("hr registered")
            .expect("state");
        tokio::time::timeout(within, engine.wait_for(|s| s.complete))
            .await
            .expect("engine registered with its calls once hr is there")
            .expect("state");
        let id = engine.borrow().instance_id.clone().expect("id");

        // The registry forgets the engine (a restored database): the next
        // heartbeat gets 404 unknown_instance and registers again.
        let conn = rusqlite::Connection::open(&db).expect("open");
        conn.execute("PRAGMA foreign_keys = ON", []).expect("fk");
        assert_eq!(
            conn.execute("DELETE FROM instances WHERE instance_id = ?1", [&id])
                .expect("delete"),
            1
        );
        let back = tokio::time::timeout(within, async {
            loop {
                let count: i64 = conn
                    .query_row(
                        "SELECT COUNT(*) FROM instance_interfaces WHERE instance_id = ?1 AND role = 'calls'",
                        [&id],
                        |row| row.get(0),
                    )
                    .expect("count");
                if count == 1 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(back.is_ok(), "the engine registered again with its calls");
        engine_task.abort();
        hr_task.abort();
    });
    let listed = services(&server);
    assert_eq!(listed["services"].as_array().unwrap().len(), 2, "{listed}");
}

/// The binary runs the aggregator every `--health-interval`: an instance
/// on a closed port turns critical without anyone asking; a bad interval
/// is a usage error (exit 2).
#[test]
fn the_binary_polls_every_health_interval_and_refuses_a_bad_one() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    for bad in ["soon", "0s", "50ms"] {
        let output = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--health-interval",
                bad,
                "--db",
            ])
            .arg(&db)
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--health-interval"),
            "{bad}"
        );
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--health-interval",
            "200ms",
            "--db",
        ])
        .arg(&db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let url = lines
        .next()
        .expect("a line")
        .expect("read")
        .strip_prefix("listening on ")
        .expect("listening on")
        .to_owned();
    assert_eq!(
        lines.next().expect("a line").expect("read"),
        format!("dashboard: {url}/")
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let (status, _) = post(
        &format!("{url}/v1/services/engine/instances"),
        &json!({"baseUrl": format!("http://{closed}")}),
        None,
    );
    assert_eq!(status, 201);
    let started = std::time::Instant::now();
    let health = loop {
        let (_, listed) = send(
            reqwest::Method::GET,
            &format!("{url}/v1/services"),
            None,
            None,
        );
        let health = listed["services"][0]["instances"][0]["health"].clone();
        if !health.is_null() || started.elapsed() > std::time::Duration::from_secs(10) {
            break health;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(health["status"], "critical", "{health}");
    eprintln!("first health check after {:?}", started.elapsed());
}

/// A service publishing what it hosts on registration
/// (`DirectoryClient::publish_on_registration`): the registry runs the
/// checks of `rfidl publish` on each manifest (a wrong token is 401, a
/// tampered manifest 422 `fingerprint_mismatch`, nothing stored), and once
/// they are published the service registers as their host; the
/// registration says its heartbeat interval.
#[test]
fn the_runtime_client_publishes_what_it_hosts_with_the_same_checks_as_rfidl_publish() {
    use rfidl_runtime::directory::{
        DirectoryClient, DirectoryError, InterfaceRef, PublishOnRegistration, Registration,
        RegistryConfig,
    };

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    // A closed registry: the publish token publishes, the registration
    // credential registers.
    let server = Server::start(
        Registry::open(&db)
            .expect("open")
            .publish_token("t0k")
            .registration_token("reg"),
    );
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    let mut tampered = compatible_revision(&v1, "extra");
    tampered.fingerprint = v1.fingerprint.clone();
    let client = |token: &str, manifests: Vec<String>| {
        DirectoryClient::new(
            RegistryConfig::new(server.url.clone())
                .with_token("reg")
                .with_heartbeat(std::time::Duration::from_millis(1500)),
            Registration {
                service_id: "hr".into(),
                base_url: "http://127.0.0.1:7001".into(),
                hosts: vec![InterfaceRef {
                    interface: v1.interface.clone(),
                    version: 1,
                    fingerprint: v1.fingerprint.clone(),
                }],
                calls: vec![],
                diagnostics_token: None,
            },
        )
        .publish_on_registration(PublishOnRegistration {
            token: token.into(),
            manifests,
        })
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let refused = |result: Result<(), DirectoryError>| match result {
            Err(DirectoryError::Refused { status, code, .. }) => (status, code),
            other => panic!("{other:?}"),
        };
        let wrong = client("not-it", vec![v1.to_pretty_json()]);
        assert_eq!(
            refused(wrong.publish_manifests().await),
            (401, "unauthorized".to_owned())
        );
        let bad = client("t0k", vec![tampered.to_pretty_json()]);
        assert_eq!(
            refused(bad.publish_manifests().await),
            (422, "fingerprint_mismatch".to_owned())
        );
        // Still not published: the registration is refused.
        assert!(matches!(
            bad.register(true).await,
            Err(DirectoryError::Refused { status: 422, .. })
        ));
        let good = client("t0k", vec![v1.to_pretty_json()]);
        let (task, mut state) = good.spawn();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            state.wait_for(|s| s.complete),
        )
        .await
        .expect("registered in time")
        .expect("state");
        task.abort();
    });
    let (status, _) = crate::support::get(&server.url, &manifest_path(&v1));
    assert_eq!(status, 200, "published by the service");
    let conn = rusqlite::Connection::open(&db).expect("open");
    let (revisions, heartbeat_ms): (i64, Option<i64>) = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM manifests), heartbeat_ms FROM instances",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("read");
    assert_eq!((revisions, heartbeat_ms), (1, Some(1500)));
}
