//! The service directory: which instance of which service runs where, the
//! interface versions it hosts and the ones it calls, and when it was last
//! seen (`docs/registry.md`, "Service directory").
//!
//! An instance is keyed by its service id and base URL; its id is the first
//! 16 hex digits of SHA-256(`service`, NUL, `base URL`), so a restarted
//! instance registers again under the same id. A registration replaces the
//! instance's interface lists (one `IMMEDIATE` transaction) and is refused,
//! with nothing stored, when it hosts a version or revision that is not
//! published (422 `unknown_interface`) or calls one that no active
//! registered provider ([`crate::liveness`]) hosts in the locked or a later
//! revision (409
//! `unsatisfied_dependencies`, the manifest scan; `POST /v1/deploy-check`
//! runs the same scan without registering).
//!
//! An instance is bound to the credential that first registered it
//! (`instance_owners`, the SHA-256 of the credential): a registration or
//! heartbeat of it with another credential is refused (403
//! `instance_owned`), except an identical re-registration once the owner's
//! credential is retired (how credentials rotate). Each registration has a
//! digest (hosts, calls, diagnostics token) that the answer gives and every
//! heartbeat carries back: a heartbeat whose digest is not the stored one is
//! answered 409 `registration_changed`, and the runtime registers again.
//!
//! Layout: the wire types and the instance id are here; `dependencies` is
//! the manifest scan, `instances` stores registrations and heartbeats,
//! `listing` reads `GET /v1/services`, `routes` holds the HTTP handlers.

mod dependencies;
mod instances;
mod listing;
mod routes;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

pub use dependencies::scan;
pub use instances::{Owner, Registered, heartbeat, register};
pub use listing::{InstanceEntry, LastHealth, ServiceEntry, services};
pub(crate) use routes::{
    check_service, serve_deploy_check, serve_deregister, serve_heartbeat, serve_register,
    serve_services,
};

/// Largest registration or deploy-check body.
pub const REGISTRATION_LIMIT: usize = 256 * 1024;
/// Largest heartbeat body (`{"registrationDigest": "sha256:…"}`).
pub const HEARTBEAT_LIMIT: usize = 1024;

/// One interface version at one revision, by its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterfaceRef {
    /// `package.Service`, e.g. `hr.employees.EmpService`.
    pub interface: String,
    /// The interface version (the `N` of `vN`).
    pub version: u32,
    /// `sha256:…` of the manifest revision.
    pub fingerprint: String,
}

/// The body of `POST /v1/services/{service}/instances`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registration {
    /// Where the instance serves its receiver and `/_rf/…` routes.
    pub base_url: String,
    /// The interface versions it provides.
    #[serde(default)]
    pub hosts: Vec<InterfaceRef>,
    /// The interface versions it sends to, at their locked fingerprints.
    #[serde(default)]
    pub calls: Vec<InterfaceRef>,
    /// The bearer token of its diagnostics routes, if it has one; the
    /// aggregator sends it. Stored, never served.
    #[serde(default)]
    pub diagnostics_token: Option<String>,
    /// How often it heartbeats, in milliseconds (100 to 3,600,000); it is
    /// gone after missing `--missed-heartbeats` of them
    /// ([`crate::liveness`]). Without it, the registry's
    /// `--heartbeat-interval`.
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
}

impl Registration {
    /// `sha256:<hex>` of what a registration says about the instance
    /// (hosts and calls, each sorted, and the diagnostics token): equal for
    /// equal registrations, whatever the order of the lists.
    pub fn digest(&self) -> String {
        fn sorted(list: &[InterfaceRef]) -> Vec<(&str, u32, &str)> {
            let mut list: Vec<(&str, u32, &str)> = list
                .iter()
                .map(|r| (r.interface.as_str(), r.version, r.fingerprint.as_str()))
                .collect();
            list.sort_unstable();
            list
        }
        let canonical = serde_json::json!([
            sorted(&self.hosts),
            sorted(&self.calls),
            self.diagnostics_token,
        ]);
        format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(canonical.to_string().as_bytes()))
        )
    }
}

/// The body of a heartbeat (optional: an empty body renews without the
/// check).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    /// The `registrationDigest` the registration was answered with.
    #[serde(default)]
    pub registration_digest: Option<String>,
}

/// The body of `POST /v1/deploy-check`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployCheck {
    /// The interface versions the service to deploy sends to, at their
    /// locked revisions; each must have an active provider.
    pub calls: Vec<InterfaceRef>,
}

/// A called interface version that no active provider satisfies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unmet {
    /// The called interface, `package.Service`.
    pub interface: String,
    /// The called interface version.
    pub version: u32,
    /// The revision the caller is locked to, `sha256:…`.
    pub fingerprint: String,
    /// `decommissioned`, `not_published`, `no_provider` or `older_provider`.
    pub reason: String,
    /// The reason in a sentence, with what to do about it.
    pub message: String,
}

/// The id of the instance of `service` at `base_url`.
pub fn instance_id(service: &str, base_url: &str) -> String {
    let mut hash = sha2::Sha256::new();
    hash.update(service.as_bytes());
    hash.update([0]);
    hash.update(base_url.as_bytes());
    hex::encode(&hash.finalize()[..8])
}
