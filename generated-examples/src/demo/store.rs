//! The demo services on either store: everything that differs between
//! SQLite and PostgreSQL is here (the business statements in each dialect,
//! and which runtime constructors open the store); the services and their
//! handlers are written once, generic over [`DemoStore`].
//!
//! A handler gets the transaction as `S::Handle` and passes it on twice (to
//! its own statement, then to a generated client): `S::reborrow(&mut tx)`
//! lends it for one call.

use rfidl_runtime::host::HostBuilder;
use rfidl_runtime::receiver::HandlerError;
use rfidl_runtime::rusqlite::params;
use rfidl_runtime::{Config, Database, Host, Postgres, Sqlite, Store};

/// The receiver's writer threads on PostgreSQL (each with its connection).
pub const POSTGRES_WRITERS: usize = 4;

/// A store the demo services run on.
pub trait DemoStore: Store + Sized {
    /// HR's and the engine's tables, created if missing (`schema` picks
    /// the service's statements of this dialect).
    fn create_schema(database: &Database, schema: &Schema) -> anyhow::Result<()>;

    /// A service on `database`: its outbox, receiver, dispatcher and
    /// operations, to configure and start ([`Host`]).
    fn host(config: Config, database: &Database) -> anyhow::Result<HostBuilder<Self>>;

    /// Runs `work` in a transaction of its own on `connection`, and
    /// commits if it succeeded.
    fn in_transaction<W: Work<Self>>(
        connection: &mut Connection,
        work: W,
    ) -> anyhow::Result<W::Output>;

    /// The engine: a workflow for a hire message.
    fn insert_workflow(
        tx: &mut Self::Handle<'_, '_>,
        workflow_id: &str,
        employee_id: &str,
        version: u32,
        message_id: &str,
    ) -> Result<(), HandlerError>;

    /// The engine: HR's laptop ticket arrived for an employee's workflow.
    fn record_ticket(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
        ticket: &str,
    ) -> Result<(), HandlerError>;

    /// The engine: onboarding of an employee completed.
    fn finish_workflow(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
    ) -> Result<(), HandlerError>;

    /// The engine: a ticket for a human, because the laptop command of
    /// `message_id` will not be delivered (`status`, `reason`). One per
    /// command: a command retried by an operator that fails again keeps it.
    fn open_human_ticket(
        tx: &mut Self::Handle<'_, '_>,
        ticket: &HumanTicket<'_>,
    ) -> Result<(), HandlerError>;

    /// HR: a laptop ticket for a command; its number, assigned by the database.
    fn insert_ticket(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
        model: &str,
        message_id: &str,
    ) -> Result<i64, HandlerError>;

    /// HR: an employee row.
    fn insert_employee(
        tx: &mut Self::Handle<'_, '_>,
        id: &str,
        name: &str,
        hired_on: &str,
    ) -> anyhow::Result<()>;
}

/// Work done in one transaction of the store `S` (outside handlers, which
/// are given theirs), see [`DemoStore::in_transaction`].
pub trait Work<S: Store> {
    type Output;
    fn run<'a, 'c: 'a>(self, tx: S::Handle<'a, 'c>) -> anyhow::Result<Self::Output>;
}

/// A ticket for a human ([`DemoStore::open_human_ticket`]).
#[derive(Debug, Clone, Copy)]
pub struct HumanTicket<'a> {
    pub message_id: &'a str,
    pub employee_id: &'a str,
    pub model: &'a str,
    pub status: &'a str,
    pub reason: &'a str,
}

/// A service's tables in both dialects.
#[derive(Debug, Clone, Copy)]
pub struct Schema {
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

/// An open connection of either store, for work outside handlers (hiring,
/// counting).
pub enum Connection {
    Sqlite(rfidl_runtime::rusqlite::Connection),
    Postgres(PgClient),
}

/// A PostgreSQL client that may be dropped anywhere: the client closes its
/// session through a runtime of its own, which cannot start on an async
/// executor's thread, so there it is closed on a thread of its own.
pub struct PgClient(Option<rfidl_runtime::postgres::Client>);

impl std::ops::Deref for PgClient {
    type Target = rfidl_runtime::postgres::Client;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("open until dropped")
    }
}

impl std::ops::DerefMut for PgClient {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("open until dropped")
    }
}

impl Drop for PgClient {
    fn drop(&mut self) {
        if let Some(client) = self.0.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            let _ = std::thread::Builder::new()
                .name("pg-close".into())
                .spawn(move || drop(client));
        }
    }
}

