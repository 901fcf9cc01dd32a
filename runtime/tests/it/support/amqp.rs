//! A RabbitMQ node speaking AMQP 1.0 per test (Debian's `rabbitmq-server`
//! 3.x with its `rabbitmq_amqp1_0` plugin; `cargo xtask test` installs the
//! package when missing). Without `rabbitmq-server` on the machine a test
//! is skipped loudly, unless `RFIDL_REQUIRE_RABBITMQ=1` (set by `cargo
//! xtask test`), which makes it a failure.
//!
//! Each [`RabbitNode`] has its own node name, its own data directory (a
//! temporary one, owned by the `rabbitmq` user the server drops to when
//! started as root) and free loopback ports; [`kill`](RabbitNode::kill) is
//! a SIGKILL of the node's processes, [`restart`](RabbitNode::restart)
//! starts it again on the same ports and data (what was on disk is what it
//! has), and the guard kills it when dropped. Nodes start one at a time
//! (an Erlang node's start is heavy on a small machine).
//!
//! `epmd`, started by the first node, outlives the nodes (as it does with
//! any Erlang program): `cargo xtask test` stops it after the run.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or killed) RabbitMQ node owned by one test.
pub struct RabbitNode {
    server: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    dist: u16,
    name: String,
    child: Option<Child>,
}

/// Serialises node starts across the tests of this binary.
static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl RabbitNode {
    /// Starts a node, or returns `None` (having printed why) when there is
    /// no `rabbitmq-server` and `RFIDL_REQUIRE_RABBITMQ` is not `1`.
    ///
    /// Panics when the node does not start within 60 s.
    pub fn start() -> Option<Self> {
        let server = server()?;
        let dir = tempfile::Builder::new()
            .prefix("rfidl-rabbitmq-")
            .tempdir()
            .expect("node directory");
        std::fs::write(dir.path().join("enabled_plugins"), "[rabbitmq_amqp1_0].\n")
            .expect("enabled_plugins");
        // guest/guest over 127.0.0.1; the default queue type classic and
        // durable, as AMQP 1.0 `/queue/NAME` addresses declare them.
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            "loopback_users = none\nlog.console.level = warning\n",
        )
        .expect("rabbitmq.conf");
        let port = free_port();
        let dist = free_port();
        let mut node = Self {
            server,
            name: format!("rfidl{port}@localhost"),
            dir,
            port,
            dist,
            child: None,
        };
        node.launch();
        Some(node)
    }

    /// `amqp://guest:guest@127.0.0.1:<port>//queue/<queue>` (a RabbitMQ 3.x
    /// address: the queue is declared on first use).
    pub fn url(&self, queue: &str) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}//queue/{queue}", self.port)
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILLs the node and waits for it to be gone. `su` starts the
    /// Erlang VM in a session of its own: its processes are found by the
    /// node's data directory in their environment.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mnesia = format!(
            "RABBITMQ_MNESIA_BASE={}",
            self.dir.path().join("mnesia").display()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = node_processes(&mnesia);
            if pids.is_empty() {
                break;
            }
            for pid in &pids {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            assert!(
                Instant::now() < deadline,
                "the node's processes {pids:?} outlive SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the node again on the same ports and data directory (kills
    /// it first if it still runs).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Runs `rabbitmqctl <args>` against this node; panics when it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let mut command = Command::new(self.server.with_file_name("rabbitmqctl"));
        let output = self
            .env(&mut command)
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("rabbitmqctl");
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The number of messages in `queue` (ready and unacknowledged), or
    /// `None` when it does not exist.
    pub fn queue_depth(&self, queue: &str) -> Option<(u64, u64)> {
        let listing = self.ctl(&[
            "list_queues",
            "-q",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ]);
        listing.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == queue).then_some(())?;
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
    }

    fn env<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        let dir = self.dir.path();
        command
            .env("RABBITMQ_NODENAME", &self.name)
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
    }

    fn launch(&mut self) {
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        let dir = self.dir.path().to_owned();
        ensure_epmd(&dir);
        chown_to_rabbitmq(&dir);
        let log_path = dir.join("server.out");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("server log");
        let offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut command = Command::new(&self.server);
        self.env(&mut command)
            .env("HOME", &dir)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.server.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = std::fs::read(&log_path).unwrap_or_default();
            let out = String::from_utf8_lossy(out.get(offset as usize..).unwrap_or_default());
            if out.contains("completed with") && listening(self.port) {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("rabbitmq-server exited ({status}) at start; its output:\n{out}");
            }
            assert!(
                Instant::now() < deadline,
                "rabbitmq-server does not start within 60 s; its output:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `epmd` on loopback unless one answers on its port (4369): the
/// nodes register there, and one started by a node itself races the
/// node's own registration. It outlives the nodes; `cargo xtask test`
/// stops it by the marker in its environment (a test node's data
/// directory, `RABBITMQ_MNESIA_BASE`).
fn ensure_epmd(dir: &Path) {
    const EPMD_PORT: u16 = 4369;
    if listening(EPMD_PORT) {
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
    while !listening(EPMD_PORT) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes whose environment holds `entry` (`NAME=value`), but not
/// `epmd`, which every Erlang node on the machine shares.
fn node_processes(entry: &str) -> Vec<u32> {
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

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// The node's files belong to the `rabbitmq` user when we are root (the
/// server drops to it, and dies with `eacces` otherwise).
fn chown_to_rabbitmq(dir: &Path) {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let status = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(dir)
            .status()
            .expect("chown");
        assert!(status.success(), "chown of the node directory failed");
    }
}

/// `rabbitmq-server` (`RFIDL_RABBITMQ_SERVER`, else Debian's
/// `/usr/sbin/rabbitmq-server`), or `None` (having printed why).
fn server() -> Option<PathBuf> {
    let path = std::env::var_os("RFIDL_RABBITMQ_SERVER")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/rabbitmq-server"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var("RFIDL_REQUIRE_RABBITMQ").as_deref() == Ok("1") {
        panic!(
            "RFIDL_REQUIRE_RABBITMQ=1 but there is no {}: run `cargo xtask test` (it \
             installs Debian's rabbitmq-server) or set RFIDL_RABBITMQ_SERVER",
            path.display()
        );
    }
    eprintln!(
        "SKIPPED: no rabbitmq-server (run `cargo xtask test`, or `apt-get install \
         rabbitmq-server`; docs/testing.md)"
    );
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port()
}
