//! The power-loss tests' receiver and rebooted disk: a real receiver whose
//! database lives in a [`FaultDir`], on either SQLite store, and the disk
//! as a reboot finds it.

use std::sync::Arc;

use rfidl_runtime::Durability;
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::{Secret, unix_now};
use rfidl_runtime::store::sqlx_sqlite::SqliteStore;
use uuid::Uuid;

use crate::faultfs::{FaultDir, PowerCut};
use crate::support::{self, Ledger, LedgerService};

/// The store a [`FaultyReceiver`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The blocking store: its connections open the file's `file:` URI,
    /// which names the fault VFS.
    Rusqlite,
    /// The sqlx SQLite store on a `SqlitePool` whose options name the fault
    /// VFS (`SqliteConnectOptions::vfs`); the store's own connections on
    /// the file (the inbox look-up, the migrations) open it through the
    /// same VFS.
    SqlxSqlite,
}

/// A receiver whose database (`receiver.db`) lives in a [`FaultDir`].
pub(crate) struct FaultyReceiver {
    pub fault: FaultDir,
    pub url: String,
    pub secret: Secret,
    pub receiver: Receiver,
    pub ledger: Arc<Ledger>,
    pub client: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl FaultyReceiver {
    pub async fn start(durability: Durability) -> Self {
        Self::start_on(Backend::Rusqlite, durability).await
    }

    pub async fn start_on(backend: Backend, durability: Durability) -> Self {
        let fault = FaultDir::new();
        let uri = fault.db_uri("receiver.db");
        support::create_ledger_table(&uri);
        let secret = Secret::generate();
        let mut config = support::receiver_config(&[&secret]);
        config.inbox.durability = durability;
        let ledger = Arc::new(Ledger::default());
        let service = LedgerService(Arc::clone(&ledger));
        let receiver = match backend {
            Backend::Rusqlite => Receiver::builder(config, &uri).service(service).build(),
            Backend::SqlxSqlite => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(fault.path().join("receiver.db"))
                    .vfs(crate::faultfs::VFS_NAME)
                    .synchronous(match durability {
                        Durability::Full => sqlx::sqlite::SqliteSynchronous::Full,
                        Durability::Normal => sqlx::sqlite::SqliteSynchronous::Normal,
                    });
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await
                    .expect("pool");
                let store = SqliteStore::open(pool).await.expect("the sqlx store");
                Receiver::builder(config, &store).service(service).build()
            }
        }
        .expect("receiver");
        let (url, server) = support::serve(receiver.router()).await;
        Self {
            fault,
            url,
            secret,
            receiver,
            ledger,
            client: reqwest::Client::new(),
            server,
        }
    }

    /// Signs and posts a `Credit` with this id; returns the status, the
    /// `Retry-After` header and the body.
    pub async fn credit_with_headers(
        &self,
        id: &Uuid,
        amount: i64,
    ) -> (u16, Option<String>, serde_json::Value) {
        let body = support::envelope(
            &id.to_string(),
            "Credit",
            serde_json::json!({"account": "acme", "amount": amount}),
        )
        .to_string();
        let headers = rfidl_runtime::signing::SignatureHeaders::sign(
            &id.to_string(),
            unix_now(),
            body.as_bytes(),
            std::slice::from_ref(&self.secret),
        );
        let mut request = self
            .client
            .post(format!("{}/_rf/receive", self.url))
            .header("content-type", "application/json");
        for (name, value) in headers.to_pairs() {
            request = request.header(name, value);
        }
        let response = request.body(body).send().await.expect("send");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.json().await.unwrap_or(serde_json::Value::Null);
        (status, retry_after, body)
    }

    /// Signs and posts a `Credit` with this id; returns the status and body.
    pub async fn credit(&self, id: &Uuid, amount: i64) -> (u16, serde_json::Value) {
        let body = support::envelope(
            &id.to_string(),
            "Credit",
            serde_json::json!({"account": "acme", "amount": amount}),
        )
        .to_string();
        support::post_signed(
            &self.client,
            &self.url,
            body.as_bytes(),
            &id.to_string(),
            &self.secret,
            unix_now(),
        )
        .await
    }

    /// Signs each `Credit` and posts them as one `/_rf/receive/batch`;
    /// returns the per-item results (`{status, body}`).
    pub async fn credit_batch(&self, ids: &[Uuid]) -> Vec<serde_json::Value> {
        let now = unix_now();
        let items: Vec<serde_json::Value> = ids
            .iter()
            .map(|id| {
                let body = support::envelope(
                    &id.to_string(),
                    "Credit",
                    serde_json::json!({"account": "acme", "amount": 1}),
                )
                .to_string();
                let headers: std::collections::BTreeMap<String, String> =
                    rfidl_runtime::signing::SignatureHeaders::sign(
                        &id.to_string(),
                        now,
                        body.as_bytes(),
                        std::slice::from_ref(&self.secret),
                    )
                    .to_pairs()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect();
                serde_json::json!({"headers": headers, "body": body})
            })
            .collect();
        let response = self
            .client
            .post(format!("{}/_rf/receive/batch", self.url))
            .json(&items)
            .send()
            .await
            .expect("send batch");
        assert_eq!(response.status().as_u16(), 200, "a batch is answered 200");
        response.json().await.expect("batch results")
    }

    /// The live database file, for read-only checks with the ordinary VFS.
    pub fn live_db(&self) -> std::path::PathBuf {
        self.fault.path().join("receiver.db")
    }

    pub async fn stop(self) {
        self.server.abort();
        self.receiver.shutdown().await;
    }
}

/// The disk after the reboot, opened with the ordinary VFS and checked.
pub(crate) struct Rebooted {
    _dir: tempfile::TempDir,
    pub conn: rusqlite::Connection,
}

impl Rebooted {
    pub fn from(cut: &PowerCut) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        cut.restore_into(dir.path());
        let conn = rusqlite::Connection::open(dir.path().join("receiver.db")).expect("reopen");
        assert_integrity(&conn);
        Self { _dir: dir, conn }
    }

    pub fn count(&self, sql: &str, id: &str) -> i64 {
        self.conn
            .query_row(sql, [id], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// (inbox rows, ledger rows) of a message.
    pub fn traces(&self, id: &Uuid) -> (i64, i64) {
        let id = id.to_string();
        (
            self.count(
                "SELECT count(*) FROM inbox_messages WHERE message_id = ?1",
                &id,
            ),
            self.count("SELECT count(*) FROM ledger WHERE message_id = ?1", &id),
        )
    }
}

#[track_caller]
pub(crate) fn assert_integrity(conn: &rusqlite::Connection) {
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok", "integrity_check");
}
