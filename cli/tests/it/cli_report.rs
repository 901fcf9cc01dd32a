//! `--format text|json|github` and `--color` on every subcommand that
//! reports, `rfidl completions`, `rfidl man`, and network errors that keep
//! their cause. Outputs are pinned with insta.

use std::path::Path;
use std::process::{Command, Output};

fn rfidl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rfidl"))
        .args(args)
        .env_remove("NO_COLOR")
        .env_remove("RFIDL_REGISTRY")
        .env_remove("RFIDL_REGISTRY_TOKEN")
        .env_remove("RFIDL_REGISTRY_OPERATOR_TOKEN")
        .env_remove("RFIDL_REGISTRY_OPERATOR_TOKEN_FILE")
        .output()
        .expect("run rfidl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    text(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// `schemas/` copied into `dir`, with `hr.rfidl` edited by `edit`.
fn schemas_copy(dir: &Path, edit: impl Fn(&str) -> String) -> std::path::PathBuf {
    let root = dir.join("schemas");
    std::fs::create_dir_all(root.join("common")).expect("mkdir");
    for file in ["hr.rfidl", "orders.rfidl", "common/common.rfidl"] {
        let contents = std::fs::read_to_string(Path::new("../schemas").join(file)).expect("read");
        let contents = if file == "hr.rfidl" {
            edit(&contents)
        } else {
            contents
        };
        std::fs::write(root.join(file), contents).expect("write");
    }
    root
}

#[test]
fn check_in_github_format_annotates_errors_and_warnings() {
    let output = rfidl(&[
        "check",
        "--format",
        "github",
        "tests/ui/e0010_unknown_type.rfidl",
    ]);
    assert_eq!(output.status.code(), Some(1));
    insta::assert_snapshot!("check_github_errors", text(&output.stdout));
    assert!(
        text(&output.stderr).contains("could not check contracts due to 3 previous errors"),
        "the summary stays text on stderr"
    );
    let output = rfidl(&[
        "check",
        "--format",
        "github",
        "tests/ui/w0002_deprecated_use.rfidl",
    ]);
    assert_eq!(output.status.code(), Some(0), "a warning does not fail");
    insta::assert_snapshot!("check_github_warning", text(&output.stdout));
    // The old name of `text` still works and is the default.
    let human = rfidl(&[
        "check",
        "--format",
        "human",
        "tests/ui/e0010_unknown_type.rfidl",
    ]);
    let default = rfidl(&["check", "tests/ui/e0010_unknown_type.rfidl"]);
    assert_eq!(human.stderr, default.stderr);
    assert!(human.stdout.is_empty());
}

#[test]
fn errors_that_are_not_diagnostics_follow_the_format() {
    let json = rfidl(&["check", "--format", "json", "no/such.rfidl"]);
    assert_eq!(json.status.code(), Some(2));
    let lines = json_lines(&json);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["severity"], "error");
    assert_eq!(lines[0]["code"], serde_json::Value::Null);
    assert!(
        lines[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no/such.rfidl")),
        "{lines:?}"
    );
    assert!(json.stderr.is_empty(), "json mode keeps stderr quiet");
    let github = rfidl(&["fmt", "--format", "github", "no/such.rfidl"]);
    assert_eq!(github.status.code(), Some(2));
    let stdout = text(&github.stdout);
    assert!(
        stdout.starts_with("::error::cannot read no/such.rfidl: "),
        "{stdout}"
    );
}

#[test]
fn fmt_check_reports_in_each_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let messy = dir.path().join("messy.rfidl");
    std::fs::write(&messy, "package shop ;\nrecord Order{id:uuid}\n").expect("write");
    let shown = path_str(&messy);

    let plain = rfidl(&["fmt", "--check", shown]);
    assert_eq!(plain.status.code(), Some(1));
    assert_eq!(text(&plain.stdout), format!("{shown}\n"));

    let json = rfidl(&["fmt", "--check", "--format", "json", shown]);
    assert_eq!(json.status.code(), Some(1));
    assert_eq!(
        json_lines(&json),
        [serde_json::json!({"event": "unformatted", "file": shown})]
    );

    let github = rfidl(&["fmt", "--check", "--format", "github", shown]);
    assert_eq!(github.status.code(), Some(1));
    assert_eq!(
        text(&github.stdout),
        format!(
            "::error file={},title=rfidl fmt::not in the canonical layout; run `rfidl fmt` on it\n",
            shown.replace(':', "%3A").replace(',', "%2C")
        )
    );

    // A rewrite in json names what it rewrote; the file is formatted after.
    let json = rfidl(&["fmt", "--format", "json", shown]);
    assert_eq!(json.status.code(), Some(0));
    assert_eq!(
        json_lines(&json),
        [serde_json::json!({"event": "formatted", "file": shown})]
    );
    assert_eq!(rfidl(&["fmt", "--check", shown]).status.code(), Some(0));
}

