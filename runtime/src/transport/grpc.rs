//! gRPC (cargo feature `grpc`): each request is one unary call
//! `rfidl.RFReceiver/Receive` ([`crate::grpc`]), each batch one call
//! `ReceiveBatch`, on one HTTP/2 channel, connected on first use and
//! reused. The reply's status, body and `Retry-After` become the
//! [`TransportResponse`], so the dispatcher classifies it with the same
//! table as HTTP; a call that got no reply is a [`TransportError`].

use crate::transport::UrlError;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    BatchFuture, OutgoingRequest, SendFuture, Transport, TransportError, TransportResponse,
    batch_body, split_batch_answer,
};
use crate::grpc::{RECEIVE_BATCH_METHOD_PATH, RECEIVE_METHOD_PATH, ReceiveReply, ReceiveRequest};

/// Calls `rfidl.RFReceiver/Receive` at `grpc://host:port`.
#[derive(Debug, Clone)]
pub struct GrpcTransport {
    channel: Channel,
    timeout: Duration,
    authority: String,
    /// Set once the receiver answered `ReceiveBatch` with `UNIMPLEMENTED`
    /// (a receiver of another make with `Receive` only): batches go as
    /// concurrent `Receive` calls from then on.
    no_batches: Arc<AtomicBool>,
}

impl GrpcTransport {
    /// A transport to `url`: `grpc://host:port`, optionally followed by the
    /// method's path `/RFReceiver/Receive` (as in the messaging spec's
    /// transport table) or `/rfidl.RFReceiver/Receive`. Plain HTTP/2, no TLS.
    /// `timeout` bounds each call; the connection is made on the first call
    /// (within `timeout`, at most 5 s). The error names what is wrong, never
    /// the URL (it may hold credentials).
    pub fn new(url: &str, timeout: Duration) -> Result<Self, UrlError> {
        let authority = parse_url(url)?;
        let endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|_| "is not a valid grpc://host:port URL".to_owned())?
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .tcp_nodelay(true);
        Ok(Self {
            channel: endpoint.connect_lazy(),
            timeout,
            authority,
            no_batches: Default::default(),
        })
    }

    /// `host:port` calls go to.
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

/// The `host:port` of a `grpc://` URL, or what is wrong with it (without
/// repeating the URL).
fn parse_url(url: &str) -> Result<String, UrlError> {
    let Some(rest) = url.strip_prefix("grpc://") else {
        return Err("is not a grpc:// URL".to_owned().into());
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(
            "holds credentials (user:password@): grpc:// destinations take none; the message \
             signature authenticates the sender"
                .to_owned()
                .into(),
        );
    }
    if !matches!(
        path,
        "" | "/" | "/RFReceiver/Receive" | "/rfidl.RFReceiver/Receive"
    ) {
        return Err(
            "has a path other than /RFReceiver/Receive (expected grpc://host:port or \
             grpc://host:port/RFReceiver/Receive)"
                .to_owned()
                .into(),
        );
    }
    let parsed: axum::http::uri::Authority = authority
        .parse()
        .map_err(|_| "has an invalid host:port (expected grpc://host:port)".to_owned())?;
    if parsed.host().is_empty() {
        return Err("has no host (expected grpc://host:port)".to_owned().into());
    }
    // `Authority` has no port for `host:abc`; a colon after the host (past
    // an IPv6 literal's `]`) says one was meant.
    let port_given = authority[authority.rfind(']').unwrap_or(0)..].contains(':');
    match (port_given, parsed.port_u16()) {
        (false, _) => Err("has no port (expected grpc://host:port)".to_owned().into()),
        (true, None) => Err("has an invalid port (expected grpc://host:port)"
            .to_owned()
            .into()),
        (true, Some(0)) => Err("has port 0 (expected grpc://host:port)".to_owned().into()),
        (true, Some(_)) => Ok(parsed.as_str().to_owned()),
    }
}

/// Why a call got no reply.
enum CallError {
    /// The server answered the call with a gRPC error.
    Status(tonic::Status),
    /// No connection, or no reply within the timeout.
    Transport(TransportError),
}

impl From<CallError> for TransportError {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Status(status) => status_error(status),
            CallError::Transport(error) => error,
        }
    }
}

/// One call of the method at `path` on `channel`, bounded by `timeout`.
async fn exchange(
    channel: Channel,
    timeout: Duration,
    path: &'static str,
    message: ReceiveRequest,
) -> Result<TransportResponse, CallError> {
    // Replies as large as the receiver sends, as over HTTP (tonic's default
    // would fail a handler's answer over 4 MiB after it took effect).
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX);
    let exchange = async {
        client.ready().await.map_err(|e| {
            CallError::Transport(TransportError::Connect(crate::chain::with_causes(&e)))
        })?;
        client
            .unary::<ReceiveRequest, ReceiveReply, _>(
                tonic::Request::new(message),
                axum::http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .map_err(CallError::Status)
    };
    let reply = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CallError::Transport(TransportError::Timeout))??
        .into_inner();
    Ok(TransportResponse {
        status: u16::try_from(reply.status).unwrap_or(0),
        body: reply.body,
        retry_after: reply
            .retry_after_seconds
            .map(|secs| Duration::from_secs(u64::from(secs))),
    })
}

