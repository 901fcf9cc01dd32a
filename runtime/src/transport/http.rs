//! HTTP with `reqwest`: one client per transport, so connections are reused.

use std::time::Duration;

use super::{
    BatchFuture, OutgoingRequest, RECEIVE_BATCH_PATH, SendFuture, Transport, TransportError,
    TransportResponse, batch_body, retry_after, split_batch_answer,
};

/// Sends to `{base_url}{path}`.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    /// Set once the receiver answered the batch path with 404/405: it is
    /// not an rfidl receiver with batches, so send one by one from then on.
    no_batches: std::sync::Arc<std::sync::atomic::AtomicBool>,
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
            no_batches: Default::default(),
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

    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        use std::sync::atomic::Ordering;
        Box::pin(async move {
            if !self.no_batches.load(Ordering::Relaxed) {
                let batch = OutgoingRequest {
                    path: RECEIVE_BATCH_PATH,
                    headers: Vec::new(),
                    body: batch_body(&requests),
                };
                match self.send(batch).await {
                    Ok(answer) if answer.status == 404 || answer.status == 405 => {
                        tracing::info!(url = %self.base_url, "receiver has no batch endpoint; sending one by one");
                        self.no_batches.store(true, Ordering::Relaxed);
                    }
                    answer => return split_batch_answer(requests.len(), answer),
                }
            }
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(self.send(request).await);
            }
            answers
        })
    }
}
