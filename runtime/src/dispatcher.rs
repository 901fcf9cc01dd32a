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
use rusqlite::{Connection, params};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db;
use crate::envelope::{Acknowledgement, Envelope, MessageType};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::signing::{self, Secret, SignatureHeaders};
use crate::transport::{
    HttpTransport, OutgoingRequest, RECEIVE_PATH, Transport, TransportError, TransportResponse,
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
}

impl DispatcherBuilder {
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
    /// `http(s)://` or `unix://` URL are added unless routed explicitly.
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
            let transport: Arc<dyn Transport> =
                if let Some(path) = destination.url.strip_prefix("unix://") {
                    unix_transport(path, config.outbox.request_timeout)
                } else {
                    Arc::new(
                        http_transport(destination, config.outbox.request_timeout).map_err(
                            |message| DispatcherError::Destination {
                                name: name.clone(),
                                message,
                            },
                        )?,
                    )
                };
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

/// The HTTP(S) transport of a configured destination, trusting its
/// `ca_file` if it names one.
fn http_transport(
    destination: &crate::config::DestinationConfig,
    timeout: Duration,
) -> Result<HttpTransport, String> {
    let Some(ca_file) = &destination.ca_file else {
        return HttpTransport::new(&destination.url, timeout).map_err(|e| e.to_string());
    };
    let pem = std::fs::read(ca_file)
        .map_err(|e| format!("cannot read CA file {}: {e}", ca_file.display()))?;
    with_root_certificates(&destination.url, timeout, &pem)
}

#[cfg(feature = "tls")]
fn with_root_certificates(
    url: &str,
    timeout: Duration,
    pem: &[u8],
) -> Result<HttpTransport, String> {
    HttpTransport::with_root_certificates(url, timeout, pem).map_err(|e| e.to_string())
}

#[cfg(not(feature = "tls"))]
fn with_root_certificates(_: &str, _: Duration, _: &[u8]) -> Result<HttpTransport, String> {
    Err("`ca_file` needs HTTPS: build rfidl-runtime with its `tls` feature".to_owned())
}

#[cfg(unix)]
fn unix_transport(path: &str, timeout: Duration) -> Arc<dyn Transport> {
    Arc::new(crate::transport::UnixSocketTransport::new(path, timeout))
}

#[cfg(not(unix))]
fn unix_transport(_: &str, _: Duration) -> Arc<dyn Transport> {
    unreachable!("unix:// destinations exist only on unix")
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
}

/// A claimed row.
#[derive(Debug, Clone)]
struct Claimed {
    message_id: String,
    lease: String,
    correlation_id: Option<String>,
    message_type: String,
    destination: String,
    interface: String,
    version: u32,
    fingerprint: String,
    endpoint: String,
    payload: String,
    headers: String,
    retry_count: u32,
    max_retries: u32,
}

/// What to write back for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Sent {
        response: serde_json::Value,
    },
    DeadLetter {
        error: String,
    },
    /// Retry after a backoff; `Failed` once retries are exhausted, or
    /// `DeadLetter` when `dead_letter_when_exhausted` (signature problems).
    Retry {
        error: String,
        retry_after: Option<Duration>,
        dead_letter_when_exhausted: bool,
    },
}

