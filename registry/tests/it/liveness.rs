//! The active catalogue: an instance that misses its heartbeats is gone
//! (kept in the directory and on the dashboard, shown as gone) and no
//! longer counts as a provider for `POST /v1/deploy-check`, a consumer's
//! registration, the dashboard's totals or the health aggregator; a
//! heartbeat brings it back. And the aggregator as a process: one log line
//! per change of an instance's state, not one per poll.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rfidl_registry::Registry;
use serde_json::{Value, json};

use crate::support::{Server, manifest_path, put, schema_manifest};

fn post(url: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::blocking::Client::new()
        .post(url)
        .json(body)
        .send()
        .expect("post");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn heartbeat(server: &Server, service: &str, id: &str) -> u16 {
    reqwest::blocking::Client::new()
        .put(format!(
            "{}/v1/services/{service}/instances/{id}/heartbeat",
            server.url
        ))
        .send()
        .expect("heartbeat")
        .status()
        .as_u16()
}

fn deploy_check(server: &Server, calls: &Value) -> (u16, Value) {
    post(
        &format!("{}/v1/deploy-check", server.url),
        &json!({ "calls": calls }),
    )
}

fn dashboard(server: &Server) -> String {
    reqwest::blocking::get(format!("{}/", server.url))
        .expect("get")
        .text()
        .expect("page")
}

/// A registry with EmpService v1 published; the reference to it.
fn published(registry: Registry) -> (tempfile::TempDir, Server, Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let _ = &dir;
    let server = Server::start(registry);
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    assert_eq!(
        put(&server.url, &manifest_path(&v1), v1.to_pretty_json(), None).0,
        201
    );
    let calls = json!([{"interface": v1.interface, "version": 1, "fingerprint": v1.fingerprint}]);
    (dir, server, calls)
}

#[test]
fn a_provider_that_stops_heartbeating_is_gone_after_n_intervals_and_counts_again_when_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Three missed heartbeats of the instance's own 500 ms interval.
    let registry = Registry::open(&dir.path().join("registry.db"))
        .expect("open")
        .missed_heartbeats(3);
    let (_keep, server, refs) = published(registry.clone());
    let (status, registered) = post(
        &format!("{}/v1/services/hr/instances", server.url),
        &json!({"baseUrl": "http://127.0.0.1:9", "hosts": refs, "heartbeatMs": 500}),
    );
    assert_eq!(status, 201, "{registered}");
    let id = registered["instanceId"].as_str().expect("id").to_owned();
    let registered_at = Instant::now();
    assert_eq!(deploy_check(&server, &refs).0, 200);

    // Heartbeats every 200 ms for a second: it stays a provider.
    while registered_at.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(heartbeat(&server, "hr", &id), 200);
        assert_eq!(deploy_check(&server, &refs).0, 200, "heartbeating");
    }

    // Then none: after 3 × 500 ms it no longer satisfies the scan.
    let stopped = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(deploy_check(&server, &refs).0, 200, "1 missed: still there");
    while stopped.elapsed() < Duration::from_millis(1700) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, answer) = deploy_check(&server, &refs);
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["missing"][0]["reason"], "no_provider", "{answer}");
    assert!(
        answer["missing"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("missed their heartbeats")),
        "{answer}"
    );
    // A consumer's registration is refused the same way.
    let (status, answer) = post(
        &format!("{}/v1/services/engine/instances", server.url),
        &json!({"baseUrl": "http://127.0.0.1:10", "calls": refs}),
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("unsatisfied_dependencies")),
        "{answer}"
    );
    // Kept in the directory, shown as gone; not in the dashboard's totals.
    let listed: Value = reqwest::blocking::get(format!("{}/v1/services", server.url))
        .expect("get")
        .json()
        .expect("json");
    assert_eq!(
        listed["services"][0]["instances"][0]["gone"], true,
        "{listed}"
    );
    let page = dashboard(&server);
    assert!(page.contains("gone: <b>1</b>"), "{page}");
    assert!(page.contains("unknown: <b>0</b>"), "{page}");
    assert!(page.contains("data-status=\"gone\""), "{page}");
    // The aggregator does not poll it.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let asked = rt
        .block_on(registry.poll_health_once(Duration::from_secs(1)))
        .expect("poll");
    assert_eq!(asked, 0);

    // One heartbeat brings it back.
    assert_eq!(heartbeat(&server, "hr", &id), 200);
    assert_eq!(deploy_check(&server, &refs).0, 200, "back");
    let listed: Value = reqwest::blocking::get(format!("{}/v1/services", server.url))
        .expect("get")
        .json()
        .expect("json");
    assert_eq!(listed["services"][0]["instances"][0]["gone"], false);
    let page = dashboard(&server);
    assert!(page.contains("gone: <b>0</b>"), "{page}");
    assert!(page.contains("unknown: <b>1</b>"), "{page}");
}

