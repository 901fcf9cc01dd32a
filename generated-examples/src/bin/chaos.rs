//! `chaos`: "nothing lost, nothing done twice", measured under faults.
//!
//! Starts the demo services (`hr-service`, `engine`) as separate OS
//! processes on loopback, each with its own SQLite file, drives N hires,
//! injects one kind of fault per scenario, waits for the drain, and computes
//! the verdict from both databases: every hire has exactly one workflow and
//! one laptop ticket, every effect has the message that caused it, nothing
//! is left `Failed`, `DeadLetter` or `Expired`. One line per scenario:
//!
//! ```text
//! scenario        messages  faults  lost  duplicated  drained_in  notes
//! ```
//!
//! and a non-zero exit on any loss, duplicate, orphan effect, message left
//! for an operator, or a drain that did not finish.
//!
//! Run it through `cargo xtask chaos [--messages N] [--scenario NAME]`,
//! which builds the binaries first. See docs/guarantees.md.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use rfidl_examples::demo::verdict::{Verdict, verdict};
use rfidl_runtime::rusqlite::Connection;
use rfidl_runtime::signing::Secret;

/// Every scenario, in the order `--scenario all` runs them.
const SCENARIOS: &[&str] = &[
    "sender-kill",
    "receiver-kill",
    "both-kill",
    "lost-acks",
    "lost-acks-50",
    "slow-handler",
    "outage",
    "disk-full",
    "clock-skew",
    "corrupt-db",
    "replicas",
    "jetstream",
];

#[derive(Parser, Debug)]
#[command(about = "Fault-injection harness for the demo services (see docs/guarantees.md)")]
struct Args {
    /// Hires per scenario.
    #[arg(long, default_value_t = 300)]
    messages: u32,
    /// One scenario, or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// SIGKILLs per kill scenario (at least 20).
    #[arg(long, default_value_t = 20)]
    kills: u32,
    /// How long the receiver is unreachable in `outage`.
    #[arg(long, value_parser = rfidl_runtime::duration::parse_duration, default_value = "30s")]
    outage: Duration,
    /// Folder of the `hr-service`, `engine` and `rfidl-registry` binaries
    /// (default: the folder of this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where the databases go (default: a fresh temporary folder, removed
    /// when every scenario passed).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of the fault schedule (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Hires of `replicas` (three engines on one PostgreSQL database).
    #[arg(long, default_value_t = 5000)]
    replica_hires: u32,
    /// Longest wait for a drain.
    #[arg(long, value_parser = rfidl_runtime::duration::parse_duration, default_value = "120s")]
    drain_timeout: Duration,
}

/// Runtime settings of both services: quick retries, a lease above the
/// request timeout, probes of an unreachable peer at least every second.
/// (`slow-handler` shortens HR's request timeout to 1 s.)
const CONFIG: &str = "
outbox:
  backoff_base: 100ms
  backoff_max: 2s
  jitter: 100ms
  max_retries: 10
  request_timeout: 5s
  lease_timeout: 10s
  probe_interval_max: 1s
