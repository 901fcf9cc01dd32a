//! The demo binaries as an operator runs them: secrets from a file and the
//! environment, stopped with SIGTERM and SIGINT mid-stream (exit 0, within
//! the bound, nothing left `Sending`), and no secret in `--help`, errors,
//! logs or any diagnostics route.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rfidl_runtime::signing::Secret;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
        .unwrap_or(0)
}

/// Sends `signal` (`TERM`, `INT`) with the system's `kill`.
fn send_signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} failed");
}

/// Waits for `child` to exit; returns its status and how long it took.
fn wait_exit(child: &mut Child, bound: Duration) -> (std::process::ExitStatus, Duration) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll") {
            return (status, started.elapsed());
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            panic!("no exit within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_for_count(db: &Path, sql: &str, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(db, sql) < at_least {
        assert!(Instant::now() < deadline, "never reached {at_least}: {sql}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Secrets {
    hr: String,
    engine: String,
}

/// Every secret must stay out of `text`.
fn assert_no_secret(secrets: &Secrets, what: &str, text: &str) {
    for secret in [&secrets.hr, &secrets.engine] {
        // The base64 body alone must not appear either.
        let body = secret.trim_start_matches("whsec_");
        assert!(!text.contains(body), "a secret appears in {what}:\n{text}");
    }
}

fn log_files(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{name}.stdout")),
        dir.join(format!("{name}.stderr")),
    )
}

fn spawn_logged(command: &mut Command, dir: &Path, name: &str) -> Child {
    let (out, err) = log_files(dir, name);
    command
        .env("RUST_LOG", "info,rfidl_runtime=debug")
        .stdout(std::fs::File::create(out).expect("stdout file"))
        .stderr(std::fs::File::create(err).expect("stderr file"))
        .spawn()
        .expect("spawn")
}

fn read_logs(dir: &Path, name: &str) -> String {
    let (out, err) = log_files(dir, name);
    std::fs::read_to_string(out).unwrap_or_default()
        + &std::fs::read_to_string(err).unwrap_or_default()
}

/// GETs each diagnostics route of a running service.
fn diagnostics_of(base: &str) -> Vec<(String, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut answers = Vec::new();
        for route in [
            "/_rf/health",
            "/_rf/readyz",
            "/_rf/livez",
            "/_rf/outbox/stats",
            "/_rf/outbox/failed",
            "/_rf/inbox/stats",
            "/_rf/metrics",
            "/_rf/metadata",
        ] {
            let response = reqwest::get(format!("{base}{route}")).await.expect(route);
            answers.push((
                format!("{route} ({})", response.status()),
                response.text().await.expect("body"),
            ));
        }
        answers
    })
}

#[test]
fn sigterm_and_sigint_stop_the_services_gracefully_and_no_secret_shows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let secrets = Secrets {
        hr: Secret::generate().to_whsec(),
        engine: Secret::generate().to_whsec(),
    };
    let (hr_port, engine_port) = (free_port(), free_port());
    // The engine reads its own secret from a file, HR's from the environment.
    std::fs::write(dir.join("engine.secret"), format!("{}\n", secrets.engine))
        .expect("secret file");
    let mut engine = spawn_logged(
        Command::new(env!("CARGO_BIN_EXE_engine"))
            .args(["--listen", &format!("127.0.0.1:{engine_port}")])
            .arg("--db")
            .arg(dir.join("engine.db"))
            .args(["--peer-url", &format!("http://127.0.0.1:{hr_port}")])
            .arg("--secret-file")
            .arg(dir.join("engine.secret"))
            .env("RFIDL_PEER_SECRET", &secrets.hr)
            // The environment overlay: quick retries.
            .env("RFIDL_OUTBOX_BACKOFF_BASE", "50ms")
            .env("RFIDL_OUTBOX_BACKOFF_MAX", "500ms"),
        dir,
        "engine",
    );
    let mut hr = spawn_logged(
        Command::new(env!("CARGO_BIN_EXE_hr-service"))
            .args(["--listen", &format!("127.0.0.1:{hr_port}")])
            .arg("--db")
            .arg(dir.join("hr.db"))
            .args(["--peer-url", &format!("http://127.0.0.1:{engine_port}")])
            .env("RFIDL_SECRET", &secrets.hr)
            .env("RFIDL_PEER_SECRET", &secrets.engine)
            // 200 hires a second: the signal lands while hires still flow.
            .args(["--hire", "400", "--hire-rate", "200"]),
        dir,
        "hr",
    );
    let (hr_db, engine_db) = (dir.join("hr.db"), dir.join("engine.db"));

    // Mid-stream: the engine has handled some hires and is sending commands.
    wait_for_count(&engine_db, "SELECT COUNT(*) FROM workflows", 30);
    let engine_url = format!("http://127.0.0.1:{engine_port}");
    for (route, body) in diagnostics_of(&engine_url) {
        assert!(!route.contains("(5"), "{route}: {body}");
        assert_no_secret(&secrets, &route, &body);
    }

    send_signal(&engine, "TERM");
    let (status, took) = wait_exit(&mut engine, Duration::from_secs(15));
    let handled = count(&engine_db, "SELECT COUNT(*) FROM workflows");
    eprintln!("engine stopped {took:?} after SIGTERM, {handled} of 400 hires handled");
    assert!(handled < 400, "the signal came mid-stream");
    assert!(status.success(), "engine after SIGTERM: {status}");
    assert!(took < Duration::from_secs(10), "engine took {took:?}");
    assert_eq!(
        count(
            &engine_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sending'"
        ),
        0,
        "the engine left claimed messages behind"
    );
    assert!(count(&engine_db, "SELECT COUNT(*) FROM workflows") > 0);

    // HR keeps trying the stopped engine; Ctrl-C stops it just as cleanly.
    std::thread::sleep(Duration::from_millis(200));
    send_signal(&hr, "INT");
    let (status, took) = wait_exit(&mut hr, Duration::from_secs(15));
    eprintln!("hr-service stopped {took:?} after SIGINT");
    assert!(status.success(), "hr-service after SIGINT: {status}");
    assert!(took < Duration::from_secs(10), "hr-service took {took:?}");
    assert_eq!(
        count(
            &hr_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sending'"
        ),
        0,
        "hr-service left claimed messages behind"
    );

    for name in ["engine", "hr"] {
        let logs = read_logs(dir, name);
        assert!(logs.contains("stopped"), "{name} logs:\n{logs}");
        assert_no_secret(&secrets, &format!("{name}'s output"), &logs);
    }
}

