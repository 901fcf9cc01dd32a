//! The environment overlay of [`Config`]: `RFIDL_…` variables over YAML.
//!
//! Every scalar setting has one variable, named after its YAML path:
//! `outbox.max_retries` is `RFIDL_OUTBOX_MAX_RETRIES`, `cleanup_interval` is
//! `RFIDL_CLEANUP_INTERVAL`. The list is derived from the struct itself
//! ([`scalar_variables`]), so a new setting gets its variable without an
//! edit here. Values are written as in YAML (`48h`, `10`, `full`).
//!
//! Destinations and peers, with a name `NAME` (upper case; `-` and `.` as `_`):
//!
//! | variable | sets |
//! | --- | --- |
//! | `RFIDL_DESTINATIONS_NAME_URL` | `destinations.NAME.url` (adds the destination if the config has none of that name); several base URLs separated by commas set `url` to the first and `urls` to the others |
//! | `RFIDL_DESTINATIONS_NAME_SECRET` | `destinations.NAME.secret` |
//! | `RFIDL_DESTINATIONS_NAME_SECRET_FILE` | the same, read from a file (trailing whitespace dropped) |
//! | `RFIDL_DESTINATIONS_NAME_CA_FILE` | `destinations.NAME.ca_file` |
//! | `RFIDL_PEERS_NAME_SECRETS` | `peers.NAME`: secrets separated by commas |
//! | `RFIDL_PEERS_NAME_SECRETS_FILE` | the same, one secret per line (blank lines and `#` lines skipped) |
//!
//! A name the config does not know is read lower case with `_` as `-`
//! (`RFIDL_PEERS_HR_SERVICE_SECRETS` is peer `hr-service`).
//!
//! An unknown variable under `RFIDL_OUTBOX_`, `RFIDL_INBOX_`, `RFIDL_BACKUP_`,
//! `RFIDL_VACUUM_`, `RFIDL_DESTINATIONS_` or `RFIDL_PEERS_` is an error (a
//! typo must not be silently ignored); other `RFIDL_` variables belong to
//! applications.
//! Errors name the variable, never its value.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Config, ConfigError, DestinationConfig};

/// The prefix of every variable.
pub const PREFIX: &str = "RFIDL_";

/// Prefixes owned by the overlay: an unknown variable under one is an error.
const OWNED: [&str; 6] = [
    "RFIDL_OUTBOX_",
    "RFIDL_INBOX_",
    "RFIDL_BACKUP_",
    "RFIDL_VACUUM_",
    "RFIDL_DESTINATIONS_",
    "RFIDL_PEERS_",
];

/// One scalar setting's variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalarVariable {
    /// `RFIDL_OUTBOX_MAX_RETRIES`.
    pub name: String,
    /// The YAML path, `["outbox", "max_retries"]`.
    pub path: Vec<String>,
    /// The default, as YAML writes it (`5`, `1s`, `full`).
    pub default: String,
}

/// The variable of every scalar setting, sorted by name.
pub fn scalar_variables() -> Vec<ScalarVariable> {
    let defaults = serde_json::to_value(Config::default()).expect("a Config always serialises");
    let mut out = Vec::new();
    collect(&defaults, &mut Vec::new(), &mut out);
    out
}

fn collect(value: &serde_json::Value, path: &mut Vec<String>, out: &mut Vec<ScalarVariable>) {
    match value {
        serde_json::Value::Object(members) => {
            for (key, member) in members {
                // Maps keyed by name have variables of their own (above).
                if path.is_empty() && (key == "destinations" || key == "peers") {
                    continue;
                }
                path.push(key.clone());
                collect(member, path, out);
                path.pop();
            }
        }
        scalar => out.push(ScalarVariable {
            name: format!("{PREFIX}{}", path.join("_").to_uppercase()),
            path: path.clone(),
            default: match scalar {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            },
        }),
    }
}

