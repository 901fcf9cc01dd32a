//! The registry binary as a process: configuration from the environment,
//! SIGTERM/SIGINT shut it down gracefully (exit 0, requests in flight
//! finish, bounded), and the publish token never shows in any output.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{get, manifest_path, put, schema_manifest};

/// A running `rfidl-registry serve` whose stderr is collected.
struct Running {
    child: Child,
    url: String,
    stdout: String,
    stderr_lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

fn binary() -> Command {
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
        "RFIDL_REGISTRY_SHUTDOWN_GRACE",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command
}

fn spawn(mut command: Command) -> Running {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rfidl-registry");
    let stderr = Arc::new(Mutex::new(String::new()));
    let (sender, stderr_lines) = std::sync::mpsc::channel();
    let pipe = child.stderr.take().expect("stderr");
    let collected = Arc::clone(&stderr);
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            collected
                .lock()
                .expect("lock")
                .push_str(&format!("{line}\n"));
            let _ = sender.send(line);
        }
    });
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read");
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| {
            panic!(
                "unexpected first line: {line:?}; stderr: {}",
                stderr.lock().unwrap()
            )
        })
        .to_owned();
    let mut rest = String::new();
    // stdout stays open until exit; read it when the process is gone.
    std::thread::spawn(move || {
        let _ = stdout.read_to_string(&mut rest);
    });
    Running {
        child,
        url,
        stdout: line,
        stderr_lines,
        stderr,
    }
}

impl Running {
    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name}");
    }

    /// Waits (bounded) for a stderr line containing `text`.
    fn wait_for_log(&self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => panic!(
                    "no `{text}` in the log within {within:?}: {}",
                    self.stderr.lock().expect("lock")
                ),
            }
        }
    }

    /// Waits (bounded) for the exit.
    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running {within:?} after the signal");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens a publish of `body` and sends everything but its last byte, with
/// `Expect: 100-continue`; returns once the server has answered `100
/// Continue`, i.e. the handler is running and reading the body.
fn start_publish(url: &str, path: &str, body: &[u8]) -> TcpStream {
    let address = url.strip_prefix("http://").expect("http url");
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .expect("send head");
    let mut continued = [0u8; 25];
    stream.read_exact(&mut continued).expect("100 Continue");
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream
        .write_all(&body[..body.len() - 1])
        .expect("send most of the body");
    stream
}

fn finish_publish(mut stream: TcpStream, body: &[u8]) -> String {
    stream
        .write_all(&body[body.len() - 1..])
        .expect("send the rest");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    answer
}

fn serve_from_env(db: &Path) -> Command {
    let mut command = binary();
    command
        .arg("serve")
        .env("RFIDL_REGISTRY_DB", db)
        .env("RFIDL_REGISTRY_LISTEN", "127.0.0.1:0");
    command
}

#[test]
fn sigterm_and_sigint_finish_the_request_in_flight_and_exit_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let manifests = [
        schema_manifest("hr.employees.EmpService", 1),
        schema_manifest("hr.employees.EmpService", 2),
    ];
    for (signal, manifest) in ["TERM", "INT"].into_iter().zip(&manifests) {
        // --db and --listen from the environment.
        let mut registry = spawn(serve_from_env(&db));
        let body = manifest.to_pretty_json().into_bytes();
        let in_flight = start_publish(&registry.url, &manifest_path(manifest), &body);
        let signalled = Instant::now();
        registry.signal(signal);
        registry.wait_for_log("shutting down", Duration::from_secs(5));
        // No new connections once it is shutting down.
        let address = registry.url.trim_start_matches("http://").to_owned();
        let refused = (0..100).any(|_| {
            let gone = TcpStream::connect(&address).is_err();
            if !gone {
                std::thread::sleep(Duration::from_millis(10));
            }
            gone
        });
        assert!(refused, "still accepting after SIG{signal}");
        let answer = finish_publish(in_flight, &body);
        assert!(answer.starts_with("HTTP/1.1 201 Created"), "{answer}");
        let status = registry.wait_exit(Duration::from_secs(5));
        let took = signalled.elapsed();
        assert_eq!(status.code(), Some(0), "SIG{signal}: {status:?}");
        assert!(took < Duration::from_secs(5), "SIG{signal}: {took:?}");
        eprintln!("SIG{signal}: exited 0 {took:?} after the signal");
        assert_eq!(
            registry.stdout.trim(),
            format!("listening on {}", registry.url)
        );
    }
    // Both publishes that were in flight are stored.
    let mut registry = spawn(serve_from_env(&db));
    for manifest in &manifests {
        assert_eq!(get(&registry.url, &manifest_path(manifest)).0, 200);
    }
    registry.signal("TERM");
    assert_eq!(registry.wait_exit(Duration::from_secs(5)).code(), Some(0));
}

