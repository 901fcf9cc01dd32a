//! Two small services built only on generated code and the runtime: an HR
//! service and a stand-in workflow engine, each with its own database (a
//! SQLite file by default, or PostgreSQL on sqlx: [`store`]) and HTTP
//! receiver on loopback.
//!
//! HR hires employees: the employee row and the `EmployeeHired` pushcall are
//! written in one transaction. The engine handles the pushcall (a workflow
//! row, exactly once) and, in the same transaction, enqueues the
//! `ProvisionLaptop` command back to HR, whose handler stores the ticket.

pub mod broker;
pub mod engine;
pub mod hr;
pub mod pg;
pub mod registry;
pub mod store;
pub mod verdict;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::directory::{InterfaceRef, PublishOnRegistration, RegistryConfig};
use rfidl_runtime::host::HostBuilder;
use rfidl_runtime::keys::IssuedKeys;
use rfidl_runtime::{AnyStore, Config, Host};

pub use store::Database;

/// How one service is started; both demo binaries take these as flags.
/// Its `Debug` form leaves the secrets out.
#[derive(Clone)]
pub struct Settings {
    /// This service's id (`sourceServiceId` of what it sends).
    pub service_id: String,
    /// Where its receiver listens (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Where it also serves its receiver over gRPC (`rfidl.RFReceiver`),
    /// if anywhere (`--grpc-listen`).
    pub grpc_listen: Option<SocketAddr>,
    /// Its database (business rows, outbox and inbox): a SQLite file or a
    /// PostgreSQL database.
    pub db: Database,
    /// The peer's id, base URL, and the secret this service signs with
    /// (empty, with a `registry`: the keys the registry issues).
    pub peer_id: String,
    pub peer_url: String,
    /// More base URLs of the peer (instances sharing its database): the
    /// dispatcher spreads over them and fails over (`DestinationConfig::urls`).
    pub peer_urls: Vec<String>,
    pub signing_secret: String,
    /// The secret the peer signs with (accepted by this service's
    /// receiver); empty, with a `registry`: the keys the registry issues.
    pub peer_secret: String,
    /// Runtime settings read from a YAML file (`--config`); `None`: the
    /// demo's quick-retry defaults.
    pub base_config: Option<Config>,
    /// The engine registry to register with (`--registry URL`); overrides
    /// the URL of the config file's `registry:` section.
    pub registry: Option<String>,
    /// Consume this service's inbound messages from NATS JetStream at this
    /// `nats://host:port/<subject>` URL (`--nats`), besides HTTP.
    pub nats: Option<String>,
    /// Consume this service's inbound messages from an AMQP 1.0 broker at
    /// this URL or Service Bus connection string (`--amqp`), besides HTTP.
    pub amqp: Option<String>,
    /// The bearer token of the `/_rf/…` diagnostics routes (`--ops-token`);
    /// without it the retries refuse (403) and the service must listen on
    /// loopback only. Given to the registry for its health checks.
    pub ops_token: Option<String>,
    /// The registry's publish token (`--registry-publish-token`): with it,
    /// the service publishes the manifests of what it hosts before it
    /// registers.
    pub registry_publish_token: Option<String>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field(
                "registry_publish_token",
                &self.registry_publish_token.is_some(),
            )
            .field("service_id", &self.service_id)
            .field("listen", &self.listen)
            .field("grpc_listen", &self.grpc_listen)
            .field("db", &self.db)
            .field("peer_id", &self.peer_id)
            .field("peer_url", &shown_url(&self.peer_url))
            .field("peer_urls", &self.peer_urls)
            .field("nats", &self.nats.is_some())
            .field("amqp", &self.amqp.is_some())
            .field("base_config", &self.base_config)
            .finish_non_exhaustive()
    }
}

/// An AMQP peer URL or connection string without its password or key.
fn shown_url(url: &str) -> String {
    if rfidl_runtime::amqp::AmqpUrl::is_amqp(url) {
        return rfidl_runtime::amqp::AmqpUrl::parse(url)
            .map(|url| url.shown())
            .unwrap_or_else(|_| "(a malformed AMQP URL)".to_owned());
    }
    url.to_owned()
}

