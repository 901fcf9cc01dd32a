//! `rfidl publish` and `rfidl fetch` (the library functions behind them)
//! report in `json` and `github` against a real registry.

use std::path::PathBuf;

use rfidl_cli::{self as cli, DiagnosticFormat, Outcome, Report};
use rfidl_codegen::registry::{Cache, LockPolicy};
use serde_json::{Value, json};

use crate::support::{Server, schema_manifest};

fn lines(report: &Report) -> Vec<Value> {
    report
        .captured()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// `schemas/` with `weekly_hours` changed from `f64` to `decimal`: both
/// `hr.employees.EmpService` versions break.
fn breaking_contracts(dir: &std::path::Path) -> PathBuf {
    let edited = dir.join("contracts");
    std::fs::create_dir_all(edited.join("common")).expect("mkdir");
    std::fs::copy(
        "../schemas/common/common.rfidl",
        edited.join("common/common.rfidl"),
    )
    .expect("copy");
    let hr = std::fs::read_to_string("../schemas/hr.rfidl").expect("read");
    std::fs::write(
        edited.join("hr.rfidl"),
        hr.replacen("weekly_hours: f64", "weekly_hours: decimal", 1),
    )
    .expect("write");
    edited.join("hr.rfidl")
}

#[test]
fn publish_and_fetch_report_json_lines_and_github_annotations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let schemas = [PathBuf::from("../schemas")];

    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::publish_with(&server.url, None, &schemas, &report),
        Outcome::Success
    );
    let published = lines(&report);
    assert_eq!(published.len(), 3, "{published:?}");
    let v2 = schema_manifest("hr.employees.EmpService", 2);
    assert_eq!(
        published[1],
        json!({
            "event": "published",
            "interface": "hr.employees.EmpService",
            "version": 2,
            "fingerprint": v2.fingerprint,
            "revision": 1,
            "created": true,
        })
    );
    let again = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::publish_with(&server.url, None, &schemas, &again),
        Outcome::Success
    );
    assert!(lines(&again).iter().all(|l| l["created"] == false));

    // A breaking revision: the changes, as `rfidl breaking` prints them.
    let edited = [breaking_contracts(dir.path())];
    let report = Report::capturing(DiagnosticFormat::Json);
    assert_eq!(
        cli::publish_with(&server.url, None, &edited, &report),
        Outcome::ContractErrors
    );
    let refused = lines(&report);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0]["interface"], "hr.employees.EmpService");
    assert_eq!(refused[0]["version"], 1);
    assert_eq!(refused[0]["code"], "B0009");
    let github = Report::capturing(DiagnosticFormat::Github);
    assert_eq!(
        cli::publish_with(&server.url, None, &edited, &github),
        Outcome::ContractErrors
    );
    assert_eq!(
        github.captured(),
        "::error title=B0009::hr.employees.EmpService v1: record hr.employees.Employee field \
         weekly_hours: type was `f64`, is `decimal`\n\
         ::error title=B0009::hr.employees.EmpService v2: record hr.employees.Employee field \
         weekly_hours: type was `f64`, is `decimal`\n"
    );

    // Fetch: one `locked` line per pin, with where the cache keeps it.
    let cache = Cache::new(dir.path().join("cache"));
    let lock = dir.path().join("rfidl.lock");
    let report = Report::capturing(DiagnosticFormat::Json);
    let remotes = ["hr.employees.EmpService@v2".parse().expect("remote")];
    assert_eq!(
        cli::fetch_with(
            Some(&server.url),
            &lock,
            &cache,
            &remotes,
            LockPolicy::Keep,
            &report
        ),
        Outcome::Success
    );
    let cached = cache
        .path_of(&v2.interface, 2, &v2.fingerprint)
        .expect("a valid cache path");
    assert!(cached.is_file());
    assert_eq!(
        lines(&report),
        [json!({
            "event": "locked",
            "interface": "hr.employees.EmpService",
            "version": 2,
            "fingerprint": v2.fingerprint,
            "cache": cached.display().to_string(),
        })]
    );
    // Nothing to fetch is an error in the format too.
    let report = Report::capturing(DiagnosticFormat::Github);
    let empty_lock = dir.path().join("empty.lock");
    assert_eq!(
        cli::fetch_with(None, &empty_lock, &cache, &[], LockPolicy::Keep, &report),
        Outcome::UsageOrIo
    );
    assert!(
        report.captured().starts_with("::error::nothing to fetch"),
        "{}",
        report.captured()
    );
}
