//! The receiver over gRPC (cargo feature `grpc`): the service
//! `rfidl.RFReceiver` with the unary method `Receive`, that carries the
//! signing headers and the exact body bytes of one message and answers what
//! `POST /_rf/receive` would have answered: status, body, `Retry-After`;
//! and `ReceiveBatch`, the same for `POST /_rf/receive/batch` (its body is
//! the HTTP batch's JSON, `wire-protocol.md`, envelope).
//!
//! ```proto
//! syntax = "proto3";
//! package rfidl;
//! service RFReceiver {
//!   rpc Receive(ReceiveRequest) returns (ReceiveReply);
//!   rpc ReceiveBatch(ReceiveRequest) returns (ReceiveReply);
//! }
//! message ReceiveRequest {
//!   map<string, string> headers = 1; // webhook-id, webhook-timestamp, webhook-signature, traceparent, …
//!   bytes body = 2;                  // the envelope's JSON, exactly as signed
//! }
//! message ReceiveReply {
//!   uint32 status = 1;                        // the HTTP status of the same delivery
//!   bytes body = 2;                           // the same JSON body
//!   optional uint32 retry_after_seconds = 3;  // Retry-After, when given
//! }
//! ```
//!
//! [`ReceiverService`] runs [`Receiver::receive`], so the signature, the
//! envelope checks, the inbox and the handler are exactly the HTTP ones;
//! the gRPC call itself succeeds (status `OK`) whatever the delivery's
//! answer, and a gRPC error means only that the call got no answer.
//! Serve it beside other tonic services, or alone with [`serve_grpc`]:
//!
//! ```no_run
//! # async fn demo(receiver: rfidl_runtime::receiver::Receiver) -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7443").await?;
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! rfidl_runtime::grpc::serve_grpc(receiver.clone(), listener, shutdown).await?;
//! receiver.shutdown().await;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, header};
use axum::response::IntoResponse as _;
use tonic::codegen::{Body, BoxFuture, StdError};
use tonic::server::{NamedService, UnaryService};
use tower::ServiceExt as _;

use crate::receiver::{ReceiveError, Receiver};

/// The fully qualified service name.
pub const SERVICE_NAME: &str = "rfidl.RFReceiver";
/// The HTTP/2 path of `Receive`.
pub const RECEIVE_METHOD_PATH: &str = "/rfidl.RFReceiver/Receive";
/// The HTTP/2 path of `ReceiveBatch`.
pub const RECEIVE_BATCH_METHOD_PATH: &str = "/rfidl.RFReceiver/ReceiveBatch";
/// Room above the receiver's body limit for the rest of a request (headers,
/// framing), so that an oversized body reaches the receiver and is answered
/// 413 `payload_too_large`, as on HTTP, instead of failing the call.
pub const DECODING_HEADROOM: usize = 64 * 1024;

