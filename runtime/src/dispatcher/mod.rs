//! The dispatcher: a tokio task that claims due outbox rows, signs and sends
//! them, and records what the receiver answered.
//!
//! * **Claims are leases.** One `UPDATE … RETURNING` moves due rows to
//!   `Sending` with a fresh lease token and a lease expiry. Every later update
//!   of the row is fenced on that token, so a dispatcher whose lease ran out
//!   (paused, partitioned) cannot overwrite newer state, and two dispatchers
//!   on one database never send a row at the same time. A row left `Sending`
//!   by a crash is claimed again once its lease expires, or at once on
//!   SQLite when the restarted dispatcher can prove that its claimer is gone
//!   (`sqlite::ExclusiveDispatch`).
//! * **Answers** are classified as the wire protocol says (`docs/wire-protocol.md`,
//!   "What the sender does with an answer").
//! * **Backoff** is `min(base * 2^n, max) + uniform jitter`, or the
//!   receiver's `Retry-After` when longer.
//! * **A runtime of its own.** The dispatcher runs on a tokio runtime of
//!   its own (two workers), which also drives its connections, so a busy
//!   or blocked application executor does not delay deliveries. While
//!   nothing is in flight a claim (on SQLite) runs on the worker that runs
//!   the dispatcher's loop, where nothing else waits for it: a message's
//!   idle path from its commit to the socket then crosses no thread, where
//!   a claim on the blocking pool costs a wake-up there and one back.
//!   Under `full` such a claim is left open while the loop writes its
//!   requests, and commits right after. What each of these saves is
//!   measured in BENCHMARKS.md ("Commit -> effect, fourth pass" and
//!   "fifth pass").
//!   With sends in flight, claims and every recording run on the blocking
//!   pool, so answers are never held behind a commit. No database work
//!   ever runs on the application's executor.

mod builder;
pub(crate) mod records;
mod request;

mod verdict;

use builder::Resolver;
pub use builder::{Dispatcher, DispatcherBuilder, DispatcherError, Route};
pub use verdict::{BROKER_ACCEPTED_STATUS, backoff};
pub(crate) use verdict::{Verdict, classify};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::circuit::{Admission, Circuits, GroupOutcome};
use crate::config::Config;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::transport::{Transport, TransportError, TransportResponse};
use records::ClaimCommit;
use request::signed_request;

