//! Counters, histograms and gauges, rendered in the Prometheus text format
//! at `GET /_rf/metrics`.
//!
//! Names follow Prometheus conventions (`promtool check metrics` is clean,
//! tested): counters end in `_total`, durations are `_seconds` histograms,
//! gauges carry a unit or `_messages`. `docs/operations.md` maps the
//! predecessor spec's names (`rf_outbox_retry_count`, …) to these.
//!
//! Counters are lock-free atomics: incrementing one on a hot path costs one
//! relaxed add. Gauges of rows (pending per destination, oldest pending age,
//! rows that need a human, inbox size) are read from the database when
//! rendered, through the partial indexes, not tracked here.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (a time, a size), set as a whole.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A histogram of durations in seconds with fixed buckets.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    buckets: [AtomicU64; BUCKETS_SECONDS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// Upper bounds in seconds: 100 µs to 10 s (the default request timeout).
const BUCKETS_SECONDS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

impl DurationHistogram {
    /// Counts one duration.
    pub fn observe(&self, elapsed: std::time::Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_SECONDS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// How many durations were counted.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The cumulative buckets, as Prometheus has them: `[upper bound in
    /// microseconds, durations at most that long]`, the bounds rising; the
    /// durations over the last bound are [`DurationHistogram::count`] minus
    /// the last bucket's.
    pub fn cumulative_micros(&self) -> Vec<[u64; 2]> {
        // The count first, as in `render`: no bucket exceeds it.
        let count = self.count();
        self.buckets
            .iter()
            .zip(BUCKETS_SECONDS)
            .map(|(bucket, bound)| {
                [
                    (bound * 1e6).round() as u64,
                    bucket.load(Ordering::Relaxed).min(count),
                ]
            })
            .collect()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        // Read the count first: buckets only grow, so no bucket can then
        // exceed `+Inf` even while observations go on.
        let count = self.count.load(Ordering::Relaxed);
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_SECONDS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed).min(count)
            );
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
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
    /// Messages an operator discarded (`Discarded`).
    pub outbox_discarded: Counter,
    /// `Failed`, `DeadLetter`, `Expired` and `Discarded` rows deleted by the
    /// retention clean-up after `outbox.failed_retention`.
    pub outbox_undelivered_deleted: Counter,
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
    /// Broker deliveries terminated: refused for good, never redelivered
    /// (JetStream `+TERM`; recorded in `rf_terminated`).
    pub inbox_terminated: Counter,
    /// Handler + inbox commit time.
    pub inbox_process_duration: DurationHistogram,
    /// Free pages the incremental vacuum returned to the file system (SQLite).
    pub sqlite_vacuumed_pages: Counter,
    /// Backups written (scheduled and on demand).
    pub backups: Counter,
    /// Backups that failed (nothing was kept of them).
    pub backup_failures: Counter,
    /// When the last backup was written: Unix seconds, 0 before the first.
    pub backup_last_success: Gauge,
    /// Size of the last backup written, in bytes.
    pub backup_last_size: Gauge,
}

/// The outbox rows of one destination that are not delivered yet, read
/// from the database at render time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DestinationGauges {
    /// The destination name (the `destination` label).
    pub destination: String,
    /// `Pending` + `Sending` rows: waiting for delivery (durable timers
    /// not due yet are `scheduled` instead).
    pub pending: u64,
    /// `Pending` rows whose `deliver_at` is still ahead (durable timers).
    pub scheduled: u64,
    /// Age of the oldest of them, in milliseconds; `None` when there is none.
    pub oldest_pending_age_ms: Option<i64>,
    /// `Failed` rows (retries exhausted): need a human.
    pub failed: u64,
    /// `DeadLetter` rows (refused for good): need a human.
    pub dead_letter: u64,
    /// `Expired` rows (TTL passed undelivered): need a human.
    pub expired: u64,
}

/// Row-count gauges read from the database at render time.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    /// One entry per destination (with rows, or configured).
    pub destinations: Vec<DestinationGauges>,
    /// Rows in the inbox; `None` leaves the gauge out.
    pub inbox_size: Option<u64>,
}

