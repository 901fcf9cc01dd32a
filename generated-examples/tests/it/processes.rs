//! The demo services as separate processes. One of them is killed with
//! SIGKILL mid-stream and restarted on the same database and port: the
//! engine (a receiver, with effects half done) or the HR service (a sender,
//! with outbox rows claimed and in flight). Every hire must still produce
//! exactly one workflow and one laptop ticket. And two engine instances on
//! one database behind HR's two `--peer-url`s, one of them SIGKILLed for
//! good: the other takes over its share.

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

/// Quick retries, and a 3 s lease so rows a killed sender left `Sending`
/// are claimed again soon after its restart.
const CONFIG: &str = "
outbox:
  backoff_base: 100ms
  backoff_max: 1s
  jitter: 50ms
  max_retries: 50
  request_timeout: 2s
  lease_timeout: 3s
";

fn engine(dir: &Path, peers: &Peers) -> Child {
    engine_on(dir, peers, peers.engine_port)
}

/// An engine instance on `port` (every instance shares `engine.db`).
fn engine_on(dir: &Path, peers: &Peers, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--db")
        .arg(dir.join("engine.db"))
        .args(["--peer-url", &format!("http://127.0.0.1:{}", peers.hr_port)])
        .args([
            "--secret",
            &peers.engine_secret,
            "--peer-secret",
            &peers.hr_secret,
        ])
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start engine")
}

/// Hires until `hires` employees exist (counting those of an earlier run),
/// and exits 0 once every hire has its laptop ticket.
fn hr_service(dir: &Path, peers: &Peers, hires: i64) -> Child {
    hr_service_to(dir, peers, hires, &[peers.engine_port], 0)
}

