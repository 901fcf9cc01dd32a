//! Diagnostics: what an operator asks a running service, as an axum router.
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /_rf/health` | traffic light `healthy` / `warning` / `critical` with its reasons and the outbox counts |
//! | `GET /_rf/outbox/stats` | rows per status, per destination, oldest pending age, last send |
//! | `GET /_rf/outbox/failed` | messages that need a human (`Failed`, `DeadLetter`, `Expired`), metadata only, filtered and paged by an opaque cursor bound to the filter |
//! | `GET /_rf/outbox/failed/groups` | the same messages counted per destination and error code, with the oldest and newest |
//! | `POST /_rf/outbox/{messageId}/retry` | puts one such message back to `Pending` |
//! | `POST /_rf/outbox/retry` | the same for every one matching `?status=` and `?destination=` |
//! | `POST /_rf/outbox/{messageId}/discard` | puts one such message aside: `Discarded`, deleted by retention after `outbox.failed_retention` |
//! | `POST /_rf/outbox/discard` | the same for every one matching `?status=` and `?destination=` |
//! | `POST /_rf/backup` | writes a backup of the SQLite file now ([`crate::backup`]): its name and size; 409 `backup_running` while one is written |
//! | `GET /_rf/inbox/stats` | inbox size, processed and duplicate counts, duplicate rate |
//! | `GET /_rf/metrics` | Prometheus text format ([`crate::metrics`]) |
//! | `GET /_rf/livez` | 200 while the process answers (no token needed) |
//! | `GET /_rf/readyz` | 200 when the database takes a write transaction, its schema is current and the dispatcher and receiver writer run; else 503 naming what failed (no token needed) |
//!
//! Payloads are never shown (they may hold personal data): the failed list
//! gives ids, routing, status, retries and the last error. Errors have the
//! wire's body `{"error": code, "message": text}` with the codes of
//! [`DiagnosticsError`]. Set [`DiagnosticsBuilder::bearer_token`] to require
//! `Authorization: Bearer <token>` on every route ([`crate::auth`]: any case
//! of the scheme; an empty token refuses everything); without it, the routes
//! that change state (the retries, discards and backups) answer 403 `token_required` and the
//! read-only ones answer anyone, so serve the router on an internal address
//! only.
//!
//! Every query runs on the blocking pool against one connection of its own,
//! and reads only through the partial indexes of [`crate::store::sqlite`], so a large
//! table of `Sent` rows does not slow the health check down.
//!
//! **Both stores.** [`Diagnostics::builder`] serves a SQLite file or a
//! PostgreSQL database (cargo feature `postgres`). The statements sit behind
//! a store trait (`DiagnosticsStore`, in `store/sqlite/diagnostics.rs` and
//! `store/postgres/diagnostics.rs`) that returns raw rows; what the routes
//! make of them (the counts, the gauges, the filters, the retry errors) is
//! written once, above it.
//!
//! One file per job:
//!
//! | module | owns | never |
//! | --- | --- | --- |
//! | `types` | the answers, the filter, [`DiagnosticsError`], the raw rows a store returns | runs a query |
//! | `health` | the folding of rows into counts and gauges, the traffic light | touches a database |
//! | `listing` | the list's filter as a store applies it, its cursor, error codes and groups | runs a query |
//! | `queries` | the `DiagnosticsStore` trait and the operations over it | holds store-specific SQL |
//! | `sqlite` | the SQLite statements and readiness checks | folds or decides |
//! | `routes` | [`Diagnostics`], its builder, the router and handlers | writes SQL |
//! | `access` | the bearer-token middleware | reads the database |
//! | `backup` | `POST /_rf/backup` | writes the service's file |
//! | `readiness` | `livez` / `readyz` | needs a token |

mod access;
mod backup;
mod health;
mod listing;
mod queries;
mod readiness;
mod routes;

mod types;

pub use crate::store::sqlite::diagnostics::database_checks;
pub use health::{health, with_decommissioned, with_destinations};
pub(crate) use listing::{ErrorGroupRow, RowFilter};
pub use listing::{FailureGroup, error_code};
pub(crate) use queries::DiagnosticsStore;
pub use queries::{
    attention_messages, destination_gauges, discard_matching, discard_message, outbox_stats,
    retry_matching, retry_message, unsent_stats,
};
pub use readiness::Readiness;
pub use routes::{Diagnostics, DiagnosticsBuilder};
use types::rfc3339;
pub use types::{
    AttentionFilter, AttentionMessage, DecommissionedVersion, DiagnosticsError, Health,
    HealthStatus, HealthThresholds, InboxStats, MAX_LIST_LIMIT, OutboxStats, SendCounters,
    StatusCounts,
};
pub(crate) use types::{AttentionRow, UnsentGroup};

pub use crate::circuit::DestinationState;
pub use crate::liveness::Liveness;
