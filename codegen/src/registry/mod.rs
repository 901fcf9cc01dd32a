//! Remote interfaces: manifests published to an rfidl registry, pinned in a
//! lock file, and kept in an offline cache, so a build generates code for an
//! interface it has no contract file for, and still builds with the registry
//! down.
//!
//! * [`LockFile`] (`rfidl.lock`, next to `Cargo.toml`, committed): which
//!   fingerprint of each remote interface version the build uses.
//! * [`Cache`] (`~/.cache/rfidl` or `$RFIDL_CACHE_DIR`): fetched manifests,
//!   content-addressed by fingerprint and verified on every read.
//! * [`resolve`]: lock + cache first, the network only for what they lack (or
//!   for `--update`); the client ([`RegistryClient`]) exists with the
//!   cargo feature `registry`, so a build script that only reads the lock and
//!   the cache pulls in no HTTP stack.
//! * Every manifest is validated ([`crate::validate`]) where it
//!   enters: fetched from a registry, read from the cache, stored into it;
//!   and no name from a lock file, a registry or `Builder::remote` becomes
//!   part of a path before it is checked ([`Cache::path_of`]), so
//!   `../../etc/passwd` can never leave the cache directory.
//! * [`freshness`]: after resolution, warns when the registry has a newer
//!   revision or version of a pinned interface, or says how old the cached
//!   copy is when the registry is unreachable.
//! * [`merge_remote`]: adds a manifest's service and type closure to the
//!   packages to generate, refusing a type or service that a local contract
//!   defines differently.
//!
// The client is compiled with the feature only; without it (a plain `cargo
// doc`), the link goes to its page on docs.rs, built with every feature.
#![cfg_attr(
    feature = "registry",
    doc = "[`RegistryClient`]: client::RegistryClient"
)]
#![cfg_attr(
    not(feature = "registry"),
    doc = "[`RegistryClient`]: https://docs.rs/rfidl-codegen/latest/rfidl_codegen/registry/client/struct.RegistryClient.html"
)]

#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub mod client;
pub mod freshness;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, PackageContract, TypeDef};
use crate::validate::{InvalidManifest, is_fingerprint, is_interface_id, shown};
pub use rfidl_contract::wire::{Published, PublishedRevision, PublishedVersion};

