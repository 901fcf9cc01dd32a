//! Generated code in a user's crate, the way a user's CI builds it.
//!
//! A scratch cargo workspace is written to a temporary directory outside
//! this one (its own `[workspace]` table, so cargo never takes it for a
//! member). Each member crate runs `rfidl_codegen::Builder` from its
//! `build.rs` over one case of the corpus (`schemas/`, the valid UI cases,
//! `tests/corpus/`), depends on `rfidl-codegen` (which compiles no clap:
//! the CLI is `rfidl-cli`) and on `rfidl-runtime`, and includes the output with
//! `include_contracts!()`. Then `cargo build` with `RUSTFLAGS=-D warnings`
//! and `cargo clippy -- -D warnings -W clippy::pedantic` must pass: any rustc
//! warning or clippy lint in generated code fails the test (two pedantic
//! lints about names the contract author chose are allowed, see below).
//!
//! The scratch builds share one persistent target directory,
//! `target/user-crate/` (like trybuild's `target/tests/`), so only the first
//! run compiles the runtime's dependencies; later runs rebuild the scratch
//! crates alone. `Cargo.lock` is this workspace's, and cargo runs
//! `--offline`: no network, the same dependency versions as the workspace.
//!
//! A second scratch crate has a broken contract: its build must fail with
//! the rendered diagnostic exactly once and a one-line summary, never the
//! escaped `Debug` dump of the error. A third is `docs/getting-started.md`,
//! file by file as the guide lists them: it must build and its two services
//! exchange a message. A fourth is `docs/stores.md`: one program per store
//! (SQLite written as before stores existed, PostgreSQL on the sqlx store
//! with the async `aio` impls and client); both must build, the SQLite one must run, and
//! the PostgreSQL one runs on two fresh databases when a server is
//! configured (`RFIDL_POSTGRES_URL`, docs/testing.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// The PostgreSQL test harness of the runtime's tests (a fresh database per
/// test); this file uses only `database()` and `url()`.
#[allow(dead_code)]
#[path = "../../../runtime/tests/it/support/postgres.rs"]
mod postgres;

/// One member crate of the scratch workspace.
struct Case {
    /// The crate's name (and folder).
    name: &'static str,
    /// Contract files or folders, relative to `codegen/`.
    roots: &'static [&'static str],
    /// The `Builder::sides` expression.
    sides: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "schemas_both",
        roots: &["../schemas"],
        sides: "Both",
    },
    Case {
        name: "schemas_service",
        roots: &["../schemas"],
        sides: "Service",
    },
    Case {
        name: "schemas_engine",
        roots: &["../schemas"],
        sides: "Engine",
    },
    Case {
        name: "edge_both",
        roots: &["tests/corpus/edge_cases.rfidl"],
        sides: "Both",
    },
    Case {
        name: "edge_service",
        roots: &["tests/corpus/edge_cases.rfidl"],
        sides: "Service",
    },
    Case {
        name: "edge_engine",
        roots: &["tests/corpus/edge_cases.rfidl"],
        sides: "Engine",
    },
    Case {
        name: "ui_diamond_imports",
        roots: &["../contract/tests/ui/ok_diamond_imports/main.rfidl"],
        sides: "Both",
    },
    Case {
        name: "ui_generated_names",
        roots: &["../contract/tests/ui/ok_generated_names_stay_distinct.rfidl"],
        sides: "Both",
    },
    Case {
        name: "ui_recursion",
        roots: &["../contract/tests/ui/ok_recursion_through_containers.rfidl"],
        sides: "Both",
    },
    Case {
        name: "ui_keywords",
        roots: &["../contract/tests/ui/ok_rust_keyword_names.rfidl"],
        sides: "Both",
    },
    Case {
        name: "ui_spec_example",
        roots: &["../contract/tests/ui/ok_spec_example/main.rfidl"],
        sides: "Both",
    },
    Case {
        name: "ui_dangling_doc",
        roots: &["../contract/tests/ui/w0001_dangling_doc_comment.rfidl"],
        sides: "Both",
    },
    Case {
        name: "ui_deprecated_use",
        roots: &["../contract/tests/ui/w0002_deprecated_use.rfidl"],
        sides: "Both",
    },
];

