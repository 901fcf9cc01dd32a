//! The dispatcher: a tokio task that claims due outbox rows, signs and sends
//! them, and records what the receiver answered.
//!
//! * **Claims are leases.** One `UPDATE … RETURNING` moves due rows to
//!   `Sending` with a fresh lease token and a lease expiry. Every later update
//!   of the row is fenced on that token, so a dispatcher whose lease ran out
//!   (paused, partitioned) cannot overwrite newer state, and two dispatchers
//!   on one database never send a row at the same time. A row left `Sending`
//!   by a crash is claimed again once its lease expires.
//! * **Answers** are classified as the wire protocol says (see [`classify`]).
//! * **Backoff** is `min(base * 2^n, max) + uniform jitter`, or the
//!   receiver's `Retry-After` when longer.
//! * SQLite runs on the blocking pool (`spawn_blocking`), never on the
//!   async executor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng as _;
use rusqlite::{Connection, OptionalExtension as _, params};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::circuit::{Admission, Circuits, GroupOutcome};
use crate::config::Config;
use crate::db;
use crate::envelope::{Acknowledgement, Envelope, MessageType};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::signing::{self, Secret, SignatureHeaders};
use crate::transport::{
    OutgoingRequest, RECEIVE_PATH, Transport, TransportError, TransportResponse,
};

/// Why a dispatcher could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatcherError {
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error("destination `{name}`: {message}")]
    Destination { name: String, message: String },
}

/// Where one destination is reached and with which secret requests are signed.
#[derive(Clone)]
pub struct Route {
    pub transport: Arc<dyn Transport>,
    pub secrets: Vec<Secret>,
}

/// Configures and starts a dispatcher.
#[must_use]
pub struct DispatcherBuilder {
    outbox: Outbox,
    db_path: PathBuf,
    routes: BTreeMap<String, Route>,
    errors: Vec<DispatcherError>,
    responses: Vec<Arc<dyn crate::responses::ResponseHandler>>,
}

impl DispatcherBuilder {
    /// Acts on the answers to messages of `handler`'s interface version,
    /// inside the transaction that marks each one `Sent` (see
    /// [`crate::responses`]).
    pub fn responses(mut self, handler: impl crate::responses::ResponseHandler) -> Self {
        self.responses.push(Arc::new(handler));
        self
    }

    /// Sends messages for `destination` through `transport`, signed with `secret`.
    pub fn route(
        mut self,
        destination: impl Into<String>,
        transport: impl Transport,
        secret: Secret,
    ) -> Self {
        self.routes.insert(
            destination.into(),
            Route {
                transport: Arc::new(transport),
                secrets: vec![secret],
            },
        );
        self
    }

    /// Starts the task. Destinations from `Config::destinations` with an
    /// `http(s)://` or `unix://` URL are added unless routed explicitly
    /// (several base URLs: [`crate::transport::SpreadTransport`]).
    pub fn start(mut self) -> Result<DispatcherHandle, DispatcherError> {
        let config = self.outbox.config().clone();
        for (name, destination) in &config.destinations {
            if self.routes.contains_key(name) {
                continue;
            }
            let secret =
                Secret::parse(&destination.secret).map_err(|e| DispatcherError::Destination {
                    name: name.clone(),
                    message: e.to_string(),
                })?;
            let transport =
                crate::transport::for_destination(destination, config.outbox.request_timeout)
                    .map_err(|message| DispatcherError::Destination {
                        name: name.clone(),
                        message,
                    })?;
            self.routes.insert(
                name.clone(),
                Route {
                    transport,
                    secrets: vec![secret],
                },
            );
        }
        if let Some(error) = self.errors.pop() {
            return Err(error);
        }
        let conn = db::open(&self.db_path, config.outbox.durability)?;
        let cancel = CancellationToken::new();
        let state = Arc::new(State {
            config,
            store: Arc::new(Mutex::new(conn)),
            routes: self.routes,
            metrics: self.outbox.metrics().clone(),
            circuits: self.outbox.circuits().clone(),
            unrouted: Mutex::new(Vec::new()),
            rotation: std::sync::atomic::AtomicUsize::new(0),
            responses: self.responses,
        });
        let (liveness, alive) = Liveness::start();
        self.outbox.set_dispatcher_liveness(liveness.clone());
        let wake = self.outbox.wake_handle();
        let worker_cancel = cancel.clone();
        let task = tokio::spawn(async move {
            let _alive = alive;
            run(state, wake, worker_cancel).await;
        });
        Ok(DispatcherHandle {
            cancel,
            task,
            liveness,
        })
    }
}

