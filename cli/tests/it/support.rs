//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};

use rfidl_codegen::check::check_paths;
use rfidl_codegen::manifest::Manifest;
use rfidl_codegen::model::Model;

/// The checked model of `roots`; fails the test on any contract error.
pub fn model_of(roots: &[PathBuf]) -> Model {
    let outcome = check_paths(roots).expect("readable");
    assert!(!outcome.has_errors(), "{}", outcome.render_human());
    outcome.model.expect("no errors")
}

/// Every manifest of `roots`.
pub fn manifests_of(roots: &[PathBuf]) -> Vec<Manifest> {
    model_of(roots).manifests().cloned().collect()
}

/// Writes `hr` as `dir/hr.rfidl`, with the real `common` package beside it
/// (which it imports), and returns its path.
pub fn write_hr(dir: &Path, hr: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("common")).expect("mkdir");
    std::fs::copy(
        "../schemas/common/common.rfidl",
        dir.join("common/common.rfidl"),
    )
    .expect("copy");
    let path = dir.join("hr.rfidl");
    std::fs::write(&path, hr).expect("write");
    path
}