/// Owns the running dispatcher; `shutdown` stops it cleanly. It runs on a
/// runtime of its own until then, or until the tokio runtime it was started
/// on shuts down, or `abort`.
pub struct DispatcherHandle {
    cancel: CancellationToken,
    /// Stops the dispatcher at once (`abort`, or the starting runtime's
    /// shutdown).
    crash: CancellationToken,
    /// Ends when the dispatcher's runtime has shut down.
    task: tokio::task::JoinHandle<()>,
    liveness: Liveness,
    failure_versions: Vec<(&'static str, u32)>,
}

impl DispatcherHandle {
    /// The interface versions (`package.Service`, version) whose failure
    /// handler this dispatcher runs: give them to
    /// [`Retention::spawn_with_failure_handlers`](crate::retention::Retention::spawn_with_failure_handlers)
    /// so that retention leaves their expiry to the dispatcher.
    pub fn failure_versions(&self) -> &[(&'static str, u32)] {
        &self.failure_versions
    }

    /// Whether the task runs (for readiness probes).
    pub fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    /// Stops claiming, lets in-flight sends finish and records their results.
    pub async fn shutdown(self) {
        self.liveness.stop();
        self.cancel.cancel();
        let _ = self.task.await;
    }

    /// Stops at once, like a crash: in-flight rows stay `Sending` until their
    /// lease expires. For tests of lease recovery.
    pub fn abort(self) {
        self.crash.cancel();
        self.task.abort();
    }
}

struct State {
    config: Config,
    db: Arc<dyn records::DispatchDb>,
    routes: BTreeMap<String, Route>,
    metrics: Arc<Metrics>,
    circuits: Arc<Circuits>,
    /// Decommissioned versions: their claimed rows are held, not sent.
    lifecycle: crate::lifecycle::Lifecycle,
    /// Routes destinations without a route of their own.
    resolver: Option<Resolver>,
    /// Signs for routes without secrets of their own.
    issued: Option<crate::keys::IssuedKeys>,
    /// Destinations with waiting rows but no route (found by [`discover`]):
    /// their rows are claimed too, and fail as unroutable, so they surface.
    unrouted: Mutex<Vec<String>>,
    /// Which destination claims first this round (fairness).
    rotation: std::sync::atomic::AtomicUsize,
}

/// A claimed row.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub message_id: String,
    /// The SQLite row's `seq` (rowid), which the updates of its attempt
    /// look it up by; unused (0) on PostgreSQL.
    pub seq: i64,
    pub lease: String,
    pub correlation_id: Option<String>,
    pub message_type: String,
    pub interface: String,
    pub version: u32,
    pub fingerprint: String,
    pub endpoint: String,
    pub payload: String,
    pub headers: String,
    pub retry_count: u32,
    pub max_retries: u32,
    pub created_at_ms: i64,
}

/// How long to keep looking after a wake-up that found nothing (the caller
/// may not have committed yet).
const RECHECK_DELAYS_MS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The fewest rows one claim may take. `outbox.batch_size` is the most
/// messages per request; a claim takes at least this many (still cut into
/// requests of at most the batch size, at most `max_in_flight` of them), so
/// that small batches do not cost a claim transaction, and under
/// `outbox.durability: normal` an fsync, per request (one claim per
/// message was the bottleneck of `batch_size: 1`: BENCHMARKS.md, "One
/// message per request").
const MIN_CLAIM_ROWS: u32 = 64;

/// How many rows a claim may take for `batch_size`.
fn claim_budget(batch_size: u32) -> usize {
    batch_size.max(MIN_CLAIM_ROWS) as usize
}

/// Rows claimed for one request: one destination, sent alone or as a batch.
#[derive(Debug)]
pub(crate) struct Group {
    pub destination: String,
    pub rows: Vec<Claimed>,
    pub probe: bool,
}

/// What became of a group: its attempts, and what its circuit learns.
struct GroupResult {
    destination: String,
    probe: bool,
    attempts: Vec<Attempt>,
}

async fn run(state: Arc<State>, wake: Arc<tokio::sync::Notify>, cancel: CancellationToken) {
    let mut in_flight: JoinSet<GroupResult> = JoinSet::new();
    let mut recheck = RECHECK_DELAYS_MS.len();
    let mut next_discovery = tokio::time::Instant::now();
    loop {
        if cancel.is_cancelled() {
            break;
        }
        if tokio::time::Instant::now() >= next_discovery {
            discover(&state).await;
            next_discovery = tokio::time::Instant::now() + state.config.outbox.poll_interval;
        }
        let capacity = state
            .config
            .outbox
            .max_in_flight
            .saturating_sub(in_flight.len());
        let (groups, next_due, on_this_worker) = if capacity > 0 {
            claim(&state, capacity, in_flight.is_empty()).await
        } else {
            (Vec::new(), None, false)
        };
        let got_rows = !groups.is_empty();
        for group in groups {
            let state = state.clone();
            in_flight.spawn(async move { send_group(&state, group).await });
        }
        if on_this_worker {
            // A claim on this worker may have been left open: the sends
            // just spawned run here first, up to their requests' writes;
            // then it commits.
            if got_rows {
                tokio::task::yield_now().await;
            }
            state.db.finish_claim();
        }
        if got_rows {
            recheck = 0;
        }
        let mut idle_wait = if got_rows {
            Duration::ZERO
        } else if recheck < RECHECK_DELAYS_MS.len() {
            recheck += 1;
            Duration::from_millis(RECHECK_DELAYS_MS[recheck - 1])
        } else {
            state.config.outbox.poll_interval
        };
        // Wake up when the next waiting row is due (a durable timer, a
        // retry's backoff), not at the next poll.
        if let Some(due) = next_due {
            let until_due = (due - crate::store::now_ms()).max(0);
            idle_wait = idle_wait.min(Duration::from_millis(until_due as u64));
        }
        // Wake up for the next probe of an open circuit.
        if let Some(probe_at) = state.circuits.next_probe() {
            idle_wait =
                idle_wait.min(probe_at.saturating_duration_since(std::time::Instant::now()));
        }
        if in_flight.is_empty() {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = wake.notified() => recheck = 0,
                _ = tokio::time::sleep(idle_wait) => {}
            }
            continue;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = wake.notified() => recheck = 0,
            done = in_flight.join_next() => {
                let mut results = Vec::new();
                if let Some(Ok(done)) = done {
                    results.push(done);
                }
                while let Some(Ok(done)) = in_flight.try_join_next() {
                    results.push(done);
                }
                record(&state, results).await;
            }
            _ = tokio::time::sleep(idle_wait), if !got_rows => {}
        }
    }
    // Graceful: finish what is in flight and record it.
    let mut results = Vec::new();
    while let Some(done) = in_flight.join_next().await {
        if let Ok(done) = done {
            results.push(done);
        }
    }
    record(&state, results).await;
}

