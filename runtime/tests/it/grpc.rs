//! The gRPC transport (feature `grpc`): real tonic servers and clients on
//! 127.0.0.1. The wire protocol's table over gRPC is the HTTP test's own
//! body (`store_delivery::wire_protocol_statuses_via`); a real receiver
//! answers every case byte for byte as over HTTP; messages arrive exactly
//! once; a receiver that is down is waited for; bad URLs are refused at
//! start.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::DispatcherError;
use rfidl_runtime::grpc::{ReceiverService, serve_grpc};
use rfidl_runtime::outbox::Status;
use rfidl_runtime::receiver::{RECEIVE_PATH, Receiver};
use rfidl_runtime::signing::{Secret, SignatureHeaders};
use rfidl_runtime::transport::{
    GrpcTransport, HttpTransport, OutgoingRequest, Transport, TransportError, TransportResponse,
};
use serde_json::json;
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::store_delivery::{Via, wire_protocol_statuses_via};
use crate::stores::{TestStore, on_every_store};
use crate::support::{self, receiver_config};

/// Serves `router` (answering `POST /_rf/receive`) as `rfidl.RFReceiver`
/// on a free loopback port; its `grpc://` URL.
pub(crate) async fn serve_router(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("grpc://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(ReceiverService::from_router(router, 1024 * 1024))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("serve");
    });
    url
}

/// Serves `receiver` with [`serve_grpc`] on `listener` until the returned
/// sender is dropped or fired.
fn serve_receiver(
    receiver: &Receiver,
    listener: tokio::net::TcpListener,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let receiver = receiver.clone();
    let server = tokio::spawn(async move {
        serve_grpc(receiver, listener, async {
            let _ = stopped.await;
        })
        .await
        .expect("serve_grpc");
    });
    (stop, server)
}

on_every_store!(
    each_answer_over_grpc_drives_the_row_to_the_status_the_wire_protocol_names,
    wire_protocol_statuses_over_grpc
);
async fn wire_protocol_statuses_over_grpc(store: &TestStore) {
    wire_protocol_statuses_via(store, Via::Grpc).await;
}

