//! One trace across services (issue 13, point 6): the W3C `traceparent` a
//! sender stores in its outbox row travels in the envelope's `headers` to a
//! real receiver on loopback; a handler that enqueues a follow-up message
//! gives it the same trace id with a new parent id; and the runtime's
//! `tracing` spans (`enqueue`, `dispatch`, `receive`, `handler`) carry the
//! message id and the trace id. A malformed incoming `traceparent` is
//! ignored (a new trace starts), never an error.
//!
//! The spans are captured by a `tracing-subscriber` layer installed as the
//! global default (the receiver's writer and the dispatcher run on threads of
//! their own). It records only the runtime's span callsites and only while a
//! test of this module runs; each test picks its own messages by id.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rfidl_runtime::BoxFuture;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutgoingMessage, Status};
use rfidl_runtime::receiver::{
    AsyncHostedService, HandlerError, HostedInterface, HostedService, IncomingCall,
};
use rfidl_runtime::responses::{Answer, ResponseHandler};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::trace::{TraceParent, with_traceparent};
use rfidl_runtime::transport::HttpTransport;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;
use uuid::Uuid;

use crate::dispatcher::{enqueue, message, sender_config, wait_for};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, SOURCE, count, post_signed, receiver_config};

// ---------------------------------------------------------------- capture

/// One span (or `retry` event) as the layer saw it: its name, its fields
/// (as displayed), and its parent span's name.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<&'static str>,
}

impl Captured {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map(String::as_str).unwrap_or("")
    }
}

static SPANS: Mutex<Vec<Captured>> = Mutex::new(Vec::new());
/// Tests of this module running now; nothing is recorded when zero.
static RECORDING: AtomicUsize = AtomicUsize::new(0);

const SPAN_NAMES: &[&str] = &["enqueue", "dispatch", "receive", "handler"];

/// The index of a span's record in [`SPANS`], kept in its extensions.
struct Slot(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

struct Collect;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Collect {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        let ours = metadata.target().starts_with("rfidl_runtime");
        if ours && metadata.is_span() && SPAN_NAMES.contains(&metadata.name())
            || ours && metadata.is_event() && metadata.name() == "retry"
        {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if RECORDING.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = span.parent().map(|p| p.name());
        let mut spans = SPANS.lock().unwrap_or_else(|p| p.into_inner());
        spans.push(Captured {
            name: attrs.metadata().name(),
            fields,
            parent,
        });
        span.extensions_mut().insert(Slot(spans.len() - 1));
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if RECORDING.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let parent = ctx.event_span(event).map(|span| span.name());
        SPANS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Captured {
                name: event.metadata().name(),
                fields,
                parent,
            });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let extensions = span.extensions();
        let Some(Slot(slot)) = extensions.get::<Slot>() else {
            return;
        };
        let mut spans = SPANS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(captured) = spans.get_mut(*slot) {
            values.record(&mut Fields(&mut captured.fields));
        }
    }
}

/// Records spans while alive (installs the layer on first use).
struct Recording;

