//! [`Registry`]: a registry's configuration (a builder over one SQLite
//! file: credentials, allowed networks, registration rate, liveness, issued
//! keys, lifecycle commands), the state its handlers share ([`Shared`],
//! run on the blocking pool by [`with_db`]) and the health aggregator's
//! round ([`Registry::poll_health_once`]). Its routes are in `router`.
//!
//! Never: answers a request itself (the handlers live in the route
//! modules); of the builder's calls only [`Registry::open`] and
//! [`Registry::issue_keys`] read the database.

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use rusqlite::Connection;

use crate::{
    ApiError, StoreError, access, aggregator, commands, keys, liveness, rollup, session, store,
};

/// A registry on one SQLite file. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    conn: Arc<Mutex<Connection>>,
    credentials: access::Credentials,
    networks: access::Networks,
    limiter: Arc<access::RateLimiter>,
    refresh_secs: u64,
    commands: Option<commands::CommandSender>,
    keys: Option<Arc<keys::KeyAuthority>>,
    liveness: liveness::Liveness,
    session_key: session::SessionKey,
}

/// The state every handler shares: the database and the registry's
/// settings, built by [`Registry::shared`] for [`Registry::router`].
pub(crate) struct Shared {
    pub(crate) conn: Arc<Mutex<Connection>>,
    /// Who may do what ([`access`]).
    pub(crate) credentials: access::Credentials,
    /// Where registered base URLs may point (empty: anywhere).
    pub(crate) networks: access::Networks,
    /// Registrations per service.
    pub(crate) limiter: Arc<access::RateLimiter>,
    /// How often the dashboard reloads itself.
    pub(crate) refresh_secs: u64,
    /// Sends lifecycle commands to providers, when configured.
    pub(crate) commands: Option<commands::CommandSender>,
    /// Issues keys at registration, when configured ([`keys`]).
    pub(crate) keys: Option<Arc<keys::KeyAuthority>>,
    /// When an instance that stopped heartbeating is gone.
    pub(crate) liveness: liveness::Liveness,
    /// Signs the dashboard's operator sessions ([`session`]).
    pub(crate) session_key: session::SessionKey,
}

