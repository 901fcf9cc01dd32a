//! The registry as a process: published manifests survive SIGKILL, and a
//! build goes on from `rfidl.lock` and the offline cache while it is dead.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use rfidl_cli::{self as cli, Outcome};
use rfidl_codegen::Builder;
use rfidl_codegen::builder::BuildError;
use rfidl_codegen::registry::client::RegistryClient;
use rfidl_codegen::registry::{Cache, RegistryError, Remote, Source as _};

use crate::support::schema_manifest;

/// Starts `rfidl-registry serve` on a free port; returns it and its URL.
fn start_registry(db: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .stdout(Stdio::piped())
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
    (child, url)
}

fn build_hr_v2(registry: &str, lock: &Path, cache: &Path, out: &Path) -> Result<(), BuildError> {
    Builder::new()
        .skip_rerun_if_changed()
        .remote("hr.employees.EmpService", 2)
        .registry(registry)
        .lock_file(lock)
        .cache_dir(cache)
        .out_dir(out)
        .compile(&[] as &[&str])
        .map(|_| ())
}

#[test]
fn builds_go_on_while_the_registry_is_killed_and_its_data_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let (lock, cache_dir, out) = (
        dir.path().join("rfidl.lock"),
        dir.path().join("cache"),
        dir.path().join("out"),
    );
    std::fs::create_dir_all(&out).expect("mkdir");
    let (mut registry, url) = start_registry(&db);
    assert_eq!(
        cli::publish(&url, None, &[std::path::PathBuf::from("../schemas")]),
        Outcome::Success
    );
    // The first build fetches, caches and pins.
    build_hr_v2(&url, &lock, &cache_dir, &out).expect("online build");
    let generated = std::fs::read_to_string(out.join("hr.employees.rs")).expect("generated");

    registry.kill().expect("SIGKILL the registry");
    registry.wait().expect("reap");

    // Registry dead: the lock and the cache are enough, same code out.
    std::fs::remove_dir_all(&out).expect("clean");
    std::fs::create_dir_all(&out).expect("mkdir");
    build_hr_v2(&url, &lock, &cache_dir, &out).expect("offline build");
    assert_eq!(
        std::fs::read_to_string(out.join("hr.employees.rs")).expect("generated"),
        generated
    );
    // Without the cache, the dead registry is named in the error.
    std::fs::remove_dir_all(&cache_dir).expect("empty cache");
    match build_hr_v2(&url, &lock, &cache_dir, &out) {
        Err(BuildError::Registry(RegistryError::Unreachable { url: named, .. })) => {
            assert!(named.starts_with(&url), "{named}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }

    // Restarted on the same file: everything published is still there.
    let (mut registry, url) = start_registry(&db);
    let client = RegistryClient::new(&url).expect("client");
    let manifest = schema_manifest("hr.employees.EmpService", 2);
    let remote: Remote = "hr.employees.EmpService@v2".parse().expect("remote");
    assert_eq!(
        client
            .exact(&remote, &manifest.fingerprint)
            .expect("fetch after restart"),
        manifest
    );
    build_hr_v2(&url, &lock, &cache_dir, &out).expect("refills the cache");
    assert!(
        Cache::new(&cache_dir)
            .get(&manifest.interface, 2, &manifest.fingerprint)
            .expect("cache")
            .is_some()
    );
    registry.kill().expect("stop");
    let _ = registry.wait();
}

#[test]
fn the_binary_refuses_an_empty_publish_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let output = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--publish-token",
            "",
            "--db",
        ])
        .arg(&db)
        .output()
        .expect("run rfidl-registry");
    assert!(!output.status.success(), "started with an empty token");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("publish token is empty"), "{stderr}");
    assert!(output.stdout.is_empty(), "it never listened");
}

/// The registry binary closes connections that trickle their headers or
/// withhold their body (issue 26: they used to stay open until the
/// file-descriptor limit).
#[test]
fn the_binary_closes_connections_that_trickle_headers_or_withhold_the_body() {
    use std::io::{Read as _, Write as _};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("registry.db"))
        .args([
            "--header-read-timeout",
            "500ms",
            "--body-read-timeout",
            "800ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rfidl-registry");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let address = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    let started = Instant::now();
    let mut connections: Vec<std::net::TcpStream> = (0..200)
        .map(|i| {
            let mut stream = std::net::TcpStream::connect(&address).expect("connect");
            let partial: &[u8] = if i % 2 == 0 {
                b"GET /v1/interfaces HTT"
            } else {
                b"PUT /v1/interfaces/a.B/v1 HTTP/1.1\r\nhost: r\r\ncontent-length: 5000\r\n\r\n{\"na"
            };
            stream.write_all(partial).expect("write");
            stream
        })
        .collect();
    for stream in &mut connections {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut answer = Vec::new();
        let closed = match stream.read_to_end(&mut answer) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "a slow connection is still open after 5 s");
    }
    assert!(started.elapsed() < Duration::from_secs(8));
    // Still serving.
    let probe = reqwest::blocking::get(format!("http://{address}/livez")).expect("livez");
    assert_eq!(probe.status(), 200);
    let _ = child.kill();
    let _ = child.wait();
}