impl Recording {
    fn start() -> Self {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            tracing_subscriber::registry()
                .with(Collect)
                .try_init()
                .expect("no other global subscriber in this test binary");
        });
        RECORDING.fetch_add(1, Ordering::SeqCst);
        Recording
    }

    /// The captured spans named `name` whose `field` is (or, for a list,
    /// contains) `value`.
    fn spans(&self, name: &str, field: &str, value: &str) -> Vec<Captured> {
        SPANS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|s| s.name == name && s.field(field).split(',').any(|v| v == value))
            .cloned()
            .collect()
    }

    /// Exactly one such span.
    fn one(&self, name: &str, field: &str, value: &str) -> Captured {
        let found = self.spans(name, field, value);
        assert_eq!(
            found.len(),
            1,
            "one `{name}` span with {field}={value}: {found:?}"
        );
        found.into_iter().next().expect("one")
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        RECORDING.fetch_sub(1, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------- a relay

const RELAY: &str = "test.Relay";

const HOSTED: &[HostedInterface] = &[HostedInterface {
    interface: RELAY,
    version: 1,
    fingerprint: "sha256:relay-v1",
    endpoints: &["Forward"],
    manifest_json: r#"{"interface":"test.Relay","version":1}"#,
}];

/// What the relay's handler saw and did for one message.
#[derive(Debug, Clone)]
struct Relayed {
    message_id: String,
    /// The incoming envelope's `traceparent` header, as received.
    incoming: Option<String>,
    /// The follow-up message it enqueued, and the `headers` of its outbox row
    /// as read back in the handler's transaction.
    follow_up: Uuid,
    follow_up_headers: BTreeMap<String, String>,
}

/// Handles `Forward` by enqueuing a follow-up for destination `next` in
/// the handler's own transaction.
struct Relay {
    outbox: crate::stores::AnyOutbox,
    seen: Arc<Mutex<Vec<Relayed>>>,
}

fn follow_up() -> OutgoingMessage {
    OutgoingMessage {
        interface: "test.Next".into(),
        fingerprint: "sha256:next-v1".into(),
        ..message("next", "Onward", json!({}))
    }
}

impl Relay {
    fn remember(&self, call: &IncomingCall<'_>, follow_up: Uuid, headers: String) {
        self.seen.lock().expect("seen").push(Relayed {
            message_id: call.message_id.to_owned(),
            incoming: call.headers.get("traceparent").cloned(),
            follow_up,
            follow_up_headers: serde_json::from_str(&headers).expect("stored headers are JSON"),
        });
    }
}

impl HostedService for Relay {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle(
        &self,
        call: &IncomingCall<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<serde_json::Value, HandlerError> {
        let id = self
            .outbox
            .sqlite()
            .enqueue(tx, follow_up())
            .map_err(|e| HandlerError::retryable(e.to_string()))?;
        let headers: String = tx.query_row(
            "SELECT headers FROM outbox_messages WHERE message_id = ?1",
            [id.to_string()],
            |r| r.get(0),
        )?;
        self.remember(call, id, headers);
        Ok(json!({}))
    }
}

// The relay on both sqlx stores.
crate::stores::on_each_sqlx_store! {
impl AsyncHostedService<Db> for Relay {
    fn interfaces(&self) -> &[HostedInterface] {
        HOSTED
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut Conn,
    ) -> BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            let id = crate::stores::OutboxOf::<Db>::of(&self.outbox)
                .enqueue_async(&mut *conn, follow_up())
                .await
                .map_err(|e| HandlerError::retryable(e.to_string()))?;
            let headers: String =
                sqlx::query_scalar("SELECT headers FROM outbox_messages WHERE message_id = $1")
                    .bind(id.to_string())
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(HandlerError::retryable)?;
            self.remember(call, id, headers);
            Ok(json!({}))
        })
    }
}
}

/// The sender's response handler: on the relay's answer, enqueues a
/// message of its own in the transaction that marks the row `Sent`, and
/// keeps that message's stored `traceparent`.
struct OnAnswer {
    outbox: Outbox,
    enqueued: Arc<Mutex<Option<String>>>,
}

impl ResponseHandler for OnAnswer {
    fn interface(&self) -> (&'static str, u32) {
        (RELAY, 1)
    }

    fn handle(
        &self,
        _answer: &Answer<'_>,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        let id = self
            .outbox
            .enqueue(tx, follow_up())
            .map_err(|e| HandlerError::retryable(e.to_string()))?;
        let headers: String = tx.query_row(
            "SELECT headers FROM outbox_messages WHERE message_id = ?1",
            [id.to_string()],
            |r| r.get(0),
        )?;
        let headers: BTreeMap<String, String> =
            serde_json::from_str(&headers).expect("stored headers are JSON");
        *self.enqueued.lock().expect("enqueued") = headers.get("traceparent").cloned();
        Ok(())
    }
}

/// A relay on `store`, served on a free loopback port: its URL, the secret
/// senders sign with, what its handler saw, and the server task.
async fn start_relay(
    store: &TestStore,
) -> (
    String,
    Secret,
    Arc<Mutex<Vec<Relayed>>>,
    tokio::task::JoinHandle<()>,
) {
    let secret = Secret::generate();
    let mut config = receiver_config(&[&secret]);
    config.service_id = "relay".into();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let relay = Relay {
        outbox: store.outbox(config.clone()),
        seen: seen.clone(),
    };
    let receiver = store.receiver_hosting(config, relay).expect("receiver");
    // The router keeps the receiver's state alive.
    let (url, server) = support::serve(receiver.router()).await;
    (url, secret, seen, server)
}

fn relayed(seen: &Mutex<Vec<Relayed>>, message_id: &Uuid) -> Relayed {
    seen.lock()
        .expect("seen")
        .iter()
        .find(|r| r.message_id == message_id.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("the relay handled {message_id}"))
}

/// The `traceparent` stored in the outbox row of `id` (SQLite).
fn stored_traceparent(db: &Path, id: &Uuid) -> String {
    let conn = rusqlite::Connection::open(db).expect("open");
    let headers: String = conn
        .query_row(
            "SELECT headers FROM outbox_messages WHERE message_id = ?1",
            [id.to_string()],
            |r| r.get(0),
        )
        .expect("row");
    let headers: BTreeMap<String, String> = serde_json::from_str(&headers).expect("JSON");
    headers
        .get("traceparent")
        .cloned()
        .expect("a traceparent header")
}

fn relay_message() -> OutgoingMessage {
    OutgoingMessage {
        interface: RELAY.into(),
        fingerprint: "sha256:relay-v1".into(),
        ..message("relay", "Forward", json!({}))
    }
}

