//! Production operations: `/_rf/metrics` by Prometheus conventions (checked
//! with the real `promtool`), `/_rf/livez` and `/_rf/readyz` against a real
//! database locked by another connection and a dispatcher that was shut
//! down, and payload values kept out of what an operator is shown.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rfidl_runtime::Durability;
use rfidl_runtime::diagnostics::Diagnostics;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, Status};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::transport::HttpTransport;
use serde_json::{Value, json};

use crate::dispatcher::{enqueue, message, sender_config, wait_for};
use crate::support::{self, serve};

/// `promtool`: `RFIDL_PROMTOOL`, else on PATH. Missing, the test skips
/// loudly, unless `RFIDL_REQUIRE_PROMTOOL=1` (set by `cargo xtask test`,
/// which installs it) makes that a failure.
fn promtool() -> Option<PathBuf> {
    let candidate = std::env::var_os("RFIDL_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("promtool"));
    let works = Command::new(&candidate)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Some(candidate);
    }
    if std::env::var("RFIDL_REQUIRE_PROMTOOL").as_deref() == Ok("1") {
        panic!("RFIDL_REQUIRE_PROMTOOL=1 but promtool does not run: use `cargo xtask test`");
    }
    eprintln!(
        "SKIPPED promtool check: promtool not found (set RFIDL_PROMTOOL or run `cargo xtask test`)"
    );
    None
}

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
        .parse()
        .expect("a number")
}

/// A sender whose `ledger` destination is a real receiver: one message is
/// delivered, one is refused for good by the handler, one carries a
/// payload the contract refuses (its values must not surface), and one for
/// `later` waits, 90 s old.
#[tokio::test]
async fn metrics_follow_prometheus_conventions_per_destination() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), support::receiver_config(&[&secret])).await;
    let db = dir.path().join("sender.db");
    let mut config = sender_config(Duration::from_millis(20));
    config.destinations.insert(
        "later".into(),
        rfidl_runtime::config::DestinationConfig::new(
            "http://127.0.0.1:9",
            Secret::generate().to_whsec(),
        ),
    );
    let outbox = Outbox::new(config, &db);
    let later = enqueue(&outbox, &db, message("later", "Credit", json!({})));
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute(
        "UPDATE outbox_messages SET created_at = ?2, next_retry_at = ?3 WHERE message_id = ?1",
        rusqlite::params![
            later.to_string(),
            rfidl_runtime::store::now_ms() - 90_000,
            rfidl_runtime::store::now_ms() + 3_600_000
        ],
    )
    .expect("age the waiting row");
    let sent = enqueue(
        &outbox,
        &db,
        message("ledger", "Credit", json!({"account": "a", "amount": 5})),
    );
    let poison = enqueue(&outbox, &db, message("ledger", "Poison", json!({})));
    let personal = enqueue(
        &outbox,
        &db,
        message(
            "ledger",
            "Credit",
            json!({"account": "a", "amount": "Salary 250000 EUR; bonus"}),
        ),
    );
    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    wait_for(&db, &sent, Status::Sent).await;
    wait_for(&db, &poison, Status::DeadLetter).await;
    let refused = wait_for(&db, &personal, Status::DeadLetter).await;

    let ops = Diagnostics::builder(&db)
        .outbox(&outbox)
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;

    // Payload values reach neither the stored error nor the failed list.
    let (_, failed) = get(&format!("{url}/_rf/outbox/failed")).await;
    for shown in [failed.as_str(), refused.last_error.as_deref().unwrap_or("")] {
        assert!(
            !shown.contains("250000"),
            "a payload value is shown: {shown}"
        );
    }
    assert!(
        failed.contains("`amount`: invalid type: string, expected i64"),
        "the error still says what is wrong and where: {failed}"
    );

    let (status, text) = get(&format!("{url}/_rf/metrics")).await;
    assert_eq!(status, 200);
    assert_eq!(sample(&text, "rf_outbox_sent_total"), 1.0);
    assert_eq!(sample(&text, "rf_outbox_dead_lettered_total"), 2.0);
    assert_eq!(
        sample(&text, "rf_outbox_pending_messages{destination=\"later\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "rf_outbox_pending_messages{destination=\"ledger\"}"),
        0.0
    );
    let age = sample(
        &text,
        "rf_outbox_oldest_pending_age_seconds{destination=\"later\"}",
    );
    assert!((90.0..120.0).contains(&age), "age {age}");
    assert_eq!(
        sample(
            &text,
            "rf_outbox_attention_messages{destination=\"ledger\",status=\"DeadLetter\"}"
        ),
        2.0
    );
    assert_eq!(
        sample(
            &text,
            "rf_outbox_attention_messages{destination=\"ledger\",status=\"Failed\"}"
        ),
        0.0
    );
    assert_eq!(sample(&text, "rf_outbox_send_duration_seconds_count"), 3.0);
    assert!(sample(&text, "rf_outbox_send_duration_seconds_sum") < 6.0);
    assert!(
        !text.contains("_ms"),
        "no millisecond metric is left:\n{text}"
    );
    dispatcher.shutdown().await;

    let Some(promtool) = promtool() else { return };
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write as _;
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let output = check.wait_with_output().expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && report.trim().is_empty(),
        "promtool check metrics: {}\n{report}\n---\n{text}",
        output.status
    );
}

