//! Per-destination circuit breakers and adaptive batch sizes.
//!
//! An unreachable or overloaded destination is a property of the
//! destination, not of the messages waiting for it, so the dispatcher
//! tracks it once per destination instead of letting every row back off on
//! its own:
//!
//! * **Closed** (normal): rows are claimed and sent as they fall due.
//! * After [`OPEN_AFTER`] consecutive send groups fail at the destination
//!   level (connection refused or reset, timeout, 429, 502, 503 other than
//!   `in_progress`, 504), the circuit **opens**: no row of that destination
//!   is claimed, except one **probe** message at a time, every
//!   `min(backoff_base * 2^n, outbox.probe_interval_max)` plus jitter. The
//!   request rate during an outage is one per probe interval per
//!   dispatcher, whatever the backlog.
//! * The first answer that is not a destination-level failure **closes** it:
//!   every waiting row is already due (destination-level failures do not
//!   push rows into the far future), so the backlog resumes at once, paced
//!   only by `outbox.batch_size` and `outbox.max_in_flight`.
//!
//! Destination-level failures never count against a message's
//! `max_retries`: count-limited retries are for answers that say the message
//! is at fault. An outage shorter than the TTL never needs a human.
//!
//! The same state carries the **batch limit**: a multi-message request that
//! fails at the transport level (lost answer, batch refused as a whole) halves
//! the number of messages the next request to that destination carries, down
//! to one; a success doubles it back up to `outbox.batch_size`. A message
//! never fails because of the company it travels in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::OutboxConfig;
use crate::dispatcher::backoff;

/// Consecutive destination-level failures that open a circuit.
pub const OPEN_AFTER: u32 = 3;

/// May rows of a destination be claimed now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Closed: claim up to this many rows per request.
    Closed { batch_limit: usize },
    /// Open, and a probe is due: claim one row and send it alone.
    Probe,
    /// Open: claim nothing before `until`.
    Blocked { until: Instant },
}

/// What one request to a destination came to, for its circuit.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupOutcome {
    /// Messages the request carried.
    pub rows: usize,
    /// A destination-level failure (see the module docs), with its text.
    pub unavailable: Option<String>,
    /// The receiver refused our signature timestamp (clock skew), with the text.
    pub clock_problem: Option<String>,
    /// The request was this destination's probe.
    pub probe: bool,
}

#[derive(Debug)]
struct Circuit {
    consecutive_failures: u32,
    /// Wall-clock ms when it opened, and when the next probe may go.
    open: Option<(i64, Instant)>,
    probing: bool,
    batch_limit: usize,
    last_problem: Option<String>,
    clock_problem: Option<(i64, String)>,
}

/// A destination's state as `GET /_rf/health` and `/_rf/outbox/stats` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationState {
    /// The destination name, as in `destinations.<name>`.
    pub destination: String,
    /// `closed` (sending) or `open` (unreachable; probing).
    pub circuit: &'static str,
    /// When the circuit opened (ms since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_since_ms: Option<i64>,
    /// Messages per request at the moment (halved after lost answers).
    pub batch_limit: usize,
    /// The last destination-level failure while open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_problem: Option<String>,
    /// Set while the destination refuses our signature timestamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_problem: Option<String>,
}

/// The circuits of one outbox's destinations. Shared by the dispatcher
/// (which updates them) and the diagnostics (which show them).
#[derive(Debug)]
pub struct Circuits {
    circuits: Mutex<HashMap<String, Circuit>>,
    batch_size: usize,
    probe_base: Duration,
    probe_max: Duration,
    jitter: Duration,
}

impl Circuits {
    pub(crate) fn new(config: &OutboxConfig) -> Self {
        Self {
            circuits: Mutex::new(HashMap::new()),
            batch_size: config.batch_size.max(1) as usize,
            probe_base: config.backoff_base,
            probe_max: config.probe_interval_max,
            jitter: config.jitter,
        }
    }

