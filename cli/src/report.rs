//! How a subcommand reports: the [`Outcome`] (the exit code), the
//! `--format` ([`DiagnosticFormat`]) and the [`Report`] that prints
//! diagnostics, errors, warnings and results in it. Every subcommand goes
//! through here; none prints a diagnostic itself.

use std::io::Write as _;
use std::path::PathBuf;

use rfidl_codegen::check::{self, CheckOutcome};
use rfidl_codegen::diagnostics::{self, ColorChoice};

use crate::breaking::VersionChange;

/// How a command ended; maps to the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 0: success.
    Success,
    /// 1: the contracts have errors.
    ContractErrors,
    /// 2: bad usage or an I/O problem.
    UsageOrIo,
}

impl Outcome {
    /// The process exit code: 0, 1 or 2 (see the variants).
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::ContractErrors => 1,
            Outcome::UsageOrIo => 2,
        }
    }
}

/// How diagnostics and results are printed (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiagnosticFormat {
    /// `text`: rustc-style diagnostics and sentences, on stderr.
    #[default]
    Human,
    /// `json`: one JSON object per line on stdout (diagnostics as
    /// [`diagnostics::render_json`]; other errors as `{"severity": "error",
    /// "code": null, "message": …}`; results with an `event` member).
    Json,
    /// `github`: GitHub Actions workflow commands on stdout (`::error
    /// file=…,line=…,col=…,title=E0010::…`) for every error and warning;
    /// progress stays text on stderr.
    Github,
}

/// How a subcommand reports: `--format` and `--color`. What the `json`
/// and `github` formats print goes to stdout, or into memory for a
/// [`Report::capturing`] one.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// What diagnostics, errors and results are printed as, and where.
    pub format: DiagnosticFormat,
    /// Whether text on stderr is coloured (`auto`: when stderr is a
    /// terminal and `NO_COLOR` is unset); never affects stdout.
    pub color: ColorChoice,
    captured: Option<std::sync::Arc<std::sync::Mutex<String>>>,
}

impl Report {
    /// A report that prints in `format` to stdout and stderr, text
    /// coloured as `color` says.
    pub fn new(format: DiagnosticFormat, color: ColorChoice) -> Self {
        Self {
            format,
            color,
            captured: None,
        }
    }

    /// A report that keeps its stdout lines in memory (see
    /// [`Report::captured`]), so a program or a test can read what a
    /// subcommand reported. Text on stderr still goes to stderr.
    pub fn capturing(format: DiagnosticFormat) -> Self {
        Self {
            format,
            color: ColorChoice::Never,
            captured: Some(std::sync::Arc::default()),
        }
    }

    /// The stdout lines of a [`Report::capturing`] report so far (empty
    /// for another).
    pub fn captured(&self) -> String {
        self.captured.as_ref().map_or_else(String::new, |c| {
            c.lock().unwrap_or_else(|p| p.into_inner()).clone()
        })
    }

    /// One line on stdout (or into the capture).
    pub(crate) fn stdout_line(&self, line: &str) {
        match &self.captured {
            Some(captured) => {
                let mut captured = captured.lock().unwrap_or_else(|p| p.into_inner());
                captured.push_str(line);
                captured.push('\n');
            }
            None => {
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
        }
    }

    /// `error` in red (bold) when text is coloured.
    pub(crate) fn error_word(&self) -> &'static str {
        if self.color.colors_stderr() {
            "\x1b[1;31merror\x1b[0m"
        } else {
            "error"
        }
    }

    /// An error that is not a diagnostic (I/O, usage, network), in the
    /// chosen format.
    pub fn error(&self, message: &str) {
        match self.format {
            DiagnosticFormat::Human => eprintln!("{}: {message}", self.error_word()),
            DiagnosticFormat::Json => self.json_line(&serde_json::json!({
                "severity": "error",
                "code": null,
                "message": message,
            })),
            DiagnosticFormat::Github => {
                self.stdout_line(&diagnostics::github_command("error", &[], message));
            }
        }
    }

