//! The AMQP 1.0 transport (cargo feature `amqp`): an `amqp://`, `amqps://`
//! or Service Bus connection-string destination.
//!
//! Each request is one AMQP message: the exact envelope as its one data
//! section, the signing headers as application properties, `message-id` =
//! the rfidl message id (what Service Bus duplicate detection keys on),
//! durable, and for commands and pushcalls `reply-to` = the answers
//! address ([`crate::amqp::answers_address`]). The broker's `accepted`
//! disposition is the answer: a [`BROKER_ACCEPTED`] response that
//! [`classify`](crate::dispatcher::classify) maps to
//! [`Verdict::Published`](crate::dispatcher::Verdict::Published) (the row
//! is `Sent`). A batch is sent as unsettled transfers back to back and
//! its dispositions awaited together (pipelined), without holding the
//! link: concurrent batches' dispositions are awaited side by side. `rejected` for size is a
//! 413 (dead letter); any other refusal, no disposition within the timeout,
//! or no broker is a [`TransportError`]: retried, and the connection is
//! opened again. See `docs/transports.md`.

use crate::transport::UrlError;
use std::time::Duration;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::LinkError;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Data, Header, Message, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue};
use tokio::sync::Mutex;

use super::{
    BatchFuture, OutgoingRequest, SendFuture, Transport, TransportError, TransportResponse,
};
use crate::amqp::{AmqpUrl, answers_address};

/// The status a broker-accepted message is reported with (`202 Accepted`,
/// with a body marked `"deferred": true`), as for JetStream.
const BROKER_ACCEPTED: u16 = crate::dispatcher::BROKER_ACCEPTED_STATUS;

/// The body of a [`BROKER_ACCEPTED`] response.
const DEFERRED_BODY: &[u8] =
    br#"{"acknowledged":true,"duplicate":false,"payload":null,"deferred":true}"#;

/// Sends to an AMQP 1.0 address; connects (session, sender link) on first
/// use and again after a failure.
pub struct AmqpTransport {
    url: AmqpUrl,
    timeout: Duration,
    link: Mutex<Option<Link>>,
    /// Links opened so far.
    opened: std::sync::atomic::AtomicU64,
}

/// An open connection, session and sender link.
struct Link {
    /// Which link this is (counted from 1): a batch that saw it fail
    /// closes it, not a newer one.
    generation: u64,
    connection: ConnectionHandle<()>,
    session: SessionHandle<()>,
    sender: fe2o3_amqp::Sender,
}

impl Link {
    /// Closes the link, session and connection, without waiting long.
    async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = self.sender.close().await;
            let _ = self.session.end().await;
            let _ = self.connection.close().await;
        })
        .await;
    }
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
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

