//! Retention: removes rows that have served their purpose, on a schedule.
//!
//! One clean-up pass ([`store::sqlite::cleanup`](crate::store::sqlite::cleanup)
//! and its PostgreSQL twins) does four things, each in short
//! transactions of at most [`CLEANUP_BATCH`] rows so the dispatcher and the
//! receiver's writer never wait long behind it:
//!
//! 1. deletes `Sent` outbox rows older than `outbox.sent_retention` (7 days);
//! 2. marks `Pending` outbox rows past their TTL as `Expired` (the dispatcher
//!    also does this when it finds them due; the pass makes the counts right
//!    for rows whose next retry lies further ahead). Rows of an interface
//!    version whose failure handler a dispatcher runs
//!    ([`Retention::spawn_with_failure_handlers`], which a
//!    [`Host`](crate::host::Host) uses) are made due at once instead: the
//!    dispatcher expires them in the transaction where the handler runs, so
//!    every `Expired` row of theirs has had its handler;
//! 3. deletes undelivered outbox rows `outbox.failed_retention` (7 days)
//!    after they stopped: `Failed` and `DeadLetter` rows after their last
//!    attempt (or their creation, never attempted), `Expired` rows after
//!    their `expires_at`, `Discarded` rows after their `discarded_at`. Until
//!    then an operator can investigate, retry
//!    (`POST /_rf/outbox/{id}/retry`, see [`crate::diagnostics`]) or discard
//!    them; each deletion is counted (`rf_outbox_undelivered_deleted_total`)
//!    and logged as a warning;
//! 4. deletes inbox rows past their `expires_at` (processed + `inbox.retention`).
//!
//! Rows `Sending` under a lease are never touched: the dispatcher owns
//! them.
//!
//! **The inbox must outlive the sender's retries.** A copy that arrives after
//! its inbox row was deleted is processed again. The inbox row expires
//! `inbox.retention` after processing and the sender stops retrying at
//! `outbox.ttl` after enqueueing, and a copy older than the dedup horizon
//! (`inbox.retention - inbox.signature_tolerance`) is refused, so
//! `inbox.retention >= outbox.ttl + inbox.signature_tolerance` of every
//! sender is enough; [`retention_warnings`] says when a config breaks that.
//!
//! [`Retention::spawn`] runs a pass at start and then every
//! `cleanup_interval` (5 minutes) on the blocking pool. On SQLite, a pass
//! that leaves more than `vacuum.threshold_pages` free pages in the file is
//! followed by an incremental vacuum in short steps
//! ([`store::sqlite::vacuum_freed`](crate::store::sqlite::vacuum_freed)),
//! counted in `rf_sqlite_vacuumed_pages_total`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::sqlite::{self as db, VacuumReport};
use crate::store::{Database, StoreError};

/// Rows deleted or updated per statement (each statement commits on its own).
pub const CLEANUP_BATCH: u32 = 1000;

/// What one clean-up pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupReport {
    /// `Sent` outbox rows deleted after their retention.
    pub sent_deleted: usize,
    /// `Pending` outbox rows marked `Expired`.
    pub expired: usize,
    /// `Pending` outbox rows past their TTL made due at once, for the
    /// dispatcher that runs their failure handler to expire them.
    pub made_due: usize,
    /// `Failed`, `DeadLetter`, `Expired` and `Discarded` outbox rows
    /// deleted after `outbox.failed_retention`.
    pub undelivered_deleted: usize,
    /// Inbox rows deleted after their retention.
    pub inbox_deleted: usize,
}

/// Settings that let the inbox forget a message while its sender may still
/// retry it, one sentence each. Empty when the config is safe.
///
/// A service's own config describes its inbox and its outbox; pass the
/// largest `outbox.ttl` of the services that send to it if they differ.
/// The rule is `inbox.retention >= outbox.ttl + inbox.signature_tolerance`:
/// a retry sent in the last `signature_tolerance` of its TTL is otherwise
/// beyond the dedup horizon.
pub fn retention_warnings(
    inbox_retention: Duration,
    sender_ttl: Duration,
    signature_tolerance: Duration,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if inbox_retention < sender_ttl + signature_tolerance {
        warnings.push(format!(
            "inbox.retention ({}) is shorter than the senders' outbox.ttl ({}) plus \
             inbox.signature_tolerance ({}): a retry late in its TTL is beyond the dedup \
             horizon (inbox.retention - inbox.signature_tolerance), refused (422 \
             beyond_dedup_horizon) and left Failed for an operator",
            crate::duration::format_duration(inbox_retention),
            crate::duration::format_duration(sender_ttl),
            crate::duration::format_duration(signature_tolerance),
        ));
    }
    warnings
}

