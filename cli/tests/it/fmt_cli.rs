//! End-to-end runs of `rfidl fmt`: what it rewrites, what `--check` lists,
//! and its exit codes (0 formatted, 1 would change or syntax error, 2 I/O).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

const MESSY: &str = "package shop ;\nrecord Order{id:uuid , // the key\nnote:string ?}\n";
const FORMATTED: &str =
    "package shop;\n\nrecord Order {\n    id: uuid, // the key\n    note: string?,\n}\n";

fn rfidl(args: &[&Path], check: bool) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rfidl"));
    command.arg("fmt");
    if check {
        command.arg("--check");
    }
    command.args(args).output().expect("run rfidl")
}

/// Sets a file's modification time an hour back, so a rewrite shows.
fn age(path: &Path) -> SystemTime {
    let past = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|file| file.set_modified(past))
        .expect("set mtime");
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .expect("mtime")
}

#[test]
fn check_lists_unformatted_files_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let messy = dir.path().join("messy.rfidl");
    let tidy = dir.path().join("tidy.rfidl");
    std::fs::write(&messy, MESSY).expect("write");
    std::fs::write(&tidy, FORMATTED).expect("write");

    let output = rfidl(&[dir.path()], true);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [messy.display().to_string()]
    );
    assert_eq!(std::fs::read_to_string(&messy).expect("read"), MESSY);

    let output = rfidl(&[&tidy], true);
    assert_eq!(output.status.code(), Some(0));
    assert!(output.stdout.is_empty());
}

#[test]
fn fmt_rewrites_only_the_files_that_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let messy = dir.path().join("messy.rfidl");
    let tidy = dir.path().join("tidy.rfidl");
    std::fs::write(&messy, MESSY).expect("write");
    std::fs::write(&tidy, FORMATTED).expect("write");
    let tidy_time = age(&tidy);

    let output = rfidl(&[&messy, &tidy], false);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(std::fs::read_to_string(&messy).expect("read"), FORMATTED);
    let after = std::fs::metadata(&tidy)
        .and_then(|m| m.modified())
        .expect("mtime");
    assert_eq!(after, tidy_time, "an already formatted file was rewritten");
    assert_eq!(rfidl(&[dir.path()], true).status.code(), Some(0));
}

#[test]
fn syntax_errors_are_reported_and_the_file_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.rfidl");
    let text = "package shop;\nrecord Order { id: uuid\n";
    std::fs::write(&broken, text).expect("write");

    for check in [false, true] {
        let output = rfidl(&[&broken], check);
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("error[E0001]"), "{stderr}");
        assert_eq!(std::fs::read_to_string(&broken).expect("read"), text);
    }
}

#[test]
fn a_missing_file_is_an_io_error() {
    let output = rfidl(&[Path::new("no/such/contract.rfidl")], false);
    assert_eq!(output.status.code(), Some(2));
}