impl AmqpTransport {
    /// A transport to `url` (`amqp[s]://[user:password@]host[:port]/<address>`
    /// or a Service Bus connection string); `timeout` bounds connecting
    /// and each batch's dispositions.
    ///
    /// # Errors
    ///
    /// A malformed URL, the wrong field named, never a credential.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, UrlError> {
        Ok(Self::with_url(AmqpUrl::parse(url)?, timeout))
    }

    /// A transport to an already parsed location.
    pub fn with_url(url: AmqpUrl, timeout: Duration) -> Self {
        Self {
            url,
            timeout,
            link: Mutex::new(None),
            opened: std::sync::atomic::AtomicU64::new(0),
        }
    }

    async fn open(&self) -> Result<Link, TransportError> {
        let id = format!("rfidl-sender-{}", uuid::Uuid::now_v7());
        let mut connection = self.url.connect(self.timeout, &id).await?;
        let attached = tokio::time::timeout(self.timeout, async {
            let mut session = fe2o3_amqp::Session::begin(&mut connection)
                .await
                .map_err(|e| TransportError::Connect(format!("session: {e}")))?;
            let sender = fe2o3_amqp::Sender::builder()
                .name(id.clone())
                .target(crate::amqp::durable_target(self.url.address()))
                .attach(&mut session)
                .await
                .map_err(|e| {
                    TransportError::Other(format!(
                        "cannot attach a sender to `{}`: {e}",
                        self.url.address()
                    ))
                })?;
            Ok::<_, TransportError>((session, sender))
        })
        .await
        .map_err(|_| TransportError::Timeout)
        .and_then(|attached| attached);
        match attached {
            Ok((session, sender)) => Ok(Link {
                generation: self
                    .opened
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1,
                connection,
                session,
                sender,
            }),
            Err(error) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), connection.close()).await;
                Err(error)
            }
        }
    }

    /// The AMQP message of one request.
    fn prepare(&self, request: OutgoingRequest) -> Result<Message<Data>, TransportError> {
        let head: Head = serde_json::from_slice(&request.body)
            .map_err(|_| TransportError::Other("the body is not an rfidl envelope".to_owned()))?;
        let mut properties = ApplicationProperties::builder();
        for (name, value) in &request.headers {
            properties = properties.insert(*name, SimpleValue::String(value.clone()));
        }
        let mut props = Properties::builder()
            .message_id(head.message_id)
            .content_type("application/json");
        if matches!(head.message_type.as_str(), "Command" | "PushCall") {
            props = props.reply_to(answers_address(self.url.address(), &head.source_service_id));
        }
        Ok(Message::builder()
            .header(Header {
                durable: true,
                ..Header::default()
            })
            .properties(props.build())
            .application_properties(properties.build())
            .data(Binary::from(request.body))
            .build())
    }

    /// Sends every request as an unsettled transfer, then waits for their
    /// dispositions together, all within the timeout. The link is held
    /// only while the transfers go out: the dispositions of concurrent
    /// batches are awaited side by side (the broker confirms a durable
    /// message once it is on disk; one batch's wait no longer holds back
    /// the next one's transfers).
    async fn send_all(
        &self,
        requests: Vec<OutgoingRequest>,
    ) -> Vec<Result<TransportResponse, TransportError>> {
        let count = requests.len();
        let all = |error: TransportError| (0..count).map(|_| Err(error.clone())).collect();
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pending = Vec::with_capacity(count);
        let mut broken = false;
        let generation = {
            let mut slot = self.link.lock().await;
            if slot.is_none() {
                match self.open().await {
                    Ok(link) => *slot = Some(link),
                    Err(error) => return all(error),
                }
            }
            let Some(link) = slot.as_mut() else {
                return all(TransportError::Other("no link".to_owned()));
            };
            let max_size = link.sender.max_message_size().filter(|size| *size > 0);
            for request in requests {
                if broken {
                    pending.push(Pending::Error(TransportError::Other(
                        "the connection failed during the batch".to_owned(),
                    )));
                    continue;
                }
                if max_size.is_some_and(|max| request.body.len() as u64 > max) {
                    pending.push(Pending::TooLarge);
                    continue;
                }
                let message = match self.prepare(request) {
                    Ok(message) => message,
                    Err(error) => {
                        pending.push(Pending::Error(error));
                        continue;
                    }
                };
                match tokio::time::timeout_at(deadline, link.sender.send_batchable(message)).await {
                    Ok(Ok(future)) => pending.push(Pending::Sent(future)),
                    Ok(Err(error)) => {
                        broken = true;
                        pending.push(Pending::Error(TransportError::Other(format!(
                            "send: {error}"
                        ))));
                    }
                    Err(_) => {
                        broken = true;
                        pending.push(Pending::Error(TransportError::Timeout));
                    }
                }
            }
            link.generation
        };
        let mut answers = Vec::with_capacity(count);
        for item in pending {
            let answer = match item {
                Pending::Sent(future) => match tokio::time::timeout_at(deadline, future).await {
                    Ok(Ok(outcome)) => outcome_answer(outcome),
                    Ok(Err(error)) => {
                        broken = true;
                        Err(TransportError::Other(format!("no disposition: {error}")))
                    }
                    Err(_) => {
                        broken = true;
                        Err(TransportError::Timeout)
                    }
                },
                Pending::TooLarge => Ok(too_large()),
                Pending::Error(error) => Err(error),
            };
            answers.push(answer);
        }
        if broken {
            // Opened again at the next attempt; unsettled transfers of this
            // one are sent again then (duplicates the inbox answers). Not
            // a newer link another batch opened meanwhile.
            let mut slot = self.link.lock().await;
            if slot
                .as_ref()
                .is_some_and(|link| link.generation == generation)
                && let Some(link) = slot.take()
            {
                drop(slot);
                link.close().await;
            }
        }
        answers
    }
}

enum Pending {
    Sent(fe2o3_amqp::link::delivery::DeliveryFut<Result<Outcome, fe2o3_amqp::link::SendError>>),
    TooLarge,
    Error(TransportError),
}

/// The answer of the broker's outcome.
fn outcome_answer(outcome: Outcome) -> Result<TransportResponse, TransportError> {
    match outcome {
        Outcome::Accepted(_) => Ok(TransportResponse {
            status: BROKER_ACCEPTED,
            body: DEFERRED_BODY.to_vec(),
            retry_after: None,
        }),
        Outcome::Rejected(rejected) => {
            let error = rejected.error;
            if error
                .as_ref()
                .is_some_and(|error| error.condition == LinkError::MessageSizeExceeded.into())
            {
                return Ok(too_large());
            }
            Err(TransportError::Other(match error {
                Some(error) => format!("the broker rejected the message: {error}"),
                None => "the broker rejected the message".to_owned(),
            }))
        }
        Outcome::Released(_) => Err(TransportError::Other(
            "the broker released the message (not taken)".to_owned(),
        )),
        Outcome::Modified(_) => Err(TransportError::Other(
            "the broker answered `modified` (not taken)".to_owned(),
        )),
        #[allow(unreachable_patterns)]
        _ => Err(TransportError::Other(
            "unexpected outcome from the broker".to_owned(),
        )),
    }
}

/// The 413 of a message larger than the link's `max-message-size` (the
/// dispatcher's table: `DeadLetter`).
fn too_large() -> TransportResponse {
    TransportResponse {
        status: 413,
        body: br#"{"error":"payload_too_large","message":"the message is larger than the broker's max-message-size"}"#.to_vec(),
        retry_after: None,
    }
}

impl Transport for AmqpTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            self.send_all(vec![request])
                .await
                .pop()
                .unwrap_or(Err(TransportError::Other("no answer".to_owned())))
        })
    }

    /// Sends the batch's messages one by one (each its own AMQP message
    /// with its own `message-id`) and awaits their dispositions together.
    fn send_batch(&self, requests: Vec<OutgoingRequest>) -> BatchFuture<'_> {
        Box::pin(self.send_all(requests))
    }
}
