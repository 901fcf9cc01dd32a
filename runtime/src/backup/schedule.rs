//! Scheduled backups: [`BackupSchedule::spawn`] takes a backup every
//! `backup.interval`, on the blocking pool, until its handle is shut down.
//!
//! The first one is due `interval` after the newest backup already in the
//! folder (at once when there is none that recent), so a service that
//! restarts often still backs up at the interval. Each attempt, failed or
//! not, waits a full interval for the next. It never runs two at once: an
//! on-demand backup in progress makes the scheduled one skip (logged).

use std::time::Duration;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::{BackupError, Backups};

/// The running schedule; [`shutdown`](Self::shutdown) stops it.
#[derive(Debug)]
pub struct BackupScheduleHandle {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl BackupScheduleHandle {
    /// Stops the schedule; a backup being written is given up between two
    /// steps (its partial file deleted, nothing kept).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// Backups on a schedule.
pub struct BackupSchedule;

impl BackupSchedule {
    /// Starts a task that writes a backup with `backups` every `interval`
    /// (at least 10 ms apart). Call it inside a tokio runtime.
    pub fn spawn(backups: Backups, interval: Duration) -> BackupScheduleHandle {
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(backups, interval, cancel.clone()));
        BackupScheduleHandle { cancel, task }
    }
}

async fn run(backups: Backups, interval: Duration, cancel: CancellationToken) {
    let interval = interval.max(Duration::from_millis(10));
    let newest = backups
        .list()
        .ok()
        .and_then(|list| list.last().map(|(at, _)| *at));
    let mut wait = first_wait(newest, Timestamp::now(), interval);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let attempt = {
            let backups = backups.clone();
            let stop = cancel.clone();
            tokio::task::spawn_blocking(move || backups.run_until(&|| stop.is_cancelled()))
        };
        match attempt.await {
            Ok(Err(BackupError::Running)) => {
                tracing::info!("scheduled backup skipped: an on-demand backup is being written");
            }
            // Written or failed: `Backups::run` logged and counted it.
            Ok(_) => {}
            Err(error) => tracing::warn!("backup task failed: {error}"),
        }
        wait = interval;
    }
}

/// How long to wait for the first backup: until `interval` after the newest
/// one (`None`: there is none), at once if that is past.
fn first_wait(newest: Option<Timestamp>, now: Timestamp, interval: Duration) -> Duration {
    let Some(newest) = newest else {
        return Duration::ZERO;
    };
    let age = Duration::try_from(now.duration_since(newest)).unwrap_or(Duration::ZERO);
    interval.saturating_sub(age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_backup_follows_the_newest_one_by_an_interval() {
        let now: Timestamp = "2026-11-29T06:30:00Z".parse().unwrap();
        let hour = Duration::from_secs(3600);
        assert_eq!(first_wait(None, now, hour), Duration::ZERO);
        let twenty_minutes_ago: Timestamp = "2026-11-29T06:10:00Z".parse().unwrap();
        assert_eq!(
            first_wait(Some(twenty_minutes_ago), now, hour),
            Duration::from_secs(40 * 60)
        );
        let yesterday: Timestamp = "2026-11-28T06:30:00Z".parse().unwrap();
        assert_eq!(first_wait(Some(yesterday), now, hour), Duration::ZERO);
        // A backup stamped in the future (a clock set back) waits one interval.
        let ahead: Timestamp = "2026-11-29T07:00:00Z".parse().unwrap();
        assert_eq!(first_wait(Some(ahead), now, hour), hour);
    }
}
