//! Hostile input against a real receiver with its diagnostics routes merged
//! (the test service of `receiver_fixture.rs`; real HTTP on loopback), on
//! every store: a SQLite file under rusqlite or under sqlx, a database on
//! the tests' PostgreSQL server. A seeded stream of random and mutated
//! requests (invalid JSON, 100,000-deep nesting, huge and non-UTF-8 headers
//! and bodies, wrong JSON types for every envelope field, mutated valid
//! envelopes, garbage **signed with the receiver's real secret** so the
//! signature check passes and deeper code runs, odd query strings, paths
//! and methods): 7,500 requests on the blocking store, the first 2,500 of
//! them on each sqlx store.
//!
//! Asserted for every request: an answer with a status the wire protocol and
//! `docs/operations.md` list, no 5xx but the retryable 503s, an error body
//! that is JSON with a code (for every answer past the HTTP layer), and no
//! row written for anything but a fresh acknowledgement (inbox, business and
//! outbox rows counted in the database). After the run: no panic anywhere
//! in the server (a panic hook counts them), the server still answers
//! `/_rf/health` and still processes a valid message.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rfidl_runtime::signing::{Secret, unix_now};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::receiver_fixture::{FINGERPRINT_V1, INTERFACE, Message, SOURCE, employees_app, sign};
use crate::stores::{TestStore, on_every_store};

/// Requests sent to the receiver (the registry's fuzz sends 3,000 more).
const REQUESTS: usize = 7_500;
/// Requests sent to a receiver on a sqlx store: the first part of the same
/// seeded stream (every kind of request is in it). What differs there is
/// the store's code (the writer, the inbox look-up, the diagnostics), not
/// the HTTP and envelope handling the full run covers on the blocking store,
/// and the run stays short in CI (a PostgreSQL commit costs an fsync).
const REQUESTS_ON_SQLX: usize = 2_500;

/// Statuses a request may get: the wire protocol's (200, 400, 401, 404,
/// 405, 413, 422, 503), the diagnostics routes' (409 `not_retryable`), and
/// 431 from the HTTP server for request headers over its limit.
const DOCUMENTED: &[u16] = &[200, 400, 401, 403, 404, 405, 409, 413, 422, 431, 503];
/// The 503 codes that ask the sender to retry.
const RETRYABLE_503: &[&str] = &[
    "storage_unavailable",
    "in_progress",
    "shutting_down",
    "unavailable",
];

