//! Runtime configuration: one `Config` with the spec's defaults, readable from YAML.
//!
//! Every duration is written in the `"1h30m"` form (see [`crate::duration`]).
//! A YAML file only needs the settings it changes; the rest keep their defaults.
//! [`Config::overlay_env`] then applies `RFIDL_…` environment variables
//! (see [`crate::config::env`]), secrets included, from files or the environment.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::serde_human;

pub mod env;
mod housekeeping;

pub use housekeeping::{BackupConfig, VacuumConfig};

/// How hard a commit tries to reach the disk before it returns.
///
/// * `Normal` (`synchronous=NORMAL` in WAL mode): a commit is atomic and
///   consistent, but the transactions committed since the last WAL
///   checkpoint may be rolled back by a power loss (not by a process crash).
///   Right for a sender: its business rows and outbox rows live in the same
///   database and share one fate, and the dispatcher (whose claims always
///   commit with `Full`) sends nothing that is not durable yet.
/// * `Full` (`synchronous=FULL`): every commit is fsynced before it returns.
///   Required for a receiver, whose 2xx answer is a promise that the effect is
///   stored: losing it after the answer would lose the message for good.
///
/// Both shown under simulated power cuts: `docs/guarantees-durability.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// `synchronous=NORMAL`: atomic, but the last commits before a power
    /// loss may be undone. The default, and the outbox's (`outbox.durability`).
    #[default]
    Normal,
    /// `synchronous=FULL`: durable when the commit returns. The inbox's
    /// default (`inbox.durability`).
    Full,
}

/// Outbox (sender side) settings.
///
/// Start from [`Default`] (or YAML) and change fields; the struct is
/// `#[non_exhaustive]`, so new settings can be added without breaking
/// callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct OutboxConfig {
    /// Safety-net poll interval; enqueues through the runtime wake the dispatcher at once.
    #[serde(with = "serde_human")]
    pub poll_interval: Duration,
    /// Attempts after the first before a message becomes `Failed`, counting
    /// only answers that say the message is at fault (handler failed, 401,
    /// a 2xx without acknowledgement). An unreachable or overloaded
    /// destination is retried until the TTL without counting.
    pub max_retries: u32,
    /// Time to live from enqueue; past it a message becomes `Expired`.
    #[serde(with = "serde_human")]
    pub ttl: Duration,
    /// Backoff base: the delay before retry `n` is `min(base * 2^n, max) + jitter`.
    #[serde(with = "serde_human")]
    pub backoff_base: Duration,
    /// Backoff cap: no computed delay exceeds it before the jitter is added
    /// (default 5 min). A receiver's longer `Retry-After` still wins.
    #[serde(with = "serde_human")]
    pub backoff_max: Duration,
    /// Upper bound of the uniformly random jitter added to each backoff.
    #[serde(with = "serde_human")]
    pub jitter: Duration,
    /// The most messages sent in one request (a batch) to a destination,
    /// and the most rows a dispatcher round claims (at least 64, cut
    /// into requests of at most this many).
    pub batch_size: u32,
    /// Sends in flight at once, over all destinations.
    pub max_in_flight: usize,
    /// A row left `Sending` longer than this (crashed dispatcher) is claimed again.
    #[serde(with = "serde_human")]
    pub lease_timeout: Duration,
    /// Per-request timeout of the transport.
    #[serde(with = "serde_human")]
    pub request_timeout: Duration,
    /// Longest wait between two probes of an unreachable destination (its
    /// circuit is open; see `rfidl_runtime::circuit`). Probes start at
    /// `backoff_base` and double up to this.
    #[serde(with = "serde_human")]
    pub probe_interval_max: Duration,
    /// `Sent` rows are deleted this long after they were sent.
    #[serde(with = "serde_human")]
    pub sent_retention: Duration,
    /// Rows that were never delivered are deleted this long after they
    /// stopped (default 7 days, time to investigate): `Failed` and
    /// `DeadLetter` rows after their last attempt, `Expired` rows after
    /// their TTL ended, `Discarded` rows after the operator's discard.
    #[serde(with = "serde_human")]
    pub failed_retention: Duration,
    /// How enqueuing transactions commit: `normal` by default. With
    /// `normal` a power cut can undo the last commits since a WAL
    /// checkpoint, business rows and their outbox rows together; never a
    /// message already sent, because the dispatcher's claim then commits
    /// with `synchronous=FULL` (making the enqueuing transaction durable
    /// before anything leaves). With `full` every enqueuing transaction is
    /// durable when it commits: `Outbox::send` commits so, and
    /// `Outbox::enqueue` refuses (`OutboxError::NotDurable`) a transaction
    /// whose connection commits with less; the claim then needs no fsync,
    /// so none lies between a commit and its delivery. See
    /// `docs/guarantees-durability.md`.
    pub durability: Durability,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            max_retries: 5,
            ttl: Duration::from_secs(24 * 3600),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(5 * 60),
            jitter: Duration::from_millis(500),
            batch_size: 50,
            max_in_flight: 16,
            lease_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            probe_interval_max: Duration::from_secs(5),
            sent_retention: Duration::from_secs(7 * 24 * 3600),
            failed_retention: Duration::from_secs(7 * 24 * 3600),
            durability: Durability::Normal,
        }
    }
}

