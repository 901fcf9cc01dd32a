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
//! * **Answers** are classified as the wire protocol says (see [`classify`]).
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

pub(crate) mod records;
pub(crate) mod sqlite;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng as _;
use serde_json::value::RawValue;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::circuit::{Admission, Circuits, GroupOutcome};
use crate::config::{Config, Durability};
use crate::db;
use crate::envelope::{Acknowledgement, MessageType, StoredEnvelope};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::responses::ResponseHandler;
use crate::signing::{self, Secret, SignatureHeaders};
use crate::store::{Sqlite, Store};
use crate::transport::{
    OutgoingRequest, RECEIVE_PATH, Transport, TransportError, TransportResponse,
};
use records::ClaimCommit;

/// Why a dispatcher could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatcherError {
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error("destination `{name}`: {message}")]
    Destination { name: String, message: String },
    /// A generated client sends to a destination that nothing routes.
    #[error(
        "a client sends to destination `{name}`, which has no route: add `destinations.{name}` \
         (its `url` and `secret`) to the config, or set RFIDL_DESTINATIONS_{env}_URL and \
         RFIDL_DESTINATIONS_{env}_SECRET",
        env = crate::config::env::name_key(name)
    )]
    UnknownDestination { name: String },
    #[error("cannot start the dispatcher's runtime or thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Where one destination is reached and with which secret requests are signed.
#[derive(Clone)]
pub struct Route {
    pub transport: Arc<dyn Transport>,
    /// Empty: the signing secrets the registry issued to this service
    /// ([`DispatcherBuilder::issued_keys`]).
    pub secrets: Vec<Secret>,
}

/// Opens the dispatcher's store once the builder starts it.
type OpenDb<S> = Box<
    dyn FnOnce(
            &Config,
            Vec<Arc<dyn ResponseHandler<S>>>,
        ) -> Result<Arc<dyn records::DispatchDb>, db::DbError>
        + Send,
>;

/// Configures and starts a dispatcher on the store `S`.
#[must_use]
pub struct DispatcherBuilder<S: Store = Sqlite> {
    outbox: Outbox,
    open: OpenDb<S>,
    routes: BTreeMap<String, Route>,
    errors: Vec<DispatcherError>,
    responses: Vec<Arc<dyn ResponseHandler<S>>>,
    resolver: Option<Resolver>,
    issued: Option<crate::keys::IssuedKeys>,
}

/// Finds the route of a destination that has none of its own
/// ([`DispatcherBuilder::route_by`]).
type Resolver = Arc<dyn Fn(&str) -> Option<Route> + Send + Sync>;

impl<S: Store> DispatcherBuilder<S> {
    /// Routes every destination that has no route of its own through
    /// `resolve`, called once per request to such a destination (cache in
    /// it when building a route costs). For senders whose destinations come
    /// and go, such as the registry's commands to service instances, whose
    /// destination names are base URLs. `None` fails the rows as unroutable.
    pub fn route_by(
        mut self,
        resolve: impl Fn(&str) -> Option<Route> + Send + Sync + 'static,
    ) -> Self {
        self.resolver = Some(Arc::new(resolve));
        self
    }

    /// Acts on the answers to messages of `handler`'s interface version,
    /// inside the transaction that marks each one `Sent` (see
    /// [`crate::responses`]).
    pub fn responses(mut self, handler: impl ResponseHandler<S>) -> Self {
        self.responses.push(Arc::new(handler));
        self
    }

