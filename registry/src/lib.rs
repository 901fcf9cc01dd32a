//! `rfidl-registry`: a server that stores versioned, immutable interface
//! manifests (`docs/registry.md`).
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let registry = rfidl_registry::Registry::open("registry.db".as_ref())?
//!     .publish_token("s3cret")
//!     .registration_token("hr-s3cret")
//!     .operator_token("op-s3cret");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7300").await?;
//! rfidl_runtime::serve(listener, registry.router()).await?;
//! # Ok(()) }
//! ```
//!
//! Order of checks on `PUT /v1/interfaces/{interface}/v{version}`: token
//! (401) → body size (413) → the body is a manifest (422
//! `invalid_manifest`) → it is the interface version the path names (422
//! `path_mismatch`) → its fingerprint matches its content (422
//! `fingerprint_mismatch`) → it is a manifest a contract could produce
//! (422 `manifest_rejected`, with the `M0001`… problems) → stored already (200) / first revision (201) /
//! a compatible next revision (201) / a breaking one (409
//! `breaking_change`, with the changes). Every error body is
//! `{"error": code, "message": text}`. SQLite runs on the blocking pool.
//!
//! Reads answer `ETag`s and honour `If-None-Match` (304, [`conditional`]);
//! `POST /v1/compatibility/…` runs a publish's checks and stores nothing;
//! `/livez` and `/readyz` are the probes.
//! Nothing is stored for a refused publish.
//!
//! Layout, one job per file: `server` ([`Registry`], its settings and the
//! health round), `router` (the route table), `error` ([`ApiError`]),
//! `publish` and `routes` (writes and reads of manifests), [`store`] (the
//! SQLite file), [`access`] (credentials, networks, rate limit),
//! [`directory`] and [`liveness`] (registered instances), [`aggregator`]
//! and [`rollup`] (their health), `dashboard` (`GET /`), [`decommission`]
//! and [`commands`] (retired versions), [`keys`] (issued keys),
//! [`conditional`] (`ETag`s), `session` and `failures` (the dashboard's
//! sign-in, retries and discards), [`throughput`] (send rates and latency).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod access;
pub mod aggregator;
pub mod commands;
pub mod conditional;
mod dashboard;
pub mod decommission;
pub mod directory;
mod error;
mod failures;
pub mod keys;
pub mod liveness;
mod publish;
pub mod rollup;
mod router;
mod routes;
mod server;
mod session;
pub mod store;
pub mod throughput;

pub use error::ApiError;
pub use server::Registry;
pub use store::StoreError;

pub(crate) use publish::{read_body, verified_manifest, version_of};
pub(crate) use server::{Shared, authorize, now_ms, with_db};

/// Largest manifest accepted by a publish.
pub const BODY_LIMIT: usize = 1024 * 1024;
