//! Process control: both demo services as OS processes on loopback, each
//! on its own SQLite file ([`Cluster`]), started with the harness's
//! settings, SIGKILLed and restarted on the same files and ports; and the
//! measurements taken from outside (read-only counts of both databases,
//! the wait for the drain, the verdict).
//!
//! It never injects a fault of its own (the scenarios do) and never writes
//! to a service's database.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use rfidl_runtime::rusqlite::Connection;
use rfidl_runtime::signing::Secret;

use super::Context;
use rfidl_examples::demo::verdict::{Verdict, verdict};

/// Runtime settings of both services: quick retries, a lease above the
/// request timeout, probes of an unreachable peer at least every second.
/// (`slow-handler` shortens HR's request timeout to 1 s.)
pub(crate) const CONFIG: &str = "
outbox:
  backoff_base: 100ms
  backoff_max: 2s
  jitter: 100ms
  max_retries: 10
  request_timeout: 5s
  lease_timeout: 10s
  probe_interval_max: 1s
";

/// Both services' processes, ports and files.
pub(crate) struct Cluster {
    pub(crate) bins: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) hr_db: PathBuf,
    pub(crate) engine_db: PathBuf,
    pub(crate) hr_port: u16,
    pub(crate) engine_port: u16,
    /// What HR dials for the engine, and the engine for HR (a proxy's
    /// address, or the peer itself).
    pub(crate) hr_peer: String,
    pub(crate) engine_peer: String,
    pub(crate) hr_secret: String,
    pub(crate) engine_secret: String,
    pub(crate) messages: u32,
    pub(crate) hire_rate: u32,
    pub(crate) engine_flags: Vec<String>,
    pub(crate) hr_flags: Vec<String>,
    pub(crate) engine_env: Vec<(String, String)>,
    pub(crate) hr_env: Vec<(String, String)>,
    pub(crate) hr: Option<Child>,
    pub(crate) engine: Option<Child>,
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Cluster {
    pub(crate) fn new(context: &Context) -> anyhow::Result<Self> {
        std::fs::write(context.dir.join("config.yaml"), CONFIG)?;
        let (hr_port, engine_port) = (free_port()?, free_port()?);
        Ok(Self {
            bins: context.bins.clone(),
            dir: context.dir.clone(),
            hr_db: context.dir.join("hr.db"),
            engine_db: context.dir.join("engine.db"),
            hr_port,
            engine_port,
            hr_peer: format!("http://127.0.0.1:{engine_port}"),
            engine_peer: format!("http://127.0.0.1:{hr_port}"),
            hr_secret: Secret::generate().to_whsec(),
            engine_secret: Secret::generate().to_whsec(),
            messages: context.messages,
            hire_rate: 0,
            engine_flags: Vec::new(),
            hr_flags: Vec::new(),
            engine_env: Vec::new(),
            hr_env: Vec::new(),
            hr: None,
            engine: None,
        })
    }

    pub(crate) fn log(&self, name: &str) -> anyhow::Result<Stdio> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))?;
        Ok(Stdio::from(file))
    }

    /// Starts one demo service with the flags both take, on this cluster's
    /// files and ports; its output goes to `<log>.log`.
    pub(crate) fn spawn(
        &self,
        binary: &str,
        log: &str,
        (port, db, peers): (u16, &std::ffi::OsStr, &[&str]),
        (secret, peer_secret): (&str, &str),
        customize: impl FnOnce(&mut Command),
    ) -> anyhow::Result<Child> {
        let mut command = Command::new(self.bins.join(binary));
        command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--db")
            .arg(db)
            .args(peers.iter().flat_map(|peer| ["--peer-url", peer]))
            .args(["--secret", secret])
            .args(["--peer-secret", peer_secret])
            .arg("--config")
            .arg(self.dir.join("config.yaml"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(self.log(log)?)
            .stderr(self.log(log)?);
        customize(&mut command);
        command.spawn().with_context(|| format!("start {binary}"))
    }

    pub(crate) fn start_hr(&mut self) -> anyhow::Result<()> {
        let (messages, rate) = (self.messages.to_string(), self.hire_rate.to_string());
        let (flags, env) = (self.hr_flags.clone(), self.hr_env.clone());
        let child = self.spawn(
            "hr-service",
            "hr",
            (self.hr_port, self.hr_db.as_os_str(), &[&self.hr_peer]),
            (&self.hr_secret, &self.engine_secret),
            |command| {
                command
                    .args(["--hire", &messages])
                    .args(["--hire-rate", &rate])
                    .args(&flags)
                    .envs(env);
            },
        )?;
        self.hr = Some(child);
        Ok(())
    }

    pub(crate) fn start_engine(&mut self) -> anyhow::Result<()> {
        let (flags, env) = (self.engine_flags.clone(), self.engine_env.clone());
        let child = self.spawn(
            "engine",
            "engine",
            (
                self.engine_port,
                self.engine_db.as_os_str(),
                &[&self.engine_peer],
            ),
            (&self.engine_secret, &self.hr_secret),
            |command| {
                command.args(&flags).envs(env);
            },
        )?;
        self.engine = Some(child);
        Ok(())
    }

    /// SIGKILL (std's `Child::kill` on Unix), then reap.
    pub(crate) fn kill(child: &mut Option<Child>) {
        if let Some(mut child) = child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn kill_hr(&mut self) {
        Self::kill(&mut self.hr);
    }

    pub(crate) fn kill_engine(&mut self) {
        Self::kill(&mut self.engine);
    }

    /// A process that exited on its own is a failure of the scenario.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, log, child) in [
            ("hr-service", "hr.log", &mut self.hr),
            ("engine", "engine.log", &mut self.engine),
        ] {
            if let Some(child) = child
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "{name} exited by itself ({status}); see {}",
                    self.dir.join(log).display()
                );
            }
        }
        Ok(())
    }

    pub(crate) fn count(db: &Path, sql: &str) -> i64 {
        Connection::open(db)
            .and_then(|c| c.query_row(sql, [], |r| r.get::<_, Option<i64>>(0)))
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Everything hired, delivered, handled and acknowledged both ways.
    pub(crate) fn drained(&self) -> bool {
        let open = "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')";
        let hires = i64::from(self.messages);
        Self::count(&self.hr_db, "SELECT COUNT(*) FROM employees") >= hires
            && Self::count(&self.hr_db, open) == 0
            && Self::count(&self.engine_db, open) == 0
            && Self::count(&self.hr_db, "SELECT COUNT(*) FROM laptop_tickets") >= hires
            && Self::count(&self.engine_db, "SELECT COUNT(*) FROM outbox_messages") >= hires
    }

    /// Waits for the drain; `None` if it did not come within `timeout`.
    pub(crate) async fn wait_drained(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<Option<Duration>> {
        let started = Instant::now();
        loop {
            self.check_alive()?;
            if self.drained() {
                return Ok(Some(started.elapsed()));
            }
            if started.elapsed() > timeout {
                return Ok(None);
            }
            // The check counts whole tables: poll a large run less often.
            let pause = if self.messages > 10_000 { 500 } else { 50 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    pub(crate) fn verdict(&self) -> anyhow::Result<Verdict> {
        verdict(&self.hr_db, &self.engine_db)
    }

    pub(crate) fn stop(&mut self) {
        self.kill_hr();
        self.kill_engine();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `port` accepts connections (a restarted process is up).
pub(crate) async fn wait_listening(port: u16, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        ensure!(
            started.elapsed() < limit,
            "nothing listens on {port} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