#[test]
fn a_request_that_never_finishes_delays_the_exit_by_the_grace_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = serve_from_env(&dir.path().join("registry.db"));
    command.args(["--shutdown-grace", "1"]);
    let mut registry = spawn(command);
    let manifest = schema_manifest("hr.employees.EmpService", 2);
    let body = manifest.to_pretty_json().into_bytes();
    let _stalled = start_publish(&registry.url, &manifest_path(&manifest), &body);
    let signalled = Instant::now();
    registry.signal("TERM");
    let status = registry.wait_exit(Duration::from_secs(5));
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let log = registry.stderr.lock().expect("lock").clone();
    assert!(
        log.contains("still in flight after the shutdown grace"),
        "{log}"
    );
}

#[test]
fn the_publish_token_never_appears_in_help_logs_or_answers() {
    const SECRET: &str = "tok-7f3a9c-never-print-me";
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let mut outputs = Vec::new();

    // --help with the token in the environment.
    let help = binary()
        .args(["serve", "--help"])
        .env("RFIDL_REGISTRY_TOKEN", SECRET)
        .output()
        .expect("help");
    assert!(help.status.success());
    let help_text = String::from_utf8_lossy(&help.stdout).into_owned();
    assert!(help_text.contains("RFIDL_REGISTRY_TOKEN"), "{help_text}");
    outputs.push(("--help", help_text + &String::from_utf8_lossy(&help.stderr)));

    // The token from a file; every log level on.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{SECRET}\n")).expect("write token");
    let mut command = serve_from_env(&db);
    command
        .arg("--publish-token-file")
        .arg(&token_file)
        .env("RUST_LOG", "trace");
    let mut registry = spawn(command);
    let manifest = schema_manifest("hr.employees.EmpService", 2);
    let path = manifest_path(&manifest);
    for token in [None, Some("wrong"), Some(&SECRET[1..])] {
        let (status, body) = put(&registry.url, &path, manifest.to_pretty_json(), token);
        assert_eq!(status, 401, "{body}");
        outputs.push(("401 body", body.to_string()));
    }
    let (status, body) = put(
        &registry.url,
        &path,
        manifest.to_pretty_json(),
        Some(SECRET),
    );
    assert_eq!(status, 201, "{body}");
    outputs.push(("201 body", body.to_string()));
    let (status, body) = put(&registry.url, &path, "{}", Some(SECRET));
    assert_eq!(status, 422);
    outputs.push(("422 body", body.to_string()));
    for path in ["/readyz", "/v1/interfaces", "/nope"] {
        outputs.push(("GET", get(&registry.url, path).1));
    }
    registry.signal("TERM");
    assert_eq!(registry.wait_exit(Duration::from_secs(5)).code(), Some(0));
    let log = registry.stderr.lock().expect("lock").clone();
    assert!(log.contains("published"), "the log is on: {log}");
    outputs.push(("stderr", log));
    outputs.push(("stdout", registry.stdout.clone()));

    // Refusals at start: an unreadable file is named, its content is not.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    for (file, env_token, expected) in [
        (
            dir.path().join("missing"),
            None,
            "cannot read the publish token file",
        ),
        (empty, None, "publish token is empty"),
        (token_file, Some(SECRET), "cannot be used with"),
    ] {
        let mut command = serve_from_env(&db);
        command.arg("--publish-token-file").arg(&file);
        if let Some(token) = env_token {
            command.env("RFIDL_REGISTRY_TOKEN", token);
        }
        let output = command.output().expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(stderr.contains(expected), "{stderr}");
        outputs.push(("refusal", stderr));
    }
    for (what, text) in outputs {
        assert!(!text.contains(SECRET), "the token shows in {what}: {text}");
        assert!(
            !text.contains(&SECRET[1..]),
            "part of the token shows in {what}: {text}"
        );
    }
}
