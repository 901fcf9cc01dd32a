//! The pre-flight check: before anything writes to an existing database
//! file, a read-only connection checks that its schema is one this build
//! knows and that `PRAGMA quick_check` passes, once per file and process.
//!
//! It never changes the file, whatever the outcome, and never migrates.

use std::path::Path;

use rusqlite::Connection;

use super::BUSY_TIMEOUT;
use crate::store::StoreError;

/// Checks an existing database file before anything may write to it, through
/// a read-only connection: its schema version must be one this build knows
/// (`supported` migrations or fewer), and `PRAGMA quick_check` must pass
/// (b-tree structure and page consistency, linear in the file's size; see
/// BENCHMARKS.md for its cost). A missing or empty file passes (it is
/// created). The file is never changed, whatever the outcome: setting
/// `journal_mode=WAL` rewrites the header of a rollback-journal database, so
/// it must not run before this check.
pub fn preflight(path: &Path, supported: i64) -> Result<(), StoreError> {
    use rusqlite::OpenFlags;
    let shown = path.display().to_string();
    if std::fs::metadata(file_of(path)).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    let corrupt = |detail: String| StoreError::Corrupt {
        path: shown.clone(),
        detail,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|source| StoreError::Sqlite {
        path: shown.clone(),
        source,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|source| StoreError::Sqlite {
            path: shown.clone(),
            source,
        })?;
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| classify_open_error(e, &shown))?;
    if found > supported {
        return Err(StoreError::TooNew {
            path: shown,
            found,
            supported,
        });
    }
    let mut statement = conn
        .prepare("PRAGMA quick_check(10)")
        .map_err(|e| classify_open_error(e, &shown))?;
    let problems: Vec<String> = statement
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| classify_open_error(e, &shown))?;
    if problems != ["ok"] {
        return Err(corrupt(problems.join("; ")));
    }
    Ok(())
}

/// A read error of the pre-flight check: damage, or something else (locked,
/// permissions) that is reported as it is.
fn classify_open_error(error: rusqlite::Error, shown: &str) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: shown.to_owned(),
            detail: error.to_string(),
        },
        _ => StoreError::Sqlite {
            path: shown.to_owned(),
            source: error,
        },
    }
}

/// The file a database path names: the path itself, or the file of a SQLite
/// URI filename (`file:/srv/app.db?vfs=name`, `file:///srv/app.db`,
/// `file://localhost/srv/app.db`; `%XX` escapes decoded), which every
/// connection the runtime opens accepts.
pub(crate) fn file_of(path: &Path) -> std::path::PathBuf {
    let Some(uri) = path.to_str().and_then(|text| text.strip_prefix("file:")) else {
        return path.to_path_buf();
    };
    let uri = uri.split(['?', '#']).next().unwrap_or_default();
    let uri = match uri.strip_prefix("//") {
        Some(rest) => rest.strip_prefix("localhost").unwrap_or(rest),
        None => uri,
    };
    let bytes = uri.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    std::path::PathBuf::from(String::from_utf8_lossy(&decoded).into_owned())
}

/// [`preflight`] once per file and process: the runtime opens several
/// connections to one file (writer, dispatcher, readers), and the check
/// reads the whole file.
pub(super) fn preflight_once(path: &Path, supported: i64) -> Result<(), StoreError> {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static CHECKED: OnceLock<Mutex<HashSet<std::path::PathBuf>>> = OnceLock::new();
    let file = file_of(path);
    let key = std::fs::canonicalize(&file).unwrap_or(file);
    let checked = CHECKED.get_or_init(Default::default);
    if checked.lock().is_ok_and(|set| set.contains(&key)) {
        return Ok(());
    }
    preflight(path, supported)?;
    if let Ok(mut set) = checked.lock() {
        set.insert(key);
    }
    Ok(())
}
