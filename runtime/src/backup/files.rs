//! Backup file names and rotation: `<database file name>.<UTC time>.backup`
//! (`service.db.20261129T063000.123Z.backup`), the `.partial` name a backup
//! is written under before its rename, and the listing rotation reads.
//!
//! It only names, lists and deletes files of one database in one folder;
//! anything else in the folder is never touched.

use std::path::{Path, PathBuf};

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// The suffix of every finished backup.
const SUFFIX: &str = ".backup";
/// The suffix of a backup still being written.
const PARTIAL: &str = ".partial";

/// `20261129T063000.123Z`: sortable, and unique per millisecond.
pub(super) fn stamp(at: Timestamp) -> String {
    let utc = at.to_zoned(TimeZone::UTC);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
        utc.year(),
        utc.month(),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second(),
        utc.millisecond()
    )
}

/// The time of a [`stamp`]; `None` for any other text.
pub(super) fn parse_stamp(text: &str) -> Option<Timestamp> {
    let bytes = text.as_bytes();
    if bytes.len() != 20 || bytes[8] != b'T' || bytes[15] != b'.' || bytes[19] != b'Z' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i16> {
        let digits = text.get(range)?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    };
    let date =
        jiff::civil::Date::new(number(0..4)?, number(4..6)? as i8, number(6..8)? as i8).ok()?;
    let time = jiff::civil::Time::new(
        number(9..11)? as i8,
        number(11..13)? as i8,
        number(13..15)? as i8,
        i32::from(number(16..19)?) * 1_000_000,
    )
    .ok()?;
    date.to_datetime(time)
        .to_zoned(TimeZone::UTC)
        .ok()
        .map(|zoned| zoned.timestamp())
}

/// The name of the backup of `database_name` taken at `at`.
pub(super) fn backup_name(database_name: &str, at: Timestamp) -> String {
    format!("{database_name}.{}{SUFFIX}", stamp(at))
}

/// The name a backup is written under until it is complete: hidden, and
/// never mistaken for a backup by a restore or by rotation.
pub(super) fn partial_name(name: &str) -> String {
    format!(".{name}{PARTIAL}")
}

/// The time a backup name of `database_name` carries; `None` for any other name.
pub(super) fn backup_time(database_name: &str, file_name: &str) -> Option<Timestamp> {
    let stamp = file_name
        .strip_prefix(database_name)?
        .strip_prefix('.')?
        .strip_suffix(SUFFIX)?;
    parse_stamp(stamp)
}

/// The backups of `database_name` in `directory`, oldest first.
pub(super) fn list(
    directory: &Path,
    database_name: &str,
) -> std::io::Result<Vec<(Timestamp, PathBuf)>> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        if let Some(at) = entry
            .file_name()
            .to_str()
            .and_then(|name| backup_time(database_name, name))
        {
            found.push((at, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Removes what a crashed backup of `database_name` left (`.partial` files).
/// Called with the in-process lock held, so none of them is being written.
pub(super) fn remove_partials(directory: &Path, database_name: &str) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = name
            .strip_prefix('.')
            .and_then(|rest| rest.strip_suffix(PARTIAL))
            .is_some_and(|inner| backup_time(database_name, inner).is_some());
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_carries_its_time_to_the_millisecond() {
        let at: Timestamp = "2026-11-29T06:30:00.123Z".parse().unwrap();
        let name = backup_name("service.db", at);
        assert_eq!(name, "service.db.20261129T063000.123Z.backup");
        assert_eq!(backup_time("service.db", &name), Some(at));
        assert_eq!(
            partial_name(&name),
            ".service.db.20261129T063000.123Z.backup.partial"
        );
    }

    #[test]
    fn other_names_are_not_backups() {
        for name in [
            "service.db",
            "other.db.20261129T063000.123Z.backup",
            "service.db.20261129T063000.123Z.backup.partial",
            "service.db.20261329T063000.123Z.backup",
            "service.db.2026112XT063000.123Z.backup",
            "service.db.20261129T063000123Z.backup",
            "service.db.+0261129T063000.123Z.backup",
        ] {
            assert_eq!(backup_time("service.db", name), None, "{name}");
        }
    }
}
