//! The dashboard's pre-aggregated health: each instance's latest check
//! (`instance_health`, one row per instance) and its checks rolled up in
//! [`BUCKET`]-long buckets (`health_buckets`: the highest outbox depth and
//! the worst colour of each), written by the aggregator with every check
//! ([`apply`]). A page load then reads one row per instance and at most
//! one row per bucket of each instance it draws, however long the raw
//! history (`health_checks`) is. It never reads the raw history.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension as _, params};

use crate::aggregator::{Check, Colour, Point, RETENTION, RemoteSends, Target};
use crate::throughput::{self, Quantile};

/// The width of one sparkline bucket.
pub const BUCKET: Duration = Duration::from_secs(300);

fn rank(colour: Colour) -> i64 {
    match colour {
        Colour::Healthy => 0,
        Colour::Warning => 1,
        Colour::Critical => 2,
    }
}

fn colour_of_rank(rank: i64) -> &'static str {
    match rank {
        0 => "healthy",
        1 => "warning",
        _ => "critical",
    }
}

/// Stores `check` as the latest one of `instance_id` and rolls it into its
/// bucket (pruning buckets older than the retention); returns the colour
/// of the check before it, `None` for the first one.
pub fn apply(
    conn: &Connection,
    instance_id: &str,
    check: &Check,
    now_ms: i64,
) -> rusqlite::Result<Option<String>> {
    let previous: Option<(String, i64, Option<String>)> = conn
        .query_row(
            "SELECT colour, checked_at, sends FROM instance_health WHERE instance_id = ?1",
            params![instance_id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()?;
    let outbox = check.health.as_ref().map(|h| &h.outbox);
    let depth = outbox.map(|o| (o.pending + o.sending) as i64);
    let sends = check.health.as_ref().and_then(|h| h.sends.as_ref());
    let before = previous
        .as_ref()
        .and_then(|(_, at, sends)| Some((*at, sends.as_deref()?)))
        .and_then(|(at, text)| Some((at, serde_json::from_str::<RemoteSends>(text).ok()?)));
    let rates = match (before, sends) {
        (Some((at, before)), Some(after)) => throughput::between(&before, at, after, now_ms),
        _ => None,
    };
    let decommissioned = check
        .health
        .as_ref()
        .filter(|h| !h.decommissioned.is_empty())
        .and_then(|h| serde_json::to_string(&h.decommissioned).ok());
    conn.execute(
        "INSERT OR REPLACE INTO instance_health (instance_id, checked_at, colour, reported, \
         depth, dead_letter, attention, oldest_pending_age_ms, reasons, sends, \
         sent_per_minute, p50_us, p99_us, decommissioned) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            instance_id,
            now_ms,
            check.colour.as_str(),
            check.health.as_ref().map(|h| h.status.clone()),
            depth,
            outbox.map(|o| o.dead_letter as i64),
            outbox.map(|o| (o.failed + o.dead_letter + o.expired) as i64),
            outbox.and_then(|o| o.oldest_pending_age_ms),
            serde_json::to_string(&check.reasons).unwrap_or_else(|_| "[]".into()),
            sends.and_then(|s| serde_json::to_string(s).ok()),
            rates.as_ref().map(|r| r.sent_per_minute),
            rates.as_ref().and_then(|r| r.p50).map(Quantile::stored),
            rates.as_ref().and_then(|r| r.p99).map(Quantile::stored),
            decommissioned,
        ],
    )?;
    let width = BUCKET.as_millis() as i64;
    conn.execute(
        // The highest depth: NULL (unreachable) only while no check of the
        // bucket reached the instance.
        "INSERT INTO health_buckets (instance_id, bucket, depth, worst) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (instance_id, bucket) DO UPDATE SET \
         depth = CASE WHEN depth IS NULL THEN excluded.depth \
                      WHEN excluded.depth IS NULL THEN depth \
                      ELSE MAX(depth, excluded.depth) END, \
         worst = MAX(worst, excluded.worst)",
        params![
            instance_id,
            now_ms - now_ms.rem_euclid(width),
            depth,
            rank(check.colour)
        ],
    )?;
    conn.execute(
        "DELETE FROM health_buckets WHERE instance_id = ?1 AND bucket < ?2",
        params![instance_id, now_ms - RETENTION.as_millis() as i64 - width],
    )?;
    Ok(previous.map(|(colour, _, _)| colour))
}

/// The buckets of an instance since `since_ms`, oldest first, as sparkline
/// points (each at its bucket's start).
pub fn sparkline_points(
    conn: &Connection,
    instance_id: &str,
    since_ms: i64,
) -> rusqlite::Result<Vec<Point>> {
    let width = BUCKET.as_millis() as i64;
    let mut statement = conn.prepare_cached(
        "SELECT bucket, depth, worst FROM health_buckets \
         WHERE instance_id = ?1 AND bucket >= ?2 ORDER BY bucket",
    )?;
    statement
        .query_map(
            params![instance_id, since_ms - since_ms.rem_euclid(width)],
            |row| {
                Ok(Point {
                    at_ms: row.get(0)?,
                    depth: row.get::<_, Option<i64>>(1)?.map(|v| v as u64),
                    colour: colour_of_rank(row.get(2)?).to_owned(),
                })
            },
        )?
        .collect()
}

/// Logs a change of an instance's colour, once: `previous` is the colour of
/// its check before `check` (`None` for its first, logged only when it is
/// not healthy). A poll that finds the same colour logs nothing, however
/// many instances stay unhealthy.
pub fn log_change(target: &Target, previous: Option<&str>, check: &Check) {
    let now = check.colour.as_str();
    if previous == Some(now) || (previous.is_none() && check.colour == Colour::Healthy) {
        return;
    }
    let was = previous.unwrap_or("unchecked");
    if check.colour == Colour::Healthy {
        tracing::info!(
            instance = %target.instance_id,
            base_url = %target.base_url,
            was,
            "instance healthy again"
        );
    } else {
        tracing::warn!(
            instance = %target.instance_id,
            base_url = %target.base_url,
            colour = now,
            was,
            reasons = ?check.reasons,
            // The cause behind a generic "unreachable" (refused, timeout,
            // a status): for the operator's log, never for the page.
            detail = check.detail.as_deref().unwrap_or(""),
            "instance not healthy"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::{RemoteHealth, RemoteOutbox, judge, last_health, record};

    fn check(status: &str, pending: u64) -> Check {
        judge(Ok(RemoteHealth {
            status: status.to_owned(),
            reasons: Vec::new(),
            outbox: RemoteOutbox {
                pending,
                ..RemoteOutbox::default()
            },
            ..RemoteHealth::default()
        }))
    }

    #[test]
    fn two_answers_in_a_row_give_the_rates_and_a_restart_gives_none() {
        use crate::aggregator::{RemoteDecommissioned, RemoteSends};
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = crate::store::open(&dir.path().join("r.db")).expect("open");
        conn.execute(
            "INSERT INTO instances (instance_id, service, base_url, registered_at, last_seen_at) \
             VALUES ('a', 's', 'http://x', 0, 0)",
            [],
        )
        .expect("instance");
        let answer = |sent: u64, fast: u64| {
            let mut check = check("healthy", 0);
            let health = check.health.as_mut().expect("answered");
            health.sends = Some(RemoteSends {
                sent,
                timed: fast + 1,
                latency_buckets_micros: vec![[1_000, fast], [10_000, fast + 1]],
            });
            health.decommissioned = vec![RemoteDecommissioned {
                interface: "hr.Api".into(),
                version: 1,
                held: 3,
            }];
            check
        };
        let stored = |conn: &Connection| {
            conn.query_row(
                "SELECT sent_per_minute, p50_us, p99_us, decommissioned FROM instance_health",
                [],
                |row| {
                    Ok((
                        row.get::<_, Option<f64>>(0)?,
                        row.get::<_, Option<i64>>(1)?,
                        row.get::<_, Option<i64>>(2)?,
                        row.get::<_, Option<String>>(3)?,
                    ))
                },
            )
            .expect("row")
        };
        record(&conn, "a", &answer(10, 10), 0).expect("first");
        let (rate, ..) = stored(&conn);
        assert_eq!(rate, None, "one answer: no rate");
        // 30 more sent in 30 s; 99 more attempts, all at most 1 ms.
        record(&conn, "a", &answer(40, 109), 30_000).expect("second");
        let (rate, p50, p99, decommissioned) = stored(&conn);
        assert_eq!(rate, Some(60.0));
        assert_eq!((p50, p99), (Some(1_000), Some(1_000)));
        assert!(decommissioned.expect("stored").contains("hr.Api"));
        // A restart: the counters start again, no rate for this interval.
        record(&conn, "a", &answer(2, 1), 60_000).expect("restarted");
        assert_eq!(stored(&conn).0, None);
        record(&conn, "a", &answer(62, 1), 120_000).expect("after");
        assert_eq!(stored(&conn).0, Some(60.0));
    }

    #[test]
    fn checks_roll_up_into_buckets_of_the_highest_depth_and_the_worst_colour() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = crate::store::open(&dir.path().join("r.db")).expect("open");
        conn.execute(
            "INSERT INTO instances (instance_id, service, base_url, registered_at, last_seen_at) \
             VALUES ('a', 's', 'http://x', 0, 0)",
            [],
        )
        .expect("instance");
        let width = BUCKET.as_millis() as i64;
        let start = 1_000 * width;
        let minute = 60_000;
        assert_eq!(
            record(&conn, "a", &check("healthy", 5), start).expect("1"),
            None
        );
        let previous = record(&conn, "a", &check("warning", 70), start + minute).expect("2");
        assert_eq!(previous.as_deref(), Some("healthy"));
        let unreachable = judge(Err("connection refused".into()));
        record(&conn, "a", &unreachable, start + 2 * minute).expect("3");
        record(&conn, "a", &check("healthy", 2), start + width + minute).expect("4");
        let points = sparkline_points(&conn, "a", start - 1).expect("points");
        let seen: Vec<(i64, Option<u64>, &str)> = points
            .iter()
            .map(|p| (p.at_ms, p.depth, p.colour.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (start, Some(70), "critical"),
                (start + width, Some(2), "healthy")
            ]
        );
        // The latest check is one row.
        let last = last_health(&conn, "a").expect("read").expect("some");
        assert_eq!(
            (last.status.as_str(), last.outbox_depth),
            ("healthy", Some(2))
        );
        // Buckets older than the retention go.
        let later = start + RETENTION.as_millis() as i64 + 3 * width;
        record(&conn, "a", &check("healthy", 1), later).expect("5");
        let left = sparkline_points(&conn, "a", 0).expect("points");
        assert_eq!(left.len(), 1, "{left:?}");
    }
}