/// The entry point: `Dispatcher::builder(&outbox, db_path).route(…).start()`.
pub struct Dispatcher;

impl Dispatcher {
    pub fn builder(outbox: &Outbox, db_path: impl AsRef<Path>) -> DispatcherBuilder {
        DispatcherBuilder {
            outbox: outbox.clone(),
            db_path: db_path.as_ref().to_path_buf(),
            routes: BTreeMap::new(),
            errors: Vec::new(),
            responses: Vec::new(),
        }
    }
}

/// Owns the running task; `shutdown` stops it cleanly.
pub struct DispatcherHandle {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    liveness: Liveness,
}

impl DispatcherHandle {
    /// Whether the task runs (for readiness probes; see [`crate::liveness`]).
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
        self.task.abort();
    }
}

struct State {
    config: Config,
    store: Arc<Mutex<Connection>>,
    routes: BTreeMap<String, Route>,
    metrics: Arc<Metrics>,
    circuits: Arc<Circuits>,
    /// Destinations with waiting rows but no route (found by [`discover`]):
    /// their rows are claimed too, and fail as unroutable, so they surface.
    unrouted: Mutex<Vec<String>>,
    /// Which destination claims first this round (fairness).
    rotation: std::sync::atomic::AtomicUsize,
    /// Handlers of answers, by interface version (`crate::responses`).
    responses: Vec<Arc<dyn crate::responses::ResponseHandler>>,
}

/// A claimed row.
#[derive(Debug, Clone)]
struct Claimed {
    message_id: String,
    lease: String,
    correlation_id: Option<String>,
    message_type: String,
    interface: String,
    version: u32,
    fingerprint: String,
    endpoint: String,
    payload: String,
    headers: String,
    retry_count: u32,
    max_retries: u32,
    created_at_ms: i64,
}

/// What to write back for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Sent {
        response: serde_json::Value,
    },
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
}