/// Inbox and receiver settings.
///
/// Start from [`Default`] (or YAML) and change fields; the struct is
/// `#[non_exhaustive]`, so new settings can be added without breaking
/// callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct InboxConfig {
    /// Processed-message records are kept this long. A message created
    /// longer ago than `retention - signature_tolerance` (the dedup horizon)
    /// that has no record is refused with 422 `beyond_dedup_horizon`, never
    /// processed a second time; so keep it at least the senders' `outbox.ttl`
    /// plus the signature tolerance (`Retention::spawn` warns otherwise), or
    /// a retry late in a long outage needs a human. Default 25 h: the
    /// default 24 h TTL, the 5 min tolerance, and margin.
    #[serde(with = "serde_human")]
    pub retention: Duration,
    /// Largest accepted request body, in bytes (413 past it).
    pub body_limit: usize,
    /// Accepted clock difference for `webhook-timestamp`, either way.
    #[serde(with = "serde_human")]
    pub signature_tolerance: Duration,
    /// How long a delivery waits for a concurrent copy of the same message
    /// before answering 503 `in_progress`.
    #[serde(with = "serde_human")]
    pub in_progress_wait: Duration,
    /// Receivers answer 2xx only after the commit is on disk: `full` by
    /// default. With `normal`, a power cut loses the messages acknowledged
    /// since the last WAL checkpoint (inbox row and effect together), and
    /// their senders, told 2xx, do not send them again. See
    /// `docs/guarantees-durability.md`.
    pub durability: Durability,
    /// Writers of a PostgreSQL receiver (blocking store: threads with a
    /// connection each; sqlx store: tasks taking a connection of the pool
    /// while they commit): how many transactions, and so how many handlers,
    /// run at once, and the connections the receiver holds. `0`: the
    /// store's default (4). SQLite has one writer, which group-commits.
    /// [`ReceiverBuilder::writers`](crate::receiver::ReceiverBuilder::writers)
    /// wins over this.
    pub writers: usize,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(25 * 3600),
            body_limit: 1024 * 1024,
            signature_tolerance: Duration::from_secs(5 * 60),
            in_progress_wait: Duration::from_secs(5),
            durability: Durability::Full,
            writers: 0,
        }
    }
}

