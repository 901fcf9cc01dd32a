//! The stand-in workflow engine: records hires as workflows (exactly once)
//! and asks HR for a laptop, in the same transaction, through the outbox;
//! when HR's answer (the laptop ticket) arrives, the workflow moves on in the
//! transaction that records the answer (exactly once too). A laptop command
//! that HR refuses, or that expires before HR is reached, opens a ticket for
//! a human instead, in the transaction that ends the command (once).

// EmpService v1 is deprecated in the contract, and this demo serves and
// sends it on purpose: old clients keep using v1 while new ones move to v2.
#![allow(deprecated)]

use rfidl_runtime::failures::Failure;
use rfidl_runtime::receiver::{HandlerError, IncomingCall};
use rfidl_runtime::responses::Answer;
use rfidl_runtime::types::{Duration, Timestamp, Uuid};
use rfidl_runtime::{Database, Host, Postgres, Sqlite};
use tokio_util::sync::CancellationToken;

use super::Settings;
use super::store::{DemoStore, HumanTicket, Schema};
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
pub const SCHEMA: Schema = Schema {
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

/// Acts on HR's answers to `ProvisionLaptop` (both versions): the workflow
/// of that employee records its ticket and moves on, in the transaction that
/// marks the command `Sent` (`rfidl_runtime::responses`).
pub struct LaptopAnswers;

impl LaptopAnswers {
    fn ticket_arrived<S: DemoStore>(
        answer: &Answer<'_>,
        mut tx: S::Handle<'_, '_>,
        ticket: &LaptopTicket,
    ) -> Result<(), HandlerError> {
        // The command was sent with `@correlate(employee_id)`.
        let employee_id = answer
            .correlation_id
            .ok_or_else(|| HandlerError::poison("a laptop answer without its employee id"))?;
        S::record_ticket(&mut tx, employee_id, &ticket.ticket)
    }
}

impl<S: DemoStore> emp_service_v1::ServiceAnswers<S> for LaptopAnswers {
    fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        tx: S::Handle<'_, '_>,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        Self::ticket_arrived::<S>(answer, tx, &response)
    }
}

impl<S: DemoStore> emp_service_v2::ServiceAnswers<S> for LaptopAnswers {
    fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        tx: S::Handle<'_, '_>,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        Self::ticket_arrived::<S>(answer, tx, &response)
    }
}

/// Acts on `ProvisionLaptop` commands (both versions) that end `Failed`,
/// `DeadLetter` or `Expired`: a ticket for a human (`human_tickets`), in
/// the transaction that ends the command (`rfidl_runtime::failures`), so
/// exactly one per command.
pub struct LaptopFailures;

impl LaptopFailures {
    fn open_ticket<S: DemoStore>(
        failure: &Failure<'_>,
        mut tx: S::Handle<'_, '_>,
        employee_id: Uuid,
        model: &str,
    ) -> Result<(), HandlerError> {
        tracing::warn!(message_id = %failure.message_id, %employee_id, status = %failure.status, "laptop command not delivered; a human takes over");
        let ticket = HumanTicket {
            message_id: failure.message_id,
            employee_id: &employee_id.to_string(),
            model,
            status: failure.status.as_str(),
            reason: failure.error,
        };
        S::open_human_ticket(&mut tx, &ticket)
    }
}

impl<S: DemoStore> emp_service_v1::ServiceFailures<S> for LaptopFailures {
    fn provision_laptop(
        &self,
        failure: &Failure<'_>,
        tx: S::Handle<'_, '_>,
        request: emp_service_v1::ProvisionLaptopRequest,
    ) -> Result<(), HandlerError> {
        Self::open_ticket::<S>(failure, tx, request.employee_id, &request.model)
    }
}

impl<S: DemoStore> emp_service_v2::ServiceFailures<S> for LaptopFailures {
    fn provision_laptop(
        &self,
        failure: &Failure<'_>,
        tx: S::Handle<'_, '_>,
        request: emp_service_v2::ProvisionLaptopRequest,
    ) -> Result<(), HandlerError> {
        Self::open_ticket::<S>(failure, tx, request.employee_id, &request.model)
    }
}

