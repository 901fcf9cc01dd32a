//! The `registry:` section of the runtime configuration and the directory
//! client's behaviour when the registry cannot be reached. The client
//! against a real registry (registration, the manifest scan's 409, the
//! heartbeat and re-registration) is tested in `rfidl-registry`'s tests
//! (`directory::the_runtime_client_…`), which can start one.

use std::time::Duration;

use rfidl_runtime::Config;
use rfidl_runtime::directory::{DirectoryClient, DirectoryError, Registration, RegistryConfig};

#[test]
fn the_registry_section_is_optional_with_a_30_s_heartbeat() {
    assert_eq!(Config::default().registry, None);
    let config = Config::from_yaml_str("registry:\n  url: http://127.0.0.1:7300\n").expect("yaml");
    assert_eq!(
        config.registry,
        Some(RegistryConfig::new("http://127.0.0.1:7300"))
    );
    assert_eq!(
        config.registry.as_ref().unwrap().heartbeat,
        Duration::from_secs(30)
    );
    let config =
        Config::from_yaml_str("registry:\n  url: http://r:7300\n  token: abc\n  heartbeat: 5s\n")
            .expect("yaml");
    let registry = config.registry.expect("section");
    assert_eq!(registry.token.as_deref(), Some("abc"));
    assert_eq!(registry.heartbeat, Duration::from_secs(5));
    assert!(Config::from_yaml_str("registry:\n  url: x\n  heartbeet: 5s\n").is_err());
    assert!(
        Config::from_yaml_str("registry:\n  token: abc\n").is_err(),
        "url is required"
    );
}

#[tokio::test]
async fn an_unreachable_registry_is_an_error_state_not_a_stop() {
    // A closed port: connection refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let config = RegistryConfig::new(format!("http://127.0.0.1:{port}"))
        .with_heartbeat(Duration::from_millis(50));
    let client = DirectoryClient::new(
        config,
        Registration {
            service_id: "hr".into(),
            base_url: "http://127.0.0.1:1".into(),
            hosts: vec![],
            calls: vec![],
            diagnostics_token: None,
        },
    );
    assert!(matches!(
        client.register(true).await,
        Err(DirectoryError::Unreachable(_))
    ));
    let (task, mut state) = client.spawn();
    // Two attempts, both failed, and the task is still running.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(5), state.changed())
            .await
            .expect("an attempt")
            .expect("state");
    }
    let seen = state.borrow().clone();
    assert_eq!(seen.instance_id, None);
    assert!(
        seen.last_error
            .as_deref()
            .unwrap_or("")
            .contains("cannot reach the registry"),
        "{seen:?}"
    );
    assert!(!task.is_finished());
    task.abort();
}
