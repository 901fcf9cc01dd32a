//! [`HostBuilder`]: what a host runs, collected before anything starts.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use super::{DEFAULT_SHUTDOWN_TIMEOUT, Host, HostError};
use crate::config::Config;
use crate::directory::{InterfaceRef, PublishOnRegistration};
use crate::dispatcher::{Dispatcher, DispatcherBuilder};
use crate::failures::IntoFailureHandler;
use crate::keys::IssuedKeys;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::receiver::{IntoService, Receiver, ReceiverBuilder};
use crate::responses::IntoResponder;
use crate::signing::Secret;
use crate::store::{AnyStore, Database, Sqlite};
use crate::transport::Transport;

/// Configures a [`Host`]; made by [`Host::builder`]. Every method but the
/// starting ones only records what to run.
#[must_use = "a host does nothing until it is started: .serve(listener), .start(listener), .listen(addr)"]
pub struct HostBuilder<S: AnyStore = Sqlite> {
    pub(super) config: Config,
    pub(super) database: Database,
    pub(super) outbox: Outbox<S>,
    pub(super) receiver: ReceiverBuilder<S>,
    pub(super) dispatcher: DispatcherBuilder<S>,
    pub(super) responses: Vec<Arc<S::Responder>>,
    pub(super) issued: Option<IssuedKeys>,
    pub(super) lifecycle: bool,
    pub(super) ops_token: Option<String>,
    pub(super) public_url: Option<String>,
    pub(super) hosts: Vec<InterfaceRef>,
    pub(super) calls: Vec<InterfaceRef>,
    pub(super) publish: Option<PublishOnRegistration>,
    pub(super) app: Option<Router>,
    pub(super) shutdown_timeout: Duration,
    #[cfg(feature = "grpc")]
    pub(super) grpc: Option<TcpListener>,
    #[cfg(feature = "nats")]
    pub(super) jetstream: Option<String>,
    #[cfg(feature = "amqp")]
    pub(super) amqp: Option<String>,
    #[cfg(feature = "nats")]
    pub(super) ack_wait: Option<Duration>,
}

impl<S: AnyStore> std::fmt::Debug for HostBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuilder")
            .field("service_id", &self.config.service_id)
            .field("database", &self.database)
            .field("responses", &self.responses.len())
            .field("ops_token", &self.ops_token.is_some())
            .field("public_url", &self.public_url)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

impl<S: AnyStore> HostBuilder<S> {
    pub(super) fn new(config: Config, database: Database) -> Self {
        let outbox = Outbox::with_metrics(
            config.clone(),
            super::start::At::<S>::new(database.clone()),
            Arc::new(Metrics::default()),
        );
        let receiver =
            Receiver::builder(config.clone(), super::start::At::<S>::new(database.clone()));
        let dispatcher = Dispatcher::builder(&outbox);
        Self {
            config,
            database,
            outbox,
            receiver,
            dispatcher,
            responses: Vec::new(),
            issued: None,
            lifecycle: false,
            ops_token: None,
            public_url: None,
            hosts: Vec::new(),
            calls: Vec::new(),
            publish: None,
            app: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            #[cfg(feature = "grpc")]
            grpc: None,
            #[cfg(feature = "nats")]
            jetstream: None,
            #[cfg(feature = "amqp")]
            amqp: None,
            #[cfg(feature = "nats")]
            ack_wait: None,
        }
    }

    /// The outbox the application's clients enqueue through
    /// (`EngineClient::new(host.outbox().clone(), "engine")`): make them
    /// before the host starts, since its dispatcher checks that every
    /// destination a client sends to is routed.
    pub fn outbox(&self) -> &Outbox<S> {
        &self.outbox
    }

    /// The configuration every part runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Hosts a service on the receiver: a generated `…Receiver(handler)`
    /// or a hand-written [`HostedService`](crate::receiver::HostedService)
    /// (or, on a sqlx store, its async form; [`ReceiverBuilder::service`]).
    pub fn service<M>(mut self, service: impl IntoService<S, M>) -> Self {
        self.receiver = self.receiver.service(service);
        self
    }