/// `<workspace>/target`, or `$CARGO_TARGET_DIR`.
fn workspace_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    )
}

fn absolute(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(relative)
        .canonicalize()
        .unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// Writes the scratch workspace's root: members, this workspace's lock file
/// and dev profile.
fn write_workspace(dir: &Path, members: &[&str]) {
    let members: Vec<String> = members.iter().map(|m| format!("{m:?}")).collect();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[workspace]\nresolver = \"3\"\nmembers = [{}]\n\n[profile.dev]\ndebug = \"line-tables-only\"\n",
            members.join(", ")
        ),
    )
    .expect("write workspace");
    std::fs::copy(absolute("../Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
}

/// Writes one member crate whose build script compiles `roots`.
fn write_member(dir: &Path, name: &str, roots: &[PathBuf], sides: &str, with_runtime: bool) {
    let crate_dir = dir.join(name);
    std::fs::create_dir_all(crate_dir.join("src")).expect("mkdir");
    let runtime = if with_runtime {
        format!(
            "rfidl-runtime = {{ path = {:?} }}\n",
            absolute("../runtime").display().to_string()
        )
    } else {
        String::new()
    };
    std::fs::write(
        crate_dir.join("Cargo.toml"),
        format!(
            "[package]\nname = {name:?}\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
             [dependencies]\n{runtime}\n\
             [build-dependencies]\n\
             rfidl-codegen = {{ path = {:?} }}\n",
            absolute(".").display().to_string()
        ),
    )
    .expect("write Cargo.toml");
    let roots: Vec<String> = roots
        .iter()
        .map(|r| format!("{:?}", r.display().to_string()))
        .collect();
    std::fs::write(
        crate_dir.join("build.rs"),
        format!(
            "//! Generates the contracts, as a user's build script does.\n\n\
             fn main() -> Result<(), Box<dyn std::error::Error>> {{\n    \
             rfidl_codegen::Builder::new()\n        \
             .sides(rfidl_codegen::Sides::{sides})\n        \
             .compile(&[{}])?;\n    \
             Ok(())\n}}\n",
            roots.join(", ")
        ),
    )
    .expect("write build.rs");
    let lib = if with_runtime {
        "//! Generated code for one case of the corpus.\n\nrfidl_runtime::include_contracts!();\n"
    } else {
        "//! A crate whose build script fails.\n"
    };
    std::fs::write(crate_dir.join("src/lib.rs"), lib).expect("write lib.rs");
}

/// `cargo <args>` in `dir`, with the shared target directory and
/// `RUSTFLAGS=-D warnings`, whatever the environment of this test holds.
fn cargo(dir: &Path, args: &[&str]) -> Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let (subcommand, rest) = args.split_first().expect("a cargo subcommand");
    Command::new(cargo)
        .arg(subcommand)
        .args(["--offline", "--quiet", "--color", "never", "--keep-going"])
        .args(rest)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", workspace_target().join("user-crate"))
        .env("RUSTFLAGS", "-D warnings")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .output()
        .expect("run cargo")
}

fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn generated_code_passes_deny_warnings_and_clippy_in_a_user_crate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    write_workspace(dir.path(), &names);
    for case in CASES {
        let roots: Vec<PathBuf> = case.roots.iter().map(|r| absolute(r)).collect();
        write_member(dir.path(), case.name, &roots, case.sides, true);
    }

    let started = Instant::now();
    let build = cargo(dir.path(), &["build", "--workspace"]);
    assert_success("cargo build with RUSTFLAGS=-D warnings", &build);
    let built = started.elapsed();

    let started = Instant::now();
    let clippy = cargo(
        dir.path(),
        &[
            "clippy",
            "--workspace",
            "--",
            "-D",
            "warnings",
            "-W",
            "clippy::pedantic",
            // Pedantic lints on names the contract author chose (parameters
            // `a` to `h`, a field `_`): generated code keeps contract names,
            // and `rfidl check` owns the naming rules (E0050, E0051).
            "-A",
            "clippy::many_single_char_names",
            "-A",
            "clippy::pub_underscore_fields",
        ],
    );
    assert_success("cargo clippy -- -D warnings -W clippy::pedantic", &clippy);
    eprintln!(
        "user crates: build {:.1} s, clippy {:.1} s ({} cases)",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        CASES.len()
    );
}

