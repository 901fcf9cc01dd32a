//! Hostile manifests and hostile input against the registry: a publish of a
//! manifest no contract could produce is refused with 422
//! `manifest_rejected` and its `M` code, and nothing is stored (checked in
//! the SQLite file); a hostile manifest planted in the database is refused by
//! the client at fetch and nothing is cached or locked; and a seeded stream
//! of random and mutated requests over real HTTP never panics the server,
//! never gets an undocumented status and never writes a row for a refused
//! request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rfidl_cli::{self as cli, Outcome};
use rfidl_codegen::manifest::{Field, Manifest};
use rfidl_codegen::registry::client::RegistryClient;
use rfidl_codegen::registry::{Cache, LockFile, LockPolicy, RegistryError, Remote, resolve};
use rfidl_registry::Registry;

use crate::support::{Server, put, schema_manifest};

fn orders() -> Manifest {
    schema_manifest("shop.orders.OrderService", 1)
}

fn edited(edit: impl FnOnce(&mut Manifest)) -> Manifest {
    let mut manifest = orders();
    edit(&mut manifest);
    manifest.with_fingerprint()
}

/// The hostile manifests of issue 15, each with the code it is refused with.
fn hostile_cases() -> Vec<(&'static str, Manifest, &'static str)> {
    let interface = |name: &'static str| edited(move |m| m.interface = name.into());
    vec![
        (
            "interface ../../etc/passwd",
            interface("../../etc/passwd"),
            "M0002",
        ),
        ("interface a/b", interface("a/b"), "M0002"),
        ("interface <script>", interface("<script>"), "M0002"),
        (
            "method `Hired(); } fn pwn() {`",
            edited(|m| m.methods[0].name = "Hired(); } fn pwn() {".into()),
            "M0004",
        ),
        (
            "undefined type",
            edited(|m| {
                m.methods[1].params.push(Field {
                    name: "ghost".into(),
                    ty: "shop.orders.Ghost".parse().expect("type"),
                    docs: Vec::new(),
                    deprecated: None,
                })
            }),
            "M0012",
        ),
        (
            "type name with a space",
            edited(|m| {
                let def = m.types.remove("shop.orders.Order").expect("Order");
                m.types.insert("shop.orders.Or der".into(), def);
            }),
            "M0004",
        ),
        (
            "field named r#fn",
            edited(|m| m.methods[1].params[1].name = "r#fn".into()),
            "M0004",
        ),
        (
            "non-ASCII that is not an identifier",
            edited(|m| m.methods[0].name = "Hire\u{202e}d".into()),
            "M0004",
        ),
        (
            "method named `fn`",
            edited(|m| m.methods[0].name = "fn".into()),
            "M0006",
        ),
        (
            "doc line that ends the comment",
            edited(|m| m.docs = vec!["ok\n} fn pwn() {".into()]),
            "M0020",
        ),
        (
            "long name",
            edited(|m| m.methods[0].name = "A".repeat(4096)),
            "M0005",
        ),
    ]
}

/// Rows in the registry's SQLite file, read with a connection of its own.
fn rows(db: &Path) -> i64 {
    count_rows(&rusqlite::Connection::open(db).expect("open db"))
}

fn count_rows(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM manifests", [], |row| row.get(0))
        .expect("count")
}