/// One message: the signing headers and the exact body bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReceiveRequest {
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature` and any other
    /// header the HTTP transport would send (`traceparent`, …).
    #[prost(map = "string, string", tag = "1")]
    pub headers: HashMap<String, String>,
    /// The envelope's JSON, exactly as signed.
    #[prost(bytes = "vec", tag = "2")]
    pub body: Vec<u8>,
}

/// What `POST /_rf/receive` would have answered.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReceiveReply {
    /// The HTTP status (`wire-protocol.md`, responses).
    #[prost(uint32, tag = "1")]
    pub status: u32,
    /// The JSON body: an acknowledgement or `{"error", "message"}`.
    #[prost(bytes = "vec", tag = "2")]
    pub body: Vec<u8>,
    /// `Retry-After` in seconds, when the answer gives one.
    #[prost(uint32, optional, tag = "3")]
    pub retry_after_seconds: Option<u32>,
}

/// What answers the calls: the receiver itself (its router for batches),
/// or any router that serves `POST /_rf/receive` and
/// `POST /_rf/receive/batch` (e.g. the receiver's routes behind middleware).
#[derive(Clone)]
enum Backend {
    Receiver {
        receiver: Receiver,
        router: axum::Router,
    },
    Router(axum::Router),
}

/// Which method a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Receive,
    ReceiveBatch,
}

/// The `rfidl.RFReceiver` tonic service. Add it to a
/// `tonic::transport::Server` (`add_service`) or serve it with
/// [`serve_grpc`].
#[derive(Clone)]
pub struct ReceiverService {
    backend: Backend,
    body_limit: usize,
    batch_body_limit: usize,
}

impl std::fmt::Debug for ReceiverService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverService")
            .field("body_limit", &self.body_limit)
            .field("batch_body_limit", &self.batch_body_limit)
            .finish_non_exhaustive()
    }
}

impl ReceiverService {
    /// Answers with `receiver` ([`Receiver::receive`]; batches through its
    /// batch route). Requests up to its body limit (batches: its batch body
    /// limit) plus [`DECODING_HEADROOM`] are decoded; a body over the limit
    /// is answered 413 `payload_too_large`, as on HTTP (a request too large
    /// to decode is not read: it gets the same answer).
    pub fn new(receiver: Receiver) -> Self {
        Self {
            body_limit: receiver.body_limit(),
            batch_body_limit: receiver.batch_body_limit(),
            backend: Backend::Receiver {
                router: receiver.router(),
                receiver,
            },
        }
    }

    /// Answers each call by sending it to `router` as `POST /_rf/receive`
    /// (batches: `POST /_rf/receive/batch`), in process, no network: for a
    /// receiver behind middleware of the application's own. `body_limit`
    /// is the router's body limit (requests up to it plus
    /// [`DECODING_HEADROOM`] are decoded); batches are decoded up to
    /// [`DEFAULT_BATCH_BODY_LIMIT`](crate::receiver::DEFAULT_BATCH_BODY_LIMIT)
    /// plus the headroom.
    pub fn from_router(router: axum::Router, body_limit: usize) -> Self {
        Self {
            backend: Backend::Router(router),
            body_limit,
            batch_body_limit: crate::receiver::DEFAULT_BATCH_BODY_LIMIT,
        }
    }
}

/// The gRPC call's answer as the HTTP receiver would have given it.
async fn answer(backend: Backend, method: Method, request: ReceiveRequest) -> ReceiveReply {
    let mut headers = HeaderMap::with_capacity(request.headers.len());
    for (name, value) in &request.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            return reply(
                ReceiveError::MalformedEnvelope(format!(
                    "header `{}` is not a valid HTTP header name and value",
                    name.escape_debug()
                ))
                .into_response(),
            )
            .await;
        };
        headers.insert(name, value);
    }
    let (router, path) = match (backend, method) {
        (Backend::Receiver { receiver, .. }, Method::Receive) => {
            let answer = receiver.receive(&headers, request.body.into()).await;
            return reply(answer.into_response()).await;
        }
        (Backend::Router(router), Method::Receive) => (router, crate::receiver::RECEIVE_PATH),
        (Backend::Receiver { router, .. } | Backend::Router(router), Method::ReceiveBatch) => {
            (router, crate::receiver::RECEIVE_BATCH_PATH)
        }
    };
    let mut http_request = Request::post(path)
        .body(axum::body::Body::from(request.body))
        .unwrap_or_default();
    *http_request.headers_mut() = headers;
    http_request.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    match router.oneshot(http_request).await {
        Ok(response) => reply(response).await,
        Err(never) => match never {},
    }
}

/// An HTTP answer as a [`ReceiveReply`].
async fn reply(response: axum::response::Response) -> ReceiveReply {
    let status = u32::from(response.status().as_u16());
    let retry_after_seconds = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok());
    match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(body) => ReceiveReply {
            status,
            body: body.to_vec(),
            retry_after_seconds,
        },
        Err(e) => {
            let refusal = ReceiveError::Unavailable(format!("cannot read the answer: {e}"));
            ReceiveReply {
                status: u32::from(refusal.status().as_u16()),
                body: serde_json::to_vec(&refusal.body()).unwrap_or_default(),
                retry_after_seconds: refusal.retry_after_secs(),
            }
        }
    }
}

/// A successful call answering 413 `payload_too_large`.
async fn too_large(
    grpc: &mut tonic::server::Grpc<tonic_prost::ProstCodec<ReceiveReply, ReceiveRequest>>,
    backend: Backend,
    limit: usize,
) -> Response<tonic::body::Body> {
    let answer = match &backend {
        Backend::Receiver { receiver, .. } => receiver.payload_too_large(limit),
        Backend::Router(_) => ReceiveError::PayloadTooLarge { limit }.into(),
    };
    let reply = reply(answer.into_response()).await;
    // One empty `ReceiveRequest` frame (uncompressed, length 0) to run the
    // unary machinery on, so the reply is framed as any other.
    let empty = Request::new(tonic::body::Body::new(http_body_util::Full::new(
        axum::body::Bytes::from_static(&[0, 0, 0, 0, 0]),
    )));
    grpc.unary(Fixed(reply), empty).await
}

/// Answers every call with the same reply.
struct Fixed(ReceiveReply);

impl UnaryService<ReceiveRequest> for Fixed {
    type Response = ReceiveReply;
    type Future = BoxFuture<tonic::Response<ReceiveReply>, tonic::Status>;

    fn call(&mut self, _: tonic::Request<ReceiveRequest>) -> Self::Future {
        let reply = self.0.clone();
        Box::pin(async move { Ok(tonic::Response::new(reply)) })
    }
}

/// A method as tonic's unary service.
struct ReceiveMethod(Backend, Method);

impl UnaryService<ReceiveRequest> for ReceiveMethod {
    type Response = ReceiveReply;
    type Future = BoxFuture<tonic::Response<ReceiveReply>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<ReceiveRequest>) -> Self::Future {
        let (backend, method) = (self.0.clone(), self.1);
        Box::pin(async move {
            Ok(tonic::Response::new(
                answer(backend, method, request.into_inner()).await,
            ))
        })
    }
}

impl<B> tower::Service<Request<B>> for ReceiverService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (method, limit) = match request.uri().path() {
            RECEIVE_METHOD_PATH => (Method::Receive, self.body_limit),
            RECEIVE_BATCH_METHOD_PATH => (Method::ReceiveBatch, self.batch_body_limit),
            _ => {
                return Box::pin(async {
                    Ok(tonic::Status::unimplemented(
                        "rfidl.RFReceiver has the methods Receive and ReceiveBatch",
                    )
                    .into_http())
                });
            }
        };
        let backend = self.backend.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .max_decoding_message_size(limit.saturating_add(DECODING_HEADROOM));
            let response = grpc
                .unary(ReceiveMethod(backend.clone(), method), request)
                .await;
            // Neither method fails: `OutOfRange` is tonic refusing a
            // request over the decoding limit (unread). Answer it as HTTP
            // does a body over the limit.
            if tonic::Status::from_header_map(response.headers())
                .is_some_and(|status| status.code() == tonic::Code::OutOfRange)
            {
                return Ok(too_large(&mut grpc, backend, limit).await);
            }
            Ok(response)
        })
    }
}

impl NamedService for ReceiverService {
    const NAME: &'static str = SERVICE_NAME;
}

/// Serves `receiver` as `rfidl.RFReceiver` on `listener` (HTTP/2 without
/// TLS) until `shutdown` completes, then lets calls in flight finish. Call
/// [`Receiver::shutdown`] afterwards to stop its writer.
pub async fn serve_grpc(
    receiver: Receiver,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(ReceiverService::new(receiver))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown,
        )
        .await
}