/// Why a remote interface could not be resolved, published or merged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Reading or writing the lock file or a cache file failed.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The lock file is not JSON of the expected shape, has a newer format,
    /// or holds an entry that is not an interface id, a version or a
    /// fingerprint.
    #[error("{path} is not a valid lock file: {reason}")]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A cache file is not UTF-8, not a manifest, or not the manifest its
    /// name says (interface, version or fingerprint). Deleting it is safe:
    /// the next fetch writes it again.
    #[error("cached manifest {path} is damaged ({reason}); delete it and fetch again")]
    CorruptCache {
        /// The cache file (or the cache root, for a manifest refused before
        /// it was stored).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A remote interface is not pinned in the lock file and there is no
    /// registry to fetch it from; the message says what to run.
    #[error(
        "{interface} v{version} is not in the lock file and no registry is configured; \
         run `rfidl fetch --registry URL {interface}@v{version}` (or set RFIDL_REGISTRY)"
    )]
    NotLocked {
        /// `package.Service`.
        interface: String,
        /// The `N` of `vN`.
        version: u32,
    },
    /// The lock file pins a fingerprint the cache does not hold, and there is
    /// no registry to fetch it from (a fresh clone whose cache is empty).
    #[error(
        "{interface} v{version} is locked at {fingerprint}, which is not in the cache ({cache}) \
         and no registry is configured to fetch it from; run `rfidl fetch --registry URL` \
         (or set RFIDL_REGISTRY)"
    )]
    NotCached {
        /// `package.Service`.
        interface: String,
        /// The `N` of `vN`.
        version: u32,
        /// The pinned fingerprint, `sha256:<hex>`.
        fingerprint: String,
        /// The cache directory searched.
        cache: PathBuf,
    },
    /// The registry could not be asked: bad URL, connection refused, TLS
    /// failure, timeout (30 s per request, 5 s to connect).
    #[error("registry {url}: {message}")]
    Unreachable {
        /// The URL requested.
        url: String,
        /// The HTTP client's error, with its causes.
        message: String,
    },
    /// The registry answered with an error status (other than a publish
    /// refused as breaking, which is [`RegistryError::Breaking`]).
    #[error("registry {url} answered {status} `{code}`: {message}")]
    Refused {
        /// The URL requested.
        url: String,
        /// The HTTP status: 404 for an interface or version not published,
        /// 401 for a missing or wrong token, 429 or 503 for a busy registry, ….
        status: u16,
        /// The registry's error code (`not_found`, `unauthorized`, … as in
        /// `docs/registry.md`), or `unexpected_answer` when the body was not
        /// a registry error.
        code: String,
        /// The registry's message (it says what exists instead of a missing
        /// interface).
        message: String,
    },
    /// A publish refused because the manifest is not a compatible revision
    /// of the version already published (HTTP 409 `breaking_change`).
    #[error(
        "registry {url} refused {interface} v{version}: it breaks the published revision\n{}",
        changes.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n")
    )]
    Breaking {
        /// The URL published to.
        url: String,
        /// `package.Service`.
        interface: String,
        /// The `N` of `vN`.
        version: u32,
        /// Every change that needs a new version, as the registry listed
        /// them (codes `B0001`…).
        changes: Vec<crate::manifest::compat::BreakingChange>,
    },
    /// The registry answered 2xx with something that is not the manifest
    /// asked for: not a manifest, another interface or version, or a
    /// fingerprint that does not match the content.
    #[error("registry {url} sent a manifest that is not what was asked for: {reason}")]
    BadManifest {
        /// The URL requested.
        url: String,
        /// What is wrong with the answer.
        reason: String,
    },
    /// A manifest no contract could produce (codes `M0001`…), refused
    /// before anything uses it.
    #[error("refused the manifest from {origin}: {problems}")]
    InvalidManifest {
        /// Where it came from: the registry URL, the cache file, or
        /// `interface vN` for one about to be published, stored or generated.
        origin: String,
        /// Every rule it breaks.
        problems: InvalidManifest,
    },
    /// An interface id or fingerprint (from `Builder::remote`, the command
    /// line or a lock file) that is not `package.Service` / `sha256:<hex>`.
    #[error("{name} is not {expected}")]
    InvalidName {
        /// The refused text, escaped and shortened for display.
        name: String,
        /// What it should have been.
        expected: &'static str,
    },
    /// A remote interface brings a record, enum or service version that a
    /// local contract (or another remote) also defines, differently: doc
    /// comments aside for a type, by fingerprint for a service version
    /// ([`merge_remote`]).
    #[error(
        "`{name}` is defined both by the local contracts and by remote {interface} v{version}, \
         differently; use one source for it"
    )]
    Conflict {
        /// The fully qualified type, or the service version.
        name: String,
        /// The remote interface that brought it, `package.Service`.
        interface: String,
        /// Its version.
        version: u32,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError + '_ {
    move |source| RegistryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One interface version: `hr.employees.EmpService@v2` on the command line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Remote {
    /// The interface id, `package.Service`: `hr.employees.EmpService`.
    pub interface: String,
    /// The `N` of `vN`, from 1.
    pub version: u32,
}

impl std::str::FromStr for Remote {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (interface, version) = text
            .rsplit_once("@v")
            .ok_or_else(|| format!("`{text}` is not `package.Service@vN`"))?;
        let version: u32 = version
            .parse()
            .map_err(|_| format!("`{text}`: `v{version}` is not a version"))?;
        if !interface.contains('.') || version == 0 {
            return Err(format!("`{text}` is not `package.Service@vN`"));
        }
        Ok(Remote {
            interface: interface.to_owned(),
            version,
        })
    }
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@v{}", self.interface, self.version)
    }
}

