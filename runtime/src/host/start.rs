//! Starting a host: the parts in order, the servers, the registration. A
//! part that refuses to start stops those started before it.

use std::marker::PhantomData;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::builder::HostBuilder;
use super::stop::Parts;
use super::{Host, HostError};
use crate::backup::{BackupSchedule, Backups};
use crate::diagnostics::Diagnostics;
use crate::directory::{DirectoryClient, Registration};
use crate::retention::Retention;
use crate::store::{AnyStore, Database, Location};

/// A database already known to belong to the store `S` (it came from an
/// `impl Location<Store = S>`), for the parts' constructors.
pub(super) struct At<S>(Database, PhantomData<fn() -> S>);

impl<S> At<S> {
    pub(super) fn new(database: Database) -> Self {
        Self(database, PhantomData)
    }
}

impl<S: AnyStore> Location for At<S> {
    type Store = S;

    fn into_database(self) -> Database {
        self.0
    }
}

/// Where the routes are served.
pub(super) enum Serving {
    /// By the host, on this listener.
    Listener(TcpListener),
    /// By the application, at this base URL.
    Elsewhere(String),
}

/// What the parts' start hands back besides the parts.
struct Started {
    receiver: crate::receiver::Receiver,
    url: String,
    local_addr: Option<std::net::SocketAddr>,
    grpc_addr: Option<std::net::SocketAddr>,
    router: axum::Router,
    directory: Option<tokio::sync::watch::Receiver<crate::directory::DirectoryState>>,
}

pub(super) async fn start<S: AnyStore>(
    builder: HostBuilder<S>,
    serving: Serving,
) -> Result<Host, HostError> {
    if let Serving::Listener(listener) = &serving {
        check_ops_access(listener.local_addr()?, builder.ops_token.as_deref())?;
    } else if builder.ops_token.as_deref() == Some("") {
        return Err(HostError::EmptyOpsToken);
    }
    let metrics = Arc::clone(builder.outbox.metrics());
    let shutdown_timeout = builder.shutdown_timeout;
    let mut parts = Parts::default();
    match start_parts(builder, serving, &mut parts).await {
        Ok(started) => Ok(Host {
            url: started.url,
            local_addr: started.local_addr,
            grpc_addr: started.grpc_addr,
            receiver: started.receiver,
            router: started.router,
            metrics,
            directory: started.directory,
            parts,
            shutdown_timeout,
        }),
        Err(error) => {
            tracing::error!(%error, "cannot start; stopping what started");
            // Bounded like a stop: what started holds no `Sending` row yet
            // but the dispatcher's first claim.
            let _ = tokio::time::timeout(shutdown_timeout, parts.stop()).await;
            Err(error)
        }
    }
}

/// Secure by default: diagnostics without a token only on loopback, and
/// never an empty token.
fn check_ops_access(addr: std::net::SocketAddr, token: Option<&str>) -> Result<(), HostError> {
    match token {
        Some("") => Err(HostError::EmptyOpsToken),
        None if !addr.ip().is_loopback() => Err(HostError::OpenDiagnostics { addr }),
        _ => Ok(()),
    }
}

