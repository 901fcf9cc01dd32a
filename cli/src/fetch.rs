//! `rfidl fetch`: pins remote interface versions in the lock file and
//! fills the offline cache.

use std::path::Path;

use rfidl_codegen::manifest::Manifest;

use crate::report::{Outcome, Report};

/// `rfidl fetch [REMOTES…]`: pins each remote interface version in the lock
/// file and stores its manifest in the offline cache. Without remotes, it
/// does so for everything already in the lock (filling the cache). Without
/// a registry it only checks that the lock and the cache agree. Text
/// output, uncoloured; see [`fetch_with`].
pub fn fetch(
    registry_url: Option<&str>,
    lock_path: &Path,
    cache: &rfidl_codegen::registry::Cache,
    remotes: &[rfidl_codegen::registry::Remote],
    policy: rfidl_codegen::registry::LockPolicy,
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
/// ([`rfidl_codegen::registry::freshness`]; json: `{"severity": "warning", …}`).
pub fn fetch_with(
    registry_url: Option<&str>,
    lock_path: &Path,
    cache: &rfidl_codegen::registry::Cache,
    remotes: &[rfidl_codegen::registry::Remote],
    policy: rfidl_codegen::registry::LockPolicy,
    report: &Report,
) -> Outcome {
    use rfidl_codegen::registry::client::RegistryClient;
    use rfidl_codegen::registry::{LockFile, Source, resolve};

    let run = || -> Result<Vec<Manifest>, rfidl_codegen::registry::RegistryError> {
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
            let freshness = rfidl_codegen::registry::freshness::check(
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