/// A signed request for `body` with id `id`, as the dispatcher sends it.
fn signed(id: &str, body: &[u8], secret: &Secret) -> OutgoingRequest {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    OutgoingRequest {
        path: RECEIVE_PATH,
        headers: SignatureHeaders::sign(id, now, body, std::slice::from_ref(secret))
            .to_pairs()
            .into(),
        body: body.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_receiver_answers_every_case_over_grpc_exactly_as_over_http() {
    let secret = Secret::generate();
    let stranger = Secret::generate();
    let mut config = receiver_config(&[&secret]);
    config.inbox.body_limit = 4096;
    let http_dir = tempfile::tempdir().expect("tempdir");
    let grpc_dir = tempfile::tempdir().expect("tempdir");
    let over_http = support::start_receiver(http_dir.path(), config.clone()).await;
    let over_grpc = support::start_receiver(grpc_dir.path(), config).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let grpc_url = format!("grpc://{}", listener.local_addr().expect("addr"));
    let (_stop, _server) = serve_receiver(&over_grpc.receiver, listener);
    let http = HttpTransport::new(&over_http.url, Duration::from_secs(5)).expect("client");
    let grpc = GrpcTransport::new(&grpc_url, Duration::from_secs(5)).expect("client");

    let id = Uuid::now_v7().to_string();
    let credit = |id: &str, amount: i64| {
        serde_json::to_vec(&support::envelope(
            id,
            "Credit",
            json!({"account": "a", "amount": amount}),
        ))
        .expect("json")
    };
    let poison = Uuid::now_v7().to_string();
    let other = Uuid::now_v7().to_string();
    let mut unknown_interface = support::envelope(&other, "Credit", json!({}));
    unknown_interface["interface"] = json!("test.Nowhere");
    let unknown_interface = serde_json::to_vec(&unknown_interface).expect("json");
    let too_large = credit(&other, 1)
        .into_iter()
        .chain([b' '; 5000])
        .collect::<Vec<u8>>();
    // Larger than tonic's decoding limit too: refused unread, answered alike.
    let far_too_large = credit(&other, 1)
        .into_iter()
        .chain(std::iter::repeat_n(b' ', 200 * 1024))
        .collect::<Vec<u8>>();
    let mut unsigned = signed(&other, &credit(&other, 1), &secret);
    unsigned
        .headers
        .retain(|(name, _)| *name != "webhook-signature");
    // (what it is, the request, the status it must get)
    let cases: Vec<(&str, OutgoingRequest, u16)> = vec![
        ("processed", signed(&id, &credit(&id, 5), &secret), 200),
        ("duplicate", signed(&id, &credit(&id, 5), &secret), 200),
        (
            "id reused with another payload",
            signed(&id, &credit(&id, 6), &secret),
            422,
        ),
        (
            "bad signature",
            signed(&other, &credit(&other, 1), &stranger),
            401,
        ),
        ("missing signature header", unsigned, 401),
        ("not JSON", signed(&other, b"{not json", &secret), 400),
        (
            "webhook-id differs from messageId",
            signed(&other, &credit(&id, 1), &secret),
            400,
        ),
        (
            "unknown interface",
            signed(&other, &unknown_interface, &secret),
            404,
        ),
        (
            "over the body limit",
            signed(&other, &too_large, &secret),
            413,
        ),
        (
            "over the decoding limit",
            signed(&other, &far_too_large, &secret),
            413,
        ),
        (
            "poison",
            signed(
                &poison,
                &serde_json::to_vec(&support::envelope(&poison, "Poison", json!({})))
                    .expect("json"),
                &secret,
            ),
            422,
        ),
    ];
    for (what, request, status) in cases {
        let by_http = http.send(request.clone()).await.expect("http answer");
        let by_grpc = grpc.send(request).await.expect("grpc answer");
        assert_eq!(by_http.status, status, "{what}: {by_http:?}");
        assert_eq!(
            by_grpc,
            by_http,
            "{what}: gRPC {} vs HTTP {}",
            String::from_utf8_lossy(&by_grpc.body),
            String::from_utf8_lossy(&by_http.body)
        );
    }
    // A batch (`ReceiveBatch` vs `POST /_rf/receive/batch`): the same
    // per-message answers.
    let fresh = Uuid::now_v7().to_string();
    let batch = vec![
        signed(&fresh, &credit(&fresh, 7), &secret),
        signed(&id, &credit(&id, 5), &secret),
        signed(&other, &credit(&other, 1), &stranger),
        signed(&other, b"[]", &secret),
    ];
    let by_http = http.send_batch(batch.clone()).await;
    let by_grpc = grpc.send_batch(batch).await;
    let statuses: Vec<u16> = by_http
        .iter()
        .map(|answer| answer.as_ref().map_or(0, |r| r.status))
        .collect();
    assert_eq!(statuses, [200, 200, 401, 400], "{by_http:?}");
    assert_eq!(by_grpc, by_http);

    let duplicate = grpc
        .send(signed(&id, &credit(&id, 5), &secret))
        .await
        .expect("answer");
    let ack: serde_json::Value = serde_json::from_slice(&duplicate.body).expect("json");
    assert_eq!(ack["duplicate"], true, "{ack}");
    assert_eq!(ack["payload"], json!({"balance": 5}), "{ack}");
    assert_eq!(
        support::count(&over_grpc.db, "SELECT COUNT(*) FROM ledger"),
        2
    );

    // A receiver shutting down answers 503 with Retry-After; it travels too.
    over_http.receiver.shutdown().await;
    over_grpc.receiver.shutdown().await;
    let late = Uuid::now_v7().to_string();
    let request = signed(&late, &credit(&late, 1), &secret);
    let by_http = http.send(request.clone()).await.expect("http answer");
    let by_grpc = grpc.send(request).await.expect("grpc answer");
    assert_eq!(by_http.status, 503, "{by_http:?}");
    assert_eq!(by_http.retry_after, Some(Duration::from_secs(1)));
    assert_eq!(by_grpc, by_http);
}

on_every_store!(
    two_hundred_messages_over_grpc_each_take_effect_once,
    exactly_once_over_grpc
);
async fn exactly_once_over_grpc(store: &TestStore) {
    let receiver_store = store.another();
    let secret = Secret::generate();
    let receiver = receiver_store
        .start_receiver(receiver_config(&[&secret]))
        .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("grpc://{}", listener.local_addr().expect("addr"));
    let (stop, server) = serve_receiver(&receiver.receiver, listener);
    let outbox = store.outbox(sender_config(Duration::from_millis(50)));
    let handle = store
        .dispatcher(&outbox)
        .route(
            "ledger",
            GrpcTransport::new(&url, Duration::from_secs(5)).expect("client"),
            secret,
        )
        .start()
        .expect("dispatcher");
    let messages = 200;
    let ids = store.enqueue_many(
        &outbox,
        (0..messages)
            .map(|i| message("ledger", "Credit", json!({"account": "g", "amount": i})))
            .collect(),
    );
    store.wait_for_all(&ids, Status::Sent).await;
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        messages
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        messages,
        "each message took effect once"
    );
    assert_eq!(
        receiver.ledger.calls.load(Ordering::SeqCst) as i64,
        messages,
        "each handler ran once"
    );
    for id in &ids {
        let response = store.row(id).response;
        assert!(
            response.as_ref().is_some_and(|r| r["balance"].is_i64()),
            "{id}: the answer came back: {response:?}"
        );
    }
    // Lost acknowledgements: everything is sent again, and answered as a
    // duplicate from the inbox.
    store.execute("UPDATE outbox_messages SET status = 'Pending', next_retry_at = 0");
    outbox
        .send(message(
            "ledger",
            "Credit",
            json!({"account": "g", "amount": 0}),
        ))
        .await
        .expect("send");
    store.wait_for_all(&ids, Status::Sent).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while receiver_store.count("SELECT COUNT(*) FROM ledger") < messages + 1 {
        assert!(Instant::now() < deadline, "the last message never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        messages + 1,
        "re-sent messages had no second effect"
    );
    assert!(receiver.receiver.metrics().inbox_duplicates.get() >= messages as u64);
    handle.shutdown().await;
    let _ = stop.send(());
    server.await.expect("graceful shutdown");
    receiver.receiver.shutdown().await;
}

/// A free loopback address (bound, then released).
async fn free_address() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("addr")
}

on_every_store!(
    a_grpc_receiver_that_is_down_is_waited_for_and_gets_each_message_once_when_up,
    receiver_down_then_up
);
async fn receiver_down_then_up(store: &TestStore) {
    let secret = Secret::generate();
    let address = free_address().await;
    // Chosen by the configuration's URL scheme, as an application does.
    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.probe_interval_max = Duration::from_millis(200);
    config.destinations.insert(
        "ledger".to_owned(),
        DestinationConfig::new(
            format!("grpc://{address}/RFReceiver/Receive"),
            secret.to_whsec(),
        ),
    );
    let outbox = store.outbox(config);
    let handle = store.dispatcher(&outbox).start().expect("dispatcher");
    let messages = 20;
    let ids = store.enqueue_many(
        &outbox,
        (0..messages)
            .map(|i| message("ledger", "Credit", json!({"account": "d", "amount": i})))
            .collect(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.count("SELECT COUNT(*) FROM outbox_messages WHERE last_error IS NOT NULL") == 0 {
        assert!(Instant::now() < deadline, "never tried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row = store.row(&ids[0]);
    assert!(
        matches!(row.status, Status::Pending | Status::Sending),
        "{row:?}"
    );
    assert_eq!(
        store.count("SELECT COALESCE(MAX(retry_count), 0) FROM outbox_messages"),
        0,
        "an unreachable receiver is not counted against max_retries"
    );
    let health = outbox
        .watched_by(store.diagnostics())
        .build()
        .expect("diagnostics");
    let (health_url, _health_server) = support::serve(health.router()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let during = loop {
        let during: serde_json::Value = reqwest::get(format!("{health_url}/_rf/health"))
            .await
            .expect("health")
            .json()
            .await
            .expect("json");
        if during["reasons"]
            .to_string()
            .contains("destination `ledger` unreachable")
        {
            break during;
        }
        assert!(Instant::now() < deadline, "never unreachable: {during}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(during["status"], "warning", "{during}");

    // Up: the receiver starts on the configured address.
    let receiver_store = store.another();
    let receiver = receiver_store
        .start_receiver(receiver_config(&[&secret]))
        .await;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .expect("bind the configured address");
    let (_stop, _server) = serve_receiver(&receiver.receiver, listener);
    store.wait_for_all(&ids, Status::Sent).await;
    assert_eq!(
        receiver_store.count("SELECT COUNT(*) FROM ledger"),
        messages
    );
    assert_eq!(
        receiver_store.count("SELECT COUNT(DISTINCT message_id) FROM ledger"),
        messages,
        "each message took effect once"
    );
    handle.shutdown().await;
    receiver.receiver.shutdown().await;
}

#[tokio::test]
async fn a_malformed_grpc_url_is_a_configuration_error_at_start_that_shows_no_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (url, wanted) in [
        ("grpc://hr.internal", "`url` has no port"),
        (
            "grpc://hr.internal:7443/Other/Method",
            "`url` has a path other",
        ),
        (
            "grpc://admin:hunter2@hr.internal:7443",
            "`url` holds credentials",
        ),
        ("grpc://hr.internal:99999", "`url` has an invalid"),
    ] {
        let mut config = sender_config(Duration::from_millis(50));
        config.destinations.insert(
            "hr".to_owned(),
            DestinationConfig::new(url, Secret::generate().to_whsec()),
        );
        let db = dir.path().join("sender.db");
        let outbox = rfidl_runtime::outbox::Outbox::new(config, &db);
        let Err(error) = rfidl_runtime::dispatcher::Dispatcher::builder(&outbox).start() else {
            panic!("{url}: the dispatcher started");
        };
        let DispatcherError::Destination { name, message } = &error else {
            panic!("{url}: {error:?}");
        };
        assert_eq!(name, "hr");
        assert!(message.contains(wanted), "{url}: {message}");
        let shown = error.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            !shown.contains("hr.internal"),
            "the URL is not repeated: {shown}"
        );
    }
}

#[tokio::test]
async fn grpc_failures_are_transport_errors() {
    // Nothing listens: a connection error (retryable, destination unreachable).
    let nobody = GrpcTransport::new(
        &format!("grpc://{}", free_address().await),
        Duration::from_secs(2),
    )
    .expect("client");
    let request = signed("m", b"{}", &Secret::generate());
    match nobody.send(request.clone()).await {
        Err(TransportError::Connect(text)) => assert!(!text.is_empty()),
        other => panic!("{other:?}"),
    }
    // A server that never answers: the per-call timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_url = format!("grpc://{}", silent.local_addr().expect("addr"));
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let slow = GrpcTransport::new(&silent_url, Duration::from_millis(300)).expect("client");
    let started = Instant::now();
    assert_eq!(
        slow.send(request.clone()).await,
        Err(TransportError::Timeout)
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // A gRPC server without rfidl.RFReceiver: the call fails, no answer.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("grpc://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("serve");
    });
    let answer: Result<TransportResponse, TransportError> =
        GrpcTransport::new(&url, Duration::from_secs(2))
            .expect("client")
            .send(request)
            .await;
    match answer {
        Err(TransportError::Other(text)) => assert!(text.contains("Unimplemented"), "{text}"),
        other => panic!("{other:?}"),
    }
}

/// `rfidl.RFReceiver` with `Receive` only, as a receiver of another make
/// might serve it.
#[derive(Clone)]
struct WithoutBatches(ReceiverService);

impl tonic::server::NamedService for WithoutBatches {
    const NAME: &'static str = rfidl_runtime::grpc::SERVICE_NAME;
}

impl tower::Service<axum::http::Request<tonic::body::Body>> for WithoutBatches {
    type Response = axum::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() == rfidl_runtime::grpc::RECEIVE_BATCH_METHOD_PATH {
            return Box::pin(async {
                Ok(tonic::Status::unimplemented("no batches here").into_http())
            });
        }
        tower::Service::call(&mut self.0, request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_without_receive_batch_gets_one_call_per_message() {
    let secret = Secret::generate();
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = support::start_receiver(dir.path(), receiver_config(&[&secret])).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("grpc://{}", listener.local_addr().expect("addr"));
    let service = WithoutBatches(ReceiverService::new(receiver.receiver.clone()));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("serve");
    });
    let grpc = GrpcTransport::new(&url, Duration::from_secs(5)).expect("client");
    for round in 0..2 {
        let ids: Vec<String> = (0..3).map(|_| Uuid::now_v7().to_string()).collect();
        let batch = ids
            .iter()
            .map(|id| {
                let body = serde_json::to_vec(&support::envelope(
                    id,
                    "Credit",
                    json!({"account": "b", "amount": 1}),
                ))
                .expect("json");
                signed(id, &body, &secret)
            })
            .collect();
        let answers = grpc.send_batch(batch).await;
        assert_eq!(answers.len(), 3);
        for answer in &answers {
            assert_eq!(answer.as_ref().map(|r| r.status), Ok(200), "{answers:?}");
        }
        assert_eq!(
            support::count(&receiver.db, "SELECT COUNT(*) FROM ledger"),
            3 * (round + 1)
        );
    }
}
