//! `rfidl deploy-check`: before a deploy, whether the registry has a
//! provider for every interface version the build calls.

use std::path::PathBuf;

use rfidl_codegen::diagnostics;

use crate::report::{DiagnosticFormat, Outcome, Report, checked, plural};

/// `rfidl deploy-check --registry URL [PATHS…]`: before a deploy, asks the
/// registry whether every interface version this build calls is hosted by
/// a registered provider at the locked fingerprint or a later compatible
/// revision. `paths` are either lock files (`*.lock`: each pinned remote)
/// or contracts (each service version's manifest); none means
/// `rfidl.lock`. Exit 1 when something is missing (each listed: text
/// `error[no_provider]: …` on stderr, json `{"event": "unsatisfied",
/// "interface", "version", "fingerprint", "reason", "message"}`, github an
/// `::error` titled with the reason), 2 when the registry cannot be asked.
pub fn deploy_check_with(registry_url: &str, paths: &[PathBuf], report: &Report) -> Outcome {
    use rfidl_codegen::registry::client::RegistryClient;
    use rfidl_codegen::registry::{LockFile, Locked};

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