// ---------------------------------------------------------------- tests

/// Sender (SQLite) → dispatcher → HTTP → relay on `store` → follow-up in
/// the relay's outbox: one trace, and the spans of every step.
async fn one_trace_spans_sender_receiver_and_next_hop(store: &TestStore) {
    let recording = Recording::start();
    let (url, secret, seen, _server) = start_relay(store).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    let id = enqueue(&outbox, &db, relay_message());
    let sent = TraceParent::parse(&stored_traceparent(&db, &id)).expect("a valid traceparent");

    let on_answer = Arc::new(Mutex::new(None));
    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "relay",
            HttpTransport::new(&url, Duration::from_secs(2)).expect("client"),
            secret,
        )
        .responses(OnAnswer {
            outbox: outbox.clone(),
            enqueued: on_answer.clone(),
        })
        .start()
        .expect("dispatcher");
    wait_for(&db, &id, Status::Sent).await;
    dispatcher.shutdown().await;

    // The receiver got exactly the traceparent the sender stored.
    let relayed = relayed(&seen, &id);
    assert_eq!(relayed.incoming, Some(sent.to_string()), "{}", store.name());
    // The follow-up continues the trace as a new hop.
    let next = TraceParent::parse(&relayed.follow_up_headers["traceparent"]).expect("valid");
    assert_eq!(next.trace_id(), sent.trace_id(), "same trace");
    assert_ne!(next.parent_id(), sent.parent_id(), "a new parent id");
    // So does what the sender's response handler enqueues on the answer.
    let on_answer = on_answer.lock().expect("on answer").clone();
    let on_answer =
        TraceParent::parse(&on_answer.expect("the response handler ran")).expect("valid");
    assert_eq!(
        on_answer.trace_id(),
        sent.trace_id(),
        "same trace on the answer"
    );
    assert_ne!(on_answer.parent_id(), sent.parent_id());

    // The spans, with the message ids and the trace id.
    let trace_id = sent.trace_id().to_string();
    let id_text = id.to_string();
    let enqueued = recording.one("enqueue", "message_id", &id_text);
    assert_eq!(enqueued.field("trace_id"), trace_id);
    assert_eq!(enqueued.field("destination"), "relay");
    assert_eq!(enqueued.field("interface"), RELAY);
    assert_eq!(enqueued.field("endpoint"), "Forward");
    assert_eq!(enqueued.field("version"), "1");
    let dispatched = recording.spans("dispatch", "message_ids", &id_text);
    assert!(!dispatched.is_empty(), "a dispatch span for {id_text}");
    for span in &dispatched {
        assert_eq!(span.field("destination"), "relay");
        assert!(
            span.field("trace_ids").split(',').any(|t| t == trace_id),
            "{span:?}"
        );
        assert_eq!(span.field("attempt"), "1", "{span:?}");
    }
    let received = recording.one("receive", "message_id", &id_text);
    assert_eq!(received.field("trace_id"), trace_id);
    assert_eq!(received.field("parent_id"), sent.parent_id().to_string());
    assert_eq!(received.field("source"), SOURCE);
    assert_eq!(received.field("endpoint"), "Forward");
    let handled = recording.one("handler", "message_id", &id_text);
    assert_eq!(handled.field("trace_id"), trace_id);
    assert_eq!(
        handled.parent,
        Some("receive"),
        "the handler span is inside receive"
    );
    let onward = recording.one("enqueue", "message_id", &relayed.follow_up.to_string());
    assert_eq!(
        onward.field("trace_id"),
        trace_id,
        "the follow-up's enqueue span"
    );
    assert_eq!(onward.field("destination"), "next");
    assert_eq!(
        onward.parent,
        Some("handler"),
        "enqueued inside the handler"
    );
}

on_every_store!(
    one_trace_spans_sender_receiver_and_next_hop,
    one_trace_spans_sender_receiver_and_next_hop
);