/// Finds destinations with waiting rows that have no route (one index
/// look-up per distinct destination), so that their rows are claimed too;
/// and re-reads the decommissioned versions.
async fn discover(state: &Arc<State>) {
    let db = state.db.clone();
    let seen = state.lifecycle.generation();
    let found = tokio::task::spawn_blocking(move || (db.discover(), db.decommissioned())).await;
    let found = found.map(|(destinations, decommissioned)| {
        match decommissioned {
            Ok(versions) => state.lifecycle.replace_since(versions, seen),
            Err(error) => tracing::warn!(%error, "cannot read the decommissioned versions"),
        }
        destinations
    });
    if let Ok(Ok(destinations)) = found {
        let unrouted: Vec<String> = destinations
            .into_iter()
            .filter(|d| !state.routes.contains_key(d))
            .collect();
        if let Ok(mut slot) = state.unrouted.lock() {
            *slot = unrouted;
        }
    }
}

/// Claims due rows, destination by destination (as their circuits allow),
/// and cuts them into groups of at most each destination's batch limit.
/// Rows past their TTL are marked `Expired` instead. `idle`: nothing is in
/// flight, so nothing on this worker waits while a claim runs here. Returns
/// the groups, when the next waiting row is due if it took none
/// ([`records::Claim::next_due`]), and whether the claim ran on this
/// worker: it may then have been left open, for the caller to commit with
/// [`DispatchDb::finish_claim`] once the groups' sends have started.
async fn claim(state: &Arc<State>, capacity: usize, idle: bool) -> (Vec<Group>, Option<i64>, bool) {
    let mut destinations: Vec<String> = state.routes.keys().cloned().collect();
    if let Ok(unrouted) = state.unrouted.lock() {
        destinations.extend(unrouted.iter().cloned());
    }
    if destinations.is_empty() {
        return (Vec::new(), None, false);
    }
    let start = state
        .rotation
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        % destinations.len();
    destinations.rotate_left(start);
    let now = std::time::Instant::now();
    let plan: Vec<(String, Admission)> = destinations
        .into_iter()
        .map(|d| {
            let admission = state.circuits.admit(&d, now);
            (d, admission)
        })
        .filter(|(_, admission)| !matches!(admission, Admission::Blocked { .. }))
        .collect();
    if plan.is_empty() {
        return (Vec::new(), None, false);
    }
    let db = state.db.clone();
    let lease_ms = state.config.outbox.lease_timeout.as_millis() as i64;
    let row_budget = claim_budget(state.config.outbox.batch_size);
    let plan_for_db = plan.clone();
    let (sender, claimed) = tokio::sync::oneshot::channel();
    let inline = idle && db.claims_on_dispatcher_worker();
    let run = move |commit| db.claim(&plan_for_db, lease_ms, row_budget, capacity, sender, commit);
    if inline {
        // On this worker: see the module's documentation.
        run(ClaimCommit::Later);
    } else {
        // Not awaited: the result comes through `claimed`, possibly while
        // the claim still commits.
        drop(tokio::task::spawn_blocking(move || run(ClaimCommit::Now)));
    }
    let result = claimed.await;
    let (groups, next_due) = match result {
        Ok(Ok(claim)) => {
            state.metrics.outbox_expired.add(claim.expired);
            if !claim.expiring.is_empty() {
                expire(state, claim.expiring).await;
            }
            (claim.groups, claim.next_due)
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "outbox claim failed; retrying at the next round");
            (Vec::new(), None)
        }
        Err(_) => (Vec::new(), None),
    };
    // A probe that found no due row is not in flight.
    for (destination, admission) in &plan {
        if *admission == Admission::Probe
            && !groups
                .iter()
                .any(|g| g.probe && &g.destination == destination)
        {
            state.circuits.probe_unused(destination);
        }
    }
    (groups, next_due, inline)
}