/// Panics anywhere in the process outside the test code and the fixture's
/// deliberate `panic…` handler.
static SERVER_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Installs the hook that counts [`SERVER_PANICS`], once for the process
/// (a hook per test would count a panic once per test that installed it).
fn count_server_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_tests = info
                .location()
                .is_some_and(|l| l.file().contains("tests/it/"));
            if !in_tests {
                SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// One raw HTTP/1.1 exchange: (status, body) or `None` without an answer.
fn exchange(addr: &str, request: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The server may answer (413, 431) and close before reading it all.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let status = std::str::from_utf8(answer.get(..12)?)
        .ok()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let mut body = answer[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Some((status, body))
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&data[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        out.extend_from_slice(&data[start..(start + size).min(data.len())]);
        data = &data[(start + size + 2).min(data.len())..];
    }
    out
}

fn http(method: &str, path: &str, headers: &[(Vec<u8>, Vec<u8>)], body: &[u8]) -> Vec<u8> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: receiver\r\n").into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name);
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(
        format!(
            "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    request.extend_from_slice(body);
    request
}

fn header_pairs(pairs: Vec<(&'static str, String)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.into_bytes()))
        .collect()
}

/// `webhook-*` headers for `body` (any bytes) with the real secret, now.
fn signed(id: &str, body: &[u8], secret: &Secret) -> Vec<(Vec<u8>, Vec<u8>)> {
    let headers = rfidl_runtime::signing::SignatureHeaders::sign(
        id,
        unix_now(),
        body,
        std::slice::from_ref(secret),
    );
    header_pairs(headers.to_pairs().into_iter().collect())
}

/// A batch item for `body` (an envelope text), signed with `secret`.
fn batch_item(id: &str, body: &str, secret: &Secret) -> Value {
    let headers: BTreeMap<String, String> = sign(id, unix_now(), body, secret)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    json!({"headers": headers, "body": body})
}

/// A fresh valid `EmployeeHired` (names never start with the fixture's
/// failure prefixes).
fn valid_message(rng: &mut StdRng) -> Message {
    Message::hired(&format!("fuzz-{}", rng.random::<u32>()))
}

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    (0..rng.random_range(0..max))
        .map(|_| rng.random())
        .collect()
}

fn mutate(rng: &mut StdRng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.random_range(1..8) {
        if bytes.is_empty() {
            bytes.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..bytes.len());
        match rng.random_range(0..3) {
            0 => bytes[at] = rng.random(),
            1 => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, rng.random()),
        }
    }
    bytes
}

fn wrong_value(rng: &mut StdRng) -> Value {
    match rng.random_range(0..12) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(1.5e300),
        3 => json!(""),
        4 => json!("not a uuid"),
        5 => json!([1, "x"]),
        6 => json!({"nested": {"deeper": []}}),
        7 => json!(true),
        8 => json!(u64::MAX),
        9 => json!(i64::MIN),
        10 => json!("\u{0000}\u{FFFF}"),
        _ => json!("x".repeat(10_000)),
    }
}

const ENVELOPE_FIELDS: &[&str] = &[
    "messageId",
    "correlationId",
    "sourceServiceId",
    "messageType",
    "interface",
    "version",
    "fingerprint",
    "endpoint",
    "payload",
    "headers",
];

/// What one request is, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Valid,
    Replay,
    GarbageBody,
    DeepNesting,
    HugeHeaders,
    NonUtf8,
    WrongTypes,
    MutatedSigned,
    MutatedUnsigned,
    SignedGarbage,
    Batch,
    Diagnostics,
    OddRoute,
}

struct Generator {
    rng: StdRng,
    secret: Secret,
    /// Envelopes acknowledged (or sent) before: replays of them are duplicates.
    sent: Vec<Message>,
}

