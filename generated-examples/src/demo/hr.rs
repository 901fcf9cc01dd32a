//! The HR service: hires employees (business row + `EmployeeHired` in one
//! transaction) and handles the engine's `ProvisionLaptop` commands.

// EmpService v1 is deprecated in the contract, and this demo serves and
// sends it on purpose: old clients keep using v1 while new ones move to v2.
#![allow(deprecated)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rfidl_runtime::host::HostBuilder;
use rfidl_runtime::receiver::{HandlerError, IncomingCall};
use rfidl_runtime::rusqlite::{Transaction, params};
use rfidl_runtime::types::{Date, Uuid};
use rfidl_runtime::{AnyStore, Durability, Host, Sqlite};
use sqlx::{PgConnection, PgPool, Postgres};

use super::Settings;
use super::pg::{self, PgDatabase};
use super::store::{Database, Sql};
use crate::generated::common;
use crate::generated::hr::employees::{
    Employee, EmploymentStatus, LaptopTicket, emp_service_v1, emp_service_v2,
};

/// The destination name HR's outbox uses for the engine.
pub const ENGINE: &str = "engine";

/// HR's business tables (in the same database as its outbox and inbox).
///
/// A ticket's number is assigned by the database inside the handler's
/// transaction (SQLite's `INTEGER PRIMARY KEY`, a PostgreSQL identity
/// column), never counted in process memory: a restarted
/// process, or a handler run again after a rollback, continues from what is
/// committed. `message_id` is UNIQUE: the command that caused the row, so an
/// effect can always be traced to its message, and a second commit of one
/// message would fail instead of leaving a second ticket.
pub const SCHEMA: Sql = Sql {
    sqlite: "
    CREATE TABLE IF NOT EXISTS employees (id TEXT PRIMARY KEY, name TEXT NOT NULL, hired_on TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS laptop_tickets (
        number INTEGER PRIMARY KEY, employee_id TEXT NOT NULL, model TEXT NOT NULL,
        message_id TEXT NOT NULL UNIQUE
    );
",
    postgres: "
    CREATE TABLE IF NOT EXISTS employees (id TEXT PRIMARY KEY, name TEXT NOT NULL, hired_on TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS laptop_tickets (
        number BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, employee_id TEXT NOT NULL,
        model TEXT NOT NULL, message_id TEXT NOT NULL UNIQUE
    );
",
};

/// A laptop ticket for a command; its number, assigned by the database.
const INSERT_TICKET: Sql = Sql {
    sqlite: "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES (?1, ?2, ?3) \
             RETURNING number",
    postgres: "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES ($1, $2, $3) \
               RETURNING number",
};

/// An employee row.
const INSERT_EMPLOYEE: Sql = Sql {
    sqlite: "INSERT INTO employees (id, name, hired_on) VALUES (?1, ?2, ?3)",
    postgres: "INSERT INTO employees (id, name, hired_on) VALUES ($1, $2, $3)",
};

/// Handles `ProvisionLaptop` for both versions, on both stores: one ticket
/// row per command, written in the receiver's transaction.
///
/// Holds no state: everything a handler needs to stay correct across crashes
/// and restarts lives in the transaction it is given.
pub struct LaptopDesk;

impl LaptopDesk {
    /// The answer: the ticket numbered `number`.
    fn ticket(number: i64) -> LaptopTicket {
        LaptopTicket {
            ticket: format!("IT-{number:06}"),
            eta: None,
        }
    }

    /// On SQLite, in the receiver's rusqlite transaction.
    fn provision(
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: &str,
    ) -> Result<LaptopTicket, HandlerError> {
        let number = tx.query_row(
            INSERT_TICKET.sqlite,
            params![employee_id.to_string(), model, call.message_id],
            |row| row.get(0),
        )?;
        Ok(Self::ticket(number))
    }

    /// On PostgreSQL, on the connection of the receiver's sqlx transaction.
    async fn provision_async(
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee_id: Uuid,
        model: &str,
    ) -> Result<LaptopTicket, HandlerError> {
        let number = sqlx::query_scalar(INSERT_TICKET.postgres)
            .bind(employee_id.to_string())
            .bind(model)
            .bind(call.message_id)
            .fetch_one(conn)
            .await
            .map_err(HandlerError::retryable)?;
        Ok(Self::ticket(number))
    }
}

impl emp_service_v1::ServiceHandler<Sqlite> for LaptopDesk {
    fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: String,
    ) -> Result<LaptopTicket, HandlerError> {
        Self::provision(call, tx, employee_id, &model)
    }
}

impl emp_service_v2::ServiceHandler<Sqlite> for LaptopDesk {
    fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: String,
        _ship_to: Option<common::Address>,
    ) -> Result<LaptopTicket, HandlerError> {
        Self::provision(call, tx, employee_id, &model)
    }
}