/// `hr-service` -> `HR_SERVICE`.
pub fn name_key(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

impl Config {
    /// Applies the process's `RFIDL_…` environment variables (see
    /// [`crate::config::env`]) over this configuration.
    pub fn overlay_env(&mut self) -> Result<(), ConfigError> {
        let mut vars = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with(PREFIX) {
                continue;
            }
            let value = value.into_string().map_err(|_| ConfigError::Env {
                variable: name.to_owned(),
                message: "the value is not UTF-8".into(),
            })?;
            vars.push((name.to_owned(), value));
        }
        self.overlay_vars(vars)
    }

    /// [`Config::overlay_env`] with the variables given (for tests and
    /// for applications that read their environment elsewhere). On an
    /// error, `self` is left as it was.
    pub fn overlay_vars(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        let vars: BTreeMap<String, String> = vars
            .into_iter()
            .filter(|(name, _)| name.starts_with(PREFIX))
            .collect();
        check_conflicts(&vars)?;
        let scalars = scalar_variables();
        let mut tree = serde_json::to_value(&*self).expect("a Config always serialises");
        let mut overlaid: Option<Config> = None;
        let mut named: Vec<(&str, &str)> = Vec::new();
        for (name, value) in &vars {
            if let Some(scalar) = scalars.iter().find(|s| &s.name == name) {
                set_scalar(&mut tree, scalar, value)?;
                // Decoded after each variable, so an error names the right one.
                overlaid = Some(serde_json::from_value(tree.clone()).map_err(|error| {
                    ConfigError::Env {
                        variable: name.clone(),
                        message: crate::redact::value_free(&error.to_string()),
                    }
                })?);
            } else if name.starts_with("RFIDL_DESTINATIONS_") || name.starts_with("RFIDL_PEERS_") {
                named.push((name, value));
            } else if OWNED.iter().any(|prefix| name.starts_with(prefix)) {
                return Err(unknown(name));
            }
        }
        // All or nothing: `self` changes only when every variable applied.
        let mut next = overlaid.unwrap_or_else(|| self.clone());
        let configured: Vec<String> = next.destinations.keys().cloned().collect();
        for (name, value) in named {
            next.set_named(name, value)?;
        }
        // A destination the environment added needs at least a URL (its
        // secret may be issued by the registry: the dispatcher's start
        // refuses one without a secret when no keys are issued).
        let added = next
            .destinations
            .iter()
            .filter(|(name, _)| !configured.contains(name));
        for (name, destination) in added {
            for (missing, suffix) in [(destination.url.is_empty(), "URL")] {
                if missing {
                    return Err(ConfigError::Env {
                        variable: format!("RFIDL_DESTINATIONS_{}_{suffix}", name_key(name)),
                        message: format!(
                            "destination `{name}` has no {} (set this variable)",
                            suffix.to_lowercase()
                        ),
                    });
                }
            }
        }
        *self = next;
        Ok(())
    }

    fn set_named(&mut self, variable: &str, value: &str) -> Result<(), ConfigError> {
        if let Some(rest) = variable.strip_prefix("RFIDL_DESTINATIONS_") {
            for (suffix, field) in [
                ("_SECRET_FILE", Field::SecretFile),
                ("_CA_FILE", Field::CaFile),
                ("_SECRET", Field::Secret),
                ("_URL", Field::Url),
            ] {
                let Some(key) = rest.strip_suffix(suffix).filter(|k| !k.is_empty()) else {
                    continue;
                };
                let name = known_name(self.destinations.keys(), key);
                let destination = self
                    .destinations
                    .entry(name)
                    .or_insert_with(|| DestinationConfig::new("", ""));
                match field {
                    Field::Url => {
                        let mut urls = value
                            .split(',')
                            .map(str::trim)
                            .filter(|url| !url.is_empty())
                            .map(str::to_owned);
                        let Some(first) = urls.next() else {
                            return Err(ConfigError::Env {
                                variable: variable.to_owned(),
                                message: "no URL given".into(),
                            });
                        };
                        destination.url = first;
                        destination.urls = urls.collect();
                    }
                    Field::Secret => destination.secret = value.to_owned(),
                    Field::SecretFile => destination.secret = read_secret_file(variable, value)?,
                    Field::CaFile => destination.ca_file = Some(PathBuf::from(value)),
                }
                return Ok(());
            }
        } else if let Some(rest) = variable.strip_prefix("RFIDL_PEERS_") {
            let (key, secrets) = if let Some(key) = rest.strip_suffix("_SECRETS_FILE") {
                let text = read_secret_file(variable, value)?;
                let secrets = text
                    .lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty() && !line.starts_with('#'))
                    .map(str::to_owned)
                    .collect();
                (key, secrets)
            } else if let Some(key) = rest.strip_suffix("_SECRETS") {
                let secrets = value
                    .split(',')
                    .map(str::trim)
                    .filter(|secret| !secret.is_empty())
                    .map(str::to_owned)
                    .collect();
                (key, secrets)
            } else {
                return Err(unknown(variable));
            };
            if key.is_empty() {
                return Err(unknown(variable));
            }
            let secrets: Vec<String> = secrets;
            if secrets.is_empty() {
                return Err(ConfigError::Env {
                    variable: variable.to_owned(),
                    message: "no secret given".into(),
                });
            }
            let name = known_name(self.peers.keys(), key);
            self.peers.insert(name, secrets);
            return Ok(());
        }
        Err(unknown(variable))
    }
}