impl Generator {
    fn next(&mut self) -> (Kind, Vec<u8>) {
        let rng = &mut self.rng;
        let receive = if rng.random_bool(0.7) {
            "/_rf/receive"
        } else {
            "/_rf/receive/batch"
        };
        match rng.random_range(0..100) {
            0..=3 => {
                let message = valid_message(rng);
                let body = message.body();
                let request = http(
                    "POST",
                    "/_rf/receive",
                    &signed(&message.id.to_string(), body.as_bytes(), &self.secret),
                    body.as_bytes(),
                );
                self.sent.push(message);
                (Kind::Valid, request)
            }
            4..=6 => {
                let Some(message) = self.sent.choose(rng).cloned() else {
                    return (Kind::OddRoute, http("GET", "/_rf/health", &[], b""));
                };
                let body = message.body();
                (
                    Kind::Replay,
                    http(
                        "POST",
                        "/_rf/receive",
                        &signed(&message.id.to_string(), body.as_bytes(), &self.secret),
                        body.as_bytes(),
                    ),
                )
            }
            7..=14 => {
                let bodies: [&[u8]; 8] = [
                    b"",
                    b"{",
                    b"null",
                    b"[]",
                    b"{\"sourceServiceId\": 5}",
                    b"{\"sourceServiceId\": \"hr-service\"",
                    b"\"hr-service\"",
                    b"{\"sourceServiceId\": \"nobody\"}",
                ];
                let body = if rng.random_bool(0.5) {
                    bodies.choose(rng).expect("body").to_vec()
                } else {
                    random_bytes(rng, 600)
                };
                (Kind::GarbageBody, http("POST", receive, &[], &body))
            }
            15..=17 => {
                let depth = *[1_000, 100_000].choose(rng).expect("depth");
                let (open, close) = *[("[", "]"), ("{\"a\":", "}")].choose(rng).expect("kind");
                let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
                // Bare, as the payload of a validly signed envelope, or
                // as a batch.
                let message = valid_message(rng);
                match rng.random_range(0..3) {
                    0 => (
                        Kind::DeepNesting,
                        http("POST", receive, &[], nested.as_bytes()),
                    ),
                    1 => {
                        let body = message.body().replacen(
                            "{\"employee\"",
                            &format!("{{\"deep\":{nested},\"employee\""),
                            1,
                        );
                        let id = message.id.to_string();
                        (
                            Kind::DeepNesting,
                            http(
                                "POST",
                                "/_rf/receive",
                                &signed(&id, body.as_bytes(), &self.secret),
                                body.as_bytes(),
                            ),
                        )
                    }
                    _ => {
                        let body = message.body().replacen(
                            "{\"employee\"",
                            &format!("{{\"deep\":{nested},\"employee\""),
                            1,
                        );
                        let batch =
                            json!([batch_item(&message.id.to_string(), &body, &self.secret)]);
                        (
                            Kind::DeepNesting,
                            http(
                                "POST",
                                "/_rf/receive/batch",
                                &[],
                                batch.to_string().as_bytes(),
                            ),
                        )
                    }
                }
            }
            18..=22 => {
                let message = valid_message(rng);
                let body = message.body();
                let mut headers = signed(&message.id.to_string(), body.as_bytes(), &self.secret);
                // Mostly under the HTTP server's limit (so deeper code sees
                // them), sometimes over it (431).
                let size = *[8 * 1024, 8 * 1024, 32 * 1024, 32 * 1024, 300 * 1024]
                    .choose(rng)
                    .expect("size");
                match rng.random_range(0..3) {
                    0 => headers.push((b"x-huge".to_vec(), vec![b'h'; size])),
                    1 => headers.extend(
                        (0..size / 1024)
                            .map(|i| (format!("x-many-{i}").into_bytes(), vec![b'm'; 1000])),
                    ),
                    _ => {
                        headers[0].1 = vec![b's'; size];
                    }
                }
                // Never processed: too large or refused before; a header
                // the receiver ignores must not stop a valid message.
                (
                    Kind::HugeHeaders,
                    http("POST", "/_rf/receive", &headers, body.as_bytes()),
                )
            }
            23..=31 => {
                let message = valid_message(rng);
                let id = message.id.to_string();
                let mut body = message.body().into_bytes();
                let mut headers = signed(&id, &body, &self.secret);
                match rng.random_range(0..4) {
                    // Non-UTF-8 in the body, signed: the bytes verify.
                    0 => {
                        let at = body.len() / 2;
                        body.splice(at..at, [0xff, 0xfe, 0xc3]);
                        headers = signed(&id, &body, &self.secret);
                    }
                    // Non-UTF-8 in a signature header.
                    1 => headers[2].1.extend_from_slice(&[0xff, 0x80]),
                    // Non-UTF-8 in the id header.
                    2 => headers[0].1 = vec![0xc3, 0x28, b'a', 0xa0],
                    // An extra header with obs-text.
                    _ => headers.push((b"x-latin1".to_vec(), vec![0xe9, 0xe8, 0xff])),
                }
                (Kind::NonUtf8, http("POST", receive, &headers, &body))
            }
            32..=46 => {
                let message = valid_message(rng);
                let mut envelope = message.envelope();
                let field = *ENVELOPE_FIELDS.choose(rng).expect("field");
                if rng.random_bool(0.2) {
                    envelope.as_object_mut().expect("object").remove(field);
                } else {
                    envelope[field] = wrong_value(rng);
                }
                if rng.random_bool(0.3) {
                    // Wrong types inside the payload.
                    envelope["payload"] =
                        json!({"employee": {"id": wrong_value(rng), "name": wrong_value(rng)}});
                }
                let body = envelope.to_string();
                let id = envelope["messageId"]
                    .as_str()
                    .map_or_else(|| message.id.to_string(), str::to_owned);
                if receive.ends_with("batch") {
                    let batch = json!([batch_item(&id, &body, &self.secret)]);
                    (
                        Kind::WrongTypes,
                        http("POST", receive, &[], batch.to_string().as_bytes()),
                    )
                } else {
                    (
                        Kind::WrongTypes,
                        http(
                            "POST",
                            receive,
                            &signed(&id, body.as_bytes(), &self.secret),
                            body.as_bytes(),
                        ),
                    )
                }
            }
            47..=61 => {
                let message = valid_message(rng);
                let id = message.id.to_string();
                let body = mutate(rng, message.body().into_bytes());
                (
                    Kind::MutatedSigned,
                    http(
                        "POST",
                        "/_rf/receive",
                        &signed(&id, &body, &self.secret),
                        &body,
                    ),
                )
            }
            62..=66 => {
                let message = valid_message(rng);
                let id = message.id.to_string();
                let body = message.body();
                let headers = signed(&id, body.as_bytes(), &self.secret);
                let body = mutate(rng, body.into_bytes());
                (
                    Kind::MutatedUnsigned,
                    http("POST", "/_rf/receive", &headers, &body),
                )
            }
            67..=74 => {
                // Validly signed garbage: the source is right, so the
                // signature check passes and the envelope parser runs.
                let id = Uuid::now_v7().to_string();
                let garbage = match rng.random_range(0..3) {
                    0 => {
                        let mut text = format!("{{\"sourceServiceId\":\"{SOURCE}\",");
                        text.push_str(&String::from_utf8_lossy(&random_bytes(rng, 300)));
                        text.into_bytes()
                    }
                    1 => json!({"sourceServiceId": SOURCE, "messageId": id, "payload": wrong_value(rng)})
                        .to_string()
                        .into_bytes(),
                    _ => json!({
                        "messageId": id,
                        "sourceServiceId": SOURCE,
                        "messageType": "PushCall",
                        "interface": INTERFACE,
                        "version": rng.random_range(0..4),
                        "fingerprint": FINGERPRINT_V1,
                        "endpoint": *["EmployeeHired", "EmployeeLeft", "Nope", ""].choose(rng).expect("endpoint"),
                        "payload": wrong_value(rng),
                    })
                    .to_string()
                    .into_bytes(),
                };
                (
                    Kind::SignedGarbage,
                    http(
                        "POST",
                        "/_rf/receive",
                        &signed(&id, &garbage, &self.secret),
                        &garbage,
                    ),
                )
            }
            75..=82 => {
                let mut items = Vec::new();
                for _ in 0..rng.random_range(0..6) {
                    let message = valid_message(rng);
                    let id = message.id.to_string();
                    let item = match rng.random_range(0..6) {
                        0 => {
                            self.sent.push(message.clone());
                            batch_item(&id, &message.body(), &self.secret)
                        }
                        1 => json!({"headers": wrong_value(rng), "body": message.body()}),
                        2 => json!({"headers": {}, "body": wrong_value(rng)}),
                        3 => wrong_value(rng),
                        4 => batch_item(
                            &id,
                            &String::from_utf8_lossy(&mutate(rng, message.body().into_bytes())),
                            &self.secret,
                        ),
                        _ => json!({"headers": {"webhook-id": id}, "body": message.body()}),
                    };
                    items.push(item);
                }
                let mut body = Value::Array(items).to_string().into_bytes();
                if rng.random_bool(0.2) {
                    body = mutate(rng, body);
                }
                (Kind::Batch, http("POST", "/_rf/receive/batch", &[], &body))
            }
            83..=94 => {
                let queries = [
                    "",
                    "?",
                    "?status=Failed",
                    "?status=failed",
                    "?status=Sent",
                    "?status=%FF%FE",
                    "?limit=-1",
                    "?limit=99999999999999999999",
                    "?limit=abc",
                    "?destination=%00",
                    "?unknown=1",
                    "?status=Failed&status=Expired",
                    "?%zz",
                    "?limit=1&limit=2",
                    "?destination=x&destination=y",
                ];
                let routes = [
                    ("GET", "/_rf/health"),
                    ("GET", "/_rf/outbox/stats"),
                    ("GET", "/_rf/outbox/failed"),
                    ("GET", "/_rf/inbox/stats"),
                    ("GET", "/_rf/metrics"),
                    ("POST", "/_rf/outbox/retry"),
                    ("POST", "/_rf/outbox/not-a-uuid/retry"),
                    (
                        "POST",
                        "/_rf/outbox/0192f0c4-6c1e-7c7a-9b1e-3f1d2a4b5c6d/retry",
                    ),
                    ("POST", "/_rf/outbox/%FF/retry"),
                    ("GET", "/_rf/metadata"),
                ];
                let (method, route) = *routes.choose(rng).expect("route");
                let query = *queries.choose(rng).expect("query");
                let method = if rng.random_bool(0.15) {
                    *["DELETE", "PUT", "PATCH", "GET", "POST"]
                        .choose(rng)
                        .expect("method")
                } else {
                    method
                };
                (
                    Kind::Diagnostics,
                    http(method, &format!("{route}{query}"), &[], b""),
                )
            }
            _ => {
                let paths = [
                    "/",
                    "/_rf",
                    "/_rf/",
                    "/_rf/receive/",
                    "/_rf/receive/batch/x",
                    "/_rf/../_rf/receive",
                    "/_rf/%2e%2e/receive",
                    "/_rf/receive?x=%ff",
                    "//_rf//receive",
                    "/_rf/outbox",
                    "/_rf/outbox/failed/extra",
                    "*",
                ];
                let methods = [
                    "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW", "POST",
                ];
                let path = *paths.choose(rng).expect("path");
                let method = *methods.choose(rng).expect("method");
                let body = random_bytes(rng, 64);
                (Kind::OddRoute, http(method, path, &[], &body))
            }
        }
    }
}