    /// A warning that is not a diagnostic (a stale pin, an unreachable
    /// registry), in the chosen format.
    pub fn warning(&self, message: &str) {
        match self.format {
            DiagnosticFormat::Human => eprintln!("{}: {message}", self.warning_word()),
            DiagnosticFormat::Json => self.json_line(&serde_json::json!({
                "severity": "warning",
                "code": null,
                "message": message,
            })),
            DiagnosticFormat::Github => {
                self.stdout_line(&diagnostics::github_command("warning", &[], message));
            }
        }
    }

    /// `warning` in yellow (bold) when text is coloured.
    fn warning_word(&self) -> &'static str {
        if self.color.colors_stderr() {
            "\x1b[1;33mwarning\x1b[0m"
        } else {
            "warning"
        }
    }

    /// A sentence about progress or a result: stderr in `text` and
    /// `github`, nothing in `json` (which prints `json` instead).
    pub(crate) fn progress(&self, text: &str, json: impl FnOnce() -> serde_json::Value) {
        match self.format {
            DiagnosticFormat::Human | DiagnosticFormat::Github => eprintln!("{text}"),
            DiagnosticFormat::Json => self.json_line(&json()),
        }
    }

    pub(crate) fn json_line(&self, value: &impl serde::Serialize) {
        self.stdout_line(&serde_json::to_string(value).expect("reports always serialise"));
    }

    /// Diagnostics of `sources`, in the chosen format.
    pub fn diagnostics(&self, sources: &diagnostics::SourceMap, found: &[diagnostics::Diagnostic]) {
        match self.format {
            DiagnosticFormat::Human => {
                let _ = diagnostics::emit_human_to_stderr(sources, found, self.color);
            }
            DiagnosticFormat::Json => {
                for diagnostic in found {
                    self.stdout_line(&diagnostics::render_json(sources, diagnostic));
                }
            }
            DiagnosticFormat::Github => {
                for diagnostic in found {
                    self.stdout_line(&diagnostics::render_github(sources, diagnostic));
                }
            }
        }
    }

    /// Breaking changes: `error[B0009]: …` lines, JSON objects
    /// (`{"interface", "version", "code", "path", "message"}`) or
    /// annotations titled with the code.
    pub(crate) fn changes(&self, changes: &[VersionChange]) {
        match self.format {
            DiagnosticFormat::Human => {
                let mut stderr = std::io::stderr().lock();
                for change in changes {
                    let _ = writeln!(
                        stderr,
                        "{}[{}]: {}: {}\n  = in {} v{}",
                        self.error_word(),
                        change.change.code,
                        change.change.path,
                        change.change.message,
                        change.interface,
                        change.version
                    );
                }
            }
            DiagnosticFormat::Json => {
                for change in changes {
                    self.json_line(change);
                }
            }
            DiagnosticFormat::Github => {
                for change in changes {
                    let message = format!(
                        "{} v{}: {}: {}",
                        change.interface, change.version, change.change.path, change.change.message
                    );
                    let title = format!("title={}", change.change.code);
                    self.stdout_line(&diagnostics::github_command("error", &[title], &message));
                }
            }
        }
    }
}

/// Checks and prints diagnostics; `Err` carries the outcome to return.
pub(crate) fn checked(paths: &[PathBuf], report: &Report) -> Result<CheckOutcome, Outcome> {
    let outcome = check::check_paths(paths).map_err(|error| {
        report.error(&error.to_string());
        Outcome::UsageOrIo
    })?;
    report.diagnostics(&outcome.sources, &outcome.diagnostics);
    if outcome.has_errors() {
        let errors = outcome.diagnostics.iter().filter(|d| d.is_error()).count();
        if report.format != DiagnosticFormat::Json {
            eprintln!(
                "{}: could not check contracts due to {errors} previous error{}",
                report.error_word(),
                plural(errors)
            );
        }
        return Err(Outcome::ContractErrors);
    }
    Ok(outcome)
}

pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