#[test]
fn a_broken_contract_fails_the_build_with_its_diagnostic_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let contract = dir.path().join("broken.rfidl");
    std::fs::write(
        &contract,
        "package broken;\n\nrecord Order {\n    total: Monye,\n    lines: list<Strng>,\n}\n\nrecord Money { amount: decimal }\n",
    )
    .expect("write contract");
    write_workspace(dir.path(), &["broken"]);
    write_member(dir.path(), "broken", &[contract], "Both", false);

    let build = cargo(dir.path(), &["build", "--workspace"]);
    assert!(
        !build.status.success(),
        "a broken contract must fail the build"
    );
    let stderr = String::from_utf8_lossy(&build.stderr);
    for diagnostic in [
        "error[E0010]: unknown type `Monye`",
        "error[E0010]: unknown type `Strng`",
    ] {
        assert_eq!(
            stderr.matches(diagnostic).count(),
            1,
            "`{diagnostic}` must be shown exactly once:\n{stderr}"
        );
    }
    assert_eq!(
        stderr.matches("  --> ").count(),
        2,
        "each diagnostic's location once:\n{stderr}"
    );
    assert!(
        !stderr.contains("\\n") && !stderr.contains("Contract("),
        "no escaped Debug dump of the error:\n{stderr}"
    );
    let summary: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("Error: "))
        .collect();
    assert_eq!(
        summary,
        ["Error: rfidl: 2 errors in the contracts, see the diagnostics above"],
        "the build stops with a one-line summary:\n{stderr}"
    );
}

/// The files `docs/getting-started.md` tells a new user to write: every code
/// block whose paragraph starts with a backticked path and a colon.
fn guide_files(markdown: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut rest = markdown;
    while let Some(start) = rest.find("\n```") {
        let before = &rest[..start];
        let paragraph = before.rsplit("\n\n").next().unwrap_or_default();
        let after_fence = &rest[start + 4..];
        let body_start = after_fence.find('\n').expect("fence line") + 1;
        let body = &after_fence[body_start..];
        let end = body.find("```").expect("closed code block");
        if let Some(path) = paragraph
            .strip_prefix('`')
            .and_then(|p| p.split_once("`:"))
            .map(|(path, _)| path)
        {
            files.push((path.to_owned(), body[..end].to_owned()));
        }
        rest = &body[end + 3..];
    }
    files
}

#[test]
fn the_getting_started_guide_runs() {
    let guide = std::fs::read_to_string(absolute("../docs/getting-started.md")).expect("guide");
    let files = guide_files(&guide);
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "Cargo.toml",
            "contracts/hello.rfidl",
            "build.rs",
            "src/main.rs"
        ]
    );
    let dir = tempfile::tempdir().expect("tempdir");
    write_guide(dir.path(), &files);

    let run = cargo(dir.path(), &["run"]);
    assert_success("cargo run of the getting-started crate", &run);
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "engine received: Ada"
    );
}

/// Writes the files of a guide into `dir`, `/path/to/rfidl` pointing at this
/// checkout, with this workspace's lock file.
fn write_guide(dir: &Path, files: &[(String, String)]) {
    let root = absolute("..").display().to_string();
    for (path, contents) in files {
        let mut contents = contents.replace("/path/to/rfidl", &root);
        if path == "Cargo.toml" {
            // Not part of the guide: keep cargo from looking for an
            // enclosing workspace, and build like this workspace does.
            contents.push_str("\n[workspace]\n\n[profile.dev]\ndebug = \"line-tables-only\"\n");
        }
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, contents).expect("write");
    }
    std::fs::copy(absolute("../Cargo.lock"), dir.join("Cargo.lock")).expect("lock");
}