impl Settings {
    /// The runtime configuration: the `--config` file if given, else quick
    /// retries so the demo's outage heals fast; then this service's id, peer
    /// and secrets from the flags.
    pub fn runtime_config(&self, destination: &str) -> Config {
        let mut config = self.base_config.clone().unwrap_or_else(demo_config);
        config.service_id = self.service_id.clone();
        config.destinations.insert(
            destination.to_owned(),
            DestinationConfig::new(self.peer_url.clone(), self.signing_secret.clone())
                .with_urls(self.peer_urls.clone()),
        );
        if !self.peer_secret.is_empty() {
            config
                .peers
                .insert(self.peer_id.clone(), vec![self.peer_secret.clone()]);
        }
        if let Some(url) = &self.registry {
            match &mut config.registry {
                Some(registry) => registry.url = url.clone(),
                None => config.registry = Some(RegistryConfig::new(url.clone())),
            }
        }
        config
    }
}

impl Settings {
    /// The set of keys the registry issues, when this service signs and
    /// verifies with them: no signing secret given, and a registry to
    /// register with (`rfidl-registry serve --issue-keys`).
    pub fn issued_keys(&self) -> Option<IssuedKeys> {
        (self.signing_secret.is_empty() && self.registry.is_some()).then(IssuedKeys::new)
    }
}

/// Logs to stderr (stdout carries the lines a script reads, such as
/// `listening on`) at `info` unless `RUST_LOG` says otherwise, so that a
/// refused registration or an open circuit shows without a flag.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// `interface` `version` at `fingerprint`.
pub fn interface_ref(interface: &str, version: u32, fingerprint: &str) -> InterfaceRef {
    InterfaceRef::new(interface, version, fingerprint)
}

/// What a service publishes on registration when `settings` holds the
/// registry's publish token: the manifests of the versions it hosts.
pub fn publish_hosted(settings: &Settings, manifests: &[&str]) -> Option<PublishOnRegistration> {
    let token = settings.registry_publish_token.clone()?;
    Some(PublishOnRegistration {
        token,
        manifests: manifests.iter().map(|m| (*m).to_owned()).collect(),
    })
}

/// The manifests of EmpService v1 and v2 as compiled here (what HR hosts).
#[allow(deprecated)]
pub fn emp_service_manifests() -> [&'static str; 2] {
    use crate::generated::hr::employees::{emp_service_v1, emp_service_v2};
    [emp_service_v1::MANIFEST_JSON, emp_service_v2::MANIFEST_JSON]
}

/// EmpService v1 and v2 as compiled here: what HR hosts and the engine
/// calls, for their registrations. (v1 is deprecated in the contract and
/// still served on purpose, as a service does while its peers move to v2.)
#[allow(deprecated)]
pub fn emp_service_versions() -> Vec<InterfaceRef> {
    use crate::generated::hr::employees::{emp_service_v1, emp_service_v2};
    vec![
        interface_ref(
            emp_service_v1::INTERFACE,
            emp_service_v1::VERSION,
            emp_service_v1::FINGERPRINT,
        ),
        interface_ref(
            emp_service_v2::INTERFACE,
            emp_service_v2::VERSION,
            emp_service_v2::FINGERPRINT,
        ),
    ]
}

/// Counts rows with one query, the same SQL on both stores (the demo's
/// numbers all come from the databases).
pub fn count(db: &Database, sql: &str) -> anyhow::Result<i64> {
    store::count(db, sql)
}

/// What both demo services add to their host from the flags: the keys the
/// registry issues (no secrets given), the diagnostics token, the gRPC
/// server (`--grpc-listen`), JetStream (`--nats`, a `nats://` peer) and the
/// bound of a graceful stop.
pub async fn options<S: AnyStore>(
    host: HostBuilder<S>,
    settings: &Settings,
) -> anyhow::Result<HostBuilder<S>> {
    let mut host = host.shutdown_timeout(SHUTDOWN_BOUND);
    if let Some(keys) = settings.issued_keys() {
        host = host.issued_keys(&keys);
    }
    if let Some(token) = &settings.ops_token {
        host = host.ops_token(token.clone());
    }
    if let Some(address) = settings.grpc_listen {
        host = host.grpc(tokio::net::TcpListener::bind(address).await?);
    }
    broker::brokers(host, settings)
}

/// How long a graceful stop may take before the process gives up and
/// exits non-zero.
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);

/// Installs the SIGTERM and SIGINT (Ctrl-C) handlers *now*, and returns a
/// future that resolves with the name of the first of them received. Call
/// it first thing in `main`: a signal that arrives while the service is
/// still starting (or, for `hr-service`, still hiring) then stops it
/// gracefully instead of killing it.
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    Ok(rfidl_runtime::host::shutdown_signal()?)
}

