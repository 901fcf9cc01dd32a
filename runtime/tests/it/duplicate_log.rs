//! A duplicate delivery is logged (issue 30, point 6): one `warn` line per
//! message, with its id and source, however often it comes again; a flood
//! of duplicates writes a bounded number of lines. Real receivers on
//! loopback, on the blocking SQLite store (single and batch requests) and
//! on the async sqlx SQLite store (and through the JetStream consumer:
//! `nats::a_duplicate_through_the_consumer_is_logged_once`); the text is
//! what a `fmt` subscriber writes.
//!
//! The subscriber is this thread's default while a test runs
//! (`tracing::subscriber::set_default`), and each test runs on a
//! current-thread runtime, so the receiver's request tasks (where the line
//! is written) run on the thread that captures, and nothing another test
//! logs is seen. `tracing` caches each call site's interest for the whole
//! process, computed by the first thread that reaches it: a test thread
//! without a subscriber would cache "never" and blind the capture, so a
//! capture first registers an [`Anchor`] that keeps every call site asking.

use std::sync::{Arc, Mutex, OnceLock};

use rfidl_runtime::Config;
use rfidl_runtime::receiver::Receiver;
use rfidl_runtime::signing::{Secret, unix_now};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{self, SOURCE, envelope, post_signed, receiver_config};

/// The receiver's limit: lines a minute before duplicates are only counted.
const LINES_PER_MINUTE: usize = 60;

/// Text written by a `fmt` subscriber, kept for the test to read.
#[derive(Clone, Default)]
pub(crate) struct Logged(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    /// Captures what is logged on this thread until the guard drops.
    pub(crate) fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        static ANCHOR: OnceLock<tracing::Dispatch> = OnceLock::new();
        ANCHOR.get_or_init(|| tracing::Dispatch::new(Anchor));
        let logged = Self::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        (logged, tracing::subscriber::set_default(subscriber))
    }

    /// The `warn` lines about duplicate deliveries.
    pub(crate) fn duplicate_lines(&self) -> Vec<String> {
        let text = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8(text)
            .expect("UTF-8")
            .lines()
            .filter(|line| line.contains("duplicate delivery"))
            .inspect(|line| assert!(line.starts_with(" WARN "), "{line}"))
            .map(str::to_owned)
            .collect()
    }
}

/// A subscriber that records nothing and answers every call site
/// "sometimes". With it registered, a call site's interest is the union over
/// all live subscribers (not the first thread's alone), so a capture on one
/// thread always sees its lines and other threads ask their own subscriber,
/// event by event.
struct Anchor;

impl tracing::Subscriber for Anchor {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

fn ledger_credit() -> Value {
    json!({"account": "acc-1", "amount": 5})
}

fn credit(id: &str) -> Vec<u8> {
    serde_json::to_vec(&envelope(id, "Credit", ledger_credit())).expect("json")
}

/// POSTs one message `times` times; the answers' `duplicate` flags.
async fn post_times(url: &str, secret: &Secret, id: &str, times: usize) -> Vec<bool> {
    let client = reqwest::Client::new();
    let body = credit(id);
    let mut duplicates = Vec::new();
    for _ in 0..times {
        let (status, answer) = post_signed(&client, url, &body, id, secret, unix_now()).await;
        assert_eq!(status, 200, "{answer}");
        duplicates.push(answer["duplicate"].as_bool().expect("duplicate"));
    }
    duplicates
}

/// Exactly one line naming `id` and the source.
pub(crate) fn assert_one_line_for(lines: &[String], id: &str) {
    let naming: Vec<&String> = lines.iter().filter(|line| line.contains(id)).collect();
    assert_eq!(naming.len(), 1, "{lines:#?}");
    assert!(
        naming[0].contains(&format!("message_id=\"{id}\"")),
        "{}",
        naming[0]
    );
    assert!(
        naming[0].contains(&format!("source=\"{SOURCE}\"")),
        "{}",
        naming[0]
    );
}

#[tokio::test]
async fn a_duplicate_is_logged_once_at_warn_with_its_id_and_source() {
    let (logged, _guard) = Logged::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), receiver_config(&[&secret])).await;
    let id = Uuid::now_v7().to_string();
    assert_eq!(
        post_times(&receiver.url, &receiver.secret, &id, 4).await,
        [false, true, true, true]
    );
    let lines = logged.duplicate_lines();
    assert_eq!(
        lines.len(),
        1,
        "three duplicates of one message: {lines:#?}"
    );
    assert_one_line_for(&lines, &id);
    // A first delivery is not a duplicate: nothing more is logged.
    let other = Uuid::now_v7().to_string();
    assert_eq!(
        post_times(&receiver.url, &receiver.secret, &other, 1).await,
        [false]
    );
    assert_eq!(logged.duplicate_lines().len(), 1);
}

/// A redelivery storm in batches: 100 messages, each delivered again three
/// times, is 300 duplicates and at most a minute's lines, one per message.
#[tokio::test]
async fn a_flood_of_duplicates_writes_a_bounded_number_of_lines() {
    let (logged, _guard) = Logged::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), receiver_config(&[&secret])).await;
    let ids: Vec<String> = (0..100).map(|_| Uuid::now_v7().to_string()).collect();
    let client = reqwest::Client::new();
    let mut flagged = 0;
    for round in 0..4 {
        let items: Vec<Value> = ids
            .iter()
            .map(|id| {
                support::batch_item(id, "Credit", ledger_credit(), &receiver.secret, unix_now())
            })
            .collect();
        let answers: Vec<Value> = client
            .post(format!("{}/_rf/receive/batch", receiver.url))
            .json(&items)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        for answer in &answers {
            assert_eq!(answer["status"], 200, "{answer}");
            assert_eq!(answer["body"]["duplicate"], round > 0, "{answer}");
            flagged += usize::from(round > 0);
        }
    }
    assert_eq!(flagged, 300);
    let lines = logged.duplicate_lines();
    assert_eq!(lines.len(), LINES_PER_MINUTE, "{} lines", lines.len());
    for id in &ids[..LINES_PER_MINUTE] {
        assert_one_line_for(&lines, id);
    }
}

/// The async inbox (sqlx SQLite store, the async writer): the same line.
#[tokio::test]
async fn a_duplicate_on_the_async_sqlx_store_is_logged_once() {
    let (logged, _guard) = Logged::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _pool) = crate::sqlx_sqlite::ledger_store(&dir.path().join("ledger.db")).await;
    let secret = Secret::generate();
    let receiver = Receiver::builder(
        Config::for_service("ledger").with_peer(SOURCE, secret.to_whsec()),
        &store,
    )
    .service(crate::sqlx_sqlite::LedgerService(Arc::default()))
    .build()
    .expect("receiver");
    let (url, _server) = support::serve(receiver.router()).await;
    let id = Uuid::now_v7().to_string();
    assert_eq!(post_times(&url, &secret, &id, 3).await, [false, true, true]);
    let lines = logged.duplicate_lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_one_line_for(&lines, &id);
    receiver.shutdown().await;
}
