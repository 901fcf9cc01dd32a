//! Building and starting a dispatcher: [`Dispatcher`] (one constructor per
//! store), [`DispatcherBuilder`] (routes, response handlers, a resolver for
//! destinations that come and go, issued keys) and the checks at start (every
//! destination a client declared has a route; every configured destination
//! has a transport for its URL). It never claims or sends: the loop in the
//! parent module does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::{DispatcherHandle, State, run};
use crate::failures::{FailureHandlers, IntoFailureHandler};
use crate::liveness::Liveness;
use crate::outbox::Outbox;
use crate::responses::IntoResponder;
use crate::signing::Secret;
use crate::store::{AnyStore, Sqlite};
use crate::transport::Transport;

/// Why a dispatcher could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatcherError {
    /// The outbox's database could not be opened for dispatching (see
    /// [`StoreError`](crate::store::StoreError)); nothing was claimed.
    #[error(transparent)]
    Db(#[from] crate::store::StoreError),
    /// A configured destination (`destinations.<name>`) cannot be used: its
    /// `secret` is missing (and no issued keys are in use) or not a valid
    /// `whsec_` secret, or no transport serves its URL's scheme (or the URL
    /// does not parse, or a `ca_file` cannot be read). Fix the
    /// configuration; the dispatcher did not start.
    #[error("destination `{name}`: {message}")]
    Destination {
        /// The destination's name, the key under `destinations`.
        name: String,
        /// What is wrong with it, without quoting the secret.
        message: String,
    },
    /// A generated client sends to a destination that nothing routes.
    #[error(
        "a client sends to destination `{name}`, which has no route: add `destinations.{name}` \
         (its `url` and `secret`) to the config, or set RFIDL_DESTINATIONS_{env}_URL and \
         RFIDL_DESTINATIONS_{env}_SECRET",
        env = crate::config::env::name_key(name)
    )]
    UnknownDestination {
        /// The destination a client declared
        /// ([`Outbox::declare_destination`](crate::Outbox::declare_destination)).
        name: String,
    },
    /// Two failure handlers were registered for one interface version
    /// ([`DispatcherBuilder::failures`]): which one should run is
    /// ambiguous. Register one, which may do both jobs; the dispatcher did
    /// not start.
    #[error(
        "more than one failure handler for `{interface}` v{version}: register one per interface \
         version"
    )]
    DuplicateFailureHandler {
        /// `package.Service`.
        interface: &'static str,
        /// Its version.
        version: u32,
    },
    /// The operating system refused to create the dispatcher's tokio
    /// runtime or its thread (out of threads or memory). Nothing started.
    #[error("cannot start the dispatcher's runtime or thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Where one destination is reached and with which secret requests are signed.
#[derive(Clone)]
///
/// Built by [`DispatcherBuilder::route`] or returned by a
/// [`route_by`](DispatcherBuilder::route_by) resolver; the registry builds
/// it with a struct literal, so it is not `#[non_exhaustive]`.
pub struct Route {
    /// Sends the signed requests of this destination (HTTP, a Unix socket,
    /// gRPC, NATS, several base URLs: [`crate::transport`]). Shared by
    /// every request to the destination; it must be safe to call
    /// concurrently.
    pub transport: Arc<dyn Transport>,
    /// Empty: the signing secrets the registry issued to this service
    /// ([`DispatcherBuilder::issued_keys`]).
    pub secrets: Vec<Secret>,
}

/// Configures and starts a dispatcher on the store `S`.
#[must_use]
pub struct DispatcherBuilder<S: AnyStore = Sqlite> {
    outbox: Outbox<S>,
    routes: BTreeMap<String, Route>,
    errors: Vec<DispatcherError>,
    responses: Vec<Arc<S::Responder>>,
    failures: FailureHandlers<S::OnFailure>,
    resolver: Option<Resolver>,
    issued: Option<crate::keys::IssuedKeys>,
}

/// Finds the route of a destination that has none of its own
/// ([`DispatcherBuilder::route_by`]).
pub(super) type Resolver = Arc<dyn Fn(&str) -> Option<Route> + Send + Sync>;

