//! HTTP with `reqwest`: one client per transport, so connections are reused.

use std::time::Duration;

use super::{
    OutgoingRequest, SendFuture, Transport, TransportError, TransportResponse, retry_after,
};

/// Sends to `{base_url}{path}`.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    base_url: String,
}

impl HttpTransport {
    /// `base_url` like `http://127.0.0.1:8080` (no trailing `/_rf/receive`).
    pub fn new(base_url: impl Into<String>, timeout: Duration) -> Result<Self, TransportError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| TransportError::Other(e.to_string()))?;
        Ok(Self {
            client,
            base_url: base_url.into().trim_end_matches('/').to_owned(),
        })
    }
}

impl Transport for HttpTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let mut builder = self
                .client
                .post(format!("{}{}", self.base_url, request.path))
                .header(reqwest::header::CONTENT_TYPE, "application/json");
            for (name, value) in request.headers {
                builder = builder.header(name, value);
            }
            let response = builder.body(request.body).send().await.map_err(|e| {
                if e.is_timeout() {
                    TransportError::Timeout
                } else if e.is_connect() {
                    TransportError::Connect(e.to_string())
                } else {
                    TransportError::Other(e.to_string())
                }
            })?;
            let status = response.status().as_u16();
            let retry_after = retry_after(
                response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            );
            let body = response.bytes().await.map_err(|e| {
                if e.is_timeout() {
                    TransportError::Timeout
                } else {
                    TransportError::Other(e.to_string())
                }
            })?;
            Ok(TransportResponse {
                status,
                body: body.to_vec(),
                retry_after,
            })
        })
    }
}
