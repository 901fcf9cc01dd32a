//! `rfidl check`: checks contracts and reports every problem.

use std::path::PathBuf;

use crate::report::{DiagnosticFormat, Outcome, Report, checked, plural};

/// `rfidl check`: diagnostics as `report` says, then (text and github) a
/// summary line on stderr.
pub fn check(paths: &[PathBuf], report: &Report) -> Outcome {
    let format = report.format;
    match checked(paths, report) {
        Ok(outcome) => {
            if format != DiagnosticFormat::Json {
                let files = outcome.read_paths.len();
                let services = outcome.model.as_ref().map_or(0, |m| m.manifests().count());
                let warnings = outcome.diagnostics.len();
                let warnings = match warnings {
                    0 => String::new(),
                    n => format!(", {n} warning{}", plural(n)),
                };
                eprintln!(
                    "checked {files} file{} ({services} service version{}): no errors{warnings}",
                    plural(files),
                    plural(services)
                );
            }
            Outcome::Success
        }
        Err(outcome) => outcome,
    }
}
