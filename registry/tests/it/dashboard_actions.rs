//! The dashboard that acts (issue 30): a real sender service (`hr`: a
//! SQLite outbox, its dispatcher and its diagnostics behind a token, on
//! loopback) with one dead letter to a real receiver (`ledger`), a real
//! registry closed by an operator token. In headless Chromium the
//! operator sees `hr` red with what to do, signs in, retries the failure
//! from the service's failures page; the dispatcher delivers it and the
//! light turns green, with the send rate and latency shown. Then every
//! bad request to the new routes gets its documented code and changes
//! nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rfidl_registry::Registry;
use rfidl_runtime::diagnostics::Diagnostics;
use rfidl_runtime::dispatcher::{Dispatcher, DispatcherHandle};
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::receiver::{HostedInterface, Receiver};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::HttpTransport;
use rfidl_runtime::{Config, MessageType};
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::dashboard::{attribute, cell, chromium, row};
use crate::decommission::EmpService;
use crate::support::Server;

const OPERATOR: &str = "op-token";
const REGISTRATION: &str = "reg-token";
const HR_OPS: &str = "hr-ops-token";
const INTERFACE: &str = "hr.employees.EmpService";
const FINGERPRINT: &str = "sha256:dashboard-actions";

/// The services and the registry of one test.
struct Stack {
    rt: tokio::runtime::Runtime,
    registry: Registry,
    server: Server,
    hr_db: PathBuf,
    hr_id: String,
    _dispatcher: DispatcherHandle,
    _services: [Server; 2],
}

fn stack(dir: &Path) -> Stack {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let secret = Secret::generate();
    let ledger_db = dir.join("ledger.db");
    let receiver = Receiver::builder(
        Config::for_service("ledger").with_peer("hr", secret.to_whsec()),
        &ledger_db,
    )
    .service(EmpService(HostedInterface {
        interface: INTERFACE,
        version: 1,
        fingerprint: FINGERPRINT,
        endpoints: &["Hired"],
        manifest_json: "{}",
    }))
    .build()
    .expect("receiver");
    let ledger = Server::serve(receiver.router());

    let hr_db = dir.join("hr.db");
    let mut config = Config::for_service("hr");
    config.outbox.poll_interval = Duration::from_millis(50);
    let outbox = Outbox::new(config, &hr_db);
    {
        let mut conn =
            rfidl_runtime::store::sqlite::open(&hr_db, rfidl_runtime::Durability::Normal)
                .expect("open");
        let tx = conn.transaction().expect("tx");
        let id = outbox
            .enqueue(
                &tx,
                OutgoingMessage {
                    destination: "ledger".into(),
                    message_type: MessageType::Signal,
                    interface: INTERFACE.into(),
                    version: 1,
                    fingerprint: FINGERPRINT.into(),
                    endpoint: "Hired".into(),
                    correlation_id: None,
                    payload: json!({"employee": 7}),
                    headers: Default::default(),
                    max_retries: None,
                    ttl: None,
                    deliver_at: None,
                },
            )
            .expect("enqueue");
        // Refused once, for good: a dead letter an operator has to retry.
        tx.execute(
            "UPDATE outbox_messages SET status = 'DeadLetter', \
             last_error = '422 payload_refused: the ledger was not ready' WHERE message_id = ?1",
            [id.to_string()],
        )
        .expect("dead letter");
        tx.commit().expect("commit");
    }
    let (dispatcher, diagnostics) = rt.block_on(async {
        let dispatcher = Dispatcher::builder(&outbox)
            .route(
                "ledger",
                HttpTransport::new(&ledger.url, Duration::from_secs(2)).expect("transport"),
                secret,
            )
            .start()
            .expect("dispatcher");
        let diagnostics = Diagnostics::builder(&hr_db)
            .outbox(&outbox)
            .bearer_token(HR_OPS)
            .build()
            .expect("diagnostics");
        (dispatcher, diagnostics)
    });
    let hr = Server::serve(diagnostics.router());

    let registry = Registry::open(&dir.join("registry.db"))
        .expect("registry")
        .operator_token(OPERATOR)
        .registration_token(REGISTRATION)
        .health_interval(Duration::from_secs(2));
    let server = Server::start(registry.clone());
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/services/hr/instances", server.url))
        .bearer_auth(REGISTRATION)
        .json(&json!({"baseUrl": hr.url, "hosts": [], "diagnosticsToken": HR_OPS}))
        .send()
        .expect("register");
    assert_eq!(response.status().as_u16(), 201);
    let hr_id = response.json::<Value>().expect("json")["instanceId"]
        .as_str()
        .expect("id")
        .to_owned();
    Stack {
        rt,
        registry,
        server,
        hr_db,
        hr_id,
        _dispatcher: dispatcher,
        _services: [ledger, hr],
    }
}

impl Stack {
    fn poll(&self) {
        self.rt
            .block_on(self.registry.poll_health_once(Duration::from_secs(2)))
            .expect("poll");
    }

