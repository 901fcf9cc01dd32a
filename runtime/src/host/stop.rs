//! Stopping a host in the order that leaves nothing `Sending`, and the
//! signals that ask for it.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::dispatcher::DispatcherHandle;
use crate::receiver::Receiver;
use crate::retention::RetentionHandle;

/// What a running host owns, each taken out as it is stopped.
#[derive(Default)]
pub(crate) struct Parts {
    /// Cancelled to stop the HTTP and gRPC servers accepting.
    pub(super) stop_serving: CancellationToken,
    pub(super) http: Option<JoinHandle<()>>,
    pub(super) grpc: Option<JoinHandle<()>>,
    #[cfg(feature = "nats")]
    pub(super) consumer: Option<crate::nats::ConsumerHandle>,
    #[cfg(feature = "amqp")]
    pub(super) amqp_consumer: Option<crate::amqp::AmqpConsumerHandle>,
    pub(super) receiver: Option<Receiver>,
    pub(super) dispatcher: Option<DispatcherHandle>,
    #[cfg(feature = "nats")]
    pub(super) answers: Vec<crate::nats::AnswersHandle>,
    #[cfg(feature = "amqp")]
    pub(super) amqp_answers: Vec<crate::amqp::AmqpAnswersHandle>,
    pub(super) retention: Option<RetentionHandle>,
    pub(super) backups: Option<crate::backup::BackupScheduleHandle>,
    pub(super) directory: Option<JoinHandle<()>>,
}

impl Parts {
    /// Stops what is running, in order (module documentation of
    /// [`crate::host`]); each step returns once what it stopped committed.
    pub(super) async fn stop(&mut self) {
        // 1. Take no more work: the servers finish the requests in flight
        // (which wait for the receiver's commit), the JetStream consumer
        // the messages in hand.
        self.stop_serving.cancel();
        for server in [self.http.take(), self.grpc.take()].into_iter().flatten() {
            let _ = server.await;
        }
        #[cfg(feature = "nats")]
        if let Some(consumer) = self.consumer.take() {
            consumer.shutdown().await;
        }
        #[cfg(feature = "amqp")]
        if let Some(consumer) = self.amqp_consumer.take() {
            consumer.shutdown().await;
        }
        tracing::debug!("servers stopped");
        // 2. The writers commit what they queued; later requests get 503.
        if let Some(receiver) = self.receiver.take() {
            receiver.shutdown().await;
            tracing::debug!("receiver stopped");
        }
        // 3. No more claims; the sends in flight record their results, so
        // no row stays `Sending`. Then the answers to what was published.
        if let Some(dispatcher) = self.dispatcher.take() {
            dispatcher.shutdown().await;
            tracing::debug!("dispatcher stopped");
        }
        #[cfg(feature = "nats")]
        for answers in std::mem::take(&mut self.answers) {
            answers.shutdown().await;
        }
        #[cfg(feature = "amqp")]
        for answers in std::mem::take(&mut self.amqp_answers) {
            answers.shutdown().await;
        }
        // 4. The clean-up, after its pass in progress.
        if let Some(retention) = self.retention.take() {
            retention.shutdown().await;
        }
        // A scheduled backup being written is given up (nothing kept).
        if let Some(backups) = self.backups.take() {
            backups.shutdown().await;
        }
        // 5. No more heartbeats: the registry counts the instance as gone
        // once it misses them.
        if let Some(directory) = self.directory.take() {
            directory.abort();
            let _ = directory.await;
            tracing::debug!("registration no longer renewed");
        }
    }
}

impl Drop for Parts {
    /// A host dropped without a stop: no more serving or heartbeats (the
    /// other parts stop with the tokio runtime).
    fn drop(&mut self) {
        self.stop_serving.cancel();
        if let Some(directory) = self.directory.take() {
            directory.abort();
        }
    }
}

/// Installs the SIGTERM and SIGINT (Ctrl-C) handlers now, and returns a
/// future that resolves with the name of the first of them received
/// (`"SIGTERM"`, `"SIGINT"`). Call it first thing in `main` and pass it to
/// [`Host::run_until`](super::Host::run_until): a signal that arrives while
/// the service still starts then stops it gracefully instead of killing it.
/// (Elsewhere than Unix: Ctrl-C only.)
///
/// # Errors
///
/// When the handlers cannot be installed.
pub fn shutdown_signal()
-> std::io::Result<impl std::future::Future<Output = &'static str> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async move {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        })
    }
}
