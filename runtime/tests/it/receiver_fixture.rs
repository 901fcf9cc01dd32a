//! A real receiver for tests: a SQLite file in a temp dir, an axum server on
//! 127.0.0.1:0, a hand-written `HostedService` that writes business rows in
//! the receiver's transaction, and helpers that sign envelopes.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rfidl_runtime::metrics::Metrics;
use rfidl_runtime::receiver::{
    AsyncHostedService, HandlerError, HostedInterface, HostedService, IncomingCall, Receiver,
    ReceiverBuilder, decode_payload, encode_response,
};
use rfidl_runtime::signing::{Secret, SignatureHeaders, unix_now};
use rfidl_runtime::{BoxFuture, Config};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const SOURCE: &str = "hr-service";
pub const INTERFACE: &str = "hr.employees.EmpService";
pub const FINGERPRINT_V1: &str =
    "sha256:1111111111111111111111111111111111111111111111111111111111111111";
pub const FINGERPRINT_V2: &str =
    "sha256:2222222222222222222222222222222222222222222222222222222222222222";

const HOSTED: &[HostedInterface] = &[
    HostedInterface {
        interface: INTERFACE,
        version: 1,
        fingerprint: FINGERPRINT_V1,
        endpoints: &["EmployeeHired", "EmployeeLeft"],
        manifest_json: r#"{"interface":"hr.employees.EmpService","version":1}"#,
    },
    HostedInterface {
        interface: INTERFACE,
        version: 2,
        fingerprint: FINGERPRINT_V2,
        endpoints: &["EmployeeHired"],
        manifest_json: r#"{"interface":"hr.employees.EmpService","version":2}"#,
    },
];

#[derive(Debug, Deserialize)]
struct Employee {
    id: String,
    name: String,
}

#[derive(Debug, Deserialize)]
struct EmployeeHired {
    employee: Employee,
}

#[derive(Debug, Deserialize)]
struct EmployeeLeft {
    id: String,
}

#[derive(Debug, Serialize)]
struct Welcome {
    welcomed: String,
    row: i64,
    version: u32,
}

/// Writes one `employees` row per processed `EmployeeHired`. Names steer
/// failures: `poison…` is refused for good, `panic…` panics, `slow…` takes 600 ms, `flaky…` fails
/// (retryably) while the shared failure budget lasts, `broken…` always fails;
/// each failing case writes its business row first, so a leak would show.
#[derive(Debug, Default)]
pub struct Employees {
    pub failures_left: Arc<AtomicU32>,
    pub handler_runs: Arc<AtomicU32>,
}

impl HostedService for Employees {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        self.handler_runs.fetch_add(1, Ordering::SeqCst);
        match (call.version, call.endpoint) {
            (1 | 2, "EmployeeHired") => {
                let hired = decode_hired(call)?;
                tx.execute(
                    "INSERT INTO employees (id, name, message_id, version) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![
                        hired.employee.id,
                        hired.employee.name,
                        call.message_id,
                        call.version
                    ],
                )?;
                if is_slow(&hired) {
                    std::thread::sleep(SLOW);
                }
                self.after_insert(hired, tx.last_insert_rowid(), call.version)
            }
            (1, "EmployeeLeft") => {
                let left: EmployeeLeft = decode_payload(call.payload)?;
                tx.execute("DELETE FROM employees WHERE id = ?1", [left.id])?;
                encode_response(&())
            }
            (_, other) => Err(HandlerError::unknown_endpoint(other)),
        }
    }
}

/// The payload of an `EmployeeHired`; one whose id or name holds a NUL is
/// refused for good on every store, as a real handler validates its input:
/// PostgreSQL's `TEXT` cannot hold one (the insert would fail, and the
/// retryable failure would come back at every retry).
fn decode_hired(call: &IncomingCall<'_>) -> Result<EmployeeHired, HandlerError> {
    let hired: EmployeeHired = decode_payload(call.payload)?;
    let employee = &hired.employee;
    if employee.id.contains('\0') || employee.name.contains('\0') {
        return Err(HandlerError::poison("a NUL character in the employee"));
    }
    Ok(hired)
}

/// How long a `slow…` hire takes in its handler.
const SLOW: std::time::Duration = std::time::Duration::from_millis(600);

fn is_slow(hired: &EmployeeHired) -> bool {
    hired.employee.name.starts_with("slow")
}