/// The running clean-up task; [`shutdown`](Self::shutdown) stops it.
#[derive(Debug)]
pub struct RetentionHandle {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl RetentionHandle {
    /// Stops the task after the pass in progress, if any.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// The scheduled clean-up of one database.
pub struct Retention;

impl Retention {
    /// Opens `database` (creating and migrating it if needed) and starts a
    /// task that runs a clean-up pass now and then every
    /// `config.cleanup_interval`.
    /// What each pass removes is counted in `metrics`
    /// (`rf_outbox_sent_deleted_total`, `rf_outbox_expired_total`,
    /// `rf_outbox_undelivered_deleted_total`, `rf_inbox_deleted_total`); a pass that fails is logged and retried at
    /// the next interval, never fatal.
    pub fn spawn(
        config: Config,
        database: impl Into<Database>,
        metrics: Arc<Metrics>,
    ) -> Result<RetentionHandle, StoreError> {
        Self::spawn_with_failure_handlers(config, database, metrics, &[])
    }

    /// [`spawn`](Self::spawn) for a database whose dispatchers run failure
    /// handlers ([`crate::failures`]) for the interface versions `handled`
    /// (what [`DispatcherHandle::failure_versions`] says; a
    /// [`Host`](crate::host::Host) passes it). The pass does not expire
    /// their `Pending` rows past the TTL; it makes them due at once, and the
    /// dispatcher expires them in the transaction where their handler runs.
    /// A row whose destination's circuit is open waits for the circuit's
    /// next probe.
    ///
    /// [`DispatcherHandle::failure_versions`]: crate::dispatcher::DispatcherHandle::failure_versions
    pub fn spawn_with_failure_handlers(
        config: Config,
        database: impl Into<Database>,
        metrics: Arc<Metrics>,
        handled: &[(&str, u32)],
    ) -> Result<RetentionHandle, StoreError> {
        let owned: Vec<(String, u32)> = handled
            .iter()
            .map(|(interface, version)| ((*interface).to_owned(), *version))
            .collect();
        for warning in retention_warnings(
            config.inbox.retention,
            config.outbox.ttl,
            config.inbox.signature_tolerance,
        ) {
            tracing::warn!("{warning}");
        }
        let cancel = CancellationToken::new();
        let sqlite = |path: std::path::PathBuf| -> Result<Pass, StoreError> {
            let conn = db::open(&path, config.outbox.durability)?;
            let pass_config = config.clone();
            let stop = cancel.clone();
            Ok(Box::new(move |now| {
                let wrap = |source| StoreError::Sqlite {
                    path: path.display().to_string(),
                    source,
                };
                let handled: Vec<(&str, u32)> =
                    owned.iter().map(|(i, v)| (i.as_str(), *v)).collect();
                let cleaned = db::cleanup_with_failure_handlers(&conn, &pass_config, now, &handled)
                    .map_err(wrap)?;
                // The pages those rows held go back to the file system, a
                // short write transaction at a time. A failure keeps what
                // the pass did (and counts it); the next pass tries again.
                let vacuumed =
                    db::vacuum_freed(&conn, &pass_config.vacuum, &|| stop.is_cancelled())
                        .unwrap_or_else(|error| {
                            tracing::warn!(
                                path = %path.display(),
                                %error,
                                "incremental vacuum failed; the free pages stay until the next pass"
                            );
                            VacuumReport::default()
                        });
                Ok((cleaned, vacuumed))
            }))
        };
        let pass: Pass = match database.into() {
            Database::Sqlite(path) => sqlite(path)?,
            // A file on a sqlx pool: cleaned on a connection of its own.
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(store) => sqlite(store.location().to_path_buf())?,
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(store) => {
                let mut pass = crate::store::sqlx_postgres::retention::pass(
                    store,
                    config.clone(),
                    version_list(handled),
                )?;
                Box::new(move |now| pass(now).map(|cleaned| (cleaned, VacuumReport::default())))
            }
        };
        Ok(Self::start(config, pass, metrics, cancel))
    }

