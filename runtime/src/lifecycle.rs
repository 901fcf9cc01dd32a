//! Decommissioned interface versions on the provider side (plan §6.2,
//! `docs/registry.md` "Decommissioning a version").
//!
//! The registry retires an interface version by sending every provider
//! instance of it a signed command of the control interface
//! [`INTERFACE`] `v1` (`Decommission {interface, version}`, and
//! `Recommission {interface, version}` to bring it back), through its own
//! outbox and the ordinary wire. A receiver built with
//! [`ReceiverBuilder::lifecycle`](crate::receiver::ReceiverBuilder::lifecycle)
//! hosts that interface by itself; the command is verified like any message
//! (source [`DEFAULT_REGISTRY_SOURCE`] with a `peers` secret), accepted only
//! from the registry's source id, and processed exactly once through the
//! inbox. In the command's transaction:
//!
//! * `Decommission` records the version in `rf_decommissioned` and **holds**
//!   its `Pending` outbox rows: they stay `Pending`, with `last_error`
//!   `held: <interface> v<version> is decommissioned` and the due time
//!   [`HELD_DUE_MS`], which no claim reaches and which the TTL expiry of the
//!   retention task skips. Nothing is lost.
//! * `Recommission` deletes the record and makes the held rows due now, their
//!   `expires_at` moved on by the time they were held.
//!
//! The dispatcher keeps the set of decommissioned versions in memory
//! ([`Lifecycle`], shared by the outbox, the dispatcher and the receiver):
//! a row of a decommissioned version that is claimed later (enqueued after
//! the command, or back from a failed attempt) is held instead of sent. The
//! set is read from the database when the dispatcher starts and again on
//! every discovery round (every `outbox.poll_interval`), so replicas on one
//! PostgreSQL database, and a transaction that rolled back after its handler
//! updated the set, agree with the table within one poll interval (a refresh
//! read before the handler's update is dropped, not applied over it). A held
//! row is checked against the table when it is recorded, so a stale set can
//! delay a row, never strand it. No claim
//! joins the table: the hot path costs one look-up in an empty map.
//!
//! The receiver answers a message for a decommissioned version 410
//! `version_decommissioned` (with `Retry-After`), before the inbox is
//! touched; `GET /_rf/health` lists the versions and their held rows.
//!
//! **A command is bound to its target.** Its payload names the instance the
//! registry addressed (`instanceId`, the id the registry assigned at
//! registration, and `baseUrl`) and carries the registry's **generation**
//! of that interface version (it grows with every decommission and
//! re-commission). An instance learns its id when it registers
//! ([`DirectoryClient::lifecycle`](crate::directory::DirectoryClient::lifecycle),
//! or [`Lifecycle::bind_instance`]) and refuses, for good (422, the
//! registry's outbox dead-letters it):
//!
//! * a command addressed to another instance: [`WRONG_TARGET`] (a copy a
//!   fake registered instance received and replays here);
//! * a command whose generation is older than the one it applied last for
//!   that version, or equal to it with the other command:
//!   [`STALE_COMMAND`] (a captured `Decommission` replayed after the
//!   re-commission). The applied generation is stored in
//!   `rf_lifecycle_applied` in the command's transaction, so it survives a
//!   restart.
//!
//! Before it knows its id, an instance answers a command 500
//! `handler_failed` (the registry retries): it registers at start-up, and
//! the registry sends commands only to registered instances.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::receiver::{HandlerError, HostedInterface, HostedService, IncomingCall};
use crate::store::Store;

/// The control interface every receiver with a lifecycle hosts.
pub const INTERFACE: &str = "rfidl.control.Lifecycle";
/// Its version. v2 binds each command to its target instance and carries
/// the registry's generation (a v1 command could be replayed against any
/// instance); no receiver hosts v1 any more.
pub const VERSION: u32 = 2;
/// Endpoint: stop dispatching a version, answer its routes 410.
pub const DECOMMISSION: &str = "Decommission";
/// Endpoint: undo [`DECOMMISSION`]; held rows become due.
pub const RECOMMISSION: &str = "Recommission";
/// The source id the registry sends lifecycle commands as (its
/// `sourceServiceId`); a provider configures a `peers` secret for it.
pub const DEFAULT_REGISTRY_SOURCE: &str = "rfidl-registry";
/// `next_retry_at` of a held outbox row: far beyond any clock (about the
/// year 146 million), yet far from `i64` overflow when added to.
pub const HELD_DUE_MS: i64 = 1 << 62;
/// The error code of a command addressed to another instance (422).
pub const WRONG_TARGET: &str = "wrong_target";
/// The error code of a command older than the state it would change (422).
pub const STALE_COMMAND: &str = "stale_command";
/// The canonical manifest of [`INTERFACE`] v2.
pub const MANIFEST_JSON: &str = r#"{"interface":"rfidl.control.Lifecycle","version":2,"methods":[{"name":"Decommission","kind":"Command","params":[{"name":"interface","type":"string"},{"name":"version","type":"u32"},{"name":"instanceId","type":"string"},{"name":"baseUrl","type":"string"},{"name":"generation","type":"u64"}]},{"name":"Recommission","kind":"Command","params":[{"name":"interface","type":"string"},{"name":"version","type":"u32"},{"name":"instanceId","type":"string"},{"name":"baseUrl","type":"string"},{"name":"generation","type":"u64"}]}]}"#;
/// `sha256:` of [`MANIFEST_JSON`] (checked by a unit test).
pub const FINGERPRINT: &str =
    "sha256:c110916f59117f82afb7bb0922f975125ffc639da5eb59c95c879eca645d6405";