/// The wire protocol's table: what an answer means for the outbox row.
pub fn classify(result: &Result<TransportResponse, TransportError>) -> Verdict {
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            return Verdict::Retry {
                error: error.to_string(),
                retry_after: None,
                dead_letter_when_exhausted: false,
            };
        }
    };
    let body_text = || {
        String::from_utf8_lossy(&response.body)
            .chars()
            .take(500)
            .collect::<String>()
    };
    match response.status {
        200..=299 => match serde_json::from_slice::<Acknowledgement>(&response.body) {
            Ok(ack) if ack.acknowledged => Verdict::Sent {
                response: ack.payload,
            },
            _ => Verdict::Retry {
                error: format!(
                    "{} without an acknowledgement: {}",
                    response.status,
                    body_text()
                ),
                retry_after: None,
                dead_letter_when_exhausted: false,
            },
        },
        409 => Verdict::Sent {
            response: serde_json::Value::Null,
        },
        400 | 404 | 413 | 422 => Verdict::DeadLetter {
            error: format!("{}: {}", response.status, body_text()),
        },
        401 => Verdict::Retry {
            error: format!("401: {}", body_text()),
            retry_after: None,
            dead_letter_when_exhausted: true,
        },
        status => Verdict::Retry {
            error: format!("{status}: {}", body_text()),
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

async fn run(state: Arc<State>, wake: Arc<tokio::sync::Notify>, cancel: CancellationToken) {
    let mut in_flight: JoinSet<Vec<Attempt>> = JoinSet::new();
    let mut recheck = RECHECK_DELAYS_MS.len();
    loop {
        if cancel.is_cancelled() {
            break;
        }
        let capacity = state
            .config
            .outbox
            .max_in_flight
            .saturating_sub(in_flight.len());
        let claimed = if capacity > 0 {
            claim(
                &state,
                capacity.min(state.config.outbox.batch_size as usize),
            )
            .await
        } else {
            Vec::new()
        };
        let got_rows = !claimed.is_empty();
        // Several due messages for one destination travel as one batch
        // request (`/_rf/receive/batch`); a lone message uses the single endpoint.
        let mut by_destination: BTreeMap<String, Vec<Claimed>> = BTreeMap::new();
        for row in claimed {
            by_destination
                .entry(row.destination.clone())
                .or_default()
                .push(row);
        }
        for rows in by_destination.into_values() {
            let state = state.clone();
            in_flight.spawn(async move { send_group(&state, rows).await });
        }
        if got_rows {
            recheck = 0;
        }
        let idle_wait = if got_rows {
            Duration::ZERO
        } else if recheck < RECHECK_DELAYS_MS.len() {
            recheck += 1;
            Duration::from_millis(RECHECK_DELAYS_MS[recheck - 1])
        } else {
            state.config.outbox.poll_interval
        };
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
                    results.extend(done);
                }
                while let Some(Ok(done)) = in_flight.try_join_next() {
                    results.extend(done);
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
            results.extend(done);
        }
    }
    record(&state, results).await;
}

async fn claim(state: &Arc<State>, limit: usize) -> Vec<Claimed> {
    let store = state.store.clone();
    let lease_ms = state.config.outbox.lease_timeout.as_millis() as i64;
    let metrics = state.metrics.clone();
    let result = tokio::task::spawn_blocking(move || -> rusqlite::Result<Vec<Claimed>> {
        let conn = store.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
        let now = db::now_ms();
        let expired = conn.execute(
            "UPDATE outbox_messages SET status = 'Expired', lease_token = NULL, last_error = 'time to live exceeded' \
             WHERE status IN ('Pending', 'Sending') AND next_retry_at <= ?1 AND expires_at <= ?1",
            params![now],
        )?;
        metrics.outbox_expired.add(expired as u64);
        let lease = uuid::Uuid::now_v7().to_string();
        let mut statement = conn.prepare_cached(
            "UPDATE outbox_messages SET status = 'Sending', lease_token = ?1, next_retry_at = ?2, last_attempt_at = ?3 \
             WHERE message_id IN (SELECT message_id FROM outbox_messages \
                 WHERE status IN ('Pending', 'Sending') AND next_retry_at <= ?3 ORDER BY next_retry_at LIMIT ?4) \
             RETURNING message_id, correlation_id, message_type, destination, interface, version, fingerprint, \
                 endpoint, payload, headers, retry_count, max_retries",
        )?;
        let rows = statement.query_map(params![lease, now + lease_ms, now, limit as i64], |r| {
            Ok(Claimed {
                message_id: r.get(0)?,
                lease: lease.clone(),
                correlation_id: r.get(1)?,
                message_type: r.get(2)?,
                destination: r.get(3)?,
                interface: r.get(4)?,
                version: r.get(5)?,
                fingerprint: r.get(6)?,
                endpoint: r.get(7)?,
                payload: r.get(8)?,
                headers: r.get(9)?,
                retry_count: r.get(10)?,
                max_retries: r.get(11)?,
            })
        })?;
        rows.collect()
    })
    .await;
    match result {
        Ok(Ok(rows)) => rows,
        Ok(Err(error)) => {
            tracing::warn!(%error, "outbox claim failed; retrying at the next round");
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// One send attempt and what came of it.
type Attempt = (Claimed, Result<TransportResponse, TransportError>, Duration);

/// Sends rows that share a destination: alone, or as one batch request.
async fn send_group(state: &State, rows: Vec<Claimed>) -> Vec<Attempt> {
    let started = std::time::Instant::now();
    let Some(route) = rows
        .first()
        .and_then(|row| state.routes.get(&row.destination))
    else {
        let error = TransportError::Connect(format!(
            "no route for destination `{}`",
            rows.first().map_or("", |row| row.destination.as_str())
        ));
        return rows
            .into_iter()
            .map(|row| (row, Err(error.clone()), started.elapsed()))
            .collect();
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
            Err(error) => attempts.push((row, Err(error), started.elapsed())),
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
            .map(|(row, answer)| (row, answer, elapsed)),
    );
    attempts
}

/// The signed single-message request for a claimed row.
fn signed_request(
    state: &State,
    route: &Route,
    row: &Claimed,
) -> Result<OutgoingRequest, TransportError> {
    let envelope = Envelope {
        message_id: row
            .message_id
            .parse()
            .map_err(|_| TransportError::Other("bad message id".into()))?,
        correlation_id: row.correlation_id.clone(),
        source_service_id: state.config.service_id.clone(),
        message_type: MessageType::parse(&row.message_type).unwrap_or(MessageType::Signal),
        interface: row.interface.clone(),
        version: row.version,
        fingerprint: row.fingerprint.clone(),
        endpoint: row.endpoint.clone(),
        payload: serde_json::from_str(&row.payload).unwrap_or(serde_json::Value::Null),
        headers: serde_json::from_str(&row.headers).unwrap_or_default(),
    };
    let body = serde_json::to_vec(&envelope).map_err(|e| TransportError::Other(e.to_string()))?;
    let signature =
        SignatureHeaders::sign(&row.message_id, signing::unix_now(), &body, &route.secrets);
    Ok(OutgoingRequest {
        path: RECEIVE_PATH,
        headers: signature.to_pairs().to_vec(),
        body,
    })
}

async fn record(state: &Arc<State>, results: Vec<Attempt>) {
    if results.is_empty() {
        return;
    }
    let store = state.store.clone();
    let config = state.config.clone();
    let metrics = state.metrics.clone();
    let outcome = tokio::task::spawn_blocking(move || -> rusqlite::Result<()> {
        let mut conn = store.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
        let tx = conn.transaction()?;
        let now = db::now_ms();
        for (row, result, elapsed) in &results {
            metrics.outbox_send_duration.observe(*elapsed);
            let fence = params![row.message_id, row.lease];
            match classify(result) {
                Verdict::Sent { response } => {
                    let changed = tx.execute(
                        "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3, response = ?4, lease_token = NULL, \
                         last_error = NULL WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                        params![fence[0], fence[1], now, serde_json::to_string(&response).unwrap_or_default()],
                    )?;
                    if changed == 1 {
                        metrics.outbox_sent.inc();
                    }
                }
                Verdict::DeadLetter { error } => {
                    tracing::warn!(message_id = %row.message_id, %error, "message dead-lettered");
                    let changed = tx.execute(
                        "UPDATE outbox_messages SET status = 'DeadLetter', last_error = ?3, lease_token = NULL \
                         WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                        params![fence[0], fence[1], error],
                    )?;
                    if changed == 1 {
                        metrics.outbox_dead_lettered.inc();
                    }
                }
                Verdict::Retry { error, retry_after, dead_letter_when_exhausted } => {
                    let attempt = row.retry_count + 1;
                    if attempt > row.max_retries {
                        let status = if dead_letter_when_exhausted { "DeadLetter" } else { "Failed" };
                        tracing::error!(message_id = %row.message_id, %error, "giving up after {} retries", row.max_retries);
                        let changed = tx.execute(
                            "UPDATE outbox_messages SET status = ?3, last_error = ?4, lease_token = NULL \
                             WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                            params![fence[0], fence[1], status, error],
                        )?;
                        if changed == 1 {
                            if dead_letter_when_exhausted {
                                metrics.outbox_dead_lettered.inc();
                            } else {
                                metrics.outbox_failed.inc();
                            }
                        }
                        continue;
                    }
                    let delay = backoff(row.retry_count, config.outbox.backoff_base, config.outbox.backoff_max, config.outbox.jitter)
                        .max(retry_after.unwrap_or_default());
                    tracing::debug!(message_id = %row.message_id, %error, attempt, "send failed; retrying in {delay:?}");
                    let changed = tx.execute(
                        "UPDATE outbox_messages SET status = 'Pending', retry_count = ?3, next_retry_at = ?4, \
                         last_error = ?5, lease_token = NULL \
                         WHERE message_id = ?1 AND lease_token = ?2 AND status = 'Sending'",
                        params![fence[0], fence[1], attempt, now + delay.as_millis() as i64, error],
                    )?;
                    if changed == 1 {
                        metrics.outbox_retries.inc();
                    }
                }
            }
        }
        tx.commit()
    })
    .await;
    if let Ok(Err(error)) = outcome {
        tracing::error!(%error, "cannot record send results; the rows are re-sent after their lease");
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
        assert!(matches!(
            classify(&answer(401, "")),
            Verdict::Retry {
                dead_letter_when_exhausted: true,
                ..
            }
        ));
        for status in [429, 500, 502, 503] {
            assert!(matches!(
                classify(&answer(status, "")),
                Verdict::Retry {
                    dead_letter_when_exhausted: false,
                    ..
                }
            ));
        }
        assert!(matches!(
            classify(&Err(TransportError::Timeout)),
            Verdict::Retry { .. }
        ));
    }
}