/// `rfidl.lock`: the fingerprint each remote interface version is pinned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockFile {
    /// Format of this file; 1.
    pub format: u32,
    /// Sorted by interface, then version.
    pub interfaces: Vec<Locked>,
}

/// One entry of the lock file: a remote interface version and the revision
/// the build uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Locked {
    /// The interface id, `package.Service`.
    pub interface: String,
    /// The `N` of `vN`, from 1.
    pub version: u32,
    /// The pinned revision's fingerprint, `sha256:` and 64 hex digits: the
    /// build uses exactly that manifest, whatever the registry publishes
    /// later (until `rfidl fetch --update`).
    pub fingerprint: String,
}

impl Default for LockFile {
    fn default() -> Self {
        Self {
            format: 1,
            interfaces: Vec::new(),
        }
    }
}

impl LockFile {
    /// Reads `path`; a missing file is an empty lock.
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::default());
            }
            Err(error) => return Err(io_error(path)(error)),
        };
        let lock: LockFile = serde_json::from_str(&text).map_err(|e| RegistryError::LockFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if lock.format != 1 {
            return Err(RegistryError::LockFile {
                path: path.to_path_buf(),
                reason: format!("format {} is newer than this rfidl knows (1)", lock.format),
            });
        }
        for locked in &lock.interfaces {
            let reason = if !is_interface_id(&locked.interface) {
                format!("{} is not `package.Service`", shown(&locked.interface))
            } else if locked.version == 0 {
                format!("{} has version 0", locked.interface)
            } else if !is_fingerprint(&locked.fingerprint) {
                format!(
                    "{} is not a fingerprint (`sha256:` and 64 hex digits)",
                    shown(&locked.fingerprint)
                )
            } else {
                continue;
            };
            return Err(RegistryError::LockFile {
                path: path.to_path_buf(),
                reason,
            });
        }
        Ok(lock)
    }

    /// Writes `path` if its content changed; returns whether it did.
    pub fn save(&self, path: &Path) -> Result<bool, RegistryError> {
        let text = serde_json::to_string_pretty(self).expect("lock files always serialise") + "\n";
        crate::output::write_if_changed(path, &text).map_err(io_error(path))
    }

    /// The entry of `remote`, if it is pinned.
    pub fn get(&self, remote: &Remote) -> Option<&Locked> {
        self.interfaces
            .iter()
            .find(|l| l.interface == remote.interface && l.version == remote.version)
    }

    /// Pins `remote` to `fingerprint`, keeping the list sorted.
    pub fn pin(&mut self, remote: &Remote, fingerprint: &str) {
        match self
            .interfaces
            .iter_mut()
            .find(|l| l.interface == remote.interface && l.version == remote.version)
        {
            Some(locked) => locked.fingerprint = fingerprint.to_owned(),
            None => self.interfaces.push(Locked {
                interface: remote.interface.clone(),
                version: remote.version,
                fingerprint: fingerprint.to_owned(),
            }),
        }
        self.interfaces
            .sort_by(|a, b| (&a.interface, a.version).cmp(&(&b.interface, b.version)));
    }

    /// Every pinned interface version, in the file's order.
    pub fn remotes(&self) -> Vec<Remote> {
        self.interfaces
            .iter()
            .map(|l| Remote {
                interface: l.interface.clone(),
                version: l.version,
            })
            .collect()
    }
}