/// The wire protocol's table: what an answer means for the outbox row.
pub fn classify(result: &Result<TransportResponse, TransportError>) -> Verdict {
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

/// How long to keep looking after a wake-up that found nothing (the caller
/// may not have committed yet).
const RECHECK_DELAYS_MS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Rows claimed for one request: one destination, sent alone or as a batch.
#[derive(Debug)]
struct Group {
    destination: String,
    rows: Vec<Claimed>,
    probe: bool,
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
        let groups = if capacity > 0 {
            claim(&state, capacity).await
        } else {
            Vec::new()
        };
        let got_rows = !groups.is_empty();
        for group in groups {
            let state = state.clone();
            in_flight.spawn(async move { send_group(&state, group).await });
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
/// look-up per distinct destination), so that their rows are claimed too.
async fn discover(state: &Arc<State>) {
    let store = state.store.clone();
    let found = tokio::task::spawn_blocking(move || -> rusqlite::Result<Vec<String>> {
        let conn = store.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
        let mut statement = conn.prepare_cached(
            "SELECT destination FROM outbox_messages WHERE status IN ('Pending', 'Sending') \
             AND destination > ?1 ORDER BY destination LIMIT 1",
        )?;
        let mut destinations = Vec::new();
        let mut after = String::new();
        while let Some(next) = statement
            .query_row([&after], |row| row.get::<_, String>(0))
            .optional()?
        {
            destinations.push(next.clone());
            after = next;
        }
        Ok(destinations)
    })
    .await;
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
/// Rows past their TTL are marked `Expired` instead.
async fn claim(state: &Arc<State>, capacity: usize) -> Vec<Group> {
    let mut destinations: Vec<String> = state.routes.keys().cloned().collect();
    if let Ok(unrouted) = state.unrouted.lock() {
        destinations.extend(unrouted.iter().cloned());
    }
    if destinations.is_empty() {
        return Vec::new();
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
        return Vec::new();
    }
    let store = state.store.clone();
    let lease_ms = state.config.outbox.lease_timeout.as_millis() as i64;
    let metrics = state.metrics.clone();
    let row_budget = state.config.outbox.batch_size.max(1) as usize;
    let plan_for_db = plan.clone();
    let durability = state.config.outbox.durability;
    let result = tokio::task::spawn_blocking(move || -> rusqlite::Result<Vec<Group>> {
        let mut conn = store.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
        // The claim commits with FULL whatever `outbox.durability` says: its
        // fsync of the WAL makes every transaction committed before it
        // durable, so no message leaves before the transaction that enqueued
        // it is on disk. (With NORMAL, a power cut after the receiver's 2xx
        // could undo the very transaction whose message the receiver
        // processed: test
        // `powerloss_sender_normal_never_delivers_a_transaction_it_can_lose`.)
        // One fsync per claim, none per enqueue. Recording results needs
        // none of its own: a result lost in a power cut means a re-send,
        // answered as a duplicate.
        conn.pragma_update(None, "synchronous", "FULL")?;
        let claimed = claim_groups(
            &mut conn,
            &plan_for_db,
            lease_ms,
            &metrics,
            row_budget,
            capacity,
        );
        let restored = conn.pragma_update(None, "synchronous", db::synchronous(durability));
        let groups = claimed?;
        restored?;
        Ok(groups)
    })
    .await;
    let groups = match result {
        Ok(Ok(groups)) => groups,
        Ok(Err(error)) => {
            tracing::warn!(%error, "outbox claim failed; retrying at the next round");
            Vec::new()
        }
        Err(_) => Vec::new(),
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
    groups
}

/// What one attempt came to: the transport's answer, or a row that could
/// not even be turned into a request.
#[derive(Debug, Clone)]
enum Outcome {
    Answer(Result<TransportResponse, TransportError>),
    Unsendable(String),
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
        }
    }
}

/// The claim's transaction: due rows, destination by destination as `plan`
/// admits them, at most `row_budget` rows in at most `capacity` groups.
fn claim_groups(
    conn: &mut Connection,
    plan: &[(String, Admission)],
    lease_ms: i64,
    metrics: &Metrics,
    row_budget: usize,
    capacity: usize,
) -> rusqlite::Result<Vec<Group>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let now = db::now_ms();
    let lease = uuid::Uuid::now_v7().to_string();
    let mut groups = Vec::new();
    // Counted once the claim commits (a failed claim is redone).
    let mut expired_total = 0;
    let mut rows_left = row_budget;
    let mut groups_left = capacity;
    for (destination, admission) in plan {
        if rows_left == 0 || groups_left == 0 {
            break;
        }
        let (limit, per_group, probe) = match *admission {
            Admission::Probe => (1, 1, true),
            Admission::Closed { batch_limit } => {
                let per_group = batch_limit.max(1);
                (rows_left.min(per_group * groups_left), per_group, false)
            }
            Admission::Blocked { .. } => continue,
        };
        let mut statement = tx.prepare_cached(
            "UPDATE outbox_messages SET status = 'Sending', lease_token = ?1, next_retry_at = ?2, last_attempt_at = ?3 \
             WHERE message_id IN (SELECT message_id FROM outbox_messages \
                 WHERE destination = ?5 AND status IN ('Pending', 'Sending') AND next_retry_at <= ?3 \
                 ORDER BY next_retry_at LIMIT ?4) \
             RETURNING message_id, correlation_id, message_type, interface, version, fingerprint, \
                 endpoint, payload, headers, retry_count, max_retries, created_at, expires_at",
        )?;
        let mut expired = Vec::new();
        let mut live = Vec::new();
        let rows = statement.query_map(
            params![lease, now + lease_ms, now, limit as i64, destination],
            |r| {
                Ok((
                    Claimed {
                        message_id: r.get(0)?,
                        lease: lease.clone(),
                        correlation_id: r.get(1)?,
                        message_type: r.get(2)?,
                        interface: r.get(3)?,
                        version: r.get(4)?,
                        fingerprint: r.get(5)?,
                        endpoint: r.get(6)?,
                        payload: r.get(7)?,
                        headers: r.get(8)?,
                        retry_count: r.get(9)?,
                        max_retries: r.get(10)?,
                        created_at_ms: r.get(11)?,
                    },
                    r.get::<_, i64>(12)?,
                ))
            },
        )?;
        for row in rows {
            let (claimed, expires_at) = row?;
            if expires_at <= now {
                expired.push(claimed);
            } else {
                live.push(claimed);
            }
        }
        for row in &expired {
            tx.execute(
                "UPDATE outbox_messages SET status = 'Expired', lease_token = NULL, \
                 last_error = 'time to live exceeded' WHERE message_id = ?1 AND lease_token = ?2",
                params![row.message_id, row.lease],
            )?;
        }
        expired_total += expired.len() as u64;
        rows_left = rows_left.saturating_sub(live.len());
        let mut live = live.into_iter().peekable();
        while live.peek().is_some() && groups_left > 0 {
            let rows: Vec<Claimed> = live.by_ref().take(per_group).collect();
            groups_left -= 1;
            groups.push(Group {
                destination: destination.clone(),
                rows,
                probe,
            });
        }
        // Rows beyond the group capacity stay claimed under this lease
        // only if sent; release any left over.
        for row in live {
            tx.execute(
                "UPDATE outbox_messages SET status = 'Pending', lease_token = NULL, next_retry_at = ?3 \
                 WHERE message_id = ?1 AND lease_token = ?2",
                params![row.message_id, row.lease, now],
            )?;
        }
    }
    tx.commit()?;
    metrics.outbox_expired.add(expired_total);
    Ok(groups)
}

/// One send attempt and what came of it.
type Attempt = (Claimed, Outcome, Duration);

/// Sends rows that share a destination: alone, or as one batch request.
async fn send_group(state: &State, group: Group) -> GroupResult {
    let Group {
        destination,
        rows,
        probe,
    } = group;
    let started = std::time::Instant::now();
    let Some(route) = state.routes.get(&destination) else {
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
    let mut requests = Vec::with_capacity(rows.len());
    let mut ready = Vec::with_capacity(rows.len());
    let mut attempts = Vec::with_capacity(rows.len());
    for row in rows {
        match signed_request(state, route, &row) {
            Ok(request) => {
                requests.push(request);
                ready.push(row);
            }
            Err(error) => attempts.push((row, Outcome::Unsendable(error), started.elapsed())),
        }
    }
    let answers = match requests.len() {
        0 => Vec::new(),
        1 => vec![route.transport.send(requests.remove(0)).await],
        _ => route.transport.send_batch(requests).await,
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

/// The signed single-message request for a claimed row.
fn signed_request(state: &State, route: &Route, row: &Claimed) -> Result<OutgoingRequest, String> {
    let envelope = Envelope {
        message_id: row
            .message_id
            .parse()
            .map_err(|_| format!("stored message id `{}` is not a UUID", row.message_id))?,
        correlation_id: row.correlation_id.clone(),
        source_service_id: state.config.service_id.clone(),
        message_type: MessageType::parse(&row.message_type).unwrap_or(MessageType::Signal),
        interface: row.interface.clone(),
        version: row.version,
        fingerprint: row.fingerprint.clone(),
        endpoint: row.endpoint.clone(),
        payload: serde_json::from_str(&row.payload).unwrap_or(serde_json::Value::Null),
        headers: serde_json::from_str(&row.headers).unwrap_or_default(),
        created_at: jiff::Timestamp::from_millisecond(row.created_at_ms).ok(),
    };
    let body = serde_json::to_vec(&envelope).map_err(|e| format!("cannot encode: {e}"))?;
    let signature =
        SignatureHeaders::sign(&row.message_id, signing::unix_now(), &body, &route.secrets);
    Ok(OutgoingRequest {
        path: RECEIVE_PATH,
        headers: signature.to_pairs().to_vec(),
        body,
    })
}

/// What one recording transaction changed, added to the metrics after it commits.
#[derive(Debug, Default)]
struct RecordCounts {
    sent: u64,
    dead_lettered: u64,
    failed: u64,
    retries: u64,
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
    let store = state.store.clone();
    let config = state.config.clone();
    let metrics = state.metrics.clone();
    let responses = state.responses.clone();
    let outcome = tokio::task::spawn_blocking(move || -> rusqlite::Result<()> {
        let mut conn = store.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
        let tx = conn.transaction()?;
        let now = db::now_ms();
        // Counted once the transaction commits: a recording that fails (a
        // full disk) is redone after the lease, and must not count twice.
        let mut counts = RecordCounts::default();
        let backoff_of = |retry: u32| {
            backoff(
                retry,
                config.outbox.backoff_base,
                config.outbox.backoff_max,
                config.outbox.jitter,
            )
        };
        for ((row, _, elapsed), verdict) in &attempts {
            metrics.outbox_send_duration.observe(*elapsed);
            let fence = (&row.message_id, &row.lease);
            let finish = |status: &str, error: &str| {
                tx.execute(
                    "UPDATE outbox_messages SET status = ?3, last_error = ?4, lease_token = NULL \
                     WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                    params![fence.0, fence.1, status, error],
                )
            };
            let again = |retry_count: u32, delay: Duration, error: &str| {
                tx.execute(
                    "UPDATE outbox_messages SET status = 'Pending', retry_count = ?3, next_retry_at = ?4, \
                     last_error = ?5, lease_token = NULL \
                     WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                    params![fence.0, fence.1, retry_count, now + delay.as_millis() as i64, error],
                )
            };
            match verdict {
                Verdict::Sent { response } => {
                    // A response handler's writes and the `Sent` status
                    // commit together or roll back together.
                    let handler = answer_handler(&responses, row);
                    if handler.is_some() {
                        tx.execute_batch("SAVEPOINT rfidl_answer")?;
                    }
                    let changed = tx.execute(
                        "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3, response = ?4, lease_token = NULL, \
                         last_error = NULL WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                        params![fence.0, fence.1, now, serde_json::to_string(response).unwrap_or_default()],
                    )?;
                    let failed = match handler {
                        Some(handler) if changed == 1 => act_on_answer(handler, row, response, &tx),
                        _ => None,
                    };
                    if let Some(error) = failed {
                        tx.execute_batch("ROLLBACK TO rfidl_answer; RELEASE rfidl_answer")?;
                        tracing::warn!(message_id = %row.message_id, %error, "response handler failed; the message is sent again");
                        let attempt = row.retry_count + 1;
                        if attempt > row.max_retries {
                            if finish("Failed", &error)? == 1 {
                                counts.failed += 1;
                            }
                        } else if again(attempt, backoff_of(row.retry_count), &error)? == 1 {
                            counts.retries += 1;
                        }
                        continue;
                    }
                    if handler.is_some() {
                        tx.execute_batch("RELEASE rfidl_answer")?;
                    }
                    if changed == 1 {
                        counts.sent += 1;
                    }
                }
                Verdict::DeadLetter { error } => {
                    tracing::warn!(message_id = %row.message_id, %error, "message dead-lettered");
                    if finish("DeadLetter", error)? == 1 {
                        counts.dead_lettered += 1;
                    }
                }
                Verdict::Failed { error } => {
                    tracing::error!(message_id = %row.message_id, %error, "message failed; an operator decides");
                    if finish("Failed", error)? == 1 {
                        counts.failed += 1;
                    }
                }
                Verdict::Retry { error, retry_after, dead_letter_when_exhausted } => {
                    let attempt = row.retry_count + 1;
                    if attempt > row.max_retries {
                        let status = if *dead_letter_when_exhausted { "DeadLetter" } else { "Failed" };
                        tracing::error!(message_id = %row.message_id, %error, "giving up after {} retries", row.max_retries);
                        if finish(status, error)? == 1 {
                            if *dead_letter_when_exhausted {
                                counts.dead_lettered += 1;
                            } else {
                                counts.failed += 1;
                            }
                        }
                        continue;
                    }
                    let delay = backoff_of(row.retry_count).max(retry_after.unwrap_or_default());
                    tracing::debug!(message_id = %row.message_id, %error, attempt, "send failed; retrying in {delay:?}");
                    if again(attempt, delay, error)? == 1 {
                        counts.retries += 1;
                    }
                }
                // Not counted: the row waits (its circuit gates an unreachable
                // destination) and is due again after one base backoff.
                Verdict::Unavailable { error, retry_after } | Verdict::Wait { error, retry_after, .. } => {
                    let delay = backoff_of(0).max(retry_after.unwrap_or_default());
                    tracing::debug!(message_id = %row.message_id, %error, "not delivered; retrying in {delay:?} (not counted)");
                    if again(row.retry_count, delay, error)? == 1 {
                        counts.retries += 1;
                    }
                }
            }
        }
        tx.commit()?;
        metrics.outbox_sent.add(counts.sent);
        metrics.outbox_dead_lettered.add(counts.dead_lettered);
        metrics.outbox_failed.add(counts.failed);
        metrics.outbox_retries.add(counts.retries);
        Ok(())
    })
    .await;
    if let Ok(Err(error)) = outcome {
        tracing::error!(%error, "cannot record send results; the rows are re-sent after their lease");
    }
    for (destination, outcome) in &outcomes {
        state.circuits.record(destination, outcome);
    }
}

/// The response handler registered for `row`'s interface version, if any.
fn answer_handler<'a>(
    responses: &'a [Arc<dyn crate::responses::ResponseHandler>],
    row: &Claimed,
) -> Option<&'a dyn crate::responses::ResponseHandler> {
    responses
        .iter()
        .find(|h| h.interface() == (row.interface.as_str(), row.version))
        .map(|h| h.as_ref())
}

/// Runs `handler` on `row`'s answer inside `tx` (behind the caller's
/// savepoint); `Some(error)` when it failed.
fn act_on_answer(
    handler: &dyn crate::responses::ResponseHandler,
    row: &Claimed,
    response: &serde_json::Value,
    tx: &rusqlite::Transaction<'_>,
) -> Option<String> {
    let answer = crate::responses::Answer {
        message_id: &row.message_id,
        interface: &row.interface,
        version: row.version,
        endpoint: &row.endpoint,
        correlation_id: row.correlation_id.as_deref(),
        payload: response,
    };
    handler
        .handle(&answer, tx)
        .err()
        .map(|error| format!("response handler: {error}"))
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
