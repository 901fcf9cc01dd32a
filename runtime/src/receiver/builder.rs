//! Building a receiver: [`ReceiverBuilder`] (the hosted services, the
//! store, the writers, limits, lifecycle and issued keys) and
//! [`ReceiverError`]. It checks the configuration (secrets, routes) before
//! anything starts, and never serves a request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::*;
use crate::store::Store;

/// Why a receiver could not be built.
///
/// Returned by [`ReceiverBuilder::build`] before anything serves a request;
/// the configuration checks (secrets, hosted interfaces) run before the
/// database is opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    /// The inbox database could not be opened or migrated (see
    /// [`StoreError`](crate::store::StoreError): a newer or damaged file is
    /// refused unchanged, an unreachable PostgreSQL server names the host).
    #[error(transparent)]
    Database(#[from] crate::store::StoreError),
    /// The inbox's read connection could not be opened on the (migrated)
    /// database: permissions, or the file vanished.
    #[error(transparent)]
    Inbox(#[from] crate::inbox::InboxError),
    /// A secret in `peers` does not parse; the secret itself is never
    /// shown. Fix the configured value.
    #[error("secret #{index} of peer `{peer}` is invalid: {source}")]
    InvalidSecret {
        /// The source service id it belongs to (the key under `peers`).
        peer: String,
        /// Its 0-based position in that peer's list.
        index: usize,
        /// Why it was refused.
        source: crate::signing::SecretError,
    },
    /// Two hosted services both serve the same interface version: routing
    /// would be ambiguous. Host each (interface, version) once.
    #[error("interface `{interface}` v{version} is hosted twice")]
    DuplicateInterface {
        /// The interface, `package.Service`.
        interface: String,
        /// The version hosted twice.
        version: u32,
    },
    /// A hosted interface's `manifest_json` is not JSON: hand-written
    /// [`HostedInterface`] data is wrong (generated code never is).
    #[error("the manifest of `{interface}` v{version} is not valid JSON: {source}")]
    InvalidManifest {
        /// The interface, `package.Service`.
        interface: String,
        /// Its version.
        version: u32,
        /// The JSON parser's error.
        source: serde_json::Error,
    },
    /// The operating system refused to start a writer thread (out of
    /// threads or memory).
    #[error("cannot start the receiver's writer thread: {0}")]
    WriterThread(std::io::Error),
}

/// Where a hosted (interface, version) is routed.
#[derive(Debug)]
pub(super) struct Route {
    pub(super) service: usize,
    pub(super) hosted: HostedInterface,
}

/// Whether the receiver checks signatures (see
/// [`ReceiverBuilder::danger_accept_unsigned_messages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verification {
    Required,
    DisabledForLocalDevelopment,
}

/// Builds a [`Receiver`]. Created by [`Receiver::builder`].
#[must_use = "call .build() to get a Receiver"]
pub struct ReceiverBuilder<S: AnyStore = Sqlite> {
    pub(super) config: Config,
    pub(super) database: crate::store::Database,
    /// Writer threads, each with its own connection (PostgreSQL); `None`:
    /// the store's default.
    pub(super) writers: Option<usize>,
    pub(super) services: Vec<Registered<S::Service>>,
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) group_commit_limit: usize,
    pub(super) batch_body_limit: usize,
    pub(super) verification: Verification,
    pub(super) lifecycle: Option<crate::lifecycle::Lifecycle>,
    pub(super) issued: Option<crate::keys::IssuedKeys>,
}

impl<S: AnyStore> std::fmt::Debug for ReceiverBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverBuilder")
            .field("database", &self.database)
            .field("services", &self.services.len())
            .field("verification", &self.verification)
            .finish_non_exhaustive()
    }
}