/// Fetched manifests on disk, one file per fingerprint:
/// `<root>/<interface>/v<version>/<sha256 hex>.json`.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// A cache rooted at `root` (nothing is created until [`put`](Self::put)).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `$RFIDL_CACHE_DIR`, else `$XDG_CACHE_HOME/rfidl`, else `~/.cache/rfidl`.
    pub fn default_dir() -> PathBuf {
        let env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = env("RFIDL_CACHE_DIR") {
            return PathBuf::from(dir);
        }
        if let Some(dir) = env("XDG_CACHE_HOME") {
            return PathBuf::from(dir).join("rfidl");
        }
        match env("HOME") {
            Some(home) => PathBuf::from(home).join(".cache").join("rfidl"),
            None => PathBuf::from(".rfidl-cache"),
        }
    }

    /// The directory the cache lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of one manifest. The interface must be `package.Service`
    /// and the fingerprint `sha256:<64 hex>`, checked here, so no name
    /// (`../../etc/passwd`, `a/b`) can make a path outside the cache.
    pub fn path_of(
        &self,
        interface: &str,
        version: u32,
        fingerprint: &str,
    ) -> Result<PathBuf, RegistryError> {
        check_remote(interface, version)?;
        let hex = fingerprint
            .strip_prefix("sha256:")
            .filter(|_| is_fingerprint(fingerprint))
            .ok_or_else(|| RegistryError::InvalidName {
                name: shown(fingerprint),
                expected: "a fingerprint (`sha256:` and 64 lowercase hex digits)",
            })?;
        Ok(self
            .root
            .join(interface)
            .join(format!("v{version}"))
            .join(format!("{hex}.json")))
    }

    /// The cached manifest, verified against its fingerprint; `None` if absent.
    pub fn get(
        &self,
        interface: &str,
        version: u32,
        fingerprint: &str,
    ) -> Result<Option<Manifest>, RegistryError> {
        let path = self.path_of(interface, version, fingerprint)?;
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_error(&path)(error)),
        };
        // A planted file of any size is read only up to the limit.
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, crate::validate::MAX_MANIFEST_BYTES as u64 + 1),
            &mut bytes,
        )
        .map_err(io_error(&path))?;
        crate::validate::check_size(bytes.len()).map_err(|problems| {
            RegistryError::InvalidManifest {
                origin: path.display().to_string(),
                problems,
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|_| RegistryError::CorruptCache {
            path: path.clone(),
            reason: "not UTF-8".to_owned(),
        })?;
        let corrupt = |reason: String| RegistryError::CorruptCache {
            path: path.clone(),
            reason,
        };
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| corrupt(format!("not a manifest: {e}")))?;
        verify(&manifest, interface, version, Some(fingerprint)).map_err(corrupt)?;
        manifest
            .validate()
            .map_err(|problems| RegistryError::InvalidManifest {
                origin: path.display().to_string(),
                problems,
            })?;
        Ok(Some(manifest))
    }

    /// When the cached manifest was fetched (its file's modification time:
    /// a cache file is written once); `None` when it is not cached or the
    /// file system does not say.
    pub fn fetched_at(
        &self,
        interface: &str,
        version: u32,
        fingerprint: &str,
    ) -> Option<std::time::SystemTime> {
        let path = self.path_of(interface, version, fingerprint).ok()?;
        std::fs::metadata(path).ok()?.modified().ok()
    }

    /// Stores `manifest` (verified first) and returns its path. The file is
    /// written next to its final name and renamed, so a reader never sees half.
    pub fn put(&self, manifest: &Manifest) -> Result<PathBuf, RegistryError> {
        manifest
            .validate()
            .map_err(|problems| RegistryError::InvalidManifest {
                origin: format!("{} v{}", shown(&manifest.interface), manifest.version),
                problems,
            })?;
        verify(manifest, &manifest.interface, manifest.version, None).map_err(|reason| {
            RegistryError::CorruptCache {
                path: self.root.clone(),
                reason,
            }
        })?;
        let path = self.path_of(&manifest.interface, manifest.version, &manifest.fingerprint)?;
        let dir = path.parent().expect("cache paths have a parent");
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let partial = path.with_extension(format!("json.{}.partial", std::process::id()));
        std::fs::write(&partial, manifest.to_pretty_json() + "\n").map_err(io_error(&partial))?;
        std::fs::rename(&partial, &path).map_err(io_error(&path))?;
        Ok(path)
    }
}

