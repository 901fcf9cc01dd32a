//! The engine's failure handler (issue 30, point 3): a `ProvisionLaptop`
//! command that cannot reach HR before its time to live ends `Expired`, and
//! the engine opens exactly one ticket for a human, in the transaction that
//! ends the command. Both services run in this process on real SQLite
//! files, over real HTTP on loopback; HR's laptop desk is a port nobody
//! listens on.

use std::time::{Duration, Instant};

use rfidl_examples::demo::Settings;
use rfidl_examples::demo::engine::Engine;
use rfidl_examples::demo::hr::HrService;
use rfidl_runtime::Config;
use rfidl_runtime::signing::Secret;

fn count(db: &std::path::Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
        .unwrap_or(0)
}

fn settings(id: &str, peer: &str, db: std::path::PathBuf, peer_url: String) -> Settings {
    Settings {
        service_id: id.into(),
        listen: "127.0.0.1:0".parse().expect("address"),
        grpc_listen: None,
        db: db.into(),
        peer_id: peer.into(),
        peer_url,
        peer_urls: Vec::new(),
        signing_secret: String::new(),
        peer_secret: String::new(),
        base_config: None,
        registry: None,
        nats: None,
        amqp: None,
        ops_token: None,
        registry_publish_token: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laptop_command_that_expires_opens_one_ticket_for_a_human() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (to_hr, to_engine) = (Secret::generate(), Secret::generate());
    // Nobody listens here: the engine's commands cannot reach HR.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut quick_expiry = Config::default();
    quick_expiry.outbox.ttl = Duration::from_millis(1500);
    quick_expiry.outbox.backoff_base = Duration::from_millis(50);
    quick_expiry.outbox.backoff_max = Duration::from_millis(200);
    quick_expiry.outbox.probe_interval_max = Duration::from_millis(200);
    let engine_db = dir.path().join("engine.db");
    let mut engine = settings(
        "engine",
        "hr-service",
        engine_db.clone(),
        format!("http://{closed}"),
    );
    engine.signing_secret = to_hr.to_whsec();
    engine.peer_secret = to_engine.to_whsec();
    engine.base_config = Some(quick_expiry);
    let engine = Engine::start(&engine).await.expect("engine");
    let mut hr = settings(
        "hr-service",
        "engine",
        dir.path().join("hr.db"),
        engine.url.clone(),
    );
    hr.signing_secret = to_engine.to_whsec();
    hr.peer_secret = to_hr.to_whsec();
    let hr = HrService::start(&hr).await.expect("hr");

    let employee = hr.hire(1).await.expect("hire");
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&engine_db, "SELECT COUNT(*) FROM human_tickets") == 0 {
        assert!(
            Instant::now() < deadline,
            "no ticket for a human after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Time for a second one, should anything open it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count(
            &engine_db,
            &format!(
                "SELECT COUNT(*) FROM human_tickets WHERE employee_id = '{employee}' \
                 AND status = 'Expired' AND reason = 'time to live exceeded' \
                 AND model = 'ThinkPad T14'"
            )
        ),
        1,
        "one ticket, for the expired command"
    );
    assert_eq!(count(&engine_db, "SELECT COUNT(*) FROM human_tickets"), 1);
    assert_eq!(
        count(
            &engine_db,
            "SELECT COUNT(*) FROM outbox_messages WHERE endpoint = 'ProvisionLaptop' \
             AND status = 'Expired'"
        ),
        1
    );
    assert_eq!(
        count(&engine_db, "SELECT COUNT(*) FROM workflows"),
        1,
        "the hire itself went through"
    );
    hr.host.shutdown().await.expect("hr stops");
    engine.stop().await.expect("engine stops");
}
