//! Several base URLs for one destination: requests are spread round-robin
//! over the endpoints that are up, and a request whose endpoint fails is
//! sent again at once to the next one (failover).
//!
//! * **What counts as a failure of the endpoint**: no answer (connection
//!   refused, timeout, connection lost before the answer was read). An HTTP
//!   answer, whatever its status, is the receiver speaking: it goes back to
//!   the dispatcher as it is, and the endpoint stays up (a 503 `in_progress`
//!   or a 422 would be the same on every replica).
//! * **A failed endpoint is down** for a short back-off that doubles with
//!   each failure in a row (from 500 ms up to 30 s by default) and ends at
//!   its first answer. While it is down, requests go to the others; a
//!   request tries the endpoints that are down only once every endpoint that
//!   is up has failed it, soonest-back first. Each request tries each
//!   endpoint at most once.
//! * **All down**: the last transport error is returned, as a single
//!   [`HttpTransport`] would; the dispatcher's circuit breaker then probes
//!   the destination with one message at a time, and each probe tries every
//!   endpoint.
//! * **Batches** (`/_rf/receive/batch`) go whole to one endpoint, and whole
//!   to the next one if it fails.
//! * **Timeouts add up**: one request may wait the timeout of each endpoint
//!   that does not answer before one does.
//!
//! **Why sending the same request again is safe.** A timeout or a lost
//! connection does not say whether the first endpoint processed the message
//! before it went silent. Sending it to the next endpoint is safe because
//! the receiving inbox de-duplicates by message id (the second copy is
//! answered `duplicate` with the first answer, and has no second effect) —
//! which holds when the endpoints are instances of one receiving service
//! sharing its inbox database, the setup this transport is for. Endpoints
//! with separate inboxes would each process a message once: spreading over
//! them is not exactly-once.
//!
//! The signed request is sent unchanged: its signature covers the body,
//! message id and timestamp, not the host.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{
    BatchFuture, HttpTransport, OutgoingRequest, SendFuture, Transport, TransportError,
    split_batch_answer,
};

/// The back-off of an endpoint after its first failure in a row.
pub const DEFAULT_DOWN_BASE: Duration = Duration::from_millis(500);
/// The longest back-off of an endpoint that keeps failing.
pub const DEFAULT_DOWN_MAX: Duration = Duration::from_secs(30);

/// Spreads requests over several [`HttpTransport`]s and fails over between
/// them (see the module documentation).
#[derive(Debug)]
pub struct SpreadTransport {
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    down_base: Duration,
    down_max: Duration,
}

#[derive(Debug)]
struct Endpoint {
    transport: HttpTransport,
    health: Mutex<Health>,
}

/// Failures in a row and, while down, when the endpoint may be tried again.
#[derive(Debug, Default, Clone, Copy)]
struct Health {
    failures: u32,
    down_until: Option<Instant>,
}

impl Health {
    fn is_up(&self, now: Instant) -> bool {
        self.down_until.is_none_or(|until| until <= now)
    }
}

/// One endpoint as [`SpreadTransport::endpoints`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointState {
    /// Its base URL.
    pub url: String,
    /// `false` while it is in its back-off after a transport failure.
    pub up: bool,
    /// Transport failures in a row (0 once it answered).
    pub failures: u32,
}

impl SpreadTransport {
    /// Spreads over `endpoints`, in the given order. Panics if there are none.
    pub fn new(endpoints: Vec<HttpTransport>) -> Self {
        assert!(
            !endpoints.is_empty(),
            "SpreadTransport needs at least one endpoint"
        );
        Self {
            endpoints: endpoints
                .into_iter()
                .map(|transport| Endpoint {
                    transport,
                    health: Mutex::new(Health::default()),
                })
                .collect(),
            next: AtomicUsize::new(0),
            down_base: DEFAULT_DOWN_BASE,
            down_max: DEFAULT_DOWN_MAX,
        }
    }

    /// How long a failed endpoint is left alone: `base` after its first
    /// failure in a row, doubling up to `max` (defaults
    /// [`DEFAULT_DOWN_BASE`], [`DEFAULT_DOWN_MAX`]).
    #[must_use]
    pub fn down_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.down_base = base;
        self.down_max = max.max(base);
        self
    }

    /// Each endpoint, in configuration order, and whether it is up now.
    pub fn endpoints(&self) -> Vec<EndpointState> {
        let now = Instant::now();
        self.endpoints
            .iter()
            .map(|endpoint| {
                let health = endpoint.health();
                EndpointState {
                    url: endpoint.transport.base_url().to_owned(),
                    up: health.is_up(now),
                    failures: health.failures,
                }
            })
            .collect()
    }

    /// The order in which one request tries the endpoints: those up, round
    /// robin from the next in turn; then those down, soonest back first.
    fn attempt_order(&self) -> Vec<usize> {
        let count = self.endpoints.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let now = Instant::now();
        let mut up = Vec::with_capacity(count);
        let mut down = Vec::new();
        for index in (0..count).map(|i| (start + i) % count) {
            let health = self.endpoints[index].health();
            if health.is_up(now) {
                up.push(index);
            } else {
                down.push((health.down_until, index));
            }
        }
        down.sort_by_key(|(until, _)| *until);
        up.extend(down.into_iter().map(|(_, index)| index));
        up
    }

    /// Records a transport failure of endpoint `index`. A failure seen by
    /// several requests in flight at once counts once: an endpoint already
    /// down keeps its back-off.
    fn failed(&self, index: usize, error: &TransportError) {
        let endpoint = &self.endpoints[index];
        let now = Instant::now();
        let mut health = endpoint.lock();
        if !health.is_up(now) {
            return;
        }
        health.failures = health.failures.saturating_add(1);
        let backoff = self
            .down_base
            .saturating_mul(1 << (health.failures - 1).min(16))
            .min(self.down_max);
        health.down_until = Some(now + backoff);
        tracing::warn!(
            url = %endpoint.transport.base_url(),
            failures = health.failures,
            ?backoff,
            %error,
            "endpoint unreachable; sending to the others"
        );
    }

    /// Records an answer of endpoint `index`: it is up.
    fn answered(&self, index: usize) {
        let endpoint = &self.endpoints[index];
        let mut health = endpoint.lock();
        if health.failures > 0 {
            tracing::info!(url = %endpoint.transport.base_url(), "endpoint answers again");
        }
        *health = Health::default();
    }
}

