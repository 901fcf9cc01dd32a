//! `rfidl deploy-check` (the library function behind it) against a real
//! registry: the manifest scan from a lock file and from contracts, in the
//! `json` and `github` formats, and its outcomes (exit 1 when a called
//! version has no compatible provider, 2 when the registry cannot be asked).

use std::path::PathBuf;

use rfidl_cli::{self as cli, DiagnosticFormat, Outcome, Report};
use rfidl_codegen::registry::{LockFile, Locked};
use serde_json::{Value, json};

use crate::support::{Server, schema_manifest, schema_manifests};

fn lines(report: &Report) -> Vec<Value> {
    report
        .captured()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[test]
fn deploy_check_passes_only_with_a_registered_compatible_provider() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let schemas = [PathBuf::from("../schemas")];
    assert_eq!(
        cli::publish_with(
            &server.url,
            None,
            &schemas,
            &Report::capturing(DiagnosticFormat::Json)
        ),
        Outcome::Success
    );
    let (v1, v2) = (
        schema_manifest("hr.employees.EmpService", 1),
        schema_manifest("hr.employees.EmpService", 2),
    );
    let lock_path = dir.path().join("rfidl.lock");
    let lock = LockFile {
        format: 1,
        interfaces: [&v1, &v2]
            .iter()
            .map(|m| Locked {
                interface: m.interface.clone(),
                version: m.version,
                fingerprint: m.fingerprint.clone(),
            })
            .collect(),
    };
    lock.save(&lock_path).expect("save lock");
    let lock_arg = [lock_path.clone()];

    // Nobody hosts EmpService yet.
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::deploy_check_with(&server.url, &lock_arg, &report),
        Outcome::ContractErrors
    );
    assert_eq!(Outcome::ContractErrors.exit_code(), 1);
    let unmet = lines(&report);
    assert_eq!(unmet.len(), 2, "{unmet:?}");
    assert_eq!(unmet[0]["event"], "unsatisfied");
    assert_eq!(unmet[0]["reason"], "no_provider");
    assert_eq!(unmet[0]["interface"], "hr.employees.EmpService");
    assert_eq!(unmet[0]["fingerprint"], v1.fingerprint.as_str());

    // HR registers as the provider of both versions.
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/services/hr/instances", server.url))
        .json(&json!({"baseUrl": "http://127.0.0.1:7001", "hosts": lock.interfaces}))
        .send()
        .expect("register");
    assert_eq!(response.status().as_u16(), 201);
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::deploy_check_with(&server.url, &lock_arg, &report),
        Outcome::Success
    );
    assert_eq!(
        lines(&report),
        [json!({"event": "deploy_check", "satisfied": true, "checked": 2})]
    );

    // From contracts: every service version of schemas/, and the others
    // have no provider; github annotations titled with the reason.
    let others = schema_manifests().len() - 2;
    assert!(others > 0);
    let report = Report::capturing(DiagnosticFormat::Github);
    assert_eq!(
        cli::deploy_check_with(&server.url, &schemas, &report),
        Outcome::ContractErrors
    );
    let annotations = report.captured();
    assert_eq!(annotations.lines().count(), others, "{annotations}");
    assert!(
        annotations
            .lines()
            .all(|l| l.starts_with("::error title=no_provider::") && !l.contains("EmpService")),
        "{annotations}"
    );
}

#[test]
fn deploy_check_without_a_registry_or_input_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let lock_path = dir.path().join("rfidl.lock");
    let lock = LockFile {
        format: 1,
        interfaces: vec![Locked {
            interface: "hr.employees.EmpService".into(),
            version: 1,
            fingerprint: "sha256:00".into(),
        }],
    };
    lock.save(&lock_path).expect("save");
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::deploy_check_with(&format!("http://{closed}"), &[lock_path], &report),
        Outcome::UsageOrIo
    );
    assert_eq!(lines(&report)[0]["severity"], "error");
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::deploy_check_with(
            &format!("http://{closed}"),
            &[dir.path().join("missing.lock")],
            &report
        ),
        Outcome::UsageOrIo
    );
    assert!(
        lines(&report)[0]["message"]
            .as_str()
            .unwrap()
            .contains("does not exist")
    );
}