/// Rows that an accepted message or a retry could write: inbox, business
/// and outbox rows (the same SQL on every store).
const ROW_COUNTS: &str = "SELECT (SELECT count(*) FROM inbox_messages), \
     (SELECT count(*) FROM employees), (SELECT count(*) FROM outbox_messages)";

/// [`ROW_COUNTS`] on `store`: on one connection kept for the run on a
/// SQLite file, on the helpers' session on PostgreSQL.
fn row_counter(store: &TestStore) -> Box<dyn FnMut() -> [i64; 3] + '_> {
    match store.file() {
        Some(path) => {
            let conn = rusqlite::Connection::open(path).expect("open");
            Box::new(move || {
                conn.prepare_cached(ROW_COUNTS)
                    .and_then(|mut statement| {
                        statement.query_row([], |row| Ok([row.get(0)?, row.get(1)?, row.get(2)?]))
                    })
                    .expect("count rows")
            })
        }
        None => Box::new(|| store.counts(ROW_COUNTS)),
    }
}

/// Checks one answer body; returns how many fresh acknowledgements it holds.
fn fresh_acks(status: u16, body: &[u8], batch: bool, what: &str) -> i64 {
    if status != 200 {
        let json: Value = serde_json::from_slice(body)
            .unwrap_or_else(|e| panic!("{what}: {status} without a JSON body ({e}): {body:?}"));
        let code = json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no code: {json}"));
        if status == 503 {
            assert!(RETRYABLE_503.contains(&code), "{what}: 503 {code}");
        }
        return 0;
    }
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return 0; // metrics text
    };
    if batch && let Some(results) = json.as_array() {
        let mut fresh = 0;
        for result in results {
            let status = result["status"].as_u64().expect("status") as u16;
            assert!(DOCUMENTED.contains(&status), "{what}: item status {status}");
            assert!(
                status < 500
                    || (status == 503
                        && RETRYABLE_503.contains(&result["body"]["error"].as_str().unwrap_or(""))),
                "{what}: item {result}"
            );
            if status == 200 && result["body"]["duplicate"] == false {
                fresh += 1;
            }
        }
        return fresh;
    }
    i64::from(json["acknowledged"] == true && json["duplicate"] == false)
}

