//! `rfidl fmt`: rewrites contracts in the canonical layout, or lists the
//! files that are not in it (`--check`).

use std::path::PathBuf;

use rfidl_codegen::check;
use rfidl_codegen::diagnostics;

use crate::report::{DiagnosticFormat, Outcome, Report};

/// What `rfidl fmt` does with a file whose layout is not canonical.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FmtMode {
    /// Rewrite it in place.
    Write,
    /// List it and exit 1 (`--check`).
    Check,
}

/// `rfidl fmt [--check]`. `--check` lists each file that is not formatted
/// (text: its path on stdout; json: `{"event": "unformatted", "file"}`;
/// github: an error annotation on the file); a rewrite reports each file it
/// changed (text: nothing; json: `{"event": "formatted", "file"}`).
pub fn fmt(paths: &[PathBuf], mode: FmtMode, report: &Report) -> Outcome {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            match check::load::contract_files(path) {
                Ok(found) => files.extend(found),
                Err(error) => {
                    report.error(&error.to_string());
                    return Outcome::UsageOrIo;
                }
            }
        } else {
            files.push(path.clone());
        }
    }
    let mut outcome = Outcome::Success;
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) => {
                report.error(&format!("cannot read {}: {error}", path.display()));
                return Outcome::UsageOrIo;
            }
        };
        let formatted = match rfidl_codegen::format::format_source(&text) {
            Ok(formatted) => formatted,
            Err(diagnostic) => {
                let mut sources = diagnostics::SourceMap::new();
                sources.add(path.display().to_string(), &path, text);
                report.diagnostics(&sources, std::slice::from_ref(&diagnostic));
                outcome = Outcome::ContractErrors;
                continue;
            }
        };
        if formatted == text {
            continue;
        }
        let shown = path.display().to_string();
        match mode {
            FmtMode::Check => {
                match report.format {
                    DiagnosticFormat::Human => report.stdout_line(&shown),
                    DiagnosticFormat::Json => report
                        .json_line(&serde_json::json!({"event": "unformatted", "file": shown})),
                    DiagnosticFormat::Github => report.stdout_line(&diagnostics::github_command(
                        "error",
                        &[
                            format!("file={}", diagnostics::github_property(&shown)),
                            "title=rfidl fmt".to_owned(),
                        ],
                        "not in the canonical layout; run `rfidl fmt` on it",
                    )),
                }
                outcome = Outcome::ContractErrors;
            }
            FmtMode::Write => {
                if let Err(error) = std::fs::write(&path, formatted) {
                    report.error(&format!("cannot write {shown}: {error}"));
                    return Outcome::UsageOrIo;
                }
                if report.format == DiagnosticFormat::Json {
                    report.json_line(&serde_json::json!({"event": "formatted", "file": shown}));
                }
            }
        }
    }
    outcome
}
