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
use crate::store::{Sqlite, Store};

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
/// [`Sqlite`] (the default) and a `&mut postgres::Transaction` for `Postgres`.
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