/// The end of a demo binary's `main`: waits for `signal` (from
/// [`shutdown_signal`], installed at the start of `main`), then [`finish`].
pub async fn run_until_signal(
    name: &str,
    signal: impl std::future::Future<Output = &'static str>,
    host: Host,
) -> anyhow::Result<()> {
    let signal = signal.await;
    finish(name, signal, host).await
}

/// Stops `host` gracefully after `signal` (`Host::shutdown`: HTTP and gRPC
/// finish the requests in flight and JetStream the messages in hand, the
/// receiver commits what it queued, the dispatcher records its sends so
/// nothing is left `Sending`, then the clean-up and the registration), with
/// the log lines an operator expects; exits 1 if that takes longer than
/// [`SHUTDOWN_BOUND`].
pub async fn finish(name: &str, signal: &str, host: Host) -> anyhow::Result<()> {
    tracing::info!(service = name, signal, "stopping gracefully");
    eprintln!("{name}: {signal} received, stopping");
    match host.shutdown().await {
        Ok(()) => {
            eprintln!("{name}: stopped");
            Ok(())
        }
        Err(error) => {
            tracing::error!(service = name, %error, "graceful stop timed out; exiting 1");
            eprintln!("{name}: {error}; exiting 1");
            std::process::exit(1);
        }
    }
}

/// Secure by default: a service serves its diagnostics without a token
/// only on loopback, and never with an empty token.
pub fn check_ops_access(listen: SocketAddr, ops_token: Option<&str>) -> anyhow::Result<()> {
    match ops_token {
        Some("") => anyhow::bail!(
            "the ops token is empty; give a non-empty --ops-token (RFIDL_OPS_TOKEN) or none"
        ),
        None if !listen.ip().is_loopback() => anyhow::bail!(
            "refusing to listen on {listen} without --ops-token (RFIDL_OPS_TOKEN): the \
             /_rf/… diagnostics routes (failed list, metrics) would answer anyone who reaches \
             the port; give a token, or listen on 127.0.0.1 (docs/operations.md, \"Access\")"
        ),
        _ => Ok(()),
    }
}

/// Flags shared by the `hr-service` and `engine` binaries.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// Address the receiver listens on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The database for business rows, outbox and inbox: a SQLite file
    /// (created if missing) or a PostgreSQL URL,
    /// `postgres://user:password@host:port/database` (sqlx; the service's
    /// tables in the schema `public`; several replicas of a service may
    /// share one).
    #[arg(long, value_parser = Database::parse)]
    pub db: Database,
    /// Base URL of the peer's receiver, e.g. http://127.0.0.1:7001; its
    /// scheme chooses the transport: http(s)://, unix:///path.sock,
    /// grpc://host:port (the peer's --grpc-listen), or
    /// nats://host:port/<subject> (the peer's --nats stream; JetStream),
    /// amqp[s]://[user:password@]host[:port]/<address> or a Service Bus
    /// connection string (the peer's --amqp address; AMQP 1.0); see
    /// docs/transports.md. Give an http(s) URL more than once for several
    /// instances of the peer that share its database: messages are spread
    /// over them, and one that does not answer is skipped
    /// (docs/operations.md, "Several receivers").
    #[arg(long = "peer-url", required = true, value_name = "URL")]
    pub peer_url: Vec<String>,
    /// Also serve this service's receiver over gRPC (`rfidl.RFReceiver`,
    /// plain HTTP/2) on this address, for peers that send with
    /// `--peer-url grpc://ADDR`. The HTTP receiver (`--listen`) stays.
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<SocketAddr>,
    /// Also consume this service's inbound messages from NATS JetStream:
    /// `nats://host:port/<subject>` (the stream and a durable consumer
    /// named after the service are created if missing). Needs a SQLite
    /// `--db`.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// Also consume this service's inbound messages from an AMQP 1.0
    /// broker: `amqp[s]://[user:password@]host[:port]/<address>` (RabbitMQ
    /// 3.x: `amqp://host//queue/<name>`) or an Azure Service Bus connection
    /// string (`Endpoint=sb://…;EntityPath=<queue>`). Needs a SQLite `--db`.
    #[arg(long, value_name = "URL")]
    pub amqp: Option<String>,
    /// Secret this service signs with (`whsec_…`). Prefer `--secret-file`
    /// or the environment: a flag's value is visible to every local user
    /// in the process list.
    #[arg(long, env = "RFIDL_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// File holding the secret this service signs with.
    #[arg(long, env = "RFIDL_SECRET_FILE", conflicts_with = "secret")]
    pub secret_file: Option<PathBuf>,
    /// Secret the peer signs with (`whsec_…`).
    #[arg(long, env = "RFIDL_PEER_SECRET", hide_env_values = true)]
    pub peer_secret: Option<String>,
    /// File holding the secret the peer signs with.
    #[arg(long, env = "RFIDL_PEER_SECRET_FILE", conflicts_with = "peer_secret")]
    pub peer_secret_file: Option<PathBuf>,
    /// Runtime settings in YAML (retries, TTL, lease, retention, …; see
    /// `rfidl_runtime::Config`). `RFIDL_…` environment variables win over
    /// it (docs/operations.md), and the flags above win over both.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Register with the engine registry at this URL (e.g.
    /// http://127.0.0.1:7300) and renew with a heartbeat; see
    /// docs/operations.md.
    #[arg(long, env = "RFIDL_REGISTRY_URL")]
    pub registry: Option<String>,
    /// Bearer token of the /_rf/… diagnostics routes. Without it the
    /// retries answer 403 and the service refuses to listen beyond
    /// loopback (its failed list would be open to anyone).
    #[arg(long, env = "RFIDL_OPS_TOKEN", hide_env_values = true)]
    pub ops_token: Option<String>,
    /// The registry's publish token: with it (and `--registry`), the
    /// service publishes the manifests of the interface versions it hosts
    /// before it registers, so it registers where nobody published them.
    #[arg(long, env = "RFIDL_REGISTRY_PUBLISH_TOKEN", hide_env_values = true)]
    pub registry_publish_token: Option<String>,
}