/// The lines `<name>: desk <n>` a stores program prints: Ada and Grace, at
/// desks 1 and 2 in either order (the engine numbers them as it handles
/// them).
fn assert_seated(program: &str, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut names = Vec::new();
    let mut desks = Vec::new();
    for line in stdout.lines() {
        let (name, desk) = line
            .split_once(": desk ")
            .unwrap_or_else(|| panic!("{program}: unexpected line {line:?} in:\n{stdout}"));
        names.push(name.to_owned());
        desks.push(
            desk.parse::<i64>()
                .unwrap_or_else(|e| panic!("{program}: {line:?}: {e}")),
        );
    }
    desks.sort_unstable();
    assert_eq!(names, ["Ada", "Grace"], "{program}:\n{stdout}");
    assert_eq!(desks, [1, 2], "{program}:\n{stdout}");
}

#[test]
fn the_stores_guide_runs() {
    let guide = std::fs::read_to_string(absolute("../docs/stores.md")).expect("guide");
    let files = guide_files(&guide);
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "Cargo.toml",
            "contracts/hello.rfidl",
            "build.rs",
            "src/lib.rs",
            "src/bin/sqlite.rs",
            "src/bin/postgres.rs"
        ]
    );
    let (_, sqlite) = &files[4];
    let (_, postgres) = &files[5];
    // What the guide claims: the SQLite program names no store, the
    // PostgreSQL one implements the async traits for `sqlx::Postgres` on the
    // transaction's connection and enqueues twice through one sqlx `&mut tx`.
    assert!(!sqlite.contains("Postgres") && !sqlite.contains("Sqlite"));
    for expected in [
        "impl aio::EngineHandler<Postgres> for FrontDesk",
        "impl aio::EngineAnswers<Postgres> for Newcomers",
        "conn: &mut PgConnection",
        "aio::EngineClient::new(service.outbox().clone(), \"engine\")",
        "client.joined(&mut tx, name.into()).await",
    ] {
        assert!(
            postgres.contains(expected),
            "docs/stores.md: no `{expected}`"
        );
    }

    let dir = tempfile::tempdir().expect("tempdir");
    write_guide(dir.path(), &files);
    // The guide's Rust is laid out as `cargo fmt` would (readers copy it).
    let rustfmt = Command::new("rustfmt")
        .args(["--edition", "2024", "--check"])
        .args([
            "build.rs",
            "src/lib.rs",
            "src/bin/sqlite.rs",
            "src/bin/postgres.rs",
        ])
        .current_dir(dir.path())
        .output()
        .expect("run rustfmt");
    assert_success("rustfmt --check of docs/stores.md", &rustfmt);
    let started = Instant::now();
    let build = cargo(dir.path(), &["build", "--bins"]);
    assert_success("cargo build of the stores crate", &build);
    let built = started.elapsed();

    let run = cargo(dir.path(), &["run", "--bin", "sqlite"]);
    assert_success("cargo run --bin sqlite", &run);
    assert_seated("sqlite", &run);

    let (Some(service), Some(engine)) = (postgres::database(), postgres::database()) else {
        eprintln!("stores crate: build {:.1} s", built.as_secs_f64());
        return;
    };
    let started = Instant::now();
    let run = cargo(
        dir.path(),
        &[
            "run",
            "--bin",
            "postgres",
            "--",
            service.url(),
            engine.url(),
        ],
    );
    assert_success("cargo run --bin postgres", &run);
    assert_seated("postgres", &run);
    eprintln!(
        "stores crate: build {:.1} s, PostgreSQL run {:.1} s",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
