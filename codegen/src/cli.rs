//! What the `rfidl` subcommands do, as library functions (the binary only
//! parses flags). Each prints to stdout/stderr and returns an [`Outcome`].
//!
//! Every subcommand that reports takes a [`Report`]: the format
//! (`text`: rustc-style on stderr; `json`: one object per line on stdout;
//! `github`: GitHub Actions annotations on stdout for what failed, text on
//! stderr for the rest) and whether text is coloured.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::check::{self, CheckOutcome};
use crate::diagnostics::{self, ColorChoice};
use crate::generate::{self, Layout};
use crate::generate::{Options, Sides};
use crate::manifest::Manifest;
use crate::manifest::compat::{self, BreakingChange};
use crate::output::write_if_changed;

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
    pub format: DiagnosticFormat,
    pub color: ColorChoice,
    captured: Option<std::sync::Arc<std::sync::Mutex<String>>>,
}

impl Report {
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
    fn stdout_line(&self, line: &str) {
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
    fn error_word(&self) -> &'static str {
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
    fn progress(&self, text: &str, json: impl FnOnce() -> serde_json::Value) {
        match self.format {
            DiagnosticFormat::Human | DiagnosticFormat::Github => eprintln!("{text}"),
            DiagnosticFormat::Json => self.json_line(&json()),
        }
    }

    fn json_line(&self, value: &impl serde::Serialize) {
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
    fn changes(&self, changes: &[VersionChange]) {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestFormat {
    Json,
    Yaml,
}

/// Checks and prints diagnostics; `Err` carries the outcome to return.
fn checked(paths: &[PathBuf], report: &Report) -> Result<CheckOutcome, Outcome> {
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

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `rfidl check`.
pub fn check(paths: &[PathBuf], format: DiagnosticFormat, color: ColorChoice) -> Outcome {
    check_with(paths, &Report::new(format, color))
}

/// [`check`] reporting as `report` says.
pub fn check_with(paths: &[PathBuf], report: &Report) -> Outcome {
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

/// `rfidl generate --out DIR`.
pub fn generate(paths: &[PathBuf], out: &Path, sides: Sides, report: &Report) -> Outcome {
    let outcome = match checked(paths, report) {
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
        let formatted = match crate::format::format_source(&text) {
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

/// The manifests of a baseline for `rfidl breaking`: a manifest file (one
/// manifest, or the array `rfidl manifest` prints), a folder of such files,
/// or contracts (`.rfidl` files, or a folder holding them).
pub fn baseline_manifests(path: &Path) -> Result<Vec<Manifest>, String> {
    let is_contract = |p: &Path| p.extension().is_some_and(|e| e == "rfidl");
    let mut json_files = Vec::new();
    if path.is_dir() {
        collect_json_files(path, &mut json_files)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if json_files.is_empty() {
            return contract_manifests(&[path.to_path_buf()]);
        }
    } else if is_contract(path) {
        return contract_manifests(&[path.to_path_buf()]);
    } else {
        json_files.push(path.to_path_buf());
    }
    let mut manifests = Vec::new();
    for file in json_files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let parsed = serde_json::from_str::<Vec<Manifest>>(&text)
            .or_else(|_| serde_json::from_str::<Manifest>(&text).map(|m| vec![m]))
            .map_err(|e| format!("{} is not a manifest: {e}", file.display()))?;
        manifests.extend(parsed);
    }
    Ok(manifests)
}

fn collect_json_files(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_json_files(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "json") {
            found.push(path);
        }
    }
    Ok(())
}

fn contract_manifests(paths: &[PathBuf]) -> Result<Vec<Manifest>, String> {
    let outcome = check::check_paths(paths).map_err(|e| e.to_string())?;
    if outcome.has_errors() {
        return Err(format!(
            "the baseline contracts have errors:\n{}",
            outcome.render_human()
        ));
    }
    let model = outcome.model.expect("no errors means a model");
    Ok(model.manifests().cloned().collect())
}

/// One breaking change of one interface version, as `rfidl breaking` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VersionChange {
    pub interface: String,
    pub version: u32,
    #[serde(flatten)]
    pub change: BreakingChange,
}

/// Compares every interface version of `baseline` with the same version in
/// `current`: the breaking changes, in baseline order. A version the
/// baseline has and `current` lacks is one change (`B0015`); a version only
/// `current` has is new, and compatible.
pub fn breaking_between(baseline: &[Manifest], current: &[Manifest]) -> Vec<VersionChange> {
    let mut found = Vec::new();
    for old in baseline {
        let changes = match current
            .iter()
            .find(|m| m.interface == old.interface && m.version == old.version)
        {
            Some(new) => compat::breaking_changes(old, new),
            None => vec![BreakingChange {
                code: "B0015",
                path: format!("{} v{}", old.service, old.version),
                message: "removed: peers still using this version lose it; keep serving it \
                          until none does"
                    .to_owned(),
            }],
        };
        found.extend(changes.into_iter().map(|change| VersionChange {
            interface: old.interface.clone(),
            version: old.version,
            change,
        }));
    }
    found
}

/// `rfidl breaking --against BASELINE PATHS…`: exit 0 when every interface
/// version of the baseline is still there and only changed compatibly, 1
/// when something needs a new version, 2 on usage or I/O errors.
pub fn breaking(against: &Path, paths: &[PathBuf], report: &Report) -> Outcome {
    let baseline = match baseline_manifests(against) {
        Ok(manifests) => manifests,
        Err(error) => {
            report.error(&error);
            return Outcome::UsageOrIo;
        }
    };
    let outcome = match checked(paths, report) {
        Ok(outcome) => outcome,
        Err(outcome) => return outcome,
    };
    let model = outcome.model.expect("no errors means a model");
    let current: Vec<Manifest> = model.manifests().cloned().collect();
    let changes = breaking_between(&baseline, &current);
    report.changes(&changes);
    match report.format {
        DiagnosticFormat::Json => {}
        DiagnosticFormat::Human | DiagnosticFormat::Github => {
            let mut stderr = std::io::stderr().lock();
            let versions: std::collections::BTreeSet<_> = changes
                .iter()
                .map(|c| (c.interface.as_str(), c.version))
                .collect();
            if changes.is_empty() {
                let _ = writeln!(
                    stderr,
                    "compared {} interface version{}: no breaking change",
                    baseline.len(),
                    plural(baseline.len())
                );
            } else {
                let _ = writeln!(
                    stderr,
                    "{}: {} breaking change{} in {} interface version{}; \
                     a breaking change needs a new version (vN+1)",
                    report.error_word(),
                    changes.len(),
                    plural(changes.len()),
                    versions.len(),
                    plural(versions.len())
                );
            }
        }
    }
    if changes.is_empty() {
        Outcome::Success
    } else {
        Outcome::ContractErrors
    }
}

/// `rfidl publish --registry URL PATHS…`: publishes every service version
/// of the contracts. Exit 1 when the registry refuses a breaking revision of
/// a published version (the changes are listed), 2 when it cannot be reached
/// or refuses for another reason. Text output, uncoloured; see
/// [`publish_with`].
#[cfg(feature = "registry")]
pub fn publish(registry_url: &str, token: Option<&str>, paths: &[PathBuf]) -> Outcome {
    publish_with(registry_url, token, paths, &Report::default())
}

/// [`publish`] reporting as `report` says: each publish is a sentence on
/// stderr (json: `{"event": "published", "interface", "version",
/// "fingerprint", "revision", "created"}`), a refusal lists its breaking
/// changes like `rfidl breaking`.
#[cfg(feature = "registry")]
pub fn publish_with(
    registry_url: &str,
    token: Option<&str>,
    paths: &[PathBuf],
    report: &Report,
) -> Outcome {
    use crate::registry::RegistryError;
    use crate::registry::client::RegistryClient;

    let outcome = match checked(paths, report) {
        Ok(outcome) => outcome,
        Err(outcome) => return outcome,
    };
    let model = outcome.model.expect("no errors means a model");
    let client = match RegistryClient::new(registry_url) {
        Ok(client) => match token {
            Some(token) => client.with_token(token),
            None => client,
        },
        Err(error) => {
            report.error(&error.to_string());
            return Outcome::UsageOrIo;
        }
    };
    let mut result = Outcome::Success;
    for manifest in model.manifests() {
        match client.publish(manifest) {
            Ok(published) => {
                report.progress(
                    &format!(
                        "published {} v{} {}: revision {}{}",
                        published.interface,
                        published.version,
                        published.fingerprint,
                        published.revision,
                        if published.created {
                            ""
                        } else {
                            " (already published)"
                        }
                    ),
                    || {
                        let mut value =
                            serde_json::to_value(&published).expect("answers always serialise");
                        value["event"] = "published".into();
                        value
                    },
                );
            }
            Err(RegistryError::Breaking {
                interface,
                version,
                changes,
                ..
            }) => {
                let changes: Vec<VersionChange> = changes
                    .into_iter()
                    .map(|change| VersionChange {
                        interface: interface.clone(),
                        version,
                        change,
                    })
                    .collect();
                report.changes(&changes);
                if report.format != DiagnosticFormat::Json {
                    eprintln!(
                        "{}: the registry refused {interface} v{version}: {} breaking change{} \
                         to a published version; declare them in a new version",
                        report.error_word(),
                        changes.len(),
                        plural(changes.len())
                    );
                }
                if result == Outcome::Success {
                    result = Outcome::ContractErrors;
                }
            }
            Err(error) => {
                report.error(&error.to_string());
                return Outcome::UsageOrIo;
            }
        }
    }
    result
}

/// `rfidl deploy-check --registry URL [PATHS…]`: before a deploy, asks the
/// registry whether every interface version this build calls is hosted by
/// a registered provider at the locked fingerprint or a later compatible
/// revision. `paths` are either lock files (`*.lock`: each pinned remote)
/// or contracts (each service version's manifest); none means
/// `rfidl.lock`. Exit 1 when something is missing (each listed: text
/// `error[no_provider]: …` on stderr, json `{"event": "unsatisfied",
/// "interface", "version", "fingerprint", "reason", "message"}`, github an
/// `::error` titled with the reason), 2 when the registry cannot be asked.
#[cfg(feature = "registry")]
pub fn deploy_check_with(registry_url: &str, paths: &[PathBuf], report: &Report) -> Outcome {
    use crate::registry::client::RegistryClient;
    use crate::registry::{LockFile, Locked};

    let default_lock = [PathBuf::from("rfidl.lock")];
    let paths = if paths.is_empty() {
        &default_lock[..]
    } else {
        paths
    };
    let is_lock = |path: &PathBuf| path.extension().is_some_and(|e| e == "lock");
    let calls: Vec<Locked> = if paths.iter().all(is_lock) {
        let mut calls = Vec::new();
        for path in paths {
            if !path.is_file() {
                report.error(&format!("lock file {} does not exist", path.display()));
                return Outcome::UsageOrIo;
            }
            match LockFile::load(path) {
                Ok(lock) => calls.extend(lock.interfaces),
                Err(error) => {
                    report.error(&error.to_string());
                    return Outcome::UsageOrIo;
                }
            }
        }
        calls
    } else if paths.iter().any(is_lock) {
        report.error("give either lock files or contracts to deploy-check, not both");
        return Outcome::UsageOrIo;
    } else {
        let outcome = match checked(paths, report) {
            Ok(outcome) => outcome,
            Err(outcome) => return outcome,
        };
        let model = outcome.model.expect("no errors means a model");
        model
            .manifests()
            .map(|m| Locked {
                interface: m.interface.clone(),
                version: m.version,
                fingerprint: m.fingerprint.clone(),
            })
            .collect()
    };
    if calls.is_empty() {
        report.error("nothing to check: the lock files or contracts name no interface version");
        return Outcome::UsageOrIo;
    }
    let missing = match RegistryClient::new(registry_url).and_then(|c| c.deploy_check(&calls)) {
        Ok(missing) => missing,
        Err(error) => {
            report.error(&error.to_string());
            return Outcome::UsageOrIo;
        }
    };
    if missing.is_empty() {
        report.progress(
            &format!(
                "deploy check passed: {} interface version{} hosted by a registered provider",
                calls.len(),
                plural(calls.len())
            ),
            || serde_json::json!({"event": "deploy_check", "satisfied": true, "checked": calls.len()}),
        );
        return Outcome::Success;
    }
    for unmet in &missing {
        let text = format!(
            "{} v{} {}: {}",
            unmet.interface, unmet.version, unmet.fingerprint, unmet.message
        );
        match report.format {
            DiagnosticFormat::Human => {
                eprintln!("{}[{}]: {text}", report.error_word(), unmet.reason);
            }
            DiagnosticFormat::Json => {
                let mut value = serde_json::to_value(unmet).expect("answers always serialise");
                value["event"] = "unsatisfied".into();
                report.json_line(&value);
            }
            DiagnosticFormat::Github => {
                let title = format!("title={}", unmet.reason);
                report.stdout_line(&diagnostics::github_command("error", &[title], &text));
            }
        }
    }
    if report.format != DiagnosticFormat::Json {
        eprintln!(
            "{}: deploy check failed: {} of {} called interface version{} ha{} no compatible \
             provider in the registry",
            report.error_word(),
            missing.len(),
            calls.len(),
            plural(calls.len()),
            if missing.len() == 1 { "s" } else { "ve" }
        );
    }
    Outcome::ContractErrors
}

/// `rfidl decommission` (`on`) / `rfidl recommission`: marks each of
/// `remotes` decommissioned in the registry, or not any more. A
/// decommissioned version fails the manifest scan of every consumer that
/// calls it (`rfidl deploy-check`, registrations). One sentence per version
/// on stderr, naming the provider instances the registry sent its command to
/// (json: `{"event": "decommissioned" | "recommissioned", "interface",
/// "version", "commandsSentTo": [base URLs] | null}`); exit 2 when the registry refuses (an unknown
/// version: 404) or cannot be reached.
#[cfg(feature = "registry")]
pub fn decommission_with(
    registry_url: &str,
    token: Option<&str>,
    remotes: &[crate::registry::Remote],
    on: bool,
    report: &Report,
) -> Outcome {
    use crate::registry::client::RegistryClient;

    if remotes.is_empty() {
        report.error("name the interface versions, e.g. hr.employees.EmpService@v1");
        return Outcome::UsageOrIo;
    }
    let client = match RegistryClient::new(registry_url) {
        Ok(client) => match token {
            Some(token) => client.with_token(token),
            None => client,
        },
        Err(error) => {
            report.error(&error.to_string());
            return Outcome::UsageOrIo;
        }
    };
    let event = if on {
        "decommissioned"
    } else {
        "recommissioned"
    };
    for remote in remotes {
        match client.decommission(remote, on) {
            Ok(answer) => {
                let told = match &answer.commands_sent_to {
                    Some(urls) if urls.is_empty() => {
                        "; no provider instance is registered".to_owned()
                    }
                    Some(urls) => format!("; command sent to {}", urls.join(", ")),
                    None => "; the registry has no command secret: its providers are not told"
                        .to_owned(),
                };
                report.progress(
                    &format!("{event} {} v{}{told}", remote.interface, remote.version),
                    || {
                        serde_json::json!({
                            "event": event,
                            "interface": remote.interface,
                            "version": remote.version,
                            "commandsSentTo": answer.commands_sent_to,
                        })
                    },
                )
            }
            Err(error) => {
                report.error(&error.to_string());
                return Outcome::UsageOrIo;
            }
        }
    }
    Outcome::Success
}

/// `rfidl fetch [REMOTES…]`: pins each remote interface version in the lock
/// file and stores its manifest in the offline cache. Without remotes, it
/// does so for everything already in the lock (filling the cache). Without
/// a registry it only checks that the lock and the cache agree. Text
/// output, uncoloured; see [`fetch_with`].
#[cfg(feature = "registry")]
pub fn fetch(
    registry_url: Option<&str>,
    lock_path: &Path,
    cache: &crate::registry::Cache,
    remotes: &[crate::registry::Remote],
    policy: crate::registry::LockPolicy,
) -> Outcome {
    fetch_with(
        registry_url,
        lock_path,
        cache,
        remotes,
        policy,
        &Report::default(),
    )
}

/// [`fetch`] reporting as `report` says: each pin is a sentence on stderr
/// (json: `{"event": "locked", "interface", "version", "fingerprint",
/// "cache"}`). With a registry, a warning for each pinned version the
/// registry has a newer revision of, for a newer version, and, when the
/// registry is unreachable, how old each cached copy is
/// ([`crate::registry::freshness`]; json: `{"severity": "warning", …}`).
#[cfg(feature = "registry")]
pub fn fetch_with(
    registry_url: Option<&str>,
    lock_path: &Path,
    cache: &crate::registry::Cache,
    remotes: &[crate::registry::Remote],
    policy: crate::registry::LockPolicy,
    report: &Report,
) -> Outcome {
    use crate::registry::client::RegistryClient;
    use crate::registry::{LockFile, Source, resolve};

    let run = || -> Result<Vec<Manifest>, crate::registry::RegistryError> {
        let mut lock = LockFile::load(lock_path)?;
        let remotes = if remotes.is_empty() {
            lock.remotes()
        } else {
            remotes.to_vec()
        };
        let client = registry_url.map(RegistryClient::new).transpose()?;
        let source = client.as_ref().map(|c| c as &dyn Source);
        let manifests = resolve(&remotes, &mut lock, cache, source, policy)?;
        lock.save(lock_path)?;
        if let Some(source) = source {
            let freshness = crate::registry::freshness::check(
                &remotes,
                &lock,
                cache,
                source,
                std::time::SystemTime::now(),
            );
            for warning in &freshness.warnings {
                report.warning(warning);
            }
        }
        Ok(manifests)
    };
    match run() {
        Ok(manifests) if manifests.is_empty() => {
            report.error(&format!(
                "nothing to fetch: name interface versions (`package.Service@vN`) or add them to {}",
                lock_path.display()
            ));
            Outcome::UsageOrIo
        }
        Ok(manifests) => {
            for manifest in manifests {
                let path = cache
                    .path_of(&manifest.interface, manifest.version, &manifest.fingerprint)
                    .map(|path| path.display().to_string())
                    .unwrap_or_default();
                report.progress(
                    &format!(
                        "locked {} v{} at {} ({path})",
                        manifest.interface, manifest.version, manifest.fingerprint,
                    ),
                    || {
                        serde_json::json!({
                            "event": "locked",
                            "interface": manifest.interface,
                            "version": manifest.version,
                            "fingerprint": manifest.fingerprint,
                            "cache": path,
                        })
                    },
                );
            }
            Outcome::Success
        }
        Err(error) => {
            report.error(&error.to_string());
            Outcome::UsageOrIo
        }
    }
}