/// Records claimed rows past their time to live `Expired`, in one
/// transaction where their failure handlers run (`crate::failures`). Should
/// it fail, the rows stay claimed until their lease runs out, and the next
/// claim finds them past their TTL again.
async fn expire(state: &Arc<State>, rows: Vec<Claimed>) {
    let attempts: Vec<(Attempt, Verdict)> = rows
        .into_iter()
        .map(|row| ((row, Outcome::Expired, Duration::ZERO), Verdict::Expired))
        .collect();
    let db = state.db.clone();
    let config = state.config.clone();
    match tokio::task::spawn_blocking(move || db.record(&attempts, &config)).await {
        Ok(Ok(counts)) => state.metrics.outbox_expired.add(counts.expired),
        Ok(Err(error)) => {
            tracing::error!(%error, "cannot record expired rows; they expire after their lease");
        }
        Err(_) => {}
    }
}

/// What one attempt came to: the transport's answer, or a row that could
/// not even be turned into a request.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Answer(Result<TransportResponse, TransportError>),
    Unsendable(String),
    /// Not sent: its version is decommissioned here.
    Held(String),
    /// Not sent: no signing secret issued yet (retried, not counted).
    Unsigned(String),
    /// Not sent: past its time to live (`records::Claim::expiring`).
    Expired,
}

impl Outcome {
    fn verdict(&self) -> Verdict {
        match self {
            Outcome::Answer(result) => classify(result),
            Outcome::Unsendable(error) => Verdict::Retry {
                error: error.clone(),
                retry_after: None,
                dead_letter_when_exhausted: false,
            },
            Outcome::Held(error) => Verdict::Held {
                error: error.clone(),
            },
            Outcome::Unsigned(error) => Verdict::Wait {
                error: error.clone(),
                retry_after: None,
                clock_problem: false,
            },
            Outcome::Expired => Verdict::Expired,
        }
    }
}

/// One send attempt and what came of it.
pub(crate) type Attempt = (Claimed, Outcome, Duration);

/// Sends rows that share a destination: alone, or as one batch request.
async fn send_group(state: &State, group: Group) -> GroupResult {
    let Group {
        destination,
        rows,
        probe,
    } = group;
    let started = std::time::Instant::now();
    let resolved = match state.routes.get(&destination) {
        Some(_) => None,
        None => state
            .resolver
            .as_ref()
            .and_then(|resolve| resolve(&destination)),
    };
    let Some(route) = state.routes.get(&destination).or(resolved.as_ref()) else {
        let error = format!("no route for destination `{destination}`");
        return GroupResult {
            destination,
            probe,
            attempts: rows
                .into_iter()
                .map(|row| (row, Outcome::Unsendable(error.clone()), started.elapsed()))
                .collect(),
        };
    };
    // A route without secrets signs with the issued ones in force now.
    let issued = match (&route.secrets[..], &state.issued) {
        ([], Some(issued)) => Some(issued.snapshot()),
        _ => None,
    };
    let secrets = issued
        .as_ref()
        .map_or(&route.secrets[..], |k| &k.signing[..]);
    if secrets.is_empty() {
        let error = format!(
            "no signing secret for destination `{destination}` yet: waiting for the registry \
             to issue this service's keys"
        );
        return GroupResult {
            destination,
            probe,
            attempts: rows
                .into_iter()
                .map(|row| (row, Outcome::Unsigned(error.clone()), started.elapsed()))
                .collect(),
        };
    }
    let mut requests = Vec::with_capacity(rows.len());
    let mut ready = Vec::with_capacity(rows.len());
    let mut attempts = Vec::with_capacity(rows.len());
    for row in rows {
        if state
            .lifecycle
            .is_decommissioned(&row.interface, row.version)
        {
            let reason = crate::lifecycle::held_reason(&row.interface, row.version);
            attempts.push((row, Outcome::Held(reason), started.elapsed()));
            continue;
        }
        match signed_request(state, secrets, &row) {
            Ok(request) => {
                requests.push(request);
                ready.push(row);
            }
            Err(error) => attempts.push((
                row,
                Outcome::Unsendable(error.to_string()),
                started.elapsed(),
            )),
        }
    }
    let span = tracing::info_span!(
        "dispatch",
        destination = %destination,
        messages = ready.len(),
        message_ids = %MessageIds(&ready),
        trace_ids = %TraceIds(&ready),
        attempt = ready.iter().map(|row| row.retry_count).max().unwrap_or(0) + 1,
    );
    let answers = match requests.len() {
        0 => Vec::new(),
        1 => vec![
            route
                .transport
                .send(requests.remove(0))
                .instrument(span)
                .await,
        ],
        _ => route.transport.send_batch(requests).instrument(span).await,
    };
    let elapsed = started.elapsed();
    attempts.extend(
        ready
            .into_iter()
            .zip(answers)
            .map(|(row, answer)| (row, Outcome::Answer(answer), elapsed)),
    );
    GroupResult {
        destination,
        probe,
        attempts,
    }
}

