//! `rfidl manifest`: prints the manifest of every service version.

use std::io::Write as _;
use std::path::PathBuf;

use crate::report::{Outcome, Report, checked};

/// The format of the printed manifests (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestFormat {
    /// `json`: one pretty-printed JSON array of every manifest.
    Json,
    /// `yaml`: the same array as YAML.
    Yaml,
}

/// `rfidl manifest`.
/// The manifests go to stdout; diagnostics are reported by `report`.
pub fn manifest(paths: &[PathBuf], format: ManifestFormat, report: &Report) -> Outcome {
    let outcome = match checked(paths, report) {
        Ok(outcome) => outcome,
        Err(outcome) => return outcome,
    };
    let model = outcome.model.expect("no errors means a model");
    let mut stdout = std::io::stdout().lock();
    let manifests: Vec<_> = model.manifests().collect();
    let _ = match format {
        ManifestFormat::Json => writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&manifests).expect("manifests always serialise")
        ),
        ManifestFormat::Yaml => write!(
            stdout,
            "{}",
            yaml_serde::to_string(&manifests).expect("manifests always serialise")
        ),
    };
    Outcome::Success
}