    /// Signs messages to every destination whose config gives no `secret`
    /// with the signing secrets the registry issued to this service
    /// ([`crate::keys`]), as they are when each request is signed. Until
    /// the first ones arrive, such messages wait (not counted). Without
    /// this, a destination without a secret stops the start.
    pub fn issued_keys(mut self, keys: &crate::keys::IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
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

    /// Starts the dispatcher, on a runtime of its own (see the module's
    /// documentation); call it on a tokio runtime, whose shutdown stops the
    /// dispatcher too. Destinations from `Config::destinations` with an
    /// `http(s)://` or `unix://` URL are added unless routed explicitly
    /// (several base URLs: [`crate::transport::SpreadTransport`]).
    pub fn start(mut self) -> Result<DispatcherHandle, DispatcherError> {
        // Panics outside a tokio runtime, before anything has started.
        let caller = tokio::runtime::Handle::current();
        let config = self.outbox.config().clone();
        let mut runtime = Unstarted(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(RUNTIME_WORKERS)
                .thread_name("rfidl-dispatcher-worker")
                .enable_all()
                .build()
                .map_err(DispatcherError::Thread)?,
        ));
        // Transports made here start their background tasks (a gRPC
        // channel's worker) on the dispatcher's runtime, beside the sends.
        let entered = runtime.0.as_ref().map(tokio::runtime::Runtime::enter);
        for (name, destination) in &config.destinations {
            if self.routes.contains_key(name) {
                continue;
            }
            let secrets = if destination.secret.is_empty() && self.issued.is_some() {
                Vec::new()
            } else {
                vec![Secret::parse(&destination.secret).map_err(|e| {
                    DispatcherError::Destination {
                        name: name.clone(),
                        message: if destination.secret.is_empty() {
                            "has no `secret`: give one (`whsec_…`), or run with keys issued by \
                             the registry (`rfidl-registry serve --issue-keys`)"
                                .to_owned()
                        } else {
                            e.to_string()
                        },
                    }
                })?]
            };
            let transport =
                crate::transport::for_destination(destination, config.outbox.request_timeout)
                    .map_err(|message| DispatcherError::Destination {
                        name: name.clone(),
                        message,
                    })?;
            self.routes
                .insert(name.clone(), Route { transport, secrets });
        }
        drop(entered);
        if let Some(error) = self.errors.pop() {
            return Err(error);
        }
        let routable = match self.resolver {
            Some(_) => None,
            None => Some(self.routes.keys().cloned().collect()),
        };
        if let Some(name) = self
            .outbox
            .unroutable_destinations(routable)
            .into_iter()
            .next()
        {
            return Err(DispatcherError::UnknownDestination { name });
        }
        let db = (self.open)(&config, self.responses)?;
        let cancel = CancellationToken::new();
        let state = Arc::new(State {
            config,
            db,
            routes: self.routes,
            metrics: self.outbox.metrics().clone(),
            circuits: self.outbox.circuits().clone(),
            lifecycle: self.outbox.lifecycle().clone(),
            resolver: self.resolver,
            issued: self.issued,
            unrouted: Mutex::new(Vec::new()),
            rotation: std::sync::atomic::AtomicUsize::new(0),
        });
        let (liveness, alive) = Liveness::start();
        self.outbox.set_dispatcher_liveness(liveness.clone());
        let wake = self.outbox.wake_handle();
        let stop = cancel.clone();
        let crash = CancellationToken::new();
        let crashed = crash.clone();
        let (finished, done) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("rfidl-dispatcher".into())
            .spawn(move || {
                let Some(runtime) = runtime.0.take() else {
                    return;
                };
                runtime.block_on(async move {
                    let _alive = alive;
                    // On a worker, so that the sends it spawns start there.
                    let mut task = tokio::spawn(run(state, wake, stop));
                    tokio::select! {
                        _ = &mut task => {}
                        () = crashed.cancelled() => task.abort(),
                    }
                });
                // Waits for a claim or recording still on the blocking pool.
                drop(runtime);
                let _ = finished.send(());
            })
            .map_err(DispatcherError::Thread)?;
        // Lives on the runtime that started the dispatcher, and stops the
        // dispatcher when dropped with it, as a task of that runtime would.
        let crash_on_drop = crash.clone().drop_guard();
        let task = caller.spawn(async move {
            let _crash_on_drop = crash_on_drop;
            let _ = done.await;
        });
        Ok(DispatcherHandle {
            cancel,
            crash,
            task,
            liveness,
        })
    }
}

/// Worker threads of the dispatcher's runtime: one runs its loop (and an
/// idle claim), and the sends spread over both, which a gRPC destination's
/// one call per message needs (on a single thread its batched rate halved on
/// the benchmark machine).
const RUNTIME_WORKERS: usize = 2;

/// The dispatcher's runtime until its thread takes it over. Should `start`
/// fail first (or the thread not start), this drops it without waiting, as
/// a runtime must be dropped on the caller's executor.
struct Unstarted(Option<tokio::runtime::Runtime>);

impl Drop for Unstarted {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The entry point: `Dispatcher::builder(&outbox, db_path).route(…).start()`
/// on SQLite, `Dispatcher::postgres(&outbox, &url)` on PostgreSQL.
pub struct Dispatcher;

impl Dispatcher {
    /// A dispatcher for the outbox in the SQLite file `db_path`.
    pub fn builder(outbox: &Outbox, db_path: impl AsRef<Path>) -> DispatcherBuilder<Sqlite> {
        let path = db_path.as_ref().to_path_buf();
        Self::with_store(
            outbox,
            Box::new(move |config: &Config, responses| {
                // NORMAL: only a claim may need an fsync, and it asks for
                // one itself (see `SqliteDispatch::claim`).
                let conn = db::open(&path, Durability::Normal)?;
                let exclusive = sqlite::ExclusiveDispatch::try_acquire(&path);
                if exclusive.is_some() {
                    let reclaimed =
                        sqlite::reclaim_abandoned(&conn, db::now_ms()).map_err(|source| {
                            db::DbError::Sqlite {
                                path: path.display().to_string(),
                                source,
                            }
                        })?;
                    if reclaimed > 0 {
                        tracing::info!(
                            rows = reclaimed,
                            "rows a dispatcher that is gone left `Sending` are due again now"
                        );
                    }
                }
                Ok(Arc::new(sqlite::SqliteDispatch::new(
                    conn,
                    exclusive,
                    config.outbox.durability,
                    responses,
                )) as Arc<dyn records::DispatchDb>)
            }),
        )
    }