/// One path segment, percent-encoded (a hostile interface id may hold `/`).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn hostile_publishes_are_refused_with_their_code_and_store_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let server = Server::on_file(&db);
    for (what, manifest, code) in hostile_cases() {
        let path = format!(
            "/v1/interfaces/{}/v{}",
            segment(&manifest.interface),
            manifest.version
        );
        let (status, body) = put(&server.url, &path, manifest.to_pretty_json(), None);
        assert_eq!(status, 422, "{what}: {body}");
        assert_eq!(body["error"], "manifest_rejected", "{what}: {body}");
        let codes: Vec<&str> = body["problems"]
            .as_array()
            .expect("problems")
            .iter()
            .filter_map(|p| p["code"].as_str())
            .collect();
        assert!(codes.contains(&code), "{what}: {codes:?}");
        assert!(
            body.to_string().len() < 20_000,
            "{what}: the answer does not echo long names"
        );
    }
    // A 10 MB name is over the body limit before it is even parsed: 413,
    // and the server closes without reading the rest, so the answer may
    // be lost to a reset while the client still writes.
    let huge = edited(|m| m.methods[0].name = "A".repeat(10 * 1024 * 1024));
    let status = exchange(
        server.url.trim_start_matches("http://"),
        &http(
            "PUT",
            "/v1/interfaces/shop.orders.OrderService/v1",
            &[],
            huge.to_pretty_json().as_bytes(),
        ),
    );
    assert!(matches!(status, Some(413) | None), "{status:?}");
    // `list<list<…` nested far deeper than a contract allows: refused as
    // not a manifest (before the parser could recurse into it).
    let deep = orders().to_pretty_json().replacen(
        "\"type\": \"uuid\"",
        &format!(
            "\"type\": \"{}uuid{}\"",
            "list<".repeat(100_000),
            ">".repeat(100_000)
        ),
        1,
    );
    let (status, body) = put(
        &server.url,
        "/v1/interfaces/shop.orders.OrderService/v1",
        deep,
        None,
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("invalid_manifest")),
        "{body}"
    );
    // What the registry cannot read, or finds at odds with the path, is
    // not echoed back in full.
    let long = "x".repeat(500_000);
    let unreadable = orders().to_pretty_json().replacen(
        "\"kind\": \"pushcall\"",
        &format!("\"kind\": \"{long}\""),
        1,
    );
    let elsewhere = edited(|m| m.interface = format!("shop.orders.{long}"));
    for (body, code) in [
        (unreadable, "invalid_manifest"),
        (elsewhere.to_pretty_json(), "path_mismatch"),
    ] {
        let (status, answer) = put(
            &server.url,
            "/v1/interfaces/shop.orders.OrderService/v1",
            body,
            None,
        );
        assert_eq!(
            (status, answer["error"].as_str()),
            (422, Some(code)),
            "{answer}"
        );
        let message = answer["message"].as_str().expect("message");
        assert!(
            message.len() < 2_000,
            "{code}: a {}-byte message",
            message.len()
        );
    }
    assert_eq!(rows(&db), 0, "nothing stored");
    // The registry still works.
    let (status, body) = put(
        &server.url,
        "/v1/interfaces/shop.orders.OrderService/v1",
        orders().to_pretty_json(),
        None,
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(rows(&db), 1);
}

