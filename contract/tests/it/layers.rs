//! The layer order of `contract/src` stated in ARCHITECTURE.md: a module
//! uses only the layers below it. Read from the source, so a new `use` that
//! reaches up (the parser into the checker, the manifest into the model)
//! fails here. The generator's layers are tested in `codegen/tests/it`.

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
    let allowed: &[(&str, &[&str])] = &[
        ("diagnostics.rs", &[]),
        ("limits.rs", &[]),
        ("names.rs", &[]),
        ("manifest", &["limits"]),
        ("syntax", &["diagnostics", "limits"]),
        ("model.rs", &["manifest"]),
        (
            "check",
            &[
                "diagnostics",
                "syntax",
                "model",
                "manifest",
                "names",
                "limits",
            ],
        ),
        // The manifest validator applies the checker's rules to manifests.
        (
            "validate",
            &[
                "check",
                "diagnostics",
                "syntax",
                "manifest",
                "names",
                "limits",
            ],
        ),
        ("format", &["diagnostics", "syntax"]),
        ("wire.rs", &[]),
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