impl Endpoint {
    fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn health(&self) -> Health {
        *self.lock()
    }
}

impl Transport for SpreadTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let mut last_error = None;
            for index in self.attempt_order() {
                match self.endpoints[index].transport.send(request.clone()).await {
                    Ok(answer) => {
                        self.answered(index);
                        return Ok(answer);
                    }
                    Err(error) => {
                        self.failed(index, &error);
                        last_error = Some(error);
                    }
                }
            }
            Err(last_error.expect("at least one endpoint"))
        })
    }

    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        Box::pin(async move {
            let mut last_error = None;
            for index in self.attempt_order() {
                match self.endpoints[index]
                    .transport
                    .send_whole_batch(&requests)
                    .await
                {
                    Some(Ok(answers)) => {
                        self.answered(index);
                        return answers;
                    }
                    Some(Err(error)) => {
                        self.failed(index, &error);
                        last_error = Some(error);
                    }
                    // This receiver has no batch endpoint (it answered, so
                    // it is up): one by one, each failing over on its own.
                    None => {
                        self.answered(index);
                        let mut answers = Vec::with_capacity(requests.len());
                        for request in requests {
                            answers.push(self.send(request).await);
                        }
                        return answers;
                    }
                }
            }
            split_batch_answer(
                requests.len(),
                Err(last_error.expect("at least one endpoint")),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(count: usize) -> SpreadTransport {
        let endpoints = (0..count)
            .map(|i| {
                HttpTransport::new(
                    format!("http://127.0.0.1:{}", 9 + i),
                    Duration::from_secs(1),
                )
                .expect("client")
            })
            .collect();
        SpreadTransport::new(endpoints).down_backoff(Duration::from_secs(1), Duration::from_secs(4))
    }

    /// Ends endpoint `index`'s back-off now, as if its time had passed.
    fn back_off_over(spread: &SpreadTransport, index: usize) {
        spread.endpoints[index].lock().down_until = Some(Instant::now());
    }

    fn left(spread: &SpreadTransport, index: usize) -> Duration {
        let until = spread.endpoints[index].health().down_until.expect("down");
        until.saturating_duration_since(Instant::now())
    }

    #[test]
    fn requests_take_turns_over_the_endpoints_that_are_up() {
        let spread = spread(3);
        let firsts: Vec<usize> = (0..6).map(|_| spread.attempt_order()[0]).collect();
        assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
        assert_eq!(spread.attempt_order(), [0, 1, 2]);
    }

    #[test]
    fn a_failed_endpoint_is_tried_last_with_a_growing_backoff_until_it_answers() {
        let spread = spread(3);
        let error = TransportError::Connect("refused".into());
        spread.failed(1, &error);
        for _ in 0..4 {
            assert_eq!(spread.attempt_order().last(), Some(&1));
        }
        assert_eq!(
            spread.endpoints().iter().map(|e| e.up).collect::<Vec<_>>(),
            [true, false, true]
        );
        // Seen again by a request that was in flight: counted once.
        spread.failed(1, &error);
        assert_eq!(spread.endpoints[1].health().failures, 1);
        // Failures in a row double the back-off up to the maximum.
        let mut backoffs = vec![left(&spread, 1)];
        for _ in 0..3 {
            back_off_over(&spread, 1);
            spread.failed(1, &error);
            backoffs.push(left(&spread, 1));
        }
        let seconds: Vec<u64> = backoffs
            .iter()
            .map(|b| b.as_millis().div_ceil(1000) as u64)
            .collect();
        assert_eq!(seconds, [1, 2, 4, 4], "{backoffs:?}");
        // Its first answer ends the back-off and the count.
        spread.answered(1);
        assert!(spread.endpoints().iter().all(|e| e.up && e.failures == 0));
        assert_eq!(spread.attempt_order().len(), 3);
    }

    #[test]
    fn when_every_endpoint_is_down_the_soonest_back_comes_first() {
        let spread = spread(3);
        let error = TransportError::Timeout;
        spread.failed(0, &error);
        back_off_over(&spread, 0);
        spread.failed(0, &error); // 2 s
        spread.failed(2, &error); // 1 s
        spread.failed(1, &error); // 1 s, a moment after 2
        assert!(spread.endpoints().iter().all(|e| !e.up));
        assert_eq!(spread.attempt_order(), [2, 1, 0]);
    }
}
