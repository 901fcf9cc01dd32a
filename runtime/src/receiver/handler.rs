//! The handler contract between the receiver and the code it hosts.
//!
//! Generated code implements [`HostedService`] (one implementation per
//! handler trait of a contract); hand-written services may too. The receiver
//! owns everything around it: signature, routing to a hosted
//! (interface, version, endpoint), the inbox and the transaction. A hosted
//! service only decodes the payload, does its work in the transaction it is
//! given, and returns the answer payload.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::envelope::MessageType;
use std::sync::Arc;

use crate::store::{AnyStore, AsyncStore, Sqlite, Store};

/// One interface version a service hosts, as generated (`HOSTED` constant of a
/// generated interface module).
///
/// The receiver reads these once, when it is built, to answer 404
/// `unknown_interface` / `unknown_version` / `unknown_endpoint` before the
/// inbox is touched, to notice a sender's differing `fingerprint`, and to
/// serve `GET /_rf/metadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostedInterface {
    /// `package.Service`, e.g. `hr.employees.EmpService`.
    pub interface: &'static str,
    /// The contract's service version (`service EmpService v2` is 2); the
    /// receiver routes on (interface, version) and hosts several versions
    /// side by side.
    pub version: u32,
    /// `sha256:<hex>` of the canonical manifest.
    pub fingerprint: &'static str,
    /// The endpoints (method names) that [`HostedService::handle`] routes.
    pub endpoints: &'static [&'static str],
    /// The canonical manifest, compact JSON; served as-is by `/_rf/metadata`.
    pub manifest_json: &'static str,
}

/// A verified, routed delivery, as a handler sees it.
///
/// Every field comes from the envelope; `source` is authenticated (its
/// signature matched one of that source's secrets) unless verification was
/// turned off with
/// [`ReceiverBuilder::danger_accept_unsigned_for_local_development`](crate::receiver::ReceiverBuilder::danger_accept_unsigned_for_local_development).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct IncomingCall<'a> {
    /// `sourceServiceId`: the sending service.
    pub source: &'a str,
    /// `messageId`, lower-case hyphenated UUID (the inbox key; store it as TEXT).
    pub message_id: &'a str,
    /// `correlationId`: the method's correlation key (its `@correlate`
    /// path's value), if the contract declares one and it was present. Not
    /// unique: many messages may share it.
    pub correlation_id: Option<&'a str>,
    /// `messageType`: what the method is declared as (a `Signal` has no
    /// response; a `Command`'s response goes back to the sender).
    pub message_type: MessageType,
    /// `interface`, `package.Service`; a hosted one (the receiver routed it).
    pub interface: &'a str,
    /// `version`: the hosted service version the call was routed to.
    pub version: u32,
    /// The sender's fingerprint (it may differ from the hosted one during a
    /// rolling deploy of a compatible revision).
    pub fingerprint: &'a str,
    /// `endpoint`: the method name, one of the hosted interface's
    /// [`endpoints`](HostedInterface::endpoints).
    pub endpoint: &'a str,
    /// The envelope's `payload`: one member per method parameter.
    pub payload: &'a serde_json::Value,
    /// The envelope's free-form `headers`, as sent (with the sender's W3C
    /// `traceparent`: [`crate::trace::TraceParent::from_headers`]).
    pub headers: &'a BTreeMap<String, String>,
}

impl<'a> IncomingCall<'a> {
    /// A call as the receiver would make it, for testing a handler without a
    /// receiver: source `"test"`, a nil message id, no correlation id,
    /// `Command`, empty fingerprint and headers. Adjust with the `with_*`
    /// methods.
    pub fn new(
        interface: &'a str,
        version: u32,
        endpoint: &'a str,
        payload: &'a serde_json::Value,
    ) -> Self {
        static NO_HEADERS: BTreeMap<String, String> = BTreeMap::new();
        Self {
            source: "test",
            message_id: "00000000-0000-0000-0000-000000000000",
            correlation_id: None,
            message_type: MessageType::Command,
            interface,
            version,
            fingerprint: "",
            endpoint,
            payload,
            headers: &NO_HEADERS,
        }
    }

    /// The same call from another source service.
    pub fn with_source(self, source: &'a str) -> Self {
        Self { source, ..self }
    }