/// One metric family's name and help text.
struct Family {
    name: &'static str,
    help: &'static str,
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &Counter); 19] = [
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
                "rf_outbox_retries_total",
                "Attempts that failed and were scheduled again.",
                &self.outbox_retries,
            ),
            (
                "rf_outbox_failed_total",
                "Messages that exceeded max retries (now Failed).",
                &self.outbox_failed,
            ),
            (
                "rf_outbox_dead_lettered_total",
                "Messages refused for good by the receiver (now DeadLetter).",
                &self.outbox_dead_lettered,
            ),
            (
                "rf_outbox_expired_total",
                "Messages that expired before delivery (now Expired).",
                &self.outbox_expired,
            ),
            (
                "rf_outbox_sent_deleted_total",
                "Sent messages deleted after their retention.",
                &self.outbox_sent_deleted,
            ),
            (
                "rf_outbox_discarded_total",
                "Messages discarded by an operator (now Discarded).",
                &self.outbox_discarded,
            ),
            (
                "rf_outbox_undelivered_deleted_total",
                "Failed, DeadLetter, Expired and Discarded messages deleted after their retention.",
                &self.outbox_undelivered_deleted,
            ),
            (
                "rf_inbox_processed_total",
                "Messages processed for the first time.",
                &self.inbox_processed,
            ),
            (
                "rf_inbox_duplicates_total",
                "Duplicate deliveries answered from the inbox.",
                &self.inbox_duplicates,
            ),
            (
                "rf_inbox_signature_failures_total",
                "Deliveries refused with 401.",
                &self.inbox_signature_failures,
            ),
            (
                "rf_inbox_rejected_total",
                "Deliveries refused with another 4xx.",
                &self.inbox_rejected,
            ),
            (
                "rf_inbox_fingerprint_mismatches_total",
                "Accepted deliveries whose fingerprint differs from the hosted one.",
                &self.inbox_fingerprint_mismatches,
            ),
            (
                "rf_inbox_deleted_total",
                "Inbox rows deleted after their retention.",
                &self.inbox_deleted,
            ),
            (
                "rf_inbox_terminated_total",
                "Broker deliveries refused for good and terminated (never redelivered).",
                &self.inbox_terminated,
            ),
            (
                "rf_sqlite_vacuumed_pages_total",
                "Free pages the incremental vacuum returned to the file system.",
                &self.sqlite_vacuumed_pages,
            ),
            (
                "rf_backups_total",
                "Backups of the database file written (scheduled and on demand).",
                &self.backups,
            ),
            (
                "rf_backup_failures_total",
                "Backups of the database file that failed.",
                &self.backup_failures,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                counter.get()
            );
        }
        for (name, help, gauge) in [
            (
                "rf_backup_last_success_timestamp_seconds",
                "When the last backup was written (Unix time; 0 before the first).",
                &self.backup_last_success,
            ),
            (
                "rf_backup_last_size_bytes",
                "Size of the last backup written.",
                &self.backup_last_size,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                gauge.get()
            );
        }
        render_destination_gauges(&mut out, &gauges.destinations);
        if let Some(size) = gauges.inbox_size {
            let _ = writeln!(
                out,
                "# HELP rf_inbox_messages Rows in the inbox (processed messages kept for de-duplication).\n\
                 # TYPE rf_inbox_messages gauge\nrf_inbox_messages {size}"
            );
        }
        self.outbox_send_duration.render(
            &mut out,
            "rf_outbox_send_duration_seconds",
            "Time to send a message (transport latency).",
        );
        self.inbox_process_duration.render(
            &mut out,
            "rf_inbox_process_duration_seconds",
            "Time to process an incoming message (handler and inbox commit).",
        );
        out
    }
}

