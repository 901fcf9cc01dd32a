//! Keys issued at registration (`rfidl-registry serve --issue-keys`,
//! [`crate::Registry::issue_keys`]; `docs/registry.md`, "Issued keys").
//!
//! The registry becomes the key authority: each service id gets a signing
//! secret (Standard Webhooks, `whsec_…`), created the first time anyone
//! needs it. A registration or heartbeat answer gives the instance its own
//! service's signing secrets and the secrets of its **peers**: the services
//! it shares an interface version with, one calling what the other hosts
//! (messages flow both ways over an interface: commands to the host,
//! pushcalls and answers back to the caller). A service connected to
//! nobody gets nobody's secret: with symmetric HMAC keys, whoever can
//! verify a service's messages can also forge them, so each secret goes
//! only where it is needed.
//!
//! **Binding.** A service's keys are bound to the credential that first
//! obtained them (`service_key_owners`, its SHA-256): another credential
//! registering an instance of that service is refused (403 `keys_owned`),
//! unless the owner's credential was retired (how credentials rotate, as
//! for instances). The instance's own binding (`instance_owned`) is checked
//! before, so an answer with keys only ever goes to the instance's owner.
//!
//! **Rotation.** When a service's newest secret is older than the rotation
//! period, the next request that needs it creates a new one and marks the
//! old one to retire after the overlap window. Until then both are issued:
//! senders sign with both (several `v1,` entries) and receivers accept
//! both, so a receiver that has renewed and one that has not both accept
//! every message. With an overlap longer than the services' heartbeat,
//! nothing is refused (`docs/registry.md`).
//!
//! **At rest.** Secrets are stored sealed with XChaCha20-Poly1305 under the
//! key file's 256-bit key, with the service id and key number as
//! associated data (a sealed secret moved to another row does not open).
//! A sealed canary tells at start-up that a key file is not the one the
//! database was sealed with: the registry refuses to start.
//!
//! Never: log, print or answer a secret except to the owning credential;
//! store one unsealed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, OsRng, Payload};
use chacha20poly1305::{AeadCore, XChaCha20Poly1305, XNonce};
use rfidl_runtime::keys::WireKeys;
use rfidl_runtime::signing::Secret;
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

use crate::ApiError;
use crate::access::Registrant;

/// A new signing secret every this often, by default.
pub const DEFAULT_ROTATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a replaced secret is still issued, by default.
pub const DEFAULT_OVERLAP: Duration = Duration::from_secs(10 * 60);

/// What the canary seals: opens only under the right key file.
const CANARY: &[u8] = b"rfidl-registry issued keys v1";

/// Why the key authority cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file could not be read or created.
    #[error("key file {path}: {source}")]
    Io {
        /// The key file's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The key file is not one line of base64 of 32 bytes.
    #[error(
        "key file {path} is not a registry key file (one line: the base64 of 32 random \
         bytes); restore the right file, or move it away to create a new one (the keys \
         issued so far are then lost)"
    )]
    Malformed {
        /// The key file's path.
        path: String,
    },
    /// The database holds keys sealed under another key file (its canary
    /// does not open).
    #[error(
        "key file {path} cannot decrypt the issued keys stored in this registry's database: it \
         is not the key file they were sealed with. Start with the original key file (or, to \
         issue new keys to every service, delete the database's issued keys)"
    )]
    WrongKeyFile {
        /// The key file's path.
        path: String,
    },
    /// The registry database could not be read.
    #[error("registry database: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// The registry's key file and rotation settings. `Debug` shows the path
/// and the periods, never the key.
pub struct KeyAuthority {
    cipher: XChaCha20Poly1305,
    path: PathBuf,
    rotation: Duration,
    overlap: Duration,
    /// The secret lifecycle commands are signed with, issued to providers.
    command_secret: Option<Secret>,
}

impl std::fmt::Debug for KeyAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAuthority")
            .field("path", &self.path)
            .field("rotation", &self.rotation)
            .field("overlap", &self.overlap)
            .field("command_secret", &self.command_secret.is_some())
            .finish_non_exhaustive()
    }
}