impl<S: AnyStore> DispatcherBuilder<S> {
    /// Routes every destination that has no route of its own through
    /// `resolve`, called once per request to such a destination (cache in
    /// it when building a route costs). For senders whose destinations come
    /// and go, such as the registry's commands to service instances, whose
    /// destination names are base URLs. `None` fails the rows as unroutable.
    pub fn route_by(
        mut self,
        resolve: impl Fn(&str) -> Option<Route> + Send + Sync + 'static,
    ) -> Self {
        self.resolver = Some(Arc::new(resolve));
        self
    }

    /// Acts on the answers to messages of `handler`'s interface version,
    /// inside the transaction that marks each one `Sent` (see
    /// [`crate::responses`]).
    pub fn responses<M>(mut self, handler: impl IntoResponder<S, M>) -> Self {
        self.responses.push(handler.into_responder().0);
        self
    }

    /// [`responses`](Self::responses) for a handler shared with another
    /// part (the host's answers consumers).
    pub(crate) fn shared_responder(mut self, handler: Arc<S::Responder>) -> Self {
        self.responses.push(handler);
        self
    }

    /// Acts on the messages of `handler`'s interface version that end
    /// `Failed`, `DeadLetter` or `Expired`, inside the transaction that
    /// gives each its status (see [`crate::failures`]): a generated
    /// `…FailureRouter(handler)`. One handler per interface version: a
    /// second one for the same version stops the start
    /// ([`DispatcherError::DuplicateFailureHandler`]).
    pub fn failures<M>(mut self, handler: impl IntoFailureHandler<S, M>) -> Self {
        let (handler, key) = handler.into_failure_handler();
        self.failures.push(key, handler.0);
        self
    }