    fn start(
        config: Config,
        pass: Pass,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
    ) -> RetentionHandle {
        let task = tokio::spawn(run(
            config,
            Arc::new(Mutex::new(pass)),
            metrics,
            cancel.clone(),
        ));
        RetentionHandle { cancel, task }
    }
}

/// `interface:version` of each handled version, as the passes compare it.
fn version_list(handled: &[(&str, u32)]) -> Vec<String> {
    handled
        .iter()
        .map(|(interface, version)| format!("{interface}:{version}"))
        .collect()
}

/// [`version_list`] as a JSON array, for SQLite's `json_each`.
pub(crate) fn version_keys(handled: &[(&str, u32)]) -> String {
    serde_json::Value::from(version_list(handled)).to_string()
}

/// One clean-up pass at a time (milliseconds now), on the store's
/// connection, and on SQLite the vacuum after it.
type Pass = Box<dyn FnMut(i64) -> Result<(CleanupReport, VacuumReport), StoreError> + Send>;

async fn run(
    config: Config,
    pass: Arc<Mutex<Pass>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let interval = config.cleanup_interval.max(Duration::from_millis(10));
    loop {
        let pass = {
            let pass = Arc::clone(&pass);
            tokio::task::spawn_blocking(move || {
                let mut pass = pass.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                pass(db::now_ms())
            })
        };
        match pass.await {
            Ok(Ok((report, vacuumed))) => {
                if vacuumed.pages > 0 {
                    metrics.sqlite_vacuumed_pages.add(vacuumed.pages);
                    tracing::info!(
                        pages = vacuumed.pages,
                        steps = vacuumed.steps,
                        longest_step_ms = vacuumed.longest_step.as_secs_f64() * 1e3,
                        "incremental vacuum returned free pages to the file system"
                    );
                }
                metrics.outbox_sent_deleted.add(report.sent_deleted as u64);
                metrics.outbox_expired.add(report.expired as u64);
                metrics.inbox_deleted.add(report.inbox_deleted as u64);
                metrics
                    .outbox_undelivered_deleted
                    .add(report.undelivered_deleted as u64);
                if report.undelivered_deleted > 0 {
                    tracing::warn!(
                        deleted = report.undelivered_deleted,
                        retention = %crate::duration::format_duration(config.outbox.failed_retention),
                        "retention deleted outbox messages that were never delivered \
                         (Failed, DeadLetter, Expired or Discarded past outbox.failed_retention)"
                    );
                }
                if report != CleanupReport::default() {
                    tracing::info!(
                        sent_deleted = report.sent_deleted,
                        expired = report.expired,
                        made_due = report.made_due,
                        undelivered_deleted = report.undelivered_deleted,
                        inbox_deleted = report.inbox_deleted,
                        "retention clean-up"
                    );
                }
            }
            Ok(Err(error)) => tracing::warn!("retention clean-up failed: {error}"),
            Err(error) => tracing::warn!("retention clean-up task failed: {error}"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_when_the_inbox_forgets_before_the_sender_gives_up() {
        let hour = Duration::from_secs(3600);
        let tolerance = Duration::from_secs(300);
        assert!(retention_warnings(24 * hour + tolerance, 24 * hour, tolerance).is_empty());
        let warnings = retention_warnings(hour, 24 * hour, tolerance);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("1h"), "{}", warnings[0]);
        assert!(warnings[0].contains("(1d)"), "{}", warnings[0]);
        // The documented rule: equal retention and TTL leave the last five
        // minutes of the TTL beyond the dedup horizon.
        let warnings = retention_warnings(24 * hour, 24 * hour, tolerance);
        assert_eq!(warnings.len(), 1, "retention = ttl is not enough");
        assert!(warnings[0].contains("(5m)"), "{}", warnings[0]);
    }

    /// The rule at its boundary (issue 30): `retention = ttl + tolerance`
    /// is enough, a second less is not, a second more is.
    #[test]
    fn the_rule_holds_from_ttl_plus_tolerance_exactly() {
        let second = Duration::from_secs(1);
        let ttl = Duration::from_secs(24 * 3600);
        let tolerance = Duration::from_secs(300);
        let boundary = ttl + tolerance;
        for (retention, warned) in [
            (boundary, false),
            (boundary - second, true),
            (boundary + second, false),
        ] {
            let warnings = retention_warnings(retention, ttl, tolerance);
            assert_eq!(
                warnings.len(),
                usize::from(warned),
                "retention {retention:?}: {warnings:?}"
            );
        }
    }
}
