//! What the `rfidl` subcommands do, as library functions (the binary only
//! parses flags). Each prints to stdout/stderr and returns an [`Outcome`].

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::builder::{Options, Sides, write_if_changed};
use crate::check::{self, CheckOutcome};
use crate::diagnostics::{self, ColorChoice};
use crate::generate::{self, Layout};
use crate::manifest::Manifest;
use crate::manifest::compat::{self, BreakingChange};

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
pub fn breaking(against: &Path, paths: &[PathBuf], format: DiagnosticFormat) -> Outcome {
    let baseline = match baseline_manifests(against) {
        Ok(manifests) => manifests,
        Err(error) => {
            eprintln!("error: {error}");
            return Outcome::UsageOrIo;
        }
    };
    let outcome = match checked(paths, DiagnosticFormat::Human, ColorChoice::Auto) {
        Ok(outcome) => outcome,
        Err(outcome) => return outcome,
    };
    let model = outcome.model.expect("no errors means a model");
    let current: Vec<Manifest> = model.manifests().cloned().collect();
    let changes = breaking_between(&baseline, &current);
    match format {
        DiagnosticFormat::Json => {
            let mut stdout = std::io::stdout().lock();
            for change in &changes {
                let line = serde_json::to_string(change).expect("changes always serialise");
                let _ = writeln!(stdout, "{line}");
            }
        }
        DiagnosticFormat::Human => {
            let mut stderr = std::io::stderr().lock();
            print_changes(&mut stderr, &changes);
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
                    "error: {} breaking change{} in {} interface version{}; \
                     a breaking change needs a new version (vN+1)",
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

/// Prints breaking changes the way `rfidl breaking` does.
fn print_changes(stderr: &mut impl std::io::Write, changes: &[VersionChange]) {
    for change in changes {
        let _ = writeln!(
            stderr,
            "error[{}]: {}: {}\n  = in {} v{}",
            change.change.code,
            change.change.path,
            change.change.message,
            change.interface,
            change.version
        );
    }
}

/// `rfidl publish --registry URL PATHS…`: publishes every service version
/// of the contracts. Exit 1 when the registry refuses a breaking revision of
/// a published version (the changes are listed), 2 when it cannot be reached
/// or refuses for another reason.
#[cfg(feature = "registry")]
pub fn publish(registry_url: &str, token: Option<&str>, paths: &[PathBuf]) -> Outcome {
    use crate::registry::RegistryError;
    use crate::registry::client::RegistryClient;

    let outcome = match checked(paths, DiagnosticFormat::Human, ColorChoice::Auto) {
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
            eprintln!("error: {error}");
            return Outcome::UsageOrIo;
        }
    };
    let mut result = Outcome::Success;
    let mut stderr = std::io::stderr().lock();
    for manifest in model.manifests() {
        match client.publish(manifest) {
            Ok(published) => {
                let _ = writeln!(
                    stderr,
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
                print_changes(&mut stderr, &changes);
                let _ = writeln!(
                    stderr,
                    "error: the registry refused {interface} v{version}: {} breaking change{} \
                     to a published version; declare them in a new version",
                    changes.len(),
                    plural(changes.len())
                );
                if result == Outcome::Success {
                    result = Outcome::ContractErrors;
                }
            }
            Err(error) => {
                let _ = writeln!(stderr, "error: {error}");
                return Outcome::UsageOrIo;
            }
        }
    }
    result
}

/// `rfidl fetch [REMOTES…]`: pins each remote interface version in the lock
/// file and stores its manifest in the offline cache. Without remotes, it
/// does so for everything already in the lock (filling the cache). Without
/// a registry it only checks that the lock and the cache agree.
#[cfg(feature = "registry")]
pub fn fetch(
    registry_url: Option<&str>,
    lock_path: &Path,
    cache: &crate::registry::Cache,
    remotes: &[crate::registry::Remote],
    policy: crate::registry::LockPolicy,
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
        Ok(manifests)
    };
    match run() {
        Ok(manifests) if manifests.is_empty() => {
            eprintln!(
                "error: nothing to fetch: name interface versions (`package.Service@vN`) or add them to {}",
                lock_path.display()
            );
            Outcome::UsageOrIo
        }
        Ok(manifests) => {
            for manifest in manifests {
                eprintln!(
                    "locked {} v{} at {} ({})",
                    manifest.interface,
                    manifest.version,
                    manifest.fingerprint,
                    cache
                        .path_of(&manifest.interface, manifest.version, &manifest.fingerprint)
                        .map(|path| path.display().to_string())
                        .unwrap_or_default()
                );
            }
            Outcome::Success
        }
        Err(error) => {
            eprintln!("error: {error}");
            Outcome::UsageOrIo
        }
    }
}
