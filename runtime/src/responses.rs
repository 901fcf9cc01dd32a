//! Acting on answers, exactly once.
//!
//! A `command` (and a `pushcall`) may declare a response: the receiver's
//! handler returns it, the receiver sends it back in the acknowledgement, and
//! the sender's dispatcher stores it in the outbox row when it marks the row
//! `Sent`. A [`ResponseHandler`] registered with
//! [`DispatcherBuilder::responses`](crate::dispatcher::DispatcherBuilder::responses)
//! runs inside that same transaction, so what it writes commits together with
//! the row's `Sent` status: exactly once. If it fails, its writes and the
//! status change roll back together (a savepoint), the row goes back to
//! `Pending` with the error in `last_error`, and the next attempt gets the
//! same answer from the receiver's inbox (a duplicate is answered with the
//! stored response) and runs the handler again, until `max_retries`, after
//! which the row is `Failed` for an operator.
//!
//! Generated code implements this trait for each service version whose
//! client may receive answers (`ServiceAnswerRouter` / `EngineAnswerRouter`
//! around a typed `ServiceAnswers` / `EngineAnswers` trait).

use crate::receiver::HandlerError;
use std::sync::Arc;

use crate::receiver::handler::{Awaited, Blocking, Registered};
use crate::store::{AnyStore, AsyncStore, Sqlite, Store};

/// One answer as the sender received it.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The id of the message this answers.
    pub message_id: &'a str,
    /// `package.Service` of the message.
    pub interface: &'a str,
    /// Its interface version.
    pub version: u32,
    /// The method, as named in the contract (`ProvisionLaptop`).
    pub endpoint: &'a str,
    /// The correlation key the message was sent with (`@correlate`).
    pub correlation_id: Option<&'a str>,
    /// The response as JSON (`null` for a method without one).
    pub payload: &'a serde_json::Value,
}

/// Acts on the answers to messages of one interface version.
///
/// `S` is the sender's [`Store`]: `tx` is a `&rusqlite::Transaction` for
/// [`Sqlite`] (the default). On a sqlx store: [`AsyncResponseHandler`].
pub trait ResponseHandler<S: Store = Sqlite>: Send + Sync + 'static {
    /// The interface (`package.Service`) and version whose answers this takes.
    fn interface(&self) -> (&'static str, u32);

    /// Runs inside the transaction that marks the message `Sent` and stores
    /// the response: write effects through `tx`.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`]: the transaction rolls back to before the row was
    /// marked, and the message is sent (and answered) again later.
    fn handle(&self, answer: &Answer<'_>, tx: S::Handle<'_, '_>) -> Result<(), HandlerError>;
}

/// [`ResponseHandler`] for a sqlx store: acts on the answers of one
/// interface version inside the transaction that marks each message `Sent`,
/// awaited. `conn` is that transaction's connection (`&mut sqlx::PgConnection`
/// for `sqlx::Postgres`, `&mut sqlx::SqliteConnection` for `sqlx::Sqlite`).
pub trait AsyncResponseHandler<S: AsyncStore>: Send + Sync + 'static {
    /// The interface (`package.Service`) and version whose answers this takes.
    fn interface(&self) -> (&'static str, u32);

    /// Runs inside the transaction that marks the message `Sent`: write
    /// effects through `conn`.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`]: the transaction rolls back to before the row was
    /// marked, and the message is sent (and answered) again later.
    fn handle<'a>(
        &'a self,
        answer: &'a Answer<'a>,
        conn: &'a mut S::Connection,
    ) -> crate::BoxFuture<'a, Result<(), HandlerError>>;
}

/// What [`DispatcherBuilder::responses`](crate::dispatcher::DispatcherBuilder::responses)
/// takes: a [`ResponseHandler`] on a store with blocking transactions, an
/// [`AsyncResponseHandler`] on a sqlx store. `M` tells the two apart and is
/// inferred; implemented for every such handler.
pub trait IntoResponder<S: AnyStore, M> {
    /// The handler as the dispatcher keeps it.
    fn into_responder(self) -> Registered<S::Responder>;
}

impl<S: Store, T: ResponseHandler<S>> IntoResponder<S, Blocking> for T {
    fn into_responder(self) -> Registered<S::Responder> {
        Registered(Arc::new(self))
    }
}

impl<S: AsyncStore, T: AsyncResponseHandler<S>> IntoResponder<S, Awaited> for T {
    fn into_responder(self) -> Registered<S::Responder> {
        Registered(Arc::new(self))
    }
}
