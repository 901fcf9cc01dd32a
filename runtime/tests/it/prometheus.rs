//! Operators' expectations: a real Prometheus (Debian package `prometheus`,
//! started on a free loopback port with a generated scrape config that sends
//! the diagnostics token) scrapes `/_rf/metrics`; the test reads the
//! `rf_outbox_*` series back through Prometheus's HTTP API.
//!
//! (`promtool check metrics` still flags the metric names kept from the
//! predecessor spec: counters without `_total`, gauges ending in `_count`,
//! `_ms` units; renaming them is a separate, breaking change.)
//!
//! The binary is `$RFIDL_PROMETHEUS_BIN/prometheus` or `/usr/bin/prometheus`. Without them the test is skipped with a loud message,
//! unless `RFIDL_REQUIRE_PROMETHEUS=1` (set by `cargo xtask test`, which
//! installs the package), which makes it a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rfidl_runtime::config::Durability;
use rfidl_runtime::diagnostics::Diagnostics;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::{Config, MessageType};
use serde_json::json;

use crate::support::serve;

fn binaries() -> Option<PathBuf> {
    let dir = std::env::var_os("RFIDL_PROMETHEUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin"));
    let prometheus = dir.join("prometheus");
    if prometheus.exists() {
        return Some(prometheus);
    }
    if std::env::var("RFIDL_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
        panic!(
            "RFIDL_REQUIRE_PROMETHEUS=1 but prometheus is not in {}: run `cargo xtask test` (it \
             installs the Debian package prometheus)",
            dir.display()
        );
    }
    eprintln!(
        "SKIPPED: prometheus is not in {} (apt-get install prometheus, or `cargo xtask test`)",
        dir.display()
    );
    None
}

/// `n` pending messages in a real outbox at `path`.
fn pending(path: &Path, n: usize) -> Outbox {
    let outbox = Outbox::new(Config::default(), path);
    let mut conn = db::open(path, Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    for i in 0..n {
        outbox
            .enqueue(
                &tx,
                OutgoingMessage {
                    destination: "ledger".into(),
                    message_type: MessageType::Command,
                    interface: "billing.Ledger".into(),
                    version: 1,
                    fingerprint: "sha256:test".into(),
                    endpoint: "Credit".into(),
                    correlation_id: None,
                    payload: json!({"amount": i}),
                    headers: Default::default(),
                    max_retries: None,
                    ttl: None,
                    deliver_at: None,
                },
            )
            .expect("enqueue");
    }
    tx.commit().expect("commit");
    outbox
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_prometheus_scrapes_the_metrics_with_the_token() {
    let Some(prometheus) = binaries() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("service.db");
    let outbox = pending(&path, 7);
    let ops = Diagnostics::builder(&path)
        .outbox(&outbox)
        .bearer_token("scrape-token")
        .build()
        .expect("diagnostics");
    let (url, _server) = serve(ops.router()).await;
    let client = reqwest::Client::new();
    let text = client
        .get(format!("{url}/_rf/metrics"))
        .bearer_auth("scrape-token")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        text.contains("rf_outbox_pending_messages{destination=\"ledger\"} 7"),
        "{text}"
    );

    let target = url.trim_start_matches("http://");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: rfidl\n    \
             metrics_path: /_rf/metrics\n    authorization:\n      credentials: scrape-token\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut server = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    let started = Instant::now();
    let query = format!("http://127.0.0.1:{port}/api/v1/query");
    let mut found = None;
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(response) = client
            .get(&query)
            .query(&[("query", "sum(rf_outbox_pending_messages{job=\"rfidl\"})")])
            .send()
            .await
            && let Ok(body) = response.json::<serde_json::Value>().await
            && let Some(value) = body["data"]["result"][0]["value"][1].as_str()
        {
            found = Some(value.to_owned());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let up = client
        .get(&query)
        .query(&[("query", "up{job=\"rfidl\"}")])
        .send()
        .await
        .ok();
    let up = match up {
        Some(response) => response.text().await.unwrap_or_default(),
        None => String::new(),
    };
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(found.as_deref(), Some("7"), "up: {up}");
    eprintln!(
        "Prometheus scraped rf_outbox_pending_messages=7 after {:?}",
        started.elapsed()
    );
}
