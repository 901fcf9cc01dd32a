//! Runtime configuration: one `Config` with the spec's defaults, readable from YAML.
//!
//! Every duration is written in the `"1h30m"` form (see [`crate::duration`]).
//! A YAML file only needs the settings it changes; the rest keep their defaults.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::serde_human;

/// How hard a commit tries to reach the disk before it returns.
///
/// * `Normal` (`synchronous=NORMAL` in WAL mode): a commit is atomic and
///   consistent, but the last transactions before a power loss (not a process
///   crash) may be rolled back. Right for a sender: its business rows and
///   outbox rows live in the same database and share one fate.
/// * `Full` (`synchronous=FULL`): every commit is fsynced before it returns.
///   Required for a receiver, whose 2xx answer is a promise that the effect is
///   stored: losing it after the answer would lose the message for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Normal,
    Full,
}

/// Outbox (sender side) settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    #[serde(with = "serde_human")]
    pub backoff_max: Duration,
    /// Upper bound of the uniformly random jitter added to each backoff.
    #[serde(with = "serde_human")]
    pub jitter: Duration,
    /// Rows claimed per dispatcher round.
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
            durability: Durability::Normal,
        }
    }
}

/// Inbox and receiver settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboxConfig {
    /// Processed-message records are kept this long. A message created
    /// longer ago than `retention - signature_tolerance` (the dedup horizon)
    /// that has no record is refused with 422 `beyond_dedup_horizon`, never
    /// processed a second time; so keep it above the senders' `outbox.ttl`
    /// plus the signature tolerance, or a retry late in a long outage needs a
    /// human. Default 25 h: the default 24 h TTL, the 5 min tolerance, and
    /// margin.
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
    /// Receivers answer 2xx only after the commit is on disk: `full` by default.
    pub durability: Durability,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(25 * 3600),
            body_limit: 1024 * 1024,
            signature_tolerance: Duration::from_secs(5 * 60),
            in_progress_wait: Duration::from_secs(5),
            durability: Durability::Full,
        }
    }
}

/// Where a destination is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    /// `http://host:port` or `https://host:port` (base URL; `/_rf/receive`
    /// is appended; HTTPS needs the default cargo feature `tls`), `unix:///path.sock`,
    /// or `inproc://name` for a receiver registered in the same process.
    pub url: String,
    /// The secret this service signs with when sending there (`whsec_...`).
    pub secret: String,
    /// For `https://` URLs: a PEM file of CA certificates to trust besides
    /// the public web roots (an internal CA, or the peer's self-signed
    /// certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// The whole runtime configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This service's id: `sourceServiceId` of everything it sends.
    pub service_id: String,
    pub outbox: OutboxConfig,
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
        }
    }
}

/// A configuration file that could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {source}")]
    Yaml {
        path: String,
        source: serde_yaml::Error,
    },
}

impl Config {
    /// Parses YAML text; missing settings keep their defaults, unknown ones are errors.
    pub fn from_yaml_str(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }

    /// Reads a YAML file.
    pub fn from_yaml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::from_yaml_str(&text).map_err(|source| ConfigError::Yaml {
            path: shown,
            source,
        })
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
        assert!(Config::from_yaml_str("outbox:\n  poll: 1s\n").is_err());
        assert!(Config::from_yaml_str("outbox:\n  ttl: soon\n").is_err());
    }
}
