//! Whether the pinned remote interfaces are still the newest the registry
//! has: the staleness warnings of a build with `Builder::remote` (as
//! `cargo:warning` lines) and of `rfidl fetch`.
//!
//! After the lock and the cache resolved every remote, one question per
//! interface goes to the registry (`GET /v1/interfaces/{interface}`, its
//! versions and revisions). A warning says when the registry has a newer
//! revision of a pinned version, or a newer version than the newest the
//! build uses; when the registry cannot be reached, it says how old the
//! cached copy the build uses is (the cache file's modification time: the
//! cache writes a file once, when it is fetched). Only warnings: the build
//! goes on from the lock either way. After the first unreachable answer
//! the registry is not asked again, so a registry that is down costs one
//! connection attempt, not one per interface.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::{Cache, LockFile, RegistryError, Remote, Source};

/// The warnings of [`check`], and whether the registry answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Freshness {
    /// One sentence each, without a prefix (the caller adds `rfidl: ` or
    /// `warning: `).
    pub warnings: Vec<String>,
    /// False when the registry could not be reached: then nothing else
    /// should be asked of it in this build.
    pub reachable: bool,
}

/// Compares each of `remotes` pinned in `lock` with what `source` has
/// published; `now` is the time to measure the cache's age against.
pub fn check(
    remotes: &[Remote],
    lock: &LockFile,
    cache: &Cache,
    source: &dyn Source,
    now: SystemTime,
) -> Freshness {
    let mut by_interface: BTreeMap<&str, Vec<&Remote>> = BTreeMap::new();
    for remote in remotes {
        by_interface
            .entry(remote.interface.as_str())
            .or_default()
            .push(remote);
    }
    let mut freshness = Freshness {
        warnings: Vec::new(),
        reachable: true,
    };
    let mut unreachable: Option<String> = None;
    for (interface, used) in by_interface {
        let answer = match &unreachable {
            Some(_) => None,
            None => Some(source.versions(interface)),
        };
        match answer {
            Some(Ok(published)) => {
                newer_than_pinned(interface, &used, &published, lock, source, &mut freshness)
            }
            Some(Err(RegistryError::Unreachable { message, .. })) => {
                freshness.reachable = false;
                unreachable = Some(message);
            }
            Some(Err(error)) => freshness.warnings.push(format!(
                "cannot tell whether {interface} has newer revisions or versions: {error}"
            )),
            None => {}
        }
        if let Some(why) = &unreachable {
            for remote in used {
                freshness
                    .warnings
                    .push(offline(remote, lock, cache, source, why, now));
            }
        }
    }
    freshness
}

/// The warnings about one interface from its published versions.
fn newer_than_pinned(
    interface: &str,
    used: &[&Remote],
    published: &[super::PublishedVersion],
    lock: &LockFile,
    source: &dyn Source,
    freshness: &mut Freshness,
) {
    if published.is_empty() {
        // A source that cannot list versions (a registry answers 404 for an
        // interface it does not have).
        return;
    }
    let url = source.name();
    for remote in used {
        let Some(pinned) = lock.get(remote) else {
            continue;
        };
        let Some(version) = published.iter().find(|v| v.version == remote.version) else {
            freshness.warnings.push(format!(
                "{interface} v{} is pinned in rfidl.lock, but the registry {url} does not \
                 publish that version (any more)",
                remote.version
            ));
            continue;
        };
        let Some(latest) = version.revisions.last() else {
            continue;
        };
        if latest.fingerprint == pinned.fingerprint {
            continue;
        }
        let pinned_revision = version
            .revisions
            .iter()
            .find(|r| r.fingerprint == pinned.fingerprint)
            .map_or_else(
                || format!("{}, which the registry does not have", pinned.fingerprint),
                |r| format!("revision {} ({})", r.revision, r.fingerprint),
            );
        freshness.warnings.push(format!(
            "the registry {url} has a newer revision of {interface} v{}: revision {} ({}, \
             published {}); rfidl.lock pins {pinned_revision}. Run `rfidl fetch --update \
             --registry {url} {interface}@v{}` to move to it",
            remote.version,
            latest.revision,
            latest.fingerprint,
            latest.published_at,
            remote.version
        ));
    }
    let newest_used = used.iter().map(|r| r.version).max().unwrap_or(0);
    let newer: Vec<String> = published
        .iter()
        .filter(|v| v.version > newest_used)
        .map(|v| format!("v{}", v.version))
        .collect();
    if !newer.is_empty() {
        freshness.warnings.push(format!(
            "the registry {url} publishes a newer version of {interface} ({}) than this build \
             uses (v{newest_used})",
            newer.join(", ")
        ));
    }
}

/// The warning for a remote built from the cache while the registry is
/// unreachable: which copy, and how old.
fn offline(
    remote: &Remote,
    lock: &LockFile,
    cache: &Cache,
    source: &dyn Source,
    why: &str,
    now: SystemTime,
) -> String {
    let url = source.name();
    let Some(pinned) = lock.get(remote) else {
        return format!(
            "the registry {url} is unreachable ({why}); {} v{} is not pinned",
            remote.interface, remote.version
        );
    };
    let fetched = cache
        .fetched_at(&remote.interface, remote.version, &pinned.fingerprint)
        .map_or_else(
            || "at an unknown time".to_owned(),
            |at| match now.duration_since(at) {
                Ok(age) => format!("{} ago", age_text(age)),
                Err(_) => "just now".to_owned(),
            },
        );
    format!(
        "using the cached copy of {} v{} ({}) fetched {fetched}; the registry {url} is \
         unreachable ({why}), so a newer revision or version would not be seen",
        remote.interface, remote.version, pinned.fingerprint
    )
}

/// `3 days`, `1 hour`, `5 minutes`, `less than a minute`.
pub fn age_text(age: Duration) -> String {
    let secs = age.as_secs();
    let (count, unit) = match secs {
        0..60 => return "less than a minute".to_owned(),
        60..3_600 => (secs / 60, "minute"),
        3_600..86_400 => (secs / 3_600, "hour"),
        _ => (secs / 86_400, "day"),
    };
    if count == 1 {
        format!("1 {unit}")
    } else {
        format!("{count} {unit}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_a_person_says_them() {
        for (secs, text) in [
            (0, "less than a minute"),
            (59, "less than a minute"),
            (60, "1 minute"),
            (3_599, "59 minutes"),
            (3_600, "1 hour"),
            (7_200, "2 hours"),
            (86_400, "1 day"),
            (3 * 86_400 + 5, "3 days"),
        ] {
            assert_eq!(age_text(Duration::from_secs(secs)), text, "{secs}");
        }
    }
}
