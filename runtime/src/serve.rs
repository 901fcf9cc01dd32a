//! [`serve`]: an axum router on a TCP listener, with the read timeouts a
//! server facing a hostile network needs.
//!
//! `axum::serve` waits forever for a client's headers and body, so a few
//! hundred connections that trickle their headers, or never send the body
//! they announced, stay open until the file-descriptor limit. Every rfidl
//! server (the receiver, the diagnostics routes, the registry, the demo
//! services) runs through this function instead:
//!
//! * the request headers must arrive whole within
//!   [`DEFAULT_HEADER_READ_TIMEOUT`] of the connection's first byte (and of
//!   each later request on a kept-alive connection), else the connection is
//!   closed;
//! * the body must arrive whole within [`DEFAULT_BODY_READ_TIMEOUT`] of the
//!   headers; a handler reading a slower one gets an error that
//!   [`is_body_timeout`] recognises (the receiver answers 408
//!   `body_timeout`) and the connection is closed.
//!
//! HTTP/1.1 only: the gRPC transport serves HTTP/2 through tonic.
//! On a graceful shutdown the listener closes at once and the requests in
//! flight finish; a caller bounds that with a timeout of its own.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

/// How long a client may take to send a request's headers.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body, after its headers.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = crate::receiver::BODY_READ_TIMEOUT;

type ShutdownSignal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves `router` on `listener` with read timeouts (module docs). Await it
/// (it runs until the listener fails or the shutdown signal fires):
///
/// ```no_run
/// # async fn run(router: axum::Router) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// rfidl_runtime::serve(listener, router)
///     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
///     .await
/// # }
/// ```
pub fn serve(listener: TcpListener, router: Router) -> Serve {
    Serve {
        listener,
        router,
        header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
        shutdown: None,
    }
}

/// A server being configured; see [`serve`].
#[must_use = "a server does nothing until it is awaited"]
pub struct Serve {
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    shutdown: Option<ShutdownSignal>,
}

impl Serve {
    /// Stops accepting connections when `signal` completes, then waits for
    /// the requests in flight.
    pub fn with_graceful_shutdown(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.shutdown = Some(Box::pin(signal));
        self
    }

    /// How long a client may take to send a request's headers (default
    /// [`DEFAULT_HEADER_READ_TIMEOUT`]).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// How long a client may take to send a request's body (default
    /// [`DEFAULT_BODY_READ_TIMEOUT`]).
    pub fn body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    async fn run(self) -> std::io::Result<()> {
        let Serve {
            listener,
            router,
            header_read_timeout,
            body_read_timeout,
            shutdown,
        } = self;
        let mut shutdown = shutdown.unwrap_or_else(|| Box::pin(std::future::pending()));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) if is_per_connection(&error) => continue,
                    Err(error) => {
                        // Out of file descriptors and the like: wait for
                        // connections to close rather than spin.
                        tracing::warn!(%error, "cannot accept a connection; retrying in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let router = router.clone();
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let request =
                    request.map(|body| Body::new(DeadlineBody::new(body, body_read_timeout)));
                router.clone().oneshot(request)
            });
            let connection = http.serve_connection(TokioIo::new(stream), service);
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                // A client that went away or sent garbage: nothing to do.
                let _ = connection.await;
            });
        }
        drop(listener);
        graceful.shutdown().await;
        Ok(())
    }
}

impl IntoFuture for Serve {
    type Output = std::io::Result<()>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Accept errors that concern one connection only (it was reset before it
/// was accepted): accept the next.
fn is_per_connection(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// The error a request body gives once its read deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs())]
pub struct BodyTimeout(Duration);

/// Whether `error`, or an error it wraps, is a [`BodyTimeout`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.is::<BodyTimeout>() {
            return true;
        }
        current = error.source();
    }
    false
}

/// A request body that fails with [`BodyTimeout`] once `timeout` has
/// passed since it was made. The timer is armed only when a read would
/// wait, so a body that came with its headers costs none.
struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
        }
    }
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|result| result.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
