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
//! (claims, results, leases), `diagnostics` (the operators' queries),
//! `vacuum` (incremental mode and returning freed pages).

#[cfg(any(feature = "nats", feature = "amqp"))]
mod answers;
mod connection;
pub(crate) mod diagnostics;
pub(crate) mod dispatch;
pub(crate) mod inbox;
pub(crate) mod lifecycle;
mod migrations;
pub(crate) mod outbox;
mod preflight;
mod retention;
#[cfg(test)]
mod tests;
mod vacuum;

pub use crate::inbox::{InboxEntry, InboxError, PayloadDigest, ProcessedMessage, payload_digest};
pub use connection::{BUSY_TIMEOUT, configure, open};
pub use inbox::{InboxReader, count as inbox_count, lookup as inbox_lookup, record_processed};
pub use migrations::MIGRATIONS;
pub(crate) use migrations::{attention, outbox_seq};
pub use outbox::{outbox_counts, outbox_row};
pub(crate) use preflight::file_of;
pub use preflight::preflight;
pub use retention::{cleanup, cleanup_with_failure_handlers};
pub use vacuum::{VacuumReport, freelist_count, vacuum_freed};

pub(crate) use super::now_ms;

#[allow(private_interfaces)] // see `store::sealed`
impl super::sealed::Common for super::Sqlite {
    type Service = dyn crate::receiver::HostedService<Self>;
    type Responder = dyn crate::responses::ResponseHandler<Self>;
    type OnFailure = dyn crate::failures::FailureHandler<Self>;

    fn interfaces(service: &Self::Service) -> &[crate::receiver::HostedInterface] {
        service.interfaces()
    }

    fn open_dispatch(
        database: &super::Database,
        config: &crate::config::Config,
        responses: Vec<std::sync::Arc<Self::Responder>>,
        failures: crate::failures::FailureHandlers<Self::OnFailure>,
    ) -> Result<std::sync::Arc<dyn crate::dispatcher::records::DispatchDb>, super::StoreError> {
        let failures = dispatch::OnFailure {
            handlers: failures,
            elsewhere: Vec::new(),
        };
        dispatch::open(path_of(database)?, config, responses, failures)
    }

    #[cfg(any(feature = "nats", feature = "amqp"))]
    fn open_answers(
        database: &super::Database,
        handlers: Vec<std::sync::Arc<Self::Responder>>,
    ) -> Result<std::sync::Arc<dyn crate::broker::AnswerStore>, super::StoreError> {
        answers::open(path_of(database)?, handlers)
    }

    #[cfg(any(feature = "nats", feature = "amqp"))]
    fn open_terminated(
        database: &super::Database,
    ) -> Result<std::sync::Arc<dyn crate::broker::TerminatedStore>, super::StoreError> {
        answers::open_terminated(path_of(database)?)
    }

    fn lifecycle_service(
        service: crate::lifecycle::LifecycleService,
        _: &crate::store::Database,
    ) -> crate::receiver::Registered<Self::Service> {
        crate::receiver::Registered(std::sync::Arc::new(service))
    }

    const DEFAULT_WRITERS: usize = 1;

    fn start_inbox(
        database: &super::Database,
        _writers: usize,
        parts: crate::receiver::WriterParts<Self>,
    ) -> Result<crate::receiver::Started, crate::receiver::ReceiverError> {
        start_inbox(path_of(database)?, parts)
    }
}

#[allow(private_interfaces)] // see `store::sealed`
impl super::sealed::Backend for super::Sqlite {
    fn enqueue(
        config: &crate::config::Config,
        tx: &rusqlite::Transaction<'_>,
        message: &crate::outbox::OutgoingMessage,
    ) -> Result<uuid::Uuid, crate::outbox::OutboxError> {
        if config.outbox.durability == crate::config::Durability::Full {
            outbox::require_durable_commit(tx)?;
        }
        outbox::insert(tx, config, message)
    }

    fn record_applied(
        tx: &mut &rusqlite::Transaction<'_>,
        applied: &crate::lifecycle::Applied<'_>,
    ) -> Result<Option<(i64, String)>, super::StoreError> {
        lifecycle::record_applied(tx, applied).map_err(super::StoreError::SqliteStatement)
    }

    fn hold_version(
        tx: &mut &rusqlite::Transaction<'_>,
        interface: &str,
        version: u32,
        now: i64,
        reason: &str,
    ) -> Result<(i64, u64), super::StoreError> {
        lifecycle::hold_version(tx, interface, version, now, reason)
            .map_err(super::StoreError::SqliteStatement)
    }

    fn release_version(
        tx: &mut &rusqlite::Transaction<'_>,
        interface: &str,
        version: u32,
        now: i64,
        reason: &str,
    ) -> Result<u64, super::StoreError> {
        lifecycle::release_version(tx, interface, version, now, reason)
            .map_err(super::StoreError::SqliteStatement)
    }
}

/// Opens (and migrates) the inbox in the SQLite file `path` and starts its
/// one writer thread, which group-commits.
fn start_inbox(
    path: &std::path::Path,
    parts: crate::receiver::WriterParts<super::Sqlite>,
) -> Result<crate::receiver::Started, crate::receiver::ReceiverError> {
    use std::sync::Arc;
    let conn = open(path, parts.durability)?;
    if let Some(lifecycle) = &parts.lifecycle {
        let rows = lifecycle::read(&conn).map_err(|source| super::StoreError::Sqlite {
            path: path.display().to_string(),
            source,
        })?;
        lifecycle.replace(rows);
    }
    let reader = inbox::InboxReader::open(path)?;
    let writer = crate::receiver::writer::Writer {
        step: inbox::SqliteStep {
            conn,
            group_limit: parts.group_limit,
        },
        commands: Arc::new(std::sync::Mutex::new(parts.commands)),
        handlers: Arc::new(parts.handlers),
        retention: parts.retention,
    };
    let alive = parts.alive;
    let thread = std::thread::Builder::new()
        .name("rfidl-receiver-writer".to_owned())
        .spawn(move || {
            let _alive = alive;
            crate::sched::request_short_slice();
            writer.run();
        })
        .map_err(crate::receiver::ReceiverError::WriterThread)?;
    Ok((
        Arc::new(reader) as Arc<dyn crate::inbox::InboxLookup>,
        vec![thread],
    ))
}

/// The SQLite file of `database`.
pub(crate) fn path_of(database: &super::Database) -> Result<&std::path::Path, super::StoreError> {
    database
        .sqlite_path()
        .ok_or_else(|| super::StoreError::WrongStore {
            expected: "SQLite",
            database: database.to_string(),
        })
}
