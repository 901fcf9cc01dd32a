//! The parts of either store a body holds: [`AnyOutbox`], [`AnyDispatcher`],
//! and [`on_each_sqlx_store!`], which writes a test's async handler once
//! for both sqlx stores.

use std::sync::Arc;

use rfidl_runtime::Sqlite;
use rfidl_runtime::diagnostics::DiagnosticsBuilder;
use rfidl_runtime::dispatcher::{DispatcherBuilder, DispatcherError, DispatcherHandle};
use rfidl_runtime::failures::{AsyncFailureHandler, FailureHandler};
use rfidl_runtime::metrics::Metrics;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::responses::{AsyncResponseHandler, ResponseHandler};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::Transport;
use uuid::Uuid;

/// Writes the items once per sqlx store, with `Db` naming the store
/// (`sqlx::Postgres`, then `sqlx::Sqlite`) and `Conn` its connection. The
/// statements use `$N` placeholders, which both accept (sqlx binds SQLite's
/// `$N` by its number), and SQL both dialects read.
macro_rules! on_each_sqlx_store {
    ($($item:item)*) => {
        const _: () = {
            type Db = sqlx::Postgres;
            type Conn = sqlx::PgConnection;
            $($item)*
        };
        const _: () = {
            type Db = sqlx::Sqlite;
            type Conn = sqlx::SqliteConnection;
            $($item)*
        };
    };
}
pub(crate) use on_each_sqlx_store;

/// An outbox of any store.
#[derive(Clone, Debug)]
pub enum AnyOutbox {
    Sqlite(Outbox<Sqlite>),
    Postgres(Outbox<sqlx::Postgres>),
    SqlxSqlite(Outbox<sqlx::Sqlite>),
}

/// The outbox of store `S` in an [`AnyOutbox`] (panics on another store):
/// what a handler written with [`on_each_sqlx_store!`] enqueues with.
pub trait OutboxOf<S: rfidl_runtime::AnyStore> {
    fn of(&self) -> &Outbox<S>;
}

impl OutboxOf<sqlx::Postgres> for AnyOutbox {
    fn of(&self) -> &Outbox<sqlx::Postgres> {
        self.postgres()
    }
}

impl OutboxOf<sqlx::Sqlite> for AnyOutbox {
    fn of(&self) -> &Outbox<sqlx::Sqlite> {
        self.sqlx_sqlite()
    }
}

/// Runs `$do` on the outbox of whichever store `$outbox` is.
macro_rules! each {
    ($outbox:expr, $inner:ident => $do:expr) => {
        match $outbox {
            AnyOutbox::Sqlite($inner) => $do,
            AnyOutbox::Postgres($inner) => $do,
            AnyOutbox::SqlxSqlite($inner) => $do,
        }
    };
}

impl AnyOutbox {
    pub fn sqlite(&self) -> &Outbox<Sqlite> {
        match self {
            AnyOutbox::Sqlite(outbox) => outbox,
            _ => panic!("not a rusqlite outbox"),
        }
    }

    pub fn postgres(&self) -> &Outbox<sqlx::Postgres> {
        match self {
            AnyOutbox::Postgres(outbox) => outbox,
            _ => panic!("not a PostgreSQL outbox"),
        }
    }

    pub fn sqlx_sqlite(&self) -> &Outbox<sqlx::Sqlite> {
        match self {
            AnyOutbox::SqlxSqlite(outbox) => outbox,
            _ => panic!("not a sqlx SQLite outbox"),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        each!(self, outbox => outbox.metrics())
    }

    pub fn circuit_states(&self) -> Vec<rfidl_runtime::diagnostics::DestinationState> {
        each!(self, outbox => outbox.circuit_states())
    }

    pub fn lifecycle(&self) -> &rfidl_runtime::lifecycle::Lifecycle {
        each!(self, outbox => outbox.lifecycle())
    }

    /// `builder` reading this outbox's metrics and dispatcher.
    pub fn watched_by(&self, builder: DiagnosticsBuilder) -> DiagnosticsBuilder {
        each!(self, outbox => builder.outbox(outbox))
    }

    pub async fn send(
        &self,
        message: OutgoingMessage,
    ) -> Result<Uuid, rfidl_runtime::outbox::OutboxError> {
        each!(self, outbox => outbox.send(message).await)
    }
}

/// A dispatcher builder of any store.
pub enum AnyDispatcher {
    Sqlite(DispatcherBuilder<Sqlite>),
    Postgres(DispatcherBuilder<sqlx::Postgres>),
    SqlxSqlite(DispatcherBuilder<sqlx::Sqlite>),
}

/// Rebuilds `$dispatcher` (an [`AnyDispatcher`]) with `$do` applied to the
/// builder of its store.
macro_rules! rebuild {
    ($dispatcher:expr, $b:ident => $do:expr) => {
        match $dispatcher {
            AnyDispatcher::Sqlite($b) => AnyDispatcher::Sqlite($do),
            AnyDispatcher::Postgres($b) => AnyDispatcher::Postgres($do),
            AnyDispatcher::SqlxSqlite($b) => AnyDispatcher::SqlxSqlite($do),
        }
    };
}

impl AnyDispatcher {
    pub fn route(self, destination: &str, transport: impl Transport, secret: Secret) -> Self {
        rebuild!(self, b => b.route(destination, transport, secret))
    }

    /// Registers a response handler written for every store (blocking on
    /// rusqlite, async on the sqlx stores).
    pub fn responses<H>(self, handler: H) -> Self
    where
        H: ResponseHandler<Sqlite>
            + AsyncResponseHandler<sqlx::Postgres>
            + AsyncResponseHandler<sqlx::Sqlite>,
    {
        rebuild!(self, b => b.responses(handler))
    }

    /// Registers a failure handler written for every store (blocking on
    /// rusqlite, async on the sqlx stores).
    pub fn failures<H>(self, handler: H) -> Self
    where
        H: FailureHandler<Sqlite>
            + AsyncFailureHandler<sqlx::Postgres>
            + AsyncFailureHandler<sqlx::Sqlite>,
    {
        rebuild!(self, b => b.failures(handler))
    }

    pub fn start(self) -> Result<DispatcherHandle, DispatcherError> {
        match self {
            AnyDispatcher::Sqlite(b) => b.start(),
            AnyDispatcher::Postgres(b) => b.start(),
            AnyDispatcher::SqlxSqlite(b) => b.start(),
        }
    }
}
