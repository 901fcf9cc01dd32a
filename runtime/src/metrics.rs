//! Counters and gauges, rendered in the Prometheus text format at `GET /_rf/metrics`.
//!
//! Names follow the predecessor spec (`rf_outbox_*`, `rf_inbox_*`) so existing
//! dashboards keep working. Counters are lock-free atomics: incrementing one
//! on a hot path costs one relaxed add. Gauges that count rows (pending,
//! inbox size) are read from the database when rendered, not tracked here.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A histogram of millisecond durations with fixed buckets.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    buckets: [AtomicU64; BUCKETS_MS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

const BUCKETS_MS: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0,
];

impl DurationHistogram {
    pub fn observe(&self, elapsed: std::time::Duration) {
        let ms = elapsed.as_secs_f64() * 1000.0;
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_MS) {
            if ms <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_MS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1000.0
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// All runtime metrics of one process. Share it with `Arc<Metrics>`.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Messages written to the outbox.
    pub outbox_enqueued: Counter,
    /// Messages acknowledged by their receiver (`Sent`).
    pub outbox_sent: Counter,
    /// Attempts that failed and were scheduled again.
    pub outbox_retries: Counter,
    /// Messages that exhausted their retries (`Failed`).
    pub outbox_failed: Counter,
    /// Messages refused for good by the receiver (`DeadLetter`).
    pub outbox_dead_lettered: Counter,
    /// Messages past their TTL (`Expired`).
    pub outbox_expired: Counter,
    /// `Sent` rows deleted by the retention clean-up.
    pub outbox_sent_deleted: Counter,
    /// Transport latency of each attempt.
    pub outbox_send_duration: DurationHistogram,
    /// Deliveries processed for the first time.
    pub inbox_processed: Counter,
    /// Deliveries answered from the inbox without running the handler.
    pub inbox_duplicates: Counter,
    /// Deliveries refused with 401.
    pub inbox_signature_failures: Counter,
    /// Deliveries refused with another 4xx.
    pub inbox_rejected: Counter,
    /// Accepted deliveries whose fingerprint differs from the hosted one.
    pub inbox_fingerprint_mismatches: Counter,
    /// Inbox rows deleted by the retention clean-up.
    pub inbox_deleted: Counter,
    /// Handler + inbox commit time.
    pub inbox_process_duration: DurationHistogram,
}

/// Row-count gauges read from the database at render time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    pub outbox_pending: Option<u64>,
    pub inbox_size: Option<u64>,
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self, gauges: Gauges) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &Counter); 13] = [
            (
                "rf_outbox_enqueued_total",
                "Messages written to the outbox.",
                &self.outbox_enqueued,
            ),
            (
                "rf_outbox_sent_total",
                "Messages acknowledged by their receiver.",
                &self.outbox_sent,
            ),
            (
                "rf_outbox_retry_count",
                "Attempts that failed and were scheduled again.",
                &self.outbox_retries,
            ),
            (
                "rf_outbox_failed_count",
                "Messages that exceeded max retries.",
                &self.outbox_failed,
            ),
            (
                "rf_outbox_dead_letter_count",
                "Messages refused for good by the receiver.",
                &self.outbox_dead_lettered,
            ),
            (
                "rf_outbox_expired_count",
                "Messages that expired before delivery.",
                &self.outbox_expired,
            ),
            (
                "rf_outbox_sent_deleted_total",
                "Sent messages deleted after their retention.",
                &self.outbox_sent_deleted,
            ),
            (
                "rf_inbox_processed_total",
                "Messages processed for the first time.",
                &self.inbox_processed,
            ),
            (
                "rf_inbox_duplicate_count",
                "Duplicate messages detected.",
                &self.inbox_duplicates,
            ),
            (
                "rf_inbox_signature_failure_count",
                "Deliveries refused with 401.",
                &self.inbox_signature_failures,
            ),
            (
                "rf_inbox_rejected_count",
                "Deliveries refused with another 4xx.",
                &self.inbox_rejected,
            ),
            (
                "rf_inbox_fingerprint_mismatch_count",
                "Accepted deliveries whose fingerprint differs from the hosted one.",
                &self.inbox_fingerprint_mismatches,
            ),
            (
                "rf_inbox_deleted_total",
                "Inbox rows deleted after their retention.",
                &self.inbox_deleted,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                counter.get()
            );
        }
        let gauges = [
            (
                "rf_outbox_pending_count",
                "Messages waiting to be sent.",
                gauges.outbox_pending,
            ),
            (
                "rf_inbox_size",
                "Current inbox row count.",
                gauges.inbox_size,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
                );
            }
        }
        self.outbox_send_duration.render(
            &mut out,
            "rf_outbox_send_duration_ms",
            "Time to send a message (transport latency).",
        );
        self.inbox_process_duration.render(
            &mut out,
            "rf_inbox_process_duration_ms",
            "Time to process an incoming message.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let metrics = Metrics::default();
        metrics.outbox_sent.add(3);
        metrics
            .inbox_process_duration
            .observe(std::time::Duration::from_micros(700));
        let text = metrics.render(Gauges {
            outbox_pending: Some(7),
            inbox_size: None,
        });
        assert!(text.contains("rf_outbox_sent_total 3\n"), "{text}");
        assert!(text.contains("rf_outbox_pending_count 7\n"), "{text}");
        assert!(!text.contains("rf_inbox_size "), "{text}");
        assert!(
            text.contains("rf_inbox_process_duration_ms_bucket{le=\"0.5\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("rf_inbox_process_duration_ms_bucket{le=\"1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("rf_inbox_process_duration_ms_count 1\n"),
            "{text}"
        );
    }
}
