//! The registry's SQLite store: one row per published revision of an
//! interface version. Rows are inserted, never updated or deleted: a
//! published manifest is immutable, and a new revision of a version is
//! accepted only if it is compatible with the latest one
//! (`rfidl_contract::manifest::compat`).
//!
//! Publishes of one database are serialised by an `IMMEDIATE` transaction,
//! so two concurrent publishes cannot both become revision 2. Commits are
//! `synchronous=FULL`: a 201 is a promise that the manifest is stored.

use std::path::Path;
use std::time::Duration;

use rfidl_contract::manifest::Manifest;
use rfidl_contract::manifest::compat::{BreakingChange, breaking_changes};
pub use rfidl_contract::wire::Published;
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use serde::Serialize;

/// Schema migrations, in order; `PRAGMA user_version` counts those applied.
/// Never edit a released entry: append one.
pub const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE manifests (
        interface     TEXT NOT NULL,     -- package.Service
        version       INTEGER NOT NULL,
        revision      INTEGER NOT NULL,  -- 1, 2, … per interface version
        fingerprint   TEXT NOT NULL,
        manifest      TEXT NOT NULL,     -- pretty JSON, as served
        published_at  INTEGER NOT NULL,  -- ms since the Unix epoch
        PRIMARY KEY (interface, version, revision),
        UNIQUE (interface, version, fingerprint)
    ) STRICT;
"#,
    // 2: the service directory (`crate::directory`) and the health history
    // of the aggregator (`crate::aggregator`).
    r#"
    CREATE TABLE instances (
        instance_id        TEXT PRIMARY KEY,  -- 16 hex of SHA-256(service, base URL)
        service            TEXT NOT NULL,
        base_url           TEXT NOT NULL,
        diagnostics_token  TEXT,              -- sent to its /_rf/health; never served
        registered_at      INTEGER NOT NULL,  -- ms since the Unix epoch
        last_seen_at       INTEGER NOT NULL,  -- registration or last heartbeat
        UNIQUE (service, base_url)
    ) STRICT;
    CREATE TABLE instance_interfaces (
        instance_id  TEXT NOT NULL REFERENCES instances (instance_id) ON DELETE CASCADE,
        role         TEXT NOT NULL CHECK (role IN ('hosts', 'calls')),
        interface    TEXT NOT NULL,
        version      INTEGER NOT NULL,
        fingerprint  TEXT NOT NULL,
        PRIMARY KEY (instance_id, role, interface, version)
    ) STRICT;
    CREATE INDEX instance_interfaces_by_interface
        ON instance_interfaces (interface, version, role);
    CREATE TABLE health_checks (
        id                     INTEGER PRIMARY KEY,
        instance_id            TEXT NOT NULL REFERENCES instances (instance_id) ON DELETE CASCADE,
        checked_at             INTEGER NOT NULL,
        colour                 TEXT NOT NULL CHECK (colour IN ('healthy', 'warning', 'critical')),
        reported               TEXT,     -- the service's own status; NULL when unreachable
        depth                  INTEGER,  -- pending + sending
        dead_letter            INTEGER,
        attention              INTEGER,  -- failed + dead letter + expired
        oldest_pending_age_ms  INTEGER,
        reasons                TEXT NOT NULL  -- JSON array of sentences
    ) STRICT;
    CREATE INDEX health_checks_by_instance ON health_checks (instance_id, checked_at);
"#,
    // 3: decommissioned interface versions (`crate::decommission`).
    r#"
    CREATE TABLE decommissioned (
        interface          TEXT NOT NULL,
        version            INTEGER NOT NULL,
        decommissioned_at  INTEGER NOT NULL,  -- ms since the Unix epoch
        PRIMARY KEY (interface, version)
    ) STRICT;
"#,
    // 4: who registered each instance (`crate::access::Registrant`) and
    // the digest of its registration (`crate::directory`). An instance
    // registered before this migration has no row: its next registration
    // binds it.
    r#"
    CREATE TABLE instance_owners (
        instance_id          TEXT PRIMARY KEY
                             REFERENCES instances (instance_id) ON DELETE CASCADE,
        credential_sha256    TEXT NOT NULL,  -- sha256:… of the credential, never the credential
        registration_digest  TEXT NOT NULL   -- sha256:… of hosts, calls, diagnostics token
    ) STRICT;