    /// The same call with another message id.
    pub fn with_message_id(self, message_id: &'a str) -> Self {
        Self { message_id, ..self }
    }

    /// The same call with a correlation id.
    pub fn with_correlation_id(self, correlation_id: &'a str) -> Self {
        Self {
            correlation_id: Some(correlation_id),
            ..self
        }
    }
}

/// Why a handler did not process a message. Its effects are rolled back in
/// every case; the variant decides what the sender is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// The payload does not fit the method's parameters: 422
    /// `payload_mismatch`, the sender dead-letters the message.
    #[error("payload does not match the contract: {0}")]
    PayloadMismatch(String),
    /// The message can never succeed (a business rule refuses it for good):
    /// 422 `poison`, the sender dead-letters it.
    #[error("message refused for good: {0}")]
    Poison(String),
    /// Refused for good with a code of the service's own (the lifecycle's
    /// `wrong_target`, `stale_command`): 422 `code`, the sender
    /// dead-letters it. Use a code that is not one of the wire protocol's
    /// (`docs/wire-protocol.md`), and document it.
    #[error("message refused for good ({code}): {message}")]
    Refused {
        /// The wire code of the 422 answer, e.g. `wrong_target`.
        code: &'static str,
        /// The text sent as the error body's `message`; keep payload values
        /// out of it.
        message: String,
    },
    /// A failure worth retrying (a resource is down, a lock timed out): 500
    /// `handler_failed`, the sender retries with backoff.
    #[error("handler failed: {0}")]
    Retryable(String),
    /// The service listed an endpoint in [`HostedInterface::endpoints`] that
    /// its `handle` does not route: 404 `unknown_endpoint`.
    #[error("endpoint `{0}` is not routed by this service")]
    UnknownEndpoint(String),
}

/// A database error in a handler is worth retrying (busy, locked, I/O), so
/// handlers can `?` their statements.
impl From<rusqlite::Error> for HandlerError {
    fn from(error: rusqlite::Error) -> Self {
        HandlerError::Retryable(format!("database: {error}"))
    }
}

/// The runtime's own statements in a handler's transaction (the lifecycle
/// service's) fail as a handler's own would: worth retrying.
impl From<crate::store::StoreError> for HandlerError {
    fn from(error: crate::store::StoreError) -> Self {
        HandlerError::Retryable(format!("database: {error}"))
    }
}

/// A handler that enqueues follow-up messages can `?` outbox errors.
impl From<crate::outbox::OutboxError> for HandlerError {
    fn from(error: crate::outbox::OutboxError) -> Self {
        HandlerError::Retryable(format!("outbox: {error}"))
    }
}

impl HandlerError {
    /// A failure worth retrying (500 `handler_failed`).
    pub fn retryable(message: impl std::fmt::Display) -> Self {
        Self::Retryable(message.to_string())
    }

    /// A message that can never succeed (422 `poison`).
    pub fn poison(message: impl std::fmt::Display) -> Self {
        Self::Poison(message.to_string())
    }

    /// A message refused for good with the service's own `code` (422 `code`).
    pub fn refused(code: &'static str, message: impl std::fmt::Display) -> Self {
        Self::Refused {
            code,
            message: message.to_string(),
        }
    }

    /// A payload that does not fit the contract (422 `payload_mismatch`).
    pub fn payload_mismatch(message: impl std::fmt::Display) -> Self {
        Self::PayloadMismatch(message.to_string())
    }

    /// An endpoint the service does not route (404 `unknown_endpoint`).
    pub fn unknown_endpoint(endpoint: &str) -> Self {
        Self::UnknownEndpoint(endpoint.to_owned())
    }
}

/// Decodes a payload into a method's request type. The payload must be a JSON
/// object; unknown members are ignored (a newer compatible sender may add
/// optional fields) and a missing required member is a
/// [`HandlerError::PayloadMismatch`] whose message names the member's path
/// and the expected type but never the value found.
pub fn decode_payload<T: DeserializeOwned>(payload: &serde_json::Value) -> Result<T, HandlerError> {
    if !payload.is_object() {
        return Err(HandlerError::PayloadMismatch(format!(
            "payload must be a JSON object with one member per parameter, found {}",
            json_kind(payload)
        )));
    }
    serde_path_to_error::deserialize(payload).map_err(|error| {
        // serde_json's message quotes the value it refused, and a payload may
        // hold personal data: the answer names the member and what was
        // expected, never the value (crate::redact).
        let path = error.path().to_string();
        let message = crate::redact::value_free(&error.inner().to_string());
        HandlerError::PayloadMismatch(if path.is_empty() || path == "." {
            message
        } else {
            format!("`{path}`: {message}")
        })
    })
}

