//! Both services through an AMQP 1.0 broker while HR, the engine and the
//! broker are SIGKILLed in turn (`amqp`), with the RabbitMQ node it needs:
//! Debian's `rabbitmq-server` (`RFIDL_RABBITMQ_SERVER`, else
//! `/usr/sbin/rabbitmq-server`; `cargo xtask chaos` installs it) with its
//! `rabbitmq_amqp1_0` plugin, a node name, loopback ports and a data
//! directory of its own in the scenario's folder, so a SIGKILLed node
//! restarts on its data.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::rngs::StdRng;

use super::super::Context;
use super::super::cluster::{Cluster, free_port, wait_listening};
use super::super::report::Report;
use super::kills::{kill_rounds, kill_slow_handlers};

/// A RabbitMQ node on loopback ports with its data in the scenario's
/// folder.
pub(crate) struct RabbitNode {
    server: PathBuf,
    dir: PathBuf,
    port: u16,
    dist: u16,
    child: Option<Child>,
}

impl RabbitNode {
    pub(crate) fn start(dir: &Path) -> anyhow::Result<Self> {
        let server = std::env::var_os("RFIDL_RABBITMQ_SERVER")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/sbin/rabbitmq-server"));
        if !server.exists() {
            bail!(
                "`amqp` needs rabbitmq-server ({}): `apt-get install rabbitmq-server`, or run \
                 `cargo xtask chaos` (it installs it)",
                server.display()
            );
        }
        let dir = dir.join("rabbitmq");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("enabled_plugins"), "[rabbitmq_amqp1_0].\n")?;
        std::fs::write(
            dir.join("rabbitmq.conf"),
            "loopback_users = none\nlog.console.level = warning\n",
        )?;
        let mut node = Self {
            server,
            dir,
            port: free_port()?,
            dist: free_port()?,
            child: None,
        };
        node.restart()?;
        Ok(node)
    }

    /// Starts the node (again) and waits until it has booted (60 s).
    pub(crate) fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        ensure_epmd(&self.dir);
        // The server drops to the `rabbitmq` user when started as root.
        let _ = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        let out = self.dir.join("server.out");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out)?;
        let offset = log.metadata()?.len() as usize;
        let dir = &self.dir;
        let child = Command::new(&self.server)
            .env("RABBITMQ_NODENAME", format!("rfidl{}@localhost", self.port))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"))
            .env("RABBITMQ_FEATURE_FLAGS_FILE", dir.join("feature_flags"))
            .env("RABBITMQ_PLUGINS_EXPAND_DIR", dir.join("plugins-expand"))
            .env("RABBITMQ_PID_FILE", dir.join("pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("HOME", dir)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("start {}", self.server.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read(&out).unwrap_or_default();
            let text = String::from_utf8_lossy(text.get(offset..).unwrap_or_default());
            if text.contains("completed with")
                && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("rabbitmq-server exited ({status}) at start:\n{text}");
            }
            if Instant::now() > deadline {
                bail!("rabbitmq-server does not start within 60 s:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the node: `su` starts the Erlang VM in a session of its
    /// own, so its processes are found by the data directory in their
    /// environment and killed by pid.
    pub(crate) fn kill(&mut self) {
        Cluster::kill(&mut self.child);
        let entry = format!("RABBITMQ_MNESIA_BASE={}", self.dir.join("mnesia").display());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = processes_with(&entry);
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `amqp://guest:guest@127.0.0.1:<port>//queue/<queue>`.
    pub(crate) fn url(&self, queue: &str) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}//queue/{queue}", self.port)
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `epmd` on loopback unless one answers on its port (4369): one
/// started by the node itself races the node's own registration. It
/// outlives the node; `cargo xtask chaos` stops it by the marker in its
/// environment (this node's data directory).
fn ensure_epmd(dir: &Path) {
    let listening = || std::net::TcpStream::connect(("127.0.0.1", 4369)).is_ok();
    if listening() {
        return;
    }
    let _ = Command::new("epmd")
        .arg("-daemon")
        .env("ERL_EPMD_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !listening() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes whose environment holds `entry` (`NAME=value`), but not
/// `epmd`, which all Erlang nodes on the machine share.
fn processes_with(entry: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() != "epmd")
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == entry.as_bytes()))
        })
        .collect()
}

/// Both services talk through RabbitMQ over AMQP 1.0 (each sends to the
/// other's queue and consumes its own; the engine's command answers come
/// back through the broker), while HR, the engine and the broker itself
/// are SIGKILLed in turn and restarted on their files.
pub(crate) async fn amqp(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    let mut node = tokio::task::block_in_place(|| RabbitNode::start(&context.dir))?;
    let mut cluster = Cluster::new(context)?;
    cluster.hire_rate = (context.messages / 2).max(1);
    cluster.hr_peer = node.url("engine");
    cluster.engine_peer = node.url("hr");
    cluster.hr_flags = vec!["--amqp".into(), node.url("hr")];
    cluster.engine_flags = vec!["--amqp".into(), node.url("engine")];
    cluster
        .engine_flags
        .extend(kill_slow_handlers(context.messages));
    cluster.start_engine()?;
    cluster.start_hr()?;
    wait_listening(cluster.engine_port, Duration::from_secs(10)).await?;
    let mut broker_kills = 0;
    let faults = kill_rounds(
        &mut (&mut cluster, &mut node),
        rng,
        context.kills,
        |(cluster, _)| cluster.check_alive(),
        |(cluster, node), round| {
            match round % 3 {
                0 => cluster.kill_hr(),
                1 => cluster.kill_engine(),
                _ => {
                    node.kill();
                    broker_kills += 1;
                }
            }
            1
        },
        |(cluster, node), round| match round % 3 {
            0 => cluster.start_hr(),
            1 => cluster.start_engine(),
            _ => tokio::task::block_in_place(|| node.restart()),
        },
    )
    .await?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    node.kill();
    Ok(Report {
        messages: context.messages,
        faults,
        verdict,
        drained_in,
        notes: vec![format!("broker_kills={broker_kills}")],
    })
}
