//! The layer order of `codegen/src` stated in ARCHITECTURE.md: a module
//! uses only the layers below it (and the contract language, re-exported
//! from `rfidl-contract`). Read from the source, so a new `use` that reaches
//! up (the generator into the build-script front door) fails here. The
//! language's own layers are tested in `contract/tests/it/layers.rs`.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `path` (or `path` itself).
fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).expect("read_dir") {
        files.extend(sources(&entry.expect("entry").path()));
    }
    files
}

/// The `crate::<module>` paths the code (not the doc comments) of `module` names.
fn uses(module: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for file in sources(&Path::new("src").join(module)) {
        let text = std::fs::read_to_string(&file).expect("read");
        for line in text.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for (index, _) in code.match_indices("crate::") {
                let rest = &code[index + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                found.push((file.display().to_string(), name));
            }
        }
    }
    found
}

#[test]
fn each_module_uses_only_the_layers_below_it() {
    // `manifest`, `names`, `validate`, `check`… are rfidl-contract's,
    // re-exported at this crate's root.
    let allowed: &[(&str, &[&str])] = &[
        ("output.rs", &[]),
        ("generate", &["manifest", "names"]),
        ("registry", &["manifest", "output", "validate"]),
        (
            "builder.rs",
            &["check", "generate", "manifest", "output", "registry"],
        ),
    ];
    let mut violations = Vec::new();
    for (module, below) in allowed {
        for (file, used) in uses(module) {
            let own = module.trim_end_matches(".rs");
            if used != own && !below.contains(&used.as_str()) {
                violations.push(format!("{file} uses crate::{used}"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layer order broken (see ARCHITECTURE.md):\n{}",
        violations.join("\n")
    );
}

/// The normal (not dev) dependencies of `package`, one name per line, as
/// `cargo tree` resolves them from this workspace's lock file.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .current_dir("..")
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package])
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A build script that uses rfidl-codegen compiles no flag parsing: clap,
/// clap_complete and clap_mangen are rfidl-cli's alone, with or without the
/// registry client.
#[test]
fn build_scripts_compile_no_clap() {
    let dependencies = normal_dependencies("rfidl-codegen");
    assert!(dependencies.iter().any(|d| d == "rfidl-contract"));
    let clap: Vec<_> = dependencies
        .iter()
        .filter(|d| d.starts_with("clap"))
        .collect();
    assert!(clap.is_empty(), "rfidl-codegen pulls in {clap:?}");
}

/// The registry server uses the language (manifests, validation,
/// compatibility) and never the generator: no rfidl-codegen, no
/// prettyplease, no askama templates of generated code in its build.
#[test]
fn the_registry_depends_on_the_contract_not_the_generator() {
    let dependencies = normal_dependencies("rfidl-registry");
    assert!(dependencies.iter().any(|d| d == "rfidl-contract"));
    let generator: Vec<_> = dependencies
        .iter()
        .filter(|d| ["rfidl-codegen", "rfidl-cli", "prettyplease"].contains(&d.as_str()))
        .collect();
    assert!(
        generator.is_empty(),
        "rfidl-registry pulls in {generator:?}"
    );
}
