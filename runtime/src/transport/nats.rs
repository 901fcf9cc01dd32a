//! The NATS JetStream transport (cargo feature `nats`): a `nats://` destination.
//!
//! Each request is published to the destination's subject with its signing
//! headers as NATS headers, its exact body, and `Nats-Msg-Id` = the message
//! id (the stream drops a re-publish inside its duplicate window). The
//! stream's publish acknowledgement is the answer: it becomes a
//! [`BROKER_ACCEPTED`] response that [`classify`](crate::dispatcher::classify)
//! maps to [`Verdict::Published`](crate::dispatcher::Verdict::Published)
//! (the row is `Sent`; a command's answer comes back later through
//! [`crate::nats::AnswersConsumer`]). No acknowledgement within the timeout,
//! or no broker, is a [`TransportError`]: retried, not counted, and the
//! destination's circuit opens as for HTTP. See `docs/transports.md`.

use crate::transport::UrlError;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::Mutex;

use super::{
    BatchFuture, OutgoingRequest, SendFuture, Transport, TransportError, TransportResponse,
};
use crate::nats::{NatsUrl, REPLY_TO_HEADER, answers_subject, ensure_stream};

/// The status a broker-accepted publish is reported with (`202 Accepted`,
/// with a body marked `"deferred": true`).
pub const BROKER_ACCEPTED: u16 = crate::dispatcher::BROKER_ACCEPTED_STATUS;

/// The body of a [`BROKER_ACCEPTED`] response.
pub(crate) const DEFERRED_BODY: &[u8] =
    br#"{"acknowledged":true,"duplicate":false,"payload":null,"deferred":true}"#;

/// Publishes to a JetStream stream; connects (and creates the stream if it
/// is missing) on first use and again after a failed connection.
pub struct JetStreamTransport {
    url: NatsUrl,
    timeout: Duration,
    context: Mutex<Option<jetstream::Context>>,
}

impl std::fmt::Debug for JetStreamTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamTransport")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the transport reads from an envelope.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head {
    message_id: String,
    #[serde(default)]
    message_type: String,
    #[serde(default)]
    source_service_id: String,
}