";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scenarios: Vec<&str> = if args.scenario == "all" {
        SCENARIOS.to_vec()
    } else {
        let wanted = SCENARIOS
            .iter()
            .find(|s| **s == args.scenario)
            .with_context(|| {
                format!(
                    "unknown scenario `{}`; one of: all, {}",
                    args.scenario,
                    SCENARIOS.join(", ")
                )
            })?;
        vec![*wanted]
    };
    ensure!(args.kills >= 1, "--kills must be at least 1");
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let bins = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the binary has a folder")?
            .to_path_buf(),
    };
    for bin in ["hr-service", "engine", "rfidl-registry"] {
        ensure!(
            bins.join(bin).is_file(),
            "{} is missing: build the binaries first (cargo xtask chaos does)",
            bins.join(bin).display()
        );
    }
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("rfidl-chaos-{}", std::process::id())),
    };
    std::fs::create_dir_all(&root)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "rfidl chaos: {} hire(s) per scenario, seed {seed}, databases under {}",
        args.messages,
        root.display()
    );
    println!(
        "{:<15} {:>8} {:>7} {:>5} {:>11} {:>11}  notes",
        "scenario", "messages", "faults", "lost", "duplicated", "drained_in"
    );
    let mut all_ok = true;
    for (index, name) in scenarios.iter().enumerate() {
        let dir = root.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(index as u64));
        let context = Context {
            bins: bins.clone(),
            dir,
            messages: args.messages,
            kills: args.kills,
            outage: args.outage,
            drain_timeout: args.drain_timeout,
            replica_hires: args.replica_hires,
        };
        let outcome = runtime.block_on(run(name, &context, &mut rng));
        match outcome {
            Ok(report) => {
                let ok = report.ok();
                all_ok &= ok;
                println!("{}", report.line(name));
            }
            Err(error) => {
                all_ok = false;
                println!("{name:<15} ERROR {error:#}");
            }
        }
    }
    if all_ok && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    if !all_ok {
        bail!(
            "a scenario lost, doubled or stranded messages (databases kept in {})",
            root.display()
        );
    }
    Ok(())
}

#[derive(Clone)]
struct Context {
    bins: PathBuf,
    dir: PathBuf,
    messages: u32,
    kills: u32,
    outage: Duration,
    drain_timeout: Duration,
    replica_hires: u32,
}

async fn run(name: &str, context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    match name {
        "sender-kill" => kills(context, rng, Target::Sender).await,
        "receiver-kill" => kills(context, rng, Target::Receiver).await,
        "both-kill" => kills(context, rng, Target::Both).await,
        "lost-acks" => lost_acks(context, rng, 0.2, 0.1).await,
        "lost-acks-50" => lost_acks(context, rng, 0.5, 0.1).await,
        "slow-handler" => slow_handler(context).await,
        "outage" => outage(context, rng).await,
        "disk-full" => disk_full(context).await,
        "clock-skew" => clock_skew(context).await,
        "corrupt-db" => corrupt_db(context).await,
        "replicas" => replicas(context, rng).await,
        "jetstream" => jetstream(context, rng).await,
        other => bail!("no scenario `{other}`"),
    }
}

/// What one scenario came to.
#[derive(Debug, Default)]
struct Report {
    messages: u32,
    faults: u64,
    verdict: Verdict,
    drained_in: Option<Duration>,
    notes: Vec<String>,
}

impl Report {
    fn ok(&self) -> bool {
        self.drained_in.is_some() && self.verdict.ok()
    }

    fn line(&self, name: &str) -> String {
        let drained = self.drained_in.map_or_else(
            || "NOT DRAINED".to_owned(),
            |d| format!("{:.1}s", d.as_secs_f64()),
        );
        let mut notes = vec![
            format!("failed={}", self.verdict.needs_a_human),
            format!("orphans={}", self.verdict.orphans),
        ];
        notes.extend(self.notes.iter().cloned());
        format!(
            "{name:<15} {:>8} {:>7} {:>5} {:>11} {:>11}  {}{}",
            self.messages,
            self.faults,
            self.verdict.lost,
            self.verdict.duplicated,
            drained,
            notes.join(" "),
            if self.ok() { "" } else { "  <- FAILED" }
        )
    }
}

