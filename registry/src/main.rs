//! `rfidl-registry serve --db FILE --listen ADDR [--publish-token-file FILE]
//! [--registration-token-file FILE] [--operator-token-file FILE]
//! [--issue-keys --key-file FILE]`: the
//! manifest registry as a process. Prints `listening on http://ADDR`
//! once it accepts connections (`--listen 127.0.0.1:0` picks a free port).
//! Without any credential it is open, and then it listens on loopback only
//! (`docs/registry.md`, "Credentials").
//! Every flag can come from the environment (`RFIDL_REGISTRY_DB`, …). On
//! SIGTERM or SIGINT it stops accepting, lets the requests in flight finish
//! (for at most `--shutdown-grace`), and exits 0.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rfidl-registry",
    version,
    about = "Stores versioned, immutable rfidl interface manifests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the registry API (docs/registry.md).
    Serve {
        /// SQLite file holding the manifests (created if missing).
        #[arg(long, env = "RFIDL_REGISTRY_DB")]
        db: PathBuf,
        /// Address to listen on.
        #[arg(long, env = "RFIDL_REGISTRY_LISTEN", default_value = "127.0.0.1:7300")]
        listen: SocketAddr,
        /// Require this bearer token to publish (reads stay open). Prefer
        /// --publish-token-file or the environment: a flag is visible to
        /// every user of the machine in the process list.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_TOKEN",
            hide_env_values = true,
            conflicts_with = "publish_token_file"
        )]
        publish_token: Option<String>,
        /// Read the publish token from this file (its first line).
        #[arg(long, env = "RFIDL_REGISTRY_TOKEN_FILE")]
        publish_token_file: Option<PathBuf>,
        /// Require this bearer token to decommission, re-commission, delete
        /// instances, open the dashboard's failed-list pages (a browser
        /// sends it as the password) and sign in to retry or discard from
        /// the dashboard. Prefer --operator-token-file.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_OPERATOR_TOKEN",
            hide_env_values = true,
            conflicts_with = "operator_token_file"
        )]
        operator_token: Option<String>,
        /// Read the operator token from this file (its first line).
        #[arg(long, env = "RFIDL_REGISTRY_OPERATOR_TOKEN_FILE")]
        operator_token_file: Option<PathBuf>,
        /// Accept this bearer token for service registrations and
        /// heartbeats. Prefer --registration-token-file, which may hold
        /// several.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_REGISTRATION_TOKEN",
            hide_env_values = true,
            conflicts_with = "registration_token_file"
        )]
        registration_token: Option<String>,
        /// Read the registration credentials from this file: one per line
        /// (blank lines and lines starting with # skipped), e.g. one per
        /// service. An instance is bound to the credential that registered it.
        #[arg(long, env = "RFIDL_REGISTRY_REGISTRATION_TOKEN_FILE")]
        registration_token_file: Option<PathBuf>,
        /// Accept registrations only of base URLs inside this network
        /// (CIDR, e.g. 10.0.0.0/8; repeat the flag, or separate by commas in
        /// the variable). Without it, any address.
        #[arg(
            long = "allow-network",
            value_name = "CIDR",
            env = "RFIDL_REGISTRY_ALLOW_NETWORKS",
            value_delimiter = ','
        )]
        allow_networks: Vec<rfidl_registry::access::Network>,
        /// At most this many registrations of one service per minute (a
        /// burst of as many); beyond, 429 `rate_limited`.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_REGISTRATIONS_PER_MINUTE",
            default_value_t = rfidl_registry::access::DEFAULT_REGISTRATIONS_PER_MINUTE,
            value_parser = clap::value_parser!(u32).range(1..)
        )]
        registrations_per_minute: u32,
        /// After SIGTERM or SIGINT, how long requests in flight may take to
        /// finish before the process exits anyway, in seconds.
        #[arg(long, env = "RFIDL_REGISTRY_SHUTDOWN_GRACE", default_value_t = 10)]
        shutdown_grace: u64,
        /// How long a client may take to send a request's headers (a
        /// duration); slower connections are closed.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_HEADER_READ_TIMEOUT",
            default_value = "10s",
            value_parser = parse_read_timeout
        )]
        header_read_timeout: Duration,
        /// How long a client may take to send a request's body after its
        /// headers (a duration); slower ones are refused and closed.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_BODY_READ_TIMEOUT",
            default_value = "30s",
            value_parser = parse_read_timeout
        )]
        body_read_timeout: Duration,
        /// How often the health aggregator polls every registered
        /// instance's /_rf/health (a duration: `2s`, `1m`, `500ms`).
        #[arg(
            long,
            env = "RFIDL_REGISTRY_HEALTH_INTERVAL",
            default_value = "60s",
            value_parser = parse_interval
        )]
        health_interval: Duration,
        /// An instance that misses this many heartbeats in a row is gone:
        /// it no longer counts as a provider (manifest scan, deploy-check,
        /// the dashboard's totals) until it heartbeats again.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_MISSED_HEARTBEATS",
            default_value_t = rfidl_registry::liveness::DEFAULT_MISSED_HEARTBEATS,
            value_parser = clap::value_parser!(u32).range(1..=1000)
        )]
        missed_heartbeats: u32,
        /// The heartbeat interval of an instance whose registration does
        /// not give its own (`heartbeatMs`; the runtime gives it).
        #[arg(
            long,
            env = "RFIDL_REGISTRY_HEARTBEAT_INTERVAL",
            default_value = "30s",
            value_parser = parse_interval
        )]
        heartbeat_interval: Duration,
        /// The secret (`whsec_…`) the registry signs its lifecycle commands
        /// (decommission, re-commission) to provider instances with; each
        /// provider lists it in `peers` under `rfidl-registry`. Without it,
        /// a decommission is recorded here but the providers are not told.
        /// Prefer --command-secret-file or the environment.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_COMMAND_SECRET",
            hide_env_values = true,
            conflicts_with = "command_secret_file"
        )]
        command_secret: Option<String>,
        /// Read the command secret from this file (its first line).
        #[arg(long, env = "RFIDL_REGISTRY_COMMAND_SECRET_FILE")]
        command_secret_file: Option<PathBuf>,
        /// SQLite file of the command outbox (default: the registry's
        /// database path with `.commands` appended).
        #[arg(long, env = "RFIDL_REGISTRY_COMMANDS_DB")]
        commands_db: Option<PathBuf>,
        /// Issue each registering service its signing secret and its peers'
        /// secrets (renewed at heartbeat, rotated with an overlap), so that
        /// services need no secret flags; the registry becomes the key
        /// authority (docs/registry.md, "Issued keys"). Needs --key-file.
        #[arg(long, env = "RFIDL_REGISTRY_ISSUE_KEYS", requires = "key_file")]
        issue_keys: bool,
        /// The key file that seals the issued keys in the database (created
        /// with mode 0600 if missing). Keep it apart from the database's
        /// backups: whoever has both can impersonate every service.
        #[arg(long, env = "RFIDL_REGISTRY_KEY_FILE")]
        key_file: Option<PathBuf>,
        /// A new signing secret per service this often (`7d`, `24h`).
        #[arg(
            long,
            env = "RFIDL_REGISTRY_KEY_ROTATION",
            default_value = "7d",
            value_parser = parse_interval
        )]
        key_rotation: Duration,
        /// How long a replaced secret is still issued and accepted; more
        /// than the longest heartbeat of the services.
        #[arg(
            long,
            env = "RFIDL_REGISTRY_KEY_OVERLAP",
            default_value = "10m",
            value_parser = parse_interval
        )]
        key_overlap: Duration,
    },
}