/// Refuses an interface id that is not `package.Service` or version 0
/// before it is used in a path, a URL or a lock entry.
pub fn check_remote(interface: &str, version: u32) -> Result<(), RegistryError> {
    if !is_interface_id(interface) {
        return Err(RegistryError::InvalidName {
            name: shown(interface),
            expected: "an interface id `package.Service` (lowercase dotted package, UpperCamelCase service)",
        });
    }
    if version == 0 {
        return Err(RegistryError::InvalidName {
            name: format!("{interface} v0"),
            expected: "a version (they count from 1)",
        });
    }
    Ok(())
}

/// Checks that `manifest` is `interface` v`version` (with `fingerprint`, if
/// given) and that its fingerprint matches its content.
pub fn verify(
    manifest: &Manifest,
    interface: &str,
    version: u32,
    fingerprint: Option<&str>,
) -> Result<(), String> {
    if manifest.interface != interface || manifest.version != version {
        return Err(format!(
            "holds {} v{}, not {interface} v{version}",
            manifest.interface, manifest.version
        ));
    }
    let computed = manifest.compute_fingerprint();
    if manifest.fingerprint != computed {
        return Err(format!(
            "its fingerprint {} does not match its content ({computed})",
            manifest.fingerprint
        ));
    }
    if let Some(wanted) = fingerprint
        && wanted != computed
    {
        return Err(format!("it is {computed}, not the locked {wanted}"));
    }
    Ok(())
}

/// Where manifests come from when the lock and the cache do not have them.
pub trait Source {
    /// A human name for messages (the registry's URL).
    fn name(&self) -> String;
    /// The latest revision of one interface version.
    fn latest(&self, remote: &Remote) -> Result<Manifest, RegistryError>;
    /// One exact revision.
    fn exact(&self, remote: &Remote, fingerprint: &str) -> Result<Manifest, RegistryError>;
    /// The interface versions decommissioned at the source, with when
    /// (RFC 3339); empty when it has none or cannot say.
    fn decommissioned(&self) -> Vec<(String, u32, String)> {
        Vec::new()
    }
    /// Every published version of `interface` with its revisions, for
    /// [`freshness::check`]; a source that cannot list them says so with an
    /// empty list.
    fn versions(&self, interface: &str) -> Result<Vec<PublishedVersion>, RegistryError> {
        let _ = interface;
        Ok(Vec::new())
    }
}

/// A warning for each of `remotes` that `source` says is decommissioned:
/// a build against it still works (the lock and cache have it), but its
/// deploy would fail `rfidl deploy-check`.
pub fn decommission_warnings(remotes: &[Remote], source: &dyn Source) -> Vec<String> {
    let retired = source.decommissioned();
    remotes
        .iter()
        .filter_map(|remote| {
            retired
                .iter()
                .find(|(interface, version, _)| {
                    *interface == remote.interface && *version == remote.version
                })
                .map(|(_, _, at)| {
                    format!(
                        "rfidl: {} v{} is decommissioned in the registry {} (since {at}); \
                         move to a newer version: `rfidl deploy-check` will refuse this build",
                        remote.interface,
                        remote.version,
                        source.name()
                    )
                })
        })
        .collect()
}

/// Whether [`resolve`] keeps locked fingerprints or moves to the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockPolicy {
    /// Use the locked fingerprint; fetch only what is not locked yet.
    Keep,
    /// Fetch the latest revision of every remote and re-pin it (`rfidl fetch --update`).
    Update,
}

