//! Both services through NATS JetStream while HR, the engine and the broker
//! are SIGKILLed in turn (`jetstream`), with the `nats-server` process it
//! needs. Needs `RFIDL_NATS_SERVER`; the broker's store lives in the
//! scenario's folder only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use rand::rngs::StdRng;

use super::super::Context;
use super::super::cluster::{Cluster, free_port, wait_listening};
use super::super::report::Report;
use super::kills::{kill_rounds, kill_slow_handlers};

/// A `nats-server` with JetStream on a loopback port and a store directory
/// that outlives its process, so a SIGKILLed server restarts on its data.
pub(crate) struct NatsServer {
    pub(crate) binary: PathBuf,
    pub(crate) store: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) port: u16,
    pub(crate) child: Option<Child>,
}

impl NatsServer {
    pub(crate) fn start(dir: &Path) -> anyhow::Result<Self> {
        let binary = std::env::var_os("RFIDL_NATS_SERVER").map(PathBuf::from).context(
            "`jetstream` needs nats-server: set RFIDL_NATS_SERVER (cargo xtask chaos installs one)",
        )?;
        let mut server = Self {
            binary,
            store: dir.join("jetstream"),
            log: dir.join("nats-server.log"),
            port: free_port()?,
            child: None,
        };
        server.restart()?;
        Ok(server)
    }

    pub(crate) fn restart(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-sd")
            .arg(&self.store)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("start {}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub(crate) fn kill(&mut self) {
        Cluster::kill(&mut self.child);
    }

    pub(crate) fn url(&self, subject: &str) -> String {
        format!("nats://127.0.0.1:{}/{subject}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Both services talk through NATS JetStream (each publishes to the other's
/// stream and consumes its own with a durable consumer; the engine's
/// command answers come back through the broker), while HR, the engine and
/// the broker itself are SIGKILLed in turn and restarted on their files.
pub(crate) async fn jetstream(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    let mut nats = NatsServer::start(&context.dir)?;
    wait_listening(nats.port, Duration::from_secs(10)).await?;
    let mut cluster = Cluster::new(context)?;
    cluster.hire_rate = (context.messages / 2).max(1);
    cluster.hr_peer = nats.url("engine");
    cluster.engine_peer = nats.url("hr");
    cluster.hr_flags = vec!["--nats".into(), nats.url("hr")];
    cluster.engine_flags = vec!["--nats".into(), nats.url("engine")];
    cluster
        .engine_flags
        .extend(kill_slow_handlers(context.messages));
    cluster.start_engine()?;
    cluster.start_hr()?;
    wait_listening(cluster.engine_port, Duration::from_secs(10)).await?;
    let mut broker_kills = 0;
    let faults = kill_rounds(
        &mut (&mut cluster, &mut nats),
        rng,
        context.kills,
        |(cluster, _)| cluster.check_alive(),
        |(cluster, nats), round| {
            match round % 3 {
                0 => cluster.kill_hr(),
                1 => cluster.kill_engine(),
                _ => {
                    nats.kill();
                    broker_kills += 1;
                }
            }
            1
        },
        |(cluster, nats), round| match round % 3 {
            0 => cluster.start_hr(),
            1 => cluster.start_engine(),
            _ => nats.restart(),
        },
    )
    .await?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    nats.kill();
    Ok(Report {
        messages: context.messages,
        faults,
        verdict,
        drained_in,
        notes: vec![format!("broker_kills={broker_kills}")],
    })
}
