//! Acting on messages that will never be delivered, exactly once.
//!
//! The sender's dispatcher ends an outbox row `Failed` (a human decides),
//! `DeadLetter` (the receiver refused it for good, or its retries ran out)
//! or `Expired` (its time to live passed before it was delivered). A
//! [`FailureHandler`] registered with
//! [`DispatcherBuilder::failures`](crate::dispatcher::DispatcherBuilder::failures)
//! runs inside the transaction that writes that status, so what it writes
//! (a compensation, a row for a human, a message it enqueues through a
//! client) commits together with the status change: exactly once per
//! transition.
//!
//! * **Every transition the dispatcher makes runs it**: a refusal
//!   (`DeadLetter`, `Failed`), retries run out, a response handler that kept
//!   failing, and a time to live that passed (found when the row is due).
//!   A row past its TTL whose interface version has a failure handler is not
//!   expired by the claim that finds it but recorded right after it, in the
//!   transaction where the handler runs (on a sqlx store that is the only
//!   transaction the handler's connection can take part in).
//! * **A handler that fails does not hold the row back.** Its writes roll
//!   back (a savepoint), the row still ends in its status, and its
//!   `last_error` says `…; failure handler: <the error>`, so an operator
//!   sees both in the dead letters. It is not run again for that
//!   transition: a terminal row is never retried by itself.
//! * **A new transition is a new event.** An operator's retry
//!   (`POST /outbox/{id}/retry`) makes the row `Pending` again; if it ends
//!   in a terminal status again, the handler runs again.
//! * **Every `Expired` row of a handled version has had its handler** when
//!   retention knows the handlers: a [`Host`](crate::host::Host) starts its
//!   retention with the dispatcher's
//!   [`failure_versions`](crate::dispatcher::DispatcherHandle::failure_versions)
//!   ([`Retention::spawn_with_failure_handlers`](crate::retention::Retention::spawn_with_failure_handlers)),
//!   and retention then makes their rows past the TTL due at once instead of
//!   expiring them, for the dispatcher to expire with the handler. A
//!   retention started with [`Retention::spawn`](crate::retention::Retention::spawn)
//!   expires them itself, without the handler. A row whose destination's
//!   circuit is open ends at the circuit's next probe.
//! * **Not run** for a discard by an operator (a human decided).
//!
//! Generated code implements this trait for each service version whose
//! client sends messages (`ServiceFailureRouter` / `EngineFailureRouter`
//! around a typed `ServiceFailures` / `EngineFailures` trait).

use std::sync::Arc;

use crate::receiver::HandlerError;
use crate::receiver::handler::{Awaited, Blocking, Registered};
use crate::store::{AnyStore, AsyncStore, Sqlite, Store};

/// The terminal status an outbox row has just been given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FinalStatus {
    /// A human decides (the receiver cannot tell whether it processed the
    /// message before, or a response handler kept failing).
    Failed,
    /// The receiver refused the message for good, or its retries ran out.
    DeadLetter,
    /// Its time to live passed before it was delivered.
    Expired,
}

impl FinalStatus {
    /// The status as stored and shown (`"DeadLetter"`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinalStatus::Failed => "Failed",
            FinalStatus::DeadLetter => "DeadLetter",
            FinalStatus::Expired => "Expired",
        }
    }
}

impl std::fmt::Display for FinalStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message that will not be delivered, as the sender stored it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Failure<'a> {
    /// The message's id.
    pub message_id: &'a str,
    /// The status the row now has.
    pub status: FinalStatus,
    /// `package.Service` of the message.
    pub interface: &'a str,
    /// Its interface version.
    pub version: u32,
    /// The method, as named in the contract (`ProvisionLaptop`).
    pub endpoint: &'a str,
    /// The correlation key the message was sent with (`@correlate`).
    pub correlation_id: Option<&'a str>,
    /// Failed attempts counted against `max_retries` before this end.
    pub retries: u32,
    /// Why: the receiver's answer (`422 invalid_payload: …`), the last
    /// error when retries ran out, or `time to live exceeded`.
    pub error: &'a str,
    /// The trace id of the message's `traceparent`, if it has one (32 hex
    /// digits). Messages the handler enqueues continue that trace.
    pub trace_id: Option<&'a str>,
    /// When the message was enqueued (Unix milliseconds).
    pub created_at_ms: i64,
    /// The request as JSON, one member per parameter.
    pub payload: &'a serde_json::Value,
}

impl Failure<'_> {
    /// The receiver's error code when [`error`](Self::error) is a refusal
    /// of the form `422 invalid_payload: …` (`invalid_payload`).
    pub fn code(&self) -> Option<&str> {
        let (status, rest) = self.error.split_once(' ')?;
        if status.len() != 3 || !status.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (code, _) = rest.split_once(':')?;
        let code_chars = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        (!code.is_empty() && code.chars().all(code_chars)).then_some(code)
    }
}

