//! In-process: hands the request to an axum `Router` in this process, so
//! the receiver's checks (signature, inbox, handler) all run as over HTTP.

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use tower::ServiceExt as _;

use super::{
    OutgoingRequest, SendFuture, Transport, TransportError, TransportResponse, retry_after,
};

/// Delivers into an axum [`Router`] in this process (a receiver's
/// [`router`](crate::receiver::Receiver::router)): no socket, no
/// serialization beyond the envelope, and the receiver's whole pipeline
/// (signature, inbox, handler transaction) runs as over HTTP. For tests
/// and for two services in one process; route it in code with
/// [`DispatcherBuilder::route`](crate::dispatcher::DispatcherBuilder::route)
/// (an `inproc://` URL in the configuration is refused).
///
/// It has no timeout of its own: a request takes as long as the receiver
/// does (at most `inbox.in_progress_wait` before a 503 `in_progress`).
#[derive(Clone)]
pub struct InProcessTransport {
    router: Router,
}

impl std::fmt::Debug for InProcessTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcessTransport")
    }
}

impl InProcessTransport {
    /// Sends into `router` (e.g. `receiver.router()`).
    pub fn new(router: Router) -> Self {
        Self { router }
    }
}

impl Transport for InProcessTransport {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let mut builder =
                Request::post(request.path).header("content-type", "application/json");
            for (name, value) in request.headers {
                builder = builder.header(name, value);
            }
            let http_request = builder
                .body(Body::from(request.body))
                .map_err(|e| TransportError::Other(e.to_string()))?;
            let response = self
                .router
                .clone()
                .oneshot(http_request)
                .await
                .map_err(|e| TransportError::Other(e.to_string()))?;
            let status = response.status().as_u16();
            let retry_after = retry_after(response.headers());
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .map_err(|e| TransportError::Other(e.to_string()))?;
            Ok(TransportResponse {
                status,
                body: body.to_vec(),
                retry_after,
            })
        })
    }
}