/// Both forms of one secret at once are refused: which should win is not obvious.
fn check_conflicts(vars: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for name in vars.keys() {
        let Some(twin) = name.strip_suffix("_FILE") else {
            continue;
        };
        if (twin.ends_with("_SECRET") || twin.ends_with("_SECRETS")) && vars.contains_key(twin) {
            return Err(ConfigError::Env {
                variable: name.clone(),
                message: format!("set either {twin} or {name}, not both"),
            });
        }
    }
    Ok(())
}

enum Field {
    Url,
    Secret,
    SecretFile,
    CaFile,
}

fn unknown(variable: &str) -> ConfigError {
    ConfigError::Env {
        variable: variable.to_owned(),
        message: "not a setting of rfidl_runtime::Config (see docs/operations.md)".into(),
    }
}

/// The configured name whose [`name_key`] is `key`, else `key` read back.
fn known_name<'a>(names: impl Iterator<Item = &'a String>, key: &str) -> String {
    let mut names = names;
    names
        .find(|name| name_key(name) == key)
        .cloned()
        .unwrap_or_else(|| key.to_ascii_lowercase().replace('_', "-"))
}

fn read_secret_file(variable: &str, path: &str) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: format!("{path} (from {variable})"),
        source,
    })?;
    let secret = text.trim_end().to_owned();
    if secret.is_empty() {
        return Err(ConfigError::Env {
            variable: variable.to_owned(),
            message: format!("the file {path} is empty"),
        });
    }
    Ok(secret)
}

fn set_scalar(
    tree: &mut serde_json::Value,
    scalar: &ScalarVariable,
    text: &str,
) -> Result<(), ConfigError> {
    let mut slot = &mut *tree;
    for key in &scalar.path {
        slot = slot
            .get_mut(key)
            .expect("the path was read from the same struct");
    }
    *slot = match slot {
        serde_json::Value::Number(_) => {
            let number: u64 = text.trim().parse().map_err(|_| ConfigError::Env {
                variable: scalar.name.clone(),
                message: "expected a whole number".into(),
            })?;
            serde_json::Value::from(number)
        }
        serde_json::Value::Bool(_) => {
            serde_json::Value::Bool(text.trim().parse().map_err(|_| ConfigError::Env {
                variable: scalar.name.clone(),
                message: "expected true or false".into(),
            })?)
        }
        _ => serde_json::Value::String(text.trim().to_owned()),
    };
    Ok(())
}
