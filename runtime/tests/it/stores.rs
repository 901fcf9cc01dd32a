//! One test body, every store: [`TestStore`] is a SQLite file in a temp dir
//! (the rusqlite store), a fresh database on the tests' PostgreSQL server
//! (the sqlx PostgreSQL store on a `PgPool`) or a SQLite file in a temp dir
//! on a `SqlitePool` (the sqlx SQLite store), and [`on_every_store!`] turns
//! one `async fn body(store: &TestStore)` into a `sqlite`, a `postgres` and
//! a `sqlx_sqlite` test. The statements the helpers run are the same SQL
//! on all three (the schemas match), so a body never branches on the store.
//!
//! The helpers are synchronous (a body reads like a script); on the sqlx
//! stores they drive the pool with `block_in_place`, so the bodies run on a
//! multi-threaded runtime. Counting and `UPDATE`s for the set-up go through
//! a session of the blocking `postgres` client of their own (a dev
//! dependency), never through the runtime's pool; on sqlx SQLite through
//! rusqlite connections on the same file (both stores share one schema).

mod any;
mod session;

pub(crate) use any::on_each_sqlx_store;
pub use any::{AnyDispatcher, AnyOutbox, OutboxOf};
pub use session::Session;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::diagnostics::{Diagnostics, DiagnosticsBuilder};
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::lifecycle::Lifecycle;
use rfidl_runtime::metrics::Metrics;
use rfidl_runtime::outbox::{Outbox, OutboxRow, OutgoingMessage, Status};
use rfidl_runtime::receiver::{AsyncHostedService, HostedService, Receiver, ReceiverError};
use rfidl_runtime::retention::{Retention, RetentionHandle};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use rfidl_runtime::store::sqlx_sqlite::SqliteStore;
use rfidl_runtime::{Config, Sqlite};
use uuid::Uuid;

use crate::support::postgres::TestDatabase;
use crate::support::{self, LedgerService};

/// Runs `$body` (an `async fn(&TestStore)`) once per store:
/// `NAME::sqlite`, `NAME::postgres` and `NAME::sqlx_sqlite`. A body that
/// does not apply to a store lists the stores it runs on,
/// `on_every_store!(NAME, body, [sqlite, postgres])`, with a comment that
/// says why.
macro_rules! on_every_store {
    ($name:ident, $body:ident) => {
        $crate::stores::on_every_store!($name, $body, [sqlite, postgres, sqlx_sqlite]);
    };
    ($name:ident, $body:ident, [$($store:ident),+]) => {
        mod $name {
            $($crate::stores::on_every_store!(@test $store, $body);)+
        }
    };
    (@test sqlite, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlite() {
            let store = $crate::stores::TestStore::sqlite();
            super::$body(&store).await;
        }
    };
    (@test postgres, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            let Some(store) = $crate::stores::TestStore::postgres() else {
                return;
            };
            super::$body(&store).await;
        }
    };
    (@test sqlx_sqlite, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlx_sqlite() {
            let store = $crate::stores::TestStore::sqlx_sqlite();
            super::$body(&store).await;
        }
    };
}
pub(crate) use on_every_store;

/// Where a test keeps its outbox, inbox and ledger.
#[allow(clippy::large_enum_variant)] // one per test
pub enum TestStore {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        /// The runtime's sqlx store on the test's database.
        store: PgStore,
        /// The helpers' own session (dropped before the database).
        session: Session,
        /// Dropped last: the database goes with the test.
        _db: TestDatabase,
    },
    SqlxSqlite {
        /// The runtime's sqlx store on the file, on a pool of its own.
        store: SqliteStore,
        path: PathBuf,
        /// Dropped last: the file goes with the test.
        _dir: tempfile::TempDir,
    },
}

