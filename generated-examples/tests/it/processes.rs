//! The demo services as separate processes; the engine is killed with
//! SIGKILL mid-stream and restarted on the same database and port. Every
//! hire must still produce exactly one workflow and one laptop ticket.

use std::path::Path;
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

struct Peers {
    hr_port: u16,
    engine_port: u16,
    hr_secret: String,
    engine_secret: String,
}

fn engine(dir: &Path, peers: &Peers) -> Child {
    Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", &format!("127.0.0.1:{}", peers.engine_port)])
        .arg("--db")
        .arg(dir.join("engine.db"))
        .args(["--peer-url", &format!("http://127.0.0.1:{}", peers.hr_port)])
        .args([
            "--secret",
            &peers.engine_secret,
            "--peer-secret",
            &peers.hr_secret,
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("start engine")
}

#[test]
fn exactly_once_across_a_sigkilled_and_restarted_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peers = Peers {
        hr_port: free_port(),
        engine_port: free_port(),
        hr_secret: Secret::generate().to_whsec(),
        engine_secret: Secret::generate().to_whsec(),
    };
    let hires = 200;
    let mut engine_process = engine(dir.path(), &peers);
    let mut hr = Command::new(env!("CARGO_BIN_EXE_hr-service"))
        .args(["--listen", &format!("127.0.0.1:{}", peers.hr_port)])
        .arg("--db")
        .arg(dir.path().join("hr.db"))
        .args([
            "--peer-url",
            &format!("http://127.0.0.1:{}", peers.engine_port),
        ])
        .args([
            "--secret",
            &peers.hr_secret,
            "--peer-secret",
            &peers.engine_secret,
        ])
        .args(["--hire", &hires.to_string(), "--exit-when-done"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start hr-service");

    // Kill the engine as soon as it has processed some hires, mid-stream.
    let engine_db = dir.path().join("engine.db");
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&engine_db, "SELECT COUNT(*) FROM workflows") < 20 {
        assert!(Instant::now() < deadline, "the engine processed nothing");
        std::thread::sleep(Duration::from_millis(5));
    }
    engine_process.kill().expect("SIGKILL the engine");
    engine_process.wait().expect("reap");
    let at_kill = count(&engine_db, "SELECT COUNT(*) FROM workflows");
    std::thread::sleep(Duration::from_millis(500));
    let mut engine_process = engine(dir.path(), &peers);

    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = hr.try_wait().expect("poll hr") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = hr.kill();
            let _ = engine_process.kill();
            panic!("not done in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    engine_process.kill().expect("stop engine");
    let _ = engine_process.wait();
    assert!(status.success(), "hr-service failed: {status}");
    assert!(
        at_kill < hires,
        "the kill happened mid-stream ({at_kill} of {hires})"
    );
    let hr_db = dir.path().join("hr.db");
    assert_eq!(count(&hr_db, "SELECT COUNT(*) FROM employees"), hires);
    assert_eq!(
        count(&engine_db, "SELECT COUNT(*) FROM workflows"),
        hires,
        "one workflow per hire"
    );
    assert_eq!(
        count(
            &engine_db,
            "SELECT COUNT(DISTINCT employee_id) FROM workflows"
        ),
        hires
    );
    assert_eq!(
        count(&hr_db, "SELECT COUNT(*) FROM laptop_tickets"),
        hires,
        "one ticket per hire"
    );
    assert_eq!(
        count(
            &hr_db,
            "SELECT COUNT(DISTINCT employee_id) FROM laptop_tickets"
        ),
        hires
    );
}