/// The exposition promtool complains about, to prove the check can fail.
#[test]
fn promtool_refuses_the_predecessors_names() {
    let Some(promtool) = promtool() else { return };
    let old = "# HELP rf_outbox_retry_count Attempts.\n# TYPE rf_outbox_retry_count counter\nrf_outbox_retry_count 1\n";
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write as _;
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(old.as_bytes())
        .expect("feed");
    let output = check.wait_with_output().expect("promtool");
    let report = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(report.contains("_total"), "{report}");
}

fn readiness_of(body: &str) -> (Vec<String>, Value) {
    let body = json_of(body);
    let failed = body["failed"]
        .as_array()
        .expect("failed")
        .iter()
        .map(|v| v.as_str().expect("name").to_owned())
        .collect();
    (failed, body["checks"].clone())
}

async fn readyz(url: &str) -> (u16, Vec<String>, Value) {
    let (status, body) = get(&format!("{url}/_rf/readyz")).await;
    let (failed, checks) = readiness_of(&body);
    (status, failed, checks)
}

fn set_user_version(db: &Path, version: i64) {
    rusqlite::Connection::open(db)
        .and_then(|c| c.execute_batch(&format!("PRAGMA user_version = {version}")))
        .expect("user_version");
}

#[tokio::test]
async fn readiness_follows_the_database_and_the_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let mut config = support::receiver_config(&[&secret]);
    config.outbox = sender_config(Duration::from_millis(50)).outbox;
    let receiver = support::start_receiver(dir.path(), config.clone()).await;
    let db = receiver.db.clone();
    let outbox = Outbox::new(config, &db);
    let ops = Diagnostics::builder(&db)
        .outbox(&outbox)
        .receiver(&receiver.receiver)
        .bearer_token("ops-token")
        .readiness_timeout(Duration::from_millis(200))
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;

    // No dispatcher yet: a service with an outbox is not ready without one.
    let (status, failed, checks) = readyz(&url).await;
    assert_eq!((status, failed), (503, vec!["dispatcher".to_owned()]));
    assert_eq!(checks["dispatcher"], "not started");

    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
    let (status, failed, checks) = readyz(&url).await;
    assert_eq!((status, failed.len()), (200, 0), "{checks}");
    for check in ["database", "migrations", "dispatcher", "receiver_writer"] {
        assert_eq!(checks[check], "ok", "{checks}");
    }
    // Probes need no token; the other routes still do.
    assert_eq!(get(&format!("{url}/_rf/livez")).await.0, 200);
    assert_eq!(get(&format!("{url}/_rf/health")).await.0, 401);

    // Another connection holds the write lock: not ready, and it says why.
    let mut locker = rusqlite::Connection::open(&db).expect("open");
    let lock = locker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("write lock");
    let (status, failed, checks) = readyz(&url).await;
    assert_eq!((status, failed), (503, vec!["database".to_owned()]));
    assert!(
        checks["database"].as_str().unwrap().contains("locked"),
        "{checks}"
    );
    assert_eq!(get(&format!("{url}/_rf/livez")).await.0, 200, "still alive");
    lock.rollback().expect("release");
    assert_eq!(readyz(&url).await.0, 200);

    // A schema this build does not know (or one not migrated).
    set_user_version(&db, db::MIGRATIONS.len() as i64 + 1);
    let (status, failed, _) = readyz(&url).await;
    assert_eq!((status, failed), (503, vec!["migrations".to_owned()]));
    set_user_version(&db, db::MIGRATIONS.len() as i64);

    dispatcher.shutdown().await;
    let (status, failed, checks) = readyz(&url).await;
    assert_eq!((status, failed), (503, vec!["dispatcher".to_owned()]));
    assert_eq!(checks["dispatcher"], "stopped");

    receiver.receiver.shutdown().await;
    let (status, failed, _) = readyz(&url).await;
    assert_eq!(
        (status, failed),
        (
            503,
            vec!["dispatcher".to_owned(), "receiver_writer".to_owned()]
        )
    );
    let _ = db::open(&db, Durability::Normal).expect("the database is intact");
}
