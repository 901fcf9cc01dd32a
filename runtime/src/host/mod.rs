//! [`Host`]: one service's parts, started, served and stopped together.
//!
//! Given a [`Config`], a database and what the generated
//! code hands over (hosted services such as `EngineReceiver(handler)`,
//! response handlers such as `ServiceAnswerRouter(answers)`), a host starts
//!
//! * the [outbox](crate::outbox)'s [dispatcher](crate::dispatcher) (with the
//!   response handlers),
//! * the [receiver](crate::receiver) on HTTP, and on gRPC and a JetStream
//!   stream where configured ([`HostBuilder::grpc`], [`HostBuilder::jetstream`];
//!   the answers to messages sent through JetStream come back through a
//!   consumer of their own),
//! * the [retention](crate::retention) clean-up,
//! * the [diagnostics](crate::diagnostics) routes (`/_rf/health`, `/_rf/readyz`,
//!   `/_rf/metrics`, …), protected by [`HostBuilder::ops_token`],
//! * the [registration](crate::directory) with the registry when the config
//!   has a `registry:` section,
//!
//! serves them on one listener, and stops them in the order that leaves no
//! outbox row `Sending`:
//!
//! 1. the servers stop accepting connections and finish the requests in
//!    flight (HTTP, gRPC), and the JetStream consumer finishes the messages
//!    in hand;
//! 2. the receiver's writers commit what they queued (later requests are
//!    answered 503);
//! 3. the dispatcher stops claiming, lets its sends finish and records
//!    their results; then the JetStream answers consumer stops;
//! 4. the retention task stops after its pass in progress;
//! 5. the registration stops renewing: the registry counts the instance as
//!    gone after its missed heartbeats (it is not deleted, so its health
//!    history stays, and a restarted instance registers again).
//!
//! All of it within [`HostBuilder::shutdown_timeout`] (10 s by default), or
//! [`HostError::ShutdownTimedOut`].
//!
//! The application's clients are made from [`HostBuilder::outbox`] before the
//! host starts (the dispatcher checks, as it starts, that every destination
//! a client sends to is routed). Every part stays usable on its own: a host
//! only wires what `Outbox`, `Dispatcher`, `Receiver`, `Retention`,
//! `Diagnostics` and `DirectoryClient` offer to whoever wires them by hand.
//!
//! ```no_run
//! use rfidl_runtime::Host;
//! # use rfidl_runtime::receiver::HostedService;
//! # async fn run(config: rfidl_runtime::Config, greeter: impl HostedService) -> Result<(), rfidl_runtime::host::HostError> {
//!
//! let host = Host::builder(config, "service.db")
//!     // e.g. `greeter_v1::EngineReceiver(Guestbook)`, generated
//!     .service(greeter)
//!     .shutdown_timeout(std::time::Duration::from_secs(10));
//! // Clients before the start: `EngineClient::new(host.outbox().clone(), "engine")`.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7001").await?;
//! // Serves until SIGTERM or SIGINT, then stops in order within the bound.
//! host.serve(listener).await
//! # }
//! ```
//!
//! Or start it, keep the handle, and stop it when the application decides:
//!
//! ```no_run
//! # use rfidl_runtime::Host;
//! # async fn run(config: rfidl_runtime::Config) -> Result<(), rfidl_runtime::host::HostError> {
//! let stop = tokio_util::sync::CancellationToken::new();
//! let host = Host::builder(config, "service.db").listen("127.0.0.1:0").await?;
//! println!("serving on {}", host.url());
//! host.run_until(stop.cancelled_owned()).await
//! # }
//! ```

mod builder;
pub(crate) mod start;
pub(crate) mod stop;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

pub use builder::HostBuilder;
pub use stop::shutdown_signal;

use crate::config::Config;
use crate::directory::DirectoryState;
use crate::metrics::Metrics;
use crate::receiver::Receiver;
use crate::store::{AnyStore, Location};

