//! Online backups of a service's SQLite file, consistent while the service
//! writes: [`Backups`] takes one ([`Backups::run`]), [`BackupSchedule`]
//! takes one every `backup.interval` (1 h), and `POST /_rf/backup` (see
//! [`crate::diagnostics`]) takes one on demand.
//!
//! A backup is SQLite's backup API run inside one read transaction of its
//! own, so it copies one snapshot: every transaction committed before it
//! started, none after, whatever commits meanwhile (WAL readers never block
//! writers). It copies `backup.pages_per_step` pages per step,
//! `backup.step_pause` apart, into `.<name>.partial` in the backup folder,
//! checks it (`PRAGMA quick_check`), switches it to a self-contained
//! rollback-journal file, fsyncs it and only then renames it to
//! `<database file name>.<UTC time>.backup`: a crash never leaves a half file
//! under a backup's name. Each success then deletes the backups older than
//! `backup.keep` (7 days), never the one just written.
//!
//! Each backup is counted (`rf_backups_total`, `rf_backup_failures_total`,
//! `rf_backup_last_success_timestamp_seconds`, `rf_backup_last_size_bytes`)
//! and logged. One runs at a time per [`Backups`]: another is refused with
//! [`BackupError::Running`]. SQLite only: a PostgreSQL database is backed up
//! by its server's tools. Restoring is a copy: `docs/operations.md#backups`.
//!
//! It never writes to the service's file and never deletes a file that is
//! not one of its backups.

mod files;
mod schedule;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use rusqlite::{Connection, OpenFlags};

pub use schedule::{BackupSchedule, BackupScheduleHandle};

use crate::config::BackupConfig;
use crate::metrics::Metrics;

/// A refused or failed backup.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// Another backup of this database is being written (409
    /// `backup_running` on `POST /_rf/backup`).
    #[error("a backup is already being written; try again when it is done")]
    Running,
    /// A `backup.…` setting cannot work; nothing was started.
    #[error("invalid setting backup.{setting}: {message}")]
    InvalidConfig {
        /// The setting, e.g. `pages_per_step`.
        setting: &'static str,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// The folder or the backup file could not be written (disk full,
    /// permissions); nothing was kept of this backup.
    #[error("backup to {path} failed: {source}")]
    Io {
        /// The file or folder.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// SQLite refused: reading the service's file or writing the copy.
    #[error("backup of {path} failed: {source}")]
    Sqlite {
        /// The database or backup file.
        path: String,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The copy does not pass `PRAGMA quick_check`; it was deleted.
    #[error("the backup {path} does not pass quick_check ({detail}); it was deleted")]
    Damaged {
        /// The copy that was deleted.
        path: String,
        /// What the check found.
        detail: String,
    },
    /// The service stopped while the backup was being written; nothing was kept.
    #[error("the service stopped while a backup was being written; nothing was kept")]
    Cancelled,
}

/// A backup written: where, how large, of which moment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackupFile {
    /// The file, in the backup folder.
    pub path: PathBuf,
    /// Its name (`service.db.20261129T063000.123Z.backup`).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// When its snapshot was taken (the time in its name).
    pub taken_at: Timestamp,
    /// How long it took to write.
    pub elapsed: Duration,
    /// Older backups deleted after it (`backup.keep`).
    pub rotated: usize,
}

/// Backups of one SQLite file into one folder. Cheap to clone; clones share
/// the one-at-a-time lock.
#[derive(Clone)]
pub struct Backups {
    inner: Arc<Inner>,
}

struct Inner {
    source: PathBuf,
    database_name: String,
    directory: PathBuf,
    keep: Duration,
    pages_per_step: i32,
    step_pause: Duration,
    metrics: Arc<Metrics>,
    running: Mutex<()>,
}

impl std::fmt::Debug for Backups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backups")
            .field("source", &self.inner.source)
            .field("directory", &self.inner.directory)
            .finish_non_exhaustive()
    }
}