    /// A dispatcher for the outbox in a PostgreSQL database. Any number of
    /// dispatchers (replicas) may share one database: claims skip the rows
    /// another one has locked, and leases fence what each may update.
    #[cfg(feature = "postgres")]
    pub fn postgres(
        outbox: &Outbox,
        url: &crate::pg::PostgresUrl,
    ) -> DispatcherBuilder<crate::store::Postgres> {
        let url = url.clone();
        Self::with_store(
            outbox,
            Box::new(move |_: &Config, responses| {
                let client = crate::pg::open(&url)?;
                Ok(Arc::new(crate::pg::PostgresDispatch::new(
                    crate::pg::Connection::new(url, client),
                    responses,
                )) as Arc<dyn records::DispatchDb>)
            }),
        )
    }

    fn with_store<S: Store>(outbox: &Outbox, open: OpenDb<S>) -> DispatcherBuilder<S> {
        DispatcherBuilder {
            outbox: outbox.clone(),
            open,
            routes: BTreeMap::new(),
            errors: Vec::new(),
            responses: Vec::new(),
            resolver: None,
            issued: None,
        }
    }
}

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

/// What to write back for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Sent {
        response: serde_json::Value,
    },
    /// A broker stored the message (a JetStream publish acknowledgement,
    /// status [`BROKER_ACCEPTED_STATUS`] marked `"deferred": true`): `Sent`,
    /// without running a response handler; the receiver's answer comes
    /// back later through the broker (`crate::nats::AnswersConsumer`).
    Published,
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

/// How long to keep looking after a wake-up that found nothing (the caller
/// may not have committed yet).
const RECHECK_DELAYS_MS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The fewest rows one claim may take. `outbox.batch_size` is the most
/// messages per request; a claim takes at least this many (still cut into
/// requests of at most the batch size, at most `max_in_flight` of them), so
/// that small batches do not cost a claim transaction, and under
/// `outbox.durability: normal` an fsync, per request: with `batch_size: 1`
/// one claim per message held exactly-once delivery to about 1,600
/// messages a second on the benchmark machine (BENCHMARKS.md, "One message
/// per request").
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
        let (groups, on_this_worker) = if capacity > 0 {
            claim(&state, capacity, in_flight.is_empty()).await
        } else {
            (Vec::new(), false)
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
/// the groups, and whether the claim ran on this worker: it may then have
/// been left open, for the caller to commit with
/// [`DispatchDb::finish_claim`] once the groups' sends have started.
async fn claim(state: &Arc<State>, capacity: usize, idle: bool) -> (Vec<Group>, bool) {
    let mut destinations: Vec<String> = state.routes.keys().cloned().collect();
    if let Ok(unrouted) = state.unrouted.lock() {
        destinations.extend(unrouted.iter().cloned());
    }
    if destinations.is_empty() {
        return (Vec::new(), false);
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
        return (Vec::new(), false);
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
    let groups = match result {
        Ok(Ok((groups, expired))) => {
            state.metrics.outbox_expired.add(expired);
            groups
        }
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
    (groups, inline)
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
            Err(error) => attempts.push((row, Outcome::Unsendable(error), started.elapsed())),
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

/// The signed single-message request for a claimed row. Its payload and
/// headers go into the body as the row stores them ([`StoredEnvelope`]).
fn signed_request(
    state: &State,
    secrets: &[Secret],
    row: &Claimed,
) -> Result<OutgoingRequest, String> {
    let message_id: uuid::Uuid = row
        .message_id
        .parse()
        .map_err(|_| format!("stored message id `{}` is not a UUID", row.message_id))?;
    let envelope = StoredEnvelope {
        message_id: &message_id,
        correlation_id: row.correlation_id.as_deref(),
        source_service_id: &state.config.service_id,
        message_type: MessageType::parse(&row.message_type).unwrap_or(MessageType::Signal),
        interface: &row.interface,
        version: row.version,
        fingerprint: &row.fingerprint,
        endpoint: &row.endpoint,
        payload: stored_json("payload", &row.payload)?,
        headers: stored_json("headers", &row.headers)?,
        created_at: jiff::Timestamp::from_millisecond(row.created_at_ms).ok(),
    };
    let body = serde_json::to_vec(&envelope).map_err(|e| format!("cannot encode: {e}"))?;
    let signature = SignatureHeaders::sign(&row.message_id, signing::unix_now(), &body, secrets);
    Ok(OutgoingRequest {
        path: RECEIVE_PATH,
        headers: signature.to_pairs().to_vec(),
        body,
    })
}

/// A row's JSON column, checked (a row the outbox wrote always is JSON) but
/// not parsed into a value.
fn stored_json<'r>(column: &str, text: &'r str) -> Result<&'r RawValue, String> {
    serde_json::from_str(text).map_err(|e| format!("stored {column} is not JSON: {e}"))
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
