//! The stand-in workflow engine: records hires as workflows (exactly once)
//! and asks HR for a laptop, in the same transaction, through the outbox;
//! when HR's answer (the laptop ticket) arrives, the workflow moves on in the
//! transaction that records the answer (exactly once too).

// EmpService v1 is deprecated in the contract, and this demo serves and
// sends it on purpose: old clients keep using v1 while new ones move to v2.
#![allow(deprecated)]

use rfidl_runtime::dispatcher::DispatcherHandle;
use rfidl_runtime::receiver::{HandlerError, IncomingCall, Receiver};
use rfidl_runtime::responses::Answer;
use rfidl_runtime::types::{Duration, Timestamp, Uuid};
use rfidl_runtime::{Database, Postgres, Sqlite};

use super::store::{DemoStore, Schema};
use super::{Operations, Settings};
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
",
    postgres: "
    CREATE TABLE IF NOT EXISTS workflows (
        id TEXT PRIMARY KEY, employee_id TEXT NOT NULL, version BIGINT NOT NULL, state TEXT NOT NULL,
        message_id TEXT NOT NULL UNIQUE, laptop_ticket TEXT
    );
    CREATE INDEX IF NOT EXISTS workflows_employee ON workflows (employee_id);
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
    /// The gRPC server's task (`--grpc-listen`).
    pub grpc_server: Option<tokio::task::JoinHandle<()>>,
    pub addr: std::net::SocketAddr,
    pub receiver: Receiver,
    pub dispatcher: DispatcherHandle,
    pub server: tokio::task::JoinHandle<()>,
    pub operations: Operations,
    /// Its JetStream consumers (`--nats`, `--peer-url nats://…`).
    pub broker: super::broker::Broker,
    /// Its registration with the engine registry, if `--registry` was given.
    pub directory: Option<super::Directory>,
}

impl Engine {
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        Self::start_with(settings, SlowHandler::default()).await
    }

    /// [`Engine::start`] with a fault drill for its hire handler, on the
    /// store `--db` names.
    pub async fn start_with(settings: &Settings, slow: SlowHandler) -> anyhow::Result<Self> {
        match &settings.db {
            Database::Postgres(_) => Self::start_on::<Postgres>(settings, slow).await,
            _ => Self::start_on::<Sqlite>(settings, slow).await,
        }
    }

    async fn start_on<S: DemoStore>(
        settings: &Settings,
        slow: SlowHandler,
    ) -> anyhow::Result<Self> {
        let config = settings.runtime_config(HR);
        S::create_schema(&settings.db, &SCHEMA)?;
        let outbox = S::outbox(config.clone(), &settings.db)?;
        let workflows = std::sync::Arc::new(Workflows::<S> {
            v1: emp_service_v1::ServiceClient::new(outbox.clone(), HR),
            v2: emp_service_v2::ServiceClient::new(outbox.clone(), HR),
            slow,
            hires: std::sync::atomic::AtomicU32::new(0),
        });
        // One receiver serves EmpService v1 and v2 side by side.
        let keys = settings.issued_keys();
        let mut receiver = S::receiver(config.clone(), &settings.db)?;
        if let Some(keys) = &keys {
            receiver = receiver.issued_keys(keys);
        }
        let receiver = receiver
            .service(emp_service_v1::EngineReceiver(workflows.clone()))
            .service(emp_service_v2::EngineReceiver(workflows))
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
        let addr = listener.local_addr()?;
        let server = super::serve(listener, operations.router.clone());
        let (grpc_url, grpc_server) = super::serve_grpc_receiver(settings, &receiver).await?;
        let mut dispatcher = rfidl_runtime::dispatcher::Dispatcher::builder(&outbox);
        if let Some(keys) = &keys {
            dispatcher = dispatcher.issued_keys(keys);
        }
        let dispatcher = dispatcher
            .responses(emp_service_v1::ServiceAnswerRouter(LaptopAnswers))
            .responses(emp_service_v2::ServiceAnswerRouter(LaptopAnswers))
            .start()?;
        // Over JetStream the answers to its ProvisionLaptop commands come
        // back through the broker: the same handlers, once per answer.
        let broker = super::broker::Broker::start(settings, &config, HR, &receiver, |answers| {
            let answers = answers
                .responses(emp_service_v1::ServiceAnswerRouter(LaptopAnswers))
                .responses(emp_service_v2::ServiceAnswerRouter(LaptopAnswers));
            match &keys {
                Some(keys) => answers.issued_keys(keys),
                None => answers,
            }
        })?;
        // The engine calls EmpService (its commands go to HR).
        let directory = super::register(
            &config,
            &format!("http://{addr}"),
            settings.ops_token.as_deref(),
            Vec::new(),
            super::emp_service_versions(),
            // The engine hosts nothing: nothing to publish.
            None,
            keys.as_ref(),
        );
        Ok(Self {
            db: settings.db.clone(),
            url: format!("http://{addr}"),
            grpc_url,
            grpc_server,
            directory,
            addr,
            receiver,
            dispatcher,
            server,
            operations,
            broker,
        })
    }

    /// Stops answering HTTP (the process stays up): an outage as HR sees it.
    pub fn take_down(&self) {
        self.server.abort();
    }

    /// Listens again on the same address.
    pub async fn bring_up(&mut self) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::bind(self.addr).await?;
        self.server = super::serve(listener, self.operations.router.clone());
        Ok(())
    }
}