    /// Acts on the answers to messages of `handler`'s interface version, in
    /// the transaction that marks each one `Sent`: a generated
    /// `…AnswerRouter(answers)` ([`DispatcherBuilder::responses`]). The same
    /// handler takes the answers that come back through JetStream.
    pub fn responses<M>(mut self, handler: impl IntoResponder<S, M>) -> Self {
        self.responses.push(handler.into_responder().0);
        self
    }

    /// Acts on the messages of `handler`'s interface version that end
    /// `Failed`, `DeadLetter` or `Expired`, in the transaction that gives
    /// each its status: a generated `…FailureRouter(handler)`
    /// ([`DispatcherBuilder::failures`], [`crate::failures`]).
    pub fn failures<M>(mut self, handler: impl IntoFailureHandler<S, M>) -> Self {
        self.dispatcher = self.dispatcher.failures(handler);
        self
    }

    /// Sends messages for `destination` through `transport`, signed with
    /// `secret` ([`DispatcherBuilder::route`]); configured destinations
    /// need no route.
    pub fn route(
        mut self,
        destination: impl Into<String>,
        transport: impl Transport,
        secret: Secret,
    ) -> Self {
        self.dispatcher = self.dispatcher.route(destination, transport, secret);
        self
    }

    /// Runs `writers` receiver writer threads (PostgreSQL;
    /// [`ReceiverBuilder::writers`]).
    pub fn writers(mut self, writers: usize) -> Self {
        self.receiver = self.receiver.writers(writers);
        self
    }

    /// Any other receiver setting (`group_commit_limit`, …), applied now.
    pub fn configure_receiver(
        mut self,
        configure: impl FnOnce(ReceiverBuilder<S>) -> ReceiverBuilder<S>,
    ) -> Self {
        self.receiver = configure(self.receiver);
        self
    }

    /// Any other dispatcher setting (`route_by`, …), applied now.
    pub fn configure_dispatcher(
        mut self,
        configure: impl FnOnce(DispatcherBuilder<S>) -> DispatcherBuilder<S>,
    ) -> Self {
        self.dispatcher = configure(self.dispatcher);
        self
    }

    /// Signs and verifies with the keys the registry issues
    /// (`rfidl-registry serve --issue-keys`, [`crate::keys`]): the same set
    /// goes to the receiver, the dispatcher, the JetStream answers consumer
    /// and the registration, which fills it.
    pub fn issued_keys(mut self, keys: &IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Hosts the registry's control interface (`rfidl.control.Lifecycle`:
    /// decommissioned versions are answered 410 and their outbound rows
    /// held; [`ReceiverBuilder::lifecycle`]), bound to the instance id the
    /// registration gets. Accepted when the config lists a `peers` secret
    /// for `rfidl-registry` (or the keys are issued).
    pub fn lifecycle(mut self) -> Self {
        self.receiver = self.receiver.lifecycle(self.outbox.lifecycle());
        self.lifecycle = true;
        self
    }

    /// Requires `Authorization: Bearer <token>` on the diagnostics routes;
    /// the registry's health checks get it with the registration. Without
    /// one, the host serves on loopback only.
    pub fn ops_token(mut self, token: impl Into<String>) -> Self {
        self.ops_token = Some(token.into());
        self
    }

    /// The base URL peers and the registry reach this service at, when it
    /// is not `http://` and the listener's address (a listener on
    /// `0.0.0.0`, a proxy in front).
    pub fn public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = Some(url.into());
        self
    }

    /// What the registration tells the registry's directory (with a
    /// `registry:` in the config): the interface versions this service
    /// provides (`hosts`, those whose commands it handles) and those it
    /// calls, with the generated `INTERFACE`, `VERSION` and `FINGERPRINT`.
    pub fn directory(
        mut self,
        hosts: impl IntoIterator<Item = InterfaceRef>,
        calls: impl IntoIterator<Item = InterfaceRef>,
    ) -> Self {
        self.hosts = hosts.into_iter().collect();
        self.calls = calls.into_iter().collect();
        self
    }