/// What a store's writers are started with.
pub(crate) struct WriterParts<S: crate::store::sealed::Common> {
    pub commands: mpsc::Receiver<Command>,
    pub handlers: Handlers<S::Service>,
    pub retention: Duration,
    pub group_limit: usize,
    pub durability: crate::config::Durability,
    /// Dropped when the last writer thread ends.
    pub alive: Arc<crate::liveness::LivenessGuard>,
    /// Loaded from the database before the first delivery, when set.
    pub lifecycle: Option<crate::lifecycle::Lifecycle>,
}

/// Started writers: the inbox look-up and the writer threads.
pub(crate) type Started = (Arc<dyn InboxLookup>, Vec<JoinHandle<()>>);

impl<S: Store> ReceiverBuilder<S> {
    /// Hosts a service that is shared with other parts of the program.
    pub fn shared_service(mut self, service: Arc<dyn HostedService<S>>) -> Self {
        self.services.push(Registered(service));
        self
    }
}

impl<S: AnyStore> ReceiverBuilder<S> {
    /// Hosts a service: a generated `…Receiver(handler)` or a hand-written
    /// [`HostedService`] (a store with blocking transactions), or its
    /// [`AsyncHostedService`](super::AsyncHostedService) form (a sqlx store).
    pub fn service<M>(mut self, service: impl IntoService<S, M>) -> Self {
        self.services.push(service.into_service());
        self
    }

    /// Counts into these metrics (e.g. the ones the outbox side also uses, so
    /// one `/_rf/metrics` page shows both). Default: a fresh set.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Most deliveries the writer commits in one transaction (one fsync).
    pub fn group_commit_limit(mut self, deliveries: usize) -> Self {
        self.group_commit_limit = deliveries.max(1);
        self
    }

    /// Largest body of `POST /_rf/receive/batch`.
    pub fn batch_body_limit(mut self, bytes: usize) -> Self {
        self.batch_body_limit = bytes;
        self
    }

    /// Turns signature verification OFF: any source is accepted and no
    /// `webhook-*` header is checked. Anyone who can reach the receiver can
    /// then make it run handlers. For local development only; logged as a
    /// warning at build time.
    pub fn danger_accept_unsigned_for_local_development(mut self) -> Self {
        self.verification = Verification::DisabledForLocalDevelopment;
        self
    }

    /// Hosts the control interface `rfidl.control.Lifecycle` v2 (commands
    /// from the registry's source id [`crate::lifecycle::DEFAULT_REGISTRY_SOURCE`]
    /// only; configure a `peers` secret for it) and answers the routes of
    /// every version in `lifecycle` 410 `version_decommissioned`. Pass the
    /// outbox's set ([`Outbox::lifecycle`](crate::outbox::Outbox::lifecycle))
    /// so that its dispatcher holds what the commands decommission, and
    /// bind it to this instance's id when it registers
    /// ([`DirectoryClient::lifecycle`](crate::directory::DirectoryClient::lifecycle)):
    /// a command addressed to another instance is refused.
    pub fn lifecycle(self, lifecycle: &crate::lifecycle::Lifecycle) -> Self {
        self.lifecycle_from(lifecycle, crate::lifecycle::DEFAULT_REGISTRY_SOURCE)
    }

    /// [`lifecycle`](Self::lifecycle) with commands accepted from the source
    /// id `registry` instead.
    pub fn lifecycle_from(
        mut self,
        lifecycle: &crate::lifecycle::Lifecycle,
        registry: &str,
    ) -> Self {
        self.lifecycle = Some(lifecycle.clone());
        let service = crate::lifecycle::LifecycleService::new(lifecycle.clone(), registry);
        self.services
            .push(S::lifecycle_service(service, &self.database));
        self
    }

