//! Compatibility of revisions of one interface version (`manifest::compat`)
//! and `rfidl breaking`: each rule on an edit of the real `schemas/hr.rfidl`.

use std::path::{Path, PathBuf};
use std::process::Command;

use rfidl_cli::breaking_between;
use rfidl_codegen::manifest::Manifest;
use rfidl_codegen::manifest::compat::{CODES, breaking_changes};

use crate::support::{manifests_of, write_hr};

const HR: &str = include_str!("../../../schemas/hr.rfidl");

/// The manifests of `hr` written into `dir` (with the real common package).
fn manifests(dir: &Path, hr: &str) -> Vec<Manifest> {
    manifests_of(&[write_hr(dir, hr)])
}

/// The breaking changes of `hr` edited by `edit` (which must change it), as
/// `(code, path)` pairs over both EmpService versions.
fn changes_after(edit: impl Fn(&str) -> String) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = manifests(&dir.path().join("before"), HR);
    let edited = edit(HR);
    assert_ne!(edited, HR, "the edit must change the contract");
    let after = manifests(&dir.path().join("after"), &edited);
    breaking_between(&before, &after)
        .into_iter()
        .map(|c| {
            (
                c.change.code.to_owned(),
                format!("v{} {}", c.version, c.change.path),
            )
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(code, path)| (code.to_string(), path.to_string()))
        .collect()
}

#[test]
fn v2_as_a_revision_of_v1_breaks_exactly_where_the_schema_says() {
    // The schema's own comment: only the required `channel` forces v2.
    let dir = tempfile::tempdir().expect("tempdir");
    let all = manifests(dir.path(), HR);
    let v1 = all.iter().find(|m| m.version == 1).expect("v1");
    let mut v2_as_v1 = all.iter().find(|m| m.version == 2).expect("v2").clone();
    v2_as_v1.version = 1;
    let changes = breaking_changes(v1, &v2_as_v1);
    assert_eq!(changes.len(), 1, "{changes:#?}");
    assert_eq!(changes[0].code, "B0007");
    assert_eq!(
        changes[0].path,
        "EmpService v1 method EmployeeHired param channel"
    );
    assert!(changes[0].message.contains("make it `common.Channel?`"));
}

#[test]
fn compatible_edits_report_nothing() {
    for (what, edit) in [
        (
            "a new optional field",
            HR.replace("    weekly_hours: f64,", "    weekly_hours: f64,\n    badge: string?,"),
        ),
        (
            "a new method",
            HR.replace(
                "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n\n    /// The engine asks",
                "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n    signal Rehired(employee_id: uuid);\n\n    /// The engine asks",
            ),
        ),
        (
            "a new optional parameter",
            HR.replace(
                "command ProvisionLaptop(employee_id: uuid, model: string)",
                "command ProvisionLaptop(employee_id: uuid, model: string, note: string?)",
            ),
        ),
        (
            "another delivery policy",
            HR.replace("max_retries = 10, ttl = \"48h\"", "max_retries = 3, ttl = \"1h\""),
        ),
        (
            "reordered fields and new docs",
            HR.replace(
                "    name: string,\n    email: string?,",
                "    /// Shown in the UI.\n    email: string?,\n    name: string,",
            ),
        ),
    ] {
        assert_eq!(changes_after(|_| edit.clone()), pairs(&[]), "{what}");
    }
}

