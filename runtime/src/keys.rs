//! Signing keys issued by the registry (`rfidl-registry serve --issue-keys`;
//! `docs/registry.md`, "Issued keys"), held where the receiver and the
//! dispatcher read them and the directory client replaces them.
//!
//! [`IssuedKeys`] is a cheap handle (an `Arc`) on the current
//! [`KeySnapshot`]: this service's signing secrets (what the dispatcher
//! signs with, for every destination whose config gives no `secret`) and
//! its peers' verification secrets (what the receiver accepts from a
//! source that `peers` does not list). A request takes one read lock to
//! clone an `Arc` and works on that snapshot; the directory client swaps in
//! a new snapshot when a registration or heartbeat answer brings new keys,
//! and the next request sees it. Hand-configured secrets always win: an
//! issued key is only used where the config names none.
//!
//! During a rotation the registry issues two signing secrets; the sender
//! signs with both (Standard Webhooks allows several `v1,` entries) and
//! receivers accept both, so a message is accepted by a receiver that
//! already has the new secret and by one that still has only the old one.
//!
//! Never: print or log a secret (`Debug` shows counts), or keep a secret
//! the registry stopped issuing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::signing::{Secret, SecretError};

/// The keys of one answer of the registry, as they travel
/// (`"keys": {"signing": ["whsec_…"], "peers": {"engine": ["whsec_…"]}}`).
/// `Debug` shows counts only.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireKeys {
    /// This service's signing secrets, newest first (two during a rotation).
    pub signing: Vec<String>,
    /// The secrets each peer (by service id) signs with.
    #[serde(default)]
    pub peers: BTreeMap<String, Vec<String>>,
}

impl std::fmt::Debug for WireKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers: BTreeMap<&str, usize> = self
            .peers
            .iter()
            .map(|(peer, secrets)| (peer.as_str(), secrets.len()))
            .collect();
        f.debug_struct("WireKeys")
            .field("signing", &self.signing.len())
            .field("peers", &peers)
            .finish()
    }
}

/// The keys in force at one moment. `Debug` shows counts only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeySnapshot {
    /// What this service signs with (all of them, on every message).
    pub signing: Vec<Secret>,
    /// What each source (service id) may sign with.
    pub peers: HashMap<String, Vec<Secret>>,
}

impl std::fmt::Debug for KeySnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers: BTreeMap<&str, usize> = self
            .peers
            .iter()
            .map(|(peer, secrets)| (peer.as_str(), secrets.len()))
            .collect();
        f.debug_struct("KeySnapshot")
            .field("signing", &self.signing.len())
            .field("peers", &peers)
            .finish()
    }
}

impl KeySnapshot {
    /// Parses the wire form; the error names the peer, never a secret.
    pub fn from_wire(wire: &WireKeys) -> Result<Self, KeyError> {
        let parse = |owner: &str, texts: &[String]| {
            texts
                .iter()
                .map(|text| {
                    Secret::parse(text).map_err(|source| KeyError {
                        owner: owner.to_owned(),
                        source,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let mut peers = HashMap::with_capacity(wire.peers.len());
        for (peer, texts) in &wire.peers {
            peers.insert(peer.clone(), parse(peer, texts)?);
        }
        Ok(Self {
            signing: parse("(this service)", &wire.signing)?,
            peers,
        })
    }
}

/// An issued secret that is not a `whsec_…` secret.
#[derive(Debug, thiserror::Error)]
#[error("the registry issued an unusable secret for {owner}: {source}")]
pub struct KeyError {
    owner: String,
    #[source]
    source: SecretError,
}

struct Inner {
    current: RwLock<Arc<KeySnapshot>>,
    /// Set by a receiver that met a source or signature it has no key for:
    /// the directory client renews at once instead of at the next beat.
    refresh: tokio::sync::Notify,
}

/// A shared, swappable [`KeySnapshot`]; clones are the same set.
#[derive(Clone)]
pub struct IssuedKeys(Arc<Inner>);

impl Default for IssuedKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for IssuedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("IssuedKeys").field(&self.snapshot()).finish()
    }
}

impl IssuedKeys {
    /// An empty set (nothing issued yet: sends wait, unknown sources are
    /// refused).
    pub fn new() -> Self {
        Self(Arc::new(Inner {
            current: RwLock::new(Arc::new(KeySnapshot::default())),
            refresh: tokio::sync::Notify::new(),
        }))
    }

    /// The keys in force now (one read lock and an `Arc` clone).
    pub fn snapshot(&self) -> Arc<KeySnapshot> {
        Arc::clone(&self.0.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts `keys` in force; returns whether they differ from the keys
    /// in force before.
    pub fn replace(&self, keys: KeySnapshot) -> bool {
        let mut current = self.0.current.write().unwrap_or_else(|p| p.into_inner());
        if **current == keys {
            return false;
        }
        *current = Arc::new(keys);
        true
    }

    /// The secrets issued for `source`, if any.
    pub fn peer(&self, source: &str) -> Option<Vec<Secret>> {
        self.snapshot().peers.get(source).cloned()
    }

    /// Asks the directory client to renew the keys now (a receiver met a
    /// source it has no key for yet).
    pub fn request_refresh(&self) {
        self.0.refresh.notify_one();
    }

    /// Waits for [`request_refresh`](Self::request_refresh).
    pub async fn refresh_requested(&self) {
        self.0.refresh.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_counts_and_never_a_secret() {
        let secret = Secret::generate().to_whsec();
        let wire = WireKeys {
            signing: vec![secret.clone()],
            peers: [("engine".to_owned(), vec![secret.clone()])].into(),
        };
        let keys = IssuedKeys::new();
        assert!(keys.replace(KeySnapshot::from_wire(&wire).expect("parse")));
        assert!(!keys.replace(KeySnapshot::from_wire(&wire).expect("parse")));
        let shown = format!("{wire:?} {keys:?} {:?}", keys.snapshot());
        let key_part = secret.trim_start_matches("whsec_");
        assert!(!shown.contains(key_part), "{shown}");
        assert!(shown.contains("engine"), "{shown}");
        assert_eq!(keys.peer("engine").map(|s| s.len()), Some(1));
    }

    #[test]
    fn a_bad_secret_names_its_owner_only() {
        let wire = WireKeys {
            signing: Vec::new(),
            peers: [("hr".to_owned(), vec!["whsec_c2hvcnQ=".to_owned()])].into(),
        };
        let error = KeySnapshot::from_wire(&wire).expect_err("too short");
        assert!(error.to_string().contains("hr"), "{error}");
        assert!(!error.to_string().contains("c2hvcnQ"), "{error}");
    }
}
