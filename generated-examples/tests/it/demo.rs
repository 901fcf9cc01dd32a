//! The README's first command, run as a process with a smaller load (150 hires, a 1 s outage): it
//! must end with exactly-once effects, healthy services and the registry
//! check passed, both services registered in the registry's directory and
//! healthy on its dashboard, and exit 0. The same on sqlx PostgreSQL
//! (`--db postgres://…`).

use std::process::{Command, Output};

use crate::postgres;

/// The demo with 150 hires and a 1 s outage, and `args`; its output, or a
/// panic with both streams when it did not exit 0.
fn run_demo(args: &[&std::ffi::OsStr]) -> (String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--hires", "150", "--outage-secs", "1"])
        .args(args)
        .output()
        .expect("run the demo");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert!(status.success(), "{stdout}\n{stderr}");
    assert_exactly_once(&stdout);
    (stdout, stderr)
}

fn assert_exactly_once(stdout: &str) {
    for line in [
        "employees hired (HR rows)                 150",
        "workflows started (engine effects)        150",
        "laptop tickets (HR effects of commands)   150",
        "tickets back at the engine (answers)      150",
        "hr: healthy, engine: healthy",
        "messages waiting for an operator          0",
        "the engine's compiled fingerprints match",
        "exactly once                              yes",
        "both registered with the registry; dashboard at http://127.0.0.1:",
        "dashboard (health aggregator)             engine: healthy, hr-service: healthy",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from\n{stdout}");
    }
}

#[test]
fn the_demo_runs_on_embedded_defaults_and_reports_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_demo(&["--dir".as_ref(), dir.path().as_os_str()]);
    for db in ["hr.db", "engine.db", "registry.db"] {
        assert!(dir.path().join(db).is_file(), "{db} is a real file");
    }
}

#[test]
fn the_demo_runs_on_sqlx_postgresql_in_two_schemas_without_showing_the_password() {
    let Some(db) = postgres::database() else {
        return;
    };
    // The tests' server trusts its user on loopback: the password is only
    // there to be hidden.
    let secret = "n0t-f0r-the-logs";
    let (scheme, rest) = db.url().split_once("://").expect("a URL");
    let (user, host) = rest.split_once('@').expect("a user");
    let url = format!("{scheme}://{user}:{secret}@{host}");
    let dir = tempfile::tempdir().expect("tempdir");
    let (stdout, stderr) = run_demo(&[
        "--db".as_ref(),
        url.as_ref(),
        "--dir".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "the password shows:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(":***@"), "{stdout}");
    for db_file in ["hr.db", "engine.db"] {
        assert!(!dir.path().join(db_file).exists(), "{db_file} not used");
    }
    // Each service's rows (and rfidl's tables) in its own schema.
    let counts: Vec<i64> = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut client = db.connect();
                [
                    "SELECT count(*) FROM hr.employees",
                    "SELECT count(*) FROM hr.laptop_tickets",
                    "SELECT count(*) FROM engine.workflows WHERE laptop_ticket IS NOT NULL",
                    "SELECT count(*) FROM engine.outbox_messages WHERE status = 'Sent'",
                    "SELECT count(*) FROM hr.outbox_messages WHERE status = 'Sent'",
                ]
                .iter()
                .map(|sql| client.query_one(*sql, &[]).expect("count").get(0))
                .collect()
            })
            .join()
            .expect("count thread")
    });
    assert_eq!(counts, [150; 5], "one row of each per hire, in its schema");
}
