//! `rfidl decommission` / `rfidl recommission`: marks interface versions
//! decommissioned in the registry, or not any more.

use crate::report::{Outcome, Report};

/// `rfidl decommission` (`on`) / `rfidl recommission`: marks each of
/// `remotes` decommissioned in the registry, or not any more. A
/// decommissioned version fails the manifest scan of every consumer that
/// calls it (`rfidl deploy-check`, registrations). One sentence per version
/// on stderr, naming the provider instances the registry sent its command to
/// (json: `{"event": "decommissioned" | "recommissioned", "interface",
/// "version", "commandsSentTo": [base URLs] | null}`); exit 2 when the registry refuses (an unknown
/// version: 404) or cannot be reached.
pub fn decommission_with(
    registry_url: &str,
    token: Option<&str>,
    remotes: &[rfidl_codegen::registry::Remote],
    on: bool,
    report: &Report,
) -> Outcome {
    use rfidl_codegen::registry::client::RegistryClient;

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
