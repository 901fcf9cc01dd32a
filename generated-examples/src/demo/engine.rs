//! The stand-in workflow engine: records hires as workflows (exactly once)
//! and asks HR for a laptop, in the same transaction, through the outbox;
//! when HR's answer (the laptop ticket) arrives, the workflow moves on in the
//! transaction that records the answer (exactly once too). A laptop command
//! that HR refuses, or that expires before HR is reached, opens a ticket for
//! a human instead, in the transaction that ends the command (once).

// EmpService v1 is deprecated in the contract, and this demo serves and
// sends it on purpose: old clients keep using v1 while new ones move to v2.
#![allow(deprecated)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rfidl_runtime::failures::Failure;
use rfidl_runtime::host::HostBuilder;
use rfidl_runtime::receiver::{HandlerError, IncomingCall};
use rfidl_runtime::responses::Answer;
use rfidl_runtime::rusqlite::{Transaction, params};
use rfidl_runtime::types::{Duration, Timestamp, Uuid};
use rfidl_runtime::{AnyStore, Host, Sqlite};
use sqlx::{PgConnection, Postgres};
use tokio_util::sync::CancellationToken;

use super::Settings;
use super::pg;
use super::store::{Database, Sql};
use crate::generated::common;
use crate::generated::hr::employees::{
    Employee, HireAck, LaptopTicket, OrgUnit, emp_service_v1, emp_service_v2,
};

/// The destination name the engine's outbox uses for HR.
pub const HR: &str = "hr";

/// The engine's business table. `message_id` is the hire message that
/// started the workflow (UNIQUE: one workflow per message, traceable);
/// `laptop_ticket` is HR's answer to the `ProvisionLaptop` command.
/// The same table on both stores.
pub const SCHEMA: Sql = Sql {
    sqlite: "
    CREATE TABLE IF NOT EXISTS workflows (
        id TEXT PRIMARY KEY, employee_id TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL,
        message_id TEXT NOT NULL UNIQUE, laptop_ticket TEXT
    );
    -- HR's answers and the lifecycle signals find the workflow by employee:
    -- without this index each one scans the table.
    CREATE INDEX IF NOT EXISTS workflows_employee ON workflows (employee_id);
    -- Laptop commands that will not be delivered, for a human to handle.
    CREATE TABLE IF NOT EXISTS human_tickets (
        message_id TEXT PRIMARY KEY, employee_id TEXT NOT NULL, model TEXT NOT NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL
    );
",
    postgres: "
    CREATE TABLE IF NOT EXISTS workflows (
        id TEXT PRIMARY KEY, employee_id TEXT NOT NULL, version BIGINT NOT NULL, state TEXT NOT NULL,
        message_id TEXT NOT NULL UNIQUE, laptop_ticket TEXT
    );
    CREATE INDEX IF NOT EXISTS workflows_employee ON workflows (employee_id);
    CREATE TABLE IF NOT EXISTS human_tickets (
        message_id TEXT PRIMARY KEY, employee_id TEXT NOT NULL, model TEXT NOT NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL
    );
",
};

/// A workflow for a hire message.
const INSERT_WORKFLOW: Sql = Sql {
    sqlite: "INSERT INTO workflows (id, employee_id, version, state, message_id) \
             VALUES (?1, ?2, ?3, 'provisioning', ?4)",
    postgres: "INSERT INTO workflows (id, employee_id, version, state, message_id) \
               VALUES ($1, $2, $3, 'provisioning', $4)",
};

/// HR's laptop ticket arrived for an employee's workflow.
const RECORD_TICKET: Sql = Sql {
    sqlite: "UPDATE workflows SET laptop_ticket = ?2, \
             state = CASE state WHEN 'provisioning' THEN 'laptop ordered' ELSE state END \
             WHERE employee_id = ?1",
    postgres: "UPDATE workflows SET laptop_ticket = $2, \
               state = CASE state WHEN 'provisioning' THEN 'laptop ordered' ELSE state END \
               WHERE employee_id = $1",
};

