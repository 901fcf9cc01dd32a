//! SQLite connection set-up and schema migrations.
//!
//! Owns the pragmas and the schema of the `outbox_messages` and
//! `inbox_messages` tables. Migrations are an ordered list of SQL scripts;
//! `PRAGMA user_version` records how many ran. A database written by a newer
//! schema than this binary knows is refused, never altered.
//!
//! Times are stored as INTEGER milliseconds since the Unix epoch (UTC): compact,
//! indexable, and compared without parsing.
//!
//! One file per job: `connection` (open and pragmas), `migrations` (the
//! schema as data), `preflight` (the checks before a write), `dispatch`
//! (claims, results, leases), `diagnostics` (the operators' queries).

mod connection;
pub(crate) mod diagnostics;
pub(crate) mod dispatch;
mod migrations;
mod preflight;
#[cfg(test)]
mod tests;

pub use connection::{BUSY_TIMEOUT, configure, open};
pub use migrations::MIGRATIONS;
pub(crate) use migrations::{attention, outbox_seq};
pub use preflight::preflight;

pub(crate) use super::now_ms;