/// [`hr_service`] sending to the engine instances on `engine_ports`, one
/// `--peer-url` each, hiring `rate` a second (0: at once).
fn hr_service_to(dir: &Path, peers: &Peers, hires: i64, engine_ports: &[u16], rate: u32) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hr-service"));
    command
        .args(["--listen", &format!("127.0.0.1:{}", peers.hr_port)])
        .arg("--db")
        .arg(dir.join("hr.db"));
    for port in engine_ports {
        command.args(["--peer-url", &format!("http://127.0.0.1:{port}")]);
    }
    command
        .args([
            "--secret",
            &peers.hr_secret,
            "--peer-secret",
            &peers.engine_secret,
        ])
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(["--hire", &hires.to_string(), "--exit-when-done"])
        .args(["--hire-rate", &rate.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("start hr-service")
}

fn peers(dir: &Path) -> Peers {
    std::fs::write(dir.join("config.yaml"), CONFIG).expect("config");
    Peers {
        hr_port: free_port(),
        engine_port: free_port(),
        hr_secret: Secret::generate().to_whsec(),
        engine_secret: Secret::generate().to_whsec(),
    }
}

/// Waits until `db` answers `sql` with at least `at_least`.
fn wait_for_count(db: &Path, sql: &str, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(db, sql) < at_least {
        assert!(Instant::now() < deadline, "never reached {at_least}: {sql}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for `hr` to exit (it does once every hire has its ticket).
fn wait_done(hr: &mut Child, engine: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = hr.try_wait().expect("poll hr") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = hr.kill();
            let _ = engine.kill();
            panic!("not done in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    engine.kill().expect("stop engine");
    let _ = engine.wait();
    assert!(status.success(), "hr-service failed: {status}");
}

/// One employee, one workflow, one ticket per hire; nothing twice.
fn assert_exactly_once(dir: &Path, hires: i64) {
    let (hr_db, engine_db) = (dir.join("hr.db"), dir.join("engine.db"));
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

#[test]
fn exactly_once_across_a_sigkilled_and_restarted_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peers = peers(dir.path());
    let hires = 200;
    let mut engine_process = engine(dir.path(), &peers);
    let mut hr = hr_service(dir.path(), &peers, hires);

    // Kill the engine as soon as it has processed some hires, mid-stream.
    let engine_db = dir.path().join("engine.db");
    wait_for_count(&engine_db, "SELECT COUNT(*) FROM workflows", 20);
    engine_process.kill().expect("SIGKILL the engine");
    engine_process.wait().expect("reap");
    let at_kill = count(&engine_db, "SELECT COUNT(*) FROM workflows");
    std::thread::sleep(Duration::from_millis(500));
    let mut engine_process = engine(dir.path(), &peers);

    wait_done(&mut hr, &mut engine_process);
    assert!(
        at_kill < hires,
        "the kill happened mid-stream ({at_kill} of {hires})"
    );
    assert_exactly_once(dir.path(), hires);
}

#[test]
fn exactly_once_across_a_sigkilled_and_restarted_sender() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peers = peers(dir.path());
    let hires = 200;
    let mut engine_process = engine(dir.path(), &peers);
    let mut hr = hr_service(dir.path(), &peers, hires);

    // Kill HR while its outbox is still sending: some hires are through,
    // others are pending or claimed (`Sending`) by the killed dispatcher.
    let (hr_db, engine_db) = (dir.path().join("hr.db"), dir.path().join("engine.db"));
    wait_for_count(&engine_db, "SELECT COUNT(*) FROM workflows", 20);
    hr.kill().expect("SIGKILL hr-service");
    hr.wait().expect("reap");
    let sent_at_kill = count(
        &hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
    );
    let hired_at_kill = count(&hr_db, "SELECT COUNT(*) FROM employees");

    // The restarted HR hires the rest, re-sends what the dead one left
    // behind (after its lease), and gets the engine's commands.
    let mut hr = hr_service(dir.path(), &peers, hires);
    wait_done(&mut hr, &mut engine_process);
    assert!(
        sent_at_kill < hires,
        "the kill happened mid-stream ({sent_at_kill} of {hires} sent, {hired_at_kill} hired)"
    );
    assert_exactly_once(dir.path(), hires);
    assert_eq!(
        count(
            &hr_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE status != 'Sent'"
        ),
        0,
        "every message of both runs was acknowledged"
    );
}

/// A restarted sender does not wait for the leases of the rows its killed
/// predecessor left `Sending` (issue 26): its dispatcher holds the SQLite
/// file's dispatcher lock, which proves that their claimer is gone.
#[test]
fn a_restarted_sender_resends_what_its_killed_predecessor_left_sending_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peers = peers(dir.path());
    // A lease far longer than the test may take: waiting for it fails.
    std::fs::write(
        dir.path().join("config.yaml"),
        CONFIG
            .replace("lease_timeout: 3s", "lease_timeout: 120s")
            .replace("request_timeout: 2s", "request_timeout: 60s"),
    )
    .expect("config");
    // The first HR sends into a listener that accepts and never answers,
    // so its claimed rows stay `Sending` until it is killed.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let black_hole_port = black_hole.local_addr().expect("addr").port();
    let held = std::thread::spawn(move || {
        let mut connections = Vec::new();
        for stream in black_hole.incoming().take(4) {
            connections.push(stream);
        }
        std::thread::sleep(Duration::from_secs(600));
        drop(connections);
    });
    let hires = 20;
    let hr = hr_service_to(dir.path(), &peers, hires, &[black_hole_port], 0);
    let mut hr = KillOnDrop(hr);
    let hr_db = dir.path().join("hr.db");
    wait_for_count(
        &hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sending'",
        1,
    );
    hr.0.kill().expect("SIGKILL hr-service");
    hr.0.wait().expect("reap");
    let sending = count(
        &hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sending'",
    );
    assert!(sending > 0, "rows were left `Sending`");

    let mut engine_process = engine(dir.path(), &peers);
    wait_listening(peers.engine_port);
    let restarted = Instant::now();
    let mut hr = hr_service(dir.path(), &peers, hires);
    wait_done(&mut hr, &mut engine_process);
    let took = restarted.elapsed();
    eprintln!(
        "{sending} rows left `Sending` by the killed sender: all through {took:?} after the restart"
    );
    assert_exactly_once(dir.path(), hires);
    assert!(
        took < Duration::from_secs(30),
        "{sending} rows left `Sending` took {took:?} to go out (their lease is 120 s)"
    );
    drop(held);
}

/// Kills its process when dropped, so a failed assertion leaves no
/// service running.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Until `port` on loopback accepts connections (the process is serving).
fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `processed` of `GET /_rf/inbox/stats`: messages this process handled.
fn processed_by(port: u16) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let stats: serde_json::Value =
            reqwest::get(format!("http://127.0.0.1:{port}/_rf/inbox/stats"))
                .await
                .expect("inbox stats")
                .json()
                .await
                .expect("json");
        stats["processed"].as_i64().expect("processed")
    })
}

