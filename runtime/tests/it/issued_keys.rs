//! Keys issued by the registry (`rfidl_runtime::keys`) in a real receiver
//! and dispatcher: swapped while running, asked for when missing, and never
//! in place of a configured secret.

use std::time::Duration;

use rfidl_runtime::Config;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::{Dispatcher, DispatcherError};
use rfidl_runtime::keys::{IssuedKeys, KeySnapshot};
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::signing::{Secret, unix_now};

use crate::receiver_fixture::{Fixture, Message, SOURCE, sign};

fn keys_for(source: &str, secrets: &[&Secret]) -> KeySnapshot {
    KeySnapshot {
        signing: vec![Secret::generate()],
        peers: [(
            source.to_owned(),
            secrets.iter().map(|s| (*s).clone()).collect(),
        )]
        .into(),
    }
}

async fn post_signed(fixture: &Fixture, secret: &Secret) -> crate::receiver_fixture::Reply {
    let message = Message::hired("ada");
    let body = message.body();
    let headers = sign(&message.id.to_string(), unix_now(), &body, secret);
    fixture.post_raw(&headers, body).await
}

#[tokio::test]
async fn a_receiver_takes_issued_keys_as_they_change_and_asks_for_missing_ones() {
    let keys = IssuedKeys::new();
    let fixture = Fixture::start_custom(
        |config| config.peers.clear(),
        |builder| builder.issued_keys(&keys),
    )
    .await;
    let (first, second) = (Secret::generate(), Secret::generate());

    // Nothing issued for the source yet: 503 keys_pending (uncounted at
    // the sender), and the directory client is asked to renew now.
    let reply = post_signed(&fixture, &first).await;
    reply.assert_error(503, "keys_pending");
    assert_eq!(reply.retry_after.as_deref(), Some("1"));
    tokio::time::timeout(Duration::from_secs(1), keys.refresh_requested())
        .await
        .expect("a renewal was asked for");

    // Issued: accepted at once.
    keys.replace(keys_for(SOURCE, &[&first]));
    post_signed(&fixture, &first)
        .await
        .assert_acknowledged(false);

    // Rotated: the old secret is refused once no longer issued.
    keys.replace(keys_for(SOURCE, &[&second, &first]));
    post_signed(&fixture, &first)
        .await
        .assert_acknowledged(false);
    keys.replace(keys_for(SOURCE, &[&second]));
    post_signed(&fixture, &first)
        .await
        .assert_error(401, "bad_signature");
    post_signed(&fixture, &second)
        .await
        .assert_acknowledged(false);
}

#[tokio::test]
async fn a_configured_secret_wins_over_an_issued_one() {
    let keys = IssuedKeys::new();
    let issued = Secret::generate();
    keys.replace(keys_for(SOURCE, &[&issued]));
    let fixture = Fixture::start_with(|builder| builder.issued_keys(&keys)).await;
    post_signed(&fixture, &issued)
        .await
        .assert_error(401, "bad_signature");
    fixture
        .post(&Message::hired("grace"))
        .await
        .assert_acknowledged(false);
}

#[tokio::test]
async fn a_destination_without_a_secret_needs_issued_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sender.db");
    let config = Config::for_service("engine")
        .with_destination("hr", DestinationConfig::new("http://127.0.0.1:9", ""));
    let outbox = Outbox::new(config, &db);
    let error = Dispatcher::builder(&outbox)
        .start()
        .err()
        .expect("no secret, no issued keys");
    assert!(
        matches!(&error, DispatcherError::Destination { name, .. } if name == "hr"),
        "{error}"
    );
    assert!(error.to_string().contains("--issue-keys"), "{error}");
    let handle = Dispatcher::builder(&outbox)
        .issued_keys(&IssuedKeys::new())
        .start()
        .expect("signs with the issued keys");
    handle.shutdown().await;
}