/// Where a destination is reached.
///
/// Build it with [`DestinationConfig::new`] (or read it from YAML) and the
/// `with_…` methods, or change its public fields; the struct is
/// `#[non_exhaustive]`, so new settings can be added without breaking
/// callers.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DestinationConfig {
    /// `http://host:port` or `https://host:port` (base URL; `/_rf/receive`
    /// is appended; HTTPS needs the default cargo feature `tls`), `unix:///path.sock`,
    /// `grpc://host:port` (cargo feature `grpc`), or
    /// `nats://[user:password@]host:port/<subject>` for a NATS JetStream
    /// stream (cargo feature `nats`); see `docs/transports.md`. Any other
    /// scheme stops the dispatcher's start. A receiver in the same process
    /// is routed in code (`DispatcherBuilder::route` with an
    /// `InProcessTransport`), not here.
    pub url: String,
    /// More base URLs of the same destination: instances of one receiving
    /// service that share its inbox database. Messages are spread
    /// round-robin over `url` and these, and a message whose instance does
    /// not answer goes to the next at once
    /// ([`crate::transport::SpreadTransport`]). All must be `http://` or
    /// `https://`. Empty by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    /// The secret this service signs with when sending there (`whsec_...`).
    /// Empty (left out): the signing secret the registry issues to this
    /// service (`rfidl-registry serve --issue-keys`, `rfidl_runtime::keys`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// For `https://` URLs: a PEM file of CA certificates to trust besides
    /// the public web roots (an internal CA, or the peer's self-signed
    /// certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// For `nats://` URLs: the replica count of the stream rfidl creates
    /// (1 to 5; 3 on a 3-node JetStream cluster survives losing any node).
    /// The URL's `?replicas=N` wins. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<usize>,
}

impl DestinationConfig {
    /// A destination at one base URL, signed with `secret` (`whsec_…`; an
    /// empty one: the secret the registry issues); add more instances with
    /// [`with_urls`](Self::with_urls), an internal CA with
    /// [`with_ca_file`](Self::with_ca_file) and a JetStream stream's
    /// replicas with [`with_replicas`](Self::with_replicas) (the fields are
    /// public too).
    pub fn new(url: impl Into<String>, secret: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            urls: Vec::new(),
            secret: secret.into(),
            ca_file: None,
            replicas: None,
        }
    }

    /// Adds base URLs of more instances of the same destination
    /// ([`urls`](Self::urls)).
    #[must_use]
    pub fn with_urls<I>(mut self, urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.urls.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Trusts the CA certificates of this PEM file for `https://` URLs,
    /// besides the public web roots ([`ca_file`](Self::ca_file)).
    #[must_use]
    pub fn with_ca_file(mut self, ca_file: impl Into<std::path::PathBuf>) -> Self {
        self.ca_file = Some(ca_file.into());
        self
    }

    /// The replica count of the JetStream stream rfidl creates for a
    /// `nats://` URL ([`replicas`](Self::replicas)).
    #[must_use]
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = Some(replicas);
        self
    }
}

/// The whole runtime configuration.
///
/// Start from [`Config::for_service`], [`Default`] or YAML, then add peers
/// and destinations with [`with_peer`](Self::with_peer) and
/// [`with_destination`](Self::with_destination) or change the public
/// fields; the struct is `#[non_exhaustive]`, so new settings can be added
/// without breaking callers.
///
/// Its `Debug` form leaves the secrets out, so a config can be logged.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// This service's id: `sourceServiceId` of everything it sends.
    pub service_id: String,
    /// The sending side: dispatcher pacing, retries, TTL, leases,
    /// retention of `Sent` rows, commit durability.
    pub outbox: OutboxConfig,
    /// The receiving side: dedup retention, body limit, signature
    /// tolerance, commit durability.
    pub inbox: InboxConfig,
    /// Retention clean-up (sent outbox rows, expired inbox rows, TTL expiry) interval.
    #[serde(with = "serde_human")]
    pub cleanup_interval: Duration,
    /// Peers this service sends to, by destination name.
    pub destinations: BTreeMap<String, DestinationConfig>,
    /// Secrets accepted from each source service (`whsec_...`); several allow rotation.
    pub peers: BTreeMap<String, Vec<String>>,
    /// The engine registry to register with (`crate::directory`); none by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<crate::directory::RegistryConfig>,
    /// Online backups of the SQLite file: off until `backup.directory` is
    /// set, then hourly, kept 7 days.
    pub backup: BackupConfig,
    /// The incremental vacuum after retention (SQLite).
    pub vacuum: VacuumConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            service_id: "rfidl-service".to_owned(),
            outbox: OutboxConfig::default(),
            inbox: InboxConfig::default(),
            cleanup_interval: Duration::from_secs(5 * 60),
            destinations: BTreeMap::new(),
            peers: BTreeMap::new(),
            registry: None,
            backup: BackupConfig::default(),
            vacuum: VacuumConfig::default(),
        }
    }
}

