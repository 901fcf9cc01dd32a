//! Transports: how a signed request reaches a receiver.
//!
//! A [`Transport`] moves exact bytes and reports the status and body it got
//! back; it never interprets them (the dispatcher classifies answers).
//! Implementations: HTTP (`reqwest`, connection reuse), in-process (calls an
//! axum `Router` directly, so the very same receiver code runs), and Unix
//! domain sockets (HTTP/1.1 over a socket file, Linux and macOS).

mod http;
mod in_process;
#[cfg(unix)]
mod unix;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use http::HttpTransport;
pub use in_process::InProcessTransport;
#[cfg(unix)]
pub use unix::UnixSocketTransport;

/// The receiver path for single messages.
pub const RECEIVE_PATH: &str = "/_rf/receive";

/// A request ready to send: headers (signature included) and exact body bytes.
#[derive(Debug, Clone)]
pub struct OutgoingRequest {
    pub path: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// What the receiver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportResponse {
    pub status: u16,
    pub body: Vec<u8>,
    /// `Retry-After` in seconds, when given.
    pub retry_after: Option<Duration>,
}

/// The request did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("no answer within the timeout")]
    Timeout,
    #[error("transport error: {0}")]
    Other(String),
}

/// A boxed future, so transports can live behind `dyn Transport`.
pub type SendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<TransportResponse, TransportError>> + Send + 'a>>;

/// Moves one request to a receiver.
pub trait Transport: Send + Sync + 'static {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_>;
}

/// Parses a `Retry-After` value given in seconds.
pub(crate) fn retry_after(value: Option<&str>) -> Option<Duration> {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}
