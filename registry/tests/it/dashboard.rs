//! The health aggregator and the traffic-light dashboard against real
//! services: each is the runtime's `Diagnostics` router over a real SQLite
//! outbox, served on loopback, with rows put in the states that make it
//! healthy, warning or critical; one more instance is a closed port
//! (connection refused). The page is rendered by headless Chromium and the
//! test reads the colours and numbers from its DOM, and saves a screenshot
//! as `target/dashboard.png`.
//!
//! Chromium is `RFIDL_CHROMIUM` or `/usr/bin/chromium` (Debian package
//! `chromium`; `cargo xtask test` installs it). Without it the browser part
//! is skipped with a loud message, unless `RFIDL_REQUIRE_CHROMIUM=1` (set by
//! `cargo xtask test` and CI), which makes it a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rfidl_registry::Registry;
use rfidl_runtime::config::Durability;
use rfidl_runtime::diagnostics::Diagnostics;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage};
use rfidl_runtime::store::sqlite as db;
use rfidl_runtime::{Config, MessageType};
use serde_json::{Value, json};

use crate::support::{Server, manifest_path, put, schema_manifest};

/// `n` pending messages in the outbox at `path`, created `age` ago; then
/// the first `dead` of them turned into dead letters.
fn seed_outbox(path: &Path, n: usize, age: Duration, dead: usize) {
    let outbox = Outbox::new(Config::default(), path);
    let mut conn = db::open(path, Durability::Normal).expect("open service db");
    let tx = conn.transaction().expect("tx");
    let ids: Vec<String> = (0..n)
        .map(|i| {
            outbox
                .enqueue(
                    &tx,
                    OutgoingMessage {
                        destination: "engine".into(),
                        message_type: MessageType::Signal,
                        interface: "hr.employees.EmpService".into(),
                        version: 1,
                        fingerprint: "sha256:test".into(),
                        endpoint: "Hired".into(),
                        correlation_id: None,
                        payload: json!({"n": i}),
                        headers: Default::default(),
                        max_retries: None,
                        ttl: None,
                        deliver_at: None,
                    },
                )
                .expect("enqueue")
                .to_string()
        })
        .collect();
    let created = rfidl_runtime::store::now_ms() - age.as_millis() as i64;
    tx.execute("UPDATE outbox_messages SET created_at = ?1", [created])
        .expect("age rows");
    for id in ids.iter().take(dead) {
        tx.execute(
            "UPDATE outbox_messages SET status = 'DeadLetter' WHERE message_id = ?1",
            [id],
        )
        .expect("dead letter");
    }
    tx.commit().expect("commit");
}

/// A service's diagnostics over a real outbox, on loopback.
fn service(
    dir: &Path,
    name: &str,
    n: usize,
    age: Duration,
    dead: usize,
    token: Option<&str>,
) -> Server {
    let path = dir.join(format!("{name}.db"));
    seed_outbox(&path, n, age, dead);
    let mut builder = Diagnostics::builder(&path);
    if let Some(token) = token {
        builder = builder.bearer_token(token);
    }
    Server::serve(builder.build().expect("diagnostics").router())
}

fn register(
    registry: &str,
    service: &str,
    base_url: &str,
    token: Option<&str>,
    hosts: Value,
) -> String {
    let mut body = json!({"baseUrl": base_url, "hosts": hosts});
    if let Some(token) = token {
        body["diagnosticsToken"] = json!(token);
    }
    let response = reqwest::blocking::Client::new()
        .post(format!("{registry}/v1/services/{service}/instances"))
        .json(&body)
        .send()
        .expect("register");
    assert_eq!(response.status().as_u16(), 201);
    response.json::<Value>().expect("json")["instanceId"]
        .as_str()
        .expect("id")
        .to_owned()
}

fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

pub(crate) fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("RFIDL_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var("RFIDL_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
        panic!(
            "RFIDL_REQUIRE_CHROMIUM=1 but {} is missing: run `cargo xtask test` (it installs \
             the Debian package chromium)",
            path.display()
        );
    }
    eprintln!(
        "SKIPPED the headless-Chromium part: {} is missing (apt-get install chromium, or \
         `cargo xtask test`)",
        path.display()
    );
    None
}