/// A configuration that could not be read or understood.
///
/// Messages never quote a value from the file or the environment (it may
/// be a secret): they name the file, the setting or variable, the line and
/// what was expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file or a secret file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that could not be read.
        path: String,
        /// Why (not found, permission denied, …).
        source: std::io::Error,
    },
    /// The YAML text is not a valid configuration.
    #[error("invalid config {path}{}: {message}", location_suffix(*.line, *.column))]
    Yaml {
        /// The file, or `<text>` for [`Config::from_yaml_str`].
        path: String,
        /// What is wrong, without the value found.
        message: String,
        /// 1-based position of the error, when the parser knows it.
        line: Option<usize>,
        /// 1-based column of the error, when the parser knows it.
        column: Option<usize>,
    },
    /// An `RFIDL_…` environment variable is unknown or its value is not valid.
    #[error("invalid environment variable {variable}: {message}")]
    Env {
        /// The variable's name, e.g. `RFIDL_OUTBOX_TTL`.
        variable: String,
        /// What is wrong, without the value (it may be a secret).
        message: String,
    },
}

fn location_suffix(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!(" (line {line}, column {column})"),
        (Some(line), None) => format!(" (line {line})"),
        _ => String::new(),
    }
}

impl ConfigError {
    fn yaml(path: &str, error: &serde_path_to_error::Error<yaml_serde::Error>) -> Self {
        let setting = error.path().to_string();
        let error = error.inner();
        let location = error.location();
        let mut message = error.to_string();
        if let Some(location) = &location {
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_owned();
            }
        }
        // The parser's own path prefix is less precise than serde_path_to_error's
        // (it stops at `outbox` for an error in `outbox.ttl`).
        let message = crate::redact::value_free(&message);
        let body = match message.split_once(": ") {
            Some((prefix, body)) if !prefix.contains(' ') => body,
            _ => &message,
        };
        let message = if setting.is_empty() || setting == "." {
            body.to_owned()
        } else {
            format!("{setting}: {body}")
        };
        ConfigError::Yaml {
            path: path.to_owned(),
            message,
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
        }
    }
}

impl Config {
    /// The defaults, for the service `service_id` (the `sourceServiceId` of
    /// what it sends): `Config::for_service("hr").with_peer("engine", secret)`.
    pub fn for_service(service_id: impl Into<String>) -> Self {
        Self {
            service_id: service_id.into(),
            ..Self::default()
        }
    }

    /// Accepts messages from `peer` signed with `secret` (a `whsec_…`
    /// Standard Webhooks secret; call again to accept several during a
    /// rotation).
    #[must_use]
    pub fn with_peer(mut self, peer: impl Into<String>, secret: impl Into<String>) -> Self {
        self.peers
            .entry(peer.into())
            .or_default()
            .push(secret.into());
        self
    }

    /// Sends what clients address to `name` as `destination` says (its URL
    /// and signing secret).
    #[must_use]
    pub fn with_destination(
        mut self,
        name: impl Into<String>,
        destination: DestinationConfig,
    ) -> Self {
        self.destinations.insert(name.into(), destination);
        self
    }

    /// Parses YAML text; missing settings keep their defaults, unknown ones are errors.
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        parse_yaml(text).map_err(|error| ConfigError::yaml("<text>", &error))
    }

    /// Reads a YAML file.
    pub fn from_yaml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: shown.clone(),
            source,
        })?;
        parse_yaml(&text).map_err(|error| ConfigError::yaml(&shown, &error))
    }

    /// This configuration as YAML (the form [`Config::from_yaml_str`] reads).
    pub fn to_yaml(&self) -> String {
        yaml_serde::to_string(self).expect("a Config always serialises")
    }
}

fn parse_yaml(text: &str) -> Result<Config, serde_path_to_error::Error<yaml_serde::Error>> {
    serde_path_to_error::deserialize(yaml_serde::Deserializer::from_str(text))
}

impl DestinationConfig {
    /// `url`, then each of `urls`: every base URL of this destination.
    pub fn base_urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.urls.iter().map(String::as_str))
    }
}