/// A read timeout: a duration from 100 ms to 10 minutes.
fn parse_read_timeout(text: &str) -> Result<Duration, String> {
    let timeout = rfidl_runtime::duration::parse_duration(text).map_err(|e| e.to_string())?;
    if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&timeout) {
        return Err(format!("`{text}` is out of range; give 100ms to 10m"));
    }
    Ok(timeout)
}

/// A health interval: a duration of at least 100 ms.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = rfidl_runtime::duration::parse_duration(text).map_err(|e| e.to_string())?;
    if interval < Duration::from_millis(100) {
        return Err(format!("`{text}` is too short; give at least 100ms"));
    }
    Ok(interval)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `info` by default, so each publish is logged (on stderr: stdout carries
    // only the `listening on` line); RUST_LOG overrides.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let Command::Serve {
        db,
        listen,
        publish_token,
        publish_token_file,
        operator_token,
        operator_token_file,
        registration_token,
        registration_token_file,
        allow_networks,
        registrations_per_minute,
        shutdown_grace,
        header_read_timeout,
        body_read_timeout,
        health_interval,
        missed_heartbeats,
        heartbeat_interval,
        command_secret,
        command_secret_file,
        commands_db,
        issue_keys,
        key_file,
        key_rotation,
        key_overlap,
    } = Cli::parse().command;
    let command_secret = match command_secret_file {
        Some(path) => Some(read_token_file(&path, "command secret")?),
        None => command_secret,
    };
    let publish_token = match publish_token_file {
        Some(path) => Some(read_token_file(&path, "publish token")?),
        None => publish_token,
    };
    let operator_token = match operator_token_file {
        Some(path) => Some(read_token_file(&path, "operator token")?),
        None => operator_token,
    };
    let registration_tokens = match registration_token_file {
        Some(path) => read_credentials_file(&path)?,
        None => registration_token.into_iter().collect(),
    };
    let mut registry = rfidl_registry::Registry::open(&db)?
        .health_interval(health_interval)
        .registrations_per_minute(registrations_per_minute)
        .missed_heartbeats(missed_heartbeats)
        .heartbeat_interval(heartbeat_interval);
    if let Some(token) = publish_token {
        anyhow::ensure!(
            !token.is_empty(),
            "the publish token is empty; give a non-empty --publish-token, \
             --publish-token-file or RFIDL_REGISTRY_TOKEN, or none of them for an open registry"
        );
        registry = registry.publish_token(token);
    }
    if let Some(token) = operator_token {
        anyhow::ensure!(
            !token.is_empty(),
            "the operator token is empty; give a non-empty --operator-token, \
             --operator-token-file or RFIDL_REGISTRY_OPERATOR_TOKEN, or none of them"
        );
        registry = registry.operator_token(token);
    }
    for token in registration_tokens {
        anyhow::ensure!(
            !token.is_empty(),
            "the registration token is empty; give a non-empty --registration-token or \
             RFIDL_REGISTRY_REGISTRATION_TOKEN, or none of them"
        );
        registry = registry.registration_token(token);
    }
    for network in allow_networks {
        registry = registry.allow_network(network);
    }
    // Closed by default: an open registry (no credential at all) serves
    // loopback only, as the services' diagnostics routes do.
    if registry.is_open() {
        anyhow::ensure!(
            listen.ip().is_loopback(),
            "refusing to listen on {listen} without a token: anyone who reaches the port could \
             publish, register, rewrite or delete instances and decommission versions; give \
             --publish-token-file, --registration-token-file and --operator-token-file \
             (RFIDL_REGISTRY_TOKEN_FILE, RFIDL_REGISTRY_REGISTRATION_TOKEN_FILE, \
             RFIDL_REGISTRY_OPERATOR_TOKEN_FILE), or listen on 127.0.0.1 \
             (docs/registry.md, \"Credentials\")"
        );
        tracing::warn!(
            %listen,
            "no token configured: this registry is open to anyone who reaches the port \
             (loopback only); see docs/registry.md, \"Credentials\""
        );
    }
    let mut commands = None;
    let mut command_key = None;
    if let Some(text) = command_secret {
        let secret = rfidl_runtime::signing::Secret::parse(&text)
            .context("the command secret is not a valid `whsec_…` secret")?;
        command_key = Some(secret.clone());
        let path = commands_db.unwrap_or_else(|| {
            let mut path = db.clone().into_os_string();
            path.push(".commands");
            PathBuf::from(path)
        });
        let sender = rfidl_registry::commands::CommandSender::start(&path, secret)
            .with_context(|| format!("cannot start the command outbox in {}", path.display()))?;
        registry = registry.commands(sender.clone());
        commands = Some(sender);
    }
    if let (true, Some(path)) = (issue_keys, &key_file) {
        let mut authority = rfidl_registry::keys::KeyAuthority::load_or_create(path)?
            .rotation(key_rotation)
            .overlap(key_overlap);
        // Providers then need no `peers.rfidl-registry` either.
        if let Some(secret) = command_key {
            authority = authority.command_secret(secret);
        }
        registry = registry.issue_keys(authority)?;
    }
    // Handlers first: a signal that comes once `listening on` is out must
    // find them in place.
    let shutdown = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    // Best effort: a reader that took the first line and closed the pipe
    // must not stop the registry.
    let _ = writeln!(
        std::io::stdout().lock(),
        "dashboard: http://{}/",
        listener.local_addr()?
    );
    let aggregator = registry.spawn_health_aggregator(health_interval);

    let (signalled, mut on_signal) = tokio::sync::watch::channel(false);
    let mut server = tokio::spawn(
        // rfidl_runtime::serve: header and body read timeouts, which
        // axum::serve lacks (a client trickling bytes holds no connection).
        rfidl_runtime::serve(listener, registry.router())
            .header_read_timeout(header_read_timeout)
            .body_read_timeout(body_read_timeout)
            .with_graceful_shutdown(async move {
                let _ = on_signal.wait_for(|s| *s).await;
            })
            .into_future(),
    );
    tokio::select! {
        result = &mut server => {
            result??;
            return Ok(());
        }
        signal = shutdown => {
            tracing::info!(signal, "shutting down: finishing the requests in flight");
            let _ = signalled.send(true);
        }
    }
    aggregator.abort();
    if let Some(commands) = &commands {
        commands.shutdown().await;
    }
    let grace = Duration::from_secs(shutdown_grace);
    match tokio::time::timeout(grace, &mut server).await {
        Ok(result) => {
            result??;
            tracing::info!("stopped");
        }
        Err(_) => {
            server.abort();
            tracing::warn!(
                seconds = shutdown_grace,
                "requests still in flight after the shutdown grace; stopped without them"
            );
        }
    }
    Ok(())
}

/// Installs the SIGTERM and SIGINT handlers now; the future names the
/// first of them to arrive.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Ctrl-C where there are no Unix signals.
#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl Future<Output = &'static str>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    })
}

/// The `what` (e.g. `publish token`) in `path`: its first line, without
/// the line end. The error names the file, never its content.
fn read_token_file(path: &std::path::Path, what: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} file {}", path.display()))?;
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}

/// The registration credentials in `path`: one per line, blank lines and
/// `#` comments skipped; at least one.
fn read_credentials_file(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the registration token file {}", path.display()))?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(
        !tokens.is_empty(),
        "the registration token file {} holds no token (one per line)",
        path.display()
    );
    Ok(tokens)
}