/// One message as one `Receive` call.
async fn call(
    channel: Channel,
    timeout: Duration,
    request: OutgoingRequest,
) -> Result<TransportResponse, TransportError> {
    let message = ReceiveRequest {
        headers: request
            .headers
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        body: request.body,
    };
    Ok(exchange(channel, timeout, RECEIVE_METHOD_PATH, message).await?)
}

/// A gRPC error: the call got no answer from the receiver.
fn status_error(status: tonic::Status) -> TransportError {
    let text = match std::error::Error::source(&status) {
        Some(source) => format!(
            "{:?}: {} ({})",
            status.code(),
            status.message(),
            crate::chain::with_causes(source)
        ),
        None => format!("{:?}: {}", status.code(), status.message()),
    };
    match status.code() {
        tonic::Code::Unavailable => TransportError::Connect(text),
        tonic::Code::DeadlineExceeded => TransportError::Timeout,
        _ => TransportError::Other(text),
    }
}

impl Transport for GrpcTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(call(self.channel.clone(), self.timeout, request))
    }

    /// One `ReceiveBatch` call with the HTTP batch's JSON, split as over
    /// HTTP. A receiver without `ReceiveBatch` gets concurrent `Receive`
    /// calls instead (remembered).
    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        Box::pin(async move {
            if !self.no_batches.load(Ordering::Relaxed) {
                let batch = ReceiveRequest {
                    headers: Default::default(),
                    body: batch_body(&requests),
                };
                match exchange(
                    self.channel.clone(),
                    self.timeout,
                    RECEIVE_BATCH_METHOD_PATH,
                    batch,
                )
                .await
                {
                    Err(CallError::Status(status))
                        if status.code() == tonic::Code::Unimplemented =>
                    {
                        tracing::info!(
                            authority = %self.authority,
                            "receiver has no ReceiveBatch; sending one call per message"
                        );
                        self.no_batches.store(true, Ordering::Relaxed);
                    }
                    answer => {
                        return split_batch_answer(requests.len(), answer.map_err(Into::into));
                    }
                }
            }
            self.send_each(requests).await
        })
    }
}

impl GrpcTransport {
    /// The calls of a batch at once, multiplexed on the channel (the
    /// receiver group-commits them as it does HTTP requests that arrive
    /// together); the answers in request order. Dropping the future cancels
    /// the calls still running.
    async fn send_each(
        &self,
        requests: Vec<OutgoingRequest>,
    ) -> Vec<Result<TransportResponse, TransportError>> {
        let count = requests.len();
        let mut calls = tokio::task::JoinSet::new();
        for (position, request) in requests.into_iter().enumerate() {
            let (channel, timeout) = (self.channel.clone(), self.timeout);
            calls.spawn(async move { (position, call(channel, timeout, request).await) });
        }
        let mut answers: Vec<Option<Result<TransportResponse, TransportError>>> =
            (0..count).map(|_| None).collect();
        while let Some(joined) = calls.join_next().await {
            if let Ok((position, answer)) = joined {
                answers[position] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(TransportError::Other("the call's task failed".to_owned()))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("grpc://127.0.0.1:7443").unwrap(),
            "127.0.0.1:7443"
        );
        assert_eq!(parse_url("grpc://hr:7443/").unwrap(), "hr:7443");
        assert_eq!(
            parse_url("grpc://hr.internal:7443/RFReceiver/Receive").unwrap(),
            "hr.internal:7443"
        );
        assert_eq!(
            parse_url("grpc://[::1]:7443/rfidl.RFReceiver/Receive").unwrap(),
            "[::1]:7443"
        );
        for (url, wanted) in [
            ("http://hr:7443", "is not a grpc:// URL"),
            ("grpc://hr", "has no port"),
            ("grpc://hr:0", "has port 0"),
            ("grpc://:7443", "has no host"),
            ("grpc://", "invalid host:port"),
            ("grpc://hr:notaport", "has an invalid port"),
            ("grpc://hr:70000", "has an invalid port"),
            ("grpc://hr:7443/other", "has a path other than"),
            ("grpc://hr:7443?x=1", "has a path other than"),
            ("grpc://admin:hunter2@hr:7443", "holds credentials"),
        ] {
            let error = parse_url(url).unwrap_err().to_string();
            assert!(error.contains(wanted), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
