//! The health policy: how the store's raw groups fold into the counts
//! ([`OutboxStats`]) and the Prometheus gauges, when a service is `healthy`,
//! `warning` or `critical`, and the warning of a manual retry beyond the
//! dedup horizon. Written once for both stores.
//!
//! Pure functions over data: it never runs a query or serves a route, so
//! every rule here is tested without a database.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{
    DecommissionedVersion, Health, HealthStatus, HealthThresholds, OutboxStats, SendCounters,
    UnsentGroup, rfc3339,
};
use crate::circuit::DestinationState;
use crate::metrics::DestinationGauges;
use crate::outbox::Status;
use crate::store::sqlite as db;

/// Adds the decommissioned versions to `health`; held rows turn a healthy
/// service to `warning`, with a reason per version.
pub fn with_decommissioned(mut health: Health, versions: Vec<DecommissionedVersion>) -> Health {
    for version in &versions {
        if version.held > 0 {
            health.reasons.push(format!(
                "{} v{} is decommissioned: {} outbox message(s) held until it is re-commissioned",
                version.interface, version.version, version.held
            ));
            if health.status == HealthStatus::Healthy {
                health.status = HealthStatus::Warning;
            }
        }
    }
    health.decommissioned = versions;
    health
}

/// The one folding of the (destination, status) groups into the counts.
pub(super) fn fold_unsent(
    groups: Vec<UnsentGroup>,
    last_sent: Option<i64>,
    now_ms: i64,
) -> OutboxStats {
    let mut stats = OutboxStats::default();
    let mut oldest_pending: Option<i64> = None;
    for group in groups {
        // Timers not due yet are neither backlog nor part of its age.
        let waiting = group.rows.saturating_sub(group.scheduled);
        stats.scheduled += group.scheduled;
        if waiting == 0 {
            continue;
        }
        if matches!(group.status, Status::Pending | Status::Sending) {
            let oldest = group.oldest_created_at;
            oldest_pending = Some(oldest_pending.map_or(oldest, |o| o.min(oldest)));
        }
        if let Some(total) = status_total(&mut stats, group.status) {
            *total += waiting;
        }
        *stats
            .destinations
            .entry(group.destination)
            .or_default()
            .entry(group.status)
            .or_default() += waiting;
    }
    stats.last_sent_at = last_sent.map(rfc3339);
    stats.oldest_pending_age_ms = oldest_pending.map(|created| (now_ms - created).max(0));
    stats
}

/// The counter of an unsent status (`Sent` rows are counted on their own).
fn status_total(stats: &mut OutboxStats, status: Status) -> Option<&mut u64> {
    Some(match status {
        Status::Pending => &mut stats.pending,
        Status::Sending => &mut stats.sending,
        // Neither needs a human: not in the unsent counts.
        Status::Sent | Status::Discarded => return None,
        Status::Failed => &mut stats.failed,
        Status::DeadLetter => &mut stats.dead_letter,
        Status::Expired => &mut stats.expired,
    })
}

/// The traffic light for `stats`.
pub fn health(stats: OutboxStats, thresholds: HealthThresholds) -> Health {
    let mut reasons = Vec::new();
    let mut status = HealthStatus::Healthy;
    if stats.attention() > 0 {
        status = HealthStatus::Critical;
        reasons.push(format!(
            "{} outbox message(s) need attention ({} failed, {} dead-lettered, {} expired); \
             see GET /_rf/outbox/failed",
            stats.attention(),
            stats.failed,
            stats.dead_letter,
            stats.expired
        ));
    }
    let backlog = stats.pending + stats.sending;
    let mut warn = |reason: String| {
        if status == HealthStatus::Healthy {
            status = HealthStatus::Warning;
        }
        reasons.push(reason);
    };
    if backlog >= thresholds.backlog {
        warn(format!(
            "{backlog} outbox message(s) waiting (threshold {})",
            thresholds.backlog
        ));
    }
    if let Some(age) = stats.oldest_pending_age_ms
        && age >= thresholds.oldest_pending_age.as_millis() as i64
    {
        warn(format!(
            "the oldest waiting message is {} old (threshold {})",
            crate::duration::format_duration(Duration::from_millis(age as u64)),
            crate::duration::format_duration(thresholds.oldest_pending_age),
        ));
    }
    Health {
        status,
        reasons,
        outbox: stats,
        destinations: Vec::new(),
        decommissioned: Vec::new(),
        sends: SendCounters::default(),
    }
}