fn render_destination_gauges(out: &mut String, destinations: &[DestinationGauges]) {
    let pending = Family {
        name: "rf_outbox_pending_messages",
        help: "Messages waiting for delivery (Pending or Sending), per destination.",
    };
    let oldest = Family {
        name: "rf_outbox_oldest_pending_age_seconds",
        help: "Age of the oldest message waiting for delivery, per destination (0 when none waits).",
    };
    let scheduled = Family {
        name: "rf_outbox_scheduled_messages",
        help: "Durable timers: messages not due yet (deliver_at ahead), per destination.",
    };
    let attention = Family {
        name: "rf_outbox_attention_messages",
        help: "Messages that need a human (Failed, DeadLetter, Expired), per destination and status.",
    };
    let header = |out: &mut String, family: &Family| {
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} gauge",
            family.name, family.help, family.name
        );
    };
    header(out, &pending);
    for d in destinations {
        let label = label_value(&d.destination);
        let _ = writeln!(
            out,
            "{}{{destination=\"{label}\"}} {}",
            pending.name, d.pending
        );
    }
    header(out, &scheduled);
    for d in destinations {
        let label = label_value(&d.destination);
        let _ = writeln!(
            out,
            "{}{{destination=\"{label}\"}} {}",
            scheduled.name, d.scheduled
        );
    }
    header(out, &oldest);
    for d in destinations {
        let label = label_value(&d.destination);
        let age = d.oldest_pending_age_ms.unwrap_or(0).max(0) as f64 / 1000.0;
        let _ = writeln!(out, "{}{{destination=\"{label}\"}} {age}", oldest.name);
    }
    header(out, &attention);
    for d in destinations {
        let label = label_value(&d.destination);
        for (status, value) in [
            ("Failed", d.failed),
            ("DeadLetter", d.dead_letter),
            ("Expired", d.expired),
        ] {
            let _ = writeln!(
                out,
                "{}{{destination=\"{label}\",status=\"{status}\"}} {value}",
                attention.name
            );
        }
    }
}

/// A label value escaped as the text format requires (`\`, `"`, newline).
fn label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_buckets_are_in_micros_and_never_exceed_the_count() {
        let histogram = DurationHistogram::default();
        histogram.observe(std::time::Duration::from_micros(80));
        histogram.observe(std::time::Duration::from_millis(3));
        histogram.observe(std::time::Duration::from_secs(30));
        let buckets = histogram.cumulative_micros();
        assert_eq!(buckets.len(), BUCKETS_SECONDS.len());
        assert_eq!(buckets[0], [100, 1]);
        assert_eq!(buckets[5], [5_000, 2]);
        // The 30 s one is over the last bound: counted, in no bucket.
        assert_eq!(buckets[14], [10_000_000, 2]);
        assert_eq!(histogram.count(), 3);
    }

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let metrics = Metrics::default();
        metrics.outbox_sent.add(3);
        metrics
            .inbox_process_duration
            .observe(std::time::Duration::from_micros(700));
        let text = metrics.render(&Gauges {
            destinations: vec![DestinationGauges {
                destination: "hr \"main\"".into(),
                pending: 7,
                oldest_pending_age_ms: Some(1_500),
                failed: 1,
                ..Default::default()
            }],
            inbox_size: None,
        });
        assert!(text.contains("rf_outbox_sent_total 3\n"), "{text}");
        assert!(
            text.contains("rf_outbox_pending_messages{destination=\"hr \\\"main\\\"\"} 7\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "rf_outbox_oldest_pending_age_seconds{destination=\"hr \\\"main\\\"\"} 1.5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "rf_outbox_attention_messages{destination=\"hr \\\"main\\\"\",status=\"Failed\"} 1\n"
            ),
            "{text}"
        );
        assert!(!text.contains("rf_inbox_messages "), "{text}");
        assert!(
            text.contains("rf_inbox_process_duration_seconds_bucket{le=\"0.0005\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("rf_inbox_process_duration_seconds_bucket{le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("rf_inbox_process_duration_seconds_sum 0.0007\n"),
            "{text}"
        );
        assert!(
            text.contains("rf_inbox_process_duration_seconds_count 1\n"),
            "{text}"
        );
        // Prometheus naming: no counter without `_total`, no `_ms`.
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let mut words = line.split(' ').skip(2);
            let (name, kind) = (words.next().unwrap(), words.next().unwrap());
            assert!(!name.ends_with("_ms"), "{line}");
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        }
    }
}