"#,
    // 5: the generation of each interface version's lifecycle
    // (`crate::decommission`): it grows with every decommission and
    // re-commission, and every command carries it, so a provider refuses
    // an older command. Versions decommissioned before start at 1.
    r#"
    CREATE TABLE lifecycle_generations (
        interface   TEXT NOT NULL,
        version     INTEGER NOT NULL,
        generation  INTEGER NOT NULL,
        PRIMARY KEY (interface, version)
    ) STRICT;
    INSERT INTO lifecycle_generations (interface, version, generation)
        SELECT interface, version, 1 FROM decommissioned;
"#,
    // 6: liveness (`crate::liveness`: an instance that misses its
    // heartbeats is gone) and the dashboard's pre-aggregated state
    // (`crate::rollup`: each instance's latest check, and its checks rolled
    // up in 5-minute buckets for the sparklines), filled from the history.
    r#"
    ALTER TABLE instances ADD COLUMN heartbeat_ms INTEGER;  -- its own interval; NULL: the registry's
    ALTER TABLE instances ADD COLUMN gone_at INTEGER;       -- when it was logged gone; NULL while active
    CREATE TABLE instance_health (
        instance_id            TEXT PRIMARY KEY REFERENCES instances (instance_id) ON DELETE CASCADE,
        checked_at             INTEGER NOT NULL,
        colour                 TEXT NOT NULL CHECK (colour IN ('healthy', 'warning', 'critical')),
        reported               TEXT,
        depth                  INTEGER,
        dead_letter            INTEGER,
        attention              INTEGER,
        oldest_pending_age_ms  INTEGER,
        reasons                TEXT NOT NULL
    ) STRICT;
    CREATE TABLE health_buckets (
        instance_id  TEXT NOT NULL REFERENCES instances (instance_id) ON DELETE CASCADE,
        bucket       INTEGER NOT NULL,  -- its start, ms since the Unix epoch
        depth        INTEGER,           -- the highest depth of its checks; NULL: none reachable
        worst        INTEGER NOT NULL,  -- 0 healthy, 1 warning, 2 critical
        PRIMARY KEY (instance_id, bucket)
    ) STRICT, WITHOUT ROWID;
    INSERT INTO instance_health
        SELECT h.instance_id, h.checked_at, h.colour, h.reported, h.depth, h.dead_letter,
               h.attention, h.oldest_pending_age_ms, h.reasons
          FROM health_checks h
          JOIN (SELECT MAX(id) AS id FROM health_checks GROUP BY instance_id) latest
            ON latest.id = h.id;
    INSERT INTO health_buckets
        SELECT instance_id, checked_at - checked_at % 300000, MAX(depth),
               MAX(CASE colour WHEN 'healthy' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END)
          FROM health_checks GROUP BY 1, 2;
"#,
    // 7: keys issued at registration (`crate::keys`), sealed under the key
    // file; never a plaintext secret.
    r#"
    CREATE TABLE key_authority (
        id      INTEGER PRIMARY KEY CHECK (id = 1),
        nonce   BLOB NOT NULL,
        sealed  BLOB NOT NULL   -- a known text: tells a wrong key file at start-up
    ) STRICT;
    CREATE TABLE service_keys (
        service     TEXT NOT NULL,
        key_id      INTEGER NOT NULL,  -- 1, 2, … per service
        created_at  INTEGER NOT NULL,  -- ms since the Unix epoch
        retire_at   INTEGER,           -- NULL: the newest; else issued until then
        nonce       BLOB NOT NULL,     -- 24 random bytes
        sealed      BLOB NOT NULL,     -- XChaCha20-Poly1305(key), AAD = service, key_id
        PRIMARY KEY (service, key_id)
    ) STRICT;
    CREATE TABLE service_key_owners (
        service            TEXT PRIMARY KEY,
        credential_sha256  TEXT NOT NULL  -- sha256:… of the credential the keys go to
    ) STRICT;