#[test]
fn without_its_own_interval_an_instance_goes_by_the_registrys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::open(&dir.path().join("registry.db"))
        .expect("open")
        .heartbeat_interval(Duration::from_millis(400))
        .missed_heartbeats(2);
    let (_keep, server, refs) = published(registry);
    let (status, registered) = post(
        &format!("{}/v1/services/hr/instances", server.url),
        &json!({"baseUrl": "http://127.0.0.1:9", "hosts": refs}),
    );
    assert_eq!(status, 201, "{registered}");
    assert_eq!(deploy_check(&server, &refs).0, 200);
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(deploy_check(&server, &refs).0, 409, "gone after 2 × 400 ms");
    // Registering again brings it back too.
    let (status, _) = post(
        &format!("{}/v1/services/hr/instances", server.url),
        &json!({"baseUrl": "http://127.0.0.1:9", "hosts": refs}),
    );
    assert_eq!(status, 200);
    assert_eq!(deploy_check(&server, &refs).0, 200);
}

#[test]
fn a_heartbeat_interval_out_of_range_is_422() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    for odd in [
        json!(0),
        json!(99),
        json!(3_600_001),
        json!(-1),
        json!("1s"),
    ] {
        let (status, answer) = post(
            &format!("{}/v1/services/hr/instances", server.url),
            &json!({"baseUrl": "http://127.0.0.1:9", "heartbeatMs": odd}),
        );
        assert_eq!(
            (status, answer["error"].as_str()),
            (422, Some("invalid_registration")),
            "{odd}: {answer}"
        );
    }
}

/// `rfidl-registry serve` polling every 150 ms: an unreachable instance is
/// logged once when it turns critical, not at every poll; an instance that
/// stopped heartbeating is logged once when it goes.
#[test]
fn the_aggregator_logs_each_change_once_not_each_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stderr_path = dir.path().join("registry.stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("registry.db"))
        .args(["--health-interval", "150ms", "--missed-heartbeats", "2"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("start rfidl-registry");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", listener.local_addr().expect("addr"))
    };
    // Unreachable, but heartbeating often enough on paper (1 h).
    let (status, _) = post(
        &format!("{url}/v1/services/down/instances"),
        &json!({"baseUrl": closed, "heartbeatMs": 3_600_000}),
    );
    assert_eq!(status, 201);
    // Gone after 2 × 100 ms without a heartbeat.
    let (status, _) = post(
        &format!("{url}/v1/services/quiet/instances"),
        &json!({"baseUrl": "http://127.0.0.1:9", "heartbeatMs": 100}),
    );
    assert_eq!(status, 201);
    // About 13 polls.
    std::thread::sleep(Duration::from_secs(2));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(&stderr_path).expect("log");
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    let down = log
        .lines()
        .filter(|l| l.contains("instance not healthy") && l.contains(&closed))
        .count();
    assert_eq!(down, 1, "{log}");
    assert_eq!(count("instance gone"), 1, "{log}");
    assert!(
        log.contains("colour=\"critical\"") || log.contains("colour=critical"),
        "{log}"
    );
}

/// `--missed-heartbeats` takes 1 to 1000 (a usage error, exit 2, names the
/// flag); `RFIDL_REGISTRY_MISSED_HEARTBEATS` is read the same way.
#[test]
fn a_missed_heartbeats_flag_out_of_range_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (flag, env) in [(Some("0"), None), (Some("1001"), None), (None, Some("0"))] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("registry.db"))
            .env_remove("RFIDL_REGISTRY_MISSED_HEARTBEATS");
        if let Some(value) = flag {
            command.args(["--missed-heartbeats", value]);
        }
        if let Some(value) = env {
            command.env("RFIDL_REGISTRY_MISSED_HEARTBEATS", value);
        }
        let output = command.output().expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag:?} {env:?}: {stderr}");
        assert!(stderr.contains("--missed-heartbeats"), "{stderr}");
    }
    assert!(!dir.path().join("registry.db").exists(), "nothing created");
}
