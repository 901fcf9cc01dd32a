//! `Config` from YAML plus the `RFIDL_…` environment overlay, with secrets
//! from real files; errors name the variable or setting, never the value.

use std::time::Duration;

use rfidl_runtime::Config;
use rfidl_runtime::config::ConfigError;
use rfidl_runtime::config::env::scalar_variables;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const SECRET: &str = "whsec_TOPSECRETTOPSECRETTOPSECRET";

#[test]
fn every_scalar_setting_has_a_variable_named_after_its_yaml_path() {
    let names: Vec<String> = scalar_variables().into_iter().map(|v| v.name).collect();
    for expected in [
        "RFIDL_SERVICE_ID",
        "RFIDL_OUTBOX_POLL_INTERVAL",
        "RFIDL_OUTBOX_MAX_RETRIES",
        "RFIDL_OUTBOX_TTL",
        "RFIDL_OUTBOX_DURABILITY",
        "RFIDL_INBOX_RETENTION",
        "RFIDL_INBOX_BODY_LIMIT",
        "RFIDL_CLEANUP_INTERVAL",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    assert!(
        !names
            .iter()
            .any(|n| n.contains("DESTINATIONS") || n.contains("PEERS")),
        "{names:?}"
    );
    // docs/operations.md documents every one of them.
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations.md"
    ))
    .expect("docs/operations.md");
    for name in &names {
        assert!(
            docs.contains(&format!("`{name}`")),
            "{name} is not documented"
        );
    }
}

#[test]
fn the_environment_wins_over_yaml_and_reads_secrets_from_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine_secret = dir.path().join("engine.secret");
    std::fs::write(&engine_secret, format!("{SECRET}\n")).expect("write");
    let peers = dir.path().join("peers");
    std::fs::write(&peers, "# rotated on 2026-11-01\nwhsec_NEW\n\nwhsec_OLD\n").expect("write");

    let mut config = Config::from_yaml_str(
        "service_id: hr\noutbox:\n  ttl: 48h\n  max_retries: 3\n\
         destinations:\n  engine-eu: {url: 'http://a:1', secret: whsec_YAML}\n",
    )
    .expect("yaml");
    config
        .overlay_vars(vars(&[
            ("RFIDL_OUTBOX_MAX_RETRIES", "9"),
            ("RFIDL_INBOX_DURABILITY", "normal"),
            ("RFIDL_CLEANUP_INTERVAL", "1m"),
            (
                "RFIDL_DESTINATIONS_ENGINE_EU_SECRET_FILE",
                engine_secret.to_str().unwrap(),
            ),
            (
                "RFIDL_DESTINATIONS_BILLING_URL",
                "http://billing:7003, http://billing-2:7003",
            ),
            ("RFIDL_DESTINATIONS_BILLING_SECRET", "whsec_BILL"),
            (
                "RFIDL_PEERS_HR_SERVICE_SECRETS_FILE",
                peers.to_str().unwrap(),
            ),
            ("RFIDL_PEERS_ENGINE_SECRETS", "whsec_A, whsec_B"),
            // Not the overlay's: left to the application.
            ("RFIDL_OPS_TOKEN", "t"),
            ("HOME", "/root"),
        ]))
        .expect("overlay");
    assert_eq!(config.service_id, "hr", "unset variables change nothing");
    assert_eq!(config.outbox.ttl, Duration::from_secs(48 * 3600));
    assert_eq!(config.outbox.max_retries, 9);
    assert_eq!(config.inbox.durability, rfidl_runtime::Durability::Normal);
    assert_eq!(config.cleanup_interval, Duration::from_secs(60));
    let engine = &config.destinations["engine-eu"];
    assert_eq!(engine.url, "http://a:1");
    assert_eq!(engine.secret, SECRET, "trailing newline dropped");
    let billing = &config.destinations["billing"];
    assert_eq!(
        (billing.url.as_str(), billing.secret.as_str()),
        ("http://billing:7003", "whsec_BILL")
    );
    assert_eq!(billing.urls, ["http://billing-2:7003"], "more base URLs");
    assert!(engine.urls.is_empty());
    assert_eq!(config.peers["hr-service"], ["whsec_NEW", "whsec_OLD"]);
    assert_eq!(config.peers["engine"], ["whsec_A", "whsec_B"]);
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("TOPSECRET") && !shown.contains("whsec_"),
        "{shown}"
    );
}

#[test]
fn bad_variables_are_named_and_their_values_never_shown() {
    let cases: [(&[(&str, &str)], &str); 9] = [
        (
            &[("RFIDL_OUTBOX_MAX_RETRIES", SECRET)],
            "RFIDL_OUTBOX_MAX_RETRIES",
        ),
        (&[("RFIDL_OUTBOX_TTL", SECRET)], "RFIDL_OUTBOX_TTL"),
        (
            &[("RFIDL_INBOX_DURABILITY", SECRET)],
            "RFIDL_INBOX_DURABILITY",
        ),
        (
            &[("RFIDL_OUTBOX_MAX_RETRYS", "3")],
            "RFIDL_OUTBOX_MAX_RETRYS",
        ),
        (
            &[("RFIDL_PEERS_HR_SECRET", SECRET)],
            "RFIDL_PEERS_HR_SECRET",
        ),
        (
            &[("RFIDL_DESTINATIONS_BILLING_SECRET", SECRET)],
            "RFIDL_DESTINATIONS_BILLING_URL",
        ),
        (
            &[
                ("RFIDL_DESTINATIONS_HR_URL", " , "),
                ("RFIDL_DESTINATIONS_HR_SECRET", SECRET),
            ],
            "RFIDL_DESTINATIONS_HR_URL: no URL given",
        ),
        (
            &[
                ("RFIDL_DESTINATIONS_HR_SECRET", SECRET),
                ("RFIDL_DESTINATIONS_HR_SECRET_FILE", "/x"),
            ],
            "not both",
        ),
        (
            &[(
                "RFIDL_DESTINATIONS_HR_SECRET_FILE",
                "/nonexistent/rfidl-secret",
            )],
            "/nonexistent/rfidl-secret",
        ),
    ];
    for (pairs, expected) in cases {
        let mut config = Config::default();
        let error = config.overlay_vars(vars(pairs)).unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(shown.contains(expected), "{pairs:?}: {shown}");
        assert!(!shown.contains("TOPSECRET"), "{pairs:?}: {shown}");
        assert!(
            matches!(error, ConfigError::Env { .. } | ConfigError::Io { .. }),
            "{error:?}"
        );
        assert_eq!(
            config,
            Config::default(),
            "a failed overlay changes nothing visible"
        );
    }
}
