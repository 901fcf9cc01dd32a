//! End-to-end runs of the `rfidl` binary: exit codes and output streams.

use std::process::Command;

fn rfidl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rfidl"))
        .args(args)
        .output()
        .expect("run rfidl")
}

#[test]
fn check_passes_on_the_example_schemas() {
    let output = rfidl(&["check", "../schemas"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("no errors"), "{stderr}");
}

#[test]
fn check_exits_1_on_contract_errors_and_2_on_io_or_usage() {
    let output = rfidl(&["check", "tests/ui/e0010_unknown_type.rfidl"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        !output.stderr.contains(&0x1b),
        "no ANSI escapes when stderr is not a terminal"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("error[E0010]: unknown type `strin`"));
    assert_eq!(
        rfidl(&["check", "no/such/file.rfidl"]).status.code(),
        Some(2)
    );
    assert_eq!(rfidl(&["check"]).status.code(), Some(2));
    assert_eq!(rfidl(&["frobnicate"]).status.code(), Some(2));
}

#[test]
fn check_of_a_folder_without_contracts_is_an_io_error() {
    let empty = tempfile::tempdir().expect("temp dir");
    let output = rfidl(&["check", empty.path().to_str().expect("utf-8 temp path")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no .rfidl files"), "{stderr}");
}

#[test]
fn check_of_a_folder_reports_every_file_in_sorted_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("nested")).expect("mkdir");
    std::fs::write(
        dir.path().join("b.rfidl"),
        "package b;\nrecord B { x: Nope }\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("nested/a.rfidl"),
        "package a;\nrecord A { x: Nah }\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a contract").expect("write");
    let output = rfidl(&[
        "check",
        "--format",
        "json",
        dir.path().to_str().expect("utf-8"),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let files: Vec<String> = stdout
        .lines()
        .map(|line| {
            let value: serde_json::Value =
                serde_json::from_str(line).expect("one JSON object a line");
            value["file"].as_str().expect("file").replace('\\', "/")
        })
        .collect();
    assert_eq!(files.len(), 2, "{stdout}");
    assert!(files[0].ends_with("/b.rfidl"), "{files:?}");
    assert!(files[1].ends_with("/nested/a.rfidl"), "{files:?}");
}

#[test]
fn json_format_prints_one_object_per_diagnostic() {
    let output = rfidl(&[
        "check",
        "--format",
        "json",
        "tests/ui/e0010_unknown_type.rfidl",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(lines[0]["code"], "E0010");
    assert_eq!(lines[0]["file"], "tests/ui/e0010_unknown_type.rfidl");
    assert_eq!(lines[0]["line"], 5);
    assert_eq!(lines[0]["column"], 11);
    assert_eq!(lines[0]["end_column"], 16);
    assert_eq!(lines[0]["help"], "did you mean `string`?");
}

#[test]
fn manifest_prints_every_service_version() {
    let output = rfidl(&["manifest", "../schemas"]);
    assert_eq!(output.status.code(), Some(0));
    let manifests: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).expect("JSON array");
    let ids: Vec<String> = manifests
        .iter()
        .map(|m| {
            format!(
                "{} v{}",
                m["interface"].as_str().unwrap_or(""),
                m["version"]
            )
        })
        .collect();
    assert_eq!(
        ids,
        [
            "hr.employees.EmpService v1",
            "hr.employees.EmpService v2",
            "shop.orders.OrderService v1"
        ]
    );
    assert!(manifests.iter().all(|m| {
        m["fingerprint"]
            .as_str()
            .is_some_and(|f| f.starts_with("sha256:"))
    }));
}

#[test]
fn builder_finds_imports_in_include_paths_and_writes_only_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let contracts = dir.path().join("contracts");
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&contracts).expect("mkdir");
    std::fs::create_dir_all(&shared).expect("mkdir");
    std::fs::write(
        shared.join("money.rfidl"),
        "package common;\nrecord Money { amount: decimal }\n",
    )
    .expect("write");
    std::fs::write(
        contracts.join("shop.rfidl"),
        "package shop;\nimport \"money.rfidl\";\nservice Shop v1 { signal Paid(amount: common.Money); }\n",
    )
    .expect("write");
    let out = dir.path().join("out");
    let build = || {
        rfidl_codegen::Builder::new()
            .out_dir(&out)
            .include_path(&shared)
            .skip_rerun_if_changed()
            .compile(&[contracts.join("shop.rfidl")])
    };
    let without = rfidl_codegen::Builder::new()
        .out_dir(&out)
        .skip_rerun_if_changed()
        .compile(&[contracts.join("shop.rfidl")]);
    assert!(
        matches!(without, Err(rfidl_codegen::builder::BuildError::Contract { errors: 1, ref rendered }) if rendered.contains("E0060"))
    );
    // What `fn main() -> Result<(), Box<dyn Error>>` prints: one line, the
    // same as Display (the diagnostics went to stderr already).
    let error = without.expect_err("contract error");
    assert_eq!(format!("{error:?}"), format!("{error}"));
    assert_eq!(
        format!("{error:?}"),
        "rfidl: 1 error in the contracts, see the diagnostics above"
    );
    let files = build().expect("include path resolves the import");
    assert!(files.iter().any(|f| f.name == "shop.rs"));
    let written = std::fs::metadata(out.join("shop.rs"))
        .and_then(|m| m.modified())
        .expect("written");
    std::thread::sleep(std::time::Duration::from_millis(20));
    build().expect("second build");
    let again = std::fs::metadata(out.join("shop.rs"))
        .and_then(|m| m.modified())
        .expect("still there");
    assert_eq!(
        written, again,
        "an unchanged contract must not rewrite the output"
    );
}

#[test]
fn check_colours_only_when_asked_or_on_a_terminal() {
    let input = "tests/ui/e0021_duplicate_field.rfidl";
    let coloured = rfidl(&["check", "--color", "always", input]);
    assert_eq!(coloured.status.code(), Some(1));
    assert!(coloured.stderr.contains(&0x1b), "--color always colours");
    let plain = rfidl(&["check", "--color", "never", input]);
    assert!(!plain.stderr.contains(&0x1b));
    // Same text once the escapes are gone.
    let stripped = strip_ansi(&String::from_utf8_lossy(&coloured.stderr));
    assert_eq!(stripped, String::from_utf8_lossy(&plain.stderr));
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
