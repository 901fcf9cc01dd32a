//! Shared fixtures: a real receiver on 127.0.0.1 with a ledger service whose
//! handler writes business rows in the delivery's transaction.

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod nats;
pub mod postgres;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rfidl_runtime::receiver::{
    AsyncHostedService, HandlerError, HostedInterface, HostedService, IncomingCall, Receiver,
    decode_payload,
};
use rfidl_runtime::signing::{Secret, SignatureHeaders};
use rfidl_runtime::{BoxFuture, Config};

pub const INTERFACE: &str = "test.Ledger";
pub const FINGERPRINT: &str = "sha256:ledger-v1";
pub const SOURCE: &str = "billing";

/// Handles `Credit {account, amount}` by inserting a ledger row.
/// `fail_next` makes the next N credits fail *after* writing their row.
#[derive(Default)]
pub struct Ledger {
    pub fail_next: AtomicU32,
    pub calls: AtomicU32,
}

#[derive(serde::Deserialize)]
struct Credit {
    account: String,
    amount: i64,
}

const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: INTERFACE,
    version: 1,
    fingerprint: FINGERPRINT,
    endpoints: &["Credit", "Poison", "Panic"],
    manifest_json: r#"{"interface":"test.Ledger","version":1}"#,
}];

/// The hosted form of a shared [`Ledger`].
pub struct LedgerService(pub Arc<Ledger>);

impl HostedService for LedgerService {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        let this = &self.0;
        this.calls.fetch_add(1, Ordering::SeqCst);
        match call.endpoint {
            "Credit" => {
                let credit: Credit = decode_payload(call.payload)?;
                tx.execute(
                    "INSERT INTO ledger (message_id, account, amount) VALUES (?1, ?2, ?3)",
                    rusqlite::params![call.message_id, credit.account, credit.amount],
                )?;
                if this.fail_next.load(Ordering::SeqCst) > 0 {
                    this.fail_next.fetch_sub(1, Ordering::SeqCst);
                    return Err(HandlerError::retryable("the bank is down"));
                }
                let balance: i64 = tx.query_row(
                    "SELECT COALESCE(SUM(amount), 0) FROM ledger WHERE account = ?1",
                    [&credit.account],
                    |r| r.get(0),
                )?;
                Ok(serde_json::json!({ "balance": balance }))
            }
            "Poison" => Err(HandlerError::poison("never valid")),
            "Panic" => panic!("handler bug"),
            other => Err(HandlerError::unknown_endpoint(other)),
        }
    }
}

// The same ledger on both sqlx stores: the same statements, async, on the
// receiver's connection (in its transaction).
crate::stores::on_each_sqlx_store! {
impl AsyncHostedService<Db> for LedgerService {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut Conn,
    ) -> BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            let this = &self.0;
            this.calls.fetch_add(1, Ordering::SeqCst);
            match call.endpoint {
                "Credit" => {
                    let credit: Credit = decode_payload(call.payload)?;
                    sqlx::query(
                        "INSERT INTO ledger (message_id, account, amount) VALUES ($1, $2, $3)",
                    )
                    .bind(call.message_id)
                    .bind(&credit.account)
                    .bind(credit.amount)
                    .execute(&mut *conn)
                    .await
                    .map_err(HandlerError::retryable)?;
                    if this.fail_next.load(Ordering::SeqCst) > 0 {
                        this.fail_next.fetch_sub(1, Ordering::SeqCst);
                        return Err(HandlerError::retryable("the bank is down"));
                    }
                    let balance: i64 = sqlx::query_scalar(
                        "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM ledger WHERE account = $1",
                    )
                    .bind(&credit.account)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(HandlerError::retryable)?;
                    Ok(serde_json::json!({ "balance": balance }))
                }
                "Poison" => Err(HandlerError::poison("never valid")),
                "Panic" => panic!("handler bug"),
                other => Err(HandlerError::unknown_endpoint(other)),
            }
        })
    }
}
}

/// A receiver with its inbox (and the ledger table) in `dir/receiver.db`.
pub struct TestReceiver {
    pub url: String,
    pub db: PathBuf,
    pub ledger: Arc<Ledger>,
    pub secret: Secret,
    pub receiver: Receiver,
    /// The server task; aborted when the test drops it.
    pub _server: tokio::task::JoinHandle<()>,
}

pub fn receiver_config(secrets: &[&Secret]) -> Config {
    secrets
        .iter()
        .fold(Config::for_service("ledger-service"), |config, secret| {
            config.with_peer(SOURCE, secret.to_whsec())
        })
}

pub fn create_ledger_table(db: &Path) {
    let conn =
        rfidl_runtime::store::sqlite::open(db, rfidl_runtime::Durability::Normal).expect("open");
    conn.execute_batch("CREATE TABLE IF NOT EXISTS ledger (message_id TEXT NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)")
        .expect("ledger table");
}

pub async fn start_receiver(dir: &Path, config: Config) -> TestReceiver {
    let db = dir.join("receiver.db");
    create_ledger_table(&db);
    let ledger = Arc::new(Ledger::default());
    let receiver = Receiver::builder(config.clone(), &db)
        .service(LedgerService(ledger.clone()))
        .build()
        .expect("receiver");
    let (url, server) = serve(receiver.router()).await;
    let secret = Secret::parse(&config.peers[SOURCE][0]).expect("secret");
    TestReceiver {
        url,
        db,
        ledger,
        secret,
        receiver,
        _server: server,
    }
}

/// Serves `router` on a free loopback port.
pub async fn serve(router: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serve");
    });
    (url, server)
}

pub fn envelope(message_id: &str, endpoint: &str, payload: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "messageId": message_id,
        "sourceServiceId": SOURCE,
        "messageType": "Command",
        "interface": INTERFACE,
        "version": 1,
        "fingerprint": FINGERPRINT,
        "endpoint": endpoint,
        "payload": payload,
    })
}

/// POSTs `body` signed with `secret` at `timestamp`.
pub async fn post_signed(
    client: &reqwest::Client,
    url: &str,
    body: &[u8],
    message_id: &str,
    secret: &Secret,
    timestamp: i64,
) -> (u16, serde_json::Value) {
    let headers = SignatureHeaders::sign(message_id, timestamp, body, std::slice::from_ref(secret));
    let mut request = client
        .post(format!("{url}/_rf/receive"))
        .header("content-type", "application/json");
    for (name, value) in headers.to_pairs() {
        request = request.header(name, value);
    }
    let response = request.body(body.to_vec()).send().await.expect("send");
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// One item of a `POST /_rf/receive/batch` body: the [`envelope`] of
/// `endpoint` with `payload` under `message_id`, signed with `secret` at
/// `timestamp`.
pub fn batch_item(
    message_id: &str,
    endpoint: &str,
    payload: serde_json::Value,
    secret: &Secret,
    timestamp: i64,
) -> serde_json::Value {
    let body =
        serde_json::to_string(&envelope(message_id, endpoint, payload)).expect("json envelope");
    let headers = SignatureHeaders::sign(
        message_id,
        timestamp,
        body.as_bytes(),
        std::slice::from_ref(secret),
    );
    let headers: serde_json::Map<String, serde_json::Value> = headers
        .to_pairs()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), serde_json::Value::String(value)))
        .collect();
    serde_json::json!({"headers": headers, "body": body})
}

pub fn count(db: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.query_row(sql, [], |r| r.get(0)).expect("count")
}