impl emp_service_v1::aio::ServiceHandler<Postgres> for LaptopDesk {
    async fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee_id: Uuid,
        model: String,
    ) -> Result<LaptopTicket, HandlerError> {
        Self::provision_async(call, conn, employee_id, &model).await
    }
}

impl emp_service_v2::aio::ServiceHandler<Postgres> for LaptopDesk {
    async fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee_id: Uuid,
        model: String,
        _ship_to: Option<common::Address>,
    ) -> Result<LaptopTicket, HandlerError> {
        Self::provision_async(call, conn, employee_id, &model).await
    }
}

/// A running HR service.
pub struct HrService {
    pub db: Database,
    pub url: String,
    /// Where its receiver is also served over gRPC (`--grpc-listen`).
    pub grpc_url: Option<String>,
    /// Its outbox's dispatcher, receiver, diagnostics, retention, JetStream
    /// consumers and registration (`--registry`), served on `--listen`.
    pub host: Host,
    hiring: Hiring,
}

/// How HR hires, on the store of its database (see [`HrService::hire`]).
enum Hiring {
    Sqlite(Arc<SqliteHiring>),
    Postgres(PgHiring),
}

/// Hiring on SQLite: one connection kept for it, used on the blocking pool.
struct SqliteHiring {
    v1: emp_service_v1::EngineClient<Sqlite>,
    v2: emp_service_v2::EngineClient<Sqlite>,
    path: PathBuf,
    /// How hires commit: `outbox.durability` (under `full` the outbox
    /// refuses a transaction that is not durable at commit).
    durability: Durability,
    /// Opened at the first hire, and again after a hire that failed.
    connection: Mutex<Option<rfidl_runtime::rusqlite::Connection>>,
}

/// Hiring on PostgreSQL: a sqlx transaction of the service's pool per hire.
struct PgHiring {
    v1: emp_service_v1::aio::EngineClient<Postgres>,
    v2: emp_service_v2::aio::EngineClient<Postgres>,
    pool: PgPool,
}

/// Every fifth hire is announced over v1, as old clients still do.
fn announced_over_v1(number: u32) -> bool {
    number.is_multiple_of(5)
}

impl SqliteHiring {
    fn hire(&self, number: u32) -> anyhow::Result<Uuid> {
        let mut slot = self
            .connection
            .lock()
            .map_err(|_| anyhow::anyhow!("the hiring connection is poisoned"))?;
        let connection = match &mut *slot {
            Some(connection) => connection,
            empty => empty.insert(rfidl_runtime::store::sqlite::open(
                &self.path,
                self.durability,
            )?),
        };
        let hired = self.hire_on(connection, number);
        if hired.is_err() {
            // Open a fresh one next time.
            *slot = None;
        }
        hired
    }

    /// The employee row and the pushcall, in one transaction.
    fn hire_on(
        &self,
        connection: &mut rfidl_runtime::rusqlite::Connection,
        number: u32,
    ) -> anyhow::Result<Uuid> {
        let employee = sample_employee(number);
        let id = employee.id;
        let tx = connection.transaction()?;
        tx.execute(
            INSERT_EMPLOYEE.sqlite,
            params![id.to_string(), employee.name, employee.hired_on.to_string()],
        )?;
        if announced_over_v1(number) {
            self.v1.employee_hired(&tx, employee)?;
        } else {
            self.v2
                .employee_hired(&tx, employee, common::Channel::Web, None)?;
        }
        tx.commit()?;
        Ok(id)
    }
}

impl PgHiring {
    /// The employee row and the pushcall, in one sqlx transaction.
    async fn hire(&self, number: u32) -> anyhow::Result<Uuid> {
        let employee = sample_employee(number);
        let id = employee.id;
        let mut tx = self.pool.begin().await?;
        sqlx::query(INSERT_EMPLOYEE.postgres)
            .bind(id.to_string())
            .bind(&employee.name)
            .bind(employee.hired_on.to_string())
            .execute(&mut *tx)
            .await?;
        if announced_over_v1(number) {
            self.v1.employee_hired(&mut tx, employee).await?;
        } else {
            self.v2
                .employee_hired(&mut tx, employee, common::Channel::Web, None)
                .await?;
        }
        tx.commit().await?;
        Ok(id)
    }
}