/// How long a graceful stop may take unless told
/// ([`HostBuilder::shutdown_timeout`]).
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a host could not start, or did not stop in time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The receiver did not start (its database, a peer's secret, two
    /// services hosting one interface version).
    #[error(transparent)]
    Receiver(#[from] crate::receiver::ReceiverError),
    /// The dispatcher did not start (its database, a destination without a
    /// route or with a URL no transport serves).
    #[error(transparent)]
    Dispatcher(#[from] crate::dispatcher::DispatcherError),
    /// Retention or the diagnostics could not open the database.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A JetStream consumer's settings are malformed (`.jetstream(url)`, a
    /// `nats://` destination).
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    #[error(transparent)]
    Nats(#[from] crate::nats::NatsError),
    /// An AMQP consumer's settings are malformed (`.amqp(url)`, an AMQP
    /// destination).
    #[cfg(feature = "amqp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
    #[error(transparent)]
    Amqp(#[from] crate::amqp::AmqpError),
    /// The listener's address, or installing the signal handlers.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Served beyond loopback without [`HostBuilder::ops_token`]: the
    /// diagnostics routes (the failed list, metrics) would answer anyone.
    #[error(
        "refusing to serve on {addr} without an ops token: the /_rf/… diagnostics routes \
         (failed list, metrics) would answer anyone who reaches the port; give a token \
         (HostBuilder::ops_token), or listen on loopback"
    )]
    OpenDiagnostics {
        /// The address the listener is bound to.
        addr: SocketAddr,
    },
    /// A `backup.…` setting cannot work (`backup.pages_per_step` 0, an
    /// `interval` of 0).
    #[error(transparent)]
    Backup(#[from] crate::backup::BackupError),
    /// [`HostBuilder::ops_token`] was given an empty token.
    #[error("the ops token is empty: give a non-empty one, or none")]
    EmptyOpsToken,
    /// The graceful stop took longer than the bound; what had not stopped
    /// yet was dropped (rows a send left `Sending` are sent again once
    /// their lease runs out).
    #[error("did not stop within {0:?}")]
    ShutdownTimedOut(Duration),
}

/// A running service: its outbox's dispatcher, its receiver, retention,
/// diagnostics and registration, served on one listener. Made by
/// [`Host::builder`]; stop it with [`shutdown`](Self::shutdown),
/// [`run`](Self::run) (SIGTERM, SIGINT) or [`run_until`](Self::run_until).
/// Dropped without that, it stops serving and renewing its registration at
/// once, and the rest stops with the tokio runtime.
#[must_use = "a host stops serving when dropped: call .run(), .run_until(…) or .shutdown()"]
pub struct Host {
    url: String,
    local_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    receiver: Receiver,
    router: Router,
    metrics: Arc<Metrics>,
    directory: Option<watch::Receiver<DirectoryState>>,
    parts: stop::Parts,
    shutdown_timeout: Duration,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("url", &self.url)
            .field("grpc_addr", &self.grpc_addr)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

impl Host {
    /// Starts configuring a service on `database` (a SQLite file path, or
    /// a sqlx store: `&PgStore`, `&SqliteStore`), which decides
    /// the store of every part, as [`Outbox::new`](crate::outbox::Outbox::new)'s does.
    pub fn builder<S: AnyStore>(
        config: Config,
        database: impl Location<Store = S>,
    ) -> HostBuilder<S> {
        HostBuilder::new(config, database.into_database())
    }

    /// The base URL peers and the registry reach this service at:
    /// [`HostBuilder::public_url`], else `http://` and the listener's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address the HTTP server listens on (`None` when the routes are
    /// served by the application: [`HostBuilder::start_unserved`]).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The address the receiver is served on over gRPC, if it is
    /// ([`HostBuilder::grpc`]).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The receiver (its metrics, its metadata; [`Receiver::receive`] for
    /// in-process deliveries).
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// The metrics every part counts into (`GET /_rf/metrics`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Everything served: the receiver's routes, the diagnostics routes and
    /// [`HostBuilder::router`]'s. For [`HostBuilder::start_unserved`], or
    /// to serve it on more listeners.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// Where the registration stands (`None` without a `registry:` in the
    /// config).
    pub fn directory(&self) -> Option<watch::Receiver<DirectoryState>> {
        self.directory.clone()
    }

    /// Runs until SIGTERM or SIGINT (Ctrl-C), then [`shutdown`](Self::shutdown).
    /// The handlers are installed when this is called: to stop gracefully
    /// on a signal that arrives while the service starts, install them
    /// first with [`shutdown_signal`] and use [`run_until`](Self::run_until)
    /// (or [`HostBuilder::serve`], which does).
    ///
    /// # Errors
    ///
    /// [`HostError::Io`] when the handlers cannot be installed,
    /// [`HostError::ShutdownTimedOut`] as for `shutdown`.
    pub async fn run(self) -> Result<(), HostError> {
        let signal = shutdown_signal()?;
        self.run_until(async move {
            let name = signal.await;
            tracing::info!(signal = name, "stopping gracefully");
        })
        .await
    }

    /// Runs until `signal` completes (a token's `cancelled_owned()`, a
    /// channel, [`shutdown_signal`]), then [`shutdown`](Self::shutdown).
    ///
    /// # Errors
    ///
    /// [`HostError::ShutdownTimedOut`] as for `shutdown`.
    pub async fn run_until(
        self,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<(), HostError> {
        signal.await;
        self.shutdown().await
    }

    /// Stops every part in the order of the [module documentation](self)
    /// (nothing is left `Sending`), within the shutdown timeout.
    ///
    /// # Errors
    ///
    /// [`HostError::ShutdownTimedOut`] when that took longer; the parts not
    /// stopped yet are dropped.
    pub async fn shutdown(mut self) -> Result<(), HostError> {
        let started = std::time::Instant::now();
        let bound = self.shutdown_timeout;
        let stopped = tokio::time::timeout(bound, self.parts.stop()).await;
        match stopped {
            Ok(()) => {
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "stopped gracefully"
                );
                Ok(())
            }
            Err(_) => {
                tracing::error!(?bound, "the graceful stop did not finish in time");
                Err(HostError::ShutdownTimedOut(bound))
            }
        }
    }
}
