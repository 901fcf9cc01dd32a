//! The receiver's single writer: one thread owns the write connection and
//! group-commits.
//!
//! A durable (`synchronous=FULL`) commit costs an fsync, so committing each
//! delivery alone caps a receiver at a few thousand messages per second. The
//! writer drains every delivery waiting in its queue, runs each in its own
//! savepoint inside one transaction (a failing handler rolls back alone),
//! commits once, and only then answers every waiting request: an answer is
//! never sent for an effect that is not on disk.
//!
//! Because one thread processes deliveries one after another, two copies of
//! one message can never both run the handler: the second finds the first's
//! inbox row (same transaction) and is answered as a duplicate.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::handler::{HandlerError, HostedService, IncomingCall};
use crate::inbox;
use crate::metrics::Metrics;

/// Most deliveries one transaction takes.
const MAX_GROUP: usize = 512;

/// A verified, routed delivery waiting for the writer.
#[derive(Debug)]
pub struct Job {
    pub service: usize,
    pub source: String,
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub interface: String,
    pub version: u32,
    pub endpoint: String,
    pub payload: serde_json::Value,
    pub payload_sha256: [u8; 32],
    pub reply: oneshot::Sender<Outcome>,
}

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Processed now; committed.
    Processed(serde_json::Value),
    /// Processed before with the same payload; the cached response.
    Duplicate(serde_json::Value),
    /// Processed before with a different payload.
    IdReused,
    /// The handler refused or failed; rolled back.
    Failed(HandlerError),
    /// The transaction could not be committed (storage problem); retryable.
    Storage(String),
}

pub struct Writer {
    pub sender: mpsc::Sender<Job>,
    pub thread: std::thread::JoinHandle<()>,
}

/// Starts the writer thread on `conn`.
pub fn start(
    mut conn: Connection,
    services: Arc<Vec<Arc<dyn HostedService>>>,
    metrics: Arc<Metrics>,
    retention: Duration,
) -> std::io::Result<Writer> {
    let (sender, mut receiver) = mpsc::channel::<Job>(4 * MAX_GROUP);
    let thread = std::thread::Builder::new()
        .name("rfidl-inbox-writer".into())
        .spawn(move || {
            let mut group = Vec::with_capacity(MAX_GROUP);
            while let Some(first) = receiver.blocking_recv() {
                group.push(first);
                while group.len() < MAX_GROUP {
                    match receiver.try_recv() {
                        Ok(job) => group.push(job),
                        Err(_) => break,
                    }
                }
                let outcomes = process_group(&mut conn, &services, &metrics, retention, &group);
                for (job, outcome) in group.drain(..).zip(outcomes) {
                    let _ = job.reply.send(outcome);
                }
            }
        })?;
    Ok(Writer { sender, thread })
}

fn process_group(
    conn: &mut Connection,
    services: &[Arc<dyn HostedService>],
    metrics: &Metrics,
    retention: Duration,
    group: &[Job],
) -> Vec<Outcome> {
    let started = Instant::now();
    let tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(error) => {
            return group
                .iter()
                .map(|_| Outcome::Storage(error.to_string()))
                .collect();
        }
    };
    let mut outcomes = Vec::with_capacity(group.len());
    for job in group {
        outcomes.push(process_one(&tx, services, retention, job));
    }
    if let Err(error) = tx.commit() {
        tracing::error!(%error, "inbox commit failed; every delivery of the group is answered as retryable");
        return group
            .iter()
            .map(|_| Outcome::Storage(error.to_string()))
            .collect();
    }
    let elapsed = started.elapsed();
    for outcome in &outcomes {
        match outcome {
            Outcome::Processed(_) => {
                metrics.inbox_processed.inc();
                metrics.inbox_process_duration.observe(elapsed);
            }
            Outcome::Duplicate(_) => metrics.inbox_duplicates.inc(),
            _ => {}
        }
    }
    outcomes
}

fn process_one(
    tx: &rusqlite::Transaction<'_>,
    services: &[Arc<dyn HostedService>],
    retention: Duration,
    job: &Job,
) -> Outcome {
    if let Err(error) = tx.execute_batch("SAVEPOINT delivery") {
        return Outcome::Storage(error.to_string());
    }
    let outcome = run_in_savepoint(tx, services, retention, job);
    let end = match outcome {
        Outcome::Processed(_) | Outcome::Duplicate(_) | Outcome::IdReused => "RELEASE delivery",
        _ => "ROLLBACK TO delivery; RELEASE delivery",
    };
    match tx.execute_batch(end) {
        Ok(()) => outcome,
        Err(error) => Outcome::Storage(error.to_string()),
    }
}

fn run_in_savepoint(
    tx: &rusqlite::Transaction<'_>,
    services: &[Arc<dyn HostedService>],
    retention: Duration,
    job: &Job,
) -> Outcome {
    match inbox::lookup(tx, &job.source, &job.message_id) {
        Ok(Some(record)) if record.payload_sha256 == job.payload_sha256 => {
            return Outcome::Duplicate(record.response);
        }
        Ok(Some(_)) => return Outcome::IdReused,
        Ok(None) => {}
        Err(error) => return Outcome::Storage(error.to_string()),
    }
    let call = IncomingCall {
        source: &job.source,
        message_id: &job.message_id,
        correlation_id: job.correlation_id.as_deref(),
        interface: &job.interface,
        version: job.version,
        endpoint: &job.endpoint,
        payload: &job.payload,
    };
    let service = &services[job.service];
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| service.handle(&call, tx)));
    let response = match result {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return Outcome::Failed(error),
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "handler panicked".to_owned());
            tracing::error!(message_id = %job.message_id, endpoint = %job.endpoint, "handler panicked: {text}");
            return Outcome::Failed(HandlerError::Retryable(format!("handler panicked: {text}")));
        }
    };
    let now = crate::db::now_ms();
    let record = inbox::Processed {
        source: &job.source,
        message_id: &job.message_id,
        endpoint: &job.endpoint,
        payload_sha256: &job.payload_sha256,
        response: &response,
        processed_at_ms: now,
        expires_at_ms: now + retention.as_millis() as i64,
    };
    match inbox::insert(tx, &record) {
        Ok(()) => Outcome::Processed(response),
        Err(error) => Outcome::Storage(error.to_string()),
    }
}
