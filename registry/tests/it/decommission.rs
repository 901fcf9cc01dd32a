//! Decommissioning end to end: the registry's `PUT /v1/decommissioned/…`
//! sends a signed `Decommission` command through its command outbox to
//! every registered provider instance (real runtime receivers on loopback,
//! real SQLite files), also to one that registers later; the provider holds
//! that version's outbox rows and answers 410; `DELETE` re-commissions.
//! (Replays of a command, by a fake instance or late: `crate::replay`.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rfidl_cli::{self as cli, DiagnosticFormat, Outcome, Report};
use rfidl_codegen::registry::Remote;
use rfidl_registry::Registry;
use rfidl_registry::commands::CommandSender;
use rfidl_runtime::directory::{DirectoryClient, InterfaceRef, Registration, RegistryConfig};
use rfidl_runtime::lifecycle::{self, HELD_DUE_MS};
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{
    HandlerError, HostedInterface, HostedService, IncomingCall, Receiver,
};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::{Config, MessageType};
use serde_json::{Value, json};

use crate::support::{Server, manifest_path, put, schema_manifest};

pub(crate) const INTERFACE: &str = "hr.employees.EmpService";

/// Hosts EmpService v1 and answers every call with `{}`.
pub(crate) struct EmpService(pub(crate) HostedInterface);

impl HostedService for EmpService {
    fn interfaces(&self) -> &[HostedInterface] {
        std::slice::from_ref(&self.0)
    }

    fn handle(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &rusqlite::Transaction<'_>,
    ) -> Result<Value, HandlerError> {
        Ok(json!({}))
    }
}

/// A provider instance: its outbox (one waiting EmpService v1 message) and
/// a receiver with the lifecycle, served on loopback.
pub(crate) struct Provider {
    pub(crate) url: String,
    pub(crate) db: PathBuf,
    pub(crate) outbox: Outbox,
    _server: tokio::task::JoinHandle<()>,
}

pub(crate) fn provider(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    name: &str,
    secret: &Secret,
    fingerprint: &'static str,
) -> Provider {
    let db = dir.join(format!("{name}.db"));
    let config =
        Config::for_service(name).with_peer(lifecycle::DEFAULT_REGISTRY_SOURCE, secret.to_whsec());
    let outbox = Outbox::new(config.clone(), &db);
    {
        let mut conn = rfidl_runtime::store::sqlite::open(&db, rfidl_runtime::Durability::Normal)
            .expect("open");
        let tx = conn.transaction().expect("tx");
        outbox
            .enqueue(
                &tx,
                OutgoingMessage {
                    destination: "subscribers".into(),
                    message_type: MessageType::Signal,
                    interface: INTERFACE.into(),
                    version: 1,
                    fingerprint: fingerprint.into(),
                    endpoint: "Hired".into(),
                    correlation_id: None,
                    payload: json!({}),
                    headers: Default::default(),
                    max_retries: None,
                    ttl: None,
                    deliver_at: None,
                },
            )
            .expect("enqueue");
        tx.commit().expect("commit");
    }
    let hosted = HostedInterface {
        interface: INTERFACE,
        version: 1,
        fingerprint,
        endpoints: &["Hire"],
        manifest_json: "{}",
    };
    let receiver = Receiver::builder(config, &db)
        .service(EmpService(hosted))
        .lifecycle(outbox.lifecycle())
        .build()
        .expect("receiver");
    let (url, server) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let router = receiver.router();
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        (url, server)
    });
    Provider {
        url,
        db,
        outbox,
        _server: server,
    }
}

/// The provider's held rows of EmpService v1.
pub(crate) fn held(provider: &Provider) -> i64 {
    let conn = rusqlite::Connection::open(&provider.db).expect("open");
    conn.query_row(
        &format!(
            "SELECT COUNT(*) FROM outbox_messages WHERE interface = '{INTERFACE}' \
             AND next_retry_at = {HELD_DUE_MS}"
        ),
        [],
        |row| row.get(0),
    )
    .expect("count")
}

