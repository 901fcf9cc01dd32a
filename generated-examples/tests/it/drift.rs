//! The checked-in `src/generated/` must be exactly what the generator
//! produces for `schemas/` today (`cargo xtask regen` rewrites it).

use std::path::{Path, PathBuf};

#[test]
fn checked_in_code_matches_the_generator() {
    let outcome = rfidl_codegen::check::check_paths(&[PathBuf::from("../schemas")])
        .expect("schemas readable");
    assert!(!outcome.has_errors(), "{}", outcome.render_human());
    let model = outcome.model.expect("model");
    let files = rfidl_codegen::generate::generate_files(
        &model.packages,
        &rfidl_codegen::Options::default(),
        rfidl_codegen::generate::Layout::SourceDir,
    )
    .expect("generate");
    let dir = Path::new("src/generated");
    let mut stale = Vec::new();
    for file in &files {
        let on_disk = std::fs::read_to_string(dir.join(&file.name)).unwrap_or_default();
        if on_disk != file.contents {
            stale.push(file.name.clone());
        }
    }
    assert!(
        stale.is_empty(),
        "generated-examples is stale ({stale:?}): run `cargo xtask regen`"
    );
}
