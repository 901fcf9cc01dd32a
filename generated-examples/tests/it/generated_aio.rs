//! The async API of the checked-in generated code (each service version's
//! `aio` module, for sqlx stores) as a user writes against it: handlers and
//! answer handlers implemented with `async fn`, generically over the store,
//! enqueueing through an `aio` client on the handler's own connection, and
//! hosted by the generated receivers and answer routers.
//!
//! No store implements `AsyncStore` yet (the sqlx ones come behind cargo
//! features of rfidl-runtime), so nothing here can run: this is a compile
//! test. It fails by not building, for instance when a generated trait
//! stops promising a `Send` future or a router stops being a service.

#![allow(
    deprecated,
    reason = "EmpService v1 is deprecated in the contract; it is the smallest version with both directions and an answer"
)]

use std::sync::Arc;

use rfidl_examples::generated::hr::employees::{Employee, HireAck, LaptopTicket, emp_service_v1};
use rfidl_runtime::AsyncStore;
use rfidl_runtime::receiver::{AsyncHostedService, HandlerError, IncomingCall};
use rfidl_runtime::responses::{Answer, AsyncResponseHandler};
use rfidl_runtime::types::{Timestamp, Uuid};

use emp_service_v1::aio;

/// The engine's side, for any async store: it answers a hire and asks the
/// service for a laptop in the same transaction.
struct Engine<S: AsyncStore> {
    laptops: aio::ServiceClient<S>,
}

impl<S: AsyncStore> aio::EngineHandler<S> for Engine<S> {
    async fn employee_hired(
        &self,
        _call: &IncomingCall<'_>,
        conn: &mut S::Connection,
        employee: Employee,
    ) -> Result<HireAck, HandlerError> {
        // Two awaits on one connection: the future holds `conn` across them.
        self.laptops
            .provision_laptop(conn, employee.id, "standard".to_owned())
            .await?;
        self.laptops
            .provision_laptop(conn, employee.id, "spare".to_owned())
            .await?;
        // A durable timer through the async client's scoped view.
        self.laptops
            .deliver_after(std::time::Duration::from_secs(7 * 24 * 3600))
            .provision_laptop(conn, employee.id, "return reminder".to_owned())
            .await?;
        Ok(HireAck {
            workflow_id: employee.id,
        })
    }

    async fn onboarding_completed(
        &self,
        _call: &IncomingCall<'_>,
        _conn: &mut S::Connection,
        _employee_id: Uuid,
        _completed_at: Timestamp,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// The engine acting on the service's answers (laptop tickets).
struct Tickets;

impl<S: AsyncStore> aio::ServiceAnswers<S> for Tickets {
    async fn provision_laptop(
        &self,
        answer: &Answer<'_>,
        _conn: &mut S::Connection,
        response: LaptopTicket,
    ) -> Result<(), HandlerError> {
        if response.ticket.is_empty() {
            return Err(HandlerError::poison(format!(
                "empty ticket for {}",
                answer.message_id
            )));
        }
        Ok(())
    }
}

fn hosts<S: AsyncStore, T: AsyncHostedService<S>>(_: T) {}

fn answers<S: AsyncStore, T: AsyncResponseHandler<S>>(_: T) {}

/// What a program on a sqlx store would register, for any such store.
#[allow(
    dead_code,
    reason = "compiled, not run: no store implements AsyncStore yet"
)]
fn register<S: AsyncStore>(laptops: aio::ServiceClient<S>) {
    let engine = Arc::new(Engine { laptops });
    hosts::<S, _>(aio::EngineReceiver(Arc::clone(&engine)));
    hosts::<S, _>(aio::EngineReceiver(engine));
    answers::<S, _>(aio::ServiceAnswerRouter(Tickets));
}