impl TestStore {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("service.db");
        let store = TestStore::Sqlite { _dir: dir, path };
        store.create_ledger_table();
        store
    }

    /// A SQLite file on a pool of 8 connections, opened (and migrated) by
    /// the sqlx SQLite store.
    pub fn sqlx_sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("service.db");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let store = block_on(async move {
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(options)
                .await
                .expect("pool");
            SqliteStore::open(pool).await.expect("open the sqlx store")
        });
        let store = TestStore::SqlxSqlite {
            store,
            path,
            _dir: dir,
        };
        store.create_ledger_table();
        store
    }

    /// `None` (the test is skipped, loudly) without a PostgreSQL server.
    /// The sqlx store opens (and migrates) the database on a pool of 16
    /// connections.
    pub fn postgres() -> Option<Self> {
        let db = crate::support::postgres::database()?;
        let url = db.url().to_owned();
        let store = block_on(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect(&url)
                .await
                .expect("pool");
            PgStore::open(pool).await.expect("open the sqlx store")
        });
        let session = Session::open(db.url());
        let store = TestStore::Postgres {
            store,
            session,
            _db: db,
        };
        store.create_ledger_table();
        Some(store)
    }

    /// The test database's URL (PostgreSQL only).
    pub fn pg_url(&self) -> &str {
        match self {
            TestStore::Postgres { _db, .. } => _db.url(),
            _ => panic!("not a PostgreSQL store"),
        }
    }

    /// The sqlx store (PostgreSQL only).
    pub fn pg_store(&self) -> &PgStore {
        match self {
            TestStore::Postgres { store, .. } => store,
            _ => panic!("not a PostgreSQL store"),
        }
    }

    /// The SQLite file of either SQLite store, `None` on PostgreSQL.
    pub fn file(&self) -> Option<&PathBuf> {
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => Some(path),
            TestStore::Postgres { .. } => None,
        }
    }

    /// A second, empty store of the same kind (a peer's database).
    pub fn another(&self) -> Self {
        match self {
            TestStore::Sqlite { .. } => TestStore::sqlite(),
            TestStore::Postgres { .. } => TestStore::postgres().expect("a second database"),
            TestStore::SqlxSqlite { .. } => TestStore::sqlx_sqlite(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            TestStore::Sqlite { .. } => "sqlite",
            TestStore::Postgres { .. } => "postgres",
            TestStore::SqlxSqlite { .. } => "sqlx_sqlite",
        }
    }

    pub fn outbox(&self, config: Config) -> AnyOutbox {
        let metrics = Arc::new(Metrics::default());
        match self {
            TestStore::Sqlite { path, .. } => {
                AnyOutbox::Sqlite(Outbox::with_metrics(config, path, metrics))
            }
            TestStore::Postgres { store, .. } => {
                AnyOutbox::Postgres(Outbox::with_metrics(config, store, metrics))
            }
            TestStore::SqlxSqlite { store, .. } => {
                AnyOutbox::SqlxSqlite(Outbox::with_metrics(config, store, metrics))
            }
        }
    }

    /// Runs `sql` (the same on every store) on a connection of its own.
    pub fn execute(&self, sql: &str) {
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let conn =
                    rfidl_runtime::store::sqlite::open(path, rfidl_runtime::Durability::Normal)
                        .expect("open");
                conn.execute_batch(sql).expect("sql");
            }
            TestStore::Postgres { .. } => {
                let sql = sql.to_owned();
                self.with_pg(move |client| client.batch_execute(&sql).expect("sql"));
            }
        }
    }

    /// Runs `sqlite` or `postgres`, whichever is this store's dialect: for
    /// the few statements one text cannot say on both (an auto-numbered key).
    pub fn execute_dialects(&self, sqlite: &str, postgres: &str) {
        match self {
            TestStore::Sqlite { .. } | TestStore::SqlxSqlite { .. } => self.execute(sqlite),
            TestStore::Postgres { .. } => self.execute(postgres),
        }
    }

    fn create_ledger_table(&self) {
        self.execute(
            "CREATE TABLE IF NOT EXISTS ledger (message_id TEXT NOT NULL, account TEXT NOT NULL, \
             amount BIGINT NOT NULL)",
        );
        // The outbox and inbox tables too, so counting works before any
        // part of the runtime opened the database (the sqlx store migrated
        // its database when it opened).
        if let TestStore::Sqlite { path, .. } = self {
            rfidl_runtime::store::sqlite::open(path, rfidl_runtime::Durability::Normal)
                .expect("migrate");
        }
    }

    /// Runs `work` on the helpers' PostgreSQL session, off the async
    /// executor.
    fn with_pg<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
    ) -> T {
        let TestStore::Postgres { session, .. } = self else {
            unreachable!("a PostgreSQL helper on a SQLite store")
        };
        session.run(work)
    }

    /// A single number (`SELECT count(*) …`), the same SQL on both stores.
    pub fn count(&self, sql: &str) -> i64 {
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).expect("open");
                conn.query_row(sql, [], |r| r.get(0)).expect("count")
            }
            TestStore::Postgres { .. } => {
                let sql = sql.to_owned();
                self.with_pg(move |client| client.query_one(&sql, &[]).expect("count").get(0))
            }
        }
    }

    /// The `N` numbers of one row (`SELECT (SELECT count(*) …), …`), the
    /// same SQL on every store.
    pub fn counts<const N: usize>(&self, sql: &str) -> [i64; N] {
        let numbers: Vec<i64> = match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).expect("open");
                conn.query_row(sql, [], |r| (0..N).map(|i| r.get(i)).collect())
                    .expect("counts")
            }
            TestStore::Postgres { .. } => {
                let sql = sql.to_owned();
                self.with_pg(move |client| {
                    let row = client.query_one(&sql, &[]).expect("counts");
                    (0..N).map(|i| row.get(i)).collect()
                })
            }
        };
        numbers.try_into().expect("N numbers")
    }

    /// A single text (`SELECT response …`), the same SQL on both stores;
    /// `None` for no row or NULL.
    pub fn text(&self, sql: &str) -> Option<String> {
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).expect("open");
                rusqlite::OptionalExtension::optional(conn.query_row(sql, [], |r| r.get(0)))
                    .expect("query")
                    .flatten()
            }
            TestStore::Postgres { .. } => {
                let sql = sql.to_owned();
                self.with_pg(move |client| {
                    client
                        .query_opt(&sql, &[])
                        .expect("query")
                        .and_then(|r| r.get(0))
                })
            }
        }
    }

    /// `(status, count)` of the outbox, by status.
    pub fn status_counts(&self) -> Vec<(String, i64)> {
        const SQL: &str =
            "SELECT status, COUNT(*) FROM outbox_messages GROUP BY status ORDER BY status";
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).expect("open");
                let mut statement = conn.prepare(SQL).expect("prepare");
                statement
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .expect("query")
                    .collect::<Result<_, _>>()
                    .expect("rows")
            }
            TestStore::Postgres { .. } => self.with_pg(|client| {
                client
                    .query(SQL, &[])
                    .expect("query")
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect()
            }),
        }
    }

    /// Enqueues `message` in a transaction of the store's own kind, then
    /// commits (`commit = true`) or rolls back.
    pub fn enqueue_then(&self, outbox: &AnyOutbox, message: OutgoingMessage, commit: bool) -> Uuid {
        self.enqueue_with(outbox, message, "", commit)
    }

    /// Runs `business_sql` (the same on every store; may be empty), then
    /// enqueues `message`, in one transaction of the store's own kind, and
    /// commits (`commit = true`) or rolls back.
    pub fn enqueue_with(
        &self,
        outbox: &AnyOutbox,
        message: OutgoingMessage,
        business_sql: &str,
        commit: bool,
    ) -> Uuid {
        self.enqueue_all(outbox, vec![message], business_sql, commit)[0]
    }

    /// Enqueues `message` and commits.
    pub fn enqueue(&self, outbox: &AnyOutbox, message: OutgoingMessage) -> Uuid {
        self.enqueue_then(outbox, message, true)
    }

    /// Enqueues every message of `messages` in one transaction, committed.
    pub fn enqueue_many(&self, outbox: &AnyOutbox, messages: Vec<OutgoingMessage>) -> Vec<Uuid> {
        self.enqueue_all(outbox, messages, "", true)
    }

    /// Runs `business_sql`, then enqueues `messages`, in one transaction,
    /// committed or rolled back.
    fn enqueue_all(
        &self,
        outbox: &AnyOutbox,
        messages: Vec<OutgoingMessage>,
        business_sql: &str,
        commit: bool,
    ) -> Vec<Uuid> {
        /// The same on either sqlx pool.
        macro_rules! on_pool {
            ($store:expr, $outbox:expr) => {
                block_on(async move {
                    let mut tx = $store.pool().begin().await.expect("tx");
                    if !business_sql.is_empty() {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(business_sql))
                            .execute(&mut *tx)
                            .await
                            .expect("business sql");
                    }
                    let mut ids = Vec::with_capacity(messages.len());
                    for message in messages {
                        ids.push(
                            $outbox
                                .enqueue_async(&mut tx, message)
                                .await
                                .expect("enqueue"),
                        );
                    }
                    if commit {
                        tx.commit().await.expect("commit");
                    } else {
                        tx.rollback().await.expect("rollback");
                    }
                    ids
                })
            };
        }
        match self {
            TestStore::Sqlite { path, .. } => {
                let mut conn =
                    rfidl_runtime::store::sqlite::open(path, rfidl_runtime::Durability::Normal)
                        .expect("open");
                let tx = conn.transaction().expect("tx");
                tx.execute_batch(business_sql).expect("business sql");
                let ids = messages
                    .into_iter()
                    .map(|message| outbox.sqlite().enqueue(&tx, message).expect("enqueue"))
                    .collect();
                if commit {
                    tx.commit().expect("commit");
                }
                ids
            }
            TestStore::Postgres { store, .. } => on_pool!(store, outbox.postgres()),
            TestStore::SqlxSqlite { store, .. } => on_pool!(store, outbox.sqlx_sqlite()),
        }
    }

    /// `n` processed inbox rows from `billing` (ids `{prefix}-{i}`) that
    /// expire at `expires_at` (ms), in one transaction.
    pub fn insert_inbox_rows(&self, prefix: &str, n: usize, expires_at: i64) {
        let rows: Vec<(String, i64, i64)> = (0..n)
            .map(|i| (format!("{prefix}-{i}"), expires_at - 86_400_000, expires_at))
            .collect();
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let mut conn = rusqlite::Connection::open(path).expect("open");
                let tx = conn.transaction().expect("tx");
                for (id, processed_at, expires_at) in rows {
                    tx.execute(
                        "INSERT INTO inbox_messages (source_service_id, message_id, endpoint, \
                         payload_sha256, processed_at, response, expires_at) \
                         VALUES ('billing', ?1, 'Credit', ?2, ?3, NULL, ?4)",
                        rusqlite::params![id, vec![0_u8; 32], processed_at, expires_at],
                    )
                    .expect("insert inbox row");
                }
                tx.commit().expect("commit");
            }
            TestStore::Postgres { .. } => self.with_pg(move |client| {
                let mut tx = client.transaction().expect("tx");
                for (id, processed_at, expires_at) in rows {
                    tx.execute(
                        "INSERT INTO inbox_messages (source_service_id, message_id, endpoint, \
                         payload_sha256, processed_at, response, expires_at) \
                         VALUES ('billing', $1, 'Credit', $2, $3, NULL, $4)",
                        &[&id, &vec![0_u8; 32], &processed_at, &expires_at],
                    )
                    .expect("insert inbox row");
                }
                tx.commit().expect("commit");
            }),
        }
    }

    /// Diagnostics of this store.
    pub fn diagnostics(&self) -> DiagnosticsBuilder {
        match self {
            TestStore::Sqlite { path, .. } => Diagnostics::builder(path),
            TestStore::Postgres { store, .. } => Diagnostics::builder(store),
            TestStore::SqlxSqlite { store, .. } => Diagnostics::builder(store),
        }
    }

    /// The retention task on this store; its first pass runs at once.
    pub fn retention(&self, config: Config, metrics: Arc<Metrics>) -> RetentionHandle {
        match self {
            TestStore::Sqlite { path, .. } => Retention::spawn(config, path, metrics),
            TestStore::Postgres { store, .. } => Retention::spawn(config, store, metrics),
            TestStore::SqlxSqlite { store, .. } => Retention::spawn(config, store, metrics),
        }
        .expect("retention")
    }

    /// The retention task on this store, leaving the expiry of the
    /// interface versions `handled` to their failure handlers' dispatcher.
    pub fn retention_beside(
        &self,
        config: Config,
        metrics: Arc<Metrics>,
        handled: &[(&str, u32)],
    ) -> RetentionHandle {
        match self {
            TestStore::Sqlite { path, .. } => {
                Retention::spawn_with_failure_handlers(config, path, metrics, handled)
            }
            TestStore::Postgres { store, .. } => {
                Retention::spawn_with_failure_handlers(config, store, metrics, handled)
            }
            TestStore::SqlxSqlite { store, .. } => {
                Retention::spawn_with_failure_handlers(config, store, metrics, handled)
            }
        }
        .expect("retention")
    }

    /// The outbox row of `id`.
    pub fn row(&self, id: &Uuid) -> OutboxRow {
        match self {
            TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).expect("open");
                rfidl_runtime::store::sqlite::outbox_row(&conn, id)
                    .expect("query")
                    .expect("row exists")
            }
            TestStore::Postgres { .. } => {
                let id = id.to_string();
                self.with_pg(move |client| {
                    let r = client
                        .query_one(
                            "SELECT message_id, destination, endpoint, status, retry_count, \
                             max_retries, last_error, response FROM outbox_messages \
                             WHERE message_id = $1",
                            &[&id],
                        )
                        .expect("row exists");
                    let status: String = r.get(3);
                    let response: Option<String> = r.get(7);
                    OutboxRow {
                        message_id: r.get(0),
                        destination: r.get(1),
                        endpoint: r.get(2),
                        status: Status::parse(&status).expect("status"),
                        retry_count: r.get::<_, i64>(4) as u32,
                        max_retries: r.get::<_, i64>(5) as u32,
                        last_error: r.get(6),
                        response: response.and_then(|t| serde_json::from_str(&t).ok()),
                    }
                })
            }
        }
    }

    /// Waits (at most 10 s) for `id` to reach `wanted`.
    pub async fn wait_for(&self, id: &Uuid, wanted: Status) -> OutboxRow {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let row = self.row(id);
            if row.status == wanted || Instant::now() > deadline {
                assert_eq!(row.status, wanted, "{} {row:?}", self.name());
                return row;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (at most 10 s) for every message of `ids` to reach `wanted`,
    /// reading all statuses in one query per look (one session, where a
    /// `wait_for` per message would open hundreds on PostgreSQL).
    pub async fn wait_for_all(&self, ids: &[Uuid], wanted: Status) {
        const SQL: &str = "SELECT message_id, status FROM outbox_messages";
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let statuses: std::collections::HashMap<String, String> = match self {
                TestStore::Sqlite { path, .. } | TestStore::SqlxSqlite { path, .. } => {
                    let conn = rusqlite::Connection::open(path).expect("open");
                    let mut statement = conn.prepare(SQL).expect("prepare");
                    statement
                        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                        .expect("query")
                        .collect::<Result<_, _>>()
                        .expect("rows")
                }
                TestStore::Postgres { .. } => self.with_pg(|client| {
                    client
                        .query(SQL, &[])
                        .expect("query")
                        .iter()
                        .map(|r| (r.get(0), r.get(1)))
                        .collect()
                }),
            };
            let behind: Vec<(&Uuid, Option<&String>)> = ids
                .iter()
                .map(|id| (id, statuses.get(&id.to_string())))
                .filter(|(_, status)| status.map(String::as_str) != Some(wanted.as_str()))
                .collect();
            if behind.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {} of {} not {wanted:?}, e.g. {:?}",
                self.name(),
                behind.len(),
                ids.len(),
                &behind[..behind.len().min(3)]
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A dispatcher for `outbox` on this store.
    pub fn dispatcher(&self, outbox: &AnyOutbox) -> AnyDispatcher {
        match self {
            TestStore::Sqlite { .. } => AnyDispatcher::Sqlite(Dispatcher::builder(outbox.sqlite())),
            TestStore::Postgres { .. } => {
                AnyDispatcher::Postgres(Dispatcher::builder(outbox.postgres()))
            }
            TestStore::SqlxSqlite { .. } => {
                AnyDispatcher::SqlxSqlite(Dispatcher::builder(outbox.sqlx_sqlite()))
            }
        }
    }

    /// A receiver hosting `service` (written for every store) on this
    /// store, built.
    pub fn receiver_hosting<H>(&self, config: Config, service: H) -> Result<Receiver, ReceiverError>
    where
        H: HostedService<Sqlite>
            + AsyncHostedService<sqlx::Postgres>
            + AsyncHostedService<sqlx::Sqlite>,
    {
        self.receiver_hosting_in(config, service, None)
    }

    /// [`Self::receiver_hosting`], sharing `lifecycle` (the set of
    /// decommissioned versions) when given.
    fn receiver_hosting_in<H>(
        &self,
        config: Config,
        service: H,
        lifecycle: Option<&Lifecycle>,
    ) -> Result<Receiver, ReceiverError>
    where
        H: HostedService<Sqlite>
            + AsyncHostedService<sqlx::Postgres>
            + AsyncHostedService<sqlx::Sqlite>,
    {
        /// The same on every store's builder.
        macro_rules! build {
            ($location:expr) => {{
                let builder = Receiver::builder(config, $location).service(service);
                match lifecycle {
                    Some(lifecycle) => builder.lifecycle(lifecycle),
                    None => builder,
                }
                .build()
            }};
        }
        match self {
            TestStore::Sqlite { path, .. } => build!(path),
            TestStore::Postgres { store, .. } => build!(store),
            TestStore::SqlxSqlite { store, .. } => build!(store),
        }
    }

    /// A receiver hosting the ledger on this store, built.
    pub fn receiver(
        &self,
        config: Config,
        ledger: Arc<support::Ledger>,
    ) -> Result<Receiver, ReceiverError> {
        self.receiver_hosting_in(config, LedgerService(ledger), None)
    }

    /// A receiver hosting the ledger that shares `lifecycle`, built.
    pub fn receiver_with_lifecycle(
        &self,
        config: Config,
        ledger: Arc<support::Ledger>,
        lifecycle: &Lifecycle,
    ) -> Result<Receiver, ReceiverError> {
        self.receiver_hosting_in(config, LedgerService(ledger), Some(lifecycle))
    }

    /// A receiver hosting the ledger, served on a free loopback port.
    pub async fn start_receiver(&self, config: Config) -> support::TestReceiver {
        let ledger = Arc::new(support::Ledger::default());
        let receiver = self
            .receiver(config.clone(), ledger.clone())
            .expect("receiver");
        let (url, server) = support::serve(receiver.router()).await;
        let secret = Secret::parse(&config.peers[support::SOURCE][0]).expect("secret");
        support::TestReceiver {
            url,
            db: self.file().cloned().unwrap_or_default(),
            ledger,
            secret,
            receiver,
            _server: server,
        }
    }
}

/// Runs `work` to its end from a synchronous helper called on a test's
/// multi-threaded runtime (the sqlx pool lives on it).
pub fn block_on<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(work))
}
