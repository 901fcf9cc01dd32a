//! Which registered instances are active: an instance that has not been
//! seen (registered or heartbeated) for [`Liveness::missed`] of its
//! heartbeat intervals is *gone*. A gone instance stays in the directory
//! and its health history, shown as gone, but no longer counts as a
//! provider in the manifest scan (registrations and `POST
//! /v1/deploy-check`), in the dashboard's totals, or for the health
//! aggregator; its next heartbeat or registration brings it back.
//!
//! The interval is the one the instance gave at registration
//! (`heartbeatMs`), else the registry's [`Liveness::heartbeat`]. Whether an
//! instance is gone is computed from `last_seen_at` at each read, so it
//! never depends on a background task; the aggregator's round only
//! notes it (`gone_at`) to log each departure once ([`sweep`]).

use std::time::Duration;

use rusqlite::{Connection, params};

/// How many heartbeats an instance may miss before it is gone, by default.
pub const DEFAULT_MISSED_HEARTBEATS: u32 = 3;
/// The heartbeat interval of an instance that did not say its own (the
/// runtime's default).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);
/// The shortest and longest `heartbeatMs` a registration may give.
pub const HEARTBEAT_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// The liveness rule of a registry (its `--missed-heartbeats` and
/// `--heartbeat-interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Heartbeats an instance may miss before it is gone (at least 1).
    pub missed: u32,
    /// The interval of an instance that did not say its own.
    pub heartbeat: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            missed: DEFAULT_MISSED_HEARTBEATS,
            heartbeat: DEFAULT_HEARTBEAT,
        }
    }
}

impl Liveness {
    /// The rule as of `now_ms`.
    pub fn at(self, now_ms: i64) -> ActiveAt {
        ActiveAt {
            now_ms,
            missed: i64::from(self.missed.max(1)),
            default_ms: self.heartbeat.as_millis().min(i64::MAX as u128) as i64,
        }
    }
}

/// [`Liveness`] at one instant: what the queries compare `last_seen_at` with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveAt {
    /// The instant, in milliseconds since the Unix epoch.
    pub now_ms: i64,
    missed: i64,
    default_ms: i64,
}

impl ActiveAt {
    /// An SQL condition true for an active row of `instances` named
    /// `alias`. Only integers of this registry go into the text.
    pub fn sql(&self, alias: &str) -> String {
        format!(
            "({alias}.last_seen_at >= {} - {} * COALESCE({alias}.heartbeat_ms, {}))",
            self.now_ms, self.missed, self.default_ms
        )
    }

    /// True when an instance last seen at `last_seen_ms`, heartbeating
    /// every `heartbeat_ms` (if it said), is active.
    pub fn is_active(&self, last_seen_ms: i64, heartbeat_ms: Option<i64>) -> bool {
        let interval = heartbeat_ms.unwrap_or(self.default_ms);
        last_seen_ms
            >= self
                .now_ms
                .saturating_sub(self.missed.saturating_mul(interval))
    }
}

/// An instance that just went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    /// Its service id.
    pub service: String,
    /// Its instance id.
    pub instance_id: String,
    /// Its registered base URL.
    pub base_url: String,
    /// When it was last seen, in milliseconds since the Unix epoch.
    pub last_seen_ms: i64,
}

/// Notes every instance that went since the last sweep (`gone_at`) and
/// returns them, so that each departure is logged once.
pub fn sweep(conn: &Connection, at: &ActiveAt) -> rusqlite::Result<Vec<Departed>> {
    let mut statement = conn.prepare(&format!(
        "UPDATE instances SET gone_at = ?1 WHERE gone_at IS NULL AND NOT {} \
         RETURNING service, instance_id, base_url, last_seen_at",
        at.sql("instances")
    ))?;
    let mut departed = statement
        .query_map(params![at.now_ms], |row| {
            Ok(Departed {
                service: row.get(0)?,
                instance_id: row.get(1)?,
                base_url: row.get(2)?,
                last_seen_ms: row.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    departed.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    Ok(departed)
}

/// Logs the departures of a [`sweep`], one line each.
pub fn log_departures(departed: &[Departed], liveness: &Liveness) {
    for gone in departed {
        tracing::warn!(
            service = %gone.service,
            instance = %gone.instance_id,
            base_url = %gone.base_url,
            last_seen_at = %crate::store::rfc3339(gone.last_seen_ms),
            missed = liveness.missed,
            "instance gone: it missed its heartbeats; it no longer counts as a provider"
        );
    }
}

/// The active instances, for the health aggregator (a gone one is not
/// polled: its history keeps its last check).
pub fn active_targets(
    conn: &Connection,
    at: &ActiveAt,
) -> rusqlite::Result<Vec<crate::aggregator::Target>> {
    let mut statement = conn.prepare(&format!(
        "SELECT instance_id, base_url, diagnostics_token FROM instances \
         WHERE {} ORDER BY instance_id",
        at.sql("instances")
    ))?;
    statement
        .query_map([], crate::aggregator::Target::of_row)?
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_gone_after_the_missed_intervals() {
        let at = Liveness {
            missed: 3,
            heartbeat: Duration::from_secs(30),
        }
        .at(1_000_000);
        assert!(at.is_active(1_000_000 - 90_000, None));
        assert!(!at.is_active(1_000_000 - 90_001, None));
        // Its own interval wins over the registry's.
        assert!(at.is_active(1_000_000 - 290_000, Some(100_000)));
        assert!(!at.is_active(1_000_000 - 3_001, Some(1_000)));
        assert_eq!(
            at.sql("i"),
            "(i.last_seen_at >= 1000000 - 3 * COALESCE(i.heartbeat_ms, 30000))"
        );
    }
}