impl Registry {
    /// Opens (creating and migrating if needed) the registry database.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            conn: Arc::new(Mutex::new(store::open(path)?)),
            credentials: access::Credentials::default(),
            networks: access::Networks::default(),
            limiter: Arc::new(access::RateLimiter::new(
                access::DEFAULT_REGISTRATIONS_PER_MINUTE,
            )),
            refresh_secs: 60,
            commands: None,
            keys: None,
            liveness: liveness::Liveness::default(),
            session_key: session::SessionKey::random(),
        })
    }

    /// An instance that misses this many heartbeats in a row is gone: it
    /// no longer counts as a provider ([`liveness`]); 3 by default, at
    /// least 1.
    #[must_use]
    pub fn missed_heartbeats(mut self, missed: u32) -> Self {
        self.liveness.missed = missed.max(1);
        self
    }

    /// The heartbeat interval of an instance whose registration does not
    /// say its own (`heartbeatMs`); 30 s by default, the runtime's.
    #[must_use]
    pub fn heartbeat_interval(mut self, interval: std::time::Duration) -> Self {
        self.liveness.heartbeat = interval;
        self
    }

    /// Issues keys at registration ([`keys`]): every registration and
    /// heartbeat answer gives the instance its service's signing secrets
    /// and its peers', sealed at rest under `authority`'s key file. Fails
    /// when the database holds keys sealed under another key file.
    pub fn issue_keys(mut self, authority: keys::KeyAuthority) -> Result<Self, keys::KeyError> {
        {
            let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            authority.check(&conn)?;
        }
        self.keys = Some(Arc::new(authority));
        Ok(self)
    }

    /// Sends `Decommission` / `Recommission` commands to the provider
    /// instances of a version through `sender` ([`commands`]). Without it,
    /// a decommission is recorded here only.
    #[must_use]
    pub fn commands(mut self, sender: commands::CommandSender) -> Self {
        self.commands = Some(sender);
        self
    }

    /// Requires `Authorization: Bearer <token>` to publish (reads stay open).
    /// An empty token fails closed: nothing can be published. Any
    /// credential closes the registry: an operation whose own credential is
    /// not configured is then refused ([`access`]).
    #[must_use]
    pub fn publish_token(mut self, token: impl Into<String>) -> Self {
        self.credentials.publish = Some(token.into());
        self
    }

    /// Requires this bearer token to decommission, re-commission, delete an
    /// instance and open an instance's failed list (a browser may send it
    /// as the password of `Basic`), and to sign in to the dashboard's
    /// retry and discard forms (`session`). An empty token fails
    /// closed.
    #[must_use]
    pub fn operator_token(mut self, token: impl Into<String>) -> Self {
        self.credentials.operator = Some(token.into());
        self
    }

    /// Accepts this bearer token for registrations and heartbeats; call it
    /// once per credential (one per service, or per instance). An instance
    /// is bound to the credential that registered it. An empty token
    /// accepts nothing.
    #[must_use]
    pub fn registration_token(mut self, token: impl Into<String>) -> Self {
        self.credentials.registration.push(token.into());
        self
    }

    /// Accepts registrations only of base URLs inside `network` (call once
    /// per network; none: any address), and the registry's own requests to
    /// instances reach only addresses inside.
    #[must_use]
    pub fn allow_network(mut self, network: access::Network) -> Self {
        let mut networks = self.networks.0.as_ref().clone();
        networks.push(network);
        self.networks = access::Networks(Arc::new(networks));
        self
    }

    /// At most this many registrations of one service per minute (a burst
    /// of as many); [`access::DEFAULT_REGISTRATIONS_PER_MINUTE`] by default.
    /// Beyond: 429 `rate_limited` with `Retry-After`.
    #[must_use]
    pub fn registrations_per_minute(mut self, per_minute: u32) -> Self {
        self.limiter = Arc::new(access::RateLimiter::new(per_minute));
        self
    }

    /// Whether no credential is configured: every operation is open (a
    /// dev registry; the binary serves it on loopback only).
    pub fn is_open(&self) -> bool {
        self.credentials.is_open()
    }

    /// The health interval, so that the dashboard reloads as often as the
    /// data changes (2 to 60 seconds; 60 by default).
    #[must_use]
    pub fn health_interval(mut self, interval: std::time::Duration) -> Self {
        self.refresh_secs = interval.as_secs().clamp(2, 60);
        self
    }

    /// The state the handlers share: this registry's database and
    /// settings, as they are now.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::new(Shared {
            conn: Arc::clone(&self.conn),
            credentials: self.credentials.clone(),
            networks: self.networks.clone(),
            limiter: Arc::clone(&self.limiter),
            refresh_secs: self.refresh_secs,
            commands: self.commands.clone(),
            keys: self.keys.clone(),
            liveness: self.liveness,
            session_key: self.session_key.clone(),
        })
    }

    /// Polls every active registered instance's `/_rf/health` once,
    /// concurrently, and stores the results ([`aggregator`], [`rollup`]) in
    /// one transaction; returns how many it asked. Instances that went
    /// since the last round are logged once ([`liveness`]) and not asked.
    pub async fn poll_health_once(&self, interval: std::time::Duration) -> Result<usize, ApiError> {
        let conn = Arc::clone(&self.conn);
        let liveness = self.liveness;
        let targets = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let at = liveness.at(now_ms());
            liveness::log_departures(&liveness::sweep(&conn, &at)?, &liveness);
            liveness::active_targets(&conn, &at)
        })
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))??;
        let client = access::instance_client(aggregator::timeout_for(interval), &self.networks)?;
        let mut polls = tokio::task::JoinSet::new();
        for target in targets {
            let client = client.clone();
            polls.spawn(async move {
                let check = aggregator::check(&client, &target).await;
                (target, check)
            });
        }
        let mut results = Vec::new();
        while let Some(joined) = polls.join_next().await {
            results.extend(joined.ok());
        }
        let asked = results.len();
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let now = now_ms();
            // One commit for the round: a commit per instance is an fsync
            // per instance.
            let tx = conn.transaction()?;
            for (target, check) in &results {
                // An instance may have been removed meanwhile: skip it.
                match aggregator::record(&tx, &target.instance_id, check, now) {
                    Ok(previous) => rollup::log_change(target, previous.as_deref(), check),
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation => {}
                    Err(other) => return Err(other),
                }
            }
            tx.commit()
        })
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))??;
        Ok(asked)
    }

    /// Runs [`Registry::poll_health_once`] every `interval` until the task
    /// is aborted (a failed round is logged and the next one tried).
    pub fn spawn_health_aggregator(
        &self,
        interval: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let registry = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let Err(error) = registry.poll_health_once(interval).await {
                    tracing::warn!(%error, "health round failed");
                }
            }
        })
    }
}

/// Runs `query` on the connection, on the blocking pool.
pub(crate) async fn with_db<T: Send + 'static>(
    shared: &Arc<Shared>,
    query: impl FnOnce(&mut Connection) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || {
        let mut conn = shared
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        query(&mut conn)
    })
    .await
    .map_err(|e| ApiError::Unavailable(e.to_string()))?
}

/// 401 unless the request carries the credential `access` needs, 403
/// `operation_disabled` when the registry is closed and that credential is
/// not configured ([`access::Credentials::authorize`]).
pub(crate) fn authorize(
    shared: &Shared,
    headers: &HeaderMap,
    access: access::Access,
) -> Result<(), ApiError> {
    shared.credentials.authorize(headers, access)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