/// Onboarding of an employee completed.
const FINISH_WORKFLOW: Sql = Sql {
    sqlite: "UPDATE workflows SET state = 'done' WHERE employee_id = ?1",
    postgres: "UPDATE workflows SET state = 'done' WHERE employee_id = $1",
};

/// A ticket for a human: the laptop command of a message will not be
/// delivered. One per command: a command retried by an operator that fails
/// again keeps its ticket.
const OPEN_HUMAN_TICKET: Sql = Sql {
    sqlite: "INSERT INTO human_tickets (message_id, employee_id, model, status, reason) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (message_id) DO NOTHING",
    postgres: "INSERT INTO human_tickets (message_id, employee_id, model, status, reason) \
               VALUES ($1, $2, $3, $4, $5) ON CONFLICT (message_id) DO NOTHING",
};

/// The laptop every new employee gets.
const LAPTOP_MODEL: &str = "ThinkPad T14";

/// Acts on HR's answers to `ProvisionLaptop` (both versions, both stores):
/// the workflow of that employee records its ticket and moves on, in the
/// transaction that marks the command `Sent` (`rfidl_runtime::responses`).
pub struct LaptopAnswers;

impl LaptopAnswers {
    /// The employee the answer is for: the command was sent with
    /// `@correlate(employee_id)`.
    fn employee<'a>(answer: &Answer<'a>) -> Result<&'a str, HandlerError> {
        answer
            .correlation_id
            .ok_or_else(|| HandlerError::poison("a laptop answer without its employee id"))
    }

    fn ticket_arrived(
        answer: &Answer<'_>,
        tx: &Transaction<'_>,
        ticket: &LaptopTicket,
    ) -> Result<(), HandlerError> {
        let employee_id = Self::employee(answer)?;
        tx.execute(RECORD_TICKET.sqlite, params![employee_id, ticket.ticket])?;
        Ok(())
    }

    async fn ticket_arrived_async(
        answer: &Answer<'_>,
        conn: &mut PgConnection,
        ticket: &LaptopTicket,
    ) -> Result<(), HandlerError> {
        let employee_id = Self::employee(answer)?;
        sqlx::query(RECORD_TICKET.postgres)
            .bind(employee_id)
            .bind(&ticket.ticket)
            .execute(conn)
            .await
            .map_err(HandlerError::retryable)?;
        Ok(())
    }
}

impl emp_service_v1::ServiceAnswers<Sqlite> for LaptopAnswers {
    fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        tx: &Transaction<'_>,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        Self::ticket_arrived(answer, tx, &response)
    }
}

impl emp_service_v2::ServiceAnswers<Sqlite> for LaptopAnswers {
    fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        tx: &Transaction<'_>,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        Self::ticket_arrived(answer, tx, &response)
    }
}

impl emp_service_v1::aio::ServiceAnswers<Postgres> for LaptopAnswers {
    async fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        conn: &mut PgConnection,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        Self::ticket_arrived_async(answer, conn, &response).await
    }
}

impl emp_service_v2::aio::ServiceAnswers<Postgres> for LaptopAnswers {
    async fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        conn: &mut PgConnection,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        Self::ticket_arrived_async(answer, conn, &response).await
    }
}

/// Acts on `ProvisionLaptop` commands (both versions, both stores) that end
/// `Failed`, `DeadLetter` or `Expired`: a ticket for a human
/// (`human_tickets`), in the transaction that ends the command
/// (`rfidl_runtime::failures`), so exactly one per command.
pub struct LaptopFailures;

impl LaptopFailures {
    fn log(failure: &Failure<'_>, employee_id: Uuid) {
        tracing::warn!(
            message_id = %failure.message_id,
            %employee_id,
            status = %failure.status,
            "laptop command not delivered; a human takes over"
        );
    }