/// Handles the pushcalls and signals of both versions, on the store `S`.
pub struct Workflows<S: DemoStore> {
    v1: emp_service_v1::ServiceClient<S>,
    v2: emp_service_v2::ServiceClient<S>,
    slow: SlowHandler,
    hires: std::sync::atomic::AtomicU32,
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

impl<S: DemoStore> Workflows<S> {
    fn start_workflow(
        &self,
        call: &IncomingCall<'_>,
        mut tx: S::Handle<'_, '_>,
        employee: &Employee,
        version: u32,
    ) -> Result<HireAck, HandlerError> {
        if !self.slow.delay.is_zero()
            && self
                .hires
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .is_multiple_of(self.slow.every)
        {
            std::thread::sleep(self.slow.delay);
        }
        // A fresh random id; nothing in process memory decides what is stored.
        let workflow_id = Uuid::now_v7();
        S::insert_workflow(
            &mut tx,
            &workflow_id.to_string(),
            &employee.id.to_string(),
            version,
            call.message_id,
        )?;
        // The command to HR commits with the workflow row, or not at all.
        if version == 1 {
            self.v1
                .provision_laptop(S::reborrow(&mut tx), employee.id, "ThinkPad T14".into())?;
        } else {
            self.v2.provision_laptop(
                S::reborrow(&mut tx),
                employee.id,
                "ThinkPad T14".into(),
                employee.home.clone(),
            )?;
        }
        Ok(HireAck { workflow_id })
    }
}

impl<S: DemoStore> emp_service_v1::EngineHandler<S> for Workflows<S> {
    fn employee_hired(
        &self,
        call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
        employee: Employee,
    ) -> Result<HireAck, HandlerError> {
        self.start_workflow(call, tx, &employee, 1)
    }

    fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
        employee_id: Uuid,
        _at: Timestamp,
    ) -> Result<(), HandlerError> {
        let mut tx = tx;
        S::finish_workflow(&mut tx, &employee_id.to_string())
    }
}

impl<S: DemoStore> emp_service_v2::EngineHandler<S> for Workflows<S> {
    fn employee_hired(
        &self,
        call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
        employee: Employee,
        _channel: common::Channel,
        _referral_code: Option<String>,
    ) -> Result<HireAck, HandlerError> {
        self.start_workflow(call, tx, &employee, 2)
    }

    fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
        employee_id: Uuid,
        _at: Timestamp,
    ) -> Result<(), HandlerError> {
        let mut tx = tx;
        S::finish_workflow(&mut tx, &employee_id.to_string())
    }

    fn leave_started(
        &self,
        _call: &IncomingCall<'_>,
        _tx: S::Handle<'_, '_>,
        _employee_id: Uuid,
        _length: Duration,
        _reason: Option<String>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    fn org_chart_changed(
        &self,
        _call: &IncomingCall<'_>,
        _tx: S::Handle<'_, '_>,
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
        match &settings.db {
            Database::Postgres(_) => Self::start_on::<Postgres>(settings, slow, false).await,
            _ => Self::start_on::<Sqlite>(settings, slow, false).await,
        }
    }

    /// [`Engine::start`], its HTTP served by the demo so that
    /// [`take_down`](Self::take_down) can cut it (the in-process demo's
    /// outage).
    pub async fn start_for_outages(settings: &Settings) -> anyhow::Result<Self> {
        let slow = SlowHandler::default();
        match &settings.db {
            Database::Postgres(_) => Self::start_on::<Postgres>(settings, slow, true).await,
            _ => Self::start_on::<Sqlite>(settings, slow, true).await,
        }
    }

    async fn start_on<S: DemoStore>(
        settings: &Settings,
        slow: SlowHandler,
        outages: bool,
    ) -> anyhow::Result<Self> {
        let config = settings.runtime_config(HR);
        S::create_schema(&settings.db, &SCHEMA)?;
        let host = S::host(config, &settings.db)?;
        let workflows = std::sync::Arc::new(Workflows::<S> {
            v1: emp_service_v1::ServiceClient::new(host.outbox().clone(), HR),
            v2: emp_service_v2::ServiceClient::new(host.outbox().clone(), HR),
            slow,
            hires: std::sync::atomic::AtomicU32::new(0),
        });
        // One receiver serves EmpService v1 and v2 side by side; HR's
        // answers to its ProvisionLaptop commands (over HTTP, or back
        // through the broker) run the same handlers, once per answer.
        let host = host
            .service(emp_service_v1::EngineReceiver(workflows.clone()))
            .service(emp_service_v2::EngineReceiver(workflows))
            .responses(emp_service_v1::ServiceAnswerRouter(LaptopAnswers))
            .responses(emp_service_v2::ServiceAnswerRouter(LaptopAnswers))
            // A laptop command that will not be delivered: a human takes over.
            .failures(emp_service_v1::ServiceFailureRouter(LaptopFailures))
            .failures(emp_service_v2::ServiceFailureRouter(LaptopFailures))
            // The engine calls EmpService (its commands go to HR) and
            // hosts nothing: nothing to publish.
            .directory(Vec::new(), super::emp_service_versions());
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