impl Backups {
    /// Backups of the SQLite file `source` (a path or a SQLite URI
    /// filename) as `config` says: `config.directory` must be set and
    /// `config.pages_per_step` at least 1, else [`BackupError::InvalidConfig`].
    /// Nothing is written until [`run`](Self::run).
    pub fn new(
        source: impl Into<PathBuf>,
        config: &BackupConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, BackupError> {
        let source = source.into();
        let directory = match &config.directory {
            Some(directory) if !directory.as_os_str().is_empty() => directory.clone(),
            _ => {
                return Err(BackupError::InvalidConfig {
                    setting: "directory",
                    message: "not set; name the folder backups are written to".to_owned(),
                });
            }
        };
        let pages_per_step = i32::try_from(config.pages_per_step)
            .ok()
            .filter(|pages| *pages > 0)
            .ok_or_else(|| BackupError::InvalidConfig {
                setting: "pages_per_step",
                message: "must be between 1 and 2147483647 (default 256)".to_owned(),
            })?;
        if config.interval.is_zero() {
            return Err(BackupError::InvalidConfig {
                setting: "interval",
                message: "must be longer than 0 (default 1h)".to_owned(),
            });
        }
        let file = crate::store::sqlite::file_of(&source);
        let database_name = file
            .file_name()
            .and_then(|name| name.to_str())
            .map(str::to_owned)
            .ok_or_else(|| BackupError::InvalidConfig {
                setting: "directory",
                message: format!(
                    "the database path {} has no UTF-8 file name to name backups after",
                    file.display()
                ),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                source,
                database_name,
                directory,
                keep: config.keep,
                pages_per_step,
                step_pause: config.step_pause,
                metrics,
                running: Mutex::new(()),
            }),
        })
    }

    /// The folder backups are written to.
    pub fn directory(&self) -> &Path {
        &self.inner.directory
    }

    /// Whether a backup is being written now.
    pub fn is_running(&self) -> bool {
        matches!(
            self.inner.running.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// The backups in the folder, oldest first, with the time of each.
    pub fn list(&self) -> Result<Vec<(Timestamp, PathBuf)>, BackupError> {
        files::list(&self.inner.directory, &self.inner.database_name)
            .map_err(|source| self.io(&self.inner.directory, source))
    }

    /// Writes a backup now, then deletes those older than `backup.keep`.
    /// Blocking (it sleeps between steps): call it on a thread of its own
    /// or the blocking pool. [`BackupError::Running`] while another is being
    /// written. Counted in the metrics and logged either way.
    pub fn run(&self) -> Result<BackupFile, BackupError> {
        self.run_until(&|| false)
    }

    /// [`run`](Self::run), given up (nothing kept) once `stop` says so
    /// between two steps.
    pub fn run_until(&self, stop: &dyn Fn() -> bool) -> Result<BackupFile, BackupError> {
        let _running = match self.inner.running.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::WouldBlock) => return Err(BackupError::Running),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        let started = Instant::now();
        let result = self.write(stop, started);
        let metrics = &self.inner.metrics;
        match &result {
            Ok(file) => {
                metrics.backups.inc();
                metrics
                    .backup_last_success
                    .set(file.taken_at.as_second().max(0) as u64);
                metrics.backup_last_size.set(file.size);
                tracing::info!(
                    file = %file.path.display(),
                    size_bytes = file.size,
                    elapsed_ms = file.elapsed.as_millis() as u64,
                    rotated = file.rotated,
                    "database backup written"
                );
            }
            Err(error) => {
                metrics.backup_failures.inc();
                tracing::warn!(
                    database = %self.inner.source.display(),
                    %error,
                    "database backup failed"
                );
            }
        }
        result
    }

    fn write(&self, stop: &dyn Fn() -> bool, started: Instant) -> Result<BackupFile, BackupError> {
        let inner = &self.inner;
        std::fs::create_dir_all(&inner.directory)
            .map_err(|source| self.io(&inner.directory, source))?;
        files::remove_partials(&inner.directory, &inner.database_name);
        let source = Connection::open_with_flags(
            &inner.source,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|source| self.sqlite(&inner.source, source))?;
        source
            .busy_timeout(crate::store::sqlite::BUSY_TIMEOUT)
            .map_err(|e| self.sqlite(&inner.source, e))?;
        // Before the snapshot: the backup holds at least every transaction
        // committed before the time in its name.
        let taken_at = Timestamp::now();
        // One read transaction for the whole copy: its snapshot is what the
        // backup holds, and commits by others meanwhile never make the
        // backup API start over.
        source
            .execute_batch("BEGIN DEFERRED")
            .and_then(|()| {
                source.query_row("SELECT count(*) FROM sqlite_schema", [], |row| {
                    row.get::<_, i64>(0)
                })
            })
            .map_err(|e| self.sqlite(&inner.source, e))?;
        let name = files::backup_name(&inner.database_name, taken_at);
        let path = inner.directory.join(&name);
        let partial = inner.directory.join(files::partial_name(&name));
        let copied = self.copy(&source, &partial, stop);
        // Ends the read transaction (it changed nothing).
        let _ = source.execute_batch("COMMIT");
        drop(source);
        if let Err(error) = copied {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
        let finished = (|| {
            std::fs::File::open(&partial)
                .and_then(|file| file.sync_all())
                .map_err(|source| self.io(&partial, source))?;
            std::fs::rename(&partial, &path).map_err(|source| self.io(&path, source))?;
            std::fs::File::open(&inner.directory)
                .and_then(|folder| folder.sync_all())
                .map_err(|source| self.io(&inner.directory, source))?;
            std::fs::metadata(&path)
                .map(|meta| meta.len())
                .map_err(|source| self.io(&path, source))
        })();
        let size = match finished {
            Ok(size) => size,
            Err(error) => {
                let _ = std::fs::remove_file(&partial);
                return Err(error);
            }
        };
        let rotated = self.rotate(taken_at, &path);
        Ok(BackupFile {
            path,
            name,
            size,
            taken_at,
            elapsed: started.elapsed(),
            rotated,
        })
    }

    /// Copies the snapshot `source` reads into the new file `partial`,
    /// checks it and makes it a self-contained rollback-journal file.
    fn copy(
        &self,
        source: &Connection,
        partial: &Path,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), BackupError> {
        let inner = &self.inner;
        let _ = std::fs::remove_file(partial);
        let mut copy = Connection::open(partial).map_err(|e| self.sqlite(partial, e))?;
        {
            use rusqlite::backup::{Backup, StepResult};
            let backup = Backup::new(source, &mut copy).map_err(|e| self.sqlite(partial, e))?;
            // `More`, or `Busy` / `Locked` (retried after the pause), until `Done`.
            while !matches!(
                backup
                    .step(inner.pages_per_step)
                    .map_err(|e| self.sqlite(partial, e))?,
                StepResult::Done
            ) {
                if stop() {
                    return Err(BackupError::Cancelled);
                }
                std::thread::sleep(inner.step_pause);
            }
        }
        let problems: Vec<String> = copy
            .prepare("PRAGMA quick_check(10)")
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get::<_, String>(0))?
                    .collect()
            })
            .map_err(|e| self.sqlite(partial, e))?;
        if problems != ["ok"] {
            return Err(BackupError::Damaged {
                path: partial.display().to_string(),
                detail: problems.join("; "),
            });
        }
        // The copy's header says WAL, like the service's file; a backup
        // must be one file that opens anywhere, so it gets a rollback journal
        // (a restored file is switched back to WAL at its first open).
        copy.pragma_update(None, "journal_mode", "DELETE")
            .map_err(|e| self.sqlite(partial, e))?;
        copy.close().map_err(|(_, e)| self.sqlite(partial, e))
    }

    /// Deletes the backups taken longer than `backup.keep` before `now`,
    /// never `newest`; a file that cannot be deleted is logged and left.
    fn rotate(&self, now: Timestamp, newest: &Path) -> usize {
        let keep =
            jiff::SignedDuration::try_from(self.inner.keep).unwrap_or(jiff::SignedDuration::MAX);
        let Ok(backups) = self.list() else { return 0 };
        let mut deleted = 0;
        for (at, path) in backups {
            let age = now.duration_since(at);
            if path == newest || age <= keep {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => deleted += 1,
                Err(error) => tracing::warn!(
                    file = %path.display(),
                    %error,
                    "could not delete an old backup"
                ),
            }
        }
        deleted
    }

    fn io(&self, path: &Path, source: std::io::Error) -> BackupError {
        BackupError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    fn sqlite(&self, path: &Path, source: rusqlite::Error) -> BackupError {
        BackupError::Sqlite {
            path: path.display().to_string(),
            source,
        }
    }
}