    /// The statuses of hr's outbox rows.
    fn hr_statuses(&self) -> Vec<String> {
        let conn = rusqlite::Connection::open(&self.hr_db).expect("open");
        let mut statement = conn
            .prepare("SELECT status FROM outbox_messages ORDER BY message_id")
            .expect("prepare");
        statement
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    fn actions_logged(&self) -> i64 {
        let conn = rusqlite::Connection::open(self.server_db()).expect("open registry database");
        conn.query_row("SELECT COUNT(*) FROM operator_actions", [], |row| {
            row.get(0)
        })
        .expect("count")
    }

    fn server_db(&self) -> PathBuf {
        self.hr_db.with_file_name("registry.db")
    }
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_failure_is_retried_from_the_page_and_the_light_turns_green() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stack = stack(dir.path());
    stack.poll();
    let Some(path) = chromium() else { return };
    let profile = tempfile::tempdir().expect("profile");
    let mut browser = Browser::launch(&path, profile.path());
    let url = &stack.server.url;

    // Red, with what to do.
    browser.goto(&format!("{url}/"));
    let page = browser.html();
    let hr = row(&page, "hr");
    assert_eq!(attribute(hr, "data-status"), "critical", "{hr}");
    assert!(cell(hr, "action").starts_with("Act now"), "{hr}");
    assert_eq!(
        cell(hr, "num sent-per-minute"),
        "–",
        "one answer: no rate yet"
    );

    // The service's failures link wants a sign-in first, then shows the
    // group.
    browser.navigating(|b| b.click("#service-hr td.failures a"));
    assert!(
        browser.location().contains("/dashboard/sign-in?next="),
        "{}",
        browser.location()
    );
    browser.eval(&format!(
        "document.getElementById('token').value = {}",
        json!(OPERATOR)
    ));
    browser.navigating(|b| b.click("#sign-in"));
    assert_eq!(browser.location(), format!("{url}/services/hr/failures"));
    let page = browser.html();
    assert_eq!(page.matches("<tr class=\"group\"").count(), 1, "{page}");
    assert!(page.contains("data-error=\"payload_refused\""), "{page}");
    assert!(page.contains("data-destination=\"ledger\""), "{page}");
    assert!(!page.contains(OPERATOR), "the token is never in a page");
    let cookies = browser.eval("document.cookie");
    assert_eq!(cookies, json!(""), "HttpOnly: no script reads the session");

    // Retried from the page: a 303 back to it, the action logged.
    browser.navigating(|b| b.click("form.retry button"));
    assert_eq!(browser.location(), format!("{url}/services/hr/failures"));
    let page = browser.html();
    assert!(
        page.contains("1 of 1 message(s) retried"),
        "the action is logged on the page: {page}"
    );
    assert_eq!(stack.actions_logged(), 1);

    // The dispatcher delivers it; the next health round turns hr green.
    wait_until("hr's message delivered", || stack.hr_statuses() == ["Sent"]);
    stack.poll();
    browser.goto(&format!("{url}/"));
    let page = browser.html();
    let hr = row(&page, "hr");
    assert_eq!(attribute(hr, "data-status"), "healthy", "{hr}");
    assert_eq!(attribute(hr, "data-colour"), "#2e7d32");
    assert_eq!(cell(hr, "action"), "Nothing to do.");
    let rate: f64 = cell(hr, "num sent-per-minute").parse().expect("a rate");
    assert!(rate > 0.0, "{hr}");
    assert!(cell(hr, "num p50").starts_with('≤'), "{hr}");
    assert!(cell(hr, "num p99").starts_with('≤'), "{hr}");
    eprintln!(
        "hr after the retry: {rate} sent/min, p50 {}, p99 {}",
        cell(hr, "num p50"),
        cell(hr, "num p99")
    );
}

/// One refused action: what it tests, where it posts, with which cookie
/// and form.
struct Case<'a> {
    what: &'a str,
    path: &'a str,
    cookie: Option<&'a str>,
    fields: Vec<(&'a str, String)>,
}

impl<'a> Case<'a> {
    fn new(
        what: &'a str,
        path: &'a str,
        cookie: Option<&'a str>,
        fields: Vec<(&'a str, String)>,
    ) -> Self {
        Self {
            what,
            path,
            cookie,
            fields,
        }
    }
}

/// A client that shows redirects instead of following them.
fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

fn code_of(response: reqwest::blocking::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().unwrap_or(Value::Null);
    (status, body["error"].as_str().unwrap_or("").to_owned())
}

#[test]
fn bad_actions_get_their_codes_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stack = stack(dir.path());
    let url = &stack.server.url;
    let http = client();
    let retry = format!("{url}/services/hr/failures/retry");
    let form = |csrf: &str, instance: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("instance", instance.to_owned()),
            ("destination", "ledger".to_owned()),
            ("error", "payload_refused".to_owned()),
        ]
    };

    // Sign-in: a wrong token is 401, the right one a session cookie.
    let wrong = http
        .post(format!("{url}/dashboard/sign-in"))
        .form(&[("token", "nope")])
        .send()
        .expect("sign in");
    assert_eq!(code_of(wrong), (401, "unauthorized".into()));
    let signed = http
        .post(format!("{url}/dashboard/sign-in"))
        .form(&[("token", OPERATOR), ("next", "//evil.example/")])
        .send()
        .expect("sign in");
    assert_eq!(signed.status().as_u16(), 303);
    assert_eq!(signed.headers()["location"], "/", "no open redirect");
    let set_cookie = signed.headers()["set-cookie"].to_str().expect("cookie");
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
    let cookie = set_cookie.split(';').next().expect("pair").to_owned();
    let page = http
        .get(format!("{url}/services/hr/failures"))
        .header("cookie", &cookie)
        .send()
        .expect("page")
        .text()
        .expect("html");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a form token in {page}"))
        .to_owned();

    let post = |path: &str, cookie: Option<&str>, fields: &[(&str, String)]| {
        let mut request = http.post(format!("{url}{path}")).form(fields);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        code_of(request.send().expect("post"))
    };
    let id = stack.hr_id.as_str();
    let with = |index: usize, value: &str| {
        let mut fields = form(&csrf, id);
        fields[index].1 = value.to_owned();
        fields
    };
    let mut extra = form(&csrf, id);
    extra.push(("status", "Failed".into()));
    let on_hr = "/services/hr/failures/retry";
    let session = Some(cookie.as_str());
    let forged = Some("rfidl_operator=v1.99999999999999.00");
    let cases = [
        Case::new(
            "no session, no token",
            "/services/hr/failures/discard",
            None,
            form(&csrf, id),
        ),
        Case::new("no form token", on_hr, session, form("", id)[1..].to_vec()),
        Case::new("another form token", on_hr, session, form("00ff", id)),
        Case::new("a forged session", on_hr, forged, form(&csrf, id)),
        Case::new(
            "unknown instance",
            on_hr,
            session,
            form(&csrf, "0123456789abcdef"),
        ),
        Case::new(
            "another service",
            "/services/billing/failures/retry",
            session,
            form(&csrf, id),
        ),
        Case::new("an empty destination", on_hr, session, with(2, "")),
        Case::new(
            "a control character",
            "/services/hr/failures/discard",
            session,
            with(3, "a\nb"),
        ),
        Case::new("an unknown field", on_hr, session, extra),
        Case::new(
            "a missing field",
            on_hr,
            session,
            form(&csrf, id)[..3].to_vec(),
        ),
        Case::new(
            "an unknown action",
            "/services/hr/failures/explode",
            session,
            form(&csrf, id),
        ),
        Case::new(
            "not a service id",
            "/services/a%20b/failures/retry",
            session,
            form(&csrf, id),
        ),
    ];
    let expected = [
        (401, "unauthorized"),
        (403, "csrf_mismatch"),
        (403, "csrf_mismatch"),
        (401, "unauthorized"),
        (404, "unknown_instance"),
        (404, "unknown_instance"),
        (400, "bad_request"),
        (400, "bad_request"),
        (400, "bad_request"),
        (400, "bad_request"),
        (404, "not_found"),
        (400, "bad_request"),
    ];
    for (case, (status, code)) in cases.iter().zip(expected) {
        assert_eq!(
            post(case.path, case.cookie, &case.fields),
            (status, code.to_owned()),
            "{}",
            case.what
        );
    }
    // The browser's Basic password is not enough to act (another site's
    // form would carry it too).
    let basic = http
        .post(&retry)
        .basic_auth("anyone", Some(OPERATOR))
        .form(&form("", id)[1..])
        .send()
        .expect("post");
    assert_eq!(code_of(basic), (401, "unauthorized".into()));
    // The page: a query is 400, no credential a redirect to sign in.
    let query = http
        .get(format!("{url}/services/hr/failures?all=1"))
        .header("cookie", &cookie)
        .send()
        .expect("get");
    assert_eq!(code_of(query), (400, "bad_request".into()));
    let anonymous = http
        .get(format!("{url}/services/hr/failures"))
        .send()
        .expect("get");
    assert_eq!(anonymous.status().as_u16(), 303);
    let unknown = http
        .get(format!("{url}/services/billing/failures"))
        .bearer_auth(OPERATOR)
        .send()
        .expect("get");
    assert_eq!(code_of(unknown), (404, "not_found".into()));

    assert_eq!(stack.hr_statuses(), ["DeadLetter"], "nothing changed");
    assert_eq!(stack.actions_logged(), 0, "nothing done, nothing logged");

    // A script's bearer operator token needs no form token.
    let discarded = http
        .post(format!("{url}/services/hr/failures/discard"))
        .bearer_auth(OPERATOR)
        .form(&form("", id)[1..])
        .send()
        .expect("post");
    assert_eq!(discarded.status().as_u16(), 303);
    assert_eq!(stack.hr_statuses(), ["Discarded"]);
    assert_eq!(stack.actions_logged(), 1);
}