/// The manifest of every remote: from the cache when the lock pins one and
/// the cache has it, else from `source` (then cached and pinned in `lock`).
/// Without a source, anything missing is an error that says what to run.
pub fn resolve(
    remotes: &[Remote],
    lock: &mut LockFile,
    cache: &Cache,
    source: Option<&dyn Source>,
    policy: LockPolicy,
) -> Result<Vec<Manifest>, RegistryError> {
    for remote in remotes {
        check_remote(&remote.interface, remote.version)?;
    }
    let mut manifests = Vec::with_capacity(remotes.len());
    for remote in remotes {
        let locked = match policy {
            LockPolicy::Keep => lock.get(remote).map(|l| l.fingerprint.clone()),
            LockPolicy::Update => None,
        };
        let manifest = match locked {
            Some(fingerprint) => {
                match cache.get(&remote.interface, remote.version, &fingerprint)? {
                    Some(manifest) => manifest,
                    None => {
                        let source = source.ok_or_else(|| RegistryError::NotCached {
                            interface: remote.interface.clone(),
                            version: remote.version,
                            fingerprint: fingerprint.clone(),
                            cache: cache.root().to_path_buf(),
                        })?;
                        let manifest = source.exact(remote, &fingerprint)?;
                        cache.put(&manifest)?;
                        manifest
                    }
                }
            }
            None => {
                let source = source.ok_or_else(|| RegistryError::NotLocked {
                    interface: remote.interface.clone(),
                    version: remote.version,
                })?;
                let manifest = source.latest(remote)?;
                cache.put(&manifest)?;
                lock.pin(remote, &manifest.fingerprint);
                manifest
            }
        };
        manifests.push(manifest);
    }
    Ok(manifests)
}

/// Adds `manifest`'s service and the types it uses to `packages` (kept sorted
/// by name). A service or type that is already there must be the same
/// (docs aside), else it is a [`RegistryError::Conflict`].
pub fn merge_remote(
    packages: &mut Vec<PackageContract>,
    manifest: &Manifest,
) -> Result<(), RegistryError> {
    let conflict = |name: &str| RegistryError::Conflict {
        name: name.to_owned(),
        interface: manifest.interface.clone(),
        version: manifest.version,
    };
    for (name, def) in &manifest.types {
        let package_name = name.rsplit_once('.').map_or("", |(package, _)| package);
        let package = package_mut(packages, package_name);
        match package.types.iter().find(|(existing, _)| existing == name) {
            Some((_, existing)) if without_docs(existing) != without_docs(def) => {
                return Err(conflict(name));
            }
            Some(_) => {}
            None => package.types.push((name.clone(), def.clone())),
        }
    }
    let package = package_mut(packages, &manifest.package);
    match package
        .services
        .iter()
        .find(|s| s.interface == manifest.interface && s.version == manifest.version)
    {
        Some(existing) if existing.fingerprint != manifest.fingerprint => {
            return Err(conflict(&format!(
                "{} v{}",
                manifest.interface, manifest.version
            )));
        }
        Some(_) => {}
        None => package.services.push(manifest.clone()),
    }
    packages.sort_by(|a, b| a.package.cmp(&b.package));
    Ok(())
}

fn package_mut<'a>(packages: &'a mut Vec<PackageContract>, name: &str) -> &'a mut PackageContract {
    let index = match packages.iter().position(|p| p.package == name) {
        Some(index) => index,
        None => {
            packages.push(PackageContract {
                package: name.to_owned(),
                docs: Vec::new(),
                types: Vec::new(),
                services: Vec::new(),
            });
            packages.len() - 1
        }
    };
    &mut packages[index]
}

fn without_docs(def: &TypeDef) -> TypeDef {
    let mut bare = def.clone();
    bare.strip_docs();
    bare
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_parse_from_the_command_line_form() {
        let remote: Remote = "hr.employees.EmpService@v2".parse().expect("valid");
        assert_eq!(remote.interface, "hr.employees.EmpService");
        assert_eq!(remote.version, 2);
        assert_eq!(remote.to_string(), "hr.employees.EmpService@v2");
        for bad in [
            "EmpService@v2",
            "hr.EmpService",
            "hr.EmpService@v0",
            "hr.X@vtwo",
        ] {
            assert!(bad.parse::<Remote>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_lock_stays_sorted_and_repins_in_place() {
        let mut lock = LockFile::default();
        let b: Remote = "b.S@v1".parse().expect("valid");
        let a: Remote = "a.S@v2".parse().expect("valid");
        lock.pin(&b, "sha256:1");
        lock.pin(&a, "sha256:2");
        lock.pin(&b, "sha256:3");
        assert_eq!(lock.remotes(), vec![a, b.clone()]);
        assert_eq!(
            lock.get(&b).map(|l| l.fingerprint.as_str()),
            Some("sha256:3")
        );
    }
}