/// A malformed or missing incoming `traceparent` is no error: the message
/// is processed, and its handler's follow-up starts a new, valid trace.
async fn a_malformed_traceparent_starts_a_new_trace(store: &TestStore) {
    let recording = Recording::start();
    let (url, secret, seen, _server) = start_relay(store).await;
    let client = reqwest::Client::new();
    let cases: &[Option<&str>] = &[
        Some("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
        Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        Some("not a traceparent"),
        None,
    ];
    let mut trace_ids = Vec::new();
    for traceparent in cases {
        let id = Uuid::now_v7();
        let mut envelope = support::envelope(&id.to_string(), "Forward", json!({}));
        envelope["interface"] = json!(RELAY);
        envelope["fingerprint"] = json!("sha256:relay-v1");
        if let Some(traceparent) = traceparent {
            envelope["headers"] = json!({ "traceparent": traceparent });
        }
        let body = serde_json::to_vec(&envelope).expect("json");
        let now = rfidl_runtime::signing::unix_now();
        let (status, answer) =
            post_signed(&client, &url, &body, &id.to_string(), &secret, now).await;
        assert_eq!(status, 200, "{traceparent:?}: {answer}");
        assert_eq!(answer["acknowledged"], json!(true));
        let relayed = relayed(&seen, &id);
        let next = TraceParent::parse(&relayed.follow_up_headers["traceparent"])
            .expect("the follow-up carries a valid traceparent");
        let received = recording.one("receive", "message_id", &id.to_string());
        assert_eq!(
            received.field("parent_id"),
            "",
            "no valid parent: {traceparent:?}"
        );
        assert_eq!(
            received.field("trace_id"),
            next.trace_id().to_string(),
            "the new trace is the handler's"
        );
        trace_ids.push(next.trace_id());
    }
    trace_ids.sort();
    trace_ids.dedup();
    assert_eq!(
        trace_ids.len(),
        cases.len(),
        "each message starts a trace of its own"
    );
}

on_every_store!(
    a_malformed_traceparent_starts_a_new_trace,
    a_malformed_traceparent_starts_a_new_trace
);

/// An application sets the context for what it enqueues (`with_traceparent`),
/// and a `traceparent` it put in the headers itself wins and is kept as is.
#[tokio::test]
async fn the_applications_traceparent_is_continued_or_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_secs(1)), &db);
    let incoming =
        TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("ok");

    let id = with_traceparent(incoming, || enqueue(&outbox, &db, relay_message()));
    let stored = TraceParent::parse(&stored_traceparent(&db, &id)).expect("valid");
    assert_eq!(stored.trace_id(), incoming.trace_id());
    assert_ne!(stored.parent_id(), incoming.parent_id());

    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let mut explicit = relay_message();
    explicit.headers.insert("traceparent".into(), own.into());
    let id = with_traceparent(incoming, || enqueue(&outbox, &db, explicit));
    assert_eq!(
        stored_traceparent(&db, &id),
        own,
        "the application's header wins"
    );

    // `send` takes the context of the thread that calls it.
    let future = with_traceparent(incoming, || outbox.send(relay_message()));
    let id = future.await.expect("send");
    let stored = TraceParent::parse(&stored_traceparent(&db, &id)).expect("valid");
    assert_eq!(stored.trace_id(), incoming.trace_id());

    // No context: every message is a trace of its own.
    let a = enqueue(&outbox, &db, relay_message());
    let b = enqueue(&outbox, &db, relay_message());
    let a = TraceParent::parse(&stored_traceparent(&db, &a)).expect("valid");
    let b = TraceParent::parse(&stored_traceparent(&db, &b)).expect("valid");
    assert_ne!(a.trace_id(), b.trace_id());
    assert_eq!(count(&db, "SELECT COUNT(*) FROM outbox_messages"), 5);
}

/// A failed attempt logs a `retry` event with the message id, the attempt,
/// the delay and the error; the next `dispatch` span says `attempt` 2.
#[tokio::test]
async fn a_retry_is_logged_with_the_message_id_and_the_next_attempt_is_counted() {
    let recording = Recording::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), receiver_config(&[&secret])).await;
    receiver.ledger.fail_next.store(1, Ordering::SeqCst);
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(sender_config(Duration::from_millis(20)), &db);
    let id = enqueue(
        &outbox,
        &db,
        message("ledger", "Credit", json!({"account": "a-1", "amount": 5})),
    );
    let dispatcher = Dispatcher::builder(&outbox)
        .route(
            "ledger",
            HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    wait_for(&db, &id, Status::Sent).await;
    dispatcher.shutdown().await;

    let id_text = id.to_string();
    let retry = recording.one("retry", "message_id", &id_text);
    assert_eq!(retry.field("attempt"), "1", "{retry:?}");
    assert!(
        retry.field("error").contains("the bank is down"),
        "{retry:?}"
    );
    assert!(retry.field("delay_ms").parse::<u64>().is_ok(), "{retry:?}");
    let mut attempts: Vec<String> = recording
        .spans("dispatch", "message_ids", &id_text)
        .iter()
        .map(|span| span.field("attempt").to_owned())
        .collect();
    attempts.sort();
    assert_eq!(attempts, ["1", "2"]);
    // Both attempts carried the same stored traceparent.
    let trace_id = TraceParent::parse(&stored_traceparent(&db, &id))
        .expect("valid")
        .trace_id()
        .to_string();
    let received = recording.spans("receive", "message_id", &id_text);
    assert_eq!(received.len(), 2, "{received:?}");
    assert!(
        received
            .iter()
            .all(|span| span.field("trace_id") == trace_id)
    );
}