impl JetStreamTransport {
    /// A transport to `url` (`nats://[user:password@]host:port/<subject>`);
    /// `timeout` bounds the connection and each publish acknowledgement.
    ///
    /// # Errors
    ///
    /// A malformed URL, named without its credentials.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, UrlError> {
        Ok(Self::with_url(NatsUrl::parse(url)?, timeout))
    }

    /// A transport to an already parsed URL.
    pub fn with_url(url: NatsUrl, timeout: Duration) -> Self {
        Self {
            url,
            timeout,
            context: Mutex::new(None),
        }
    }

    /// The JetStream context, connecting and creating the stream first if
    /// there is none yet.
    async fn context(&self) -> Result<jetstream::Context, TransportError> {
        let mut slot = self.context.lock().await;
        if let Some(context) = slot.as_ref() {
            return Ok(context.clone());
        }
        let client = self.url.connect(self.timeout).await?;
        let mut context = jetstream::new(client);
        context.set_timeout(self.timeout);
        tokio::time::timeout(self.timeout.max(Duration::from_secs(2)), async {
            ensure_stream(&context, &self.url).await
        })
        .await
        .map_err(|_| TransportError::Timeout)?
        .map_err(|e| TransportError::Other(e.to_string()))?;
        *slot = Some(context.clone());
        Ok(context)
    }

    /// The headers and body of one request, ready to publish.
    fn prepare(
        &self,
        request: OutgoingRequest,
    ) -> Result<(async_nats::HeaderMap, axum::body::Bytes), TransportError> {
        let head: Head = serde_json::from_slice(&request.body)
            .map_err(|_| TransportError::Other("the body is not an rfidl envelope".to_owned()))?;
        let mut headers = async_nats::HeaderMap::new();
        for (name, value) in &request.headers {
            headers.insert(*name, value.as_str());
        }
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            head.message_id.as_str(),
        );
        if matches!(head.message_type.as_str(), "Command" | "PushCall") {
            headers.insert(
                REPLY_TO_HEADER,
                answers_subject(self.url.subject(), &head.source_service_id),
            );
        }
        Ok((headers, request.body.into()))
    }

    /// Publishes every request, then waits for their acknowledgements
    /// (pipelined: one round trip's latency for the lot), all within the
    /// timeout.
    async fn publish_all(
        &self,
        requests: Vec<OutgoingRequest>,
    ) -> Vec<Result<TransportResponse, TransportError>> {
        let count = requests.len();
        let context = match self.context().await {
            Ok(context) => context,
            Err(error) => return (0..count).map(|_| Err(error.clone())).collect(),
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pending = Vec::with_capacity(count);
        for request in requests {
            let published = match self.prepare(request) {
                Ok((headers, body)) => tokio::time::timeout_at(
                    deadline,
                    context.publish_with_headers(self.url.subject().to_owned(), headers, body),
                )
                .await
                .map_err(|_| Refusal::Error(TransportError::Timeout))
                .and_then(|sent| sent.map_err(|e| refusal(e.kind()))),
                Err(error) => Err(Refusal::Error(error)),
            };
            pending.push(published);
        }
        let mut answers = Vec::with_capacity(count);
        let mut stream_missing = false;
        for published in pending {
            let answer = match published {
                Ok(ack) => match tokio::time::timeout_at(deadline, ack).await {
                    Ok(Ok(_ack)) => Ok(TransportResponse {
                        status: BROKER_ACCEPTED,
                        body: DEFERRED_BODY.to_vec(),
                        retry_after: None,
                    }),
                    Ok(Err(e)) => Err(refusal(e.kind())),
                    Err(_) => Err(Refusal::Error(TransportError::Timeout)),
                },
                Err(refusal) => Err(refusal),
            };
            answers.push(match answer {
                Ok(response) => Ok(response),
                Err(Refusal::TooLarge) => Ok(TransportResponse {
                    status: 413,
                    body: TOO_LARGE_BODY.to_vec(),
                    retry_after: None,
                }),
                Err(Refusal::StreamMissing) => {
                    stream_missing = true;
                    Err(TransportError::Other(
                        "no stream takes the subject (created again at the next attempt)"
                            .to_owned(),
                    ))
                }
                Err(Refusal::Error(error)) => Err(error),
            });
        }
        if stream_missing {
            // Deleted under us: connect and create it again next time.
            *self.context.lock().await = None;
        }
        answers
    }
}

/// Why a publish was not acknowledged.
enum Refusal {
    /// Larger than the broker's `max_payload`: it never will be.
    TooLarge,
    /// No stream takes the subject (deleted while we were connected).
    StreamMissing,
    Error(TransportError),
}

fn refusal(kind: jetstream::context::PublishErrorKind) -> Refusal {
    use jetstream::context::PublishErrorKind as Kind;
    match kind {
        Kind::MaxPayloadExceeded => Refusal::TooLarge,
        Kind::StreamNotFound => Refusal::StreamMissing,
        Kind::TimedOut => Refusal::Error(TransportError::Timeout),
        kind => Refusal::Error(TransportError::Other(format!(
            "no publish acknowledgement: {kind}"
        ))),
    }
}

/// The 413 of a message the broker can never take (the dispatcher's
/// table: `DeadLetter`).
const TOO_LARGE_BODY: &[u8] = br#"{"error":"payload_too_large","message":"the message is larger than the broker's max_payload"}"#;

impl Transport for JetStreamTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            self.publish_all(vec![request])
                .await
                .pop()
                .unwrap_or(Err(TransportError::Other("no answer".to_owned())))
        })
    }

    /// Publishes the batch's messages one by one (each its own stream
    /// message, deduplicated by its own `Nats-Msg-Id`) and awaits their
    /// acknowledgements together.
    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        Box::pin(self.publish_all(requests))
    }
}