    /// Publishes these manifests with the registry's publish token before
    /// registering ([`DirectoryClient::publish_on_registration`](crate::directory::DirectoryClient::publish_on_registration)).
    pub fn publish_on_registration(mut self, publish: PublishOnRegistration) -> Self {
        self.publish = Some(publish);
        self
    }

    /// The application's own routes, served beside the receiver's and the
    /// diagnostics' (merged: a route under `/_rf/` would clash).
    pub fn router(mut self, router: Router) -> Self {
        self.app = Some(match self.app.take() {
            Some(app) => app.merge(router),
            None => router,
        });
        self
    }

    /// How long a graceful stop may take (default 10 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Also serves the receiver as `rfidl.RFReceiver` (gRPC, plain HTTP/2)
    /// on `listener`, for peers that send to `grpc://` URLs.
    #[cfg(feature = "grpc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
    pub fn grpc(mut self, listener: TcpListener) -> Self {
        self.grpc = Some(listener);
        self
    }

    /// Also consumes this service's inbound messages from the AMQP 1.0
    /// address of `url` (an `amqp[s]://` URL or a Service Bus connection
    /// string; [`AmqpConsumer`](crate::amqp::AmqpConsumer)). Answers to
    /// messages sent to an AMQP destination are taken whether or not this
    /// is set.
    #[cfg(feature = "amqp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
    pub fn amqp(mut self, url: impl Into<String>) -> Self {
        self.amqp = Some(url.into());
        self
    }

    /// Also consumes this service's inbound messages from the JetStream
    /// stream of `url` (`nats://host:port/<subject>`), with a durable
    /// consumer named after the service id that its replicas share
    /// ([`JetStreamConsumer`](crate::nats::JetStreamConsumer)). Answers to
    /// messages sent to a `nats://` destination are taken whether or not
    /// this is set.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn jetstream(mut self, url: impl Into<String>) -> Self {
        self.jetstream = Some(url.into());
        self
    }

    /// How long the broker waits for an acknowledgement before it
    /// redelivers, for both JetStream consumers (default 30 s).
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn jetstream_ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = Some(ack_wait);
        self
    }

    /// Starts every part and serves them on `listener`.
    ///
    /// # Errors
    ///
    /// What a part refused at start (what started before is stopped), or
    /// [`HostError::OpenDiagnostics`] for a listener beyond loopback without
    /// an ops token.
    pub async fn start(self, listener: TcpListener) -> Result<Host, HostError> {
        super::start::start(self, super::start::Serving::Listener(listener)).await
    }

    /// [`start`](Self::start) on a listener bound to `addr`
    /// (`"127.0.0.1:0"` picks a free port: [`Host::url`] says which).
    ///
    /// # Errors
    ///
    /// As for `start`, and [`HostError::Io`] when `addr` cannot be bound.
    pub async fn listen(self, addr: impl tokio::net::ToSocketAddrs) -> Result<Host, HostError> {
        let listener = TcpListener::bind(addr).await?;
        self.start(listener).await
    }

    /// Starts every part but the HTTP server: the application serves
    /// [`Host::router`] itself (behind TLS, in a larger server) at
    /// `public_url`, and stops serving it before [`Host::shutdown`].
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub async fn start_unserved(self, public_url: impl Into<String>) -> Result<Host, HostError> {
        super::start::start(self, super::start::Serving::Elsewhere(public_url.into())).await
    }

    /// Starts, serves on `listener` until SIGTERM or SIGINT, then stops in
    /// order within the shutdown timeout. The signal handlers are installed
    /// first, so a signal during the start stops the service gracefully too.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start) and [`Host::shutdown`].
    pub async fn serve(self, listener: TcpListener) -> Result<(), HostError> {
        let signal = super::shutdown_signal()?;
        let host = self.start(listener).await?;
        host.run_until(async move {
            let name = signal.await;
            tracing::info!(signal = name, "stopping gracefully");
        })
        .await
    }

    /// Starts, serves on `listener` until `signal` completes, then stops in
    /// order within the shutdown timeout.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start) and [`Host::shutdown`].
    pub async fn serve_with_shutdown(
        self,
        listener: TcpListener,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<(), HostError> {
        self.start(listener).await?.run_until(signal).await
    }
}