/// Encodes a handler's answer as the response payload (`null` for `()`).
pub fn encode_response<T: Serialize>(response: &T) -> Result<serde_json::Value, HandlerError> {
    serde_json::to_value(response)
        .map_err(|e| HandlerError::Retryable(format!("cannot encode the response: {e}")))
}

pub(crate) fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A service the receiver hosts: one or more interface versions, each with its
/// endpoints. Dyn-compatible; the receiver holds `Arc<dyn HostedService>`.
///
/// # Contract
///
/// * [`interfaces`](Self::interfaces) is read once, when the receiver is
///   built; return the same list every time. An (interface, version) may be
///   hosted by one service only; one service, or several, may host v1 and v2
///   of an interface side by side.
/// * [`handle`](Self::handle) is called only for an (interface, version,
///   endpoint) that `interfaces` lists, after the signature, the envelope and
///   the inbox have been checked, and at most once to commit per message
///   (source, id).
/// * It runs on a receiver's database-writer thread (SQLite: the single
///   writer; PostgreSQL: one of a few, each with its own connection), inside
///   a transaction (a savepoint of a group commit) that also inserts the
///   inbox row. Write every effect through `tx` and it commits exactly once with
///   that row. Do not `COMMIT`, `ROLLBACK` or `RELEASE` through `tx`, and do
///   not block for long: every other delivery waits for this one. To send a
///   message onward, enqueue it in the outbox through `tx`.
/// * Return the answer payload (cached in the inbox and sent back, also to
///   later duplicates). On `Err`, or on a panic, only this message's work is
///   rolled back and the sender is told per [`HandlerError`]; a panic is
///   answered 500 `handler_failed` and the writer keeps serving.
///
/// Generated code routes with a static `match` on `call.endpoint` (and on
/// `call.interface` / `call.version` when one service hosts several), decodes
/// with [`decode_payload`] and encodes with [`encode_response`].
///
/// `S` is the receiver's [`Store`]: `tx` is a `&rusqlite::Transaction` for
/// [`Sqlite`] (the default). On a sqlx store: [`AsyncHostedService`].
pub trait HostedService<S: Store = Sqlite>: Send + Sync + 'static {
    /// The interface versions this service hosts.
    fn interfaces(&self) -> &[HostedInterface];

    /// Processes one message in `tx`; returns the answer payload.
    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: S::Handle<'_, '_>,
    ) -> Result<serde_json::Value, HandlerError>;
}

/// Implemented by generated `…Receiver` types on a sqlx store: a set of
/// interface versions and how to process one message, awaited.
///
/// The same contract as [`HostedService`], async: the receiver runs it
/// inside the transaction (a savepoint of a group commit) that also
/// inserts the inbox row, and `conn` is that transaction's connection.
/// Write every effect through `conn` and it commits exactly once with the
/// row. Do not `COMMIT` or `ROLLBACK` through it. Handlers of different
/// transactions run concurrently (one per receiver writer,
/// [`ReceiverBuilder::writers`](super::ReceiverBuilder::writers)); a
/// handler that awaits something slow holds its writer and its
/// transaction meanwhile.
///
/// `S` is the receiver's [`AsyncStore`]: `conn` is a `&mut sqlx::PgConnection`
/// for `sqlx::Postgres` and a `&mut sqlx::SqliteConnection` for
/// `sqlx::Sqlite`.
pub trait AsyncHostedService<S: AsyncStore>: Send + Sync + 'static {
    /// The interface versions this service hosts.
    fn interfaces(&self) -> &[HostedInterface];

    /// Processes one message on `conn`; resolves to the answer payload.
    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut S::Connection,
    ) -> crate::BoxFuture<'a, Result<serde_json::Value, HandlerError>>;
}

/// A handler as a builder keeps it: a service for a receiver, a response
/// handler for a dispatcher. Made by [`IntoService`] and
/// [`IntoResponder`](crate::responses::IntoResponder).
pub struct Registered<T: ?Sized>(pub(crate) Arc<T>);