impl Employees {
    /// What a processed `EmployeeHired` comes to once its row is written:
    /// the name steers the failures (see the type's docs).
    fn after_insert(
        &self,
        hired: EmployeeHired,
        row: i64,
        version: u32,
    ) -> Result<serde_json::Value, HandlerError> {
        let name = hired.employee.name.as_str();
        if name.starts_with("poison") {
            return Err(HandlerError::poison("poisoned on purpose"));
        }
        if name.starts_with("panic") {
            panic!("handler panics on purpose");
        }
        if name.starts_with("broken") {
            return Err(HandlerError::retryable("always broken"));
        }
        if name.starts_with("flaky")
            && self
                .failures_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(HandlerError::retryable("flaky dependency"));
        }
        encode_response(&Welcome {
            welcomed: hired.employee.name,
            row,
            version,
        })
    }
}

// The same service on both sqlx stores: the same statements, async, in the
// receiver's transaction.
crate::stores::on_each_sqlx_store! {
impl AsyncHostedService<Db> for Employees {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut Conn,
    ) -> BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            self.handler_runs.fetch_add(1, Ordering::SeqCst);
            match (call.version, call.endpoint) {
                (1 | 2, "EmployeeHired") => {
                    let hired = decode_hired(call)?;
                    let row: i64 = sqlx::query_scalar(
                        "INSERT INTO employees (id, name, message_id, version) \
                         VALUES ($1, $2, $3, $4) RETURNING row",
                    )
                    .bind(&hired.employee.id)
                    .bind(&hired.employee.name)
                    .bind(call.message_id)
                    .bind(i64::from(call.version))
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(HandlerError::retryable)?;
                    if is_slow(&hired) {
                        tokio::time::sleep(SLOW).await;
                    }
                    self.after_insert(hired, row, call.version)
                }
                (1, "EmployeeLeft") => {
                    let left: EmployeeLeft = decode_payload(call.payload)?;
                    sqlx::query("DELETE FROM employees WHERE id = $1")
                        .bind(&left.id)
                        .execute(&mut *conn)
                        .await
                        .map_err(HandlerError::retryable)?;
                    encode_response(&())
                }
                (_, other) => Err(HandlerError::unknown_endpoint(other)),
            }
        })
    }
}
}

/// The business table of [`Employees`], on either store.
pub const EMPLOYEES_SQLITE: &str = "CREATE TABLE employees (row INTEGER PRIMARY KEY, \
     id TEXT NOT NULL, name TEXT NOT NULL, message_id TEXT NOT NULL, version INTEGER NOT NULL)";
/// [`EMPLOYEES_SQLITE`] in PostgreSQL's dialect.
pub const EMPLOYEES_POSTGRES: &str = "CREATE TABLE employees \
     (row BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, \
     id TEXT NOT NULL, name TEXT NOT NULL, message_id TEXT NOT NULL, version BIGINT NOT NULL)";