#[test]
fn a_decommissioned_version_fails_the_scan_until_it_is_recommissioned() {
    use rfidl_codegen::registry::Remote;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        rfidl_registry::Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .publish_token("t0k")
            .registration_token("t0k")
            .operator_token("t0k"),
    );
    let schemas = [PathBuf::from("../schemas")];
    assert_eq!(
        cli::publish_with(
            &server.url,
            Some("t0k"),
            &schemas,
            &Report::capturing(DiagnosticFormat::Json)
        ),
        Outcome::Success
    );
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    let v1_ref = json!({"interface": v1.interface, "version": 1, "fingerprint": v1.fingerprint});
    let client = reqwest::blocking::Client::new();
    let response = client
        .post(format!("{}/v1/services/hr/instances", server.url))
        .bearer_auth("t0k")
        .json(&json!({"baseUrl": "http://127.0.0.1:7001", "hosts": [v1_ref]}))
        .send()
        .expect("register");
    assert_eq!(response.status().as_u16(), 201);
    let listed = || -> Value {
        client
            .get(format!("{}/v1/decommissioned", server.url))
            .send()
            .expect("list")
            .json()
            .expect("json")
    };
    let check = |report: &Report| {
        let lock_path = dir.path().join("rfidl.lock");
        LockFile {
            format: 1,
            interfaces: vec![Locked {
                interface: v1.interface.clone(),
                version: 1,
                fingerprint: v1.fingerprint.clone(),
            }],
        }
        .save(&lock_path)
        .expect("lock");
        cli::deploy_check_with(&server.url, &[lock_path], report)
    };
    assert_eq!(
        check(&Report::capturing(DiagnosticFormat::Json)),
        Outcome::Success
    );

    let emp_v1: Remote = "hr.employees.EmpService@v1".parse().expect("remote");
    let emp_v9: Remote = "hr.employees.EmpService@v9".parse().expect("remote");
    // Without the token, and for an unknown version: refused, nothing stored.
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::decommission_with(
            &server.url,
            None,
            std::slice::from_ref(&emp_v1),
            true,
            &report
        ),
        Outcome::UsageOrIo
    );
    assert!(
        report.captured().contains("unauthorized"),
        "{}",
        report.captured()
    );
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::decommission_with(&server.url, Some("t0k"), &[emp_v9], true, &report),
        Outcome::UsageOrIo
    );
    assert!(
        report.captured().contains("v9 is not published"),
        "{}",
        report.captured()
    );
    for (method, path, code) in [
        (
            reqwest::Method::PUT,
            "/v1/decommissioned/hr.employees.EmpService/v01",
            400,
        ),
        (
            reqwest::Method::DELETE,
            "/v1/decommissioned/shop.Nothing/v1",
            404,
        ),
        (
            reqwest::Method::GET,
            "/v1/decommissioned/hr.employees.EmpService/v1",
            405,
        ),
    ] {
        let response = client
            .request(method.clone(), format!("{}{path}", server.url))
            .bearer_auth("t0k")
            .send()
            .expect("send");
        assert_eq!(response.status().as_u16(), code, "{method} {path}");
    }
    assert_eq!(listed(), json!({"decommissioned": []}), "nothing stored");

    // Decommissioned: the deploy check and a consumer's registration fail.
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::decommission_with(
            &server.url,
            Some("t0k"),
            std::slice::from_ref(&emp_v1),
            true,
            &report
        ),
        Outcome::Success
    );
    assert_eq!(
        lines(&report),
        [
            json!({"event": "decommissioned", "interface": "hr.employees.EmpService", "version": 1, "commandsSentTo": null})
        ]
    );
    assert_eq!(listed()["decommissioned"][0]["version"], 1);
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(check(&report), Outcome::ContractErrors);
    assert_eq!(lines(&report)[0]["reason"], "decommissioned");
    // A build against it warns (the Builder prints these as cargo:warning).
    let registry_client =
        rfidl_codegen::registry::client::RegistryClient::new(&server.url).expect("client");
    let emp_v2: Remote = "hr.employees.EmpService@v2".parse().expect("remote");
    let warnings = rfidl_codegen::registry::decommission_warnings(
        &[emp_v1.clone(), emp_v2.clone()],
        &registry_client,
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("hr.employees.EmpService v1 is decommissioned"),
        "{warnings:?}"
    );
    let refused = client
        .post(format!("{}/v1/services/engine/instances", server.url))
        .bearer_auth("t0k")
        .json(&json!({"baseUrl": "http://127.0.0.1:7002", "calls": [v1_ref]}))
        .send()
        .expect("register");
    assert_eq!(refused.status().as_u16(), 409);

    // Re-commissioned: back to normal.
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::decommission_with(
            &server.url,
            Some("t0k"),
            std::slice::from_ref(&emp_v1),
            false,
            &report
        ),
        Outcome::Success
    );
    assert_eq!(lines(&report)[0]["event"], "recommissioned");
    assert!(
        rfidl_codegen::registry::decommission_warnings(&[emp_v1, emp_v2], &registry_client)
            .is_empty()
    );
    assert_eq!(listed(), json!({"decommissioned": []}));
    assert_eq!(
        check(&Report::capturing(DiagnosticFormat::Json)),
        Outcome::Success
    );
}