    fn with<T>(&self, destination: &str, f: impl FnOnce(&mut Circuit) -> T) -> T {
        let mut circuits = self
            .circuits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let circuit = circuits
            .entry(destination.to_owned())
            .or_insert_with(|| Circuit {
                consecutive_failures: 0,
                open: None,
                probing: false,
                batch_limit: self.batch_size,
                last_problem: None,
                clock_problem: None,
            });
        f(circuit)
    }

    /// Whether rows of `destination` may be claimed at `now`. Hands out at
    /// most one probe at a time.
    pub(crate) fn admit(&self, destination: &str, now: Instant) -> Admission {
        self.with(destination, |circuit| match circuit.open {
            None => Admission::Closed {
                batch_limit: circuit.batch_limit,
            },
            Some((_, next_probe)) if !circuit.probing && now >= next_probe => {
                circuit.probing = true;
                Admission::Probe
            }
            Some((_, next_probe)) => Admission::Blocked {
                until: next_probe.max(now + Duration::from_millis(10)),
            },
        })
    }

    /// A claimed probe that found no row to send: nothing is in flight.
    pub(crate) fn probe_unused(&self, destination: &str) {
        self.with(destination, |circuit| circuit.probing = false);
    }

    /// Records what one request to `destination` came to.
    pub(crate) fn record(&self, destination: &str, outcome: &GroupOutcome) {
        let now = Instant::now();
        self.with(destination, |circuit| {
            if outcome.probe {
                circuit.probing = false;
            }
            match &outcome.clock_problem {
                Some(problem) => {
                    circuit.clock_problem = Some((crate::store::now_ms(), problem.clone()));
                }
                None if outcome.unavailable.is_none() => circuit.clock_problem = None,
                None => {}
            }
            let Some(problem) = &outcome.unavailable else {
                if let Some((since, _)) = circuit.open.take() {
                    let down = crate::store::now_ms() - since;
                    tracing::info!(
                        destination,
                        down_ms = down,
                        "destination answers again; circuit closed, waiting messages resume"
                    );
                }
                circuit.consecutive_failures = 0;
                circuit.last_problem = None;
                circuit.batch_limit = (circuit.batch_limit * 2).min(self.batch_size);
                return;
            };
            circuit.consecutive_failures = circuit.consecutive_failures.saturating_add(1);
            circuit.last_problem = Some(problem.clone());
            if outcome.rows > 1 {
                circuit.batch_limit = (outcome.rows / 2).max(1);
            }
            if circuit.consecutive_failures >= OPEN_AFTER || circuit.open.is_some() {
                let exponent = circuit.consecutive_failures.saturating_sub(OPEN_AFTER);
                let delay = backoff(exponent, self.probe_base, self.probe_max, self.jitter);
                let since = match circuit.open {
                    Some((since, _)) => since,
                    None => {
                        tracing::warn!(
                            destination,
                            %problem,
                            "destination unreachable; circuit open, probing with one message at a time"
                        );
                        crate::store::now_ms()
                    }
                };
                circuit.open = Some((since, now + delay));
            }
        });
    }

    /// The earliest moment a blocked destination may be probed, if any.
    pub(crate) fn next_probe(&self) -> Option<Instant> {
        let circuits = self
            .circuits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        circuits
            .values()
            .filter(|c| !c.probing)
            .filter_map(|c| c.open.map(|(_, at)| at))
            .min()
    }