/// A running receiver with its database, address and secrets.
pub struct Fixture {
    /// Keeps the database's directory alive as long as the fixture.
    _dir: tempfile::TempDir,
    pub db_path: PathBuf,
    pub base: String,
    pub receiver: Receiver,
    pub secret: Secret,
    pub old_secret: Secret,
    pub handler_runs: Arc<AtomicU32>,
    pub client: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Fixture {
    pub async fn start() -> Self {
        Self::start_with(|builder| builder).await
    }

    pub async fn start_with(customize: impl FnOnce(ReceiverBuilder) -> ReceiverBuilder) -> Self {
        Self::start_custom(|_| {}, customize).await
    }

    pub async fn start_custom(
        configure: impl FnOnce(&mut Config),
        customize: impl FnOnce(ReceiverBuilder) -> ReceiverBuilder,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db_path = dir.path().join("receiver.db");
        let conn = rfidl_runtime::store::sqlite::open(&db_path, rfidl_runtime::Durability::Full)
            .expect("open db");
        conn.execute_batch(EMPLOYEES_SQLITE)
            .expect("business table");
        drop(conn);
        let secret = Secret::generate();
        let old_secret = Secret::generate();
        let mut config = Config::for_service("payroll");
        config.peers.insert(
            SOURCE.to_owned(),
            vec![old_secret.to_whsec(), secret.to_whsec()],
        );
        configure(&mut config);
        let employees = Employees::default();
        let handler_runs = Arc::clone(&employees.handler_runs);
        let builder = Receiver::builder(config, &db_path)
            .service(employees)
            .metrics(Arc::new(Metrics::default()));
        let receiver = customize(builder).build().expect("build receiver");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let app = receiver.router();
        let server = tokio::spawn(async move {
            rfidl_runtime::serve(listener, app).await.expect("serve");
        });
        Self {
            _dir: dir,
            db_path,
            base,
            receiver,
            secret,
            old_secret,
            handler_runs,
            client: reqwest::Client::new(),
            server,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A fresh connection (not the receiver's): what is committed is visible.
    pub fn conn(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.db_path).expect("open")
    }

    pub fn count(&self, table: &str) -> i64 {
        self.conn()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .expect("count")
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(self.receiver.metrics())
    }

    /// Posts `body` with the given headers to `/_rf/receive`.
    pub async fn post_raw(&self, headers: &[(&str, String)], body: impl Into<String>) -> Reply {
        let mut request = self
            .client
            .post(self.url("/_rf/receive"))
            .header("content-type", "application/json")
            .body(body.into());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        Reply::from(request.send().await.expect("send")).await
    }

    /// Signs `message` with the current secret, now, and posts it.
    pub async fn post(&self, message: &Message) -> Reply {
        let body = message.body();
        let headers = sign(&message.id.to_string(), unix_now(), &body, &self.secret);
        self.post_raw(&headers, body).await
    }
}

/// `webhook-*` headers for `body`.
pub fn sign(id: &str, timestamp: i64, body: &str, secret: &Secret) -> Vec<(&'static str, String)> {
    SignatureHeaders::sign(id, timestamp, body.as_bytes(), std::slice::from_ref(secret))
        .to_pairs()
        .into_iter()
        .collect()
}

/// An envelope under construction.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: Uuid,
    pub version: u32,
    pub endpoint: String,
    pub fingerprint: String,
    pub payload: serde_json::Value,
}

impl Message {
    /// `EmployeeHired` v1 of employee `name` with a fresh id.
    pub fn hired(name: &str) -> Self {
        Self {
            id: Uuid::now_v7(),
            version: 1,
            endpoint: "EmployeeHired".to_owned(),
            fingerprint: FINGERPRINT_V1.to_owned(),
            payload: serde_json::json!({"employee": {"id": format!("e-{name}"), "name": name}}),
        }
    }

    pub fn envelope(&self) -> serde_json::Value {
        serde_json::json!({
            "messageId": self.id.to_string(),
            "correlationId": "order-4711",
            "sourceServiceId": SOURCE,
            "messageType": "PushCall",
            "interface": INTERFACE,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "endpoint": self.endpoint,
            "payload": self.payload,
            "headers": {"rf-version": "1"},
        })
    }

    pub fn body(&self) -> String {
        self.envelope().to_string()
    }
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: serde_json::Value,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
}

impl Reply {
    pub async fn from(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header("retry-after");
        let content_type = header("content-type");
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        Self {
            status,
            body,
            retry_after,
            content_type,
        }
    }

    /// The `error` code of an error body.
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("<no error code>")
    }

    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code()),
            (status, code),
            "unexpected answer: {:?}",
            self.body
        );
        assert!(
            self.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "error body without message: {:?}",
            self.body
        );
    }

    #[track_caller]
    pub fn assert_acknowledged(&self, duplicate: bool) {
        assert_eq!(self.status, 200, "unexpected answer: {:?}", self.body);
        assert_eq!(self.body["acknowledged"], true, "{:?}", self.body);
        assert_eq!(self.body["duplicate"], duplicate, "{:?}", self.body);
    }
}

/// A receiver hosting `employees` on `store` (its table created first),
/// peered with [`SOURCE`] under a fresh secret, `configure`d: the receiver
/// and the secret senders sign with.
pub fn employees_receiver(
    store: &crate::stores::TestStore,
    configure: impl FnOnce(&mut Config),
    employees: Employees,
) -> (Receiver, Secret) {
    store.execute_dialects(EMPLOYEES_SQLITE, EMPLOYEES_POSTGRES);
    let secret = Secret::generate();
    let mut config = Config::for_service("payroll");
    config
        .peers
        .insert(SOURCE.to_owned(), vec![secret.to_whsec()]);
    configure(&mut config);
    let receiver = store
        .receiver_hosting(config, employees)
        .expect("build receiver");
    (receiver, secret)
}

/// [`employees_receiver`] with its diagnostics routes merged (behind
/// `token` when given): the app, the secret senders sign with, and the
/// receiver.
pub fn employees_app(
    store: &crate::stores::TestStore,
    configure: impl FnOnce(&mut Config),
    token: Option<&str>,
) -> (axum::Router, Secret, Receiver) {
    let (receiver, secret) = employees_receiver(store, configure, Employees::default());
    let diagnostics = store.diagnostics().metrics(Arc::clone(receiver.metrics()));
    let diagnostics = match token {
        Some(token) => diagnostics.bearer_token(token),
        None => diagnostics,
    }
    .build()
    .expect("diagnostics");
    let app = receiver.router().merge(diagnostics.router());
    (app, secret, receiver)
}
