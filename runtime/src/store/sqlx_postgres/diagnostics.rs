//! The diagnostics routes' statements on sqlx PostgreSQL
//! ([`crate::diagnostics::DiagnosticsStore`]): those of the blocking
//! PostgreSQL store, in the store's schema, on the caller's pool. The
//! routes call them on the blocking pool; each statement is driven there by
//! the pool's runtime. The pool replaces a connection that broke (a server
//! restart, an ended session), so the first request after a restart is
//! answered too. The readiness probe's statements run within the readiness
//! timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Row as _;
use tokio::runtime::Handle;

use super::PgStore;
use crate::diagnostics::{
    AttentionRow, DiagnosticsError, DiagnosticsStore, ErrorGroupRow, RowFilter, UnsentGroup,
};
use crate::outbox::Status;
use crate::store::StoreError;

/// The statements, `{t}` standing for the schema.
const SQL: &[&str] = &[
    // UNSENT_DUE, UNSENT_ATTENTION: the conditions of the partial indexes.
    "SELECT destination, status, COUNT(*), MIN(created_at), \
     COUNT(*) FILTER (WHERE created_at > $1) FROM {t}outbox_messages \
     WHERE status IN ('Pending', 'Sending') GROUP BY destination, status",
    "SELECT destination, status, COUNT(*), MIN(created_at), 0::bigint FROM {t}outbox_messages \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') GROUP BY destination, status",
    // LAST_SENT
    "SELECT MAX(sent_at) FROM {t}outbox_messages WHERE status = 'Sent'",
    // SENT_COUNT
    "SELECT COUNT(*) FROM {t}outbox_messages WHERE status = 'Sent'",
    // ATTENTION: `{f}` is the blocking store's `ROW_FILTER`.
    "SELECT message_id, correlation_id, message_type, destination, interface, \
            version, endpoint, status, retry_count, max_retries, last_error, \
            created_at, last_attempt_at, expires_at \
     FROM {t}outbox_messages \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') {f} \
     ORDER BY created_at, message_id LIMIT $9",
    // RETRY_ONE
    "UPDATE {t}outbox_messages \
     SET status = 'Pending', retry_count = 0, next_retry_at = $2, \
         lease_token = NULL, expires_at = GREATEST(expires_at, $3) \
     WHERE message_id = $1 AND status IN ('Failed', 'DeadLetter', 'Expired')",
    // STATUS_OF
    "SELECT status FROM {t}outbox_messages WHERE message_id = $1",
    // RETRY_MATCHING
    "UPDATE {t}outbox_messages \
     SET status = 'Pending', retry_count = 0, next_retry_at = $9, \
         lease_token = NULL, expires_at = GREATEST(expires_at, $10) \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') {f}",
    // COUNT_OLDER
    "SELECT COUNT(*) FROM {t}outbox_messages \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') {f} AND created_at < $9 \
       AND ($10::text IS NULL OR message_id = $10)",
    // INBOX_SIZE
    "SELECT COUNT(*) FROM {t}inbox_messages",
    // DECOMMISSIONED (with each version's held rows)
    "SELECT d.interface, d.version, d.decommissioned_at, \
     (SELECT COUNT(*) FROM {t}outbox_messages o WHERE o.status IN ('Pending', 'Sending') \
      AND o.status = 'Pending' AND o.next_retry_at >= 4611686018427387904 \
      AND o.interface = d.interface AND o.version = d.version) \
     FROM {t}rf_decommissioned d ORDER BY d.interface, d.version",
    // SCHEMA_VERSION
    "SELECT version FROM {t}rfidl_schema",
    // ERROR_GROUPS
    "SELECT destination, last_error, COUNT(*), MIN(created_at), MAX(created_at) \
     FROM {t}outbox_messages \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') {f} \
     GROUP BY destination, last_error",
    // DISCARD_ONE
    "UPDATE {t}outbox_messages \
     SET status = 'Discarded', discarded_at = $2, lease_token = NULL \
     WHERE message_id = $1 AND status IN ('Failed', 'DeadLetter', 'Expired')",
    // DISCARD_MATCHING
    "UPDATE {t}outbox_messages \
     SET status = 'Discarded', discarded_at = $9, lease_token = NULL \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') {f}",
];

const UNSENT_DUE: usize = 0;
const UNSENT_ATTENTION: usize = 1;
const LAST_SENT: usize = 2;
const SENT_COUNT: usize = 3;
const ATTENTION: usize = 4;
const RETRY_ONE: usize = 5;
const STATUS_OF: usize = 6;
const RETRY_MATCHING: usize = 7;
const COUNT_OLDER: usize = 8;
const INBOX_SIZE: usize = 9;
const DECOMMISSIONED: usize = 10;
const SCHEMA_VERSION: usize = 11;
const ERROR_GROUPS: usize = 12;
const DISCARD_ONE: usize = 13;
const DISCARD_MATCHING: usize = 14;

