//! `hr-service --registry URL` as a process against a real registry on
//! loopback where nobody published EmpService: with the registry's publish
//! token (`--registry-publish-token`) it publishes the manifests of what it
//! hosts and registers; without it, the refusal (422
//! `unknown_interface`) shows on stderr at the default log level.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rfidl_registry::Registry;
use serde_json::Value;

/// The registration credential of a closed registry.
const REGISTRATION_TOKEN: &str = "reg-t0ken";

const SECRET: &str = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

/// A registry (with `token`, if any) served on loopback by `runtime`.
fn registry(runtime: &tokio::runtime::Runtime, db: &Path, token: Option<&str>) -> String {
    let mut registry = Registry::open(db).expect("open registry");
    if let Some(token) = token {
        // Closed: publishing and registering each need their credential.
        registry = registry
            .publish_token(token)
            .registration_token(REGISTRATION_TOKEN);
    }
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = registry.router();
    runtime.spawn(async move {
        let _ = rfidl_runtime::serve(listener, router).await;
    });
    url
}

/// `hr-service` registering at `registry`, its stderr in `stderr`, with
/// no `RUST_LOG`: the default filter.
fn hr_service(dir: &Path, registry: &str, extra: &[&str], stderr: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hr-service"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--peer-url",
            "http://127.0.0.1:9",
        ])
        .arg("--db")
        .arg(dir.join("hr.db"))
        .args(["--registry", registry])
        .args(extra)
        .env("RFIDL_SECRET", SECRET)
        .env("RFIDL_PEER_SECRET", SECRET)
        .env_remove("RUST_LOG")
        .env_remove("RFIDL_REGISTRY_PUBLISH_TOKEN")
        .env_remove("RFIDL_OPS_TOKEN")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).expect("stderr file"))
        .spawn()
        .expect("start hr-service")
}

/// Waits (at most 30 s) until `done` says yes.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "no {what} within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn get(runtime: &tokio::runtime::Runtime, url: &str) -> Value {
    runtime.block_on(async {
        reqwest::get(url)
            .await
            .expect("get")
            .json()
            .await
            .expect("json")
    })
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn with_the_publish_token_a_service_publishes_what_it_hosts_and_registers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let url = registry(&runtime, &dir.path().join("registry.db"), Some("pub-t0ken"));
    // The registration needs the registration credential (its `registry:`
    // section); the manifests are published with the publish token.
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!("registry:\n  url: {url}\n  token: {REGISTRATION_TOKEN}\n"),
    )
    .expect("config");
    let stderr = dir.path().join("hr.stderr");
    let child = hr_service(
        dir.path(),
        &url,
        &[
            "--config",
            config.to_str().expect("utf-8 path"),
            "--registry-publish-token",
            "pub-t0ken",
        ],
        &stderr,
    );
    wait_for("registration", || {
        let listed = get(&runtime, &format!("{url}/v1/services"));
        listed["services"][0]["service"] == "hr-service"
    });
    // The service logs once the registry's answer is back: a moment after
    // the registry lists it.
    wait_for("the registration logged", || {
        std::fs::read_to_string(&stderr)
            .is_ok_and(|log| log.contains("registered with the registry"))
    });
    stop(child);
    let interfaces = get(&runtime, &format!("{url}/v1/interfaces"));
    let versions = &interfaces["interfaces"][0];
    assert_eq!(
        versions["interface"], "hr.employees.EmpService",
        "{interfaces}"
    );
    assert_eq!(versions["versions"].as_array().map(Vec::len), Some(2));
    let listed = get(&runtime, &format!("{url}/v1/services"));
    let hosts = &listed["services"][0]["instances"][0]["hosts"];
    assert_eq!(hosts.as_array().map(Vec::len), Some(2), "{listed}");
    let log = std::fs::read_to_string(&stderr).expect("stderr");
    assert!(log.contains("registered with the registry"), "{log}");
    assert!(
        !log.contains("pub-t0ken"),
        "the token is never logged: {log}"
    );
}

#[test]
fn without_it_the_refused_registration_shows_on_stderr_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let url = registry(&runtime, &dir.path().join("registry.db"), None);
    let stderr = dir.path().join("hr.stderr");
    let child = hr_service(dir.path(), &url, &[], &stderr);
    wait_for("refusal on stderr", || {
        std::fs::read_to_string(&stderr).is_ok_and(|log| log.contains("unknown_interface"))
    });
    stop(child);
    let log = std::fs::read_to_string(&stderr).expect("stderr");
    assert!(log.contains("cannot register with the registry"), "{log}");
    assert!(log.contains("WARN"), "{log}");
    let listed = get(&runtime, &format!("{url}/v1/services"));
    assert_eq!(listed["services"], serde_json::json!([]), "{listed}");
}
