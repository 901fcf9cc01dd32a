//! Secure by default: a demo service refuses to listen beyond loopback
//! without an ops token (its failed list and metrics would answer anyone),
//! and refuses an empty token; it exits non-zero with the reason before it opens
//! its database or binds anything.

use std::process::Command;

use rfidl_examples::demo::check_ops_access;

#[test]
fn the_loopback_rule_and_the_empty_token() {
    let public = "0.0.0.0:7001".parse().expect("addr");
    let loopback = "127.0.0.1:7001".parse().expect("addr");
    let loopback6 = "[::1]:7001".parse().expect("addr");
    assert!(check_ops_access(public, None).is_err());
    assert!(check_ops_access(public, Some("")).is_err());
    assert!(check_ops_access(loopback, Some("")).is_err());
    assert!(check_ops_access(public, Some("t0ken")).is_ok());
    assert!(check_ops_access(loopback, None).is_ok());
    assert!(check_ops_access(loopback6, None).is_ok());
}

#[test]
fn a_service_on_a_public_address_without_a_token_does_not_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("hr.db");
    let output = Command::new(env!("CARGO_BIN_EXE_hr-service"))
        .args(["--listen", "0.0.0.0:0", "--peer-url", "http://127.0.0.1:9"])
        .arg("--db")
        .arg(&db)
        .env(
            "RFIDL_SECRET",
            "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        )
        .env(
            "RFIDL_PEER_SECRET",
            "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        )
        .env_remove("RFIDL_OPS_TOKEN")
        .output()
        .expect("run hr-service");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("without --ops-token"), "{stderr}");
    assert!(!db.exists(), "nothing created");
}