impl std::fmt::Debug for DestinationConfig {
    /// Everything but the secret, and the URLs without passwords or keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A URL may hold a password, a connection string its key.
        let urls: Vec<String> = self
            .urls
            .iter()
            .map(|url| crate::redact::destination_url(url))
            .collect();
        f.debug_struct("DestinationConfig")
            .field("url", &crate::redact::destination_url(&self.url))
            .field("urls", &urls)
            .field("secret", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl std::fmt::Debug for Config {
    /// Everything but the secrets: peers show how many secrets each has.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers: BTreeMap<&str, String> = self
            .peers
            .iter()
            .map(|(peer, secrets)| (peer.as_str(), format!("<{} secret(s)>", secrets.len())))
            .collect();
        f.debug_struct("Config")
            .field("service_id", &self.service_id)
            .field("outbox", &self.outbox)
            .field("inbox", &self.inbox)
            .field("cleanup_interval", &self.cleanup_interval)
            .field("destinations", &self.destinations)
            .field("peers", &peers)
            .field("backup", &self.backup)
            .field("vacuum", &self.vacuum)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_spec() {
        let config = Config::default();
        assert_eq!(config.outbox.poll_interval, Duration::from_secs(1));
        assert_eq!(config.outbox.max_retries, 5);
        assert_eq!(config.outbox.ttl, Duration::from_secs(86_400));
        assert_eq!(config.outbox.backoff_base, Duration::from_secs(2));
        assert_eq!(config.outbox.backoff_max, Duration::from_secs(300));
        assert_eq!(config.outbox.jitter, Duration::from_millis(500));
        assert_eq!(config.outbox.batch_size, 50);
        assert_eq!(
            config.outbox.sent_retention,
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(
            config.outbox.failed_retention,
            Duration::from_secs(7 * 86_400)
        );
        // Above the default TTL plus the signature tolerance, so no retry of
        // a message within its TTL falls beyond the dedup horizon.
        assert_eq!(config.inbox.retention, Duration::from_secs(25 * 3600));
        assert!(config.inbox.retention > config.outbox.ttl + config.inbox.signature_tolerance);
        assert_eq!(config.cleanup_interval, Duration::from_secs(300));
        assert_eq!(config.inbox.durability, Durability::Full);
    }

    #[test]
    fn yaml_overrides_only_what_it_names() {
        let config = Config::from_yaml_str(
            "service_id: hr\noutbox:\n  ttl: 48h\n  max_retries: 10\npeers:\n  engine: [whsec_AAAA]\n",
        )
        .expect("valid yaml");
        assert_eq!(config.service_id, "hr");
        assert_eq!(config.outbox.ttl, Duration::from_secs(48 * 3600));
        assert_eq!(config.outbox.max_retries, 10);
        assert_eq!(config.outbox.batch_size, 50);
        assert_eq!(config.peers["engine"], vec!["whsec_AAAA".to_owned()]);
    }

    #[test]
    fn yaml_rejects_unknown_settings_and_bad_durations() {
        let unknown = Config::from_yaml_str("outbox:\n  poll: 1s\n").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `poll`"),
            "{unknown}"
        );
        let bad = Config::from_yaml_str("outbox:\n  ttl: soon\n").unwrap_err();
        assert!(bad.to_string().contains("outbox.ttl"), "{bad}");
    }

    #[test]
    fn a_destination_may_list_more_base_urls() {
        let one =
            Config::from_yaml_str("destinations:\n  hr: {url: 'http://a:1', secret: whsec_AAAA}\n")
                .expect("one url");
        assert!(one.destinations["hr"].urls.is_empty());
        assert_eq!(
            one.destinations["hr"].base_urls().collect::<Vec<_>>(),
            ["http://a:1"]
        );
        let several = Config::from_yaml_str(
            "destinations:\n  hr:\n    url: http://a:1\n    urls: [http://b:1, http://c:1]\n    secret: whsec_AAAA\n",
        )
        .expect("several urls");
        assert_eq!(
            several.destinations["hr"].base_urls().collect::<Vec<_>>(),
            ["http://a:1", "http://b:1", "http://c:1"]
        );
        assert!(several.to_yaml().contains("urls:"));
        assert_eq!(
            Config::from_yaml_str(&several.to_yaml()).expect("round trip"),
            several
        );
        let typo = Config::from_yaml_str(
            "destinations:\n  hr: {url: 'http://a:1', url2: 'http://b:1', secret: whsec_AAAA}\n",
        )
        .unwrap_err();
        assert!(typo.to_string().contains("unknown field `url2`"), "{typo}");
    }

    #[test]
    fn yaml_errors_name_the_setting_and_line_but_not_the_value() {
        for text in [
            "outbox:\n  max_retries: whsec_TOPSECRET\n",
            "outbox:\n  ttl: whsec_TOPSECRET\n",
            "inbox:\n  durability: whsec_TOPSECRET\n",
            "peers:\n  hr: whsec_TOPSECRET\n",
            "destinations:\n  hr: {url: x, secret: [whsec_TOPSECRET]}\n",
        ] {
            let error = Config::from_yaml_str(text).unwrap_err();
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("TOPSECRET"), "{shown}");
            let ConfigError::Yaml { line, .. } = &error else {
                panic!("{error:?}")
            };
            assert_eq!(*line, Some(2), "{error}");
        }
    }

    #[test]
    fn debug_output_leaves_secrets_out() {
        let mut config = Config::default();
        config.destinations.insert(
            "hr".into(),
            DestinationConfig {
                url: "http://127.0.0.1:1".into(),
                urls: vec!["http://127.0.0.1:2".into()],
                secret: "whsec_TOPSECRET1".into(),
                ca_file: None,
                replicas: None,
            },
        );
        config
            .peers
            .insert("hr".into(), vec!["whsec_TOPSECRET2".into()]);
        let shown = format!("{config:?} {config:#?}");
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:1"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:2"), "{shown}");
    }

    /// The YAML form of a config, pinned: what serde_yaml 0.9 wrote, byte
    /// for byte (the YAML crate was swapped; files must not change).
    #[test]
    fn yaml_output_is_pinned() {
        let mut config = Config {
            service_id: "hr: \"main\"".into(),
            ..Config::default()
        };
        config.destinations.insert(
            "engine".into(),
            DestinationConfig {
                url: "http://127.0.0.1:7002".into(),
                urls: Vec::new(),
                secret: "whsec_AAAA".into(),
                ca_file: None,
                replicas: None,
            },
        );
        config.peers.insert(
            "engine".into(),
            vec!["whsec_BBBB".into(), "whsec_CCCC".into()],
        );
        let yaml = config.to_yaml();
        assert_eq!(yaml, PINNED_YAML);
        assert_eq!(Config::from_yaml_str(&yaml).expect("round trip"), config);
    }

    #[test]
    fn the_builders_set_what_yaml_sets() {
        let built = Config::for_service("engine")
            .with_peer("hr", "whsec_AAAA")
            .with_peer("hr", "whsec_BBBB")
            .with_destination(
                "hr",
                DestinationConfig::new("https://hr-1:7001", "whsec_CCCC")
                    .with_urls(["https://hr-2:7001"])
                    .with_ca_file("/etc/rfidl/ca.pem")
                    .with_replicas(3),
            );
        let read = Config::from_yaml_str(
            "service_id: engine\n\
             peers: {hr: [whsec_AAAA, whsec_BBBB]}\n\
             destinations:\n  \
               hr:\n    \
                 url: https://hr-1:7001\n    \
                 urls: [https://hr-2:7001]\n    \
                 secret: whsec_CCCC\n    \
                 ca_file: /etc/rfidl/ca.pem\n    \
                 replicas: 3\n",
        )
        .expect("yaml");
        assert_eq!(built, read);
        let registry = crate::directory::RegistryConfig::new("http://registry:7300")
            .with_token("t0k")
            .with_heartbeat(Duration::from_secs(10));
        assert_eq!(registry.token.as_deref(), Some("t0k"));
        assert_eq!(registry.heartbeat, Duration::from_secs(10));
    }

    const PINNED_YAML: &str = include_str!("../tests/config.pinned.yaml");
}