impl KeyAuthority {
    /// Reads the key file at `path`, or creates it (mode 0600, a fresh
    /// random key) when it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let io = |source| KeyError::Io {
            path: shown.clone(),
            source,
        };
        let key: [u8; 32] = match std::fs::read_to_string(path) {
            Ok(text) => base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .ok()
                .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
                .ok_or_else(|| KeyError::Malformed {
                    path: shown.clone(),
                })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let key: [u8; 32] = XChaCha20Poly1305::generate_key(&mut OsRng).into();
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                let mut file = options.open(path).map_err(io)?;
                let line = base64::engine::general_purpose::STANDARD.encode(key);
                file.write_all(format!("{line}\n").as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(io)?;
                tracing::info!(path = %shown, "created the key file of the issued keys");
                key
            }
            Err(error) => return Err(io(error)),
        };
        #[cfg(unix)]
        if let Ok(metadata) = std::fs::metadata(path) {
            let mode = std::os::unix::fs::PermissionsExt::mode(&metadata.permissions());
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %shown,
                    mode = format!("{:o}", mode & 0o777),
                    "the key file is readable by other users; chmod 600 it"
                );
            }
        }
        Ok(Self {
            cipher: XChaCha20Poly1305::new(&key.into()),
            path: path.to_path_buf(),
            rotation: DEFAULT_ROTATION,
            overlap: DEFAULT_OVERLAP,
            command_secret: None,
        })
    }

    /// Issues `secret`, the one the registry signs its lifecycle commands
    /// with ([`crate::commands`]), to every instance of a service that
    /// hosts an interface version, as the secret of the source
    /// `rfidl-registry`: providers need no `peers` entry for it. It is not
    /// rotated (the command outbox signs with one secret).
    #[must_use]
    pub fn command_secret(mut self, secret: Secret) -> Self {
        self.command_secret = Some(secret);
        self
    }

    /// A new signing secret per service this often (default 7 days).
    #[must_use]
    pub fn rotation(mut self, every: Duration) -> Self {
        self.rotation = every.max(Duration::from_millis(1));
        self
    }

    /// How long a replaced secret is still issued (and so accepted) after
    /// its successor (default 10 minutes); give more than the longest
    /// heartbeat of the services.
    #[must_use]
    pub fn overlap(mut self, window: Duration) -> Self {
        self.overlap = window;
        self
    }

    fn seal(&self, aad: &[u8], plaintext: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("XChaCha20-Poly1305 seals any length a key has");
        (nonce.to_vec(), sealed)
    }

    fn open(&self, aad: &[u8], nonce: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if nonce.len() != 24 {
            return None;
        }
        self.cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad })
            .ok()
    }

    /// Stores the canary on first use; refuses a key file that does not
    /// open the stored one.
    pub(crate) fn check(&self, conn: &Connection) -> Result<(), KeyError> {
        let stored: Option<(Vec<u8>, Vec<u8>)> = conn
            .query_row(
                "SELECT nonce, sealed FROM key_authority WHERE id = 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        match stored {
            Some((nonce, sealed)) => match self.open(b"canary", &nonce, &sealed) {
                Some(text) if text == CANARY => Ok(()),
                _ => Err(KeyError::WrongKeyFile {
                    path: self.path.display().to_string(),
                }),
            },
            None => {
                let (nonce, sealed) = self.seal(b"canary", CANARY);
                conn.execute(
                    "INSERT INTO key_authority (id, nonce, sealed) VALUES (1, ?1, ?2)",
                    params![nonce, sealed],
                )?;
                Ok(())
            }
        }
    }

    /// Refuses (403 `keys_owned`) a credential other than the one bound to
    /// `service`'s keys, while that one is still accepted. Read only.
    pub(crate) fn check_owner(
        conn: &Connection,
        service: &str,
        registrant: &Registrant,
        is_live: &dyn Fn(&str) -> bool,
    ) -> Result<(), ApiError> {
        let owner: Option<String> = conn
            .query_row(
                "SELECT credential_sha256 FROM service_key_owners WHERE service = ?1",
                params![service],
                |row| row.get(0),
            )
            .optional()?;
        match owner {
            Some(owner) if owner != registrant.0 && is_live(&owner) => {
                Err(ApiError::KeysOwned(format!(
                    "the keys of service `{service}` are issued to another registration \
                     credential; register its instances with that one"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The keys of an instance of `service` registered by `registrant`:
    /// its service's signing secrets and its peers' (see the module's
    /// documentation), creating and rotating secrets as due. One
    /// transaction.
    pub(crate) fn issue(
        &self,
        conn: &mut Connection,
        service: &str,
        registrant: &Registrant,
        is_live: &dyn Fn(&str) -> bool,
        now_ms: i64,
    ) -> Result<WireKeys, ApiError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        Self::check_owner(&tx, service, registrant, is_live)?;
        tx.execute(
            "INSERT INTO service_key_owners (service, credential_sha256) VALUES (?1, ?2) \
             ON CONFLICT (service) DO UPDATE SET credential_sha256 = excluded.credential_sha256",
            params![service, registrant.0],
        )?;
        let signing = self.current(&tx, service, now_ms)?;
        let peers: Vec<String> = {
            let mut statement = tx.prepare(
                "SELECT DISTINCT other.service FROM instances me \
                 JOIN instance_interfaces mine ON mine.instance_id = me.instance_id \
                 JOIN instance_interfaces theirs ON theirs.interface = mine.interface \
                  AND theirs.version = mine.version AND theirs.role <> mine.role \
                 JOIN instances other ON other.instance_id = theirs.instance_id \
                 WHERE me.service = ?1 ORDER BY other.service",
            )?;
            statement
                .query_map(params![service], |row| row.get(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut wire = WireKeys {
            signing,
            ..WireKeys::default()
        };
        for peer in peers {
            let secrets = self.current(&tx, &peer, now_ms)?;
            wire.peers.insert(peer, secrets);
        }
        if let Some(secret) = &self.command_secret {
            let hosts: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM instances i JOIN instance_interfaces ii                  ON ii.instance_id = i.instance_id WHERE i.service = ?1 AND ii.role = 'hosts')",
                params![service],
                |row| row.get(0),
            )?;
            if hosts {
                wire.peers.insert(
                    rfidl_runtime::lifecycle::DEFAULT_REGISTRY_SOURCE.to_owned(),
                    vec![secret.to_whsec()],
                );
            }
        }
        tx.commit()?;
        Ok(wire)
    }

    /// `service`'s secrets in force, newest first: creates the first one,
    /// rotates when the newest is older than the rotation period, drops
    /// those past their overlap.
    fn current(
        &self,
        conn: &Connection,
        service: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, ApiError> {
        conn.execute(
            "DELETE FROM service_keys WHERE service = ?1 AND retire_at IS NOT NULL \
             AND retire_at <= ?2",
            params![service, now_ms],
        )?;
        let newest: Option<(i64, i64)> = conn
            .query_row(
                "SELECT key_id, created_at FROM service_keys WHERE service = ?1 \
                 AND retire_at IS NULL ORDER BY key_id DESC LIMIT 1",
                params![service],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        let rotation_ms = i64::try_from(self.rotation.as_millis()).unwrap_or(i64::MAX);
        let due = match newest {
            None => true,
            Some((_, created)) => now_ms.saturating_sub(created) >= rotation_ms,
        };
        if due {
            let overlap_ms = i64::try_from(self.overlap.as_millis()).unwrap_or(i64::MAX);
            conn.execute(
                "UPDATE service_keys SET retire_at = ?2 WHERE service = ?1 AND retire_at IS NULL",
                params![service, now_ms.saturating_add(overlap_ms)],
            )?;
            let next: i64 = conn.query_row(
                "SELECT COALESCE(MAX(key_id), 0) + 1 FROM service_keys WHERE service = ?1",
                params![service],
                |row| row.get(0),
            )?;
            let key = XChaCha20Poly1305::generate_key(&mut OsRng);
            let (nonce, sealed) = self.seal(&aad(service, next), &key);
            conn.execute(
                "INSERT INTO service_keys (service, key_id, created_at, retire_at, nonce, sealed) \
                 VALUES (?1, ?2, ?3, NULL, ?4, ?5)",
                params![service, next, now_ms, nonce, sealed],
            )?;
            if newest.is_some() {
                tracing::info!(%service, key = next, "rotated the service's signing secret");
            }
        }
        let mut statement = conn.prepare(
            "SELECT key_id, nonce, sealed FROM service_keys WHERE service = ?1 \
             ORDER BY key_id DESC",
        )?;
        let rows = statement
            .query_map(params![service], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, Vec<u8>>(1)?,
                    row.get::<_, Vec<u8>>(2)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(id, nonce, sealed)| {
                self.open(&aad(service, id), &nonce, &sealed)
                    .map(|key| Secret::from_bytes(key).to_whsec())
                    .ok_or_else(|| {
                        ApiError::Unavailable(format!(
                            "issued key {id} of service `{service}` does not decrypt under the \
                             key file; the database was altered"
                        ))
                    })
            })
            .collect()
    }
}

/// The associated data of a sealed secret: its row.
fn aad(service: &str, key_id: i64) -> Vec<u8> {
    let mut aad = service.as_bytes().to_vec();
    aad.push(0);
    aad.extend_from_slice(&key_id.to_be_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_in_its_own_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let authority = KeyAuthority::load_or_create(&dir.path().join("k")).expect("key");
        let (nonce, sealed) = authority.seal(&aad("hr", 1), b"0123456789abcdef");
        assert!(authority.open(&aad("hr", 1), &nonce, &sealed).is_some());
        assert!(authority.open(&aad("hr", 2), &nonce, &sealed).is_none());
        assert!(authority.open(&aad("engine", 1), &nonce, &sealed).is_none());
        let again = KeyAuthority::load_or_create(&dir.path().join("k")).expect("reload");
        assert!(again.open(&aad("hr", 1), &nonce, &sealed).is_some());
        assert!(!format!("{authority:?}").contains("cipher"));
    }
}