/// The flags every headless Chromium of the tests runs with.
pub(crate) const HEADLESS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Runs headless Chromium with `args` and `url`; its stdout. Killed after 60 s.
fn run_chromium(browser: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    let mut child = Command::new(browser)
        .args(HEADLESS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).expect("read");
        text
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "chromium {args:?}: {status:?}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().expect("reader")
}

/// The `<tr>` of `service` in the page and the text of its `class` cell.
pub(crate) fn row<'a>(page: &'a str, service: &str) -> &'a str {
    let start = page
        .find(&format!("data-service=\"{service}\""))
        .unwrap_or_else(|| panic!("no row for {service} in {page}"));
    let end = start + page[start..].find("</tr>").expect("</tr>");
    &page[start..end]
}

pub(crate) fn attribute<'a>(row: &'a str, name: &str) -> &'a str {
    let start = row.find(&format!("{name}=\"")).expect(name) + name.len() + 2;
    &row[start..start + row[start..].find('"').expect("quote")]
}

pub(crate) fn cell<'a>(row: &'a str, class: &str) -> &'a str {
    let start = row
        .find(&format!("class=\"{class}\">"))
        .unwrap_or_else(|| panic!("no {class} cell in {row}"))
        + class.len()
        + 9;
    row[start..start + row[start..].find("</td>").expect("</td>")].trim()
}