impl ServiceArgs {
    /// The settings these flags describe: the YAML file (or the demo's
    /// quick retries), then the `RFIDL_…` environment overlay, then the
    /// flags. Errors never show a secret.
    pub fn settings(&self, service_id: &str, peer_id: &str) -> anyhow::Result<Settings> {
        check_ops_access(self.listen, self.ops_token.as_deref())?;
        let mut config = match self.config.as_deref() {
            Some(path) => Config::from_yaml_file(path)?,
            None => demo_config(),
        };
        config.overlay_env()?;
        let signing_secret = secret_from(
            self.secret.as_deref(),
            self.secret_file.as_deref(),
            "--secret, --secret-file, RFIDL_SECRET or RFIDL_SECRET_FILE",
            self.registry.is_some(),
        )?;
        let peer_secret = secret_from(
            self.peer_secret.as_deref(),
            self.peer_secret_file.as_deref(),
            "--peer-secret, --peer-secret-file, RFIDL_PEER_SECRET or RFIDL_PEER_SECRET_FILE",
            self.registry.is_some(),
        )?;
        anyhow::ensure!(
            signing_secret.is_empty() == peer_secret.is_empty(),
            "give both secrets (--secret and --peer-secret), or neither to use the keys the \
             registry issues"
        );
        Ok(Settings {
            service_id: service_id.into(),
            listen: self.listen,
            grpc_listen: self.grpc_listen,
            db: self.db.clone(),
            peer_id: peer_id.into(),
            peer_url: self.peer_url[0].clone(),
            peer_urls: self.peer_url[1..].to_vec(),
            signing_secret,
            peer_secret,
            base_config: Some(config),
            registry: self.registry.clone(),
            nats: self.nats.clone(),
            amqp: self.amqp.clone(),
            ops_token: self.ops_token.clone(),
            registry_publish_token: self.registry_publish_token.clone(),
        })
    }
}

/// The secret given inline or in a file (trailing whitespace dropped).
fn secret_from(
    inline: Option<&str>,
    file: Option<&std::path::Path>,
    options: &str,
    issued: bool,
) -> anyhow::Result<String> {
    if let Some(secret) = inline {
        return Ok(secret.to_owned());
    }
    let Some(path) = file else {
        anyhow::ensure!(
            issued,
            "a secret is required: give one of {options}, or --registry with a registry that \
             issues keys (`rfidl-registry serve --issue-keys`)"
        );
        return Ok(String::new());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|error| anyhow::anyhow!("cannot read secret file {}: {error}", path.display()))?;
    let secret = text.trim_end();
    anyhow::ensure!(
        !secret.is_empty(),
        "secret file {} is empty",
        path.display()
    );
    Ok(secret.to_owned())
}

/// Quick retries, so the demo's outage heals fast.
fn demo_config() -> Config {
    let mut config = Config::default();
    config.outbox.backoff_base = Duration::from_millis(100);
    config.outbox.backoff_max = Duration::from_secs(1);
    config.outbox.jitter = Duration::from_millis(50);
    config.outbox.max_retries = 50;
    config.outbox.request_timeout = Duration::from_secs(2);
    config
}