on_every_store!(
    hostile_input_fuzz_never_panics_nor_writes_for_a_refusal,
    fuzz
);
async fn fuzz(store: &TestStore) {
    count_server_panics();
    // Input handling is under test here, not durability: `normal` commits
    // skip the fsync per message that would dominate the run.
    let (app, secret, _receiver) = employees_app(
        store,
        |config| config.inbox.durability = rfidl_runtime::Durability::Normal,
        None,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    let panics_before = SERVER_PANICS.load(Ordering::SeqCst);
    let requests = match store {
        TestStore::Sqlite { .. } => REQUESTS,
        _ => REQUESTS_ON_SQLX,
    };

    // The loop blocks (raw sockets, the counts), off the async workers.
    let (by_kind, time_by_kind, elapsed) = tokio::task::block_in_place(|| {
        let mut row_counts = row_counter(store);
        let mut generator = Generator {
            rng: StdRng::seed_from_u64(0x15_0007),
            secret: secret.clone(),
            sent: Vec::new(),
        };
        let mut by_kind: BTreeMap<Kind, BTreeMap<Option<u16>, usize>> = BTreeMap::new();
        let mut time_by_kind: BTreeMap<Kind, Duration> = BTreeMap::new();
        let started = std::time::Instant::now();
        // One count a request: what follows one answer is what precedes the
        // next request (nothing else writes), so a late write would still
        // show, charged to the next request.
        let mut after = row_counts();
        for index in 0..requests {
            let (kind, request) = generator.next();
            let what = format!(
                "request {index} ({kind:?}): {:?}",
                String::from_utf8_lossy(&request[..request.len().min(240)])
            );
            let before = after;
            let sent_at = std::time::Instant::now();
            let answer = exchange(&addr, &request);
            *time_by_kind.entry(kind).or_default() += sent_at.elapsed();
            after = row_counts();
            *by_kind
                .entry(kind)
                .or_default()
                .entry(answer.as_ref().map(|a| a.0))
                .or_default() += 1;
            let Some((status, body)) = answer else {
                panic!("{what}: no answer");
            };
            let answered = String::from_utf8_lossy(&body[..body.len().min(400)]);
            assert!(
                DOCUMENTED.contains(&status),
                "{what}: status {status}: {answered}"
            );
            assert!(
                status < 500 || status == 503,
                "{what}: status {status}: {answered}"
            );
            // 400 and 431 without a body come from the HTTP layer itself
            // (a request line or headers it cannot parse).
            // Paths outside `/_rf/` belong to the application the receiver
            // is merged into: the empty 404 there is the router's default.
            let ours = request
                .splitn(3, |b| *b == b' ')
                .nth(1)
                .is_some_and(|path| path.starts_with(b"/_rf/"));
            let fresh = if (matches!(status, 400 | 431) && body.is_empty()) || !ours {
                assert_eq!(after, before, "{what}: nothing written");
                0
            } else {
                let batch = request.starts_with(b"POST /_rf/receive/batch ");
                fresh_acks(status, &body, batch, &what)
            };
            assert_eq!(
                after[0] - before[0],
                fresh,
                "{what}: inbox rows must grow by the fresh acknowledgements only"
            );
            assert_eq!(
                after[1] - before[1],
                fresh,
                "{what}: one business row per fresh acknowledgement, none otherwise"
            );
            assert_eq!(after[2], before[2], "{what}: no outbox row appears");
        }
        (by_kind, time_by_kind, started.elapsed())
    });
    eprintln!(
        "receiver fuzz on {}: {requests} requests in {elapsed:?}",
        store.name()
    );
    for (kind, statuses) in &by_kind {
        eprintln!("  {kind:?} ({:?}): {statuses:?}", time_by_kind[kind]);
    }
    assert_eq!(by_kind.len(), 13, "every kind of request was sent");
    assert_eq!(
        SERVER_PANICS.load(Ordering::SeqCst) - panics_before,
        0,
        "no panic in the server"
    );
    // Still serving, and still processing.
    let addr_after = addr.clone();
    let (health, fresh) = tokio::task::spawn_blocking(move || {
        let health = exchange(&addr_after, &http("GET", "/_rf/health", &[], b""));
        let message = Message::hired("after-the-fuzz");
        let body = message.body();
        let fresh = exchange(
            &addr_after,
            &http(
                "POST",
                "/_rf/receive",
                &signed(&message.id.to_string(), body.as_bytes(), &secret),
                body.as_bytes(),
            ),
        );
        (health, fresh)
    })
    .await
    .expect("after");
    assert_eq!(health.map(|h| h.0), Some(200));
    assert_eq!(fresh.map(|f| f.0), Some(200));
    server.abort();
}
