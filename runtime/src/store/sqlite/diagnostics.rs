//! The diagnostics statements on SQLite: [`DiagnosticsStore`] for
//! `rusqlite::Connection`, the group counts the folding in `health` starts
//! from, and the `database` / `migrations` checks of `GET /_rf/readyz`.
//! `?n` placeholders; the two `status IN (…)` conditions of the group
//! queries repeat those of the partial indexes `outbox_due` and
//! `outbox_attention`, so neither query scans the table.
//!
//! Returns raw rows only; it never folds, filters or decides a status (that
//! is `health` and `queries`), and never touches HTTP.

use std::collections::BTreeMap;

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension as _, params, params_from_iter};

use crate::diagnostics::{
    AttentionRow, DiagnosticsError, DiagnosticsStore, ErrorGroupRow, RowFilter, UnsentGroup,
};
use crate::outbox::Status;
use crate::store::sqlite as db;

/// The conditions of a [`RowFilter`], `?1` to `?8` ([`filter_values`]);
/// a NULL parameter matches every row.
macro_rules! row_filter {
    () => {
        " AND (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR destination = ?2) \
          AND (?3 IS NULL OR interface = ?3) AND (?4 IS NULL OR endpoint = ?4) \
          AND (?5 IS NULL OR instr(last_error, ?5) > 0) AND (?6 IS NULL OR created_at < ?6) \
          AND (?7 IS NULL OR created_at > ?7 OR (created_at = ?7 AND message_id > ?8))"
    };
}

/// The parameters `?1` to `?8` of `row_filter!`.
fn filter_values(filter: &RowFilter) -> Vec<Value> {
    let text = |value: &Option<String>| value.clone().map_or(Value::Null, Value::Text);
    let (after_at, after_id) = match &filter.after {
        Some((at, id)) => (Value::Integer(*at), Value::Text(id.clone())),
        None => (Value::Null, Value::Null),
    };
    vec![
        filter.status.map_or(Value::Null, |status| {
            Value::Text(status.as_str().to_owned())
        }),
        text(&filter.destination),
        text(&filter.interface),
        text(&filter.method),
        text(&filter.error),
        filter.created_before.map_or(Value::Null, Value::Integer),
        after_at,
        after_id,
    ]
}

/// The database part of readiness: a write transaction can start (nobody
/// holds the write lock past `conn`'s busy timeout, the file is writable)
/// and the schema is the one this build knows.
pub fn database_checks(conn: &Connection) -> BTreeMap<String, String> {
    let mut checks = BTreeMap::new();
    let writable = conn
        .execute_batch("BEGIN IMMEDIATE; ROLLBACK;")
        .map(|()| "ok".to_owned())
        .unwrap_or_else(|error| {
            // A failed BEGIN leaves no transaction; a failed ROLLBACK might.
            let _ = conn.execute_batch("ROLLBACK");
            format!("cannot start a write transaction: {error}")
        });
    checks.insert("database".to_owned(), writable);
    let known = db::MIGRATIONS.len() as i64;
    let migrations = match conn.query_row("PRAGMA user_version", [], |row| row.get::<_, i64>(0)) {
        Ok(version) if version == known => "ok".to_owned(),
        Ok(version) => format!("schema version {version}, this build needs {known}"),
        Err(error) => format!("cannot read the schema version: {error}"),
    };
    checks.insert("migrations".to_owned(), migrations);
    checks
}

/// The unsent rows by (destination, status); a waiting row whose
/// `created_at` (its due time) is after `now` is a durable timer, counted
/// as scheduled.
pub(crate) fn unsent_groups(conn: &Connection, now: i64) -> rusqlite::Result<Vec<UnsentGroup>> {
    let mut groups = Vec::new();
    for (sql, binds_now) in [
        (
            "SELECT destination, status, COUNT(*), MIN(created_at), SUM(created_at > ?1) \
             FROM outbox_messages WHERE status IN ('Pending', 'Sending') \
             GROUP BY destination, status",
            true,
        ),
        (
            concat!(
                "SELECT destination, status, COUNT(*), MIN(created_at), 0 FROM outbox_messages \
                 WHERE ",
                crate::store::sqlite::attention!(),
                " GROUP BY destination, status"
            ),
            false,
        ),
    ] {
        let mut statement = conn.prepare_cached(sql)?;
        let mut rows = if binds_now {
            statement.query([now])?
        } else {
            statement.query([])?
        };
        while let Some(row) = rows.next()? {
            let status: String = row.get(1)?;
            let Some(status) = Status::parse(&status) else {
                continue;
            };
            groups.push(UnsentGroup {
                destination: row.get(0)?,
                status,
                rows: row.get::<_, i64>(2)?.max(0) as u64,
                scheduled: row.get::<_, Option<i64>>(4)?.unwrap_or(0).max(0) as u64,
                oldest_created_at: row.get(3)?,
            });
        }
    }
    Ok(groups)
}

/// One look-up at the end of `outbox_sent`, not a scan.
pub(crate) fn last_sent_at(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT MAX(sent_at) FROM outbox_messages WHERE status = 'Sent'")?
        .query_row([], |row| row.get(0))
}

pub(crate) fn sent_count(conn: &Connection) -> rusqlite::Result<u64> {
    let sent: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'")?
        .query_row([], |row| row.get(0))?;
    Ok(sent.max(0) as u64)
}

