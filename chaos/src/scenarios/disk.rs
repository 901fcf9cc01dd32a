//! Faults of the disk: a full filesystem under the receiver's database
//! (`disk-full`, a tmpfs, needs root) and damaged or too-new database
//! files that every binary must refuse at start, unchanged (`corrupt-db`).
//! It only ever damages files it created for the scenario.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use rfidl_runtime::rusqlite::Connection;
use rfidl_runtime::signing::Secret;

use super::super::Context;
use super::super::cluster::{Cluster, free_port, wait_listening};
use super::super::report::Report;
use rfidl_examples::demo::verdict::Verdict;

/// The engine's database lives on a tmpfs that a filler file leaves almost
/// full: its commits fail with "database or disk is full" until the
/// filler goes. Then it must recover and drain, with `integrity_check` ok.
pub(crate) async fn disk_full(context: &Context) -> anyhow::Result<Report> {
    let mount = context.dir.join("small-disk");
    std::fs::create_dir_all(&mount)?;
    // Room for the whole run once space returns (about 4 KiB per hire for
    // the engine's rows, WAL and inbox), whatever `--messages` says.
    let size = format!("size={}k", 64 * 1024 + u64::from(context.messages) * 4);
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
        .arg(&mount)
        .status()
        .context("run mount (the disk-full scenario needs root for a tmpfs)")?;
    ensure!(
        status.success(),
        "cannot mount a tmpfs at {} (needs root)",
        mount.display()
    );
    let unmount = Unmount(mount.clone());
    let mut cluster = Cluster::new(context)?;
    cluster.engine_db = mount.join("engine.db");
    cluster.start_engine()?;
    wait_listening(cluster.engine_port, Duration::from_secs(10)).await?;
    // Leave 64 KiB: the engine's next WAL frames do not fit.
    let filler = mount.join("filler");
    fill_disk(&mount, &filler, 64 * 1024)?;
    cluster.start_hr()?;
    let full_for = Duration::from_secs(5);
    tokio::time::sleep(full_for).await;
    cluster.check_alive()?;
    let errors = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending') AND last_error IS NOT NULL",
    );
    let failed_during = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
    );
    std::fs::remove_file(&filler)?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    let integrity: String =
        Connection::open(&cluster.engine_db)?
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    drop(unmount);
    let mut verdict = verdict;
    if integrity != "ok" {
        verdict.lost += 1;
    }
    Ok(Report {
        messages: context.messages,
        faults: 1,
        verdict,
        drained_in,
        notes: vec![format!(
            "full_for={}s rows_refused_while_full={errors} failed_during={failed_during} integrity={integrity}",
            full_for.as_secs()
        )],
    })
}

/// Unmounts a scenario's tmpfs when dropped.
pub(crate) struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writes `filler` until `mount` has only about `leave` bytes free.
pub(crate) fn fill_disk(mount: &Path, filler: &Path, leave: u64) -> anyhow::Result<()> {
    let output = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(mount)
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let available: u64 = text
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .context("df gives the free space")?;
    let mut file = std::fs::File::create(filler)?;
    let chunk = vec![0u8; 1 << 20];
    let mut left = available.saturating_sub(leave);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(())
}

/// A database written by a newer schema (rollback journal), one with 8 KiB
/// of garbage in the middle, and a file that is no database: every binary
/// refuses each at start with a clear error, and leaves it byte-for-byte
/// unchanged.
pub(crate) async fn corrupt_db(context: &Context) -> anyhow::Result<Report> {
    let dir = &context.dir;
    let mut faults = 0;
    let mut failures = Vec::new();
    let secret = Secret::generate().to_whsec();
    for (kind, make) in [
        ("newer", make_newer as fn(&Path) -> anyhow::Result<()>),
        ("garbage", make_garbage),
        ("not-a-db", make_not_a_db),
    ] {
        for binary in ["hr-service", "engine", "rfidl-registry"] {
            let db = dir.join(format!("{binary}-{kind}.db"));
            make(&db)?;
            let before = std::fs::read(&db)?;
            let port = free_port()?;
            let mut command = Command::new(context.bins.join(binary));
            if binary == "rfidl-registry" {
                command
                    .arg("serve")
                    .arg("--db")
                    .arg(&db)
                    .args(["--listen", &format!("127.0.0.1:{port}")]);
            } else {
                command
                    .args(["--listen", &format!("127.0.0.1:{port}")])
                    .arg("--db")
                    .arg(&db)
                    .args(["--peer-url", "http://127.0.0.1:9"])
                    .args(["--secret", &secret, "--peer-secret", &secret]);
            }
            let mut child = command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("start {binary}"))?;
            let started = Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait()? {
                    break Some(status);
                }
                if started.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            faults += 1;
            let unchanged = std::fs::read(&db)? == before;
            let clear = stderr.contains("refusing") || stderr.contains("damaged");
            match status {
                Some(status) if !status.success() && unchanged && clear => {}
                other => failures.push(format!(
                    "{binary}/{kind}: exit {other:?}, unchanged={unchanged}, stderr: {}",
                    stderr.lines().last().unwrap_or("")
                )),
            }
        }
    }
    for failure in &failures {
        eprintln!("chaos corrupt-db: {failure}");
    }
    Ok(Report {
        messages: 0,
        faults,
        verdict: Verdict {
            lost: failures.len() as i64,
            ..Verdict::default()
        },
        drained_in: Some(Duration::ZERO),
        notes: vec![format!(
            "binaries=3 files=3 refused_unchanged={}",
            faults - failures.len() as u64
        )],
    })
}

pub(crate) fn make_newer(path: &Path) -> anyhow::Result<()> {
    let conn = Connection::open(path)?;
    conn.execute_batch("CREATE TABLE from_the_future (x); PRAGMA user_version = 99;")?;
    Ok(())
}

pub(crate) fn make_garbage(path: &Path) -> anyhow::Result<()> {
    {
        let conn = rfidl_runtime::store::sqlite::open(path, rfidl_runtime::Durability::Normal)?;
        conn.execute_batch(
            "CREATE TABLE filler (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
             CREATE INDEX filler_text ON filler (text);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
             INSERT INTO filler (text) SELECT printf('row %d %s', i, hex(randomblob(40))) FROM n;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )?;
    }
    let len = std::fs::metadata(path)?.len();
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    use std::io::{Seek as _, SeekFrom};
    file.seek(SeekFrom::Start(len / 2))?;
    file.write_all(&[0xA5; 8192])?;
    Ok(())
}

pub(crate) fn make_not_a_db(path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, vec![b'x'; 8192])?;
    Ok(())
}
