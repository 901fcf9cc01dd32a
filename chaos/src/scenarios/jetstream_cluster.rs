//! Both services over replicated (R3) JetStream streams on a 3-node
//! `nats-server` cluster (`jetstream-cluster`) while the nodes are
//! SIGKILLed one at a time, each stream's leader and the meta leader among
//! them, and HR and the engine are SIGKILLed too. Needs
//! `RFIDL_NATS_SERVER`; the nodes' stores and log live in the scenario's
//! folder only.
//!
//! The leader of a moment is asked of the cluster itself: each node runs
//! its monitoring port, and `/jsz` names the meta leader and every
//! stream's leader. `/healthz` says when a restarted node has caught up, so
//! that the next node is killed only once the first is back (one node down
//! at a time: the streams keep their quorum).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use rand::Rng as _;
use rand::rngs::StdRng;

use super::super::Context;
use super::super::cluster::{Cluster, free_port, wait_listening};
use super::super::report::Report;
use super::kills::kill_slow_handlers;

/// Node kills per run, one at a time: the leader of the engine's stream
/// (where HR publishes the hires), the leader of HR's stream, the meta
/// leader.
const NODE_ROUNDS: usize = 3;

/// How long a killed node stays down.
const NODE_DOWN: Duration = Duration::from_secs(2);

/// One node: its client, route and monitoring ports, its store.
struct Node {
    name: String,
    port: u16,
    route_port: u16,
    monitor_port: u16,
    store: PathBuf,
    child: Option<Child>,
}

/// Three `nats-server` nodes with JetStream, routed to each other on
/// loopback under a cluster name of their own, each on a store directory
/// that outlives its process (a SIGKILLed node restarts on its data).
struct NatsCluster {
    binary: PathBuf,
    name: String,
    log: PathBuf,
    nodes: Vec<Node>,
    http: reqwest::Client,
}

/// Who leads, as one node sees it.
#[derive(Debug, Default)]
struct Leaders {
    meta: Option<String>,
    streams: Vec<(String, String)>,
}

impl Leaders {
    fn of_stream(&self, stream: &str) -> Option<&str> {
        self.streams
            .iter()
            .find(|(name, _)| name == stream)
            .map(|(_, leader)| leader.as_str())
    }
}

