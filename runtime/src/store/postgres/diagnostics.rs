//! The diagnostics routes' statements on PostgreSQL
//! ([`crate::diagnostics::DiagnosticsStore`]): the SQLite ones in
//! PostgreSQL's dialect (`$n` placeholders with typed parameters, one round
//! trip each and no prepare; `GREATEST` for SQLite's two-argument `MAX`;
//! `($1::text IS NULL OR …)` for an optional filter). What the routes make
//! of the rows is shared with SQLite in [`crate::diagnostics`].
//!
//! Two connections, as on SQLite: one for the routes, one for
//! `GET /_rf/readyz`, so a probe never queues behind a slow query. The
//! probe's connection connects and runs each statement within the
//! readiness timeout (`connect_timeout`, `statement_timeout`). Either is
//! opened again before its next use when it broke.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};

use super::{Connection, PostgresUrl, error_text};
use crate::diagnostics::{
    AttentionRow, DiagnosticsError, DiagnosticsStore, ErrorGroupRow, RowFilter, UnsentGroup,
};
use crate::outbox::Status;
use crate::store::StoreError;
use crate::store::pg_schema::ROW_FILTER;

/// One connection of the diagnostics routes.
pub(crate) struct PostgresDiagnostics {
    url: PostgresUrl,
    /// For the readiness connection: how long a connection attempt and each
    /// statement may take.
    timeout: Option<Duration>,
    conn: Mutex<Connection>,
}

/// Connects (and migrates), for [`crate::diagnostics::DiagnosticsBuilder::build`]:
/// the routes' connection and the readiness probe's. A wrong URL or an
/// unreachable server is [`StoreError::Postgres`] naming host and cause.
pub(crate) fn open(
    url: &PostgresUrl,
    readiness_timeout: Duration,
) -> Result<(PostgresDiagnostics, PostgresDiagnostics), StoreError> {
    let client = super::open(url)?;
    let routes = PostgresDiagnostics {
        url: url.clone(),
        timeout: None,
        conn: Mutex::new(Connection::new(url.clone(), client)),
    };
    let probe = PostgresDiagnostics {
        url: url.clone(),
        timeout: Some(readiness_timeout),
        conn: Mutex::new(Connection {
            url: url.clone(),
            client: None,
        }),
    };
    // Connected now, so a server that takes the routes' connection but not
    // a second one is a start-up error too.
    probe.connect()?;
    Ok((routes, probe))
}

/// The parameters `$1` to `$8` of `pg_schema::ROW_FILTER`, owned where the filter
/// holds them otherwise.
struct FilterParams<'a> {
    filter: &'a RowFilter,
    status: Option<&'static str>,
    after_at: Option<i64>,
    after_id: Option<&'a str>,
}

impl<'a> FilterParams<'a> {
    fn new(filter: &'a RowFilter) -> Self {
        Self {
            filter,
            status: filter.status.map(Status::as_str),
            after_at: filter.after.as_ref().map(|(at, _)| *at),
            after_id: filter.after.as_ref().map(|(_, id)| id.as_str()),
        }
    }

    fn params(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        vec![
            (&self.status, Type::TEXT),
            (&self.filter.destination, Type::TEXT),
            (&self.filter.interface, Type::TEXT),
            (&self.filter.method, Type::TEXT),
            (&self.filter.error, Type::TEXT),
            (&self.filter.created_before, Type::INT8),
            (&self.after_at, Type::INT8),
            (&self.after_id, Type::TEXT),
        ]
    }
}

/// The group queries: the two `status IN (…)` conditions repeat those of the
/// partial indexes `outbox_due` and `outbox_attention`.
const UNSENT_GROUPS: [&str; 2] = [
    "SELECT destination, status, COUNT(*), MIN(created_at), \
     COUNT(*) FILTER (WHERE created_at > $1) FROM outbox_messages \
     WHERE status IN ('Pending', 'Sending') GROUP BY destination, status",
    "SELECT destination, status, COUNT(*), MIN(created_at), 0::bigint FROM outbox_messages \
     WHERE status IN ('Failed', 'DeadLetter', 'Expired') GROUP BY destination, status",
];

impl PostgresDiagnostics {
    fn unavailable(&self, cause: impl std::fmt::Display) -> DiagnosticsError {
        DiagnosticsError::Unavailable(format!(
            "PostgreSQL database at {}: {cause}",
            self.url.target()
        ))
    }

    /// Opens the connection if it is not open (or broke): within the
    /// timeout, and with it as `statement_timeout`, on the probe's.
    fn connect(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if conn.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        conn.client = None;
        let mut config = self.url.config.clone();
        if let Some(timeout) = self.timeout {
            config.connect_timeout(timeout);
        }
        let timeout = self.timeout;
        let target = self.url.target();
        let client = super::off_runtime(move || -> Result<Client, StoreError> {
            let mut client = config.connect(NoTls).map_err(|e| StoreError::Postgres {
                target,
                cause: format!("cannot connect: {}", error_text(&e)),
            })?;
            if let Some(timeout) = timeout {
                client
                    .batch_execute(&format!(
                        "SET statement_timeout = {}",
                        timeout.as_millis().max(1)
                    ))
                    .map_err(|e| super::statement(&e))?;
            }
            Ok(client)
        })?;
        conn.client = Some(client);
        Ok(())
    }

