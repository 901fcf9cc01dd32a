//! Transports: how a signed request reaches a receiver.
//!
//! A [`Transport`] moves exact bytes and reports the status and body it got
//! back; it never interprets them (the dispatcher classifies answers).
//! Implementations: HTTP (plain `http://` over hyper directly, anything
//! else with `reqwest`; connection reuse either way), in-process (calls an
//! axum `Router` directly, so the very same receiver code runs), Unix
//! domain sockets (HTTP/1.1 over a socket file, Linux and macOS), and a
//! spread over several HTTP base URLs of one destination, with failover
//! ([`SpreadTransport`]). With the cargo feature `grpc`, a gRPC call per
//! request (`GrpcTransport`, `grpc://` destinations). With `nats`,
//! JetStream (`nats://`); with `amqp`, AMQP 1.0 (`AmqpTransport`:
//! `amqp://`, `amqps://` and Azure Service Bus connection strings).

#[cfg(feature = "amqp")]
mod amqp;
mod direct;
#[cfg(feature = "grpc")]
mod grpc;
mod http;
mod in_process;
#[cfg(feature = "nats")]
mod nats;
mod spread;
#[cfg(unix)]
mod unix;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use amqp::AmqpTransport;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub use grpc::GrpcTransport;
pub use http::HttpTransport;
pub use in_process::InProcessTransport;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use nats::{BROKER_ACCEPTED, JetStreamTransport};
pub use spread::{DEFAULT_DOWN_BASE, DEFAULT_DOWN_MAX, EndpointState, SpreadTransport};
#[cfg(unix)]
pub use unix::UnixSocketTransport;

/// A request ready to send: headers (signature included) and exact body bytes.
#[derive(Debug, Clone)]
pub struct OutgoingRequest {
    /// The receiver path, relative to the destination's base URL: the
    /// dispatcher always sends [`RECEIVE_PATH`](crate::receiver::RECEIVE_PATH);
    /// a transport that batches picks the batch path itself.
    pub path: &'static str,
    /// The Standard Webhooks headers (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`); the transport adds its own (content type,
    /// host).
    pub headers: Vec<(&'static str, String)>,
    /// The envelope's JSON text, exactly as signed: send it unchanged, or
    /// the signature no longer matches (401 `bad_signature`).
    pub body: Vec<u8>,
}

/// What the receiver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportResponse {
    /// The HTTP status (or the status a non-HTTP transport maps its answer
    /// to, e.g. 202 for a broker's acknowledgement).
    pub status: u16,
    /// The answer body as received: an acknowledgement, an
    /// [`ErrorBody`](crate::envelope::ErrorBody), or anything a foreign
    /// receiver sent.
    pub body: Vec<u8>,
    /// `Retry-After` in seconds, when given.
    pub retry_after: Option<Duration>,
}

/// The request did not get an answer.
///
/// The dispatcher treats every variant as a destination-level failure:
/// the row is retried until its TTL without counting against
/// `max_retries`, and repeated failures open the destination's circuit.
/// The receiver may still have processed the message (the answer may be
/// what was lost); sending it again is safe, since the receiver's inbox
/// answers a copy as a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// No connection could be made (refused, DNS, TLS handshake, socket
    /// file missing): the request was not sent. The text is the cause.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// No whole answer within the transport's timeout
    /// (`outbox.request_timeout`, 10 s by default): the request may or may
    /// not have been processed.
    #[error("no answer within the timeout")]
    Timeout,
    /// Any other failure: a reset connection, an unreadable answer, a
    /// broken batch answer, a request or TLS setting that could not be
    /// built. Unless the text says it was never built, the request may
    /// have been processed.
    #[error("transport error: {0}")]
    Other(String),
}

/// A boxed future, so transports can live behind `dyn Transport`.
pub type SendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<TransportResponse, TransportError>> + Send + 'a>>;

/// The answers to a batch, one per request, in order.
pub type BatchFuture<'a> =
    Pin<Box<dyn Future<Output = Vec<Result<TransportResponse, TransportError>>> + Send + 'a>>;

