//! Plain `http://` with no proxy: HTTP/1.1 over kept-alive TCP connections,
//! driven by hyper's connection API with a small pool of our own.
//!
//! [`HttpTransport`](super::HttpTransport) uses this for every `http://`
//! base URL without credentials when the environment names no HTTP proxy;
//! everything else (HTTPS, a proxy, credentials in the URL) goes through
//! `reqwest`, which handles them. The two speak the same HTTP; this one has
//! less between the dispatcher and the socket; how much sooner a request
//! reaches the receiver's handler this way is measured in BENCHMARKS.md
//! ("Commit -> effect").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::{OutgoingRequest, TransportError, TransportResponse, read_answer};

/// The most idle connections kept (the dispatcher's default `max_in_flight`).
const MAX_IDLE: usize = 64;

/// The environment variables through which `reqwest` finds an HTTP proxy.
const PROXY_VARIABLES: [&str; 4] = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"];

/// Whether `variable` (the environment, in production) names an HTTP proxy
/// that `reqwest` would use for `http://` URLs.
pub(super) fn proxy_configured(variable: impl Fn(&str) -> Option<String>) -> bool {
    PROXY_VARIABLES
        .iter()
        .any(|name| variable(name).is_some_and(|value| !value.trim().is_empty()))
}

/// A plain HTTP destination: where to connect, the path prefix of its base
/// URL, and its idle connections.
#[derive(Debug)]
pub(super) struct Direct {
    /// `host:port` to connect to; also the `Host` header.
    authority: String,
    /// The base URL's path, without a trailing `/` (usually empty).
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Direct {
    /// For `base_url` if it is plain `http://host[:port][/path]` with no
    /// credentials, query or fragment; `None` otherwise.
    pub(super) fn for_url(
        base_url: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Option<Arc<Self>> {
        let uri: hyper::Uri = base_url.parse().ok()?;
        if uri.scheme_str() != Some("http") || uri.query().is_some() || base_url.contains('#') {
            return None;
        }
        let authority = uri.authority()?;
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return None;
        }
        let port = authority.port_u16().unwrap_or(80);
        Some(Arc::new(Self {
            authority: format!("{}:{port}", authority.host()),
            prefix: uri.path().trim_end_matches('/').to_owned(),
            timeout,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }))
    }

    /// One request and its whole answer, within the timeout.
    pub(super) async fn send(
        &self,
        request: OutgoingRequest,
    ) -> Result<TransportResponse, TransportError> {
        tokio::time::timeout(self.timeout, self.exchange(request))
            .await
            .unwrap_or(Err(TransportError::Timeout))
    }

    async fn exchange(
        &self,
        request: OutgoingRequest,
    ) -> Result<TransportResponse, TransportError> {
        let mut message = self.http_request(request)?;
        loop {
            // An idle connection may have been closed by the receiver since
            // its last answer; hyper then hands the request back unsent, and
            // it goes on the next connection (at worst a new one).
            let (mut sender, reused) = match self.take_idle() {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            if sender.ready().await.is_err() {
                if reused {
                    continue;
                }
                return Err(TransportError::Connect(format!(
                    "{}: the connection closed before the request was sent",
                    self.authority
                )));
            }
            match sender.try_send_request(message).await {
                Ok(response) => {
                    let answer = read_answer(response)
                        .await
                        .map_err(|e| self.failed("reading the answer", &e))?;
                    self.give_back(sender);
                    return Ok(answer);
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => message = unsent,
                    _ => return Err(self.failed("sending", &error.into_error())),
                },
            }
        }
    }

    fn http_request(
        &self,
        request: OutgoingRequest,
    ) -> Result<hyper::Request<Full<Bytes>>, TransportError> {
        let mut builder = hyper::Request::post(format!("{}{}", self.prefix, request.path))
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (name, value) in request.headers {
            builder = builder.header(name, value);
        }
        builder
            .body(Full::new(Bytes::from(request.body)))
            .map_err(|e| TransportError::Other(format!("cannot build the request: {e}")))
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }

    /// A new connection, its reading and writing driven by a task of its
    /// own until either side closes it.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, TransportError> {
        let stream = tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| TransportError::Timeout)?
        .map_err(|e| TransportError::Connect(format!("{}: {e}", self.authority)))?;
        stream
            .set_nodelay(true)
            .map_err(|e| TransportError::Connect(format!("{}: {e}", self.authority)))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| TransportError::Connect(format!("{}: {e}", self.authority)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended");
            }
        });
        Ok(sender)
    }

    fn failed(&self, what: &str, error: &hyper::Error) -> TransportError {
        TransportError::Other(format!(
            "{what} http://{}: {}",
            self.authority,
            crate::chain::with_causes(error)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_without_credentials_goes_direct() {
        let direct =
            |url: &str| Direct::for_url(url, Duration::from_secs(1), Duration::from_secs(1));
        let at = direct("http://127.0.0.1:8080").expect("plain");
        assert_eq!(
            (at.authority.as_str(), at.prefix.as_str()),
            ("127.0.0.1:8080", "")
        );
        let at = direct("http://hr.internal/base/").expect("default port, a prefix");
        assert_eq!(
            (at.authority.as_str(), at.prefix.as_str()),
            ("hr.internal:80", "/base")
        );
        for url in [
            "https://hr.internal",
            "http://user:secret@hr.internal",
            "http://hr.internal/?a=b",
            "http://hr.internal/#x",
            "unix:///run/rfidl.sock",
            "not a url",
        ] {
            assert!(direct(url).is_none(), "{url}");
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Server {
        /// Answers every request on a connection, keeping it open.
        KeepsAlive,
        /// Answers a connection's first request, then closes it without
        /// saying so (no `Connection: close`), as a receiver whose idle
        /// timeout ran out would.
        Closes,
        /// Reads a request and never answers.
        Silent,
    }

    /// A server on loopback that answers 200 with the connection's number.
    async fn server(kind: Server) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut socket, _)) = listener.accept().await {
                n += 1;
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    loop {
                        // Each request is headers and the 2-byte body `{}`.
                        let mut read = Vec::new();
                        while !read.ends_with(b"\r\n\r\n{}") {
                            match socket.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => read.extend_from_slice(&buffer[..k]),
                            }
                        }
                        if kind == Server::Silent {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            return;
                        }
                        let body = n.to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nretry-after: 7\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(answer.as_bytes()).await;
                        if kind == Server::Closes {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{address}")
    }

    fn request() -> OutgoingRequest {
        OutgoingRequest {
            path: crate::receiver::RECEIVE_PATH,
            headers: vec![("webhook-id", "m".to_owned())],
            body: b"{}".to_vec(),
        }
    }

    #[tokio::test]
    async fn requests_share_one_kept_alive_connection() {
        let url = server(Server::KeepsAlive).await;
        let direct = Direct::for_url(&url, Duration::from_secs(5), Duration::from_secs(5))
            .expect("plain http");
        for _ in 0..5 {
            let answer = direct.send(request()).await.expect("answered");
            assert_eq!((answer.status, answer.body), (200, b"1".to_vec()));
            assert_eq!(answer.retry_after, Some(Duration::from_secs(7)));
        }
    }

    #[tokio::test]
    async fn a_connection_the_receiver_closed_is_replaced_not_reported() {
        let url = server(Server::Closes).await;
        let direct = Direct::for_url(&url, Duration::from_secs(5), Duration::from_secs(5))
            .expect("plain http");
        for expected in 1..=5 {
            let answer = direct.send(request()).await.expect("answered");
            assert_eq!(answer.status, 200);
            // Each answer came on a new connection: the closed one was not reused.
            assert_eq!(answer.body, expected.to_string().into_bytes());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn no_answer_is_a_timeout_and_no_listener_a_connect_error() {
        let url = server(Server::Silent).await;
        let direct = Direct::for_url(&url, Duration::from_millis(300), Duration::from_secs(1))
            .expect("plain http");
        assert_eq!(direct.send(request()).await, Err(TransportError::Timeout));

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", closed.local_addr().expect("address"));
        drop(closed);
        let direct = Direct::for_url(&url, Duration::from_secs(1), Duration::from_secs(1))
            .expect("plain http");
        match direct.send(request()).await {
            Err(TransportError::Connect(why)) => assert!(why.contains("refused"), "{why}"),
            other => panic!("expected a connect error, got {other:?}"),
        }
    }

    #[test]
    fn a_proxy_in_the_environment_keeps_reqwest() {
        let with = |name: &'static str, value: &'static str| {
            move |asked: &str| (asked == name).then(|| value.to_owned())
        };
        assert!(!proxy_configured(|_| None));
        assert!(proxy_configured(with("HTTP_PROXY", "http://proxy:3128")));
        assert!(proxy_configured(with("http_proxy", "http://proxy:3128")));
        assert!(proxy_configured(with("ALL_PROXY", "socks5://proxy")));
        assert!(!proxy_configured(with("HTTP_PROXY", " ")));
        assert!(!proxy_configured(with("HTTPS_PROXY", "http://proxy:3128")));
    }
}