    /// Every destination the dispatcher has talked to, by name.
    pub fn states(&self) -> Vec<DestinationState> {
        let circuits = self
            .circuits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut states: Vec<DestinationState> = circuits
            .iter()
            .map(|(destination, c)| DestinationState {
                destination: destination.clone(),
                circuit: if c.open.is_some() { "open" } else { "closed" },
                open_since_ms: c.open.map(|(since, _)| since),
                batch_limit: c.batch_limit,
                last_problem: c.open.and(c.last_problem.clone()),
                clock_problem: c.clock_problem.as_ref().map(|(_, text)| text.clone()),
            })
            .collect();
        states.sort_by(|a, b| a.destination.cmp(&b.destination));
        states
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circuits() -> Circuits {
        let config = OutboxConfig {
            backoff_base: Duration::from_millis(100),
            probe_interval_max: Duration::from_secs(1),
            jitter: Duration::ZERO,
            batch_size: 40,
            ..OutboxConfig::default()
        };
        Circuits::new(&config)
    }

    fn failed(rows: usize) -> GroupOutcome {
        GroupOutcome {
            rows,
            unavailable: Some("cannot connect".into()),
            ..GroupOutcome::default()
        }
    }

    #[test]
    fn opens_after_consecutive_failures_probes_one_at_a_time_and_closes_on_an_answer() {
        let c = circuits();
        let now = Instant::now();
        assert_eq!(c.admit("d", now), Admission::Closed { batch_limit: 40 });
        c.record("d", &failed(1));
        c.record("d", &failed(1));
        assert!(matches!(c.admit("d", now), Admission::Closed { .. }));
        c.record("d", &failed(1));
        let Admission::Blocked { until } = c.admit("d", Instant::now()) else {
            panic!("open after {OPEN_AFTER} failures");
        };
        assert!(until > Instant::now());
        assert_eq!(c.states()[0].circuit, "open");
        let later = until + Duration::from_millis(1);
        assert_eq!(c.admit("d", later), Admission::Probe);
        assert!(
            matches!(c.admit("d", later), Admission::Blocked { .. }),
            "one probe at a time"
        );
        c.record(
            "d",
            &GroupOutcome {
                probe: true,
                ..failed(1)
            },
        );
        assert!(matches!(
            c.admit("d", Instant::now()),
            Admission::Blocked { .. }
        ));
        let answered = GroupOutcome {
            rows: 1,
            probe: true,
            ..GroupOutcome::default()
        };
        c.record("d", &answered);
        assert!(matches!(
            c.admit("d", Instant::now()),
            Admission::Closed { .. }
        ));
        assert_eq!(c.states()[0].circuit, "closed");
        assert_eq!(c.next_probe(), None);
    }

    #[test]
    fn a_failing_batch_is_halved_down_to_one_and_grows_back_on_success() {
        let c = circuits();
        let now = Instant::now();
        c.record("d", &failed(40));
        assert_eq!(c.admit("d", now), Admission::Closed { batch_limit: 20 });
        c.record(
            "d",
            &GroupOutcome {
                rows: 20,
                ..GroupOutcome::default()
            },
        );
        c.record("d", &failed(40));
        c.record("d", &failed(20));
        c.record("d", &failed(10));
        // Open now, but the halving went on: a probe carries one message anyway.
        assert_eq!(c.states()[0].batch_limit, 5);
        for _ in 0..10 {
            c.record("d", &failed(2));
        }
        assert_eq!(c.states()[0].batch_limit, 1);
        for _ in 0..10 {
            c.record(
                "d",
                &GroupOutcome {
                    rows: 1,
                    ..GroupOutcome::default()
                },
            );
        }
        assert_eq!(c.states()[0].batch_limit, 40, "back to batch_size");
    }

    #[test]
    fn clock_problems_are_shown_until_an_answer_clears_them() {
        let c = circuits();
        c.record(
            "d",
            &GroupOutcome {
                rows: 1,
                clock_problem: Some("clock problem: skew".into()),
                ..GroupOutcome::default()
            },
        );
        assert_eq!(
            c.states()[0].clock_problem.as_deref(),
            Some("clock problem: skew")
        );
        c.record(
            "d",
            &GroupOutcome {
                rows: 1,
                ..GroupOutcome::default()
            },
        );
        assert_eq!(c.states()[0].clock_problem, None);
    }
}
