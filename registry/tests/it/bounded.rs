//! Bounded reads and no forgery (issue 26): what the registry reads from a
//! registered instance is bounded (64 KiB of health, 1 MiB of failed list,
//! reasons cut in count and length), no redirect is followed, failures show
//! as one generic reason, the failed-list page needs the operator token,
//! registrations are rate-limited per service and may be limited to given
//! networks. Every instance is a real HTTP server on 127.0.0.1.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use rfidl_registry::Registry;
use rfidl_registry::aggregator::{MAX_REASON_CHARS, MAX_REASONS, UNREACHABLE};
use serde_json::{Value, json};

use crate::closed::{register, send};
use crate::support::Server;

/// A raw HTTP server that answers every request with a 200 whose body
/// (no length, until the connection closes) is `prefix` then `filler`
/// bytes up to `total`; counts the bytes it managed to write.
fn streaming_server(prefix: &'static str, total: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let written = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&written);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let counter = Arc::clone(&counter);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
                if stream.write_all(head.as_bytes()).is_err()
                    || stream.write_all(prefix.as_bytes()).is_err()
                {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                let mut sent = prefix.len();
                while sent < total {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                    sent += chunk.len();
                    counter.store(sent, Ordering::Relaxed);
                }
            });
        }
    });
    (url, written)
}

fn poll_once(registry: &Registry) {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(registry.poll_health_once(Duration::from_secs(5)))
        .expect("poll");
}

/// The stored reasons of the instance at `base_url` (its last check).
fn stored_check(db: &Path, base_url: &str) -> (String, String, i64) {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.query_row(
        "SELECT h.colour, h.reasons, length(h.reasons) FROM health_checks h \
         JOIN instances i ON i.instance_id = h.instance_id WHERE i.base_url = ?1 \
         ORDER BY h.id DESC LIMIT 1",
        [base_url],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
    .expect("a check")
}

/// The finding: a 30 MB health answer was stored every poll. Now at most
/// 64 KiB is read (critical, "larger than 64 KiB"), whether the instance
/// states its length (axum, 30 MB) or streams without one; and the reasons
/// of an answer under the bound are cut in count and length.
#[test]
fn health_answers_are_read_up_to_64_kib_and_reasons_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let registry = Registry::open(&db).expect("open");
    let server = Server::start(registry.clone());

    let huge = Arc::new(format!(
        "{{\"status\":\"healthy\",\"reasons\":[\"{}\"],\"outbox\":{{}}}}",
        "x".repeat(30 * 1024 * 1024)
    ));
    let stated = Server::serve(Router::new().route(
        "/_rf/health",
        get(move || {
            let huge = Arc::clone(&huge);
            async move {
                (
                    [("content-type", "application/json")],
                    huge.as_str().to_owned(),
                )
            }
        }),
    ));
    let (streamed, written) =
        streaming_server("{\"status\":\"healthy\",\"reasons\":[\"", 30 * 1024 * 1024);
    let many: Vec<String> = (0..100)
        .map(|i| format!("{i}:{}", "y".repeat(500)))
        .collect();
    let chatty_body = json!({"status": "warning", "reasons": many, "outbox": {}}).to_string();
    assert!(chatty_body.len() < 64 * 1024);
    let chatty = Server::serve(Router::new().route(
        "/_rf/health",
        get(move || {
            let body = chatty_body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    ));
    for (service, url) in [
        ("stated", &stated.url),
        ("streamed", &streamed),
        ("chatty", &chatty.url),
    ] {
        assert_eq!(
            register(&server, service, &json!({"baseUrl": url}), None).0,
            201
        );
    }
    let started = std::time::Instant::now();
    poll_once(&registry);
    let took = started.elapsed();
    for url in [&stated.url, &streamed] {
        let (colour, reasons, length) = stored_check(&db, url);
        assert_eq!(colour, "critical");
        assert_eq!(reasons, r#"["the health answer is larger than 64 KiB"]"#);
        assert!(length < 100);
    }
    let sent = written.load(Ordering::Relaxed);
    eprintln!(
        "one poll of three instances (two answering 30 MB): {took:?}; the streaming one wrote \
         {sent} bytes before the registry hung up"
    );
    assert!(sent < 30 * 1024 * 1024, "the registry read it all");
    let (colour, reasons, length) = stored_check(&db, &chatty.url);
    assert_eq!(colour, "warning");
    let reasons: Vec<String> = serde_json::from_str(&reasons).expect("json");
    assert_eq!(reasons.len(), MAX_REASONS + 1, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| r.chars().count() <= MAX_REASON_CHARS + 1)
    );
    assert_eq!(reasons[MAX_REASONS], "… and 84 more reason(s)");
    assert!(length < 6000, "{length}");
    // The dashboard stays small.
    let (status, page, _) = send(
        reqwest::Method::GET,
        &format!("{}/", server.url),
        None,
        None,
    );
    assert_eq!(status, 200);
    assert!(page.as_str().expect("html").len() < 64 * 1024);
}

/// The finding: the aggregator followed redirects to any host and port.
/// A 302 to another local port is an answer like any other: the second
/// server sees no request, and the instance shows as unreachable.
#[test]
fn redirects_are_not_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let registry = Registry::open(&db).expect("open");
    let server = Server::start(registry.clone());
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let target = Server::serve(Router::new().fallback(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            (
                [("content-type", "application/json")],
                r#"{"status":"healthy","outbox":{},"messages":[]}"#,
            )
        }
    }));
    let location = format!("{}/_rf/health", target.url);
    let failed_location = format!("{}/_rf/outbox/failed", target.url);
    let redirector = Server::serve(
        Router::new()
            .route(
                "/_rf/health",
                get(move || {
                    let location = location.clone();
                    async move { (axum::http::StatusCode::FOUND, [("location", location)]) }
                }),
            )
            .route(
                "/_rf/outbox/failed",
                get(move || {
                    let location = failed_location.clone();
                    async move {
                        (
                            axum::http::StatusCode::TEMPORARY_REDIRECT,
                            [("location", location)],
                        )
                    }
                }),
            ),
    );
    let (status, registered) = register(&server, "hr", &json!({"baseUrl": redirector.url}), None);
    assert_eq!(status, 201);
    poll_once(&registry);
    let (colour, reasons, _) = stored_check(&db, &redirector.url);
    assert_eq!(colour, "critical");
    assert_eq!(reasons, json!([UNREACHABLE]).to_string());
    let (status, answer, _) = send(
        reqwest::Method::GET,
        &format!(
            "{}/instances/{}/failed",
            server.url,
            registered["instanceId"].as_str().expect("id")
        ),
        None,
        None,
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (502, Some("instance_unreachable"))
    );
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the redirect was followed");
}

