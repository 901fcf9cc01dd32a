//! `rfidl breaking`: the changes that break peers of an interface version,
//! between a baseline (manifests or contracts) and the contracts as they are.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use rfidl_codegen::check;
use rfidl_codegen::manifest::Manifest;
use rfidl_codegen::manifest::compat::{self, BreakingChange};

use crate::report::{DiagnosticFormat, Outcome, Report, checked, plural};

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
    /// The interface, `package.Service` (e.g. `hr.employees.EmpService`).
    pub interface: String,
    /// The interface version the change breaks (the `N` of `vN`).
    pub version: u32,
    /// What changed, with its code (`B0001`…); serialised flat, beside
    /// `interface` and `version`.
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