/// The hosted interface of the control service.
pub const HOSTED: HostedInterface = HostedInterface {
    interface: INTERFACE,
    version: VERSION,
    fingerprint: FINGERPRINT,
    endpoints: &[DECOMMISSION, RECOMMISSION],
    manifest_json: MANIFEST_JSON,
};

/// A lifecycle command: the endpoint of [`INTERFACE`] v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop dispatching a version, hold its rows, answer its routes 410.
    Decommission,
    /// Undo it: the held rows become due.
    Recommission,
}

impl Command {
    /// The endpoint name on the wire.
    pub fn endpoint(self) -> &'static str {
        match self {
            Command::Decommission => DECOMMISSION,
            Command::Recommission => RECOMMISSION,
        }
    }
}

/// `last_error` of a held row.
pub fn held_reason(interface: &str, version: u32) -> String {
    format!("held: {interface} v{version} is decommissioned")
}

/// The payload of both commands: which version, for which instance, at
/// which generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CommandPayload {
    /// The interface to decommission or re-commission, `package.Service`.
    pub interface: String,
    /// Its version; the other versions of the interface are not touched.
    pub version: u32,
    /// The instance the registry addressed: the id it assigned at
    /// registration.
    pub instance_id: String,
    /// That instance's base URL as the registry knows it (shown in
    /// refusals; the id is what is compared).
    pub base_url: String,
    /// The registry's generation of this interface version: larger for
    /// every later decommission or re-commission.
    pub generation: u64,
}

/// The decommissioned versions this process knows of, shared by the outbox,
/// its dispatcher and the receiver. Cheap to clone; every clone is the same
/// set.
#[derive(Clone, Default)]
pub struct Lifecycle {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// interface → version → decommissioned at (ms).
    versions: RwLock<BTreeMap<String, BTreeMap<u32, i64>>>,
    /// Wakes the dispatcher after a re-commission.
    wake: Mutex<Option<Arc<Notify>>>,
    /// Counts the handler's changes, so that a refresh read before a change
    /// committed does not undo it ([`Lifecycle::replace_since`]).
    generation: std::sync::atomic::AtomicU64,
    /// The id the registry assigned this instance; commands for another
    /// are refused.
    instance: RwLock<Option<String>>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("decommissioned", &self.decommissioned())
            .finish()
    }
}