#[test]
fn exactly_once_across_two_engine_instances_when_one_is_sigkilled_for_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peers = peers(dir.path());
    // A steady stream (about 1.5 s), so the kill falls in the middle of it.
    let hires = 600;
    let second_port = free_port();
    let mut first = KillOnDrop(engine_on(dir.path(), &peers, peers.engine_port));
    wait_listening(peers.engine_port);
    let mut second = KillOnDrop(engine_on(dir.path(), &peers, second_port));
    wait_listening(second_port);
    let mut hr = KillOnDrop(hr_service_to(
        dir.path(),
        &peers,
        hires,
        &[peers.engine_port, second_port],
        400,
    ));

    let engine_db = dir.path().join("engine.db");
    wait_for_count(&engine_db, "SELECT COUNT(*) FROM workflows", 100);
    let (by_first, by_second) = (processed_by(peers.engine_port), processed_by(second_port));
    assert!(
        by_first > 0 && by_second > 0,
        "HR spread its hires over both instances: {by_first} and {by_second}"
    );
    second.0.kill().expect("SIGKILL the second engine");
    second.0.wait().expect("reap");
    let at_kill = count(&engine_db, "SELECT COUNT(*) FROM workflows");
    let killed = Instant::now();

    // Never restarted: the first instance gets everything from now on.
    wait_done(&mut hr.0, &mut first.0);
    eprintln!(
        "two engines: {by_first} + {by_second} processed before the SIGKILL, \
         {at_kill} of {hires} workflows at the kill, done {:?} later",
        killed.elapsed()
    );
    assert!(
        at_kill < hires,
        "the kill happened mid-stream ({at_kill} of {hires})"
    );
    assert_exactly_once(dir.path(), hires);
}

/// The gRPC ports of both services (`--grpc-listen`) beside their HTTP ones.
struct GrpcPorts {
    hr: u16,
    engine: u16,
}

/// A demo service on its HTTP port and database in `dir`, sending to its
/// peer at `peer_url`, with `extra` flags (e.g. another way to receive).
fn service(dir: &Path, peers: &Peers, hr: bool, peer_url: &str, extra: &[String]) -> Command {
    let (binary, port, db, secret, peer_secret) = if hr {
        let binary = env!("CARGO_BIN_EXE_hr-service");
        (
            binary,
            peers.hr_port,
            "hr.db",
            &peers.hr_secret,
            &peers.engine_secret,
        )
    } else {
        let binary = env!("CARGO_BIN_EXE_engine");
        (
            binary,
            peers.engine_port,
            "engine.db",
            &peers.engine_secret,
            &peers.hr_secret,
        )
    };
    let mut command = Command::new(binary);
    command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--db")
        .arg(dir.join(db))
        .args(["--peer-url", peer_url])
        .args(["--secret", secret, "--peer-secret", peer_secret])
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(extra)
        .stdout(Stdio::null());
    command
}

/// An engine that receives over gRPC too and sends to HR over gRPC.
fn engine_over_grpc(dir: &Path, peers: &Peers, grpc: &GrpcPorts) -> Child {
    let listen = [
        "--grpc-listen".to_owned(),
        format!("127.0.0.1:{}", grpc.engine),
    ];
    service(
        dir,
        peers,
        false,
        &format!("grpc://127.0.0.1:{}", grpc.hr),
        &listen,
    )
    .spawn()
    .expect("start engine")
}

