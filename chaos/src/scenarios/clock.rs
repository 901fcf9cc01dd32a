//! A receiver whose clock runs 10 minutes ahead (libfaketime), then fixed
//! (`clock-skew`). It changes no clock but the engine process's own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

use super::super::Context;
use super::super::cluster::{Cluster, wait_listening};
use super::super::report::Report;

/// The engine's clock runs 10 minutes ahead (libfaketime), past the 5 min
/// signature tolerance: both directions are refused, retried without
/// counting, and reported as a clock problem in `last_error` and HR's
/// `/_rf/health`. Then the clock is fixed (the engine restarted without the
/// skew) and everything drains.
pub(crate) async fn clock_skew(context: &Context) -> anyhow::Result<Report> {
    let library = faketime_library()?;
    let mut cluster = Cluster::new(context)?;
    cluster.engine_env = vec![
        ("LD_PRELOAD".into(), library.display().to_string()),
        ("FAKETIME".into(), "+10m".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    cluster.start_engine()?;
    cluster.start_hr()?;
    wait_listening(cluster.hr_port, Duration::from_secs(10)).await?;
    let started = Instant::now();
    let clock_rows = "SELECT COUNT(*) FROM outbox_messages WHERE last_error LIKE 'clock problem%'";
    while Cluster::count(&cluster.hr_db, clock_rows) == 0 {
        cluster.check_alive()?;
        ensure!(
            started.elapsed() < Duration::from_secs(20),
            "no clock problem reported by HR's outbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let health: serde_json::Value =
        reqwest::get(format!("http://127.0.0.1:{}/_rf/health", cluster.hr_port))
            .await?
            .json()
            .await?;
    let reported = health["reasons"].to_string().contains("clock problem");
    let refused = Cluster::count(&cluster.hr_db, clock_rows);
    let failed_during = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
    );
    // The operator fixes the clock.
    cluster.kill_engine();
    cluster.engine_env.clear();
    cluster.start_engine()?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let mut verdict = cluster.verdict()?;
    cluster.stop();
    if !reported {
        // Not reported where an operator looks: count it against the run.
        verdict.needs_a_human += 1;
    }
    Ok(Report {
        messages: context.messages,
        faults: 1,
        verdict,
        drained_in,
        notes: vec![format!(
            "skew=+10m refused_rows={refused} failed_during={failed_during} health={} clock_problem_in_health={reported}",
            health["status"].as_str().unwrap_or("?")
        )],
    })
}

/// libfaketime's preload library, installed from Debian's `faketime`
/// package when missing.
pub(crate) fn faketime_library() -> anyhow::Result<PathBuf> {
    let find = || -> Option<PathBuf> {
        [
            "/usr/lib/x86_64-linux-gnu/faketime",
            "/usr/lib/aarch64-linux-gnu/faketime",
            "/usr/lib/faketime",
        ]
        .iter()
        .map(|dir| Path::new(dir).join("libfaketime.so.1"))
        .find(|p| p.is_file())
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    eprintln!(
        "chaos: installing Debian's faketime package (libfaketime) for the clock-skew scenario"
    );
    let _ = Command::new("apt-get").args(["update", "-qq"]).status();
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "faketime"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("run apt-get")?;
    ensure!(status.success(), "apt-get install faketime failed");
    find().context("libfaketime.so.1 not found after installing faketime")
}