    /// Accepts, from a source that `peers` does not list, the secrets the
    /// registry issued for it ([`crate::keys`]); the set may change while
    /// the receiver runs (the directory client renews it). Secrets in
    /// `peers` keep precedence.
    pub fn issued_keys(mut self, keys: &crate::keys::IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Runs `writers` writer threads, each with a connection of its own, so
    /// that handlers run side by side (PostgreSQL; 4 by default). SQLite
    /// has one writer, which group-commits: this setting does not apply.
    pub fn writers(mut self, writers: usize) -> Self {
        self.writers = Some(writers);
        self
    }

    /// Opens (and migrates) the database, starts the writer thread.
    pub fn build(self) -> Result<Receiver, ReceiverError> {
        let mut secrets = HashMap::new();
        for (peer, texts) in &self.config.peers {
            let mut parsed = Vec::with_capacity(texts.len());
            for (index, text) in texts.iter().enumerate() {
                let secret =
                    Secret::parse(text).map_err(|source| ReceiverError::InvalidSecret {
                        peer: peer.clone(),
                        index,
                        source,
                    })?;
                parsed.push(secret);
            }
            secrets.insert(peer.clone(), parsed);
        }

        let mut routes: HashMap<&'static str, BTreeMap<u32, Route>> = HashMap::new();
        let mut metadata = Vec::new();
        for (index, service) in self.services.iter().enumerate() {
            for hosted in S::interfaces(&service.0) {
                let versions = routes.entry(hosted.interface).or_default();
                if versions.contains_key(&hosted.version) {
                    return Err(ReceiverError::DuplicateInterface {
                        interface: hosted.interface.to_owned(),
                        version: hosted.version,
                    });
                }
                let manifest: serde_json::Value = serde_json::from_str(hosted.manifest_json)
                    .map_err(|source| ReceiverError::InvalidManifest {
                        interface: hosted.interface.to_owned(),
                        version: hosted.version,
                        source,
                    })?;
                metadata.push(serde_json::json!({
                    "interface": hosted.interface,
                    "version": hosted.version,
                    "fingerprint": hosted.fingerprint,
                    "endpoints": hosted.endpoints,
                    "manifest": manifest,
                }));
                versions.insert(
                    hosted.version,
                    Route {
                        service: index,
                        hosted: *hosted,
                    },
                );
            }
        }

        if self.verification == Verification::DisabledForLocalDevelopment {
            warn!(
                db = %self.database,
                "SIGNATURE VERIFICATION IS OFF: this receiver accepts unsigned messages from anyone. \
                 Never run it like this outside local development."
            );
        }

        let metrics = self.metrics.unwrap_or_default();
        let services: Arc<[Registered<S::Service>]> = self.services.into();
        let (commands, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let (liveness, alive) = crate::liveness::Liveness::start();
        let configured = Some(self.config.inbox.writers).filter(|&writers| writers > 0);
        let writers = self
            .writers
            .or(configured)
            .unwrap_or(S::DEFAULT_WRITERS)
            .max(1);
        let (reader, threads) = S::start_inbox(
            &self.database,
            writers,
            WriterParts {
                commands: receiver,
                handlers: Handlers {
                    services,
                    metrics: Arc::clone(&metrics),
                },
                retention: self.config.inbox.retention,
                group_limit: self.group_commit_limit,
                durability: self.config.inbox.durability,
                alive: Arc::new(alive),
                lifecycle: self.lifecycle.clone(),
            },
        )?;

        Ok(Receiver {
            shared: Arc::new(Shared {
                database: self.database.clone(),
                body_limit: self.config.inbox.body_limit,
                batch_body_limit: self.batch_body_limit,
                tolerance: self.config.inbox.signature_tolerance,
                in_progress_wait: self.config.inbox.in_progress_wait,
                dedup_horizon: self
                    .config
                    .inbox
                    .retention
                    .saturating_sub(self.config.inbox.signature_tolerance),
                verification: self.verification,
                secrets,
                issued: self.issued,
                routes,
                metadata: serde_json::json!({ "interfaces": metadata }),
                reader,
                commands,
                metrics,
                duplicates: Default::default(),
                writer_threads: Mutex::new(threads),
                liveness,
                lifecycle: self.lifecycle,
            }),
        })
    }
}