#[test]
fn breaking_reports_in_each_format_and_colours_only_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let after = schemas_copy(dir.path(), |hr| {
        hr.replacen("weekly_hours: f64", "weekly_hours: decimal", 1)
    });
    let baseline = "../generated-examples/src/generated/manifests";
    let run = |extra: &[&str]| {
        let mut args = vec!["breaking", "--against", baseline, path_str(&after)];
        args.extend_from_slice(extra);
        rfidl(&args)
    };
    let github = run(&["--format", "github"]);
    assert_eq!(github.status.code(), Some(1));
    insta::assert_snapshot!("breaking_github", text(&github.stdout));

    let json = run(&["--format", "json"]);
    assert_eq!(json.status.code(), Some(1));
    let lines = json_lines(&json);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| l["code"] == "B0009"), "{lines:?}");

    let coloured = run(&["--color", "always"]);
    assert!(coloured.stderr.contains(&0x1b), "--color always colours");
    let plain = run(&["--color", "never"]);
    assert!(!plain.stderr.contains(&0x1b));
    let text_out = text(&plain.stderr);
    assert!(text_out.contains("error[B0009]: record hr.employees.Employee field weekly_hours"));
    // `--color` is global: before the subcommand too.
    let mut args = vec!["--color", "always", "breaking", "--against", baseline];
    args.push(path_str(&after));
    assert_eq!(rfidl(&args).stderr, coloured.stderr);
}

#[test]
fn generate_reports_in_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let output = rfidl(&[
        "generate",
        "--format",
        "json",
        "../schemas",
        "--out",
        path_str(&out),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["event"], "generated");
    let files = lines[0]["files"].as_u64().expect("files");
    assert_eq!(lines[0]["changed"].as_u64(), Some(files), "all new");
    let on_disk = std::fs::read_dir(&out).expect("out").count() as u64;
    assert!(
        files >= on_disk && on_disk > 0,
        "{files} files, {on_disk} entries"
    );
    // Again: nothing changes.
    let again = rfidl(&[
        "generate",
        "--format",
        "json",
        "../schemas",
        "--out",
        path_str(&out),
    ]);
    assert_eq!(json_lines(&again)[0]["changed"], 0);
}

#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let output = rfidl(&["completions", shell]);
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = text(&output.stdout);
        for word in [
            "rfidl",
            "check",
            "publish",
            "breaking",
            "completions",
            "format",
            "github",
        ] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    // The bash script is valid bash and completes subcommands.
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("rfidl.bash");
    std::fs::write(&script, rfidl(&["completions", "bash"]).stdout).expect("write");
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && COMP_WORDS=(rfidl ch) COMP_CWORD=1 && _rfidl rfidl ch rfidl && \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .expect("run bash");
    assert!(completed.status.success(), "{}", text(&completed.stderr));
    assert_eq!(text(&completed.stdout), "check\n");
    let unknown = rfidl(&["completions", "tcsh"]);
    assert_eq!(unknown.status.code(), Some(2));
}