/// The store itself refuses them too, whoever calls it.
#[test]
fn hostile_manifests_never_reach_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let mut conn = rfidl_registry::store::open(&db).expect("open");
    for (what, manifest, code) in hostile_cases() {
        match rfidl_registry::store::publish(&mut conn, &manifest, 0) {
            Err(rfidl_registry::store::PublishError::Invalid(problems)) => {
                assert!(problems.has(code), "{what}: {problems}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(rows(&db), 0);
}

/// A manifest that got into the database some other way (an older registry,
/// a hand edit) is refused by the client: nothing is cached, nothing locked.
#[test]
fn hostile_manifests_planted_in_the_registry_are_refused_at_fetch() {
    for (what, manifest, code) in hostile_cases() {
        if manifest.interface != "shop.orders.OrderService" {
            continue;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("registry.db");
        drop(Registry::open(&db).expect("create"));
        rusqlite::Connection::open(&db)
            .expect("open")
            .execute(
                "INSERT INTO manifests VALUES (?1, ?2, 1, ?3, ?4, 0)",
                rusqlite::params![
                    manifest.interface,
                    manifest.version,
                    manifest.fingerprint,
                    manifest.to_pretty_json()
                ],
            )
            .expect("plant");
        let server = Server::on_file(&db);
        let client = RegistryClient::new(&server.url).expect("client");
        let cache_dir = dir.path().join("cache");
        let cache = Cache::new(&cache_dir);
        let mut lock = LockFile::default();
        let remote: Remote = "shop.orders.OrderService@v1".parse().expect("remote");
        let error = resolve(
            std::slice::from_ref(&remote),
            &mut lock,
            &cache,
            Some(&client),
            LockPolicy::Keep,
        )
        .expect_err(what);
        match &error {
            RegistryError::InvalidManifest { origin, problems } => {
                assert!(origin.starts_with(&server.url), "{what}: {origin}");
                assert!(problems.has(code), "{what}: {problems}");
            }
            other => panic!("{what}: {other}"),
        }
        assert!(lock.interfaces.is_empty(), "{what}: nothing pinned");
        // The CLI's fetch: refused, no lock file, no cache entry.
        let lock_path = dir.path().join("rfidl.lock");
        assert_eq!(
            cli::fetch(
                Some(&server.url),
                &lock_path,
                &cache,
                &[remote],
                LockPolicy::Update
            ),
            Outcome::UsageOrIo,
            "{what}"
        );
        assert!(!lock_path.exists(), "{what}: no lock written");
        assert!(!cache_dir.exists(), "{what}: nothing cached");
    }
}

// ---------------------------------------------------------------------
// Hostile input: a seeded stream of random and mutated requests.

/// Statuses `docs/registry.md` lists (431: request headers over the HTTP
/// server's limit, answered before any route; 403 `operation_disabled` and
/// 429 `rate_limited` on the directory's routes).
const DOCUMENTED: &[u16] = &[
    200, 201, 400, 401, 403, 404, 405, 409, 413, 422, 429, 431, 503,
];

/// Sends raw bytes as one HTTP/1.1 exchange (`connection: close`) and
/// returns the status, or `None` when the server closed without an answer
/// (allowed only for bytes that are not HTTP).
fn exchange(addr: &str, request: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The server may answer (413, 431) and close before reading it all.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    // A reset after a complete answer still leaves the answer read.
    let _ = stream.read_to_end(&mut answer);
    let head = std::str::from_utf8(answer.get(..12)?).ok()?;
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

fn http(method: &str, path: &str, headers: &[(Vec<u8>, Vec<u8>)], body: &[u8]) -> Vec<u8> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: registry\r\n").into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name);
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    request.extend_from_slice(body);
    request
}

/// One random request, and whether it is a valid publish (which may add a row).
fn hostile_request(rng: &mut StdRng, valid: &[Manifest], token: &str) -> (u32, Vec<u8>) {
    let kind = rng.random_range(0..12);
    (kind, hostile_request_of(kind, rng, valid, token))
}

fn hostile_request_of(kind: u32, rng: &mut StdRng, valid: &[Manifest], token: &str) -> Vec<u8> {
    let manifest = valid.choose(rng).expect("manifests");
    let path = format!(
        "/v1/interfaces/{}/v{}",
        manifest.interface, manifest.version
    );
    let auth = (
        b"authorization".to_vec(),
        format!("Bearer {token}").into_bytes(),
    );
    let json = manifest.to_pretty_json().into_bytes();
    match kind {
        // Mutated valid manifest: flip, drop or insert bytes.
        0..=2 => {
            let mut body = json;
            for _ in 0..rng.random_range(1..8) {
                let at = rng.random_range(0..body.len());
                match rng.random_range(0..3) {
                    0 => body[at] = rng.random(),
                    1 => {
                        body.remove(at);
                    }
                    _ => body.insert(at, rng.random()),
                }
            }
            http("PUT", &path, &[auth], &body)
        }
        // Wrong JSON types for each member.
        3 => {
            let mut value: serde_json::Value = serde_json::from_slice(&json).expect("json");
            let keys = [
                "format",
                "interface",
                "package",
                "service",
                "version",
                "fingerprint",
                "methods",
                "types",
                "docs",
            ];
            let key = *keys.choose(rng).expect("key");
            let wrong = [
                serde_json::json!(null),
                serde_json::json!(-1),
                serde_json::json!(1.5),
                serde_json::json!("x"),
                serde_json::json!([1, 2]),
                serde_json::json!({"a": 1}),
                serde_json::json!(true),
                serde_json::json!(u64::MAX),
            ];
            value[key] = wrong.choose(rng).expect("wrong").clone();
            http("PUT", &path, &[auth], value.to_string().as_bytes())
        }
        // Deep nesting.
        // Deep nesting: of JSON, and of a type reference inside a manifest
        // (`list<list<…`, parsed by the registry itself).
        4 => {
            let depth = [100, 1_000, 100_000].choose(rng).copied().expect("depth");
            let body = if rng.random_bool(0.5) {
                format!("{}{}", "[".repeat(depth), "]".repeat(depth))
            } else {
                let deep = format!("{}uuid{}", "list<".repeat(depth), ">".repeat(depth));
                let text = String::from_utf8_lossy(&json).into_owned();
                match text.find("\"type\": \"") {
                    Some(at) => {
                        let start = at + "\"type\": \"".len();
                        let end = start + text[start..].find('"').unwrap_or(0);
                        format!("{}{deep}{}", &text[..start], &text[end..])
                    }
                    None => text,
                }
            };
            http("PUT", &path, &[auth], body.as_bytes())
        }
        // Non-UTF-8 body and header values.
        5 => {
            let body: Vec<u8> = (0..rng.random_range(0..512))
                .map(|_| rng.random())
                .collect();
            let header = (b"x-odd".to_vec(), vec![0xff, 0xfe, b'a', 0x80]);
            http("PUT", &path, &[auth, header], &body)
        }
        // Huge headers.
        6 => {
            let size = [8 * 1024, 64 * 1024, 200 * 1024]
                .choose(rng)
                .copied()
                .expect("size");
            let header = (b"x-big".to_vec(), vec![b'a'; size]);
            http("GET", &path, &[header], b"")
        }
        // Odd paths and methods.
        7 => {
            let paths = [
                "/v1/interfaces/%2e%2e%2f%2e%2e%2fetc%2fpasswd/v1",
                "/v1/interfaces/shop.orders.OrderService/v0",
                "/v1/interfaces/shop.orders.OrderService/v99999999999",
                "/v1/interfaces/shop.orders.OrderService/v1/sha256:..%2F..",
                "/v1/interfaces/%ff%fe/v1",
                "/v1/interfaces/x/v1/y/z",
                "/v1/interfaces?x=%zz",
                "/health?%00",
                "/../../etc/passwd",
                "/v1/interfaces/shop.orders.OrderService/v%31",
                "//v1//interfaces",
            ];
            let methods = [
                "GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO",
            ];
            let method = *methods.choose(rng).expect("method");
            let path = *paths.choose(rng).expect("path");
            if method == "HEAD" {
                // No body in the answer; still a status line.
                return http(method, path, &[], b"");
            }
            http(
                method,
                path,
                &[auth],
                &json[..rng.random_range(0..json.len())],
            )
        }
        // Publishes with a bad or missing token.
        8 => {
            let bad = (b"authorization".to_vec(), b"Bearer nope".to_vec());
            http("PUT", &path, &[bad], &json)
        }
        // Garbage that is not HTTP at all.
        9 => (0..rng.random_range(1..256))
            .map(|_| rng.random())
            .collect(),
        // Reads of what exists and what does not.
        10 => {
            let exact = format!("{path}/{}", manifest.fingerprint);
            let path = [path.as_str(), exact.as_str(), "/v1/interfaces", "/health"]
                .choose(rng)
                .copied()
                .expect("path");
            http("GET", path, &[], b"")
        }
        // A valid publish (already stored: 200, or new: 201).
        _ => http("PUT", &path, &[auth], &json),
    }
}

/// Panics anywhere in the process outside the test code.
static SERVER_PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn count_server_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info
            .location()
            .is_some_and(|l| l.file().contains("tests/it/"))
        {
            SERVER_PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        previous(info);
    }));
}

#[test]
fn hostile_input_fuzz_never_panics_nor_writes_for_a_refusal() {
    const REQUESTS: usize = 3_000;
    count_server_panics();
    let panics_before = SERVER_PANICS.load(std::sync::atomic::Ordering::SeqCst);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let token = "fuzz-token";
    let server = Server::start(Registry::open(&db).expect("open").publish_token(token));
    let addr = server.url.trim_start_matches("http://").to_owned();
    let valid = crate::support::schema_manifests();
    let mut rng = StdRng::seed_from_u64(0x000f_0e15);
    let mut created = 0;
    let mut statuses = std::collections::BTreeMap::<Option<u16>, usize>::new();
    let counter = rusqlite::Connection::open(&db).expect("open db");
    let started = std::time::Instant::now();
    let mut kinds = std::collections::BTreeMap::<u32, usize>::new();
    for index in 0..REQUESTS {
        let (kind, request) = hostile_request(&mut rng, &valid, token);
        let before = count_rows(&counter);
        let status = exchange(&addr, &request);
        *kinds.entry(kind).or_default() += 1;
        *statuses.entry(status).or_default() += 1;
        let after = count_rows(&counter);
        match status {
            Some(201) => {
                created += 1;
                assert_eq!(after, before + 1, "request {index}: a 201 adds one row");
            }
            Some(code) => {
                assert!(
                    DOCUMENTED.contains(&code),
                    "request {index}: undocumented status {code}: {:?}",
                    String::from_utf8_lossy(&request[..request.len().min(300)])
                );
                assert_eq!(after, before, "request {index}: {code} wrote a row");
            }
            None => {
                // Only bytes that are not an HTTP request may go unanswered.
                assert!(
                    !request.starts_with(b"GET ") && !request.starts_with(b"PUT "),
                    "request {index} got no answer: {:?}",
                    String::from_utf8_lossy(&request[..request.len().min(300)])
                );
                assert_eq!(after, before);
            }
        }
    }
    assert!(
        !statuses.keys().any(|s| s.is_some_and(|s| s >= 500)),
        "no 5xx: {statuses:?}"
    );
    // At most one row per valid manifest: mutations that keep a manifest
    // valid change only its docs (same fingerprint: 200, nothing written).
    assert!(
        created <= valid.len(),
        "{created} rows for {} manifests",
        valid.len()
    );
    assert_eq!(rows(&db), created as i64);
    assert_eq!(
        SERVER_PANICS.load(std::sync::atomic::Ordering::SeqCst) - panics_before,
        0,
        "no panic in the server"
    );
    // Still serving.
    assert_eq!(
        exchange(&addr, &http("GET", "/health", &[], b"")),
        Some(200)
    );
    eprintln!(
        "registry fuzz: {REQUESTS} requests in {:?}, statuses {statuses:?}",
        started.elapsed()
    );
    assert_eq!(kinds.len(), 12, "every kind of request was sent: {kinds:?}");
}
