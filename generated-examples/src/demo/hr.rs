//! The HR service: hires employees (business row + `EmployeeHired` in one
//! transaction) and handles the engine's `ProvisionLaptop` commands.

// EmpService v1 is deprecated in the contract, and this demo serves and
// sends it on purpose: old clients keep using v1 while new ones move to v2.
#![allow(deprecated)]

use std::path::{Path, PathBuf};

use rfidl_runtime::dispatcher::{Dispatcher, DispatcherHandle};
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::receiver::{HandlerError, IncomingCall, Receiver};
use rfidl_runtime::rusqlite::{self, Transaction, params};
use rfidl_runtime::types::{Date, Uuid};

use super::{Operations, Settings};
use crate::generated::common;
use crate::generated::hr::employees::{
    Employee, EmploymentStatus, LaptopTicket, emp_service_v1, emp_service_v2,
};

/// The destination name HR's outbox uses for the engine.
pub const ENGINE: &str = "engine";

/// HR's business tables (in the same database as its outbox and inbox).
///
/// A ticket's number is assigned by SQLite inside the handler's transaction
/// (`INTEGER PRIMARY KEY`), never counted in process memory: a restarted
/// process, or a handler run again after a rollback, continues from what is
/// committed. `message_id` is UNIQUE: the command that caused the row, so an
/// effect can always be traced to its message, and a second commit of one
/// message would fail instead of leaving a second ticket.
pub const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS employees (id TEXT PRIMARY KEY, name TEXT NOT NULL, hired_on TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS laptop_tickets (
        number INTEGER PRIMARY KEY, employee_id TEXT NOT NULL, model TEXT NOT NULL,
        message_id TEXT NOT NULL UNIQUE
    );
";

/// Handles `ProvisionLaptop` for both versions: one ticket row per command.
///
/// Holds no state: everything a handler needs to stay correct across crashes
/// and restarts lives in the transaction it is given.
pub struct LaptopDesk;

impl LaptopDesk {
    fn provision(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: String,
    ) -> Result<LaptopTicket, HandlerError> {
        let number: i64 = tx.query_row(
            "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES (?1, ?2, ?3) RETURNING number",
            params![employee_id.to_string(), model, call.message_id],
            |row| row.get(0),
        )?;
        Ok(LaptopTicket {
            ticket: format!("IT-{number:06}"),
            eta: None,
        })
    }
}

impl emp_service_v1::ServiceHandler for LaptopDesk {
    fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: String,
    ) -> Result<LaptopTicket, HandlerError> {
        self.provision(call, tx, employee_id, model)
    }
}

impl emp_service_v2::ServiceHandler for LaptopDesk {
    fn provision_laptop(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: String,
        _ship_to: Option<common::Address>,
    ) -> Result<LaptopTicket, HandlerError> {
        self.provision(call, tx, employee_id, model)
    }
}

/// A running HR service.
pub struct HrService {
    pub db: PathBuf,
    pub url: String,
    pub receiver: Receiver,
    pub dispatcher: DispatcherHandle,
    pub server: tokio::task::JoinHandle<()>,
    pub operations: Operations,
    /// Its registration with the engine registry, if `--registry` was given.
    pub directory: Option<super::Directory>,
    v1: emp_service_v1::EngineClient,
    v2: emp_service_v2::EngineClient,
}

impl HrService {
    /// Opens the database, starts the receiver (commands from the engine)
    /// and the dispatcher (messages to the engine).
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        let config = settings.runtime_config(ENGINE);
        rfidl_runtime::db::open(&settings.db, config.outbox.durability)?.execute_batch(SCHEMA)?;
        let desk = std::sync::Arc::new(LaptopDesk);
        let outbox = Outbox::new(config.clone(), &settings.db);
        let receiver = Receiver::builder(config.clone(), &settings.db)
            .service(emp_service_v1::ServiceReceiver(desk.clone()))
            .service(emp_service_v2::ServiceReceiver(desk))
            .metrics(outbox.metrics().clone())
            .build()?;
        let operations = Operations::start(
            &config,
            &settings.db,
            &outbox,
            &receiver,
            settings.ops_token.as_deref(),
        )?;
        let listener = tokio::net::TcpListener::bind(settings.listen).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let server = super::serve(listener, operations.router.clone());
        let dispatcher = Dispatcher::builder(&outbox, &settings.db).start()?;
        // HR provides EmpService (the engine's commands land here).
        let directory = super::register(
            &config,
            &url,
            settings.ops_token.as_deref(),
            super::emp_service_versions(),
            Vec::new(),
        );
        Ok(Self {
            db: settings.db.clone(),
            url,
            directory,
            receiver,
            dispatcher,
            server,
            operations,
            v1: emp_service_v1::EngineClient::new(outbox.clone(), ENGINE),
            v2: emp_service_v2::EngineClient::new(outbox, ENGINE),
        })
    }

    /// Hires someone: the employee row and the `EmployeeHired` pushcall
    /// commit together (v2 for most, v1 for every fifth, as old clients do).
    pub fn hire(&self, conn: &mut rusqlite::Connection, number: u32) -> anyhow::Result<Uuid> {
        let employee = sample_employee(number);
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO employees (id, name, hired_on) VALUES (?1, ?2, ?3)",
            params![
                employee.id.to_string(),
                employee.name,
                employee.hired_on.to_string()
            ],
        )?;
        let id = employee.id;
        if number.is_multiple_of(5) {
            self.v1.employee_hired(&tx, employee)?;
        } else {
            self.v2
                .employee_hired(&tx, employee, common::Channel::Web, None)?;
        }
        tx.commit()?;
        Ok(id)
    }

    pub fn connection(&self) -> anyhow::Result<rusqlite::Connection> {
        Ok(rfidl_runtime::db::open(
            &self.db,
            rfidl_runtime::Durability::Normal,
        )?)
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
pub fn outbox_counts(db: &Path) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let conn = rusqlite::Connection::open(db)?;
    Ok(rfidl_runtime::outbox::counts(&conn)?)
}