/// Both services' processes, ports and files.
struct Cluster {
    bins: PathBuf,
    dir: PathBuf,
    hr_db: PathBuf,
    engine_db: PathBuf,
    hr_port: u16,
    engine_port: u16,
    /// What HR dials for the engine, and the engine for HR (a proxy's
    /// address, or the peer itself).
    hr_peer: String,
    engine_peer: String,
    hr_secret: String,
    engine_secret: String,
    messages: u32,
    hire_rate: u32,
    engine_flags: Vec<String>,
    hr_flags: Vec<String>,
    engine_env: Vec<(String, String)>,
    hr_env: Vec<(String, String)>,
    hr: Option<Child>,
    engine: Option<Child>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Cluster {
    fn new(context: &Context) -> anyhow::Result<Self> {
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

    fn log(&self, name: &str) -> anyhow::Result<Stdio> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))?;
        Ok(Stdio::from(file))
    }

    /// Starts one demo service with the flags both take, on this cluster's
    /// files and ports; its output goes to `<log>.log`.
    fn spawn(
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

    fn start_hr(&mut self) -> anyhow::Result<()> {
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

    fn start_engine(&mut self) -> anyhow::Result<()> {
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
    fn kill(child: &mut Option<Child>) {
        if let Some(mut child) = child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn kill_hr(&mut self) {
        Self::kill(&mut self.hr);
    }

    fn kill_engine(&mut self) {
        Self::kill(&mut self.engine);
    }

    /// A process that exited on its own is a failure of the scenario.
    fn check_alive(&mut self) -> anyhow::Result<()> {
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

    fn count(db: &Path, sql: &str) -> i64 {
        Connection::open(db)
            .and_then(|c| c.query_row(sql, [], |r| r.get::<_, Option<i64>>(0)))
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Everything hired, delivered, handled and acknowledged both ways.
    fn drained(&self) -> bool {
        let open = "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')";
        let hires = i64::from(self.messages);
        Self::count(&self.hr_db, "SELECT COUNT(*) FROM employees") >= hires
            && Self::count(&self.hr_db, open) == 0
            && Self::count(&self.engine_db, open) == 0
            && Self::count(&self.hr_db, "SELECT COUNT(*) FROM laptop_tickets") >= hires
            && Self::count(&self.engine_db, "SELECT COUNT(*) FROM outbox_messages") >= hires
    }

    /// Waits for the drain; `None` if it did not come within `timeout`.
    async fn wait_drained(&mut self, timeout: Duration) -> anyhow::Result<Option<Duration>> {
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

    fn verdict(&self) -> anyhow::Result<Verdict> {
        verdict(&self.hr_db, &self.engine_db)
    }

    fn stop(&mut self) {
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
async fn wait_listening(port: u16, limit: Duration) -> anyhow::Result<()> {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Sender,
    Receiver,
    Both,
}

/// SIGKILLs at random moments (while HR is still hiring, while the engine
/// is inside a handler), each followed by a restart on the same files and
/// ports.
async fn kills(context: &Context, rng: &mut StdRng, target: Target) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    // Hiring spans the first kills (about 2 s of hires, longer with the
    // restarts), then the kills go on through delivery.
    cluster.hire_rate = (context.messages / 2).max(1);
    cluster.engine_flags = kill_slow_handlers(context.messages);
    cluster.start_engine()?;
    cluster.start_hr()?;
    wait_listening(cluster.engine_port, Duration::from_secs(10)).await?;
    let victims = |round: u32| match target {
        Target::Sender => vec![Target::Sender],
        Target::Receiver => vec![Target::Receiver],
        // Interleaved: alternate, and sometimes both at once.
        Target::Both => match round % 3 {
            0 => vec![Target::Sender],
            1 => vec![Target::Receiver],
            _ => vec![Target::Sender, Target::Receiver],
        },
    };
    let mut killed_while_hiring = 0;
    let faults = kill_rounds(
        &mut cluster,
        rng,
        context.kills,
        Cluster::check_alive,
        |cluster, round| {
            let victims = victims(round);
            for victim in &victims {
                match victim {
                    Target::Sender => {
                        let hired =
                            Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees");
                        if hired < i64::from(context.messages) {
                            killed_while_hiring += 1;
                        }
                        cluster.kill_hr();
                    }
                    _ => cluster.kill_engine(),
                }
            }
            victims.len() as u64
        },
        |cluster, round| {
            for victim in &victims(round) {
                match victim {
                    Target::Sender => cluster.start_hr()?,
                    _ => cluster.start_engine()?,
                }
            }
            Ok(())
        },
    )
    .await?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    let mut notes = Vec::new();
    if target != Target::Receiver {
        notes.push(format!("killed_while_hiring={killed_while_hiring}"));
    }
    Ok(Report {
        messages: context.messages,
        faults,
        verdict,
        drained_in,
        notes,
    })
}

/// The engine's flags in the kill scenarios: 2 ms handlers (every one in a
/// small run of `messages`, one in 50 in a run of 100,000), so that a kill
/// of the engine often lands inside one.
fn kill_slow_handlers(messages: u32) -> Vec<String> {
    let every = (messages / 2000).max(1);
    vec![
        "--slow-handler".into(),
        "2ms".into(),
        "--slow-every".into(),
        every.to_string(),
    ]
}

/// The loop of the kill scenarios, on `state` (what they kill and
/// restart): `rounds` times, a random pause (50-400 ms), `alive` (fails
/// when a process exited on its own), `kill(round)` (which returns how many
/// processes it killed), a random pause (0-200 ms), then `restart(round)`
/// on the same files. Returns the kills.
async fn kill_rounds<S>(
    state: &mut S,
    rng: &mut StdRng,
    rounds: u32,
    alive: impl Fn(&mut S) -> anyhow::Result<()>,
    mut kill: impl FnMut(&mut S, u32) -> u64,
    mut restart: impl FnMut(&mut S, u32) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut faults = 0;
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        alive(state)?;
        faults += kill(state, round);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
        restart(state, round)?;
    }
    Ok(faults)
}

/// A loopback HTTP/1.1 proxy between one service and its peer. Each request
/// travels on its own upstream connection; the proxy can drop the answer
/// (the receiver processed the message, the sender never hears of it),
/// replay a delivered request later (a duplicate storm), or refuse every
/// connection (the peer is unreachable).
struct Proxy {
    port: u16,
    state: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

/// What the proxy does, and what it counted.
struct ProxyState {
    upstream: SocketAddr,
    drop_answer: f64,
    replay: f64,
    rng: std::sync::Mutex<StdRng>,
    down: AtomicBool,
    requests: AtomicU64,
    dropped_answers: AtomicU64,
    replays: AtomicU64,
    refused: AtomicU64,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    async fn start(
        upstream: SocketAddr,
        drop_answer: f64,
        replay: f64,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(ProxyState {
            upstream,
            drop_answer,
            replay,
            rng: std::sync::Mutex::new(StdRng::seed_from_u64(seed)),
            down: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            dropped_answers: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if state.down.load(Ordering::SeqCst) {
                        state.refused.fetch_add(1, Ordering::Relaxed);
                        drop(client);
                        continue;
                    }
                    let state = state.clone();
                    tokio::spawn(async move {
                        let _ = relay(client, &state).await;
                    });
                }
            })
        };
        Ok(Self { port, state, task })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn count(&self, counter: impl Fn(&ProxyState) -> &AtomicU64) -> u64 {
        counter(&self.state).load(Ordering::Relaxed)
    }
}

/// Reads one HTTP/1.1 request (headers and a `Content-Length` body).
async fn read_request(
    stream: &mut tokio::net::TcpStream,
) -> anyhow::Result<Option<(String, Vec<u8>)>> {
    use tokio::io::AsyncReadExt as _;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let header_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
        ensure!(buffer.len() < 1 << 20, "request head too large");
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = buffer[header_end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        ensure!(read > 0, "request body cut short");
        body.extend_from_slice(&chunk[..read]);
    }
    // One request per upstream connection: the answer ends when it closes.
    let head: String = head
        .lines()
        .filter(|line| {
            !line
                .split_once(':')
                .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("connection"))
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    Ok(Some((format!("{head}\r\nConnection: close\r\n\r\n"), body)))
}

/// Sends `request` upstream on a fresh connection; returns the whole answer.
async fn forward(upstream: SocketAddr, head: &str, body: &[u8]) -> anyhow::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(upstream).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(answer)
}

async fn relay(mut client: tokio::net::TcpStream, state: &ProxyState) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let Some((head, body)) = read_request(&mut client).await? else {
        return Ok(());
    };
    state.requests.fetch_add(1, Ordering::Relaxed);
    let answer = forward(state.upstream, &head, &body).await?;
    let (lose, again, delay_ms) = {
        let mut rng = state
            .rng
            .lock()
            .map_err(|_| anyhow::anyhow!("rng poisoned"))?;
        (
            rng.random_bool(state.drop_answer),
            rng.random_bool(state.replay),
            rng.random_range(200..3000u64),
        )
    };
    if again {
        state.replays.fetch_add(1, Ordering::Relaxed);
        let upstream = state.upstream;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let _ = forward(upstream, &head, &body).await;
        });
    }
    if lose {
        // Processed upstream; the sender only sees its connection close.
        state.dropped_answers.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    client.write_all(&answer).await?;
    client.shutdown().await?;
    Ok(())
}

fn upstream(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Lost acknowledgements both ways (`drop_answer` of the answers never reach
/// the sender) and a duplicate storm (`replay` of the requests come again).
async fn lost_acks(
    context: &Context,
    rng: &mut StdRng,
    drop_answer: f64,
    replay: f64,
) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    let to_engine = Proxy::start(
        upstream(cluster.engine_port),
        drop_answer,
        replay,
        rng.random::<u64>(),
    )
    .await?;
    let to_hr = Proxy::start(
        upstream(cluster.hr_port),
        drop_answer,
        replay,
        rng.random::<u64>(),
    )
    .await?;
    cluster.hr_peer = to_engine.url();
    cluster.engine_peer = to_hr.url();
    cluster.start_engine()?;
    cluster.start_hr()?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    // Let the last replays land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let verdict = cluster.verdict()?;
    cluster.stop();
    let both =
        |counter: fn(&ProxyState) -> &AtomicU64| to_engine.count(counter) + to_hr.count(counter);
    let dropped = both(|s| &s.dropped_answers);
    let replayed = both(|s| &s.replays);
    let requests = both(|s| &s.requests);
    Ok(Report {
        messages: context.messages,
        faults: dropped + replayed,
        verdict,
        drained_in,
        notes: vec![format!(
            "requests={requests} answers_lost={dropped} replayed={replayed} ({:.0}%/{:.0}%)",
            drop_answer * 100.0,
            replay * 100.0
        )],
    })
}

/// One hire in ten (at most 20 in a run) takes 1.5 s, longer than the
/// sender's 1 s timeout: the sender gives up, the receiver still commits,
/// and the retry is answered from the inbox.
async fn slow_handler(context: &Context) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    let every = (context.messages / 20).max(10);
    // HR gives up on a request after 1 s (the environment overlay wins over
    // the config file), before the 1.5 s handler is done.
    cluster.hr_env = vec![("RFIDL_OUTBOX_REQUEST_TIMEOUT".into(), "1s".into())];
    cluster.engine_flags = vec![
        "--slow-handler".into(),
        "1500ms".into(),
        "--slow-every".into(),
        every.to_string(),
    ];
    cluster.start_engine()?;
    cluster.start_hr()?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    Ok(Report {
        messages: context.messages,
        faults: u64::from(context.messages.div_ceil(every)),
        verdict,
        drained_in,
        notes: vec![format!("slow=1.5s/{every} timeout=1s")],
    })
}

/// The engine is unreachable for `--outage` (connections refused by the
/// proxy in front of it), then back: reports HR's request rate during the
/// outage and how long the drain took once it was over.
async fn outage(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    let front = Proxy::start(upstream(cluster.engine_port), 0.0, 0.0, rng.random::<u64>()).await?;
    cluster.hr_peer = front.url();
    cluster.hire_rate = (context.messages / 4).max(1);
    cluster.start_engine()?;
    cluster.start_hr()?;
    // Down after a quarter of the hires; HR keeps hiring.
    let quarter = i64::from(context.messages / 4);
    let started = Instant::now();
    while Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees") < quarter {
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "HR does not hire"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    front.state.down.store(true, Ordering::SeqCst);
    let before = front.count(|s| &s.refused);
    tokio::time::sleep(context.outage).await;
    cluster.check_alive()?;
    let attempts = front.count(|s| &s.refused) - before;
    let waiting = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')",
    );
    let failed_during = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
    );
    front.state.down.store(false, Ordering::SeqCst);
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    Ok(Report {
        messages: context.messages,
        faults: 1,
        verdict,
        drained_in,
        notes: vec![format!(
            "outage={}s waiting_at_end={waiting} failed_during={failed_during} \
             requests_during_outage={attempts} ({:.2}/s)",
            context.outage.as_secs(),
            attempts as f64 / context.outage.as_secs_f64()
        )],
    })
}

/// The engine's database lives on a tmpfs that a filler file leaves almost
/// full: its commits fail with "database or disk is full" until the
/// filler goes. Then it must recover and drain, with `integrity_check` ok.
async fn disk_full(context: &Context) -> anyhow::Result<Report> {
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
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writes `filler` until `mount` has only about `leave` bytes free.
fn fill_disk(mount: &Path, filler: &Path, leave: u64) -> anyhow::Result<()> {
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

/// The engine's clock runs 10 minutes ahead (libfaketime), past the 5 min
/// signature tolerance: both directions are refused, retried without
/// counting, and reported as a clock problem in `last_error` and HR's
/// `/_rf/health`. Then the clock is fixed (the engine restarted without the
/// skew) and everything drains.
async fn clock_skew(context: &Context) -> anyhow::Result<Report> {
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
fn faketime_library() -> anyhow::Result<PathBuf> {
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

/// A database written by a newer schema (rollback journal), one with 8 KiB
/// of garbage in the middle, and a file that is no database: every binary
/// refuses each at start with a clear error, and leaves it byte-for-byte
/// unchanged.
async fn corrupt_db(context: &Context) -> anyhow::Result<Report> {
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

fn make_newer(path: &Path) -> anyhow::Result<()> {
    let conn = Connection::open(path)?;
    conn.execute_batch("CREATE TABLE from_the_future (x); PRAGMA user_version = 99;")?;
    Ok(())
}

fn make_garbage(path: &Path) -> anyhow::Result<()> {
    {
        let conn = rfidl_runtime::db::open(path, rfidl_runtime::Durability::Normal)?;
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

fn make_not_a_db(path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, vec![b'x'; 8192])?;
    Ok(())
}

/// Three `engine` replicas on one PostgreSQL database behind one
/// `hr-service` that lists all three (`--peer-url` three times), while
/// `--replica-hires` hires flow: SIGKILLs of a random replica at random
/// moments, each restarted on the same port after a pause. The database
/// decides which replica processes a message; every hire must still come
/// out exactly once. Needs `RFIDL_POSTGRES_URL` (`cargo xtask chaos` starts
/// a throw-away server).
async fn replicas(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    const REPLICAS: usize = 3;
    let server = std::env::var("RFIDL_POSTGRES_URL").context(
        "`replicas` needs a PostgreSQL server: set RFIDL_POSTGRES_URL (cargo xtask chaos starts one)",
    )?;
    let database = format!("rfidl_chaos_{}", std::process::id());
    let engine_url = postgres_database(&server, &database)?;
    let admin = server.clone();
    let statements = [
        format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
        format!("CREATE DATABASE {database}"),
    ];
    std::thread::spawn(move || -> anyhow::Result<()> {
        let mut client =
            rfidl_runtime::postgres::Client::connect(&admin, rfidl_runtime::postgres::NoTls)?;
        for statement in statements {
            client.batch_execute(&statement)?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("database set-up panicked"))??;

    let hires = context.replica_hires;
    let mut cluster = Cluster::new(&Context {
        messages: hires,
        ..context.clone()
    })?;
    cluster.hire_rate = (hires / 10).max(1);
    let ports: Vec<u16> = (0..REPLICAS)
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let peers: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let peer_refs: Vec<&str> = peers.iter().map(String::as_str).collect();
    let engine_db = std::ffi::OsString::from(&engine_url);
    let start = |cluster: &Cluster, index: usize| {
        cluster.spawn(
            "engine",
            &format!("engine-{index}"),
            (ports[index], &engine_db, &[&cluster.engine_peer]),
            (&cluster.engine_secret, &cluster.hr_secret),
            |command| {
                command.args(["--slow-handler", "2ms", "--slow-every", "10"]);
            },
        )
    };
    let mut engines: Vec<Option<Child>> = Vec::new();
    for index in 0..REPLICAS {
        engines.push(Some(start(&cluster, index)?));
    }
    for port in &ports {
        wait_listening(*port, Duration::from_secs(20)).await?;
    }
    let hr = cluster.spawn(
        "hr-service",
        "hr",
        (cluster.hr_port, cluster.hr_db.as_os_str(), &peer_refs),
        (&cluster.hr_secret, &cluster.engine_secret),
        |command| {
            command
                .args(["--hire", &hires.to_string()])
                .args(["--hire-rate", &cluster.hire_rate.to_string()]);
        },
    )?;
    cluster.hr = Some(hr);
    let engine_database = rfidl_runtime::Database::parse(&engine_url)?;
    let mut faults = 0;
    for _ in 0..context.kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..600))).await;
        cluster.check_alive()?;
        let victim = rng.random_range(0..REPLICAS);
        Cluster::kill(&mut engines[victim]);
        faults += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        engines[victim] = Some(start(&cluster, victim)?);
    }
    let open = "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')";
    let engine_count = |sql: &str| rfidl_examples::demo::count(&engine_database, sql).unwrap_or(-1);
    let started = Instant::now();
    let drained_in = loop {
        cluster.check_alive()?;
        for (index, engine) in engines.iter_mut().enumerate() {
            if let Some(child) = engine
                && let Some(status) = child.try_wait()?
            {
                bail!("engine-{index} exited by itself ({status})");
            }
        }
        let hired = i64::from(hires);
        if Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees") >= hired
            && Cluster::count(&cluster.hr_db, open) == 0
            && Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM laptop_tickets") >= hired
            && engine_count(open) == 0
            && engine_count("SELECT COUNT(*) FROM outbox_messages") >= hired
        {
            break Some(started.elapsed());
        }
        if started.elapsed() > context.drain_timeout {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let verdict = rfidl_examples::demo::verdict::verdict_of(
        &rfidl_runtime::Database::Sqlite(cluster.hr_db.clone()),
        &engine_database,
        &context.dir,
    )?;
    for engine in &mut engines {
        Cluster::kill(engine);
    }
    cluster.stop();
    let processed: Vec<String> = (0..REPLICAS)
        .map(|index| {
            let log = std::fs::read_to_string(context.dir.join(format!("engine-{index}.log")))
                .unwrap_or_default();
            format!(
                "engine-{index}:{}starts",
                log.matches("listening on").count()
            )
        })
        .collect();
    Ok(Report {
        messages: hires,
        faults,
        verdict,
        drained_in,
        notes: vec![format!("replicas={REPLICAS}"), processed.join(",")],
    })
}

/// `server` (a `postgres://` URL) with its database replaced by `name`.
fn postgres_database(server: &str, name: &str) -> anyhow::Result<String> {
    let (scheme, rest) = server
        .split_once("://")
        .context("RFIDL_POSTGRES_URL is not a URL")?;
    let (location, query) = rest
        .split_once('?')
        .map_or((rest, None), |(l, q)| (l, Some(q)));
    let authority = location.split_once('/').map_or(location, |(a, _)| a);
    Ok(match query {
        Some(query) => format!("{scheme}://{authority}/{name}?{query}"),
        None => format!("{scheme}://{authority}/{name}"),
    })
}

/// A `nats-server` with JetStream on a loopback port and a store directory
/// that outlives its process, so a SIGKILLed server restarts on its data.
struct NatsServer {
    binary: PathBuf,
    store: PathBuf,
    log: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl NatsServer {
    fn start(dir: &Path) -> anyhow::Result<Self> {
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

    fn restart(&mut self) -> anyhow::Result<()> {
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

    fn kill(&mut self) {
        Cluster::kill(&mut self.child);
    }

    fn url(&self, subject: &str) -> String {
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
async fn jetstream(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
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