impl NatsCluster {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let binary = std::env::var_os("RFIDL_NATS_SERVER").map(PathBuf::from).context(
            "`jetstream-cluster` needs nats-server: set RFIDL_NATS_SERVER (cargo xtask chaos installs one)",
        )?;
        let mut nodes = Vec::new();
        for i in 1..=3 {
            nodes.push(Node {
                name: format!("node{i}"),
                port: free_port()?,
                route_port: free_port()?,
                monitor_port: free_port()?,
                store: dir.join(format!("jetstream-node{i}")),
                child: None,
            });
        }
        let mut cluster = Self {
            binary,
            // Its own name: nodes of another run never join this cluster.
            name: format!("rfidl-chaos-{}-{}", std::process::id(), free_port()?),
            log: dir.join("nats-cluster.log"),
            nodes,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()?,
        };
        for i in 0..cluster.nodes.len() {
            cluster.launch(i)?;
        }
        Ok(cluster)
    }

    fn launch(&mut self, i: usize) -> anyhow::Result<()> {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("nats://127.0.0.1:{}", node.route_port))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let node = &mut self.nodes[i];
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &node.port.to_string()])
            .args(["-m", &node.monitor_port.to_string()])
            .args(["-n", &node.name, "--cluster_name", &self.name, "--cluster"])
            .arg(format!("nats://127.0.0.1:{}", node.route_port))
            .args(["--routes", &routes.join(",")])
            .arg("-sd")
            .arg(&node.store)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("start {}", self.binary.display()))?;
        node.child = Some(child);
        Ok(())
    }

    fn kill(&mut self, i: usize) {
        Cluster::kill(&mut self.nodes[i].child);
    }

    fn kill_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.name == name)
    }

    /// `nats://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/<subject>?replicas=3`.
    fn url(&self, subject: &str) -> String {
        let servers: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("nats://{}/{subject}?replicas=3", servers.join(","))
    }

    /// The leaders as the first running node that answers sees them.
    async fn leaders(&self) -> Leaders {
        for node in self.nodes.iter().filter(|node| node.child.is_some()) {
            let url = format!(
                "http://127.0.0.1:{}/jsz?accounts=true&streams=true",
                node.monitor_port
            );
            let Ok(response) = self.http.get(&url).send().await else {
                continue;
            };
            let Ok(body) = response.text().await else {
                continue;
            };
            let Ok(jsz) = serde_json::from_str::<serde_json::Value>(&body) else {
                continue;
            };
            let text =
                |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
            let mut leaders = Leaders {
                meta: text(&jsz["meta_cluster"]["leader"]),
                streams: Vec::new(),
            };
            for account in jsz["account_details"].as_array().into_iter().flatten() {
                for stream in account["stream_detail"].as_array().into_iter().flatten() {
                    if let (Some(name), Some(leader)) =
                        (text(&stream["name"]), text(&stream["cluster"]["leader"]))
                    {
                        leaders.streams.push((name, leader));
                    }
                }
            }
            if leaders.meta.is_some() {
                return leaders;
            }
        }
        Leaders::default()
    }

    /// Waits until `check` holds of the leaders (the cluster elected them).
    async fn wait_leaders(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&Leaders) -> bool,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        while !check(&self.leaders().await) {
            ensure!(
                started.elapsed() < limit,
                "the JetStream cluster elected no {what} within {limit:?}; see {}",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Waits until node `i` says it is healthy: JetStream up and its
    /// streams caught up with their leaders (`/healthz` answers 200).
    async fn wait_healthy(&self, i: usize, limit: Duration) -> anyhow::Result<()> {
        let node = &self.nodes[i];
        wait_listening(node.port, Duration::from_secs(10)).await?;
        let url = format!("http://127.0.0.1:{}/healthz", node.monitor_port);
        let started = Instant::now();
        loop {
            if let Ok(response) = self.http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            ensure!(
                started.elapsed() < limit,
                "{} is not healthy {limit:?} after its restart; see {}",
                node.name,
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Both services over R3 streams of a 3-node cluster. [`NODE_ROUNDS`]
/// rounds, each: SIGKILL a node that leads (a stream, or the meta group),
/// SIGKILL and restart HR or the engine while it is down, restart the node
/// after [`NODE_DOWN`] on its port and store, wait until it has caught up,
/// then SIGKILL and restart the other service. Hiring spans the rounds.
pub(crate) async fn jetstream_cluster(
    context: &Context,
    rng: &mut StdRng,
) -> anyhow::Result<Report> {
    let mut nats = NatsCluster::start(&context.dir)?;
    for node in &nats.nodes {
        wait_listening(node.port, Duration::from_secs(10)).await?;
    }
    nats.wait_leaders("meta leader", Duration::from_secs(30), |l| l.meta.is_some())
        .await?;
    let mut cluster = Cluster::new(context)?;
    // About 10 s of hires: the node kills land while hiring goes on.
    cluster.hire_rate = (context.messages / 10).max(1);
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
    // Both streams exist (each service creates its own) before the first
    // leader is picked.
    nats.wait_leaders("stream leaders", Duration::from_secs(30), |l| {
        l.of_stream("RF_hr").is_some() && l.of_stream("RF_engine").is_some()
    })
    .await?;
    let (mut node_kills, mut leader_kills, mut service_kills) = (0u64, 0u64, 0u64);
    let mut killed = Vec::new();
    for round in 0..NODE_ROUNDS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..800))).await;
        cluster.check_alive()?;
        let leaders = nats.leaders().await;
        let leader = match round % 3 {
            0 => leaders.of_stream("RF_engine").map(str::to_owned),
            1 => leaders.of_stream("RF_hr").map(str::to_owned),
            _ => leaders.meta.clone(),
        };
        let victim = leader
            .as_deref()
            .and_then(|name| nats.index_of(name))
            .unwrap_or(round % nats.nodes.len());
        let led: Vec<&str> = [
            (leaders.meta.as_deref(), "meta"),
            (leaders.of_stream("RF_engine"), "RF_engine"),
            (leaders.of_stream("RF_hr"), "RF_hr"),
        ]
        .into_iter()
        .filter(|(name, _)| *name == Some(nats.nodes[victim].name.as_str()))
        .map(|(_, role)| role)
        .collect();
        if led.iter().any(|role| role.starts_with("RF_")) {
            leader_kills += 1;
        }
        // Where hiring stood: the kills land mid-stream.
        let hired = Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees");
        killed.push(format!(
            "{}({})@{hired}",
            nats.nodes[victim].name,
            led.join("+")
        ));
        let down_since = Instant::now();
        nats.kill(victim);
        node_kills += 1;
        // A service dies while the node is down: it restarts against
        // the two that remain.
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..600))).await;
        if round % 2 == 0 {
            cluster.kill_hr();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            cluster.start_hr()?;
        } else {
            cluster.kill_engine();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            cluster.start_engine()?;
        }
        service_kills += 1;
        tokio::time::sleep(NODE_DOWN.saturating_sub(down_since.elapsed())).await;
        nats.launch(victim)?;
        nats.wait_healthy(victim, Duration::from_secs(60)).await?;
        // And the other service once the node is back.
        cluster.check_alive()?;
        if round % 2 == 0 {
            cluster.kill_engine();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            cluster.start_engine()?;
        } else {
            cluster.kill_hr();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            cluster.start_hr()?;
        }
        service_kills += 1;
    }
    ensure!(
        leader_kills >= 1,
        "no stream leader was killed (the cluster named none): {}",
        killed.join(" ")
    );
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    nats.kill_all();
    Ok(Report {
        messages: context.messages,
        faults: node_kills + service_kills,
        verdict,
        drained_in,
        notes: vec![
            format!("node_kills={node_kills}"),
            format!("stream_leader_kills={leader_kills}"),
            format!("service_kills={service_kills}"),
            format!("killed_at_hires={}", killed.join(",")),
        ],
    })
}
