//! A hostile network against a real receiver served by `rfidl_runtime::serve`
//! (real HTTP on loopback), on every store (`on_every_store!`): requests
//! that cost the server CPU before anyone is authenticated, and connections
//! that never finish sending. Each test reproduces a finding of issue 26
//! that the previous code failed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rfidl_runtime::signing::{MAX_SIGNATURES, Secret, unix_now};

use crate::receiver_fixture::{Message, employees_app, sign};
use crate::stores::{TestStore, on_every_store};

/// The bounds the issue sets for a release build; a debug build (what
/// `cargo test` runs) does the same work unoptimised, so it gets five times
/// as long. The previous code took 28 s (release) for one request.
fn bound(release: Duration) -> Duration {
    if cfg!(debug_assertions) {
        release * 5
    } else {
        release
    }
}

/// A receiver on `store` with its diagnostics routes (for `/_rf/livez`),
/// served with the given read timeouts: its address and the secret
/// senders sign with (the receiver lives as long as its router).
async fn served(
    store: &TestStore,
    header_timeout: Duration,
    body_timeout: Duration,
) -> (String, Secret) {
    let (app, secret, _receiver) = employees_app(store, |_| {}, Some("hostile-network-token"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        rfidl_runtime::serve(listener, app)
            .header_read_timeout(header_timeout)
            .body_read_timeout(body_timeout)
            .await
            .expect("serve");
    });
    (address, secret)
}

/// Rows of the test service's business table.
fn employees(store: &TestStore) -> i64 {
    store.count("SELECT count(*) FROM employees")
}

/// A valid envelope of about one megabyte (under the 1 MiB body limit),
/// and its headers with `bogus` signatures that match no secret (each of a
/// real tag's length, so each would cost an HMAC if it were checked).
fn megabyte_request(bogus: usize) -> (String, Vec<(&'static str, String)>) {
    let message = Message::hired(&"x".repeat(499_000));
    let body = message.body();
    let id = message.id.to_string();
    let mut headers = sign(&id, unix_now(), &body, &Secret::generate());
    let forged = headers[2].1.clone();
    headers[2].1 = vec![forged; bogus].join(" ");
    (body, headers)
}

async fn post(
    client: &reqwest::Client,
    address: &str,
    request: &(String, Vec<(&str, String)>),
) -> (u16, serde_json::Value) {
    let mut builder = client
        .post(format!("http://{address}/_rf/receive"))
        .header("content-type", "application/json")
        .body(request.0.clone());
    for (name, value) in &request.1 {
        builder = builder.header(*name, value);
    }
    let response = builder.send().await.expect("send");
    let status = response.status().as_u16();
    let body = response.json().await.expect("JSON error body");
    (status, body)
}

/// The worst `/_rf/livez` round trip of `probes` taken 20 ms apart.
async fn slowest_livez(client: &reqwest::Client, address: &str, probes: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..probes {
        let started = Instant::now();
        let response = client
            .get(format!("http://{address}/_rf/livez"))
            .send()
            .await
            .expect("livez");
        assert_eq!(response.status(), 200);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    slowest
}

on_every_store!(
    a_thousand_bogus_signatures_on_a_megabyte_are_refused_at_once,
    bogus_signatures_refused_at_once
);
async fn bogus_signatures_refused_at_once(store: &TestStore) {
    let (address, _) = served(store, Duration::from_secs(10), Duration::from_secs(30)).await;
    let client = reqwest::Client::new();
    let request = megabyte_request(1_000);
    // Warm the connection pool so the figure is the server's work.
    slowest_livez(&client, &address, 1).await;
    let started = Instant::now();
    let (status, body) = post(&client, &address, &request).await;
    let took = started.elapsed();
    eprintln!("1,000 bogus signatures on a 1 MB body: refused in {took:?}");
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("too_many_signatures")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains(&MAX_SIGNATURES.to_string())),
        "the message names the limit: {body}"
    );
    assert!(
        took < bound(Duration::from_millis(50)),
        "refused after {took:?}"
    );
    assert_eq!(employees(store), 0);
}