impl DiagnosticsStore for Connection {
    fn decommissioned(&self) -> Result<Vec<(String, i64, i64, i64)>, DiagnosticsError> {
        let mut statement = self.prepare_cached(crate::store::DECOMMISSIONED_SQL)?;
        let rows = statement
            .query_map([], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn unsent_groups(&self, now: i64) -> Result<Vec<UnsentGroup>, DiagnosticsError> {
        Ok(unsent_groups(self, now)?)
    }

    fn last_sent_at(&self) -> Result<Option<i64>, DiagnosticsError> {
        Ok(last_sent_at(self)?)
    }

    fn sent_count(&self) -> Result<u64, DiagnosticsError> {
        Ok(sent_count(self)?)
    }

    fn attention_rows(
        &self,
        filter: &RowFilter,
        limit: u32,
    ) -> Result<Vec<AttentionRow>, DiagnosticsError> {
        let mut statement = self.prepare_cached(concat!(
            "SELECT message_id, correlation_id, message_type, destination, interface, \
                    version, endpoint, status, retry_count, max_retries, last_error, \
                    created_at, last_attempt_at, expires_at \
             FROM outbox_messages \
             WHERE ",
            crate::store::sqlite::attention!(),
            row_filter!(),
            " ORDER BY created_at, message_id LIMIT +?9"
        ))?;
        let mut values = filter_values(filter);
        values.push(Value::Integer(i64::from(limit)));
        let rows = statement.query_map(params_from_iter(values), |row| {
            Ok(AttentionRow {
                message_id: row.get(0)?,
                correlation_id: row.get(1)?,
                message_type: row.get(2)?,
                destination: row.get(3)?,
                interface: row.get(4)?,
                version: row.get(5)?,
                endpoint: row.get(6)?,
                status: row.get(7)?,
                retry_count: row.get(8)?,
                max_retries: row.get(9)?,
                last_error: row.get(10)?,
                created_at: row.get(11)?,
                last_attempt_at: row.get(12)?,
                expires_at: row.get(13)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn error_groups(&self, filter: &RowFilter) -> Result<Vec<ErrorGroupRow>, DiagnosticsError> {
        let mut statement = self.prepare_cached(concat!(
            "SELECT destination, last_error, COUNT(*), MIN(created_at), MAX(created_at) \
             FROM outbox_messages WHERE ",
            crate::store::sqlite::attention!(),
            row_filter!(),
            " GROUP BY destination, last_error"
        ))?;
        let rows = statement.query_map(params_from_iter(filter_values(filter)), |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn retry_one(
        &self,
        message_id: &str,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        Ok(self
            .prepare_cached(concat!(
                "UPDATE outbox_messages \
                 SET status = 'Pending', retry_count = 0, next_retry_at = ?2, \
                     lease_token = NULL, expires_at = MAX(expires_at, ?3) \
                 WHERE message_id = ?1 AND seq = ?4 AND ",
                crate::store::sqlite::attention!(),
                ""
            ))?
            .execute(params![
                message_id,
                now_ms,
                renew_until_ms,
                crate::store::sqlite::outbox_seq(message_id)
            ])?)
    }

    fn status_of(&self, message_id: &str) -> Result<Option<String>, DiagnosticsError> {
        Ok(self
            .query_row(
                "SELECT status FROM outbox_messages WHERE message_id = ?1 AND seq = ?2",
                params![message_id, crate::store::sqlite::outbox_seq(message_id)],
                |row| row.get(0),
            )
            .optional()?)
    }

    fn retry_matching(
        &self,
        filter: &RowFilter,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let mut values = filter_values(filter);
        values.extend([Value::Integer(now_ms), Value::Integer(renew_until_ms)]);
        Ok(self
            .prepare_cached(concat!(
                "UPDATE outbox_messages \
                 SET status = 'Pending', retry_count = 0, next_retry_at = ?9, \
                     lease_token = NULL, expires_at = MAX(expires_at, ?10) \
                 WHERE ",
                crate::store::sqlite::attention!(),
                row_filter!()
            ))?
            .execute(params_from_iter(values))?)
    }

    fn discard_one(&self, message_id: &str, now_ms: i64) -> Result<usize, DiagnosticsError> {
        Ok(self
            .prepare_cached(concat!(
                "UPDATE outbox_messages \
                 SET status = 'Discarded', discarded_at = ?2, lease_token = NULL \
                 WHERE message_id = ?1 AND seq = ?3 AND ",
                crate::store::sqlite::attention!(),
                ""
            ))?
            .execute(params![
                message_id,
                now_ms,
                crate::store::sqlite::outbox_seq(message_id)
            ])?)
    }

    fn discard_matching(&self, filter: &RowFilter, now_ms: i64) -> Result<usize, DiagnosticsError> {
        let mut values = filter_values(filter);
        values.push(Value::Integer(now_ms));
        Ok(self
            .prepare_cached(concat!(
                "UPDATE outbox_messages \
                 SET status = 'Discarded', discarded_at = ?9, lease_token = NULL \
                 WHERE ",
                crate::store::sqlite::attention!(),
                row_filter!()
            ))?
            .execute(params_from_iter(values))?)
    }

    fn count_older(
        &self,
        message_id: Option<&str>,
        filter: &RowFilter,
        before_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let mut values = filter_values(filter);
        values.extend([
            Value::Integer(before_ms),
            message_id.map_or(Value::Null, |id| Value::Text(id.to_owned())),
        ]);
        let count: i64 = self
            .prepare_cached(concat!(
                "SELECT COUNT(*) FROM outbox_messages \
                 WHERE ",
                crate::store::sqlite::attention!(),
                row_filter!(),
                " AND created_at < ?9 AND (?10 IS NULL OR message_id = ?10)"
            ))?
            .query_row(params_from_iter(values), |row| row.get(0))?;
        Ok(count.max(0) as usize)
    }

    fn inbox_size(&self) -> Result<u64, DiagnosticsError> {
        Ok(super::inbox::count(self)?)
    }

    fn database_checks(&self) -> BTreeMap<String, String> {
        database_checks(self)
    }
}