"#,
    // 8: what the dashboard shows beyond the outbox (`crate::throughput`):
    // each instance's last send counters, the rates between its last two
    // answers and its decommissioned versions; and the log of the
    // operator's retries and discards from the dashboard
    // (`crate::failures`).
    r#"
    ALTER TABLE instance_health ADD COLUMN sends TEXT;            -- JSON `sends` of the last answer
    ALTER TABLE instance_health ADD COLUMN sent_per_minute REAL;  -- between the last two answers
    ALTER TABLE instance_health ADD COLUMN p50_us INTEGER;         -- bucket bound; negative: over it
    ALTER TABLE instance_health ADD COLUMN p99_us INTEGER;
    ALTER TABLE instance_health ADD COLUMN decommissioned TEXT;   -- JSON array, as answered
    CREATE TABLE operator_actions (
        id           INTEGER PRIMARY KEY,
        at           INTEGER NOT NULL,  -- ms since the Unix epoch
        service      TEXT NOT NULL,
        instance_id  TEXT NOT NULL,     -- kept after the instance goes: a log
        action       TEXT NOT NULL CHECK (action IN ('retry', 'discard')),
        destination  TEXT NOT NULL,
        error_code   TEXT NOT NULL,
        done         INTEGER NOT NULL,  -- messages the instance retried or discarded
        refused      INTEGER NOT NULL,  -- messages it refused (already moved on)
        outcome      TEXT NOT NULL      -- one sentence
    ) STRICT;
    CREATE INDEX operator_actions_by_service ON operator_actions (service, id);
"#,
];

/// How long a statement waits for another writer before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors opening the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite failed to open, configure or migrate the file.
    #[error("registry database {path}: {source}")]
    Sqlite {
        /// The database file's path.
        path: String,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The file was written by a newer build (left unchanged).
    #[error(
        "registry database {path} has schema version {found}, newer than the {supported} \
         this build knows; refusing to touch it"
    )]
    TooNew {
        /// The database file's path.
        path: String,
        /// The file's schema version (`PRAGMA user_version`).
        found: i64,
        /// The newest schema version this build knows ([`MIGRATIONS`]).
        supported: i64,
    },
    /// The file is damaged: not a database, or it fails SQLite's
    /// `quick_check` (left unchanged).
    #[error(
        "registry database {path} is damaged ({detail}); refusing to start on it. The file was \
         not changed: restore it from a backup"
    )]
    Corrupt {
        /// The database file's path.
        path: String,
        /// What the check found.
        detail: String,
    },
}

/// Opens (creating and migrating if needed) the store at `path`.
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    let shown = path.display().to_string();
    let wrap = |source| StoreError::Sqlite {
        path: shown.clone(),
        source,
    };
    // Refuse a newer or damaged file before `journal_mode=WAL` can rewrite
    // its header: the file stays byte-for-byte unchanged.
    rfidl_runtime::store::sqlite::preflight(path, MIGRATIONS.len() as i64).map_err(|error| {
        match error {
            rfidl_runtime::store::StoreError::TooNew {
                path,
                found,
                supported,
            } => StoreError::TooNew {
                path,
                found,
                supported,
            },
            rfidl_runtime::store::StoreError::Corrupt { path, detail } => {
                StoreError::Corrupt { path, detail }
            }
            rfidl_runtime::store::StoreError::Sqlite { path, source } => {
                StoreError::Sqlite { path, source }
            }
            other => StoreError::Corrupt {
                path: shown.clone(),
                detail: other.to_string(),
            },
        }
    })?;
    let mut conn = Connection::open(path).map_err(wrap)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(wrap)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(wrap)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(wrap)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(wrap)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(wrap)?;
    let found: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(wrap)?;
    let supported = MIGRATIONS.len() as i64;
    if found > supported {
        return Err(StoreError::TooNew {
            path: shown,
            found,
            supported,
        });
    }
    for (index, script) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(script).map_err(wrap)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(wrap)?;
    }
    tx.commit().map_err(wrap)?;
    Ok(conn)
}

/// Why a publish was refused.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The manifest is not a compatible next revision of the latest one:
    /// each breaking change with its `B0001`… code.
    #[error("the revision breaks the published one")]
    Breaking(Vec<BreakingChange>),
    /// No contract could produce the manifest (its `M0001`… problems).
    #[error("no contract could produce this manifest: {0}")]
    Invalid(rfidl_contract::validate::InvalidManifest),
    /// The latest stored revision, to compare with, does not parse.
    #[error("the stored revision {revision} is unreadable: {reason}")]
    CorruptRevision {
        /// Its revision number (from 1).
        revision: u32,
        /// Why it does not parse.
        reason: String,
    },
    /// SQLite failed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Stores `manifest` as the next revision of its interface version, unless