pub(crate) fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn send(method: reqwest::Method, url: &str, body: Option<&Value>) -> (u16, Value) {
    let mut request = reqwest::blocking::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

/// Registers `provider` as an instance of `service` hosting EmpService v1,
/// as a service does (`DirectoryClient`), which binds its lifecycle to the
/// instance id the registry assigns. Returns that id.
pub(crate) fn register(
    rt: &tokio::runtime::Runtime,
    registry: &str,
    service: &str,
    provider: &Provider,
    fingerprint: &str,
) -> String {
    let client = DirectoryClient::new(
        RegistryConfig::new(registry),
        Registration {
            service_id: service.into(),
            base_url: provider.url.clone(),
            hosts: vec![InterfaceRef {
                interface: INTERFACE.into(),
                version: 1,
                fingerprint: fingerprint.into(),
            }],
            calls: Vec::new(),
            diagnostics_token: None,
        },
    )
    .lifecycle(provider.outbox.lifecycle());
    let id = rt.block_on(client.register(true)).expect("registered");
    assert_eq!(provider.outbox.lifecycle().instance(), Some(id.clone()));
    id
}

#[test]
fn a_decommission_reaches_every_provider_instance_and_a_recommission_releases_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let secret = Secret::generate();
    let commands = {
        let _in_runtime = rt.enter();
        CommandSender::start_with(
            &dir.path().join("registry.db.commands"),
            secret.clone(),
            Duration::from_millis(50),
        )
        .expect("command sender")
    };
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .commands(commands.clone()),
    );
    let v1 = schema_manifest(INTERFACE, 1);
    let (status, _) = put(&server.url, &manifest_path(&v1), v1.to_pretty_json(), None);
    assert_eq!(status, 201);
    let fingerprint: &'static str = Box::leak(v1.fingerprint.clone().into_boxed_str());

    let first = provider(&rt, dir.path(), "hr-a", &secret, fingerprint);
    let register = |provider: &Provider| register(&rt, &server.url, "hr", provider, fingerprint);
    register(&first);
    assert_eq!(held(&first), 0);

    // Decommission: the registry names the instance it sends the command to,
    // and the provider applies it: its row is held, its set says so.
    // Through the CLI's `rfidl decommission` (the same function).
    let report = Report::capturing(DiagnosticFormat::Json);
    let remote: Remote = format!("{INTERFACE}@v1").parse().expect("remote");
    assert_eq!(
        cli::decommission_with(
            &server.url,
            None,
            std::slice::from_ref(&remote),
            true,
            &report
        ),
        Outcome::Success
    );
    let line: Value = serde_json::from_str(report.captured().trim()).expect("json line");
    assert_eq!(line["commandsSentTo"], json!([first.url]), "{line}");
    wait_until("the first provider holds its row", || held(&first) == 1);
    assert!(first.outbox.lifecycle().is_decommissioned(INTERFACE, 1));

    // Its EmpService v1 route now answers 410 version_decommissioned (to a
    // signed message: the check comes after the signature's).
    let id = "0190b5a4-0000-7000-8000-000000000001";
    let body = serde_json::to_vec(&json!({
        "messageId": id,
        "sourceServiceId": lifecycle::DEFAULT_REGISTRY_SOURCE,
        "messageType": "Command",
        "interface": INTERFACE,
        "version": 1,
        "fingerprint": fingerprint,
        "endpoint": "Hire",
        "payload": {},
    }))
    .expect("json");
    let signature = rfidl_runtime::signing::SignatureHeaders::sign(
        id,
        rfidl_runtime::signing::unix_now(),
        &body,
        std::slice::from_ref(&secret),
    );
    let mut request = reqwest::blocking::Client::new().post(format!("{}/_rf/receive", first.url));
    for (name, value) in signature.to_pairs() {
        request = request.header(name, value);
    }
    let response = request.body(body).send().expect("send");
    assert_eq!(response.status().as_u16(), 410);
    let refusal: Value = response.json().expect("json");
    assert_eq!(refusal["error"], "version_decommissioned");

    // A provider that registers while the version is decommissioned is told.
    let second = provider(&rt, dir.path(), "hr-b", &secret, fingerprint);
    register(&second);
    wait_until("the late provider holds its row", || held(&second) == 1);

    // Re-commission: both release their rows.
    let path = format!("{}/v1/decommissioned/{INTERFACE}/v1", server.url);
    let (status, answer) = send(reqwest::Method::DELETE, &path, None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["decommissioned"], false);
    assert_eq!(
        answer["commandsSentTo"].as_array().map(Vec::len),
        Some(2),
        "{answer}"
    );
    wait_until("both providers released their rows", || {
        held(&first) == 0 && held(&second) == 0
    });
    assert!(!first.outbox.lifecycle().is_decommissioned(INTERFACE, 1));
    assert!(!second.outbox.lifecycle().is_decommissioned(INTERFACE, 1));

    // Every command was acknowledged. A provider applies a command before
    // the registry's dispatcher has read its answer and marked the row
    // `Sent` (CI once counted 3 of 4 right after the release), so wait for
    // the marks.
    let conn = rusqlite::Connection::open(dir.path().join("registry.db.commands")).expect("open");
    let sent = || -> i64 {
        conn.query_row(
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
            [],
            |row| row.get(0),
        )
        .expect("count")
    };
    wait_until("every command marked Sent", || sent() >= 4);
    assert_eq!(sent(), 4, "two decommissions and two recommissions");
    drop(server);
    rt.block_on(commands.shutdown());
}