/// What the edit is, the edited contract, and the `(code, path)`s it must report.
type Case = (&'static str, String, Vec<(&'static str, &'static str)>);

#[test]
fn each_breaking_edit_has_its_code() {
    let cases: Vec<Case> = vec![
        (
            "method removed",
            HR.replacen(
                "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n",
                "",
                1,
            ),
            vec![("B0002", "v1 EmpService v1 method OnboardingCompleted")],
        ),
        (
            "kind changed",
            HR.replacen("command ProvisionLaptop", "pushcall ProvisionLaptop", 1),
            vec![("B0003", "v1 EmpService v1 method ProvisionLaptop")],
        ),
        (
            "response changed",
            HR.replacen(
                "model: string) -> LaptopTicket;",
                "model: string) -> HireAck;",
                1,
            ),
            vec![("B0004", "v1 EmpService v1 method ProvisionLaptop")],
        ),
        (
            "parameter removed",
            HR.replacen(
                "command ProvisionLaptop(employee_id: uuid, model: string)",
                "command ProvisionLaptop(employee_id: uuid)",
                1,
            ),
            vec![("B0005", "v1 EmpService v1 method ProvisionLaptop param model")],
        ),
        (
            "parameter retyped",
            HR.replacen(
                "command ProvisionLaptop(employee_id: uuid, model: string)",
                "command ProvisionLaptop(employee_id: uuid, model: string?)",
                1,
            ),
            vec![("B0006", "v1 EmpService v1 method ProvisionLaptop param model")],
        ),
        (
            "required parameter added",
            HR.replacen(
                "command ProvisionLaptop(employee_id: uuid, model: string)",
                "command ProvisionLaptop(employee_id: uuid, model: string, budget: u32)",
                1,
            ),
            vec![("B0007", "v1 EmpService v1 method ProvisionLaptop param budget")],
        ),
        (
            "field removed (used by both versions)",
            HR.replacen("    email: string?, // optional: may be absent or null\n", "", 1),
            vec![
                ("B0008", "v1 record hr.employees.Employee field email"),
                ("B0008", "v2 record hr.employees.Employee field email"),
            ],
        ),
        (
            "field retyped",
            HR.replacen("weekly_hours: f64", "weekly_hours: decimal", 1),
            vec![
                ("B0009", "v1 record hr.employees.Employee field weekly_hours"),
                ("B0009", "v2 record hr.employees.Employee field weekly_hours"),
            ],
        ),
        (
            "required field added",
            HR.replacen("    ticket: string,", "    ticket: string,\n    vendor: string,", 1),
            vec![
                ("B0010", "v1 record hr.employees.LaptopTicket field vendor"),
                ("B0010", "v2 record hr.employees.LaptopTicket field vendor"),
            ],
        ),
        (
            "record became an enum",
            HR.replacen(
                "record HireAck {\n    workflow_id: uuid,\n}",
                "enum HireAck {\n    Accepted,\n}",
                1,
            ),
            vec![
                ("B0011", "v1 hr.employees.HireAck"),
                ("B0011", "v2 hr.employees.HireAck"),
            ],
        ),
        (
            "enum variant removed",
            HR.replacen("    OnLeave,\n", "", 1),
            vec![
                ("B0012", "v1 enum hr.employees.EmploymentStatus variant OnLeave"),
                ("B0012", "v2 enum hr.employees.EmploymentStatus variant OnLeave"),
            ],
        ),
        (
            "enum variant added",
            HR.replacen("    Terminated,\n", "    Terminated,\n    Retired,\n", 1),
            vec![
                ("B0013", "v1 enum hr.employees.EmploymentStatus variant Retired"),
                ("B0013", "v2 enum hr.employees.EmploymentStatus variant Retired"),
            ],
        ),
        (
            "correlation changed",
            HR.replacen(
                "    @correlate(employee_id)\n    command ProvisionLaptop(employee_id: uuid, model: string)",
                "    @correlate(model)\n    command ProvisionLaptop(employee_id: uuid, model: string)",
                1,
            ),
            vec![("B0014", "v1 EmpService v1 method ProvisionLaptop")],
        ),
        (
            "version removed",
            HR.replacen("service EmpService v1 {", "service EmpService v3 {", 1),
            vec![("B0015", "v1 EmpService v1")],
        ),
    ];
    let mut seen: Vec<&str> = vec!["B0001"]; // checked below, not an edit
    for (what, edited, expected) in cases {
        assert_eq!(
            changes_after(|_| edited.clone()),
            pairs(&expected),
            "{what}"
        );
        seen.extend(expected.iter().map(|(code, _)| *code));
    }
    for (code, _) in CODES {
        assert!(seen.contains(code), "{code} has a test case");
    }
}

#[test]
fn comparing_two_different_versions_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let all = manifests(dir.path(), HR);
    let changes = breaking_changes(&all[0], &all[1]);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].code, "B0001");
}

#[test]
fn every_code_is_documented() {
    let docs = include_str!("../../../docs/errors.md");
    for (code, title) in CODES {
        assert!(
            docs.contains(&format!("## {code}")),
            "docs/errors.md has a section for {code} ({title})"
        );
    }
}

fn rfidl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rfidl"))
        .args(args)
        .output()
        .expect("run rfidl")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[test]
fn the_cli_compares_against_manifests_or_contracts() {
    // The checked-in manifests are the published state of schemas/.
    let output = rfidl(&[
        "breaking",
        "--against",
        "../generated-examples/src/generated/manifests",
        "../schemas",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("compared 3 interface versions: no breaking change"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let before = dir.path().join("before");
    let after = dir.path().join("after");
    manifests(&before, HR);
    manifests(
        &after,
        &HR.replacen("weekly_hours: f64", "weekly_hours: decimal", 1),
    );
    let output = rfidl(&[
        "breaking",
        "--against",
        path_str(&before),
        path_str(&after.join("hr.rfidl")),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "error[B0009]: record hr.employees.Employee field weekly_hours: type was `f64`, is `decimal`"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("2 breaking changes in 2 interface versions"),
        "{stderr}"
    );

    // JSON lines, and a baseline printed by `rfidl manifest`.
    let printed = rfidl(&["manifest", path_str(&before.join("hr.rfidl"))]);
    let baseline: PathBuf = dir.path().join("published.json");
    std::fs::write(&baseline, &printed.stdout).expect("write baseline");
    let output = rfidl(&[
        "breaking",
        "--format",
        "json",
        "--against",
        path_str(&baseline),
        path_str(&after.join("hr.rfidl")),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["code"], "B0009");
    assert_eq!(lines[0]["interface"], "hr.employees.EmpService");
    assert_eq!(lines[0]["version"], 1);

    let output = rfidl(&[
        "breaking",
        "--against",
        "no/such/baseline.json",
        "../schemas",
    ]);
    assert_eq!(output.status.code(), Some(2));
}