async fn start_parts<S: AnyStore>(
    builder: HostBuilder<S>,
    serving: Serving,
    parts: &mut Parts,
) -> Result<Started, HostError> {
    let HostBuilder {
        config,
        database,
        outbox,
        receiver,
        dispatcher,
        responses,
        issued,
        lifecycle,
        ops_token,
        public_url,
        hosts,
        calls,
        publish,
        app,
        #[cfg(feature = "grpc")]
        grpc,
        #[cfg(feature = "nats")]
        jetstream,
        #[cfg(feature = "nats")]
        ack_wait,
        #[cfg(feature = "amqp")]
        amqp,
        ..
    } = builder;
    let metrics = Arc::clone(outbox.metrics());

    // The receiver first: its writers take what the servers will hand them.
    let mut receiver = receiver.metrics(Arc::clone(&metrics));
    if let Some(keys) = &issued {
        receiver = receiver.issued_keys(keys);
    }
    let receiver = receiver.build()?;
    parts.receiver = Some(receiver.clone());

    let mut diagnostics = Diagnostics::builder(database.clone())
        .outbox(&outbox)
        .receiver(&receiver);
    if let Some(token) = &ops_token {
        diagnostics = diagnostics.bearer_token(token);
    }
    let backups = backups_of(&config, &database, &metrics)?;
    if let Some(backups) = &backups {
        diagnostics = diagnostics.backups(backups.clone());
    }
    let diagnostics = diagnostics.build()?;

    let mut dispatcher = dispatcher;
    for handler in &responses {
        dispatcher = dispatcher.shared_responder(Arc::clone(handler));
    }
    if let Some(keys) = &issued {
        dispatcher = dispatcher.issued_keys(keys);
    }
    let dispatcher = parts.dispatcher.insert(dispatcher.start()?);
    // Rows past their TTL with a failure handler are the dispatcher's to expire.
    let handled = dispatcher.failure_versions().to_vec();
    parts.retention = Some(Retention::spawn_with_failure_handlers(
        config.clone(),
        database.clone(),
        Arc::clone(&metrics),
        &handled,
    )?);
    parts.backups = backups.map(|backups| BackupSchedule::spawn(backups, config.backup.interval));

    let mut router = receiver.router().merge(diagnostics.router());
    if let Some(app) = app {
        router = router.merge(app);
    }
    let (url, local_addr) = match serving {
        Serving::Listener(listener) => {
            let addr = listener.local_addr()?;
            let stop = parts.stop_serving.clone();
            let served = router.clone();
            parts.http = Some(tokio::spawn(async move {
                let serve = crate::serve(listener, served)
                    .with_graceful_shutdown(async move { stop.cancelled().await });
                if let Err(error) = serve.await {
                    tracing::error!(%error, "the HTTP server stopped");
                }
            }));
            let url = public_url.unwrap_or_else(|| format!("http://{addr}"));
            (url, Some(addr))
        }
        Serving::Elsewhere(url) => (url, None),
    };
    tracing::info!(service = %config.service_id, %url, store = S::NAME, "serving");

    #[cfg(feature = "grpc")]
    let grpc_addr = match grpc {
        Some(listener) => {
            let addr = listener.local_addr()?;
            let stop = parts.stop_serving.clone();
            let served = receiver.clone();
            parts.grpc = Some(tokio::spawn(async move {
                let until = async move { stop.cancelled().await };
                if let Err(error) = crate::grpc::serve_grpc(served, listener, until).await {
                    tracing::error!(%error, "the gRPC server stopped");
                }
            }));
            Some(addr)
        }
        None => None,
    };
    #[cfg(not(feature = "grpc"))]
    let grpc_addr = None;

    #[cfg(any(feature = "nats", feature = "amqp"))]
    start_brokers::<S>(
        Brokers {
            config: &config,
            database: &database,
            receiver: &receiver,
            #[cfg(feature = "nats")]
            jetstream,
            #[cfg(feature = "nats")]
            ack_wait,
            #[cfg(feature = "amqp")]
            amqp,
            issued: issued.as_ref(),
        },
        &responses,
        parts,
    )?;

    let directory = config.registry.clone().map(|registry| {
        let mut client = DirectoryClient::new(
            registry,
            Registration {
                service_id: config.service_id.clone(),
                base_url: url.clone(),
                hosts,
                calls,
                diagnostics_token: ops_token.clone(),
            },
        );
        if let Some(keys) = &issued {
            client = client.issued_keys(keys);
        }
        if lifecycle {
            client = client.lifecycle(outbox.lifecycle());
        }
        if let Some(publish) = publish {
            client = client.publish_on_registration(publish);
        }
        let (task, state) = client.spawn();
        parts.directory = Some(task);
        state
    });

    Ok(Started {
        receiver,
        url,
        local_addr,
        grpc_addr,
        router,
        directory,
    })
}

/// The backups of a SQLite service file, when `backup.directory` is set.
fn backups_of(
    config: &crate::Config,
    database: &Database,
    metrics: &Arc<crate::metrics::Metrics>,
) -> Result<Option<Backups>, HostError> {
    let file = match database {
        Database::Sqlite(path) => path.clone(),
        #[cfg(feature = "sqlx-sqlite")]
        Database::SqlxSqlite(store) => store.location().to_path_buf(),
        #[allow(unreachable_patterns)] // only PostgreSQL stores are left
        _ if config.backup.directory.is_none() => return Ok(None),
        #[allow(unreachable_patterns)]
        _ => {
            tracing::warn!(
                "backup.directory is ignored: a PostgreSQL database is backed up by its \
                 server's tools"
            );
            return Ok(None);
        }
    };
    if config.backup.directory.is_none() {
        // No folder is picked by default: see docs/operations.md, "Backups".
        tracing::info!(
            file = %file.display(),
            "scheduled backups are off: set backup.directory (RFIDL_BACKUP_DIRECTORY) to a \
             folder, preferably on another disk"
        );
        return Ok(None);
    }
    Ok(Some(Backups::new(
        file,
        &config.backup,
        Arc::clone(metrics),
    )?))
}

