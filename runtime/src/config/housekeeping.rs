//! Disk housekeeping settings of a SQLite service file: online backups
//! ([`BackupConfig`], `backup.…`) and the incremental vacuum after
//! retention ([`VacuumConfig`], `vacuum.…`).
//!
//! Plain data with the defaults of the design (hourly backups kept 7 days);
//! what runs them is [`crate::backup`] and [`crate::retention`]. Both are
//! SQLite only: a PostgreSQL database is backed up and vacuumed by its server.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::serde_human;

/// Online backups of the service's SQLite file (`backup.…`,
/// `RFIDL_BACKUP_…`); see `docs/operations.md#backups`.
///
/// Scheduled backups run once `directory` is set: every `interval` (1 h), each
/// kept `keep` (7 days). `POST /_rf/backup` takes one on demand into the same
/// folder.
///
/// Start from [`Default`] (or YAML) and change fields; the struct is
/// `#[non_exhaustive]`, so new settings can be added without breaking
/// callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackupConfig {
    /// The folder backups are written to (created if missing); none (the
    /// default) turns scheduled and on-demand backups off. Prefer another
    /// disk than the database's: a backup on the same disk does not survive
    /// that disk.
    pub directory: Option<PathBuf>,
    /// Time between two scheduled backups (default 1 h). The first one runs
    /// `interval` after the newest backup already in the folder, or at start
    /// when there is none that recent.
    #[serde(with = "serde_human")]
    pub interval: Duration,
    /// Backups older than this are deleted after each successful backup
    /// (default 7 days); the one just written never is.
    #[serde(with = "serde_human")]
    pub keep: Duration,
    /// Pages copied per step of the SQLite backup API (default 256, 1 MiB
    /// at 4 KiB pages); writers go on between steps.
    pub pages_per_step: u32,
    /// Pause between two steps (default 5 ms), so a backup yields the disk
    /// to the service.
    #[serde(with = "serde_human")]
    pub step_pause: Duration,
}

impl Default for BackupConfig {
    fn default() -> Self {
        Self {
            directory: None,
            interval: Duration::from_secs(3600),
            keep: Duration::from_secs(7 * 24 * 3600),
            pages_per_step: 256,
            step_pause: Duration::from_millis(5),
        }
    }
}

/// The incremental vacuum that returns the pages retention freed to the
/// file system (`vacuum.…`, `RFIDL_VACUUM_…`); see
/// `docs/operations.md#vacuum`.
///
/// After a retention pass, when the file holds more than `threshold_pages`
/// free pages, `PRAGMA incremental_vacuum(step_pages)` runs repeatedly, each
/// step a short write transaction of its own, `step_pause` apart, until
/// fewer than `step_pages` are free.
///
/// Start from [`Default`] (or YAML) and change fields; the struct is
/// `#[non_exhaustive]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct VacuumConfig {
    /// Free pages that start a vacuum (default 2048, 8 MiB at 4 KiB
    /// pages); `0` turns the vacuum off.
    pub threshold_pages: u32,
    /// Pages returned per step, each step one write transaction (default
    /// 128: a step holds the write lock about a millisecond, see
    /// BENCHMARKS.md).
    pub step_pages: u32,
    /// Pause between two steps (default 2 ms), for writers waiting on the
    /// lock; never shorter than the step before it took.
    #[serde(with = "serde_human")]
    pub step_pause: Duration,
}

impl Default for VacuumConfig {
    fn default() -> Self {
        Self {
            threshold_pages: 2048,
            step_pages: 128,
            step_pause: Duration::from_millis(2),
        }
    }
}