/// An HR service that receives over gRPC too and sends to the engine over
/// gRPC (the spec's form of the URL, with the method's path).
fn hr_service_over_grpc(dir: &Path, peers: &Peers, grpc: &GrpcPorts, hires: i64) -> Child {
    let flags = [
        "--grpc-listen".to_owned(),
        format!("127.0.0.1:{}", grpc.hr),
        "--hire".to_owned(),
        hires.to_string(),
        "--exit-when-done".to_owned(),
    ];
    let peer = format!("grpc://127.0.0.1:{}/RFReceiver/Receive", grpc.engine);
    service(dir, peers, true, &peer, &flags)
        .spawn()
        .expect("start hr-service")
}

#[test]
fn exactly_once_over_grpc_both_ways_across_a_sigkilled_and_restarted_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peers = peers(dir.path());
    let grpc = GrpcPorts {
        hr: free_port(),
        engine: free_port(),
    };
    let hires = 100;
    let mut engine_process = engine_over_grpc(dir.path(), &peers, &grpc);
    let mut hr = hr_service_over_grpc(dir.path(), &peers, &grpc, hires);

    let engine_db = dir.path().join("engine.db");
    wait_for_count(&engine_db, "SELECT COUNT(*) FROM workflows", 10);
    engine_process.kill().expect("SIGKILL the engine");
    engine_process.wait().expect("reap");
    let at_kill = count(&engine_db, "SELECT COUNT(*) FROM workflows");
    let mut engine_process = engine_over_grpc(dir.path(), &peers, &grpc);

    wait_done(&mut hr, &mut engine_process);
    assert!(
        at_kill < hires,
        "the kill happened mid-stream ({at_kill} of {hires})"
    );
    // Both peer URLs are grpc://: every message went over gRPC.
    assert_exactly_once(dir.path(), hires);
}

/// Both services only through NATS JetStream: each publishes to the other's
/// stream (`--peer-url nats://…`) and consumes its own (`--nats`), and the
/// engine's command answers come back through the broker. The engine is
/// SIGKILLed mid-stream (messages in its hands come back after the demo's
/// 5 s `ack_wait`) and restarted: every hire exactly once.
#[test]
fn exactly_once_over_jetstream_both_ways_across_a_sigkilled_and_restarted_engine() {
    let Some(binary) = std::env::var_os("RFIDL_NATS_SERVER") else {
        assert!(
            std::env::var_os("RFIDL_REQUIRE_NATS").is_none(),
            "RFIDL_REQUIRE_NATS is set but RFIDL_NATS_SERVER is not"
        );
        eprintln!("SKIPPED: set RFIDL_NATS_SERVER to a nats-server binary (cargo xtask test does)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let nats_port = free_port();
    let mut nats = Command::new(binary)
        .args(["-js", "-a", "127.0.0.1", "-p", &nats_port.to_string()])
        .arg("-sd")
        .arg(dir.path().join("jetstream"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", nats_port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = |subject: &str| format!("nats://127.0.0.1:{nats_port}/{subject}");
    let peers = peers(dir.path());
    let hires = 100;
    let engine = || {
        service(
            dir.path(),
            &peers,
            false,
            &url("hr"),
            &["--nats".into(), url("engine")],
        )
        .spawn()
        .expect("start engine")
    };
    let mut engine_process = engine();
    let hr_flags = [
        "--nats".to_owned(),
        url("hr"),
        "--hire".to_owned(),
        hires.to_string(),
        "--exit-when-done".to_owned(),
    ];
    let mut hr = service(dir.path(), &peers, true, &url("engine"), &hr_flags)
        .spawn()
        .expect("start hr-service");

    let engine_db = dir.path().join("engine.db");
    wait_for_count(&engine_db, "SELECT COUNT(*) FROM workflows", 10);
    engine_process.kill().expect("SIGKILL the engine");
    engine_process.wait().expect("reap");
    let at_kill = count(&engine_db, "SELECT COUNT(*) FROM workflows");
    let mut engine_process = engine();

    wait_done(&mut hr, &mut engine_process);
    let _ = nats.kill();
    let _ = nats.wait();
    assert!(
        at_kill < hires,
        "the kill happened mid-stream ({at_kill} of {hires})"
    );
    // HTTP was never dialled: both peer URLs are nats://.
    assert_exactly_once(dir.path(), hires);
}
