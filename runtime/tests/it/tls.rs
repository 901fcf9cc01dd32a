//! HTTPS destinations: the dispatcher delivers to a real receiver behind
//! TLS on 127.0.0.1 whose self-signed certificate it trusts through the
//! destination's `ca_file`; without that file the certificate is refused,
//! `last_error` says so, and the message waits for a retry (nothing lost).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rfidl_runtime::Config;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, Status};
use rfidl_runtime::signing::Secret;
use serde_json::json;
use tokio_rustls::rustls;

use crate::dispatcher::{enqueue, message, sender_config, status_of, wait_for};
use crate::support::{self, count};

/// Serves `router` over TLS with a fresh self-signed certificate for
/// 127.0.0.1; returns the `https://` URL and the certificate's PEM.
async fn serve_tls(router: axum::Router) -> (String, String) {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
        .expect("self-signed certificate");
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key.into())
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return; // the client refused our certificate
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (url, certified.cert.pem())
}

fn https_config(url: &str, secret: &Secret, ca_file: Option<&Path>) -> Config {
    let mut config = sender_config(Duration::from_millis(50));
    config.outbox.max_retries = 1_000;
    let mut destination = DestinationConfig::new(url, secret.to_whsec());
    if let Some(ca_file) = ca_file {
        destination = destination.with_ca_file(ca_file);
    }
    config.with_destination("ledger", destination)
}

/// A receiver behind TLS, and a sender whose `ledger` destination is it
/// (trusting its certificate only if `trust` says so), with one Credit
/// enqueued.
struct Setup {
    _dir: tempfile::TempDir,
    receiver: support::TestReceiver,
    db: std::path::PathBuf,
    dispatcher: rfidl_runtime::dispatcher::DispatcherHandle,
    id: uuid::Uuid,
}

#[derive(Clone, Copy, PartialEq)]
enum Trust {
    PeerCertificate,
    PublicRootsOnly,
}

async fn setup(trust: Trust) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), support::receiver_config(&[&secret])).await;
    let (url, pem) = serve_tls(receiver.receiver.router()).await;
    let ca_file = dir.path().join("peer-ca.pem");
    std::fs::write(&ca_file, pem).expect("write CA file");
    let trusted = (trust == Trust::PeerCertificate).then_some(ca_file.as_path());
    let db = dir.path().join("sender.db");
    let outbox = Outbox::new(https_config(&url, &secret, trusted), &db);
    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
    let id = enqueue(
        &outbox,
        &db,
        message("ledger", "Credit", json!({"account": "tls", "amount": 7})),
    );
    Setup {
        _dir: dir,
        receiver,
        db,
        dispatcher,
        id,
    }
}

#[tokio::test]
async fn a_receiver_behind_tls_with_a_trusted_certificate_gets_the_message_once() {
    let setup = setup(Trust::PeerCertificate).await;
    wait_for(&setup.db, &setup.id, Status::Sent).await;
    assert_eq!(
        count(&setup.receiver.db, "SELECT SUM(amount) FROM ledger"),
        7
    );
    setup.dispatcher.shutdown().await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_and_the_message_waits() {
    let setup = setup(Trust::PublicRootsOnly).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let row = loop {
        let row = status_of(&setup.db, &setup.id);
        if row.last_error.is_some() {
            break row;
        }
        assert!(Instant::now() < deadline, "no attempt failed: {row:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    setup.dispatcher.shutdown().await;
    assert!(
        matches!(row.status, Status::Pending | Status::Sending),
        "a transport failure is retried: {row:?}"
    );
    let error = row.last_error.unwrap_or_default();
    assert!(
        error.contains("certificate"),
        "last_error names the cause: {error}"
    );
    assert_eq!(count(&setup.receiver.db, "SELECT COUNT(*) FROM ledger"), 0);
}

#[test]
fn an_unreadable_ca_file_stops_the_dispatcher_from_starting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let config = https_config(
        "https://127.0.0.1:1",
        &Secret::generate(),
        Some(&dir.path().join("missing.pem")),
    );
    let outbox = Outbox::new(config, &db);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let error = runtime
        .block_on(async { Dispatcher::builder(&outbox).start().err() })
        .expect("refused");
    let text = error.to_string();
    assert!(
        text.contains("ledger") && text.contains("missing.pem"),
        "{text}"
    );

    std::fs::write(dir.path().join("garbage.pem"), "not a certificate").expect("write");
    let config = https_config(
        "https://127.0.0.1:1",
        &Secret::generate(),
        Some(&dir.path().join("garbage.pem")),
    );
    let outbox = Outbox::new(config, &db);
    let error = runtime
        .block_on(async { Dispatcher::builder(&outbox).start().err() })
        .expect("refused");
    assert!(error.to_string().contains("certificate"), "{error}");
}