impl Connection {
    /// Opens (and migrates) `database`; a SQLite connection commits with
    /// `synchronous=NORMAL`.
    pub fn open(database: &Database) -> anyhow::Result<Self> {
        Self::open_with(database, rfidl_runtime::Durability::Normal)
    }

    /// Opens (and migrates) `database`; a SQLite connection commits with
    /// `durability` (give it `outbox.durability` for a connection that
    /// enqueues).
    pub fn open_with(
        database: &Database,
        durability: rfidl_runtime::Durability,
    ) -> anyhow::Result<Self> {
        Ok(match database {
            Database::Sqlite(path) => {
                Connection::Sqlite(rfidl_runtime::store::sqlite::open(path, durability)?)
            }
            Database::Postgres(url) => {
                Connection::Postgres(PgClient(Some(rfidl_runtime::store::postgres::open(url)?)))
            }
            other => anyhow::bail!("unsupported database {other}"),
        })
    }

    /// Opens `database` to read what the services wrote: no migration (the
    /// services ran it at start-up), so polling it never takes the
    /// migration's write lock.
    pub fn open_to_read(database: &Database) -> anyhow::Result<Self> {
        Ok(match database {
            Database::Sqlite(path) => {
                let conn = rfidl_runtime::rusqlite::Connection::open(path)?;
                conn.busy_timeout(rfidl_runtime::store::sqlite::BUSY_TIMEOUT)?;
                Connection::Sqlite(conn)
            }
            Database::Postgres(url) => Connection::Postgres(PgClient(Some(url.connect()?))),
            other => anyhow::bail!("unsupported database {other}"),
        })
    }

    /// One number from `sql` (the same SQL on both stores).
    pub fn count(&mut self, sql: &str) -> anyhow::Result<i64> {
        Ok(match self {
            Connection::Sqlite(conn) => conn.query_row(sql, [], |r| r.get(0))?,
            Connection::Postgres(client) => client.query_one(sql, &[])?.get(0),
        })
    }
}

/// Opens `database` (and migrates it), runs `work` with the connection on
/// a thread of its own (the PostgreSQL client may not run on an async
/// executor), and closes it.
pub fn with_connection<T: Send>(
    database: &Database,
    work: impl FnOnce(&mut Connection) -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    on_thread(database, Connection::open, work)
}

/// [`with_connection`] to read only: no migration, see
/// [`Connection::open_to_read`].
pub fn reading<T: Send>(
    database: &Database,
    work: impl FnOnce(&mut Connection) -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    on_thread(database, Connection::open_to_read, work)
}

fn on_thread<T: Send>(
    database: &Database,
    open: fn(&Database) -> anyhow::Result<Connection>,
    work: impl FnOnce(&mut Connection) -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut connection = open(database)?;
                work(&mut connection)
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("database thread panicked")))
    })
}

/// Counts rows with one query (the same SQL on both stores).
pub fn count(database: &Database, sql: &str) -> anyhow::Result<i64> {
    reading(database, |connection| connection.count(sql))
}

impl DemoStore for Sqlite {
    fn create_schema(database: &Database, schema: &Schema) -> anyhow::Result<()> {
        let sql = schema.sqlite;
        with_connection(database, |connection| match connection {
            Connection::Sqlite(conn) => Ok(conn.execute_batch(sql)?),
            Connection::Postgres(_) => anyhow::bail!("not a SQLite database"),
        })
    }

    fn host(config: Config, database: &Database) -> anyhow::Result<HostBuilder<Self>> {
        let path = database
            .sqlite_path()
            .ok_or_else(|| anyhow::anyhow!("{database} is not a SQLite file"))?;
        Ok(Host::builder(config, path))
    }

    fn in_transaction<W: Work<Self>>(
        connection: &mut Connection,
        work: W,
    ) -> anyhow::Result<W::Output> {
        let Connection::Sqlite(conn) = connection else {
            anyhow::bail!("not a SQLite connection");
        };
        let tx = conn.transaction()?;
        let value = work.run(&tx)?;
        tx.commit()?;
        Ok(value)
    }