/// that fingerprint is stored already or it breaks the latest revision.
/// A manifest no contract could produce (`rfidl_contract::validate`, which also
/// checks the fingerprint) is refused before the transaction opens: the
/// store never holds one, whoever calls it.
pub fn publish(
    conn: &mut Connection,
    manifest: &Manifest,
    now_ms: i64,
) -> Result<Published, PublishError> {
    manifest.validate().map_err(PublishError::Invalid)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let published = |revision: u32, created: bool| Published {
        interface: manifest.interface.clone(),
        version: manifest.version,
        fingerprint: manifest.fingerprint.clone(),
        revision,
        created,
    };
    let same: Option<u32> = tx
        .query_row(
            "SELECT revision FROM manifests WHERE interface = ?1 AND version = ?2 AND fingerprint = ?3",
            params![manifest.interface, manifest.version, manifest.fingerprint],
            |row| row.get(0),
        )
        .optional()?;
    if let Some(revision) = same {
        return Ok(published(revision, false));
    }
    let latest: Option<(u32, String)> = tx
        .query_row(
            "SELECT revision, manifest FROM manifests WHERE interface = ?1 AND version = ?2 \
             ORDER BY revision DESC LIMIT 1",
            params![manifest.interface, manifest.version],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let revision = match latest {
        None => 1,
        Some((revision, text)) => {
            let old: Manifest =
                serde_json::from_str(&text).map_err(|e| PublishError::CorruptRevision {
                    revision,
                    reason: e.to_string(),
                })?;
            let changes = breaking_changes(&old, manifest);
            if !changes.is_empty() {
                return Err(PublishError::Breaking(changes));
            }
            revision + 1
        }
    };
    tx.execute(
        "INSERT INTO manifests (interface, version, revision, fingerprint, manifest, published_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            manifest.interface,
            manifest.version,
            revision,
            manifest.fingerprint,
            manifest.to_pretty_json(),
            now_ms
        ],
    )?;
    tx.commit()?;
    Ok(published(revision, true))
}

/// The latest revision's manifest text and fingerprint.
pub fn latest(
    conn: &Connection,
    interface: &str,
    version: u32,
) -> rusqlite::Result<Option<(String, String)>> {
    conn.query_row(
        "SELECT manifest, fingerprint FROM manifests WHERE interface = ?1 AND version = ?2 \
         ORDER BY revision DESC LIMIT 1",
        params![interface, version],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
}

/// One exact revision's manifest text.
pub fn exact(
    conn: &Connection,
    interface: &str,
    version: u32,
    fingerprint: &str,
) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT manifest FROM manifests WHERE interface = ?1 AND version = ?2 AND fingerprint = ?3",
        params![interface, version, fingerprint],
        |row| row.get(0),
    )
    .optional()
}

/// One interface and its versions, for `GET /v1/interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceSummary {
    /// The interface, `package.Service`.
    pub interface: String,
    /// Its published versions, in ascending order.
    pub versions: Vec<VersionSummary>,
}

/// One published version in `GET /v1/interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionSummary {
    /// The interface version (the `N` of `vN`).
    pub version: u32,
    /// `sha256:…` of its latest revision, the one `GET …/v{version}`
    /// serves.
    pub latest_fingerprint: String,
    /// How many revisions it has (at least 1).
    pub revisions: u32,
}

/// Every interface, sorted, with each version's latest fingerprint.
pub fn list(conn: &Connection) -> rusqlite::Result<Vec<InterfaceSummary>> {
    let mut statement = conn.prepare(
        "SELECT m.interface, m.version, m.fingerprint, m.revision FROM manifests m \
         WHERE m.revision = (SELECT MAX(revision) FROM manifests \
                             WHERE interface = m.interface AND version = m.version) \
         ORDER BY m.interface, m.version",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            VersionSummary {
                version: row.get(1)?,
                latest_fingerprint: row.get(2)?,
                revisions: row.get(3)?,
            },
        ))
    })?;
    let mut interfaces: Vec<InterfaceSummary> = Vec::new();
    for row in rows {
        let (interface, version) = row?;
        match interfaces.last_mut() {
            Some(last) if last.interface == interface => last.versions.push(version),
            _ => interfaces.push(InterfaceSummary {
                interface,
                versions: vec![version],
            }),
        }
    }
    Ok(interfaces)
}

/// One version of one interface with all its revisions, for
/// `GET /v1/interfaces/{interface}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionDetail {
    /// The interface version (the `N` of `vN`).
    pub version: u32,
    /// Oldest first; the last one is what `GET …/v{version}` serves.
    pub revisions: Vec<RevisionDetail>,
}