#[test]
fn services_made_healthy_warning_and_critical_show_their_colours() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::open(&dir.path().join("registry.db"))
        .expect("open")
        .health_interval(Duration::from_secs(2));
    let server = Server::start(registry.clone());
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    assert_eq!(
        put(&server.url, &manifest_path(&v1), v1.to_pretty_json(), None).0,
        201
    );
    let hosts = json!([{"interface": v1.interface, "version": 1, "fingerprint": v1.fingerprint}]);

    // healthy: 3 fresh messages, diagnostics behind a token the registry
    // has to send; warning: 60 messages, the oldest 150 s old; critical: 2
    // dead letters; and a closed port.
    let billing = service(
        dir.path(),
        "billing",
        3,
        Duration::ZERO,
        0,
        Some("diag-token"),
    );
    let ledger = service(dir.path(), "ledger", 60, Duration::from_secs(150), 0, None);
    let hr = service(dir.path(), "hr", 3, Duration::from_secs(1), 2, None);
    let gone = closed_port();
    let billing_id = register(
        &server.url,
        "billing",
        &billing.url,
        Some("diag-token"),
        hosts.clone(),
    );
    register(&server.url, "ledger", &ledger.url, None, json!([]));
    let hr_id = register(&server.url, "hr", &hr.url, None, hosts);
    let engine_id = register(&server.url, "engine", &gone, None, json!([]));
    // A wrong token: the service answers 401, which is critical too.
    let audit_id = register(&server.url, "audit", &billing.url, Some("wrong"), json!([]));

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    for round in 0..3 {
        if round > 0 {
            // ledger's backlog grows between rounds: 60, 80, 100.
            seed_outbox(
                &dir.path().join("ledger.db"),
                20,
                Duration::from_secs(150),
                0,
            );
        }
        let asked = rt
            .block_on(registry.poll_health_once(Duration::from_secs(2)))
            .expect("poll");
        assert_eq!(asked, 5);
    }
    eprintln!(
        "3 health rounds of 5 instances took {:?}",
        started.elapsed()
    );

    // The API says the same as the page will.
    let listed: Value = reqwest::blocking::get(format!("{}/v1/services", server.url))
        .expect("get")
        .json()
        .expect("json");
    let health_of = |service: &str| {
        listed["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["service"] == service)
            .unwrap_or_else(|| panic!("{service} in {listed}"))["instances"][0]["health"]
            .clone()
    };
    assert_eq!(health_of("billing")["status"], "healthy", "{listed}");
    assert_eq!(health_of("billing")["outboxDepth"], 3);
    assert_eq!(health_of("ledger")["status"], "warning");
    assert_eq!(health_of("ledger")["outboxDepth"], 100);
    assert_eq!(health_of("hr")["status"], "critical");
    assert_eq!(health_of("hr")["deadLetter"], 2);
    assert_eq!(health_of("engine")["status"], "critical");
    assert_eq!(health_of("engine")["reported"], Value::Null);
    assert_eq!(health_of("audit")["status"], "critical");
    // The cause (HTTP 401) goes to the log only: what an open read shows
    // must not make the registry a port scanner.
    assert_eq!(
        health_of("audit")["reasons"],
        json!([rfidl_registry::aggregator::UNREACHABLE]),
        "{listed}"
    );
    assert_eq!(
        health_of("engine")["reasons"],
        health_of("audit")["reasons"]
    );
    // The diagnostics token is never served.
    assert!(!listed.to_string().contains("diag-token"));

    // The failed lists, asked by the registry with each instance's token.
    let failed = |id: &str, query: &str| {
        let response =
            reqwest::blocking::get(format!("{}/instances/{id}/failed{query}", server.url))
                .expect("get");
        (response.status().as_u16(), response.text().expect("body"))
    };
    let (status, page) = failed(&hr_id, "");
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        page.matches("data-status=\"DeadLetter\"").count(),
        2,
        "{page}"
    );
    assert!(!page.contains("\"n\""), "no payload on the page");
    let (status, page) = failed(&billing_id, "");
    assert_eq!(status, 200, "the token was sent: {page}");
    assert!(page.contains("Nothing needs a human"), "{page}");
    for id in [&audit_id, &engine_id] {
        let (status, body) = failed(id, "");
        assert_eq!(status, 502, "{body}");
        assert!(body.contains("instance_unreachable"), "{body}");
    }
    let (status, body) = failed("0123456789abcdef", "");
    assert_eq!(
        (status, body.contains("unknown_instance")),
        (404, true),
        "{body}"
    );
    let (status, body) = failed(&hr_id, "?all=1");
    assert_eq!(
        (status, body.contains("bad_request")),
        (400, true),
        "{body}"
    );

    let Some(browser) = chromium() else { return };
    let profile = tempfile::tempdir().expect("profile");
    let started = Instant::now();
    let dom = run_chromium(
        &browser,
        profile.path(),
        &["--dump-dom"],
        &format!("{}/", server.url),
    );
    eprintln!("chromium --dump-dom took {:?}", started.elapsed());
    let expect = [
        ("billing", "healthy", "#2e7d32", "3", "0"),
        ("ledger", "warning", "#f9a825", "100", "0"),
        ("hr", "critical", "#c62828", "1", "2"),
        ("engine", "critical", "#c62828", "–", "–"),
        ("audit", "critical", "#c62828", "–", "–"),
    ];
    for (service, status, colour, depth, dead) in expect {
        let tr = row(&dom, service);
        assert_eq!(attribute(tr, "data-status"), status, "{service}: {tr}");
        assert_eq!(attribute(tr, "data-colour"), colour, "{service}");
        assert!(
            tr.contains(&format!("background:{colour}")),
            "{service}: {tr}"
        );
        assert_eq!(cell(tr, "num depth"), depth, "{service}");
        assert_eq!(cell(tr, "num dead-letters"), dead, "{service}");
        assert!(tr.contains("<svg"), "{service}: sparkline");
        assert!(
            tr.contains("/failed\">failed</a>"),
            "{service}: failed link"
        );
    }
    assert!(
        cell(row(&dom, "ledger"), "num oldest").starts_with("15"),
        "150 s"
    );
    // The three checks fall in one 5-minute bucket (two, when they
    // straddle a boundary): the last point is at the right end and the
    // top (the highest depth, 100); the dot has the colour.
    let points = attribute(row(&dom, "ledger"), "points");
    assert!(points.split(' ').count() <= 2, "{points}");
    assert!(points.ends_with("157.0,3.0"), "{points}");
    assert!(
        row(&dom, "ledger").contains("fill=\"#f9a825\""),
        "warning dot"
    );
    assert!(dom.contains("id=\"count-critical\""), "summary");
    assert!(dom.contains("critical: <b>3</b>"), "summary counts");
    assert!(dom.contains("healthy: <b>1</b>"));
    assert!(dom.contains("warning: <b>1</b>"));

    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    std::fs::create_dir_all(&target).expect("target dir");
    let picture = target.join("dashboard.png");
    let _ = std::fs::remove_file(&picture);
    run_chromium(
        &browser,
        profile.path(),
        &[
            &format!("--screenshot={}", picture.display()),
            "--window-size=1280,800",
        ],
        &format!("{}/", server.url),
    );
    let png = std::fs::read(&picture).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    eprintln!("screenshot: {}", picture.display());
}

