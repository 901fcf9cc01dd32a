//! The demo services on sqlx PostgreSQL (`--db postgres://…`): the
//! database a service names, its pool, its business tables, its host on a
//! [`PgStore`], and reading what it wrote. The handlers that write on it
//! are next to their SQLite twins, in `hr.rs` and `engine.rs`.
//!
//! A service's pool has `search_path` set to its schema (`public` unless
//! [`PgDatabase::in_schema`] says otherwise), so the business statements
//! name their tables unqualified; rfidl's own tables are in the same schema
//! ([`PgStore::open_in_schema`]). Must never hold a connection outside a
//! function: everything here opens, works and closes.

use std::str::FromStr as _;

use rfidl_runtime::Config;
use rfidl_runtime::host::HostBuilder;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions as _, Connection as _};

/// The receiver's writer tasks on PostgreSQL (each commits on a connection
/// of the pool).
pub const POSTGRES_WRITERS: usize = 4;

/// A service's pool: its writers, the dispatcher, the wake-up listener,
/// and hiring.
const POOL_SIZE: u32 = POSTGRES_WRITERS as u32 + 4;

/// The advisory lock that the transaction creating a service's tables
/// holds: replicas starting together create them once, the others wait.
const SCHEMA_LOCK: i64 = 7365;

/// A PostgreSQL database (and schema) of a demo service: `--db
/// postgres://user:password@host:port/database`. Shown without its
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct PgDatabase {
    url: String,
    schema: String,
}

impl PgDatabase {
    /// A `postgres://` or `postgresql://` URL, checked as sqlx reads it;
    /// the schema `public`. The error shows the URL without its password.
    pub fn parse(url: &str) -> Result<Self, String> {
        PgConnectOptions::from_str(url).map_err(|error| {
            format!(
                "invalid PostgreSQL URL `{}`: {error}",
                without_password(url)
            )
        })?;
        Ok(Self {
            url: url.to_owned(),
            schema: "public".into(),
        })
    }

    /// This database with the service's tables and rfidl's in `schema`
    /// (created if missing): two services may then share one database.
    pub fn in_schema(mut self, schema: &str) -> Self {
        schema.clone_into(&mut self.schema);
        self
    }

    /// The schema of the service's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The URL's options, every session's `search_path` the schema (and
    /// no `NOTICE` of a `CREATE … IF NOT EXISTS` that skipped in the logs).
    fn options(&self) -> anyhow::Result<PgConnectOptions> {
        Ok(PgConnectOptions::from_str(&self.url)?
            .options([
                ("search_path", self.schema.as_str()),
                ("client_min_messages", "warning"),
            ])
            .disable_statement_logging())
    }

    /// The service's pool.
    pub async fn pool(&self) -> anyhow::Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .connect_with(self.options()?)
            .await?)
    }

    /// One connection, to read or set up.
    async fn connect(&self) -> anyhow::Result<PgConnection> {
        Ok(self.options()?.connect().await?)
    }
}

impl std::fmt::Display for PgDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", without_password(&self.url))?;
        if self.schema != "public" {
            write!(f, " (schema {})", self.schema)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgDatabase({self})")
    }
}

/// `url` with the password of its user information replaced by `***`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        _ => url.to_owned(),
    }
}

/// Creates the schema (if it is not `public`) and a service's tables
/// (`sql`, statements with `IF NOT EXISTS`) in one transaction under an
/// advisory lock: replicas starting together do not race to create them.
pub async fn create_schema(pool: &PgPool, database: &PgDatabase, sql: &str) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut *tx)
        .await?;
    if database.schema != "public" {
        anyhow::ensure!(
            database
                .schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_'),
            "a demo schema is lower-case letters and `_`"
        );
        let create = format!("CREATE SCHEMA IF NOT EXISTS {}", database.schema);
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// A service on `pool`: its outbox, receiver, dispatcher and operations on
/// a [`PgStore`] in the service's schema (rfidl migrates its tables there).
pub async fn host(
    config: Config,
    pool: &PgPool,
    database: &PgDatabase,
) -> anyhow::Result<HostBuilder<sqlx::Postgres>> {
    let store = PgStore::open_in_schema(pool.clone(), &database.schema).await?;
    Ok(rfidl_runtime::Host::builder(config, store).writers(POSTGRES_WRITERS))
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own:
/// callable from synchronous code and from async code alike (the caller's
/// thread waits, as it would for a SQLite read).
fn on_own_runtime<T: Send>(
    work: impl std::future::Future<Output = anyhow::Result<T>> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(work)
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the database thread panicked")))
    })
}

