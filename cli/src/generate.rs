//! `rfidl generate`: the code `Builder` writes in a build script, into a
//! folder of the user's choice.

use std::path::{Path, PathBuf};

use rfidl_codegen::generate::{self, Layout, Options, Sides};
use rfidl_codegen::output::write_if_changed;

use crate::report::{Outcome, Report, checked};

/// `rfidl generate --out DIR`.
pub fn generate(paths: &[PathBuf], out: &Path, sides: Sides, report: &Report) -> Outcome {
    let outcome = match checked(paths, report) {
        Ok(outcome) => outcome,
        Err(outcome) => return outcome,
    };
    let model = outcome.model.expect("no errors means a model");
    let mut options = Options::default();
    options.sides = sides;
    let files = match generate::generate_files(&model.packages, &options, Layout::SourceDir) {
        Ok(files) => files,
        Err(error) => {
            report.error(&error.to_string());
            return Outcome::UsageOrIo;
        }
    };
    let mut written = 0;
    for file in &files {
        match write_if_changed(&out.join(&file.name), &file.contents) {
            Ok(true) => written += 1,
            Ok(false) => {}
            Err(error) => {
                report.error(&format!(
                    "cannot write {}: {error}",
                    out.join(&file.name).display()
                ));
                return Outcome::UsageOrIo;
            }
        }
    }
    report.progress(
        &format!(
            "generated {} files into {} ({written} changed)",
            files.len(),
            out.display()
        ),
        || {
            serde_json::json!({
                "event": "generated",
                "files": files.len(),
                "changed": written,
                "out": out.display().to_string(),
            })
        },
    );
    Outcome::Success
}
