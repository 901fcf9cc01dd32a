//! What the broker transports share (cargo features `nats`, `amqp`): what
//! a consumer does with a delivery ([`decide`]), the answers a receiving
//! consumer sends back and how the sender's database records them
//! ([`AnswerStore`]), and the row a consumer writes for a message it gave
//! up on ([`TerminatedRow`], [`TerminatedStore`]). The consumers are
//! written once over those seams; each store implements them in its
//! folder (`store/<name>/answers.rs`).

mod decide;
mod stores;

use std::sync::Arc;

pub(crate) use decide::{Action, Retries, decide};
pub(crate) use stores::{
    AnswerStore, BlockingAnswers, BlockingTerminated, OnBlockingPool, TerminatedStore,
    open_terminated,
};
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) use stores::{AsyncAnswerStatements, OnPool, row_of};

use crate::responses::{Answer, ResponseHandler};
use crate::store::Store;

/// `{messageId, status, body}` as the receiving consumer publishes it.
#[derive(Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Published {
    pub(crate) message_id: String,
    status: u16,
    #[serde(default)]
    body: serde_json::Value,
}

/// What recording an answer came to.
pub(crate) enum Recorded {
    /// Committed now, or found recorded before: acknowledge.
    Done,
    /// The row is not `Sent` yet: the dispatcher has not recorded the
    /// publish. Try again shortly.
    NotYet,
    /// The response handler failed; rolled back.
    Failed(String),
}

/// The outbox row an answer belongs to.
pub(crate) struct Row {
    pub(crate) status: String,
    pub(crate) answered: bool,
    pub(crate) interface: String,
    pub(crate) version: u32,
    pub(crate) endpoint: String,
    pub(crate) correlation_id: Option<String>,
    pub(crate) headers: String,
}

/// The payload of an answer (`null` when it has none).
fn payload_of(published: &Published) -> serde_json::Value {
    if published.status >= 300 {
        tracing::warn!(message_id = %published.message_id, status = published.status, "answer is not an acknowledgement");
    }
    published
        .body
        .get("payload")
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// The answer to `message_id` that `row` holds, as a response handler
/// takes it.
pub(crate) fn answer_of<'a>(
    row: &'a Row,
    message_id: &'a str,
    payload: &'a serde_json::Value,
) -> Answer<'a> {
    Answer {
        message_id,
        interface: &row.interface,
        version: row.version,
        endpoint: &row.endpoint,
        correlation_id: row.correlation_id.as_deref(),
        payload,
    }
}

/// The trace the row's message belongs to: its handler runs in it.
pub(crate) fn traceparent_of(row: &Row) -> Option<crate::trace::TraceParent> {
    let headers = serde_json::from_str(&row.headers).unwrap_or_default();
    crate::trace::TraceParent::from_headers(&headers)
}

/// Runs the row's handler, if one is registered, in the caller's
/// transaction, in the message's trace.
pub(crate) fn run_handler<S: Store>(
    handlers: &[Arc<dyn ResponseHandler<S>>],
    row: &Row,
    message_id: &str,
    payload: &serde_json::Value,
    tx: S::Handle<'_, '_>,
) -> Result<(), crate::receiver::HandlerError> {
    let Some(handler) = handlers
        .iter()
        .find(|h| h.interface() == (row.interface.as_str(), row.version))
    else {
        return Ok(());
    };
    let answer = answer_of(row, message_id, payload);
    match traceparent_of(row) {
        Some(traceparent) => {
            crate::trace::with_traceparent(traceparent, || handler.handle(&answer, tx))
        }
        None => handler.handle(&answer, tx),
    }
}

/// What a row says about an answer before it is applied: the row and the
/// answer's payload to apply, or what to do instead.
pub(crate) fn precheck(
    row: Option<Row>,
    published: &Published,
) -> Result<(Row, serde_json::Value), Recorded> {
    let message_id = &published.message_id;
    let Some(row) = row else {
        tracing::warn!(%message_id, "answer to a message this outbox does not hold (deleted by retention?); acknowledged");
        return Err(Recorded::Done);
    };
    if row.answered {
        return Err(Recorded::Done);
    }
    if row.status != "Sent" {
        return Err(Recorded::NotYet);
    }
    Ok((row, payload_of(published)))
}

/// A message the consumer gave up on, as `rf_terminated` records it.
pub(crate) struct TerminatedRow {
    pub stream_sequence: i64,
    pub stream: String,
    pub message_id: Option<String>,
    pub subject: String,
    pub error: String,
    pub at: i64,
}

/// A broker operation that failed (a stream or queue, a publish, an
/// acknowledgement, a record of the consumer's): what happened, never a
/// credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BrokerError(pub(crate) String);

impl From<String> for BrokerError {
    fn from(reason: String) -> Self {
        Self(reason)
    }
}

impl From<&str> for BrokerError {
    fn from(reason: &str) -> Self {
        Self(reason.to_owned())
    }
}

/// The configured destination `destination` and its signing secret (`None`:
/// none in the config, the registry issues the keys), for the answers
/// consumers of both brokers. The error names the setting and what is
/// wrong, never the secret.
pub(crate) fn configured_destination<'c>(
    config: &'c crate::Config,
    destination: &str,
) -> Result<
    (
        &'c crate::config::DestinationConfig,
        Option<crate::signing::Secret>,
    ),
    (&'static str, String),
> {
    let found = config.destinations.get(destination).ok_or_else(|| {
        (
            "destination",
            format!("no destination `{destination}` is configured"),
        )
    })?;
    if found.secret.is_empty() {
        return Ok((found, None));
    }
    let secret = crate::signing::Secret::parse(&found.secret)
        .map_err(|e| ("secret", format!("destination `{destination}`: {e}")))?;
    Ok((found, Some(secret)))
}