impl<T: ?Sized> Clone for Registered<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T: ?Sized> std::fmt::Debug for Registered<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registered")
    }
}

/// The kind of a handler that blocks ([`HostedService`],
/// [`ResponseHandler`](crate::responses::ResponseHandler)): the `M` of
/// [`IntoService`], inferred.
#[derive(Debug)]
pub enum Blocking {}

/// The kind of an async handler ([`AsyncHostedService`],
/// [`AsyncResponseHandler`](crate::responses::AsyncResponseHandler)): the
/// `M` of [`IntoService`], inferred.
#[derive(Debug)]
pub enum Awaited {}

/// What [`ReceiverBuilder::service`](super::ReceiverBuilder::service)
/// takes: a [`HostedService`] on a store with blocking transactions, an
/// [`AsyncHostedService`] on a sqlx store. `M` tells the two apart and is
/// inferred; implemented for every such service.
pub trait IntoService<S: AnyStore, M> {
    /// The service as the receiver keeps it.
    fn into_service(self) -> Registered<S::Service>;
}

impl<S: Store, T: HostedService<S>> IntoService<S, Blocking> for T {
    fn into_service(self) -> Registered<S::Service> {
        Registered(Arc::new(self))
    }
}

impl<S: AsyncStore, T: AsyncHostedService<S>> IntoService<S, Awaited> for T {
    fn into_service(self) -> Registered<S::Service> {
        Registered(Arc::new(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Hired {
        name: String,
        #[serde(default)]
        team: Option<String>,
    }

    #[test]
    fn decode_ignores_unknown_members_and_refuses_missing_ones() {
        let ok: Hired =
            decode_payload(&serde_json::json!({"name": "Ada", "extra": 1})).expect("decodes");
        assert_eq!(
            ok,
            Hired {
                name: "Ada".into(),
                team: None
            }
        );
        assert!(matches!(
            decode_payload::<Hired>(&serde_json::json!({"team": "x"})),
            Err(HandlerError::PayloadMismatch(_))
        ));
        assert!(matches!(
            decode_payload::<Hired>(&serde_json::json!(["Ada", null])),
            Err(HandlerError::PayloadMismatch(_))
        ));
    }

    #[test]
    fn decode_errors_name_the_path_and_the_expected_type_but_not_the_value() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        enum Status {
            Active,
            OnLeave,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Employee {
            status: Status,
            grade: u32,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Hired {
            employee: Employee,
        }
        let cases = [
            (
                serde_json::json!({"employee": {"status": "Salary 250000 EUR; bonus", "grade": 1}}),
                "`employee.status`: unknown variant, expected `Active` or `OnLeave`",
            ),
            (
                serde_json::json!({"employee": {"status": "Active", "grade": "250000 EUR"}}),
                "`employee.grade`: invalid type: string, expected u32",
            ),
            (
                serde_json::json!({"employee": {"status": "Active", "grade": -250000}}),
                "`employee.grade`: invalid value: integer, expected u32",
            ),
            (
                serde_json::json!({"employee": {"status": "Active"}}),
                "`employee`: missing field `grade`",
            ),
        ];
        for (payload, expected) in cases {
            let Err(HandlerError::PayloadMismatch(message)) = decode_payload::<Hired>(&payload)
            else {
                panic!("{payload} decoded")
            };
            assert_eq!(message, expected);
            assert!(!message.contains("250000"), "{message}");
        }
    }

    #[test]
    fn calls_can_be_made_for_handler_tests() {
        let payload = serde_json::json!({"name": "Ada"});
        let call = IncomingCall::new("hr.X", 2, "Hired", &payload)
            .with_source("hr")
            .with_message_id("m-1")
            .with_correlation_id("c-1");
        assert_eq!(
            (
                call.source,
                call.message_id,
                call.correlation_id,
                call.version
            ),
            ("hr", "m-1", Some("c-1"), 2)
        );
        let hired: Hired = decode_payload(call.payload).expect("decodes");
        assert_eq!(hired.name, "Ada");
    }

    #[test]
    fn unit_responses_encode_as_null() {
        assert_eq!(
            encode_response(&()).expect("encodes"),
            serde_json::Value::Null
        );
    }
}