/// One number from `sql` (any integer or numeric result; NULL is 0).
pub fn count(database: &PgDatabase, sql: &str) -> anyhow::Result<i64> {
    on_own_runtime(async {
        let mut conn = database.connect().await?;
        let wrapped = format!("SELECT ({sql})::BIGINT");
        let number: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(wrapped))
            .fetch_one(&mut conn)
            .await?;
        conn.close().await?;
        Ok(number.unwrap_or(0))
    })
}

/// Outbox rows per status.
pub fn outbox_counts(
    database: &PgDatabase,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    on_own_runtime(async {
        let mut conn = database.connect().await?;
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT status, COUNT(*) FROM outbox_messages GROUP BY status")
                .fetch_all(&mut conn)
                .await?;
        conn.close().await?;
        Ok(rows
            .into_iter()
            .map(|(status, n)| (status, n.unsigned_abs()))
            .collect())
    })
}

/// A row of two text columns, with the name of its table.
pub type TableRow = (&'static str, Option<String>, Option<String>);

/// The rows of `queries` (`(table, two-column SELECT)`) whose table exists.
pub fn rows_of(
    database: &PgDatabase,
    queries: &[(&'static str, &'static str)],
) -> anyhow::Result<Vec<TableRow>> {
    on_own_runtime(async {
        let mut conn = database.connect().await?;
        let mut all = Vec::new();
        for (table, sql) in queries {
            let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                .bind(table)
                .fetch_one(&mut conn)
                .await?;
            if !exists {
                continue;
            }
            let rows: Vec<(Option<String>, Option<String>)> =
                sqlx::query_as(*sql).fetch_all(&mut conn).await?;
            all.extend(rows.into_iter().map(|(a, b)| (*table, a, b)));
        }
        conn.close().await?;
        Ok(all)
    })
}

/// Makes up to `limit` delivered messages due again, as if their
/// acknowledgements were lost (the demo's replay); how many.
pub fn replay_sent(database: &PgDatabase, limit: i64) -> anyhow::Result<u64> {
    on_own_runtime(async {
        let mut conn = database.connect().await?;
        let replayed = sqlx::query(
            "UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0 WHERE message_id IN \
             (SELECT message_id FROM outbox_messages WHERE status = 'Sent' LIMIT $1)",
        )
        .bind(limit)
        .execute(&mut conn)
        .await?
        .rows_affected();
        conn.close().await?;
        Ok(replayed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_password() {
        let shown = |url: &str| PgDatabase::parse(url).expect("parses").to_string();
        assert_eq!(
            shown("postgres://app:s3cret@db:5432/hr?sslmode=require"),
            "postgres://app:***@db:5432/hr?sslmode=require"
        );
        assert_eq!(shown("postgres://app@db/hr"), "postgres://app@db/hr");
        let in_schema = PgDatabase::parse("postgres://a:b@h/d").expect("parses");
        assert_eq!(
            in_schema.in_schema("engine").to_string(),
            "postgres://a:***@h/d (schema engine)"
        );
    }

    #[test]
    fn a_malformed_url_is_refused_without_its_password() {
        let error = PgDatabase::parse("postgres://app:s3cret@db:notaport/hr").unwrap_err();
        assert!(error.contains("invalid PostgreSQL URL"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
}
