//! The registry's lifecycle commands to provider instances
//! (`rfidl_runtime::lifecycle`): when an interface version is decommissioned
//! or re-commissioned, and when a provider of a decommissioned version
//! registers, the registry sends each provider instance of it a signed
//! `Decommission` / `Recommission` command of `rfidl.control.Lifecycle` v2.
//! Each command names the instance it is for (its instance id and base URL,
//! [`Target`]) and the version's generation
//! ([`crate::decommission::generation`]): the provider refuses one
//! addressed to another instance (422 `wrong_target`) or older than the
//! state it holds (422 `stale_command`), and the outbox dead-letters such a
//! refusal. A copy that a fake registered instance receives is thus of no
//! use against a real one.
//!
//! The commands go through the runtime's ordinary outbox and dispatcher, on
//! a SQLite file of their own next to the registry's database (a command is
//! written before the HTTP answer says it was sent, and retried with backoff
//! until the instance acknowledges it or its TTL runs out). The source id is
//! [`rfidl_runtime::lifecycle::DEFAULT_REGISTRY_SOURCE`], each request is
//! signed with the one command secret every provider lists under that
//! source in its `peers`. The destination of a command is the instance's
//! base URL, routed by [`DispatcherBuilder::route_by`](rfidl_runtime::dispatcher::DispatcherBuilder::route_by):
//! instances come and go, and a command still waiting after a restart of
//! the registry knows where to go.
//!
//! The registry database and the command outbox are two files: a
//! decommission is committed first, then its commands are written. If that
//! write fails, the answer is 503 and repeating the request (idempotent:
//! the provider applies a command for a state it is in already as a no-op)
//! sends them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rfidl_runtime::dispatcher::{Dispatcher, DispatcherHandle, Route};
use rfidl_runtime::lifecycle;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{Config, MessageType};

/// A provider instance a command is addressed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The id the registry assigned it at registration.
    pub instance_id: String,
    /// Where the command is sent.
    pub base_url: String,
}

/// How often the command dispatcher looks for new destinations (instances):
/// a command to an instance with no command waiting yet leaves within this
/// time. One index look-up per round on a small file.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);

/// Sends lifecycle commands to provider instances. Cheap to clone.
#[derive(Clone)]
pub struct CommandSender {
    outbox: Outbox,
    dispatcher: Arc<Mutex<Option<DispatcherHandle>>>,
}

impl std::fmt::Debug for CommandSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandSender")
            .field("outbox", &self.outbox)
            .finish_non_exhaustive()
    }
}

/// Why the command sender could not start.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The dispatcher of the command outbox did not start.
    #[error("command outbox: {0}")]
    Dispatcher(#[from] rfidl_runtime::dispatcher::DispatcherError),
    /// The command outbox's SQLite file could not be opened or migrated.
    #[error("command outbox: {0}")]
    Db(#[from] rfidl_runtime::store::StoreError),
}

impl CommandSender {
    /// Starts the command outbox in the SQLite file `db` (created if
    /// missing) and its dispatcher, signing with `secret`. Call on a tokio
    /// runtime.
    pub fn start(db: &Path, secret: Secret) -> Result<Self, CommandError> {
        Self::start_with(db, secret, DEFAULT_POLL)
    }

    /// [`start`](Self::start) with another poll interval (how soon a command
    /// to an instance that has no waiting command yet is picked up; tests).
    pub fn start_with(db: &Path, secret: Secret, poll: Duration) -> Result<Self, CommandError> {
        let mut config = Config::for_service(lifecycle::DEFAULT_REGISTRY_SOURCE);
        config.outbox.poll_interval = poll;
        // Create and migrate the file before the dispatcher opens it.
        drop(rfidl_runtime::store::sqlite::open(
            db,
            config.outbox.durability,
        )?);
        let timeout = config.outbox.request_timeout;
        let outbox = Outbox::new(config, db);
        let routes: Mutex<HashMap<String, Route>> = Mutex::new(HashMap::new());
        let dispatcher = Dispatcher::builder(&outbox)
            .route_by(move |base_url| {
                let mut routes = routes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(route) = routes.get(base_url) {
                    return Some(route.clone());
                }
                let transport = match HttpTransport::new(base_url, timeout) {
                    Ok(transport) => transport,
                    Err(error) => {
                        tracing::warn!(%base_url, %error, "cannot reach this instance for commands");
                        return None;
                    }
                };
                let route = Route {
                    transport: Arc::new(transport),
                    secrets: vec![secret.clone()],
                };
                routes.insert(base_url.to_owned(), route.clone());
                Some(route)
            })
            .start()?;
        Ok(Self {
            outbox,
            dispatcher: Arc::new(Mutex::new(Some(dispatcher))),
        })
    }

    /// Writes `command` for `interface` `version` at `generation` to each
    /// of `instances`, each copy naming its instance. Returns how many it
    /// wrote.
    pub async fn send(
        &self,
        instances: &[Target],
        interface: &str,
        version: u32,
        generation: u64,
        command: lifecycle::Command,
    ) -> Result<usize, rfidl_runtime::outbox::OutboxError> {
        let endpoint = command.endpoint();
        for target in instances {
            let payload = serde_json::to_value(lifecycle::CommandPayload {
                interface: interface.to_owned(),
                version,
                instance_id: target.instance_id.clone(),
                base_url: target.base_url.clone(),
                generation,
            })?;
            let base_url = &target.base_url;
            let id = self
                .outbox
                .send(OutgoingMessage {
                    destination: base_url.clone(),
                    message_type: MessageType::Command,
                    interface: lifecycle::INTERFACE.to_owned(),
                    version: lifecycle::VERSION,
                    fingerprint: lifecycle::FINGERPRINT.to_owned(),
                    endpoint: endpoint.to_owned(),
                    correlation_id: None,
                    payload,
                    headers: Default::default(),
                    max_retries: None,
                    ttl: None,
                    deliver_at: None,
                })
                .await?;
            tracing::info!(
                %base_url,
                instance = %target.instance_id,
                %interface,
                version,
                generation,
                endpoint,
                message_id = %id,
                "lifecycle command written"
            );
        }
        Ok(instances.len())
    }

    /// Stops the dispatcher (in-flight commands finish first).
    pub async fn shutdown(&self) {
        let handle = self
            .dispatcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(handle) = handle {
            handle.shutdown().await;
        }
    }
}

/// The registered instances that host `interface` `version`.
pub fn providers(
    conn: &rusqlite::Connection,
    interface: &str,
    version: u32,
) -> rusqlite::Result<Vec<Target>> {
    let mut statement = conn.prepare_cached(
        "SELECT DISTINCT i.instance_id, i.base_url FROM instances i \
         JOIN instance_interfaces h ON h.instance_id = i.instance_id \
         WHERE h.role = 'hosts' AND h.interface = ?1 AND h.version = ?2 \
         ORDER BY i.base_url, i.instance_id",
    )?;
    statement
        .query_map(rusqlite::params![interface, version], |row| {
            Ok(Target {
                instance_id: row.get(0)?,
                base_url: row.get(1)?,
            })
        })?
        .collect()
}
