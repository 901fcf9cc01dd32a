//! `rfidl publish`: publishes every service version of the contracts to a
//! registry.

use std::path::PathBuf;

use crate::breaking::VersionChange;
use crate::report::{DiagnosticFormat, Outcome, Report, checked, plural};

/// `rfidl publish --registry URL PATHS…`: publishes every service version
/// of the contracts. Exit 1 when the registry refuses a breaking revision of
/// a published version (the changes are listed), 2 when it cannot be reached
/// or refuses for another reason. Text output, uncoloured; see
/// [`publish_with`].
pub fn publish(registry_url: &str, token: Option<&str>, paths: &[PathBuf]) -> Outcome {
    publish_with(registry_url, token, paths, &Report::default())
}

/// [`publish`] reporting as `report` says: each publish is a sentence on
/// stderr (json: `{"event": "published", "interface", "version",
/// "fingerprint", "revision", "created"}`), a refusal lists its breaking
/// changes like `rfidl breaking`.
pub fn publish_with(
    registry_url: &str,
    token: Option<&str>,
    paths: &[PathBuf],
    report: &Report,
) -> Outcome {
    use rfidl_codegen::registry::RegistryError;
    use rfidl_codegen::registry::client::RegistryClient;

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