/// The diagnostics' statements on the store's pool: the routes' (no
/// timeout) or the readiness probe's (`timeout`).
pub(crate) struct SqlxDiagnostics {
    store: PgStore,
    runtime: Handle,
    statements: Vec<String>,
    timeout: Option<Duration>,
}

/// The routes' and the readiness probe's statements, for
/// [`crate::diagnostics::DiagnosticsBuilder::build`], made on the pool's
/// runtime.
pub(crate) fn open(
    store: &PgStore,
    readiness_timeout: Duration,
) -> Result<(SqlxDiagnostics, SqlxDiagnostics), StoreError> {
    let runtime = Handle::try_current().map_err(|_| StoreError::Postgres {
        target: store.target().to_owned(),
        cause: "diagnostics on a sqlx pool must be built on the pool's tokio runtime".to_owned(),
    })?;
    let prefix = format!("\"{}\".", store.schema());
    let statements: Vec<String> = SQL
        .iter()
        .map(|sql| {
            sql.replace("{t}", &prefix)
                .replace("{f}", crate::store::pg_schema::ROW_FILTER)
        })
        .collect();
    let part = |timeout| SqlxDiagnostics {
        store: store.clone(),
        runtime: runtime.clone(),
        statements: statements.clone(),
        timeout,
    };
    Ok((part(None), part(Some(readiness_timeout))))
}

/// Binds `$1` to `$8` of the blocking store's `ROW_FILTER`.
fn bind_filter<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    filter: &RowFilter,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(filter.status.map(Status::as_str))
        .bind(filter.destination.clone())
        .bind(filter.interface.clone())
        .bind(filter.method.clone())
        .bind(filter.error.clone())
        .bind(filter.created_before)
        .bind(filter.after.as_ref().map(|(at, _)| *at))
        .bind(filter.after.as_ref().map(|(_, id)| id.clone()))
}

impl SqlxDiagnostics {
    fn query(
        &self,
        index: usize,
    ) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(sqlx::AssertSqlSafe(self.statements[index].as_str()))
    }

    /// Drives `statement` to its end (within the probe's timeout).
    fn run<T>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, DiagnosticsError> {
        let unavailable = |cause: String| {
            DiagnosticsError::Unavailable(format!(
                "PostgreSQL database at {}: {cause}",
                self.store.target()
            ))
        };
        let done = match self.timeout {
            None => self.runtime.block_on(statement),
            Some(timeout) => self
                .runtime
                .block_on(async { tokio::time::timeout(timeout, statement).await })
                .map_err(|_| unavailable(format!("no answer within {timeout:?}")))?,
        };
        done.map_err(|e| unavailable(super::error_text(&e)))
    }

    fn count(&self, index: usize) -> Result<u64, DiagnosticsError> {
        let count: i64 = self.run(first(self.query(index).fetch_one(self.store.pool())))?;
        Ok(count.max(0) as u64)
    }
}

/// The first column of the row `row` fetches.
async fn first<T>(
    row: impl Future<Output = Result<sqlx::postgres::PgRow, sqlx::Error>>,
) -> Result<T, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.await?.try_get(0)
}

impl DiagnosticsStore for SqlxDiagnostics {
    fn decommissioned(&self) -> Result<Vec<(String, i64, i64, i64)>, DiagnosticsError> {
        let rows = self.run(self.query(DECOMMISSIONED).fetch_all(self.store.pool()))?;
        Ok(rows
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
            .collect())
    }

    fn unsent_groups(&self, now: i64) -> Result<Vec<UnsentGroup>, DiagnosticsError> {
        let mut groups = Vec::new();
        for index in [UNSENT_DUE, UNSENT_ATTENTION] {
            let mut query = self.query(index);
            if index == UNSENT_DUE {
                query = query.bind(now);
            }
            for row in self.run(query.fetch_all(self.store.pool()))? {
                let status: String = row.get(1);
                let Some(status) = Status::parse(&status) else {
                    continue;
                };
                groups.push(UnsentGroup {
                    destination: row.get(0),
                    status,
                    rows: row.get::<i64, _>(2).max(0) as u64,
                    scheduled: row.get::<i64, _>(4).max(0) as u64,
                    oldest_created_at: row.get(3),
                });
            }
        }
        Ok(groups)
    }

    fn last_sent_at(&self) -> Result<Option<i64>, DiagnosticsError> {
        self.run(first(self.query(LAST_SENT).fetch_one(self.store.pool())))
    }

