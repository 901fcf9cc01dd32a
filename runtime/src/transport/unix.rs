//! HTTP/1.1 over a Unix domain socket (`unix:///run/rfidl/engine.sock`), for
//! peers on the same machine. A fresh connection per request keeps it simple;
//! a socket connect costs microseconds.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::Full;
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::{OutgoingRequest, SendFuture, Transport, TransportError, read_answer};

/// HTTP/1.1 over a Unix domain socket: a `unix:///path/to.sock`
/// destination, for a receiver on the same machine served on a socket
/// file. One connection per request.
#[derive(Debug, Clone)]
pub struct UnixSocketTransport {
    path: PathBuf,
    timeout: Duration,
}

impl UnixSocketTransport {
    /// Sends to the socket file at `path`; a request without a whole
    /// answer within `timeout` (connect included) fails with
    /// [`TransportError::Timeout`]. A missing socket file or a refused
    /// connection is [`TransportError::Connect`].
    pub fn new(path: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            path: path.into(),
            timeout,
        }
    }
}

impl Transport for UnixSocketTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let exchange = async {
                let stream = tokio::net::UnixStream::connect(&self.path)
                    .await
                    .map_err(|e| {
                        TransportError::Connect(format!("{}: {e}", self.path.display()))
                    })?;
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .map_err(|e| TransportError::Connect(e.to_string()))?;
                let driver = tokio::spawn(connection);
                let mut builder = Request::post(request.path)
                    .header("host", "localhost")
                    .header("content-type", "application/json");
                for (name, value) in request.headers {
                    builder = builder.header(name, value);
                }
                let http_request = builder
                    .body(Full::new(Bytes::from(request.body)))
                    .map_err(|e| TransportError::Other(e.to_string()))?;
                let response = sender
                    .send_request(http_request)
                    .await
                    .map_err(|e| TransportError::Other(e.to_string()))?;
                let answer = read_answer(response)
                    .await
                    .map_err(|e| TransportError::Other(e.to_string()))?;
                driver.abort();
                Ok(answer)
            };
            tokio::time::timeout(self.timeout, exchange)
                .await
                .map_err(|_| TransportError::Timeout)?
        })
    }
}
