//! A real `nats-server` with JetStream per test, from the binary named by
//! `RFIDL_NATS_SERVER` (`cargo xtask test` sets it to the one it installed
//! in `.venv`). Without the variable a test is skipped loudly, unless
//! `RFIDL_REQUIRE_NATS=1` (also set by `cargo xtask test`), which makes it
//! a failure.
//!
//! Each [`NatsServer`] listens on a free port of 127.0.0.1 with its store
//! in a temporary directory of its own; [`kill`](NatsServer::kill) is a
//! SIGKILL, [`restart_same_store`](NatsServer::restart_same_store) starts it
//! again on the same port and store (what survived on disk is what it
//! has), and the guard kills it when dropped.
//!
//! Depends on std and `tempfile` only, so another test crate can include
//! it: `#[path = "<relative path>/runtime/tests/it/support/nats.rs"] mod nats;`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or killed) `nats-server` owned by one test.
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server, or returns `None` (having printed why) when
    /// `RFIDL_NATS_SERVER` is not set and `RFIDL_REQUIRE_NATS` is not `1`.
    ///
    /// Panics when the binary cannot be started or does not accept
    /// connections within 10 s.
    pub fn start() -> Option<Self> {
        let binary = binary()?;
        let port = free_port();
        let store = tempfile::Builder::new()
            .prefix("rfidl-nats-")
            .tempdir()
            .expect("temporary store directory");
        let mut server = Self {
            binary,
            port,
            store,
            child: None,
        };
        server.launch();
        Some(server)
    }

    /// `nats://127.0.0.1:<port>/<subject>`.
    pub fn url(&self, subject: &str) -> String {
        format!("nats://127.0.0.1:{}/{subject}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILLs the server and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store directory (kills
    /// it first if it still runs).
    pub fn restart_same_store(&mut self) {
        self.kill();
        self.launch();
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.store.path().join("server.log"))
            .expect("server log");
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(self.store.path().join("jetstream"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.child = Some(child);
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "nats-server exited ({status}) at start; its log:\n{}",
                    std::fs::read_to_string(self.store.path().join("server.log"))
                        .unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "nats-server does not accept connections on {address} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `nats-server` binary of `RFIDL_NATS_SERVER`, or `None` (having
/// printed why) when it is not set and `RFIDL_REQUIRE_NATS` is not `1`.
fn binary() -> Option<PathBuf> {
    match std::env::var_os("RFIDL_NATS_SERVER") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ if std::env::var("RFIDL_REQUIRE_NATS").as_deref() == Ok("1") => panic!(
            "RFIDL_REQUIRE_NATS=1 but RFIDL_NATS_SERVER is not set: run `cargo xtask test` \
             (it installs nats-server into .venv) or point it at a nats-server binary"
        ),
        _ => {
            eprintln!(
                "SKIPPED: no nats-server (run `cargo xtask test`, or set RFIDL_NATS_SERVER \
                 to a nats-server 2.10+ binary; docs/testing.md)"
            );
            None
        }
    }
}

/// A 3-node JetStream cluster on loopback (`../shared/recipes`: routes
/// between the three, a store directory and a name each), owned by one
/// test: [`kill`](Self::kill) SIGKILLs one node, [`restart`](Self::restart)
/// starts it again on its port and store; dropping the guard kills all.
pub struct NatsCluster {
    binary: PathBuf,
    /// Its own cluster name: nodes of two tests' clusters never join.
    name: String,
    nodes: Vec<ClusterNode>,
}

struct ClusterNode {
    name: String,
    port: u16,
    route_port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsCluster {
    /// Starts three nodes (`None` as [`NatsServer::start`]); each accepts
    /// connections on return. JetStream elects its leaders a few seconds
    /// later: clients retry until then.
    pub fn start() -> Option<Self> {
        let binary = binary()?;
        let nodes = (1..=3)
            .map(|i| ClusterNode {
                name: format!("node{i}"),
                port: free_port(),
                route_port: free_port(),
                store: tempfile::Builder::new()
                    .prefix("rfidl-nats-cluster-")
                    .tempdir()
                    .expect("temporary store directory"),
                child: None,
            })
            .collect();
        let name = format!("rfidl-{}", free_port());
        let mut cluster = Self {
            binary,
            name,
            nodes,
        };
        for i in 0..3 {
            cluster.launch(i);
        }
        Some(cluster)
    }

    /// `nats://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/<subject>?replicas=3`.
    pub fn url(&self, subject: &str) -> String {
        let servers: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("nats://{}/{subject}?replicas=3", servers.join(","))
    }

    /// The client ports of the nodes, in order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    /// The index of the node named `name` (`node1`…).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.name == name)
    }

    /// SIGKILLs node `i` and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on its port and store.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.launch(i);
    }

    fn launch(&mut self, i: usize) {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("nats://127.0.0.1:{}", node.route_port))
            .collect();
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.store.path().join("server.log"))
            .expect("server log");
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(node.port.to_string())
            .args(["-n", &node.name, "--cluster_name", &self.name, "--cluster"])
            .arg(format!("nats://127.0.0.1:{}", node.route_port))
            .args(["--routes", &routes.join(",")])
            .arg("-sd")
            .arg(node.store.path().join("jetstream"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        node.child = Some(child);
        let address = SocketAddr::from(([127, 0, 0, 1], node.port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "cluster node {} does not accept connections within 10 s",
                node.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}
