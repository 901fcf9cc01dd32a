//! What a broker consumer does with a delivery, by what the receiver
//! answered: the dispatcher's own table ([`classify`]), the same for
//! JetStream and AMQP.

use std::time::Duration;

use crate::dispatcher::{Verdict, classify};
use crate::receiver::Reply;
use crate::transport::TransportResponse;

/// What to do with one delivery.
#[derive(Debug, PartialEq)]
pub(crate) enum Action {
    /// Processed now or before: answer (if asked), then acknowledge.
    Ack {
        /// `{status, body}`, what goes back to the sender.
        answer: serde_json::Value,
    },
    /// Delivered again after this delay (JetStream `-NAK`, AMQP
    /// `modified`).
    Retry(Duration),
    /// It never succeeds: recorded in `rf_terminated`, then terminated
    /// (JetStream `+TERM`, AMQP `rejected`).
    Term(String),
}

/// How a consumer retries: the backoff of this delivery, the longest one,
/// and the deliveries allowed to fail.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retries {
    /// The outbox's backoff for this delivery.
    pub(crate) backoff: Duration,
    /// The longest backoff (a held version waits that long).
    pub(crate) backoff_max: Duration,
    pub(crate) max_retries: u32,
}

/// The dispatcher's table applied to the receiver's answer to delivery
/// number `delivered` (1 for the first).
pub(crate) fn decide(answer: &Reply, delivered: u32, retries: Retries) -> Action {
    // Processed or a duplicate: what `classify` says of its 200, without
    // serialising the answer only to parse it back.
    if matches!(answer, Reply::Acknowledged { .. }) {
        let result = answer.clone().into_batch_result();
        return Action::Ack {
            answer: serde_json::json!({ "status": result.status, "body": result.body }),
        };
    }
    let retry_after = match answer {
        Reply::Refused(refusal) => refusal
            .retry_after_secs()
            .map(|secs| Duration::from_secs(u64::from(secs))),
        Reply::Acknowledged { .. } => None,
    };
    let result = answer.clone().into_batch_result();
    let response = TransportResponse {
        status: result.status,
        body: serde_json::to_vec(&result.body).unwrap_or_default(),
        retry_after,
    };
    match classify(&Ok(response)) {
        Verdict::Sent { .. } | Verdict::Published => Action::Ack {
            answer: serde_json::json!({ "status": result.status, "body": result.body }),
        },
        Verdict::DeadLetter { error } | Verdict::Failed { error } => Action::Term(error),
        Verdict::Retry {
            error, retry_after, ..
        } => {
            if delivered > retries.max_retries {
                Action::Term(format!(
                    "{error} (delivered {delivered} times, max_retries {})",
                    retries.max_retries
                ))
            } else {
                Action::Retry(retries.backoff.max(retry_after.unwrap_or_default()))
            }
        }
        Verdict::Unavailable { retry_after, .. } | Verdict::Wait { retry_after, .. } => {
            Action::Retry(retries.backoff.max(retry_after.unwrap_or_default()))
        }
        Verdict::Held { .. } => Action::Retry(retries.backoff_max),
        // Never classified from an answer: a claim's verdict.
        Verdict::Expired => Action::Term(crate::dispatcher::records::EXPIRED.to_owned()),
    }
}
