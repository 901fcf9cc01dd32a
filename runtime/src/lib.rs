//! `rfidl-runtime`: reliable messaging for services generated from `.rfidl` contracts.
//!
//! * [`outbox`]: messages are written to the outbox in the caller's own
//!   transaction, so a business change and its message commit or roll back
//!   together. The outbox and inbox live in SQLite (the embedded default) or
//!   PostgreSQL (feature `postgres`, for replicas): see [`store`].
//! * [`dispatcher`]: a tokio task claims due outbox rows with a fenced lease,
//!   signs and sends them, and applies backoff, TTL and dead-lettering.
//! * [`receiver`]: an axum router verifies signatures, de-duplicates
//!   on the inbox and runs the handler and the inbox insert in one transaction,
//!   which makes processing exactly-once.
//! * [`signing`]: Standard Webhooks HMAC-SHA256.
//! * [`retention`]: the scheduled clean-up of sent outbox rows and expired
//!   inbox rows; [`diagnostics`]: health, statistics, the failed list, manual
//!   retry and `/_rf/metrics` for operators.
//! * [`Host`]: all of the above for one service, started from a config, a
//!   database and the generated handlers, served on one listener and
//!   stopped in order on SIGTERM/SIGINT (or a token) within a bound.
//! * [`trace`]: the W3C `traceparent` each message carries in its envelope
//!   headers, and the `tracing` spans `enqueue`, `dispatch`, `receive` and
//!   `handler` that carry its trace id.
//!
//! The runtime never depends on the code generator; generated code depends on it.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub mod amqp;
// Shared with rfidl-registry (one bearer-token parser for both); not API.
#[doc(hidden)]
pub mod auth;
pub mod backup;
#[cfg(any(feature = "nats", feature = "amqp"))]
mod broker;
mod chain;
mod circuit;
pub mod config;
pub mod diagnostics;
pub mod directory;
pub mod dispatcher;
pub mod duration;
pub mod envelope;
pub mod failures;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
pub mod host;
mod inbox;
pub mod keys;
pub mod lifecycle;
mod liveness;
pub mod metrics;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
pub mod outbox;
pub mod receiver;
mod redact;
pub mod responses;
pub mod retention;
mod sched;
pub mod serve;
pub mod signing;
pub mod store;
pub mod trace;
pub mod transport;
pub mod types;

// Re-exported for generated code, so user crates need no direct dependency.
pub use rusqlite;
pub use serde;
pub use serde_json;

// What a hello-world needs, at the root; the rest in the modules.
pub use config::{Config, Durability};
pub use diagnostics::Diagnostics;
pub use dispatcher::Dispatcher;
pub use envelope::{Envelope, MessageType};
pub use host::Host;
pub use outbox::{Outbox, OutboxError, OutgoingMessage};
pub use receiver::{HandlerError, IncomingCall, Receiver};
pub use retention::Retention;
pub use serve::serve;
pub use signing::Secret;
pub use store::{AnyStore, AsyncStore, Database, Sqlite, Store};

/// A boxed future that can move between threads: what the async handler
/// traits return (generated code boxes each `async fn` into one).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Includes the code that `rfidl_codegen::Builder` generated for one contract
/// package into the current module, e.g. inside `pub mod employees { … }`:
///
/// ```ignore
/// pub mod hr {
///     pub mod employees {
///         rfidl_runtime::include_contract!("hr.employees");
///     }
/// }
/// ```
///
/// Types from other packages are referred to through `super::` paths, so nest
/// modules like the package names (or use [`include_contracts!`], which does it
/// for you).
#[macro_export]
macro_rules! include_contract {
    ($package:literal) => {
        include!(concat!(env!("OUT_DIR"), "/", $package, ".rs"));
    };
}

/// Includes every package the build script generated, nested by package name
/// (`hr.employees` becomes `hr::employees`).
#[macro_export]
macro_rules! include_contracts {
    () => {
        include!(concat!(env!("OUT_DIR"), "/rfidl_contracts.rs"));
    };
}