/// 120 instances of three services: the page groups them by service with
/// counts per colour, shows 50 instances a page, the worst first, with
/// previous/next links, and `?service=` shows one service's instances.
#[test]
fn the_dashboard_groups_by_service_and_pages_the_worst_first() {
    use rfidl_registry::aggregator::{judge, record};

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let server = Server::start(Registry::open(&db).expect("open"));
    let mut ids = Vec::new();
    for n in 0..120 {
        let service = ["alpha", "beta", "gamma"][n % 3];
        ids.push(register(
            &server.url,
            service,
            &format!("http://127.0.0.1:{}", 10_000 + n),
            None,
            json!([]),
        ));
    }
    // Checks written as the aggregator writes them: gamma's instance
    // 10,002 critical, beta's 10,001 a warning, every other one healthy.
    let conn = rusqlite::Connection::open(&db).expect("open");
    let now = rfidl_runtime::store::now_ms();
    for (n, id) in ids.iter().enumerate() {
        let answer = match n {
            2 => Err("connection refused or unreachable".to_owned()),
            _ => Ok(rfidl_registry::aggregator::RemoteHealth {
                status: if n == 1 { "warning" } else { "healthy" }.to_owned(),
                ..Default::default()
            }),
        };
        record(&conn, id, &judge(answer), now).expect("record");
    }
    let page = |query: &str| {
        let (status, body) = crate::support::get(&server.url, query);
        assert_eq!(status, 200, "{query}: {body}");
        body
    };
    let first = page("/");
    assert!(first.contains("healthy: <b>118</b>"), "{first}");
    assert!(first.contains("critical: <b>1</b>"));
    assert!(first.contains("warning: <b>1</b>"));
    assert_eq!(first.matches("class=\"service\" id=\"service-").count(), 3);
    let beta = &first[first.find("id=\"service-beta\"").expect("beta row")..];
    let beta = &beta[..beta.find("</tr>").expect("end")];
    assert_eq!(cell(beta, "num instances"), "40");
    assert_eq!(cell(beta, "num warning"), "1");
    assert_eq!(cell(beta, "num healthy"), "39");
    assert_eq!(first.matches("<tr class=\"instance\"").count(), 50);
    // The worst first: the critical one, then the warning.
    let statuses: Vec<&str> = first
        .match_indices("data-status=\"")
        .map(|(at, _)| {
            let rest = &first[at + 13..];
            &rest[..rest.find('"').expect("quote")]
        })
        .collect();
    assert_eq!(&statuses[..3], ["critical", "warning", "healthy"]);
    assert!(first.contains("1–50 of 120"), "{first}");
    assert!(first.contains("href=\"/?page=2\""), "next link");
    let last = page("/?page=3");
    assert_eq!(last.matches("<tr class=\"instance\"").count(), 20);
    assert!(last.contains("101–120 of 120"), "{last}");
    assert!(last.contains("rel=\"prev\" href=\"/?page=2\""), "{last}");
    assert!(!last.contains("rel=\"next\""));
    let gamma = page("/?service=gamma&hours=2");
    assert_eq!(gamma.matches("<tr class=\"instance\"").count(), 40);
    assert_eq!(gamma.matches("data-service=\"gamma\"").count(), 40);
    assert!(gamma.contains("1–40 of 40"), "{gamma}");
    let beyond = page("/?page=9");
    assert!(beyond.contains("No instance on this page"), "{beyond}");
    for odd in ["/?page=0", "/?page=x", "/?service=a%20b", "/?service="] {
        let (status, body) = crate::support::get(&server.url, odd);
        assert_eq!(status, 400, "{odd}: {body}");
    }
}