/// The binary: `--command-secret-file` turns the commands on (their outbox
/// in `<db>.commands`), `rfidl decommission` reaches a provider through it;
/// a secret that is not `whsec_…` stops the start with a clear message.
#[test]
fn the_binary_sends_commands_with_its_command_secret_and_refuses_a_bad_one() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let secret_file = dir.path().join("commands.secret");
    std::fs::write(&secret_file, "not-a-secret\n").expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .arg("--command-secret-file")
        .arg(&secret_file)
        .output()
        .expect("run");
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("command secret"), "{stderr}");
    assert!(
        !stderr.contains("not-a-secret"),
        "the secret is not printed: {stderr}"
    );

    let secret = Secret::generate();
    std::fs::write(&secret_file, format!("{}\n", secret.to_whsec())).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rfidl-registry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .arg("--command-secret-file")
        .arg(&secret_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let url = lines
        .next()
        .expect("a line")
        .expect("read")
        .strip_prefix("listening on ")
        .expect("listening on")
        .to_owned();
    let v1 = schema_manifest(INTERFACE, 1);
    assert_eq!(
        put(&url, &manifest_path(&v1), v1.to_pretty_json(), None).0,
        201
    );
    let fingerprint: &'static str = Box::leak(v1.fingerprint.clone().into_boxed_str());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let hr = provider(&rt, dir.path(), "hr", &secret, fingerprint);
    register(&rt, &url, "hr", &hr, fingerprint);
    let report = Report::capturing(DiagnosticFormat::Json);
    let remote: Remote = format!("{INTERFACE}@v1").parse().expect("remote");
    let started = Instant::now();
    assert_eq!(
        cli::decommission_with(&url, None, std::slice::from_ref(&remote), true, &report),
        Outcome::Success
    );
    let line: Value = serde_json::from_str(report.captured().trim()).expect("json line");
    assert_eq!(line["commandsSentTo"], json!([hr.url]), "{line}");
    wait_until("the provider holds its row", || held(&hr) == 1);
    let took = started.elapsed();
    assert!(dir.path().join("registry.db.commands").exists());
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("decommission to held on the provider, through the binary: {took:?}");
}