/// Adds what the dispatcher knows of its destinations to `health`: an
/// unreachable destination (circuit open) and a clock problem each turn a
/// healthy service to `warning`, with a reason.
pub fn with_destinations(mut health: Health, states: Vec<DestinationState>) -> Health {
    let now = db::now_ms();
    for state in &states {
        if let Some(since) = state.open_since_ms {
            health.reasons.push(format!(
                "destination `{}` unreachable for {} (circuit open, probing): {}",
                state.destination,
                crate::duration::format_duration(
                    Duration::from_millis((now - since).max(0) as u64)
                ),
                state.last_problem.as_deref().unwrap_or("no answer")
            ));
        }
        if let Some(problem) = &state.clock_problem {
            health
                .reasons
                .push(format!("destination `{}`: {problem}", state.destination));
        }
        if (state.open_since_ms.is_some() || state.clock_problem.is_some())
            && health.status == HealthStatus::Healthy
        {
            health.status = HealthStatus::Warning;
        }
    }
    health.destinations = states;
    health
}

/// The one folding of the (destination, status) groups into the gauges.
pub(super) fn fold_gauges(
    groups: Vec<UnsentGroup>,
    now_ms: i64,
    configured: &[String],
) -> Vec<DestinationGauges> {
    let mut by_name: BTreeMap<String, DestinationGauges> = configured
        .iter()
        .map(|name| {
            let gauges = DestinationGauges {
                destination: name.clone(),
                ..DestinationGauges::default()
            };
            (name.clone(), gauges)
        })
        .collect();
    for group in groups {
        let gauges =
            by_name
                .entry(group.destination.clone())
                .or_insert_with(|| DestinationGauges {
                    destination: group.destination,
                    ..DestinationGauges::default()
                });
        gauges.scheduled += group.scheduled;
        let count = group.rows.saturating_sub(group.scheduled);
        if count == 0 {
            continue;
        }
        match group.status {
            Status::Pending | Status::Sending => {
                gauges.pending += count;
                let age = (now_ms - group.oldest_created_at).max(0);
                gauges.oldest_pending_age_ms =
                    Some(gauges.oldest_pending_age_ms.map_or(age, |a| a.max(age)));
            }
            Status::Failed => gauges.failed += count,
            Status::DeadLetter => gauges.dead_letter += count,
            Status::Expired => gauges.expired += count,
            Status::Sent | Status::Discarded => {}
        }
    }
    by_name.into_values().collect()
}