/// The finding: the dashboard's failed list bypassed each service's ops
/// token. Now it needs the registry's operator token (a bearer token, or
/// a browser's Basic password, which a 401 asks for), and it reads at most
/// 1 MiB from the instance.
#[test]
fn the_failed_list_page_needs_the_operator_token_and_reads_at_most_1_mib() {
    use base64::Engine as _;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .registration_token("reg")
            .operator_token("op"),
    );
    let instance = Server::serve(Router::new().route(
        "/_rf/outbox/failed",
        get(|| async { ([("content-type", "application/json")], r#"{"messages":[]}"#) }),
    ));
    let big = Server::serve(Router::new().route(
        "/_rf/outbox/failed",
        get(|| async {
            let filler = "z".repeat(2 * 1024 * 1024);
            (
                [("content-type", "application/json")],
                format!(r#"{{"messages":[],"pad":"{filler}"}}"#),
            )
        }),
    ));
    let page = |id: &Value, authorization: Option<&str>| {
        let mut request = reqwest::blocking::Client::new().get(format!(
            "{}/instances/{}/failed",
            server.url,
            id.as_str().expect("id")
        ));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let response = request.send().expect("page");
        let status = response.status().as_u16();
        let challenge: Vec<String> = response
            .headers()
            .get_all("www-authenticate")
            .iter()
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .collect();
        (status, challenge, response.text().expect("body"))
    };
    let (_, small) = register(
        &server,
        "hr",
        &json!({"baseUrl": instance.url}),
        Some("reg"),
    );
    let (_, large) = register(&server, "big", &json!({"baseUrl": big.url}), Some("reg"));
    for wrong in [None, Some("Bearer reg"), Some("Bearer wrong")] {
        let (status, challenge, body) = page(&small["instanceId"], wrong);
        assert_eq!(status, 401, "{wrong:?}: {body}");
        assert!(
            challenge.iter().any(|c| c.starts_with("Basic ")),
            "{challenge:?}"
        );
    }
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("anyone:op")
    );
    for right in ["Bearer op", basic.as_str()] {
        let (status, _, body) = page(&small["instanceId"], Some(right));
        assert_eq!(status, 200, "{right}: {body}");
        assert!(body.contains("Nothing needs a human"), "{body}");
    }
    let (status, _, body) = page(&large["instanceId"], Some("Bearer op"));
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("larger than 1 MiB"), "{body}");
}

/// Registrations of one service are rate-limited: 429 `rate_limited`
/// with `Retry-After`; another service is not affected.
#[test]
fn registrations_per_service_are_rate_limited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .registrations_per_minute(3),
    );
    for port in 1..=3 {
        let body = json!({"baseUrl": format!("http://127.0.0.1:{port}")});
        assert_eq!(register(&server, "hr", &body, None).0, 201);
    }
    let url = format!("{}/v1/services/hr/instances", server.url);
    let body = json!({"baseUrl": "http://127.0.0.1:4"});
    let (status, answer, headers) = send(reqwest::Method::POST, &url, Some(&body), None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (429, Some("rate_limited")),
        "{answer}"
    );
    let retry: u64 = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(
        register(
            &server,
            "engine",
            &json!({"baseUrl": "http://127.0.0.1:5"}),
            None
        )
        .0,
        201
    );
}

