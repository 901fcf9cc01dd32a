//! The HR service: hires employees (business row + `EmployeeHired` in one
//! transaction) and handles the engine's `ProvisionLaptop` commands.

// EmpService v1 is deprecated in the contract, and this demo serves and
// sends it on purpose: old clients keep using v1 while new ones move to v2.
#![allow(deprecated)]

use rfidl_runtime::receiver::{HandlerError, IncomingCall};
use rfidl_runtime::types::{Date, Uuid};
use rfidl_runtime::{Database, Host, Postgres, Sqlite};

use super::Settings;
use super::store::{Connection, DemoStore, Schema};
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
pub const SCHEMA: Schema = Schema {
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

/// Handles `ProvisionLaptop` for both versions: one ticket row per command.
///
/// Holds no state: everything a handler needs to stay correct across crashes
/// and restarts lives in the transaction it is given.
pub struct LaptopDesk;

impl LaptopDesk {
    fn provision<S: DemoStore>(
        &self,
        call: &IncomingCall<'_>,
        mut tx: S::Handle<'_, '_>,
        employee_id: Uuid,
        model: String,
    ) -> Result<LaptopTicket, HandlerError> {
        let number = S::insert_ticket(&mut tx, &employee_id.to_string(), &model, call.message_id)?;
        Ok(LaptopTicket {
            ticket: format!("IT-{number:06}"),
            eta: None,
        })
    }
}

impl<S: DemoStore> emp_service_v1::ServiceHandler<S> for LaptopDesk {
    fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
        employee_id: Uuid,
        model: String,
    ) -> Result<LaptopTicket, HandlerError> {
        self.provision::<S>(call, tx, employee_id, model)
    }
}

impl<S: DemoStore> emp_service_v2::ServiceHandler<S> for LaptopDesk {
    fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
        employee_id: Uuid,
        model: String,
        _ship_to: Option<common::Address>,
    ) -> Result<LaptopTicket, HandlerError> {
        self.provision::<S>(call, tx, employee_id, model)
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
    hiring: std::sync::Arc<dyn Hiring>,
    /// The connection hires are made on, opened at the first hire.
    connection: std::sync::Arc<std::sync::Mutex<Option<Connection>>>,
    /// How hires commit: `outbox.durability` (under `full` the outbox
    /// refuses a transaction that is not durable at commit).
    durability: rfidl_runtime::Durability,
}

/// Hiring on the service's store (see [`HrService::hire`]).
trait Hiring: Send + Sync {
    fn hire(&self, connection: &mut Connection, number: u32) -> anyhow::Result<Uuid>;
}

/// The clients HR sends with, on the store `S`.
struct Clients<S: DemoStore> {
    v1: emp_service_v1::EngineClient<S>,
    v2: emp_service_v2::EngineClient<S>,
}

impl<S: DemoStore> Hiring for Clients<S> {
    fn hire(&self, connection: &mut Connection, number: u32) -> anyhow::Result<Uuid> {
        S::in_transaction(
            connection,
            Hire {
                clients: self,
                employee: sample_employee(number),
                number,
            },
        )
    }
}

/// One hire, in one transaction: the employee row and the pushcall.
struct Hire<'h, S: DemoStore> {
    clients: &'h Clients<S>,
    employee: Employee,
    number: u32,
}

impl<S: DemoStore> super::store::Work<S> for Hire<'_, S> {
    type Output = Uuid;

    fn run<'a, 'c: 'a>(self, mut tx: S::Handle<'a, 'c>) -> anyhow::Result<Uuid> {
        let employee = self.employee;
        let id = employee.id;
        S::insert_employee(
            &mut tx,
            &employee.id.to_string(),
            &employee.name,
            &employee.hired_on.to_string(),
        )?;
        if self.number.is_multiple_of(5) {
            self.clients.v1.employee_hired(tx, employee)?;
        } else {
            self.clients
                .v2
                .employee_hired(tx, employee, common::Channel::Web, None)?;
        }
        Ok(id)
    }
}

impl HrService {
    /// Opens the database (the store `--db` names), starts the receiver
    /// (commands from the engine) and the dispatcher (messages to the engine).
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        match &settings.db {
            Database::Postgres(_) => Self::start_on::<Postgres>(settings).await,
            _ => Self::start_on::<Sqlite>(settings).await,
        }
    }

    async fn start_on<S: DemoStore>(settings: &Settings) -> anyhow::Result<Self>
    where
        rfidl_runtime::lifecycle::LifecycleService: rfidl_runtime::receiver::HostedService<S>,
    {
        let config = settings.runtime_config(ENGINE);
        S::create_schema(&settings.db, &SCHEMA)?;
        let host = S::host(config.clone(), &settings.db)?;
        // Made before the host starts its dispatcher, which checks that the
        // config routes every destination they send to.
        let hiring = std::sync::Arc::new(Clients::<S> {
            v1: emp_service_v1::EngineClient::new(host.outbox().clone(), ENGINE),
            v2: emp_service_v2::EngineClient::new(host.outbox().clone(), ENGINE),
        });
        let desk = std::sync::Arc::new(LaptopDesk);
        let host = host
            .service(emp_service_v1::ServiceReceiver(desk.clone()))
            .service(emp_service_v2::ServiceReceiver(desk))
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
            connection: Default::default(),
            durability: config.outbox.durability,
        })
    }

    /// Hires someone: the employee row and the `EmployeeHired` pushcall
    /// commit together (v2 for most, v1 for every fifth, as old clients do).
    /// The transaction runs on the blocking pool, on one connection kept
    /// for hiring.
    pub async fn hire(&self, number: u32) -> anyhow::Result<Uuid> {
        let (hiring, connection, db, durability) = (
            std::sync::Arc::clone(&self.hiring),
            std::sync::Arc::clone(&self.connection),
            self.db.clone(),
            self.durability,
        );
        tokio::task::spawn_blocking(move || {
            let mut slot = connection
                .lock()
                .map_err(|_| anyhow::anyhow!("the hiring connection is poisoned"))?;
            if slot.is_none() {
                *slot = Some(Connection::open_with(&db, durability)?);
            }
            let connection = slot
                .as_mut()
                .ok_or_else(|| anyhow::anyhow!("no connection"))?;
            let hired = hiring.hire(connection, number);
            if hired.is_err() {
                // Open a fresh one next time (the server may have closed it).
                *slot = None;
            }
            hired
        })
        .await?
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
    super::store::reading(db, |connection| {
        Ok(match connection {
            Connection::Sqlite(conn) => rfidl_runtime::store::sqlite::outbox_counts(conn)?,
            Connection::Postgres(client) => client
                .query(
                    "SELECT status, COUNT(*) FROM outbox_messages GROUP BY status",
                    &[],
                )?
                .iter()
                .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1) as u64))
                .collect(),
        })
    })
}