impl Lifecycle {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the lifecycle the id the registry assigned this instance (the
    /// `instanceId` of the registration's answer): commands addressed to
    /// another id are refused [`WRONG_TARGET`]. A later call (the instance
    /// registered again) replaces it.
    /// [`DirectoryClient::lifecycle`](crate::directory::DirectoryClient::lifecycle)
    /// calls it on every accepted registration.
    pub fn bind_instance(&self, instance_id: impl Into<String>) {
        let instance_id = instance_id.into();
        if let Ok(mut slot) = self.inner.instance.write()
            && slot.as_deref() != Some(instance_id.as_str())
        {
            tracing::info!(instance = %instance_id, "lifecycle commands bound to this instance id");
            *slot = Some(instance_id);
        }
    }

    /// The instance id commands must name, once known.
    pub fn instance(&self) -> Option<String> {
        self.inner
            .instance
            .read()
            .ok()
            .and_then(|slot| slot.clone())
    }

    /// Whether `interface` `version` is decommissioned. One read lock and
    /// one look-up in a (usually empty) map.
    pub fn is_decommissioned(&self, interface: &str, version: u32) -> bool {
        let Ok(versions) = self.inner.versions.read() else {
            return false;
        };
        !versions.is_empty()
            && versions
                .get(interface)
                .is_some_and(|v| v.contains_key(&version))
    }

    /// Every decommissioned version with the time it was decommissioned (ms).
    pub fn decommissioned(&self) -> Vec<(String, u32, i64)> {
        let Ok(versions) = self.inner.versions.read() else {
            return Vec::new();
        };
        versions
            .iter()
            .flat_map(|(interface, v)| {
                v.iter()
                    .map(|(version, at)| (interface.clone(), *version, *at))
            })
            .collect()
    }

    /// The change count, read before a refresh reads the database.
    pub(crate) fn generation(&self) -> u64 {
        self.inner
            .generation
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// [`replace`](Self::replace), unless the handler changed the set since
    /// `seen` (then the rows may predate that change's commit; the next
    /// refresh reconciles).
    pub(crate) fn replace_since(&self, rows: Vec<(String, u32, i64)>, seen: u64) {
        if self.generation() == seen {
            self.replace(rows);
        }
    }

    /// Replaces the set with what the database holds.
    pub(crate) fn replace(&self, rows: Vec<(String, u32, i64)>) {
        let mut fresh: BTreeMap<String, BTreeMap<u32, i64>> = BTreeMap::new();
        for (interface, version, at) in rows {
            fresh.entry(interface).or_default().insert(version, at);
        }
        let released = if let Ok(mut versions) = self.inner.versions.write() {
            let released = versions.iter().any(|(i, v)| {
                v.keys()
                    .any(|version| !fresh.get(i).is_some_and(|f| f.contains_key(version)))
            });
            *versions = fresh;
            released
        } else {
            false
        };
        if released {
            self.wake();
        }
    }

    /// Marks (`Some(at)`) or unmarks one version.
    pub(crate) fn set(&self, interface: &str, version: u32, at: Option<i64>) {
        self.inner
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if let Ok(mut versions) = self.inner.versions.write() {
            match at {
                Some(at) => {
                    versions
                        .entry(interface.to_owned())
                        .or_default()
                        .insert(version, at);
                }
                None => {
                    if let Some(v) = versions.get_mut(interface) {
                        v.remove(&version);
                        if v.is_empty() {
                            versions.remove(interface);
                        }
                    }
                }
            }
        }
        if at.is_none() {
            self.wake();
        }
    }

    /// Wakes this dispatcher when held rows become due.
    pub(crate) fn set_wake(&self, wake: Arc<Notify>) {
        if let Ok(mut slot) = self.inner.wake.lock() {
            *slot = Some(wake);
        }
    }

    fn wake(&self) {
        if let Ok(slot) = self.inner.wake.lock()
            && let Some(wake) = slot.as_ref()
        {
            wake.notify_one();
        }
    }
}

/// The control service: hosts [`INTERFACE`] v2 on a receiver built with
/// [`ReceiverBuilder::lifecycle`](crate::receiver::ReceiverBuilder::lifecycle).
pub struct LifecycleService {
    lifecycle: Lifecycle,
    registry: String,
}

impl LifecycleService {
    /// Accepts commands from the source id `registry` only.
    pub fn new(lifecycle: Lifecycle, registry: impl Into<String>) -> Self {
        Self {
            lifecycle,
            registry: registry.into(),
        }
    }

    /// Checks the source, decodes the payload and checks that it is
    /// addressed to this instance: which command, for what, at which
    /// generation (as stored).
    pub(crate) fn command(
        &self,
        call: &IncomingCall<'_>,
    ) -> Result<(Command, CommandPayload, i64), HandlerError> {
        if call.source != self.registry {
            return Err(HandlerError::poison(format!(
                "lifecycle commands are accepted from the registry (`{}`) only, not from `{}`",
                self.registry, call.source
            )));
        }
        let command = match call.endpoint {
            DECOMMISSION => Command::Decommission,
            RECOMMISSION => Command::Recommission,
            other => return Err(HandlerError::unknown_endpoint(other)),
        };
        let target: CommandPayload = crate::receiver::decode_payload(call.payload)?;
        if target.interface.is_empty() || target.version == 0 {
            return Err(HandlerError::payload_mismatch(
                "`interface` must be non-empty and `version` at least 1",
            ));
        }
        let generation = i64::try_from(target.generation)
            .ok()
            .filter(|g| *g >= 1)
            .ok_or_else(|| {
                HandlerError::payload_mismatch("`generation` must be from 1 to 2^63 - 1")
            })?;
        if target.interface == INTERFACE {
            return Err(HandlerError::poison(format!(
                "the control interface `{INTERFACE}` cannot be decommissioned"
            )));
        }
        match self.lifecycle.instance() {
            None => Err(HandlerError::retryable(format!(
                "this instance does not know its instance id yet (it is not registered with the \
                 registry), so it cannot check that this command for `{}` ({}) is its own; \
                 retry once it is registered",
                target.instance_id, target.base_url
            ))),
            Some(own) if own != target.instance_id => Err(HandlerError::refused(
                WRONG_TARGET,
                format!(
                    "this {} of {} v{} is addressed to instance `{}` ({}), not to this \
                     instance `{own}`: a lifecycle command is applied only by the instance the \
                     registry sent it to",
                    command.endpoint(),
                    target.interface,
                    target.version,
                    target.instance_id,
                    target.base_url
                ),
            )),
            Some(_) => Ok((command, target, generation)),
        }
    }

    /// The refusal of a command that is not newer than `applied`, the last
    /// one applied for its version.
    pub(crate) fn stale(
        command: Command,
        target: &CommandPayload,
        applied: Option<(i64, String)>,
    ) -> HandlerError {
        let held = applied.map_or_else(
            || "a newer command".to_owned(),
            |(generation, endpoint)| format!("`{endpoint}` at generation {generation}"),
        );
        HandlerError::refused(
            STALE_COMMAND,
            format!(
                "`{}` of {} v{} carries generation {}, but this instance applied {held}: a \
                 command older than the state it holds is refused",
                command.endpoint(),
                target.interface,
                target.version,
                target.generation
            ),
        )
    }

    /// Updates the set and answers; `at` is when the version was
    /// decommissioned (for a decommission), `rows` how many rows were held
    /// or released.
    pub(crate) fn done(
        &self,
        command: Command,
        target: &CommandPayload,
        at: i64,
        rows: u64,
    ) -> serde_json::Value {
        // Set before the commit (a handler has no after-commit hook): a
        // rollback is corrected by the dispatcher's next refresh.
        let decommissioned = command == Command::Decommission;
        self.lifecycle.set(
            &target.interface,
            target.version,
            decommissioned.then_some(at),
        );
        tracing::info!(
            interface = %target.interface,
            version = target.version,
            generation = target.generation,
            decommissioned,
            rows,
            "lifecycle command processed"
        );
        serde_json::json!({
            "interface": target.interface,
            "version": target.version,
            "generation": target.generation,
            "decommissioned": decommissioned,
            if decommissioned { "held" } else { "released" }: rows,
        })
    }
}

impl<S: Store> HostedService<S> for LifecycleService {
    fn interfaces(&self) -> &[HostedInterface] {
        std::slice::from_ref(&HOSTED)
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        mut tx: S::Handle<'_, '_>,
    ) -> Result<serde_json::Value, HandlerError> {
        let (command, target, generation) = self.command(call)?;
        let now = crate::store::now_ms();
        let (interface, version) = (target.interface.as_str(), target.version);
        let applied = Applied {
            interface,
            version,
            generation,
            command: command.endpoint(),
            at: now,
        };
        if let Some(newer) = S::record_applied(&mut tx, &applied)? {
            return Err(Self::stale(command, &target, Some(newer)));
        }
        if command == Command::Decommission {
            let (at, held) = S::hold_version(
                &mut tx,
                interface,
                version,
                now,
                &held_reason(interface, version),
            )?;
            Ok(self.done(command, &target, at, held))
        } else {
            let released = S::release_version(
                &mut tx,
                interface,
                version,
                now,
                &format!("released: {interface} v{version} was re-commissioned"),
            )?;
            Ok(self.done(command, &target, now, released))
        }
    }
}

/// A lifecycle command as `rf_lifecycle_applied` records it.
pub(crate) struct Applied<'a> {
    pub interface: &'a str,
    pub version: u32,
    pub generation: i64,
    /// The command's endpoint (`Decommission`, `Recommission`).
    pub command: &'a str,
    pub at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;

    #[test]
    fn the_fingerprint_is_the_manifests() {
        let digest = hex::encode(sha2::Sha256::digest(MANIFEST_JSON.as_bytes()));
        assert_eq!(FINGERPRINT, format!("sha256:{digest}"));
    }

    #[test]
    fn the_held_due_time_is_the_one_the_expiry_statements_skip() {
        // The stores' expiry statements (store/*/retention.rs) spell it out.
        assert_eq!(HELD_DUE_MS, 4_611_686_018_427_387_904);
    }

    #[test]
    fn the_set_marks_unmarks_and_replaces() {
        let set = Lifecycle::new();
        assert!(!set.is_decommissioned("a.B", 1));
        set.set("a.B", 1, Some(5));
        assert!(set.is_decommissioned("a.B", 1));
        assert!(!set.is_decommissioned("a.B", 2));
        set.replace(vec![("c.D".into(), 2, 7)]);
        assert!(!set.is_decommissioned("a.B", 1));
        assert_eq!(set.decommissioned(), vec![("c.D".to_owned(), 2, 7)]);
        set.set("c.D", 2, None);
        assert!(set.decommissioned().is_empty());
        // A refresh read before the handler's change does not undo it.
        let seen = set.generation();
        set.set("e.F", 1, Some(9));
        set.replace_since(Vec::new(), seen);
        assert!(set.is_decommissioned("e.F", 1));
        set.replace_since(Vec::new(), set.generation());
        assert!(!set.is_decommissioned("e.F", 1));
    }
}