    fn sent_count(&self) -> Result<u64, DiagnosticsError> {
        self.count(SENT_COUNT)
    }

    fn attention_rows(
        &self,
        filter: &RowFilter,
        limit: u32,
    ) -> Result<Vec<AttentionRow>, DiagnosticsError> {
        let rows = self.run(
            bind_filter(self.query(ATTENTION), filter)
                .bind(i64::from(limit))
                .fetch_all(self.store.pool()),
        )?;
        Ok(rows
            .iter()
            .map(|row| AttentionRow {
                message_id: row.get(0),
                correlation_id: row.get(1),
                message_type: row.get(2),
                destination: row.get(3),
                interface: row.get(4),
                version: row.get(5),
                endpoint: row.get(6),
                status: row.get(7),
                retry_count: row.get(8),
                max_retries: row.get(9),
                last_error: row.get(10),
                created_at: row.get(11),
                last_attempt_at: row.get(12),
                expires_at: row.get(13),
            })
            .collect())
    }

    fn error_groups(&self, filter: &RowFilter) -> Result<Vec<ErrorGroupRow>, DiagnosticsError> {
        let rows =
            self.run(bind_filter(self.query(ERROR_GROUPS), filter).fetch_all(self.store.pool()))?;
        Ok(rows
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)))
            .collect())
    }

    fn retry_one(
        &self,
        message_id: &str,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let done = self.run(
            self.query(RETRY_ONE)
                .bind(message_id)
                .bind(now_ms)
                .bind(renew_until_ms)
                .execute(self.store.pool()),
        )?;
        Ok(done.rows_affected() as usize)
    }

    fn status_of(&self, message_id: &str) -> Result<Option<String>, DiagnosticsError> {
        let row = self.run(
            self.query(STATUS_OF)
                .bind(message_id)
                .fetch_optional(self.store.pool()),
        )?;
        Ok(row.map(|row| row.get(0)))
    }

    fn retry_matching(
        &self,
        filter: &RowFilter,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let done = self.run(
            bind_filter(self.query(RETRY_MATCHING), filter)
                .bind(now_ms)
                .bind(renew_until_ms)
                .execute(self.store.pool()),
        )?;
        Ok(done.rows_affected() as usize)
    }

    fn discard_one(&self, message_id: &str, now_ms: i64) -> Result<usize, DiagnosticsError> {
        let done = self.run(
            self.query(DISCARD_ONE)
                .bind(message_id)
                .bind(now_ms)
                .execute(self.store.pool()),
        )?;
        Ok(done.rows_affected() as usize)
    }

    fn discard_matching(&self, filter: &RowFilter, now_ms: i64) -> Result<usize, DiagnosticsError> {
        let done = self.run(
            bind_filter(self.query(DISCARD_MATCHING), filter)
                .bind(now_ms)
                .execute(self.store.pool()),
        )?;
        Ok(done.rows_affected() as usize)
    }

    fn count_older(
        &self,
        message_id: Option<&str>,
        filter: &RowFilter,
        before_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let count: i64 = self.run(first(
            bind_filter(self.query(COUNT_OLDER), filter)
                .bind(before_ms)
                .bind(message_id)
                .fetch_one(self.store.pool()),
        ))?;
        Ok(count.max(0) as usize)
    }

    fn inbox_size(&self) -> Result<u64, DiagnosticsError> {
        self.count(INBOX_SIZE)
    }

    /// `SELECT 1` answers within the readiness timeout, and `rfidl_schema`
    /// records the migrations this build knows.
    fn database_checks(&self) -> BTreeMap<String, String> {
        let known = super::super::pg_schema::MIGRATIONS.len() as i64;
        let reached = self.run(sqlx::query("SELECT 1").execute(self.store.pool()));
        let (database, migrations) = match reached {
            Err(DiagnosticsError::Unavailable(cause)) => (
                format!("cannot reach the database: {cause}"),
                "not checked: the database does not answer".to_owned(),
            ),
            Err(error) => (error.to_string(), "not checked".to_owned()),
            Ok(_) => {
                let version =
                    self.run(self.query(SCHEMA_VERSION).fetch_optional(self.store.pool()));
                let migrations = match version.map(|row| row.map(|row| row.get::<i64, _>(0))) {
                    Ok(Some(version)) if version == known => "ok".to_owned(),
                    Ok(Some(version)) => {
                        format!("schema version {version}, this build needs {known}")
                    }
                    Ok(None) => format!("schema version 0, this build needs {known}"),
                    Err(error) => format!("cannot read the schema version: {error}"),
                };
                ("ok".to_owned(), migrations)
            }
        };
        BTreeMap::from([
            ("database".to_owned(), database),
            ("migrations".to_owned(), migrations),
        ])
    }
}