/// The warning of a manual retry of `old` messages created before the horizon.
pub(super) fn horizon_warning(old: usize, horizon: Duration) -> Option<String> {
    (old > 0).then(|| {
        format!(
            "{old} of the retried messages were created more than {} ago, beyond the dedup \
             horizon receivers keep by default (inbox.retention less the signature tolerance): \
             a receiver with no record of one refuses it with 422 beyond_dedup_horizon rather \
             than risk processing it twice, and it comes back Failed; check the receiver's \
             effects before sending it another way",
            crate::duration::format_duration(horizon)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> OutboxStats {
        OutboxStats::default()
    }

    fn group(destination: &str, status: Status, rows: u64, oldest: i64) -> UnsentGroup {
        UnsentGroup {
            destination: destination.to_owned(),
            status,
            rows,
            scheduled: 0,
            oldest_created_at: oldest,
        }
    }

    /// Durable timers not due yet are counted apart: no backlog, no age,
    /// no warning, however many.
    #[test]
    fn scheduled_rows_are_not_backlog() {
        let timers = UnsentGroup {
            scheduled: 10_000,
            ..group("reminders", Status::Pending, 10_000, 50_000)
        };
        let mixed = UnsentGroup {
            scheduled: 2,
            ..group("ledger", Status::Pending, 3, 1_000)
        };
        let stats = fold_unsent(vec![timers.clone(), mixed.clone()], None, 10_000);
        assert_eq!((stats.pending, stats.scheduled), (1, 10_002));
        assert_eq!(stats.oldest_pending_age_ms, Some(9_000));
        assert!(!stats.destinations.contains_key("reminders"));
        assert_eq!(stats.destinations["ledger"][&Status::Pending], 1);
        let only_timers = fold_unsent(vec![timers.clone()], None, 10_000);
        assert_eq!(only_timers.oldest_pending_age_ms, None);
        assert_eq!(
            health(only_timers, HealthThresholds::default()).status,
            HealthStatus::Healthy
        );

        let gauges = fold_gauges(vec![timers, mixed], 10_000, &[]);
        assert_eq!(
            (
                gauges[0].pending,
                gauges[0].scheduled,
                gauges[0].oldest_pending_age_ms
            ),
            (1, 2, Some(9_000))
        );
        assert_eq!(
            (
                gauges[1].pending,
                gauges[1].scheduled,
                gauges[1].oldest_pending_age_ms
            ),
            (0, 10_000, None)
        );
    }

    /// The one folding both stores' groups go through.
    #[test]
    fn groups_fold_into_counts_and_gauges() {
        let groups = vec![
            group("ledger", Status::Pending, 3, 1_000),
            group("ledger", Status::Sending, 1, 500),
            group("billing", Status::Pending, 2, 4_000),
            group("billing", Status::Failed, 4, 100),
            group("audit", Status::Expired, 1, 100),
        ];
        let stats = fold_unsent(groups.clone(), Some(9_000), 10_000);
        assert_eq!(
            (stats.pending, stats.sending, stats.failed, stats.expired),
            (5, 1, 4, 1)
        );
        assert_eq!(
            stats.oldest_pending_age_ms,
            Some(9_500),
            "ledger's Sending row"
        );
        assert_eq!(stats.last_sent_at.as_deref(), Some("1970-01-01T00:00:09Z"));
        assert_eq!(stats.sent, None);
        assert_eq!(stats.destinations["ledger"][&Status::Pending], 3);
        assert_eq!(stats.destinations["billing"][&Status::Failed], 4);

        let gauges = fold_gauges(groups, 10_000, &["ledger".into(), "idle".into()]);
        let names: Vec<&str> = gauges.iter().map(|g| g.destination.as_str()).collect();
        assert_eq!(names, ["audit", "billing", "idle", "ledger"]);
        let ledger = &gauges[3];
        assert_eq!(
            (ledger.pending, ledger.oldest_pending_age_ms),
            (4, Some(9_500))
        );
        assert_eq!((gauges[1].pending, gauges[1].failed), (2, 4));
        assert_eq!(gauges[0].expired, 1);
        assert_eq!(
            gauges[2],
            DestinationGauges {
                destination: "idle".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn health_is_a_traffic_light() {
        let thresholds = HealthThresholds::default();
        assert_eq!(health(stats(), thresholds).status, HealthStatus::Healthy);

        let backlog = OutboxStats {
            pending: 499,
            sending: 1,
            ..stats()
        };
        let verdict = health(backlog, thresholds);
        assert_eq!(verdict.status, HealthStatus::Warning);
        assert!(verdict.reasons[0].contains("500 outbox message(s) waiting"));

        let stuck = OutboxStats {
            pending: 1,
            oldest_pending_age_ms: Some(180_000),
            ..stats()
        };
        let verdict = health(stuck, thresholds);
        assert_eq!(verdict.status, HealthStatus::Warning);
        assert!(
            verdict.reasons[0].contains("3m old"),
            "{:?}",
            verdict.reasons
        );

        let dead = OutboxStats {
            pending: 600,
            dead_letter: 1,
            ..stats()
        };
        let verdict = health(dead, thresholds);
        assert_eq!(verdict.status, HealthStatus::Critical);
        assert_eq!(verdict.reasons.len(), 2, "{:?}", verdict.reasons);
    }
}
