//! What the `rfidl` subcommands do, as library functions (the binary only
//! parses flags). Each prints to stdout/stderr and returns an [`Outcome`].

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::builder::{Options, Sides, write_if_changed};
use crate::check::{self, CheckOutcome};
use crate::diagnostics::{self, ColorChoice};
use crate::generate::{self, Layout};

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
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::ContractErrors => 1,
            Outcome::UsageOrIo => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagnosticFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestFormat {
    Json,
    Yaml,
}

/// Checks and prints diagnostics; `Err` carries the outcome to return.
fn checked(
    paths: &[PathBuf],
    format: DiagnosticFormat,
    color: ColorChoice,
) -> Result<CheckOutcome, Outcome> {
    let outcome = check::check_paths(paths).map_err(|error| {
        eprintln!("error: {error}");
        Outcome::UsageOrIo
    })?;
    match format {
        DiagnosticFormat::Human => {
            let _ =
                diagnostics::emit_human_to_stderr(&outcome.sources, &outcome.diagnostics, color);
        }
        DiagnosticFormat::Json => {
            let mut stdout = std::io::stdout().lock();
            for diagnostic in &outcome.diagnostics {
                let _ = writeln!(
                    stdout,
                    "{}",
                    diagnostics::render_json(&outcome.sources, diagnostic)
                );
            }
        }
    }
    let mut stderr = std::io::stderr().lock();
    if outcome.has_errors() {
        let errors = outcome.diagnostics.iter().filter(|d| d.is_error()).count();
        if format == DiagnosticFormat::Human {
            let _ = writeln!(
                stderr,
                "error: could not check contracts due to {errors} previous error{}",
                plural(errors)
            );
        }
        return Err(Outcome::ContractErrors);
    }
    Ok(outcome)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `rfidl check`.
pub fn check(paths: &[PathBuf], format: DiagnosticFormat, color: ColorChoice) -> Outcome {
    match checked(paths, format, color) {
        Ok(outcome) => {
            if format == DiagnosticFormat::Human {
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

/// `rfidl generate --out DIR`.
pub fn generate(paths: &[PathBuf], out: &Path, sides: Sides) -> Outcome {
    let outcome = match checked(paths, DiagnosticFormat::Human, ColorChoice::Auto) {
        Ok(outcome) => outcome,
        Err(outcome) => return outcome,
    };
    let model = outcome.model.expect("no errors means a model");
    let options = Options {
        sides,
        ..Options::default()
    };
    let files = match generate::generate_files(&model.packages, &options, Layout::SourceDir) {
        Ok(files) => files,
        Err(error) => {
            eprintln!("error: {error}");
            return Outcome::UsageOrIo;
        }
    };
    let mut written = 0;
    for file in &files {
        match write_if_changed(&out.join(&file.name), &file.contents) {
            Ok(true) => written += 1,
            Ok(false) => {}
            Err(error) => {
                eprintln!(
                    "error: cannot write {}: {error}",
                    out.join(&file.name).display()
                );
                return Outcome::UsageOrIo;
            }
        }
    }
    eprintln!(
        "generated {} files into {} ({written} changed)",
        files.len(),
        out.display()
    );
    Outcome::Success
}

/// `rfidl manifest`.
pub fn manifest(paths: &[PathBuf], format: ManifestFormat) -> Outcome {
    let outcome = match checked(paths, DiagnosticFormat::Human, ColorChoice::Auto) {
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
            serde_yaml::to_string(&manifests).expect("manifests always serialise")
        ),
    };
    Outcome::Success
}

/// What `rfidl fmt` does with a file whose layout is not canonical.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FmtMode {
    /// Rewrite it in place.
    Write,
    /// List it and exit 1 (`--check`).
    Check,
}

/// `rfidl fmt [--check]`.
pub fn fmt(paths: &[PathBuf], mode: FmtMode) -> Outcome {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            match check::load::contract_files(path) {
                Ok(found) => files.extend(found),
                Err(error) => {
                    eprintln!("error: {error}");
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
                eprintln!("error: cannot read {}: {error}", path.display());
                return Outcome::UsageOrIo;
            }
        };
        let formatted = match crate::format::format_source(&text) {
            Ok(formatted) => formatted,
            Err(diagnostic) => {
                let mut sources = diagnostics::SourceMap::new();
                sources.add(path.display().to_string(), &path, text);
                eprint!("{}", diagnostics::render_human(&sources, &diagnostic));
                outcome = Outcome::ContractErrors;
                continue;
            }
        };
        if formatted == text {
            continue;
        }
        match mode {
            FmtMode::Check => {
                println!("{}", path.display());
                outcome = Outcome::ContractErrors;
            }
            FmtMode::Write => {
                if let Err(error) = std::fs::write(&path, formatted) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    return Outcome::UsageOrIo;
                }
            }
        }
    }
    outcome
}