on_every_store!(
    livez_answers_while_eight_signature_floods_run,
    livez_answers_while_floods_run
);
async fn livez_answers_while_floods_run(store: &TestStore) {
    let (address, _) = served(store, Duration::from_secs(10), Duration::from_secs(30)).await;
    let client = reqwest::Client::new();
    slowest_livez(&client, &address, 1).await;
    // The attack (1,000 entries each), then the most a request may
    // carry (MAX_SIGNATURES entries: the body is parsed and hashed once per
    // secret, off the async workers).
    for bogus in [1_000, MAX_SIGNATURES] {
        let request = megabyte_request(bogus);
        let floods: Vec<_> = (0..8)
            .map(|_| {
                let client = client.clone();
                let address = address.clone();
                let request = request.clone();
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    for _ in 0..3 {
                        answers.push(post(&client, &address, &request).await);
                    }
                    answers
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let slowest = slowest_livez(&client, &address, 5).await;
        for flood in floods {
            for (status, body) in flood.await.expect("flood") {
                assert_eq!(status, 401, "{bogus} entries: {body}");
            }
        }
        eprintln!("8 floods of {bogus} signatures each: slowest /_rf/livez {slowest:?}");
        assert!(
            slowest < bound(Duration::from_millis(100)),
            "with {bogus} signatures per request, /_rf/livez took {slowest:?}"
        );
    }
    assert_eq!(employees(store), 0);
}

/// Reads until the server closes the connection; `None` if it is still
/// open after `wait`.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    stream.set_read_timeout(Some(wait)).expect("timeout");
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => Some(answer),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(answer),
        Err(_) => None,
    }
}

on_every_store!(
    connections_that_trickle_headers_or_withhold_the_body_are_closed,
    slow_connections_are_closed
);
async fn slow_connections_are_closed(store: &TestStore) {
    let header_timeout = Duration::from_millis(500);
    let body_timeout = Duration::from_millis(800);
    let (address, secret) = served(store, header_timeout, body_timeout).await;
    let served_at = address.clone();
    let (body, headers) = megabyte_request(1);
    let started = Instant::now();
    let outcome = tokio::task::spawn_blocking(move || {
        // 100 connections that send half a request line and stop, and 100
        // that send full headers announcing a body they never send whole.
        let mut trickling: Vec<TcpStream> = (0..100)
            .map(|_| {
                let mut stream = TcpStream::connect(&address).expect("connect");
                stream.write_all(b"POST /_rf/receive HTT").expect("write");
                stream
            })
            .collect();
        let mut withholding: Vec<TcpStream> = (0..100)
            .map(|_| {
                let mut stream = TcpStream::connect(&address).expect("connect");
                let mut head = format!(
                    "POST /_rf/receive HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                    body.len()
                );
                for (name, value) in &headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                stream.write_all(head.as_bytes()).expect("write");
                stream.write_all(&body.as_bytes()[..100]).expect("write");
                stream
            })
            .collect();
        let trickled: Vec<_> = trickling
            .iter_mut()
            .map(|s| closed_within(s, Duration::from_secs(5)))
            .collect();
        let withheld: Vec<_> = withholding
            .iter_mut()
            .map(|s| closed_within(s, Duration::from_secs(5)))
            .collect();
        (trickled, withheld)
    })
    .await
    .expect("clients");
    let (trickled, withheld) = outcome;
    assert!(
        trickled.iter().all(Option::is_some),
        "{} of 100 connections trickling headers still open",
        trickled.iter().filter(|c| c.is_none()).count()
    );
    for answer in &withheld {
        let answer = answer
            .as_ref()
            .expect("a connection withholding its body is closed");
        let text = String::from_utf8_lossy(answer);
        assert!(
            text.starts_with("HTTP/1.1 408") && text.contains("body_timeout"),
            "answer to a withheld body: {text}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "closing took {:?}",
        started.elapsed()
    );
    // Nothing was written, and the server still serves.
    assert_eq!(employees(store), 0);
    let message = Message::hired("Ada");
    let body = message.body();
    let request = (
        body.clone(),
        sign(&message.id.to_string(), unix_now(), &body, &secret),
    );
    let (status, answer) = post(&reqwest::Client::new(), &served_at, &request).await;
    assert_eq!(
        (status, &answer["duplicate"]),
        (200, &serde_json::json!(false)),
        "{answer}"
    );
    assert_eq!(employees(store), 1);
}