    fn insert_workflow(
        tx: &mut Self::Handle<'_, '_>,
        workflow_id: &str,
        employee_id: &str,
        version: u32,
        message_id: &str,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO workflows (id, employee_id, version, state, message_id) \
             VALUES (?1, ?2, ?3, 'provisioning', ?4)",
            params![workflow_id, employee_id, version, message_id],
        )?;
        Ok(())
    }

    fn record_ticket(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
        ticket: &str,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "UPDATE workflows SET laptop_ticket = ?2, \
             state = CASE state WHEN 'provisioning' THEN 'laptop ordered' ELSE state END \
             WHERE employee_id = ?1",
            params![employee_id, ticket],
        )?;
        Ok(())
    }

    fn finish_workflow(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "UPDATE workflows SET state = 'done' WHERE employee_id = ?1",
            [employee_id],
        )?;
        Ok(())
    }

    fn open_human_ticket(
        tx: &mut Self::Handle<'_, '_>,
        ticket: &HumanTicket<'_>,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO human_tickets (message_id, employee_id, model, status, reason) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (message_id) DO NOTHING",
            params![
                ticket.message_id,
                ticket.employee_id,
                ticket.model,
                ticket.status,
                ticket.reason
            ],
        )?;
        Ok(())
    }

    fn insert_ticket(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
        model: &str,
        message_id: &str,
    ) -> Result<i64, HandlerError> {
        Ok(tx.query_row(
            "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES (?1, ?2, ?3) \
             RETURNING number",
            params![employee_id, model, message_id],
            |row| row.get(0),
        )?)
    }

    fn insert_employee(
        tx: &mut Self::Handle<'_, '_>,
        id: &str,
        name: &str,
        hired_on: &str,
    ) -> anyhow::Result<()> {
        tx.execute(
            "INSERT INTO employees (id, name, hired_on) VALUES (?1, ?2, ?3)",
            params![id, name, hired_on],
        )?;
        Ok(())
    }
}

impl DemoStore for Postgres {
    fn create_schema(database: &Database, schema: &Schema) -> anyhow::Result<()> {
        let sql = schema.postgres;
        with_connection(database, |connection| match connection {
            Connection::Postgres(client) => {
                // Replicas starting together: one creates, the others wait.
                let mut tx = client.transaction()?;
                tx.execute("SELECT pg_advisory_xact_lock(7365)", &[])?;
                tx.batch_execute(sql)?;
                Ok(tx.commit()?)
            }
            Connection::Sqlite(_) => anyhow::bail!("not a PostgreSQL database"),
        })
    }

    fn host(config: Config, database: &Database) -> anyhow::Result<HostBuilder<Self>> {
        let Database::Postgres(url) = database else {
            anyhow::bail!("{database} is not a PostgreSQL database");
        };
        Ok(Host::builder(config, &**url).writers(POSTGRES_WRITERS))
    }

    fn in_transaction<W: Work<Self>>(
        connection: &mut Connection,
        work: W,
    ) -> anyhow::Result<W::Output> {
        let Connection::Postgres(client) = connection else {
            anyhow::bail!("not a PostgreSQL connection");
        };
        let mut tx = client.transaction()?;
        let value = work.run(&mut tx)?;
        tx.commit()?;
        Ok(value)
    }

    fn insert_workflow(
        tx: &mut Self::Handle<'_, '_>,
        workflow_id: &str,
        employee_id: &str,
        version: u32,
        message_id: &str,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO workflows (id, employee_id, version, state, message_id) \
             VALUES ($1, $2, $3, 'provisioning', $4)",
            &[&workflow_id, &employee_id, &i64::from(version), &message_id],
        )?;
        Ok(())
    }

    fn record_ticket(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
        ticket: &str,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "UPDATE workflows SET laptop_ticket = $2, \
             state = CASE state WHEN 'provisioning' THEN 'laptop ordered' ELSE state END \
             WHERE employee_id = $1",
            &[&employee_id, &ticket],
        )?;
        Ok(())
    }

    fn finish_workflow(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "UPDATE workflows SET state = 'done' WHERE employee_id = $1",
            &[&employee_id],
        )?;
        Ok(())
    }

    fn open_human_ticket(
        tx: &mut Self::Handle<'_, '_>,
        ticket: &HumanTicket<'_>,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO human_tickets (message_id, employee_id, model, status, reason) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (message_id) DO NOTHING",
            &[
                &ticket.message_id,
                &ticket.employee_id,
                &ticket.model,
                &ticket.status,
                &ticket.reason,
            ],
        )?;
        Ok(())
    }

    fn insert_ticket(
        tx: &mut Self::Handle<'_, '_>,
        employee_id: &str,
        model: &str,
        message_id: &str,
    ) -> Result<i64, HandlerError> {
        Ok(tx
            .query_one(
                "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES ($1, $2, $3) \
                 RETURNING number",
                &[&employee_id, &model, &message_id],
            )?
            .get(0))
    }

    fn insert_employee(
        tx: &mut Self::Handle<'_, '_>,
        id: &str,
        name: &str,
        hired_on: &str,
    ) -> anyhow::Result<()> {
        tx.execute(
            "INSERT INTO employees (id, name, hired_on) VALUES ($1, $2, $3)",
            &[&id, &name, &hired_on],
        )?;
        Ok(())
    }
}