/// The `message_ids` field of a `dispatch` span: the request's message ids,
/// comma-separated (formatted only when the span is recorded).
struct MessageIds<'a>(&'a [Claimed]);

impl std::fmt::Display for MessageIds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, row) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&row.message_id)?;
        }
        Ok(())
    }
}

/// The `trace_ids` field of a `dispatch` span: each message's trace id from
/// its stored `traceparent` (empty for a row without a valid one),
/// comma-separated, in the order of `message_ids`.
struct TraceIds<'a>(&'a [Claimed]);

impl std::fmt::Display for TraceIds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, row) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let headers: BTreeMap<String, String> =
                serde_json::from_str(&row.headers).unwrap_or_default();
            if let Some(traceparent) = crate::trace::TraceParent::from_headers(&headers) {
                write!(f, "{}", traceparent.trace_id())?;
            }
        }
        Ok(())
    }
}

/// Writes the attempts' results (one transaction), then tells each
/// destination's circuit what its request came to.
async fn record(state: &Arc<State>, results: Vec<GroupResult>) {
    if results.is_empty() {
        return;
    }
    let mut outcomes = Vec::with_capacity(results.len());
    let mut attempts = Vec::new();
    for result in results {
        let verdicts: Vec<Verdict> = result
            .attempts
            .iter()
            .map(|(_, o, _)| o.verdict())
            .collect();
        // Destination-level only if nothing in the request got through: one
        // message answered 503 beside others that were processed says
        // nothing about the destination.
        let unavailable = verdicts
            .iter()
            .map(|v| match v {
                Verdict::Unavailable { error, .. } => Some(error.clone()),
                _ => None,
            })
            .collect::<Option<Vec<String>>>()
            .and_then(|errors| errors.into_iter().next());
        let clock_problem = verdicts.iter().find_map(|v| match v {
            Verdict::Wait {
                error,
                clock_problem: true,
                ..
            } => Some(error.clone()),
            _ => None,
        });
        outcomes.push((
            result.destination,
            GroupOutcome {
                rows: result.attempts.len(),
                unavailable,
                clock_problem,
                probe: result.probe,
            },
        ));
        attempts.extend(result.attempts.into_iter().zip(verdicts));
    }
    let db = state.db.clone();
    let config = state.config.clone();
    let metrics = state.metrics.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        for ((_, _, elapsed), _) in &attempts {
            metrics.outbox_send_duration.observe(*elapsed);
        }
        db.record(&attempts, &config)
    })
    .await;
    match outcome {
        Ok(Ok(counts)) => {
            // Counted once the transaction committed: a recording that
            // fails (a full disk, a lost connection) is redone after the
            // lease and must not count twice.
            state.metrics.outbox_sent.add(counts.sent);
            state.metrics.outbox_dead_lettered.add(counts.dead_lettered);
            state.metrics.outbox_failed.add(counts.failed);
            state.metrics.outbox_retries.add(counts.retries);
            state.metrics.outbox_expired.add(counts.expired);
        }
        Ok(Err(error)) => {
            tracing::error!(%error, "cannot record send results; the rows are re-sent after their lease");
        }
        Err(_) => {}
    }
    for (destination, outcome) in &outcomes {
        state.circuits.record(destination, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters_within_bounds() {
        let base = Duration::from_secs(2);
        let max = Duration::from_secs(300);
        let jitter = Duration::from_millis(500);
        for (retry, expected) in [
            (0, 2),
            (1, 4),
            (2, 8),
            (3, 16),
            (4, 32),
            (7, 256),
            (8, 300),
            (40, 300),
        ] {
            for _ in 0..50 {
                let delay = backoff(retry, base, max, jitter);
                let floor = Duration::from_secs(expected);
                assert!(
                    delay >= floor && delay <= floor + jitter,
                    "retry {retry}: {delay:?}"
                );
            }
        }
        assert_eq!(
            backoff(3, base, max, Duration::ZERO),
            Duration::from_secs(16)
        );
    }

    #[test]
    fn answers_are_classified_as_the_wire_protocol_says() {
        let answer = |status: u16, body: &str| {
            Ok(TransportResponse {
                status,
                body: body.as_bytes().to_vec(),
                retry_after: None,
            })
        };
        let refusal = |status: u16, code: &str| {
            answer(
                status,
                &format!(r#"{{"error":"{code}","message":"said the receiver"}}"#),
            )
        };
        let ack = r#"{"acknowledged":true,"duplicate":false,"payload":{"x":1}}"#;
        assert_eq!(
            classify(&answer(200, ack)),
            Verdict::Sent {
                response: serde_json::json!({"x": 1})
            }
        );
        assert!(matches!(
            classify(&answer(200, "not json")),
            Verdict::Retry { .. }
        ));
        // A broker's acceptance (JetStream): Sent, the answer comes later.
        let deferred = r#"{"acknowledged":true,"duplicate":false,"payload":null,"deferred":true}"#;
        assert_eq!(classify(&answer(202, deferred)), Verdict::Published);
        // Only with the marker: a 202 acknowledgement of an HTTP receiver
        // is an answer like a 200.
        assert_eq!(
            classify(&answer(202, ack)),
            Verdict::Sent {
                response: serde_json::json!({"x": 1})
            }
        );
        assert!(matches!(
            classify(&answer(200, deferred)),
            Verdict::Sent { .. }
        ));
        assert!(matches!(classify(&answer(409, "")), Verdict::Sent { .. }));
        for status in [400, 404, 413, 422] {
            assert!(
                matches!(classify(&answer(status, "{}")), Verdict::DeadLetter { .. }),
                "{status}"
            );
        }
        // Beyond the receiver's dedup horizon: a human decides, never DeadLetter.
        assert!(matches!(
            classify(&refusal(422, "beyond_dedup_horizon")),
            Verdict::Failed { .. }
        ));
        assert!(matches!(
            classify(&refusal(401, "bad_signature")),
            Verdict::Retry {
                dead_letter_when_exhausted: true,
                ..
            }
        ));
        // Clock skew: waits (not counted), and says what it is.
        match classify(&refusal(401, "timestamp_out_of_range")) {
            Verdict::Wait {
                error,
                clock_problem: true,
                ..
            } => assert!(error.starts_with("clock problem"), "{error}"),
            other => panic!("{other:?}"),
        }
        // The message may be at fault: counted.
        assert!(matches!(
            classify(&refusal(500, "handler_failed")),
            Verdict::Retry {
                dead_letter_when_exhausted: false,
                ..
            }
        ));
        // A decommissioned version: waits, destination untouched.
        assert!(matches!(
            classify(&refusal(410, "version_decommissioned")),
            Verdict::Wait {
                clock_problem: false,
                ..
            }
        ));
        // A copy is in progress: waits, destination untouched.
        assert!(matches!(
            classify(&refusal(503, "in_progress")),
            Verdict::Wait {
                clock_problem: false,
                ..
            }
        ));
        // Unreachable or overloaded destination: never counted.
        for status in [429, 502, 503, 504] {
            assert!(
                matches!(classify(&answer(status, "")), Verdict::Unavailable { .. }),
                "{status}"
            );
        }
        for error in [
            TransportError::Timeout,
            TransportError::Connect("refused".into()),
            TransportError::Other("connection reset".into()),
        ] {
            assert!(matches!(classify(&Err(error)), Verdict::Unavailable { .. }));
        }
    }

    #[test]
    fn last_error_keeps_the_code_and_message_and_is_bounded() {
        let long = "x".repeat(5_000);
        let verdict = classify(&Ok(TransportResponse {
            status: 500,
            body: format!(r#"{{"error":"handler_failed","message":"{long}"}}"#).into_bytes(),
            retry_after: None,
        }));
        let Verdict::Retry { error, .. } = verdict else {
            panic!("{verdict:?}");
        };
        assert!(error.starts_with("500 handler_failed: xxx"), "{error}");
        assert!(error.len() <= 500);
    }
}
