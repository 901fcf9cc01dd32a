//! HTTP: plain `http://` directly over hyper ([`super::direct`]), everything
//! else with `reqwest`; one client per transport, so connections are reused.

use std::sync::Arc;
use std::time::Duration;

use super::direct::{self, Direct};
use super::{
    BatchFuture, OutgoingRequest, SendFuture, Transport, TransportError, TransportResponse,
    batch_body, retry_after, split_batch_answer,
};

/// Sends to `{base_url}{path}`.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: Client,
    /// Set once the receiver answered the batch path with 404/405: it is
    /// not an rfidl receiver with batches, so send one by one from then on.
    no_batches: std::sync::Arc<std::sync::atomic::AtomicBool>,
    base_url: String,
}

impl HttpTransport {
    /// `base_url` like `http://127.0.0.1:8080` or `https://hr.internal`
    /// (no trailing `/_rf/receive`). HTTPS trusts the public web roots
    /// (cargo feature `tls`, on by default). `http://` goes through an HTTP
    /// proxy named by `http_proxy` or `all_proxy` (either case) when one
    /// is set.
    pub fn new(base_url: impl Into<String>, timeout: Duration) -> Result<Self, TransportError> {
        let base_url = base_url.into();
        let proxied = direct::proxy_configured(|name| std::env::var(name).ok());
        match Direct::for_url(&base_url, timeout, connect_timeout(timeout)) {
            Some(direct) if !proxied => Ok(Self {
                client: Client::Direct(direct),
                no_batches: Default::default(),
                base_url: base_url.trim_end_matches('/').to_owned(),
            }),
            _ => Self::from_builder(base_url, Self::client_builder(timeout)),
        }
    }

    /// Like [`new`](Self::new), also trusting the CA certificates in `pem`
    /// (one or more `-----BEGIN CERTIFICATE-----` blocks): an internal CA,
    /// or a peer's self-signed certificate.
    #[cfg(feature = "tls")]
    pub fn with_root_certificates(
        base_url: impl Into<String>,
        timeout: Duration,
        pem: &[u8],
    ) -> Result<Self, TransportError> {
        let certificates = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| TransportError::Other(format!("invalid CA certificate PEM: {e}")))?;
        if certificates.is_empty() {
            return Err(TransportError::Other(
                "the CA file holds no certificate".to_owned(),
            ));
        }
        let builder = certificates
            .into_iter()
            .fold(Self::client_builder(timeout), |builder, certificate| {
                builder.add_root_certificate(certificate)
            });
        Self::from_builder(base_url, builder)
    }

    fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout(timeout))
            .pool_max_idle_per_host(64)
    }

    fn from_builder(
        base_url: impl Into<String>,
        builder: reqwest::ClientBuilder,
    ) -> Result<Self, TransportError> {
        let client = builder
            .build()
            .map_err(|e| TransportError::Other(e.to_string()))?;
        Ok(Self {
            client: Client::Reqwest(client),
            no_batches: Default::default(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
        })
    }
}

/// How requests leave: see the module's documentation.
#[derive(Debug, Clone)]
enum Client {
    Direct(Arc<Direct>),
    Reqwest(reqwest::Client),
}

/// The longest a connection may take: the request's timeout, at most 5 s.
fn connect_timeout(timeout: Duration) -> Duration {
    timeout.min(Duration::from_secs(5))
}

impl Transport for HttpTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let client = match &self.client {
                Client::Direct(direct) => return direct.send(request).await,
                Client::Reqwest(client) => client,
            };
            let mut builder = client
                .post(format!("{}{}", self.base_url, request.path))
                .header(reqwest::header::CONTENT_TYPE, "application/json");
            for (name, value) in request.headers {
                builder = builder.header(name, value);
            }
            let response = builder.body(request.body).send().await.map_err(|e| {
                if e.is_timeout() {
                    TransportError::Timeout
                } else if e.is_connect() {
                    TransportError::Connect(with_causes(&e))
                } else {
                    TransportError::Other(with_causes(&e))
                }
            })?;
            let status = response.status().as_u16();
            let retry_after = retry_after(response.headers());
            let body = response.bytes().await.map_err(|e| {
                if e.is_timeout() {
                    TransportError::Timeout
                } else {
                    TransportError::Other(with_causes(&e))
                }
            })?;
            Ok(TransportResponse {
                status,
                body: body.to_vec(),
                retry_after,
            })
        })
    }

    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        Box::pin(async move {
            match self.send_whole_batch(&requests).await {
                Some(Ok(answers)) => answers,
                Some(Err(error)) => split_batch_answer(requests.len(), Err(error)),
                None => {
                    let mut answers = Vec::with_capacity(requests.len());
                    for request in requests {
                        answers.push(self.send(request).await);
                    }
                    answers
                }
            }
        })
    }
}

impl HttpTransport {
    /// The base URL requests go to (no trailing `/`).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// One request to `/_rf/receive/batch`: `Err` when it got no answer (the
    /// endpoint failed, not the messages), the per-message answers when it
    /// did, and `None` when this receiver has no batch endpoint (remembered:
    /// send one by one from then on).
    pub(crate) async fn send_whole_batch(
        &self,
        requests: &[OutgoingRequest],
    ) -> Option<Result<Vec<Result<TransportResponse, TransportError>>, TransportError>> {
        use std::sync::atomic::Ordering;
        if self.no_batches.load(Ordering::Relaxed) {
            return None;
        }
        let batch = OutgoingRequest {
            path: crate::receiver::RECEIVE_BATCH_PATH,
            headers: Vec::new(),
            body: batch_body(requests),
        };
        match self.send(batch).await {
            Ok(answer) if answer.status == 404 || answer.status == 405 => {
                tracing::info!(url = %self.base_url, "receiver has no batch endpoint; sending one by one");
                self.no_batches.store(true, Ordering::Relaxed);
                None
            }
            Ok(answer) => Some(Ok(split_batch_answer(requests.len(), Ok(answer)))),
            Err(error) => Some(Err(error)),
        }
    }
}

/// reqwest's own message names only the URL; the reason (connection
/// refused, an untrusted certificate) is in its sources, and it is what an
/// operator reading `last_error` needs.
fn with_causes(error: &reqwest::Error) -> String {
    crate::chain::with_causes(error)
}
