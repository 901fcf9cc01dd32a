//! Messages sent per minute and the p50/p99 send → answer latency of an
//! instance, from two of its `/_rf/health` answers in a row: the runtime
//! reports counters since it started (`sends`: messages sent, attempts
//! timed, cumulative latency buckets, as Prometheus has them), and the
//! aggregator's interval is the window.
//!
//! A quantile is known to its bucket only: it is shown as "at most" the
//! bucket's upper bound (or "over" the last bound), never as a made-up
//! point between bounds.
//!
//! Pure functions: no query, no request.

use crate::aggregator::RemoteSends;

/// A latency quantile, as precise as the buckets allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantile {
    /// At most this many µs (the upper bound of its bucket).
    AtMost(u64),
    /// Over this many µs (the last bound).
    Over(u64),
}

impl Quantile {
    /// As stored: µs, negative for [`Quantile::Over`].
    pub fn stored(self) -> i64 {
        match self {
            Quantile::AtMost(us) => i64::try_from(us).unwrap_or(i64::MAX),
            Quantile::Over(us) => -i64::try_from(us).unwrap_or(i64::MAX),
        }
    }

    /// From [`Quantile::stored`].
    pub fn from_stored(value: i64) -> Self {
        if value < 0 {
            Quantile::Over(value.unsigned_abs())
        } else {
            Quantile::AtMost(value.unsigned_abs())
        }
    }

    /// `≤ 2.5 ms`, `≤ 1 s`, `> 10 s`.
    pub fn shown(self) -> String {
        let (sign, us) = match self {
            Quantile::AtMost(us) => ("≤", us),
            Quantile::Over(us) => (">", us),
        };
        let text = if us >= 1_000_000 {
            format!("{} s", trim(us as f64 / 1e6))
        } else if us >= 1_000 {
            format!("{} ms", trim(us as f64 / 1e3))
        } else {
            format!("{us} µs")
        };
        format!("{sign} {text}")
    }
}

/// `2.5`, `10`: no trailing zeros.
fn trim(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// What happened between two answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Rates {
    /// Messages acknowledged per minute over the interval.
    pub sent_per_minute: f64,
    /// The median send → answer latency of the interval's attempts; `None`
    /// when none was timed.
    pub p50: Option<Quantile>,
    /// The 99th percentile of the same.
    pub p99: Option<Quantile>,
}

/// The rates between `before` (at `before_ms`) and `after`; `None` when
/// they cannot be compared: no time between them, a counter went down
/// (the instance restarted: its counters start again at 0, and what it
/// sent between the two answers is unknown), or the buckets differ.
pub fn between(
    before: &RemoteSends,
    before_ms: i64,
    after: &RemoteSends,
    after_ms: i64,
) -> Option<Rates> {
    let elapsed_ms = after_ms.checked_sub(before_ms).filter(|ms| *ms > 0)?;
    let sent = after.sent.checked_sub(before.sent)?;
    let timed = after.timed.checked_sub(before.timed)?;
    if before.latency_buckets_micros.len() != after.latency_buckets_micros.len() {
        return None;
    }
    let mut buckets = Vec::with_capacity(after.latency_buckets_micros.len());
    for (old, new) in before
        .latency_buckets_micros
        .iter()
        .zip(&after.latency_buckets_micros)
    {
        if old[0] != new[0] {
            return None;
        }
        buckets.push([new[0], new[1].checked_sub(old[1])?]);
    }
    Some(Rates {
        sent_per_minute: sent as f64 * 60_000.0 / elapsed_ms as f64,
        p50: quantile(&buckets, timed, 0.50),
        p99: quantile(&buckets, timed, 0.99),
    })
}

/// The `q` quantile of `total` attempts in cumulative `buckets`: the upper
/// bound of the first bucket that holds the attempt of rank ⌈q·total⌉.
fn quantile(buckets: &[[u64; 2]], total: u64, q: f64) -> Option<Quantile> {
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    match buckets.iter().find(|[_, count]| *count >= rank) {
        Some([bound, _]) => Some(Quantile::AtMost(*bound)),
        None => buckets.last().map(|[bound, _]| Quantile::Over(*bound)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(sent: u64, buckets: &[[u64; 2]]) -> RemoteSends {
        RemoteSends {
            sent,
            timed: buckets.last().map_or(0, |b| b[1]) + 1,
            latency_buckets_micros: buckets.to_vec(),
        }
    }

    #[test]
    fn rates_come_from_the_difference_of_two_answers() {
        let before = sends(100, &[[1_000, 10], [10_000, 20], [100_000, 20]]);
        // 120 sent in 60 s; of 100 new attempts, 90 at most 1 ms, 98 at
        // most 10 ms, all 100 at most 100 ms.
        let after = sends(220, &[[1_000, 100], [10_000, 118], [100_000, 120]]);
        let rates = between(&before, 0, &after, 60_000).expect("comparable");
        assert_eq!(rates.sent_per_minute, 120.0);
        assert_eq!(rates.p50, Some(Quantile::AtMost(1_000)));
        assert_eq!(rates.p99, Some(Quantile::AtMost(100_000)));
        let slow = sends(220, &[[1_000, 10], [10_000, 20], [100_000, 20]]);
        let slow = RemoteSends {
            timed: before.timed + 5,
            ..slow
        };
        let rates = between(&before, 0, &slow, 30_000).expect("comparable");
        assert_eq!(rates.sent_per_minute, 240.0);
        assert_eq!(rates.p50, Some(Quantile::Over(100_000)));
        // Nothing timed: no quantile.
        let idle = between(&before, 0, &before, 60_000).expect("comparable");
        assert_eq!((idle.sent_per_minute, idle.p50), (0.0, None));
    }

    #[test]
    fn a_restart_or_other_buckets_compare_nothing() {
        let before = sends(100, &[[1_000, 10]]);
        assert_eq!(between(&before, 0, &sends(5, &[[1_000, 10]]), 1), None);
        assert_eq!(between(&before, 0, &sends(100, &[[2_000, 10]]), 1), None);
        assert_eq!(between(&before, 0, &sends(100, &[]), 1), None);
        assert_eq!(between(&before, 5, &before, 5), None);
    }

    #[test]
    fn quantiles_are_shown_as_their_bucket() {
        assert_eq!(Quantile::AtMost(2_500).shown(), "≤ 2.5 ms");
        assert_eq!(Quantile::AtMost(250).shown(), "≤ 250 µs");
        assert_eq!(Quantile::Over(10_000_000).shown(), "> 10 s");
        for q in [Quantile::AtMost(100), Quantile::Over(10_000_000)] {
            assert_eq!(Quantile::from_stored(q.stored()), q);
        }
    }
}