/// A destination or broker URL (or connection string) that cannot be used:
/// what is wrong with it, never a credential it holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct UrlError {
    reason: String,
}

impl UrlError {
    /// What is wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl From<String> for UrlError {
    fn from(reason: String) -> Self {
        Self { reason }
    }
}

impl From<&str> for UrlError {
    fn from(reason: &str) -> Self {
        Self {
            reason: reason.to_owned(),
        }
    }
}

/// Moves requests to a receiver.
pub trait Transport: Send + Sync + 'static {
    /// Sends one request and returns what the receiver answered, whatever
    /// its status: `Ok` for any answer (the dispatcher classifies it), `Err`
    /// only when there was none. Never resend a request that got an
    /// answer: retries are the dispatcher's decision (backoff, leases,
    /// counting); only an unanswered request may go to another base URL
    /// ([`SpreadTransport`]). Called concurrently from the dispatcher's
    /// runtime.
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_>;

    /// Sends several requests to the same receiver. The default sends them
    /// one by one; transports that can reach `/_rf/receive/batch` send one
    /// request and split its per-message answers.
    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(self.send(request).await);
            }
            answers
        })
    }
}

/// Splits a batch answer into per-message answers. Anything but a 200 with
/// one result per item fails every item alike (retryable).
pub(crate) fn split_batch_answer(
    count: usize,
    answer: Result<TransportResponse, TransportError>,
) -> Vec<Result<TransportResponse, TransportError>> {
    let all = |error: TransportError| (0..count).map(|_| Err(error.clone())).collect();
    let response = match answer {
        Ok(response) => response,
        Err(error) => return all(error),
    };
    if response.status != 200 {
        return all(TransportError::Other(format!(
            "batch answered {}",
            response.status
        )));
    }
    match serde_json::from_slice::<Vec<crate::envelope::BatchResult>>(&response.body) {
        Ok(results) if results.len() == count => results
            .into_iter()
            .map(|result| {
                Ok(TransportResponse {
                    status: result.status,
                    body: serde_json::to_vec(&result.body).unwrap_or_default(),
                    retry_after: None,
                })
            })
            .collect(),
        _ => all(TransportError::Other("malformed batch answer".to_owned())),
    }
}

/// The JSON body of a batch request: one `{headers, body}` item per request.
pub(crate) fn batch_body(requests: &[OutgoingRequest]) -> Vec<u8> {
    let items: Vec<crate::envelope::BatchItem> = requests
        .iter()
        .map(|request| crate::envelope::BatchItem {
            headers: request
                .headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect(),
            body: String::from_utf8_lossy(&request.body).into_owned(),
        })
        .collect();
    serde_json::to_vec(&items).unwrap_or_default()
}

/// A hyper client's answer, read whole: its status, `Retry-After` and body.
pub(crate) async fn read_answer(
    response: hyper::Response<hyper::body::Incoming>,
) -> Result<TransportResponse, hyper::Error> {
    use http_body_util::BodyExt as _;
    let status = response.status().as_u16();
    let retry_after = retry_after(response.headers());
    let body = response.into_body().collect().await?.to_bytes();
    Ok(TransportResponse {
        status,
        body: body.to_vec(),
        retry_after,
    })
}

