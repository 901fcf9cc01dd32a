//! What an answer means for an outbox row ([`classify`], the wire
//! protocol's table: `docs/wire-protocol.md`) and when a row goes again
//! ([`backoff`]). Pure logic: no I/O, no clock but the jitter's randomness.

use std::time::Duration;

use rand::Rng as _;

use crate::envelope::Acknowledgement;
use crate::transport::{TransportError, TransportResponse};

/// What to write back for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Sent {
        response: serde_json::Value,
    },
    /// A broker stored the message (a JetStream publish acknowledgement,
    /// status [`BROKER_ACCEPTED_STATUS`] marked `"deferred": true`): `Sent`,
    /// without running a response handler; the receiver's answer comes
    /// back later through the broker (`crate::nats::AnswersConsumer`).
    Published,
    /// Not sent: its time to live passed (found by a claim, and recorded
    /// apart from it because a failure handler runs: `Claim::expiring`).
    Expired,
    /// The receiver says the message will never succeed (400, 404, 413, 422).
    DeadLetter {
        error: String,
    },
    /// A human decides: the receiver cannot tell whether it processed this
    /// message before (422 `beyond_dedup_horizon`), so it must not be sent
    /// again automatically.
    Failed {
        error: String,
    },
    /// The message may be at fault (handler failed, signature refused, a 2xx
    /// without acknowledgement): retried after a backoff, counted against
    /// `max_retries`; then `Failed`, or `DeadLetter` when
    /// `dead_letter_when_exhausted` (signature problems).
    Retry {
        error: String,
        retry_after: Option<Duration>,
        dead_letter_when_exhausted: bool,
    },
    /// The destination is unreachable or overloaded: retried until the TTL,
    /// never counted, and the destination's circuit learns of it.
    Unavailable {
        error: String,
        retry_after: Option<Duration>,
    },
    /// Retried until the TTL without counting, destination untouched: a copy
    /// is being processed right now (503 `in_progress`), or the clocks
    /// disagree (`clock_problem`: 401 `timestamp_out_of_range`).
    Wait {
        error: String,
        retry_after: Option<Duration>,
        clock_problem: bool,
    },
    /// Not sent: its interface version is decommissioned here. The row
    /// stays `Pending`, due never, until a re-commission
    /// ([`crate::lifecycle`]).
    Held {
        error: String,
    },
}

/// The wire protocol's table: what an answer means for the outbox row.
pub(crate) fn classify(result: &Result<TransportResponse, TransportError>) -> Verdict {
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            return Verdict::Unavailable {
                error: error.to_string(),
                retry_after: None,
            };
        }
    };
    // `{"error": code, "message": text}` of an rfidl receiver, or the start
    // of whatever another receiver said.
    let (code, text) = match serde_json::from_slice::<crate::envelope::ErrorBody>(&response.body) {
        Ok(body) => (
            Some(body.error.clone()),
            format!("{}: {}", body.error, body.message),
        ),
        Err(_) => (
            None,
            String::from_utf8_lossy(&response.body)
                .chars()
                .take(200)
                .collect::<String>(),
        ),
    };
    let error = || {
        let mut error = format!("{} {text}", response.status);
        if error.len() > 500 {
            let mut cut = 500;
            while !error.is_char_boundary(cut) {
                cut -= 1;
            }
            error.truncate(cut);
        }
        error
    };
    match (response.status, code.as_deref()) {
        (BROKER_ACCEPTED_STATUS, _) if is_deferred(&response.body) => Verdict::Published,
        (200..=299, _) => match serde_json::from_slice::<Acknowledgement>(&response.body) {
            Ok(ack) if ack.acknowledged => Verdict::Sent {
                response: ack.payload,
            },
            _ => Verdict::Retry {
                error: format!("{} without an acknowledgement", error()),
                retry_after: None,
                dead_letter_when_exhausted: false,
            },
        },
        (409, _) => Verdict::Sent {
            response: serde_json::Value::Null,
        },
        (422, Some(crate::receiver::BEYOND_DEDUP_HORIZON)) => Verdict::Failed { error: error() },
        (400 | 404 | 413 | 422, _) => Verdict::DeadLetter { error: error() },
        (401, Some("timestamp_out_of_range")) => Verdict::Wait {
            error: format!(
                "clock problem: the receiver refused our signature timestamp as outside its \
                 tolerance; check the clocks of both hosts (NTP). {}",
                error()
            ),
            retry_after: None,
            clock_problem: true,
        },
        (401, _) => Verdict::Retry {
            error: error(),
            retry_after: None,
            dead_letter_when_exhausted: true,
        },
        // The provider decommissioned this version: wait (not counted,
        // destination untouched) at its `Retry-After`, until it is
        // re-commissioned or the TTL runs out.
        (410, Some(crate::receiver::VERSION_DECOMMISSIONED)) => Verdict::Wait {
            error: error(),
            retry_after: response.retry_after,
            clock_problem: false,
        },
        // The receiver is fetching this service's key from the registry.
        (503, Some(crate::receiver::KEYS_PENDING)) => Verdict::Wait {
            error: error(),
            retry_after: response.retry_after,
            clock_problem: false,
        },
        (503, Some("in_progress")) => Verdict::Wait {
            error: error(),
            retry_after: response.retry_after,
            clock_problem: false,
        },
        (429 | 502 | 503 | 504, _) => Verdict::Unavailable {
            error: error(),
            retry_after: response.retry_after,
        },
        _ => Verdict::Retry {
            error: error(),
            retry_after: response.retry_after,
            dead_letter_when_exhausted: false,
        },
    }
}

/// The status of a broker's acceptance (a JetStream publish
/// acknowledgement): `202`, with `"deferred": true` in the body.
pub const BROKER_ACCEPTED_STATUS: u16 = 202;

/// Whether a 2xx body is an acknowledgement whose answer comes later.
fn is_deferred(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Deferred {
        acknowledged: bool,
        #[serde(default)]
        deferred: bool,
    }
    matches!(
        serde_json::from_slice::<Deferred>(body),
        Ok(Deferred {
            acknowledged: true,
            deferred: true
        })
    )
}

/// The delay before retry number `retry` (0-based): `min(base * 2^retry, max)`
/// plus a uniform jitter in `[0, jitter]`.
pub fn backoff(retry: u32, base: Duration, max: Duration, jitter: Duration) -> Duration {
    let exponential = base.saturating_mul(2u32.saturating_pow(retry.min(31)));
    let capped = exponential.min(max);
    let jitter_ms = jitter.as_millis() as u64;
    let random = if jitter_ms == 0 {
        0
    } else {
        rand::rng().random_range(0..=jitter_ms)
    };
    capped + Duration::from_millis(random)
}