/// With an allow-list, a base URL outside it is refused (422
/// `network_not_allowed`), by address or by what its host name resolves to.
#[test]
fn registrations_outside_the_allowed_networks_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let only_ten = Server::start(
        Registry::open(&dir.path().join("a.db"))
            .expect("open")
            .allow_network("10.0.0.0/8".parse().expect("cidr")),
    );
    for url in [
        "http://127.0.0.1:7001",
        "http://[::1]:7001",
        "http://localhost:7001",
    ] {
        let (status, answer) = register(&only_ten, "hr", &json!({"baseUrl": url}), None);
        assert_eq!(
            (status, answer["error"].as_str()),
            (422, Some("network_not_allowed")),
            "{url}: {answer}"
        );
    }
    assert_eq!(
        register(
            &only_ten,
            "hr",
            &json!({"baseUrl": "http://10.1.2.3:7001"}),
            None
        )
        .0,
        201
    );
    let loopback = Server::start(
        Registry::open(&dir.path().join("b.db"))
            .expect("open")
            .allow_network("127.0.0.0/8".parse().expect("cidr"))
            .allow_network("::1".parse().expect("address")),
    );
    for url in [
        "http://127.0.0.1:7001",
        "http://[::1]:7001",
        "http://localhost:7001",
    ] {
        assert_eq!(
            register(&loopback, "hr", &json!({"baseUrl": url}), None).0,
            201,
            "{url}"
        );
    }
    // The aggregator's resolver lets a host name inside through.
    let db = dir.path().join("c.db");
    let registry = Registry::open(&db)
        .expect("open")
        .allow_network("127.0.0.0/8".parse().expect("cidr"))
        .allow_network("::1".parse().expect("address"));
    let server = Server::start(registry.clone());
    let instance = Server::serve(Router::new().route(
        "/_rf/health",
        get(|| async {
            (
                [("content-type", "application/json")],
                r#"{"status":"healthy","reasons":[],"outbox":{}}"#,
            )
        }),
    ));
    let by_name = instance.url.replace("127.0.0.1", "localhost");
    assert_eq!(
        register(&server, "hr", &json!({"baseUrl": by_name}), None).0,
        201
    );
    poll_once(&registry);
    assert_eq!(stored_check(&db, &by_name).0, "healthy");
}