#[test]
fn help_and_errors_never_show_a_secret() {
    let secrets = Secrets {
        hr: Secret::generate().to_whsec(),
        engine: Secret::generate().to_whsec(),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // An empty value in `extra_env` removes the variable.
    let run = |args: &[&str], extra_env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_engine"));
        command
            .args(args)
            .env("RFIDL_SECRET", &secrets.engine)
            .env("RFIDL_PEER_SECRET", &secrets.hr);
        for (name, value) in extra_env {
            if value.is_empty() {
                command.env_remove(name);
            } else {
                command.env(name, value);
            }
        }
        let output = command.stdin(Stdio::null()).output().expect("run engine");
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status, text)
    };

    let (status, help) = run(&["--help"], &[]);
    assert!(status.success());
    assert!(
        help.contains("RFIDL_SECRET"),
        "the variable is named:\n{help}"
    );
    assert_no_secret(&secrets, "engine --help", &help);

    // A missing flag, an unreadable secret file, a bad setting from the
    // environment whose value is a secret, a bad YAML value that is one:
    // each error is clear and shows no secret.
    let db = dir.path().join("e.db");
    let db = db.to_str().expect("utf-8");
    let yaml = dir.path().join("bad.yaml");
    std::fs::write(&yaml, format!("outbox:\n  max_retries: {}\n", secrets.hr)).expect("yaml");
    let yaml = yaml.to_str().expect("utf-8");
    // (arguments, environment changes, what the error must name)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (&["--db", db], &[], "--peer-url"),
        (
            &[
                "--db",
                db,
                "--peer-url",
                "http://127.0.0.1:9",
                "--peer-secret-file",
                "/nonexistent/secret",
            ],
            &[("RFIDL_PEER_SECRET", "")],
            "/nonexistent/secret",
        ),
        (
            &["--db", db, "--peer-url", "http://127.0.0.1:9"],
            &[("RFIDL_OUTBOX_TTL", &secrets.engine)],
            "RFIDL_OUTBOX_TTL",
        ),
        (
            &[
                "--db",
                db,
                "--peer-url",
                "http://127.0.0.1:9",
                "--config",
                yaml,
            ],
            &[],
            "outbox.max_retries",
        ),
    ];
    for (args, env, expected) in cases {
        let (status, text) = run(args, env);
        assert!(!status.success(), "{args:?} should fail:\n{text}");
        assert!(
            text.contains(expected),
            "{args:?}: no {expected:?} in\n{text}"
        );
        assert_no_secret(&secrets, &format!("the error of {args:?}"), &text);
    }
}

#[test]
fn the_demo_stops_gracefully_on_sigterm_mid_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut demo = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--hires", "3000", "--outage-secs", "30", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn demo");
    // Mid-run: hires are flowing (the engine may or may not have handled
    // some yet; it goes down for 30 s after the first third).
    let hr_db = dir.path().join("hr.db");
    wait_for_count(&hr_db, "SELECT COUNT(*) FROM employees", 50);
    send_signal(&demo, "TERM");
    let (status, took) = wait_exit(&mut demo, Duration::from_secs(15));
    eprintln!("demo stopped {took:?} after SIGTERM");
    assert!(status.success(), "demo after SIGTERM: {status}");
    assert!(took < Duration::from_secs(10), "demo took {took:?}");
    for db in ["hr.db", "engine.db"] {
        assert_eq!(
            count(
                &dir.path().join(db),
                "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sending'"
            ),
            0,
            "{db} has claimed messages left"
        );
    }
}