#[test]
fn man_prints_roff_or_writes_a_page_per_subcommand() {
    let output = rfidl(&["man"]);
    assert_eq!(output.status.code(), Some(0));
    let page = text(&output.stdout);
    assert!(page.contains(".TH rfidl 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    assert!(page.contains("rfidl\\-completions(1)"), "{page}");

    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("man1");
    let output = rfidl(&["man", "--out", path_str(&out)]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let mut pages: Vec<String> = std::fs::read_dir(&out)
        .expect("pages")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    insta::assert_debug_snapshot!("man_pages", pages);
    let check = std::fs::read_to_string(out.join("rfidl-check.1")).expect("check page");
    let title = format!(".TH rfidl-check 1  \"rfidl {}\"", env!("CARGO_PKG_VERSION"));
    assert!(check.contains(&title), "{check}");
    assert!(
        check.contains("github"),
        "the formats are documented: {check}"
    );
    // A file where the folder should be: exit 2 with the place named.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, "").expect("write");
    let output = rfidl(&["man", "--out", path_str(&blocked)]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("cannot write the manual into"));
}

/// A loopback port nothing listens on.
#[cfg(feature = "registry")]
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

#[cfg(feature = "registry")]
#[test]
fn an_unreachable_registry_shows_the_cause() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    let output = rfidl(&["publish", "--registry", &url, "../schemas"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.starts_with(&format!("error: registry {url}/v1/interfaces/hr.employees.EmpService/v1: error sending request: ")),
        "{line}"
    );
    assert!(line.contains("tcp connect error"), "{line}");
    assert!(line.contains("Connection refused"), "{line}");

    let dir = tempfile::tempdir().expect("tempdir");
    let lock = dir.path().join("rfidl.lock");
    let cache = dir.path().join("cache");
    let output = rfidl(&[
        "fetch",
        "--format",
        "json",
        "--registry",
        &url,
        "--lock",
        path_str(&lock),
        "--cache",
        path_str(&cache),
        "hr.employees.EmpService@v2",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let message = lines[0]["message"].as_str().expect("message");
    assert!(message.contains("Connection refused"), "{message}");
}

#[cfg(feature = "registry")]
#[test]
fn the_registry_token_never_shows_in_help_or_errors() {
    const SECRET: &str = "cli-tok-5e1f-never-print";
    let url = format!("http://127.0.0.1:{}", closed_port());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rfidl"))
            .args(args)
            .env("RFIDL_REGISTRY_TOKEN", SECRET)
            .env_remove("RFIDL_REGISTRY")
            .output()
            .expect("run rfidl")
    };
    let help = run(&["publish", "--help"]);
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("RFIDL_REGISTRY_TOKEN"));
    for format in ["text", "json", "github"] {
        let failed = run(&[
            "publish",
            "--format",
            format,
            "--registry",
            &url,
            "../schemas",
        ]);
        assert_eq!(failed.status.code(), Some(2), "{format}");
        for output in [&help.stdout, &help.stderr, &failed.stdout, &failed.stderr] {
            assert!(!text(output).contains(SECRET), "{format}: {}", text(output));
        }
    } // The operator token of `decommission` / `recommission` likewise.
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rfidl"))
            .args(args)
            .env("RFIDL_REGISTRY_OPERATOR_TOKEN", SECRET)
            .env_remove("RFIDL_REGISTRY_OPERATOR_TOKEN_FILE")
            .env_remove("RFIDL_REGISTRY")
            .output()
            .expect("run rfidl")
    };
    let help = run(&["decommission", "--help"]);
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("RFIDL_REGISTRY_OPERATOR_TOKEN"));
    assert!(text(&help.stdout).contains("--operator-token-file"));
    let failed = run(&[
        "decommission",
        "--registry",
        &url,
        "hr.employees.EmpService@v1",
    ]);
    assert_eq!(failed.status.code(), Some(2));
    for output in [&help.stdout, &help.stderr, &failed.stdout, &failed.stderr] {
        assert!(!text(output).contains(SECRET), "{}", text(output));
    }
}