    fn open_ticket(
        failure: &Failure<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        model: &str,
    ) -> Result<(), HandlerError> {
        Self::log(failure, employee_id);
        tx.execute(
            OPEN_HUMAN_TICKET.sqlite,
            params![
                failure.message_id,
                employee_id.to_string(),
                model,
                failure.status.as_str(),
                failure.error
            ],
        )?;
        Ok(())
    }

    async fn open_ticket_async(
        failure: &Failure<'_>,
        conn: &mut PgConnection,
        employee_id: Uuid,
        model: &str,
    ) -> Result<(), HandlerError> {
        Self::log(failure, employee_id);
        sqlx::query(OPEN_HUMAN_TICKET.postgres)
            .bind(failure.message_id)
            .bind(employee_id.to_string())
            .bind(model)
            .bind(failure.status.as_str())
            .bind(failure.error)
            .execute(conn)
            .await
            .map_err(HandlerError::retryable)?;
        Ok(())
    }
}

impl emp_service_v1::ServiceFailures<Sqlite> for LaptopFailures {
    fn provision_laptop(
        &self,
        failure: &Failure<'_>,
        tx: &Transaction<'_>,
        request: emp_service_v1::ProvisionLaptopRequest,
    ) -> Result<(), HandlerError> {
        Self::open_ticket(failure, tx, request.employee_id, &request.model)
    }
}

impl emp_service_v2::ServiceFailures<Sqlite> for LaptopFailures {
    fn provision_laptop(
        &self,
        failure: &Failure<'_>,
        tx: &Transaction<'_>,
        request: emp_service_v2::ProvisionLaptopRequest,
    ) -> Result<(), HandlerError> {
        Self::open_ticket(failure, tx, request.employee_id, &request.model)
    }
}

impl emp_service_v1::aio::ServiceFailures<Postgres> for LaptopFailures {
    async fn provision_laptop(
        &self,
        failure: &Failure<'_>,
        conn: &mut PgConnection,
        request: emp_service_v1::ProvisionLaptopRequest,
    ) -> Result<(), HandlerError> {
        Self::open_ticket_async(failure, conn, request.employee_id, &request.model).await
    }
}

impl emp_service_v2::aio::ServiceFailures<Postgres> for LaptopFailures {
    async fn provision_laptop(
        &self,
        failure: &Failure<'_>,
        conn: &mut PgConnection,
        request: emp_service_v2::ProvisionLaptopRequest,
    ) -> Result<(), HandlerError> {
        Self::open_ticket_async(failure, conn, request.employee_id, &request.model).await
    }
}

/// Handles the pushcalls and signals of both versions; `C` is the pair of
/// clients it sends `ProvisionLaptop` with, which names the store:
/// [`SqliteClients`] or [`PgClients`].
pub struct Workflows<C> {
    clients: C,
    slow: SlowHandler,
    hires: AtomicU32,
}

/// The engine's clients of HR on SQLite (rusqlite, synchronous).
pub struct SqliteClients {
    v1: emp_service_v1::ServiceClient<Sqlite>,
    v2: emp_service_v2::ServiceClient<Sqlite>,
}

/// The engine's clients of HR on PostgreSQL (sqlx, async).
pub struct PgClients {
    v1: emp_service_v1::aio::ServiceClient<Postgres>,
    v2: emp_service_v2::aio::ServiceClient<Postgres>,
}

/// A fault drill: makes one hire handler in `every` take `delay` (inside
/// its transaction). The default, a zero delay, is the real engine.
#[derive(Debug, Clone, Copy)]
pub struct SlowHandler {
    pub delay: std::time::Duration,
    pub every: u32,
}

impl Default for SlowHandler {
    fn default() -> Self {
        Self {
            delay: std::time::Duration::ZERO,
            every: 1,
        }
    }
}

impl<C> Workflows<C> {
    fn new(clients: C, slow: SlowHandler) -> Self {
        Self {
            clients,
            slow,
            hires: AtomicU32::new(0),
        }
    }

