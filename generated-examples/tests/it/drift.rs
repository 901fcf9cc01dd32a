//! The checked-in `src/generated/` (and `examples/generated/`) must be
//! exactly what the generator produces for `schemas/` (and
//! `examples/contracts/`) today (`cargo xtask regen` rewrites both). This is
//! the one pin of the generated code and manifests: a change to a template
//! shows up as a diff of these files, reviewed like any other.

use std::path::{Path, PathBuf};

/// The files the generator writes for the contracts under `contracts`,
/// against those checked in under `out`: (changed or missing, not generated).
fn drift(contracts: &str, out: &str) -> (Vec<String>, Vec<PathBuf>) {
    let outcome =
        rfidl_codegen::check::check_paths(&[PathBuf::from(contracts)]).expect("contracts readable");
    assert!(!outcome.has_errors(), "{}", outcome.render_human());
    let model = outcome.model.expect("model");
    let files = rfidl_codegen::generate::generate_files(
        &model.packages,
        &rfidl_codegen::Options::default(),
        rfidl_codegen::generate::Layout::SourceDir,
    )
    .expect("generate");
    let dir = Path::new(out);
    let mut stale = Vec::new();
    for file in &files {
        let on_disk = std::fs::read_to_string(dir.join(&file.name)).unwrap_or_default();
        if on_disk != file.contents {
            stale.push(file.name.clone());
        }
    }
    let expected: std::collections::BTreeSet<PathBuf> =
        files.iter().map(|file| PathBuf::from(&file.name)).collect();
    let mut extra = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).expect("read the generated folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(dir)
                && !expected.contains(relative)
            {
                extra.push(relative.to_path_buf());
            }
        }
    }
    (stale, extra)
}

#[test]
fn checked_in_code_matches_the_generator() {
    for (contracts, out) in [
        ("../schemas", "src/generated"),
        ("examples/contracts", "examples/generated"),
    ] {
        let (stale, extra) = drift(contracts, out);
        assert!(
            stale.is_empty() && extra.is_empty(),
            "{out} is stale (changed or missing: {stale:?}; not generated: {extra:?}): \
             run `cargo xtask regen`"
        );
    }
}