/// Acts on the messages of one interface version that end `Failed`,
/// `DeadLetter` or `Expired`.
///
/// `S` is the sender's [`Store`]: `tx` is a `&rusqlite::Transaction` for
/// [`Sqlite`] (the default, the only store with blocking transactions); the
/// sqlx stores take an [`AsyncFailureHandler`].
pub trait FailureHandler<S: Store = Sqlite>: Send + Sync + 'static {
    /// The interface (`package.Service`) and version whose messages this takes.
    fn interface(&self) -> (&'static str, u32);

    /// Runs inside the transaction that gives the row its terminal status:
    /// write effects through `tx`.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`]: its writes roll back, the row still ends in its
    /// status, with the error appended to its `last_error`.
    fn handle(&self, failure: &Failure<'_>, tx: S::Handle<'_, '_>) -> Result<(), HandlerError>;
}

/// [`FailureHandler`] for a sqlx store, awaited: `conn` is the connection
/// of the transaction that gives the row its terminal status
/// (`&mut sqlx::PgConnection` for `sqlx::Postgres`,
/// `&mut sqlx::SqliteConnection` for `sqlx::Sqlite`).
pub trait AsyncFailureHandler<S: AsyncStore>: Send + Sync + 'static {
    /// The interface (`package.Service`) and version whose messages this takes.
    fn interface(&self) -> (&'static str, u32);

    /// Runs inside the transaction that gives the row its terminal status:
    /// write effects through `conn`.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`]: its writes roll back, the row still ends in its
    /// status, with the error appended to its `last_error`.
    fn handle<'a>(
        &'a self,
        failure: &'a Failure<'a>,
        conn: &'a mut S::Connection,
    ) -> crate::BoxFuture<'a, Result<(), HandlerError>>;
}

/// What [`DispatcherBuilder::failures`](crate::dispatcher::DispatcherBuilder::failures)
/// takes: a [`FailureHandler`] on a store with blocking transactions, an
/// [`AsyncFailureHandler`] on a sqlx store. `M` tells the two apart and is
/// inferred; implemented for every such handler.
pub trait IntoFailureHandler<S: AnyStore, M> {
    /// The handler as the dispatcher keeps it, and the interface version
    /// it acts on.
    fn into_failure_handler(self) -> (Registered<S::OnFailure>, (&'static str, u32));
}

impl<S: Store, T: FailureHandler<S>> IntoFailureHandler<S, Blocking> for T {
    fn into_failure_handler(self) -> (Registered<S::OnFailure>, (&'static str, u32)) {
        let key = self.interface();
        (Registered(Arc::new(self)), key)
    }
}

impl<S: AsyncStore, T: AsyncFailureHandler<S>> IntoFailureHandler<S, Awaited> for T {
    fn into_failure_handler(self) -> (Registered<S::OnFailure>, (&'static str, u32)) {
        let key = self.interface();
        (Registered(Arc::new(self)), key)
    }
}

/// The failure handlers of a dispatcher, each with the interface version
/// it acts on (at most one per version: `DispatcherBuilder::start` checks).
pub(crate) struct FailureHandlers<H: ?Sized> {
    handlers: Vec<((&'static str, u32), Arc<H>)>,
}

impl<H: ?Sized> Default for FailureHandlers<H> {
    fn default() -> Self {
        Self {
            handlers: Vec::new(),
        }
    }
}

impl<H: ?Sized> Clone for FailureHandlers<H> {
    fn clone(&self) -> Self {
        Self {
            handlers: self.handlers.clone(),
        }
    }
}

impl<H: ?Sized> FailureHandlers<H> {
    pub(crate) fn push(&mut self, key: (&'static str, u32), handler: Arc<H>) {
        self.handlers.push((key, handler));
    }

    /// The handler of an interface version.
    pub(crate) fn get(&self, interface: &str, version: u32) -> Option<&Arc<H>> {
        self.handlers
            .iter()
            .find(|((i, v), _)| *i == interface && *v == version)
            .map(|(_, handler)| handler)
    }

    #[cfg(feature = "sqlx-sqlite")]
    pub(crate) fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// The first interface version registered twice.
    pub(crate) fn duplicate(&self) -> Option<(&'static str, u32)> {
        self.handlers.iter().enumerate().find_map(|(n, (key, _))| {
            self.handlers[..n]
                .iter()
                .any(|(earlier, _)| earlier == key)
                .then_some(*key)
        })
    }

    /// The interface versions with a handler: for a claim on a connection
    /// the handlers cannot run on, which only needs to know which rows have
    /// one (`records::Claim::expiring`), and for retention, which leaves
    /// their expiry to the dispatcher.
    pub(crate) fn keys(&self) -> Vec<(&'static str, u32)> {
        self.handlers.iter().map(|(key, _)| *key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(error: &str) -> Failure<'_> {
        Failure {
            message_id: "m",
            status: FinalStatus::DeadLetter,
            interface: "i.I",
            version: 1,
            endpoint: "E",
            correlation_id: None,
            retries: 0,
            error,
            trace_id: None,
            created_at_ms: 0,
            payload: &serde_json::Value::Null,
        }
    }

    #[test]
    fn the_code_is_read_from_a_refusal_only() {
        assert_eq!(
            failure("422 invalid_payload: bad").code(),
            Some("invalid_payload")
        );
        assert_eq!(failure("time to live exceeded").code(), None);
        assert_eq!(failure("500 : x").code(), None);
        assert_eq!(failure("4222 x_y: z").code(), None);
        assert_eq!(failure("404 Not Found: z").code(), None);
    }
}