    /// How long this hire's handler waits first: the fault drill's delay
    /// for one hire in `every`, else none.
    fn drill(&self) -> Option<std::time::Duration> {
        let slow = !self.slow.delay.is_zero()
            && self
                .hires
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(self.slow.every);
        slow.then_some(self.slow.delay)
    }
}

/// What a hire's workflow starts with: a fresh random id (nothing in
/// process memory decides what is stored), and the answer to the hire.
fn new_workflow() -> (Uuid, HireAck) {
    let workflow_id = Uuid::now_v7();
    (workflow_id, HireAck { workflow_id })
}

impl Workflows<SqliteClients> {
    fn start_workflow(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee: &Employee,
        version: u32,
    ) -> Result<HireAck, HandlerError> {
        if let Some(delay) = self.drill() {
            std::thread::sleep(delay);
        }
        let (workflow_id, ack) = new_workflow();
        tx.execute(
            INSERT_WORKFLOW.sqlite,
            params![
                workflow_id.to_string(),
                employee.id.to_string(),
                version,
                call.message_id
            ],
        )?;
        // The command to HR commits with the workflow row, or not at all.
        let model = LAPTOP_MODEL.to_owned();
        if version == 1 {
            self.clients.v1.provision_laptop(tx, employee.id, model)?;
        } else {
            let ship_to = employee.home.clone();
            (self.clients.v2).provision_laptop(tx, employee.id, model, ship_to)?;
        }
        Ok(ack)
    }

    fn finish_workflow(tx: &Transaction<'_>, employee_id: Uuid) -> Result<(), HandlerError> {
        tx.execute(FINISH_WORKFLOW.sqlite, [employee_id.to_string()])?;
        Ok(())
    }
}

impl Workflows<PgClients> {
    async fn start_workflow(
        &self,
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee: &Employee,
        version: u32,
    ) -> Result<HireAck, HandlerError> {
        if let Some(delay) = self.drill() {
            tokio::time::sleep(delay).await;
        }
        let (workflow_id, ack) = new_workflow();
        sqlx::query(INSERT_WORKFLOW.postgres)
            .bind(workflow_id.to_string())
            .bind(employee.id.to_string())
            .bind(i64::from(version))
            .bind(call.message_id)
            .execute(&mut *conn)
            .await
            .map_err(HandlerError::retryable)?;
        // The command to HR commits with the workflow row, or not at all.
        let model = LAPTOP_MODEL.to_owned();
        if version == 1 {
            (self.clients.v1)
                .provision_laptop(conn, employee.id, model)
                .await?;
        } else {
            let ship_to = employee.home.clone();
            (self.clients.v2)
                .provision_laptop(conn, employee.id, model, ship_to)
                .await?;
        }
        Ok(ack)
    }

    async fn finish_workflow(
        conn: &mut PgConnection,
        employee_id: Uuid,
    ) -> Result<(), HandlerError> {
        sqlx::query(FINISH_WORKFLOW.postgres)
            .bind(employee_id.to_string())
            .execute(conn)
            .await
            .map_err(HandlerError::retryable)?;
        Ok(())
    }
}

impl emp_service_v1::EngineHandler<Sqlite> for Workflows<SqliteClients> {
    fn employee_hired(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee: Employee,
    ) -> Result<HireAck, HandlerError> {
        self.start_workflow(call, tx, &employee, 1)
    }

    fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        _at: Timestamp,
    ) -> Result<(), HandlerError> {
        Self::finish_workflow(tx, employee_id)
    }
}

impl emp_service_v2::EngineHandler<Sqlite> for Workflows<SqliteClients> {
    fn employee_hired(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee: Employee,
        _channel: common::Channel,
        _referral_code: Option<String>,
    ) -> Result<HireAck, HandlerError> {
        self.start_workflow(call, tx, &employee, 2)
    }

    fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee_id: Uuid,
        _at: Timestamp,
    ) -> Result<(), HandlerError> {
        Self::finish_workflow(tx, employee_id)
    }

    fn leave_started(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &Transaction<'_>,
        _employee_id: Uuid,
        _length: Duration,
        _reason: Option<String>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    fn org_chart_changed(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &Transaction<'_>,
        _root: OrgUnit,
        _version: u32,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl emp_service_v1::aio::EngineHandler<Postgres> for Workflows<PgClients> {
    async fn employee_hired(
        &self,
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee: Employee,
    ) -> Result<HireAck, HandlerError> {
        self.start_workflow(call, conn, &employee, 1).await
    }

    async fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee_id: Uuid,
        _at: Timestamp,
    ) -> Result<(), HandlerError> {
        Self::finish_workflow(conn, employee_id).await
    }
}

impl emp_service_v2::aio::EngineHandler<Postgres> for Workflows<PgClients> {
    async fn employee_hired(
        &self,
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee: Employee,
        _channel: common::Channel,
        _referral_code: Option<String>,
    ) -> Result<HireAck, HandlerError> {
        self.start_workflow(call, conn, &employee, 2).await
    }

    async fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        employee_id: Uuid,
        _at: Timestamp,
    ) -> Result<(), HandlerError> {
        Self::finish_workflow(conn, employee_id).await
    }

    async fn leave_started(
        &self,
        _call: &IncomingCall<'_>,
        _conn: &mut PgConnection,
        _employee_id: Uuid,
        _length: Duration,
        _reason: Option<String>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    async fn org_chart_changed(
        &self,
        _call: &IncomingCall<'_>,
        _conn: &mut PgConnection,
        _root: OrgUnit,
        _version: u32,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A running engine.
pub struct Engine {
    pub db: Database,
    pub url: String,
    /// Where its receiver is also served over gRPC (`--grpc-listen`).
    pub grpc_url: Option<String>,
    /// Its outbox's dispatcher, receiver, diagnostics, retention, JetStream
    /// consumers and registration (`--registry`).
    pub host: Host,
    /// The HTTP server the demo runs itself to take it down and up again
    /// ([`Engine::start_for_outages`]); `None`: the host serves.
    outages: Option<OwnServer>,
}

/// An HTTP server of the engine's routes that an outage aborts.
struct OwnServer {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl OwnServer {
    fn serve(listener: tokio::net::TcpListener, router: axum::Router) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let until = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if let Err(error) = rfidl_runtime::serve(listener, router)
                .with_graceful_shutdown(until)
                .await
            {
                tracing::error!(%error, "server stopped");
            }
        });
        Ok(Self { addr, stop, task })
    }
}

impl Engine {
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        Self::start_with(settings, SlowHandler::default()).await
    }

    /// [`Engine::start`] with a fault drill for its hire handler, on the
    /// store `--db` names.
    pub async fn start_with(settings: &Settings, slow: SlowHandler) -> anyhow::Result<Self> {
        Self::start_on(settings, slow, false).await
    }

    /// [`Engine::start`], its HTTP served by the demo so that
    /// [`take_down`](Self::take_down) can cut it (the in-process demo's
    /// outage).
    pub async fn start_for_outages(settings: &Settings) -> anyhow::Result<Self> {
        Self::start_on(settings, SlowHandler::default(), true).await
    }

    async fn start_on(
        settings: &Settings,
        slow: SlowHandler,
        outages: bool,
    ) -> anyhow::Result<Self> {
        let config = settings.runtime_config(HR);
        // One receiver serves EmpService v1 and v2 side by side; HR's
        // answers to its ProvisionLaptop commands (over HTTP, or back
        // through the broker) run the same handlers, once per answer.
        match &settings.db {
            Database::Sqlite(path) => {
                super::store::create_sqlite_tables(path, &SCHEMA)?;
                let host = Host::builder(config, path.as_path());
                let workflows = Arc::new(Workflows::new(
                    SqliteClients {
                        v1: emp_service_v1::ServiceClient::new(host.outbox().clone(), HR),
                        v2: emp_service_v2::ServiceClient::new(host.outbox().clone(), HR),
                    },
                    slow,
                ));
                let host = host
                    .service(emp_service_v1::EngineReceiver(workflows.clone()))
                    .service(emp_service_v2::EngineReceiver(workflows))
                    .responses(emp_service_v1::ServiceAnswerRouter(LaptopAnswers))
                    .responses(emp_service_v2::ServiceAnswerRouter(LaptopAnswers))
                    // A laptop command that will not be delivered: a human
                    // takes over.
                    .failures(emp_service_v1::ServiceFailureRouter(LaptopFailures))
                    .failures(emp_service_v2::ServiceFailureRouter(LaptopFailures));
                Self::serve(settings, host, outages).await
            }
            Database::Postgres(database) => {
                let pool = database.pool().await?;
                pg::create_schema(&pool, database, SCHEMA.postgres).await?;
                let host = pg::host(config, &pool, database).await?;
                let workflows = Arc::new(Workflows::new(
                    PgClients {
                        v1: emp_service_v1::aio::ServiceClient::new(host.outbox().clone(), HR),
                        v2: emp_service_v2::aio::ServiceClient::new(host.outbox().clone(), HR),
                    },
                    slow,
                ));
                let host = host
                    .service(emp_service_v1::aio::EngineReceiver(workflows.clone()))
                    .service(emp_service_v2::aio::EngineReceiver(workflows))
                    .responses(emp_service_v1::aio::ServiceAnswerRouter(LaptopAnswers))
                    .responses(emp_service_v2::aio::ServiceAnswerRouter(LaptopAnswers))
                    .failures(emp_service_v1::aio::ServiceFailureRouter(LaptopFailures))
                    .failures(emp_service_v2::aio::ServiceFailureRouter(LaptopFailures));
                Self::serve(settings, host, outages).await
            }
        }
    }

    /// The rest of the start, the same on both stores.
    async fn serve<S: AnyStore>(
        settings: &Settings,
        host: HostBuilder<S>,
        outages: bool,
    ) -> anyhow::Result<Self> {
        // The engine calls EmpService (its commands go to HR) and hosts
        // nothing: nothing to publish.
        let host = host.directory(Vec::new(), super::emp_service_versions());
        let host = super::options(host, settings).await?;
        let (host, outages) = if outages {
            let listener = tokio::net::TcpListener::bind(settings.listen).await?;
            let host = host
                .start_unserved(format!("http://{}", listener.local_addr()?))
                .await?;
            let server = OwnServer::serve(listener, host.router())?;
            (host, Some(server))
        } else {
            (host.listen(settings.listen).await?, None)
        };
        Ok(Self {
            db: settings.db.clone(),
            url: host.url().to_owned(),
            grpc_url: host.grpc_addr().map(|addr| format!("grpc://{addr}")),
            host,
            outages,
        })
    }

    /// Stops answering HTTP (the process stays up): an outage as HR sees it.
    pub fn take_down(&self) {
        if let Some(server) = &self.outages {
            server.task.abort();
        }
    }

    /// Listens again on the same address.
    pub async fn bring_up(&mut self) -> anyhow::Result<()> {
        if let Some(server) = &mut self.outages {
            let listener = tokio::net::TcpListener::bind(server.addr).await?;
            *server = OwnServer::serve(listener, self.host.router())?;
        }
        Ok(())
    }

    /// Stops the engine gracefully (`Host::shutdown`), its own server first.
    pub async fn stop(self) -> Result<(), rfidl_runtime::host::HostError> {
        if let Some(server) = self.outages {
            server.stop.cancel();
            let _ = server.task.await;
        }
        self.host.shutdown().await
    }
}
