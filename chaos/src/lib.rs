//! `rfidl-chaos`: "nothing lost, nothing done twice", measured under faults.
//!
//! Starts the demo services (`hr-service` and `engine`, binaries of
//! `rfidl-examples`; `rfidl-registry`) as separate OS processes on
//! loopback, each with its own SQLite file, drives N hires,
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
//!
//! Run it through `cargo xtask chaos [--messages N] [--scenario NAME]`,
//! which first builds the binaries of this crate, `rfidl-examples` and
//! `rfidl-registry` into one target folder: the `chaos` binary looks for
//! the services next to itself (`--bin-dir` names another folder), only
//! parses the flags and calls [`run`]. See docs/guarantees.md.
//!
//! | module | owns |
//! | --- | --- |
//! | `cluster` | the service processes: start, SIGKILL, restart, wait for the drain |
//! | `proxy` | the loopback HTTP proxy that drops answers, replays requests, refuses connections |
//! | `report` | what a scenario came to, and its line in the table |
//! | `scenarios` | one file per family of faults, each returning a report |
//!
//! It never touches a service's database while the service writes to it,
//! beyond read-only counts, and never decides a verdict of its own: that is
//! [`rfidl_examples::demo::verdict`], computed from both databases after the drain.

mod cluster;
mod proxy;
mod report;
mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use rand::SeedableRng as _;
use rand::rngs::StdRng;

pub use scenarios::SCENARIOS;

/// Hires per scenario without `--messages`.
const DEFAULT_MESSAGES: u32 = 300;

/// Hires of `jetstream-cluster` without `--messages` (issue 31: 5,000).
const CLUSTER_MESSAGES: u32 = 5000;

/// The flags of the `chaos` binary.
#[derive(Parser, Debug)]
#[command(about = "Fault-injection harness for the demo services (see docs/guarantees.md)")]
pub struct Args {
    /// Hires per scenario (default: 300; 5,000 for `jetstream-cluster`).
    #[arg(long)]
    pub messages: Option<u32>,
    /// One scenario, or `all`.
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// SIGKILLs per kill scenario (at least 20).
    #[arg(long, default_value_t = 20)]
    pub kills: u32,
    /// How long the receiver is unreachable in `outage`.
    #[arg(long, value_parser = rfidl_runtime::duration::parse_duration, default_value = "30s")]
    pub outage: Duration,
    /// Folder of the `hr-service`, `engine` and `rfidl-registry` binaries
    /// (default: the folder of this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Where the databases go (default: a fresh temporary folder, removed
    /// when every scenario passed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seed of the fault schedule (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Hires of `replicas` (three engines on one PostgreSQL database).
    #[arg(long, default_value_t = 5000)]
    pub replica_hires: u32,
    /// Longest wait for a drain.
    #[arg(long, value_parser = rfidl_runtime::duration::parse_duration, default_value = "120s")]
    pub drain_timeout: Duration,
}

/// Runs the scenarios `args` names, one line each; an error when any lost,
/// doubled or stranded a message.
pub fn run(args: Args) -> anyhow::Result<()> {
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
    let messages = args.messages.unwrap_or(DEFAULT_MESSAGES);
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
        "rfidl chaos: {messages} hire(s) per scenario{}, seed {seed}, databases under {}",
        if args.messages.is_none() {
            " (jetstream-cluster: 5000)"
        } else {
            ""
        },
        root.display()
    );
    println!(
        "{:<17} {:>8} {:>7} {:>5} {:>11} {:>11}  notes",
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
            messages: if *name == "jetstream-cluster" {
                args.messages.unwrap_or(CLUSTER_MESSAGES)
            } else {
                messages
            },
            kills: args.kills,
            outage: args.outage,
            drain_timeout: args.drain_timeout,
            replica_hires: args.replica_hires,
        };
        let outcome = runtime.block_on(scenarios::run(name, &context, &mut rng));
        match outcome {
            Ok(report) => {
                let ok = report.ok();
                all_ok &= ok;
                println!("{}", report.line(name));
            }
            Err(error) => {
                all_ok = false;
                println!("{name:<17} ERROR {error:#}");
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

/// What every scenario is given.
#[derive(Clone)]
pub(crate) struct Context {
    pub(crate) bins: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) messages: u32,
    pub(crate) kills: u32,
    pub(crate) outage: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) replica_hires: u32,
}