/// One stored revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionDetail {
    /// Its revision number: 1 for the first, one more for each later one.
    pub revision: u32,
    /// `sha256:…` of the manifest; its URL is `…/v{version}/{fingerprint}`.
    pub fingerprint: String,
    /// When it was stored, RFC 3339 in UTC with milliseconds
    /// (`2026-11-24T09:02:41.123Z`).
    pub published_at: String,
}

/// Every version of `interface` with its revisions, versions ascending;
/// empty when the interface has nothing published.
pub fn versions(conn: &Connection, interface: &str) -> rusqlite::Result<Vec<VersionDetail>> {
    let mut statement = conn.prepare(
        "SELECT version, revision, fingerprint, published_at FROM manifests \
         WHERE interface = ?1 ORDER BY version, revision",
    )?;
    let rows = statement.query_map(params![interface], |row| {
        Ok((
            row.get::<_, u32>(0)?,
            RevisionDetail {
                revision: row.get(1)?,
                fingerprint: row.get(2)?,
                published_at: rfc3339(row.get(3)?),
            },
        ))
    })?;
    let mut versions: Vec<VersionDetail> = Vec::new();
    for row in rows {
        let (version, revision) = row?;
        match versions.last_mut() {
            Some(last) if last.version == version => last.revisions.push(revision),
            _ => versions.push(VersionDetail {
                version,
                revisions: vec![revision],
            }),
        }
    }
    Ok(versions)
}

/// The names of every published interface, sorted (for "did you mean").
pub fn interface_names(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut statement =
        conn.prepare("SELECT DISTINCT interface FROM manifests ORDER BY interface")?;
    statement
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()
}

/// What a dry run of a publish would meet: the latest revision of the
/// manifest's interface version and the changes that break it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Compatibility {
    /// True when a publish would be accepted (no breaking change).
    pub compatible: bool,
    /// The breaking changes, in `rfidl breaking`'s order; empty when compatible.
    pub changes: Vec<BreakingChange>,
    /// The revision compared with; `None` when the version has none yet.
    pub against: Option<Against>,
}

/// The stored revision a dry run compared with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Against {
    /// The revision number of the latest stored revision.
    pub revision: u32,
    /// Its fingerprint, `sha256:…`.
    pub fingerprint: String,
}

/// Compares `manifest` with the latest revision of its interface version by
/// the rules of [`publish`], reading only (nothing is stored).
pub fn compatibility(
    conn: &Connection,
    manifest: &Manifest,
) -> Result<Compatibility, PublishError> {
    let latest: Option<(u32, String, String)> = conn
        .query_row(
            "SELECT revision, fingerprint, manifest FROM manifests \
             WHERE interface = ?1 AND version = ?2 ORDER BY revision DESC LIMIT 1",
            params![manifest.interface, manifest.version],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()?;
    let Some((revision, fingerprint, text)) = latest else {
        return Ok(Compatibility {
            compatible: true,
            changes: Vec::new(),
            against: None,
        });
    };
    let old: Manifest = serde_json::from_str(&text).map_err(|e| PublishError::CorruptRevision {
        revision,
        reason: e.to_string(),
    })?;
    let changes = breaking_changes(&old, manifest);
    Ok(Compatibility {
        compatible: changes.is_empty(),
        changes,
        against: Some(Against {
            revision,
            fingerprint,
        }),
    })
}

/// Why the registry is not ready: its database refuses a write
/// transaction, or has another schema version than this build's.
pub fn readiness(conn: &mut Connection, busy: Duration) -> Result<(), String> {
    conn.busy_timeout(busy).map_err(|e| e.to_string())?;
    let result = (|| {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| format!("cannot begin a write transaction: {e}"))?;
        let found: i64 = tx
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| format!("cannot read the schema version: {e}"))?;
        let supported = MIGRATIONS.len() as i64;
        if found != supported {
            return Err(format!(
                "the database has schema version {found}, this build serves {supported}"
            ));
        }
        tx.rollback()
            .map_err(|e| format!("cannot end the write transaction: {e}"))
    })();
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| e.to_string())?;
    result
}

/// Milliseconds since the Unix epoch as RFC 3339 (UTC).
pub(crate) fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map_or_else(|_| format!("@{ms}ms"), |t| t.to_string())
}