    /// Signs messages to every destination whose config gives no `secret`
    /// with the signing secrets the registry issued to this service
    /// ([`crate::keys`]), as they are when each request is signed. Until
    /// the first ones arrive, such messages wait (not counted). Without
    /// this, a destination without a secret stops the start.
    pub fn issued_keys(mut self, keys: &crate::keys::IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Sends messages for `destination` through `transport`, signed with `secret`.
    pub fn route(
        mut self,
        destination: impl Into<String>,
        transport: impl Transport,
        secret: Secret,
    ) -> Self {
        self.routes.insert(
            destination.into(),
            Route {
                transport: Arc::new(transport),
                secrets: vec![secret],
            },
        );
        self
    }

    /// Starts the dispatcher, on a runtime of its own (see the module's
    /// documentation); call it on a tokio runtime, whose shutdown stops the
    /// dispatcher too. Destinations from `Config::destinations` with an
    /// `http(s)://` or `unix://` URL are added unless routed explicitly
    /// (several base URLs: [`crate::transport::SpreadTransport`]).
    pub fn start(mut self) -> Result<DispatcherHandle, DispatcherError> {
        // Panics outside a tokio runtime, before anything has started.
        let caller = tokio::runtime::Handle::current();
        let config = self.outbox.config().clone();
        let mut runtime = Unstarted(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(RUNTIME_WORKERS)
                .thread_name("rfidl-dispatcher-worker")
                .enable_all()
                .build()
                .map_err(DispatcherError::Thread)?,
        ));
        // Transports made here start their background tasks (a gRPC
        // channel's worker) on the dispatcher's runtime, beside the sends.
        let entered = runtime.0.as_ref().map(tokio::runtime::Runtime::enter);
        for (name, destination) in &config.destinations {
            if self.routes.contains_key(name) {
                continue;
            }
            let secrets = if destination.secret.is_empty() && self.issued.is_some() {
                Vec::new()
            } else {
                vec![Secret::parse(&destination.secret).map_err(|e| {
                    DispatcherError::Destination {
                        name: name.clone(),
                        message: if destination.secret.is_empty() {
                            "has no `secret`: give one (`whsec_…`), or run with keys issued by \
                             the registry (`rfidl-registry serve --issue-keys`)"
                                .to_owned()
                        } else {
                            e.to_string()
                        },
                    }
                })?]
            };
            let transport =
                crate::transport::for_destination(destination, config.outbox.request_timeout)
                    .map_err(|message| DispatcherError::Destination {
                        name: name.clone(),
                        message: message.to_string(),
                    })?;
            self.routes
                .insert(name.clone(), Route { transport, secrets });
        }
        drop(entered);
        if let Some(error) = self.errors.pop() {
            return Err(error);
        }
        if let Some((interface, version)) = self.failures.duplicate() {
            return Err(DispatcherError::DuplicateFailureHandler { interface, version });
        }
        let routable = match self.resolver {
            Some(_) => None,
            None => Some(self.routes.keys().cloned().collect()),
        };
        if let Some(name) = self
            .outbox
            .unroutable_destinations(routable)
            .into_iter()
            .next()
        {
            return Err(DispatcherError::UnknownDestination { name });
        }
        let failure_versions = self.failures.keys();
        let db = S::open_dispatch(
            self.outbox.database(),
            &config,
            self.responses,
            self.failures,
        )?;
        let cancel = CancellationToken::new();
        S::wake_on_commit(
            self.outbox.database(),
            self.outbox.wake_handle(),
            cancel.clone(),
        );
        let state = Arc::new(State {
            config,
            db,
            routes: self.routes,
            metrics: self.outbox.metrics().clone(),
            circuits: self.outbox.circuits().clone(),
            lifecycle: self.outbox.lifecycle().clone(),
            resolver: self.resolver,
            issued: self.issued,
            unrouted: Mutex::new(Vec::new()),
            rotation: std::sync::atomic::AtomicUsize::new(0),
        });
        let (liveness, alive) = Liveness::start();
        self.outbox.set_dispatcher_liveness(liveness.clone());
        let wake = self.outbox.wake_handle();
        let stop = cancel.clone();
        let crash = CancellationToken::new();
        let crashed = crash.clone();
        let (finished, done) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("rfidl-dispatcher".into())
            .spawn(move || {
                let Some(runtime) = runtime.0.take() else {
                    return;
                };
                runtime.block_on(async move {
                    let _alive = alive;
                    // On a worker, so that the sends it spawns start there.
                    let mut task = tokio::spawn(run(state, wake, stop));
                    tokio::select! {
                        _ = &mut task => {}
                        () = crashed.cancelled() => task.abort(),
                    }
                });
                // Waits for a claim or recording still on the blocking pool.
                drop(runtime);
                let _ = finished.send(());
            })
            .map_err(DispatcherError::Thread)?;
        // Lives on the runtime that started the dispatcher, and stops the
        // dispatcher when dropped with it, as a task of that runtime would.
        let crash_on_drop = crash.clone().drop_guard();
        let task = caller.spawn(async move {
            let _crash_on_drop = crash_on_drop;
            let _ = done.await;
        });
        Ok(DispatcherHandle {
            cancel,
            crash,
            task,
            liveness,
            failure_versions,
        })
    }
}

/// Worker threads of the dispatcher's runtime: one runs its loop (and an
/// idle claim), and the sends spread over both, which a gRPC destination's
/// one call per message needs (on a single thread its batched rate halved on
/// the benchmark machine).
const RUNTIME_WORKERS: usize = 2;

/// The dispatcher's runtime until its thread takes it over. Should `start`
/// fail first (or the thread not start), this drops it without waiting, as
/// a runtime must be dropped on the caller's executor.
struct Unstarted(Option<tokio::runtime::Runtime>);

impl Drop for Unstarted {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The entry point: `Dispatcher::builder(&outbox).route(…).start()`.
pub struct Dispatcher;

impl Dispatcher {
    /// A dispatcher for `outbox`, on the outbox's database (and store).
    /// Any number of dispatchers may share a PostgreSQL database (replicas):
    /// claims skip the rows another one has locked, and leases fence what
    /// each may update. On SQLite, the first one to start on a file holds it
    /// (`<file>.dispatcher-lock`) and reclaims rows a dispatcher that is gone
    /// left `Sending`.
    pub fn builder<S: AnyStore>(outbox: &Outbox<S>) -> DispatcherBuilder<S> {
        DispatcherBuilder {
            outbox: outbox.clone(),
            routes: BTreeMap::new(),
            errors: Vec::new(),
            responses: Vec::new(),
            failures: FailureHandlers::default(),
            resolver: None,
            issued: None,
        }
    }
}