/// What a host's broker consumers start with.
#[cfg(any(feature = "nats", feature = "amqp"))]
pub(crate) struct Brokers<'a> {
    pub config: &'a crate::Config,
    pub database: &'a Database,
    pub receiver: &'a crate::receiver::Receiver,
    #[cfg(feature = "nats")]
    pub jetstream: Option<String>,
    #[cfg(feature = "nats")]
    pub ack_wait: Option<std::time::Duration>,
    #[cfg(feature = "amqp")]
    pub amqp: Option<String>,
    pub issued: Option<&'a crate::keys::IssuedKeys>,
}

/// The broker consumers of a host, on any store: JetStream's and AMQP's,
/// inbound and answers.
#[cfg(any(feature = "nats", feature = "amqp"))]
fn start_brokers<S: AnyStore>(
    brokers: Brokers<'_>,
    responses: &[Arc<S::Responder>],
    parts: &mut Parts,
) -> Result<(), HostError> {
    #[cfg(feature = "nats")]
    start_jetstream::<S>(&brokers, responses, parts)?;
    #[cfg(feature = "amqp")]
    start_amqp::<S>(&brokers, responses, parts)?;
    Ok(())
}

/// The consumer of `jetstream` into the receiver, and one answers consumer
/// per `nats://` destination, running `responses`.
#[cfg(feature = "nats")]
fn start_jetstream<S: AnyStore>(
    brokers: &Brokers<'_>,
    responses: &[Arc<S::Responder>],
    parts: &mut Parts,
) -> Result<(), HostError> {
    let Brokers {
        config,
        database,
        receiver,
        ack_wait,
        issued,
        ..
    } = *brokers;
    let jetstream = brokers.jetstream.clone();
    use crate::nats::{AnswersConsumer, JetStreamConsumer};

    if let Some(url) = jetstream {
        let mut consumer =
            JetStreamConsumer::builder(receiver.clone(), &url).durable(&config.service_id);
        if let Some(ack_wait) = ack_wait {
            consumer = consumer.ack_wait(ack_wait);
        }
        parts.consumer = Some(consumer.spawn()?);
    }
    for (name, destination) in &config.destinations {
        if !destination.url.starts_with("nats://") {
            continue;
        }
        let mut answers =
            AnswersConsumer::for_destination(config, name, At::<S>::new(database.clone()))?;
        for handler in responses {
            answers = answers.shared_responder(Arc::clone(handler));
        }
        if let Some(keys) = issued {
            answers = answers.issued_keys(keys);
        }
        if let Some(ack_wait) = ack_wait {
            answers = answers.ack_wait(ack_wait);
        }
        parts.answers.push(answers.spawn()?);
    }
    Ok(())
}

/// The consumer of `amqp` into the receiver, and one answers consumer per
/// AMQP destination, running `responses`.
#[cfg(feature = "amqp")]
fn start_amqp<S: AnyStore>(
    brokers: &Brokers<'_>,
    responses: &[Arc<S::Responder>],
    parts: &mut Parts,
) -> Result<(), HostError> {
    let Brokers {
        config,
        database,
        receiver,
        issued,
        ..
    } = *brokers;
    let amqp = brokers.amqp.clone();
    use crate::amqp::{AmqpAnswersConsumer, AmqpConsumer, AmqpUrl};

    if let Some(url) = amqp {
        parts.amqp_consumer = Some(AmqpConsumer::builder(receiver.clone(), &url).spawn()?);
    }
    for (name, destination) in &config.destinations {
        if !AmqpUrl::is_amqp(&destination.url) {
            continue;
        }
        let mut answers =
            AmqpAnswersConsumer::for_destination(config, name, At::<S>::new(database.clone()))?;
        for handler in responses {
            answers = answers.shared_responder(Arc::clone(handler));
        }
        if let Some(keys) = issued {
            answers = answers.issued_keys(keys);
        }
        parts.amqp_answers.push(answers.spawn()?);
    }
    Ok(())
}