    /// Runs the read `work` on the client, connecting first if needed. A
    /// read that failed because the connection broke (the server restarted,
    /// an administrator ended the session) runs once more on a new one, so
    /// the first request after a restart is answered too.
    fn with_client<T>(
        &self,
        mut work: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, DiagnosticsError> {
        match self.once(&mut work) {
            Err(Broken::Closed(_)) => self
                .once(&mut work)
                .map_err(|broken| broken.into_error(self)),
            done => done.map_err(|broken| broken.into_error(self)),
        }
    }

    /// Runs the write `work` once: a write whose connection broke may have
    /// committed, so it is not run again (the caller sees 503 and asks again).
    fn write<T>(
        &self,
        mut work: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, DiagnosticsError> {
        self.once(&mut work)
            .map_err(|broken| broken.into_error(self))
    }

    fn once<T>(
        &self,
        work: &mut impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, Broken> {
        self.connect().map_err(|e| Broken::Other(e.to_string()))?;
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let client = conn
            .client
            .as_mut()
            .ok_or_else(|| Broken::Other("no connection".to_owned()))?;
        match work(client) {
            Ok(value) => Ok(value),
            Err(error) => {
                let text = error_text(&error);
                if client.is_closed() || session_ended(&error) {
                    // The client may not have seen its socket close yet:
                    // drop it, so the next `connect` opens a new session.
                    conn.client = None;
                    Err(Broken::Closed(text))
                } else {
                    Err(Broken::Other(text))
                }
            }
        }
    }

    fn count(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64, DiagnosticsError> {
        let count: i64 =
            self.with_client(|client| client.query_typed_one(sql, params).map(|row| row.get(0)))?;
        Ok(count.max(0) as u64)
    }
}

/// The error a server sends as it ends the session (SQLSTATE class 57P:
/// an administrator's command, a crash, a shutdown) or a connection
/// exception (class 08): it can arrive before the socket's close does.
fn session_ended(error: &postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        let code = code.code();
        code.starts_with("57P") || code.starts_with("08")
    })
}

/// Why a statement failed: its connection closed, or anything else.
enum Broken {
    Closed(String),
    Other(String),
}

impl Broken {
    fn into_error(self, store: &PostgresDiagnostics) -> DiagnosticsError {
        match self {
            Broken::Closed(cause) | Broken::Other(cause) => store.unavailable(cause),
        }
    }
}

impl DiagnosticsStore for PostgresDiagnostics {
    fn decommissioned(&self) -> Result<Vec<(String, i64, i64, i64)>, DiagnosticsError> {
        self.with_client(|client| {
            Ok(client
                .query(crate::store::DECOMMISSIONED_SQL, &[])?
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
                .collect())
        })
    }

    fn unsent_groups(&self, now: i64) -> Result<Vec<UnsentGroup>, DiagnosticsError> {
        self.with_client(|client| {
            let mut groups = Vec::new();
            let [due, attention] = UNSENT_GROUPS;
            let due = client.query_typed(due, &[(&now, postgres::types::Type::INT8)])?;
            for rows in [due, client.query_typed(attention, &[])?] {
                for row in rows {
                    let status: String = row.get(1);
                    let Some(status) = Status::parse(&status) else {
                        continue;
                    };
                    groups.push(UnsentGroup {
                        destination: row.get(0),
                        status,
                        rows: row.get::<_, i64>(2).max(0) as u64,
                        scheduled: row.get::<_, i64>(4).max(0) as u64,
                        oldest_created_at: row.get(3),
                    });
                }
            }
            Ok(groups)
        })
    }

    fn last_sent_at(&self) -> Result<Option<i64>, DiagnosticsError> {
        self.with_client(|client| {
            client
                .query_typed_one(
                    "SELECT MAX(sent_at) FROM outbox_messages WHERE status = 'Sent'",
                    &[],
                )
                .map(|row| row.get(0))
        })
    }

    fn sent_count(&self) -> Result<u64, DiagnosticsError> {
        self.count(
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
            &[],
        )
    }

    fn attention_rows(
        &self,
        filter: &RowFilter,
        limit: u32,
    ) -> Result<Vec<AttentionRow>, DiagnosticsError> {
        let limit = i64::from(limit);
        let sql = format!(
            "SELECT message_id, correlation_id, message_type, destination, interface, \
                    version, endpoint, status, retry_count, max_retries, last_error, \
                    created_at, last_attempt_at, expires_at \
             FROM outbox_messages \
             WHERE status IN ('Failed', 'DeadLetter', 'Expired') {ROW_FILTER} \
             ORDER BY created_at, message_id LIMIT $9"
        );
        let bound = FilterParams::new(filter);
        let rows = self.with_client(|client| {
            let mut params = bound.params();
            params.push((&limit, Type::INT8));
            client.query_typed(&sql, &params)
        })?;
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
        let sql = format!(
            "SELECT destination, last_error, COUNT(*), MIN(created_at), MAX(created_at) \
             FROM outbox_messages \
             WHERE status IN ('Failed', 'DeadLetter', 'Expired') {ROW_FILTER} \
             GROUP BY destination, last_error"
        );
        let bound = FilterParams::new(filter);
        let rows = self.with_client(|client| client.query_typed(&sql, &bound.params()))?;
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
        let updated = self.write(|client| {
            client.execute_typed(
                "UPDATE outbox_messages \
                 SET status = 'Pending', retry_count = 0, next_retry_at = $2, \
                     lease_token = NULL, expires_at = GREATEST(expires_at, $3) \
                 WHERE message_id = $1 AND status IN ('Failed', 'DeadLetter', 'Expired')",
                &[
                    (&message_id, Type::TEXT),
                    (&now_ms, Type::INT8),
                    (&renew_until_ms, Type::INT8),
                ],
            )
        })?;
        Ok(updated as usize)
    }

    fn status_of(&self, message_id: &str) -> Result<Option<String>, DiagnosticsError> {
        self.with_client(|client| {
            client
                .query_typed_opt(
                    "SELECT status FROM outbox_messages WHERE message_id = $1",
                    &[(&message_id, Type::TEXT)],
                )
                .map(|row| row.map(|row| row.get(0)))
        })
    }

    fn retry_matching(
        &self,
        filter: &RowFilter,
        now_ms: i64,
        renew_until_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let sql = format!(
            "UPDATE outbox_messages \
             SET status = 'Pending', retry_count = 0, next_retry_at = $9, \
                 lease_token = NULL, expires_at = GREATEST(expires_at, $10) \
             WHERE status IN ('Failed', 'DeadLetter', 'Expired') {ROW_FILTER}"
        );
        let bound = FilterParams::new(filter);
        let updated = self.write(|client| {
            let mut params = bound.params();
            params.extend([
                (&now_ms as _, Type::INT8),
                (&renew_until_ms as _, Type::INT8),
            ]);
            client.execute_typed(&sql, &params)
        })?;
        Ok(updated as usize)
    }

    fn discard_one(&self, message_id: &str, now_ms: i64) -> Result<usize, DiagnosticsError> {
        let updated = self.write(|client| {
            client.execute_typed(
                "UPDATE outbox_messages \
                 SET status = 'Discarded', discarded_at = $2, lease_token = NULL \
                 WHERE message_id = $1 AND status IN ('Failed', 'DeadLetter', 'Expired')",
                &[(&message_id, Type::TEXT), (&now_ms, Type::INT8)],
            )
        })?;
        Ok(updated as usize)
    }

    fn discard_matching(&self, filter: &RowFilter, now_ms: i64) -> Result<usize, DiagnosticsError> {
        let sql = format!(
            "UPDATE outbox_messages \
             SET status = 'Discarded', discarded_at = $9, lease_token = NULL \
             WHERE status IN ('Failed', 'DeadLetter', 'Expired') {ROW_FILTER}"
        );
        let bound = FilterParams::new(filter);
        let updated = self.write(|client| {
            let mut params = bound.params();
            params.push((&now_ms, Type::INT8));
            client.execute_typed(&sql, &params)
        })?;
        Ok(updated as usize)
    }

    fn count_older(
        &self,
        message_id: Option<&str>,
        filter: &RowFilter,
        before_ms: i64,
    ) -> Result<usize, DiagnosticsError> {
        let sql = format!(
            "SELECT COUNT(*) FROM outbox_messages \
             WHERE status IN ('Failed', 'DeadLetter', 'Expired') {ROW_FILTER} \
               AND created_at < $9 AND ($10::text IS NULL OR message_id = $10)"
        );
        let bound = FilterParams::new(filter);
        let mut params = bound.params();
        params.extend([
            (&before_ms as _, Type::INT8),
            (&message_id as _, Type::TEXT),
        ]);
        let count = self.count(&sql, &params)?;
        Ok(count as usize)
    }

    fn inbox_size(&self) -> Result<u64, DiagnosticsError> {
        self.count("SELECT COUNT(*) FROM inbox_messages", &[])
    }

    /// `SELECT 1` answers within the readiness timeout, and `rfidl_schema`
    /// records the migrations this build knows.
    fn database_checks(&self) -> BTreeMap<String, String> {
        let mut checks = BTreeMap::new();
        let known = super::MIGRATIONS.len() as i64;
        let reached = self.with_client(|client| client.query_typed_one("SELECT 1", &[]).map(drop));
        let (database, migrations) = match reached {
            Err(DiagnosticsError::Unavailable(cause)) => (
                format!("cannot reach the database: {cause}"),
                "not checked: the database does not answer".to_owned(),
            ),
            Err(error) => (error.to_string(), "not checked".to_owned()),
            Ok(()) => {
                let version = self.with_client(|client| {
                    client
                        .query_typed_opt("SELECT version FROM rfidl_schema", &[])
                        .map(|row| row.map(|row| row.get::<_, i64>(0)))
                });
                let migrations = match version {
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
        checks.insert("database".to_owned(), database);
        checks.insert("migrations".to_owned(), migrations);
        checks
    }
}