/// An HTTP answer's `Retry-After`, when it gives a number of seconds.
pub(crate) fn retry_after(headers: &hyper::HeaderMap) -> Option<Duration> {
    headers
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Why a destination URL with a scheme no transport serves is refused. It
/// names the scheme, never the rest of the URL (it may hold credentials):
/// text without a well-formed `scheme://` is said to have none.
fn unserved_scheme(url: &str) -> String {
    const SERVED: &str = "http://, https://, unix://, grpc://, nats://, amqp:// or amqps://";
    let scheme = url
        .split_once("://")
        .map(|(scheme, _)| scheme)
        .filter(|scheme| {
            let mut chars = scheme.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
    match scheme {
        Some(scheme) => {
            format!("`url` has the scheme `{scheme}`, which no transport serves: use {SERVED}")
        }
        None => format!("`url` has no `scheme://`: use {SERVED}"),
    }
}

/// The transport of a configured destination: a [`UnixSocketTransport`] for
/// a `unix://` URL, a `GrpcTransport` for a `grpc://` one (cargo feature
/// `grpc`), a `JetStreamTransport` for a `nats://` one (cargo feature
/// `nats`), an `AmqpTransport` for an `amqp://` or `amqps://` URL or a
/// Service Bus connection string (cargo feature `amqp`), an [`HttpTransport`] for one `http(s)://` URL (trusting its
/// `ca_file`, if named), a [`SpreadTransport`] over several. Errors name
/// what is wrong, never a URL (it may hold credentials).
pub(crate) fn for_destination(
    destination: &crate::config::DestinationConfig,
    timeout: Duration,
) -> Result<Arc<dyn Transport>, UrlError> {
    if destination.url.starts_with("nats://") {
        return nats_transport(destination, timeout);
    }
    if is_amqp_url(&destination.url) {
        return amqp_transport(destination, timeout);
    }
    if destination.urls.is_empty() {
        if let Some(path) = destination.url.strip_prefix("unix://") {
            return unix_transport(path, timeout);
        }
        if destination.url.starts_with("grpc://") {
            return grpc_transport(&destination.url, timeout);
        }
        if destination.url.starts_with("inproc://") {
            return Err(
                "`url` is inproc://: an in-process receiver is routed in code, \
                 `DispatcherBuilder::route(name, InProcessTransport::new(receiver.router()), \
                 secret)`, not by URL"
                    .to_owned()
                    .into(),
            );
        }
        if !(destination.url.starts_with("http://") || destination.url.starts_with("https://")) {
            return Err(unserved_scheme(&destination.url).into());
        }
        return Ok(Arc::new(http_transport(
            destination,
            &destination.url,
            timeout,
        )?));
    }
    let mut endpoints = Vec::with_capacity(destination.urls.len() + 1);
    for (position, url) in destination.base_urls().enumerate() {
        let shown = if position == 0 {
            "`url`".to_owned()
        } else {
            format!("`urls[{}]`", position - 1)
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{shown} is not an http:// or https:// URL: a destination with several \
                 base URLs spreads over HTTP(S) only (unix:// and other schemes take one `url`)"
            )
            .into());
        }
        let normal = url.trim_end_matches('/');
        if destination
            .base_urls()
            .take(position)
            .any(|earlier| earlier.trim_end_matches('/') == normal)
        {
            return Err(format!("{shown} repeats an earlier base URL").into());
        }
        endpoints.push(http_transport(destination, url, timeout)?);
    }
    Ok(Arc::new(SpreadTransport::new(endpoints)))
}

/// The HTTP(S) transport to `url`, trusting the destination's `ca_file` if
/// it names one.
fn http_transport(
    destination: &crate::config::DestinationConfig,
    url: &str,
    timeout: Duration,
) -> Result<HttpTransport, UrlError> {
    let Some(ca_file) = &destination.ca_file else {
        return HttpTransport::new(url, timeout).map_err(|e| UrlError::from(e.to_string()));
    };
    let pem = std::fs::read(ca_file)
        .map_err(|e| format!("cannot read CA file {}: {e}", ca_file.display()))?;
    with_root_certificates(url, timeout, &pem)
}

#[cfg(feature = "tls")]
fn with_root_certificates(
    url: &str,
    timeout: Duration,
    pem: &[u8],
) -> Result<HttpTransport, UrlError> {
    HttpTransport::with_root_certificates(url, timeout, pem)
        .map_err(|e| UrlError::from(e.to_string()))
}

#[cfg(not(feature = "tls"))]
fn with_root_certificates(_: &str, _: Duration, _: &[u8]) -> Result<HttpTransport, UrlError> {
    Err(
        "`ca_file` needs HTTPS: build rfidl-runtime with its `tls` feature"
            .to_owned()
            .into(),
    )
}

/// A `nats://` destination: one URL, no `urls`, no `ca_file`.
#[cfg(feature = "nats")]
fn nats_transport(
    destination: &crate::config::DestinationConfig,
    timeout: Duration,
) -> Result<Arc<dyn Transport>, UrlError> {
    if !destination.urls.is_empty() {
        return Err(
            "`urls`: a nats:// destination takes one `url` (the broker spreads)"
                .to_owned()
                .into(),
        );
    }
    let url = crate::nats::NatsUrl::parse(&destination.url)
        .map_err(|message| format!("`url`: {message}"))?;
    let replicas = destination.replicas.unwrap_or(1);
    if !(1..=crate::nats::MAX_REPLICAS).contains(&replicas) {
        return Err(format!("`replicas` must be 1 to {}", crate::nats::MAX_REPLICAS).into());
    }
    let url = url.with_default_replicas(replicas);
    Ok(Arc::new(JetStreamTransport::with_url(url, timeout)))
}

#[cfg(not(feature = "nats"))]
fn nats_transport(
    _: &crate::config::DestinationConfig,
    _: Duration,
) -> Result<Arc<dyn Transport>, UrlError> {
    Err(
        "`url`: nats:// destinations need rfidl-runtime's cargo feature `nats`"
            .to_owned()
            .into(),
    )
}

/// An AMQP location: `amqp://`, `amqps://`, or a connection string
/// (`Endpoint=sb://…`), told apart without the `amqp` feature too, so the
/// error says which feature is missing.
pub(crate) fn is_amqp_url(url: &str) -> bool {
    let url = url.trim_start();
    url.starts_with("amqp://")
        || url.starts_with("amqps://")
        || url
            .get(..9)
            .is_some_and(|head| head.eq_ignore_ascii_case("endpoint="))
}

/// An AMQP destination: one URL (or connection string), no `urls`, no
/// `ca_file`.
#[cfg(feature = "amqp")]
fn amqp_transport(
    destination: &crate::config::DestinationConfig,
    timeout: Duration,
) -> Result<Arc<dyn Transport>, UrlError> {
    if !destination.urls.is_empty() {
        return Err(
            "`urls`: an AMQP destination takes one `url` (the broker spreads)"
                .to_owned()
                .into(),
        );
    }
    if destination.ca_file.is_some() {
        return Err(
            "`ca_file`: an amqps:// destination trusts the public CA roots only"
                .to_owned()
                .into(),
        );
    }
    let url = crate::amqp::AmqpUrl::parse(&destination.url)
        .map_err(|message| format!("`url`: {message}"))?;
    Ok(Arc::new(AmqpTransport::with_url(url, timeout)))
}

#[cfg(not(feature = "amqp"))]
fn amqp_transport(
    _: &crate::config::DestinationConfig,
    _: Duration,
) -> Result<Arc<dyn Transport>, UrlError> {
    Err(
        "`url`: amqp:// destinations and Service Bus connection strings need \
         rfidl-runtime's cargo feature `amqp`"
            .to_owned()
            .into(),
    )
}

#[cfg(feature = "grpc")]
fn grpc_transport(url: &str, timeout: Duration) -> Result<Arc<dyn Transport>, UrlError> {
    GrpcTransport::new(url, timeout)
        .map(|transport| Arc::new(transport) as Arc<dyn Transport>)
        .map_err(|what| UrlError::from(format!("`url` {what}")))
}

#[cfg(not(feature = "grpc"))]
fn grpc_transport(_: &str, _: Duration) -> Result<Arc<dyn Transport>, UrlError> {
    Err(
        "`url` is a grpc:// URL: build rfidl-runtime with its `grpc` feature"
            .to_owned()
            .into(),
    )
}

#[cfg(unix)]
fn unix_transport(path: &str, timeout: Duration) -> Result<Arc<dyn Transport>, UrlError> {
    Ok(Arc::new(UnixSocketTransport::new(path, timeout)))
}

#[cfg(not(unix))]
fn unix_transport(_: &str, _: Duration) -> Result<Arc<dyn Transport>, UrlError> {
    Err("unix:// destinations exist only on unix".to_owned().into())
}

/// A shared transport: route a clone and keep a handle, e.g. to read
/// [`SpreadTransport::endpoints`] for diagnostics.
impl<T: Transport + ?Sized> Transport for Arc<T> {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        (**self).send(request)
    }

    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        (**self).send_batch(requests)
    }
}