impl HrService {
    /// Opens the database (the store `--db` names), starts the receiver
    /// (commands from the engine) and the dispatcher (messages to the engine).
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        match &settings.db {
            Database::Sqlite(path) => Self::start_on_sqlite(settings, path).await,
            Database::Postgres(database) => Self::start_on_postgres(settings, database).await,
        }
    }

    async fn start_on_sqlite(settings: &Settings, path: &Path) -> anyhow::Result<Self> {
        let config = settings.runtime_config(ENGINE);
        super::store::create_sqlite_tables(path, &SCHEMA)?;
        let host = Host::builder(config.clone(), path);
        // Made before the host starts its dispatcher, which checks that the
        // config routes every destination they send to.
        let hiring = Hiring::Sqlite(Arc::new(SqliteHiring {
            v1: emp_service_v1::EngineClient::new(host.outbox().clone(), ENGINE),
            v2: emp_service_v2::EngineClient::new(host.outbox().clone(), ENGINE),
            path: path.to_path_buf(),
            durability: config.outbox.durability,
            connection: Mutex::new(None),
        }));
        let desk = Arc::new(LaptopDesk);
        let host = host
            .service(emp_service_v1::ServiceReceiver(desk.clone()))
            .service(emp_service_v2::ServiceReceiver(desk));
        Self::serve(settings, host, hiring).await
    }

    async fn start_on_postgres(settings: &Settings, database: &PgDatabase) -> anyhow::Result<Self> {
        let pool = database.pool().await?;
        pg::create_schema(&pool, database, SCHEMA.postgres).await?;
        let host = pg::host(settings.runtime_config(ENGINE), &pool, database).await?;
        let hiring = Hiring::Postgres(PgHiring {
            v1: emp_service_v1::aio::EngineClient::new(host.outbox().clone(), ENGINE),
            v2: emp_service_v2::aio::EngineClient::new(host.outbox().clone(), ENGINE),
            pool,
        });
        let desk = Arc::new(LaptopDesk);
        let host = host
            .service(emp_service_v1::aio::ServiceReceiver(desk.clone()))
            .service(emp_service_v2::aio::ServiceReceiver(desk));
        Self::serve(settings, host, hiring).await
    }

    /// The rest of the start, the same on both stores.
    async fn serve<S: AnyStore>(
        settings: &Settings,
        host: HostBuilder<S>,
        hiring: Hiring,
    ) -> anyhow::Result<Self> {
        let host = host
            // The registry's Decommission/Recommission commands (accepted
            // when the config lists a `peers` secret for `rfidl-registry`).
            .lifecycle()
            // HR provides EmpService (the engine's commands land here);
            // it acts on no answer: the engine's are only recorded.
            .directory(super::emp_service_versions(), Vec::new());
        let host = match super::publish_hosted(settings, &super::emp_service_manifests()) {
            Some(publish) => host.publish_on_registration(publish),
            None => host,
        };
        let host = super::options(host, settings).await?;
        let host = host.listen(settings.listen).await?;
        Ok(Self {
            db: settings.db.clone(),
            url: host.url().to_owned(),
            grpc_url: host.grpc_addr().map(|addr| format!("grpc://{addr}")),
            host,
            hiring,
        })
    }

    /// Hires someone: the employee row and the `EmployeeHired` pushcall
    /// commit together (v2 for most, v1 for every fifth, as old clients do).
    /// On SQLite the transaction runs on the blocking pool, on one
    /// connection kept for hiring; on PostgreSQL it is a sqlx transaction
    /// of the service's pool.
    pub async fn hire(&self, number: u32) -> anyhow::Result<Uuid> {
        match &self.hiring {
            Hiring::Sqlite(hiring) => {
                let hiring = Arc::clone(hiring);
                tokio::task::spawn_blocking(move || hiring.hire(number)).await?
            }
            Hiring::Postgres(hiring) => hiring.hire(number).await,
        }
    }
}

/// A plausible employee, deterministic per number.
pub fn sample_employee(number: u32) -> Employee {
    Employee {
        id: Uuid::now_v7(),
        name: format!("Employee {number}"),
        email: Some(format!("employee{number}@example.com")),
        hired_on: Date::constant(2026, 11, 23),
        salary: common::Money {
            amount: rfidl_runtime::types::Decimal::new(520_000 + number as i64, 2),
            currency: "EUR".into(),
        },
        home: None,
        tags: vec!["demo".into()],
        attributes: Default::default(),
        status: EmploymentStatus::Active,
        weekly_hours: 38.5,
        #[allow(deprecated)]
        payroll_number: None,
    }
}

/// Outbox rows of `db` per status.
pub fn outbox_counts(db: &Database) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    super::store::outbox_counts(db)
}
