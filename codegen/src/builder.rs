//! The `build.rs` API, in the spirit of prost-build and tonic-build.
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     rfidl_codegen::Builder::new().compile(&["schemas/hr.rfidl"])?;
//!     Ok(())
//! }
//! ```
//!
//! Output goes to `OUT_DIR` (or [`Builder::out_dir`]); a file is written only
//! when its content changed, so an unchanged contract costs no rebuild of the
//! crate. Every file read is announced with `cargo:rerun-if-changed`.
//! Contract errors fail the build with the same rustc-style diagnostics as
//! `rfidl check`.
//!
//! **Remote interfaces** ([`Builder::remote`]) come from a registry instead of
//! a contract file: the build reads the fingerprint pinned in `rfidl.lock`
//! and the manifest from the offline cache, and touches the network only for
//! what those lack (with the cargo feature `registry` and a registry URL from
//! [`Builder::registry`] or `RFIDL_REGISTRY`). With the lock committed and
//! the cache filled (`rfidl fetch`), the build works with the registry down.
//! With a registry configured, the build warns (`cargo:warning`) when it has
//! a newer revision or version of a pinned interface, and when it cannot be
//! reached, says how old the cached copy is ([`registry::freshness`]).

use std::path::{Path, PathBuf};

use crate::generate::options::{TypeRule, TypeRuleKind};
pub use crate::generate::{GeneratedFile, Options, Sides};
pub use crate::output::write_if_changed;
use crate::registry::{self, Cache, LockFile, LockPolicy, RegistryError, Remote};

/// Configures and runs code generation from a `build.rs`.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Builder {
    options: Options,
    out_dir: Option<PathBuf>,
    include_paths: Vec<PathBuf>,
    emit_rerun_if_changed: bool,
    remotes: Vec<Remote>,
    registry: Option<String>,
    lock_file: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
}

impl Builder {
    /// Defaults: both sides, output to `OUT_DIR`, `rerun-if-changed` printed.
    pub fn new() -> Self {
        Self {
            options: Options::default(),
            out_dir: None,
            include_paths: Vec::new(),
            emit_rerun_if_changed: true,
            remotes: Vec::new(),
            registry: None,
            lock_file: None,
            cache_dir: None,
        }
    }

    /// Also generates code for `interface` (`package.Service`) version
    /// `version`, published to a registry: see the module docs.
    pub fn remote(mut self, interface: impl Into<String>, version: u32) -> Self {
        self.remotes.push(Remote {
            interface: interface.into(),
            version,
        });
        self
    }

    /// The registry to fetch remote interfaces from when the lock or the
    /// cache lacks them (default: `$RFIDL_REGISTRY`). Needs the cargo feature
    /// `registry`; without it, the build reads only the lock and the cache.
    pub fn registry(mut self, url: impl Into<String>) -> Self {
        self.registry = Some(url.into());
        self
    }

    /// The lock file (default: `rfidl.lock` in `CARGO_MANIFEST_DIR`).
    pub fn lock_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.lock_file = Some(path.into());
        self
    }

    /// The offline cache (default: [`Cache::default_dir`]).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Generates only one side (default: both).
    pub fn sides(mut self, sides: Sides) -> Self {
        self.options.sides = sides;
        self
    }

    /// Writes into `dir` instead of `OUT_DIR`.
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Also looks for imported files in `dir` (after the importing file's own folder).
    pub fn include_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.include_paths.push(dir.into());
        self
    }

    /// Adds `#[derive(<derive>)]` items (e.g. `"Eq, Hash"`) to the matching types.
    ///
    /// `path` selects records and enums by their fully qualified contract
    /// name (`hr.employees.Employee`), by package (`hr.employees`, or `hr`
    /// for every package below it), or `.` for every type. The text is
    /// Rust, checked when the code is generated (an invalid one fails with
    /// [`GenerateError::InvalidRust`](crate::generate::GenerateError::InvalidRust)).
    pub fn type_derive(mut self, path: impl Into<String>, derive: impl Into<String>) -> Self {
        self.options.type_rules.push(TypeRule {
            path: path.into(),
            kind: TypeRuleKind::Derive(derive.into()),
        });
        self
    }

    /// Adds an attribute (e.g. `"#[non_exhaustive]"`) to the matching types,
    /// selected by `path` as for [`type_derive`](Self::type_derive).
    pub fn type_attribute(mut self, path: impl Into<String>, attribute: impl Into<String>) -> Self {
        self.options.type_rules.push(TypeRule {
            path: path.into(),
            kind: TypeRuleKind::Attribute(attribute.into()),
        });
        self
    }

    /// Stops printing `cargo:rerun-if-changed` lines (for use outside build scripts).
    pub fn skip_rerun_if_changed(mut self) -> Self {
        self.emit_rerun_if_changed = false;
        self
    }
}

/// Why a build script's generation failed.
///
/// Its `Debug` form is its `Display` form, so a `build.rs` that returns it
/// with `?` ends with one readable line (`Error: rfidl: 2 errors in the
/// contracts, see the diagnostics above`) instead of an escaped dump: the
/// diagnostics themselves were already printed to stderr, once.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The contracts have errors. The rendered diagnostics were printed to
    /// stderr (where cargo shows a failed build script's output) and are
    /// kept in `rendered`; the message is a one-line summary.
    #[error(
        "rfidl: {errors} error{} in the contracts, see the diagnostics above",
        if *errors == 1 { "" } else { "s" }
    )]
    Contract {
        /// How many errors the check found.
        errors: usize,
        /// Every diagnostic (errors and warnings), rendered like rustc's.
        rendered: String,
    },
    /// A path given to [`Builder::compile`] could not be read (missing, not
    /// readable, a directory without `.rfidl` files). A missing *import* is
    /// a contract error ([`BuildError::Contract`], E0060) instead.
    #[error(transparent)]
    Load(#[from] crate::check::LoadError),
    /// The generator failed on checked contracts: a bug in rfidl-codegen,
    /// or a [`Builder::type_derive`] / [`Builder::type_attribute`] text that
    /// is not valid Rust.
    #[error(transparent)]
    Generate(#[from] crate::generate::GenerateError),
    /// A generated file could not be written into the output directory.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file that failed: the output directory joined with
        /// [`GeneratedFile::name`].
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Neither [`Builder::out_dir`] nor the `OUT_DIR` environment variable
    /// (which cargo sets for build scripts) says where to write.
    #[error("OUT_DIR is not set: call compile from a build script, or set Builder::out_dir")]
    NoOutDir,
    /// A remote interface ([`Builder::remote`]) could not be resolved from
    /// the lock file, the cache or the registry, or conflicts with a local
    /// contract.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// The same text as `Display`: `fn main() -> Result<(), Box<dyn Error>>`
/// prints an error returned from `main` with `Debug`.
impl std::fmt::Debug for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl Builder {
    /// Checks `paths` (files or directories) and writes the generated code
    /// and manifests into the output directory.
    ///
    /// Adds the remote interfaces ([`Builder::remote`]) and returns every
    /// generated file (names relative to the output directory). Contract
    /// warnings are passed to cargo as `cargo:warning` lines.
    ///
    /// # Errors
    ///
    /// Any [`BuildError`]: contract errors (rendered to stderr first),
    /// unreadable paths, unresolvable remote interfaces, a missing `OUT_DIR`,
    /// a file that cannot be written.
    pub fn compile(&self, paths: &[impl AsRef<Path>]) -> Result<Vec<GeneratedFile>, BuildError> {
        let roots: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        if self.emit_rerun_if_changed {
            for root in &roots {
                // A directory: new files in it must trigger a rerun too.
                println!("cargo:rerun-if-changed={}", root.display());
            }
        }
        let mut packages = if roots.is_empty() {
            Vec::new()
        } else {
            self.check_local(&roots)?
        };
        for manifest in self.resolve_remotes()? {
            // Resolution validated it where it came from (registry, cache);
            // checked again here, right before it becomes code.
            manifest
                .validate()
                .map_err(|problems| RegistryError::InvalidManifest {
                    origin: format!("{} v{}", manifest.interface, manifest.version),
                    problems,
                })?;
            registry::merge_remote(&mut packages, &manifest)?;
        }
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or(BuildError::NoOutDir)?,
        };
        let files = crate::generate::generate_files(
            &packages,
            &self.options,
            crate::generate::Layout::OutDir,
        )?;
        for file in &files {
            let path = out_dir.join(&file.name);
            write_if_changed(&path, &file.contents)
                .map_err(|source| BuildError::Write { path, source })?;
        }
        Ok(files)
    }
}

impl Builder {
    /// Checks the local contracts; their packages, or the rendered errors.
    fn check_local(
        &self,
        roots: &[PathBuf],
    ) -> Result<Vec<crate::manifest::PackageContract>, BuildError> {
        let outcome = crate::check::check_paths_with_includes(roots, &self.include_paths)?;
        if self.emit_rerun_if_changed {
            for path in &outcome.read_paths {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        let rendered = outcome.render_human();
        if outcome.has_errors() {
            eprint!("{rendered}");
            let errors = outcome.diagnostics.iter().filter(|d| d.is_error()).count();
            return Err(BuildError::Contract { errors, rendered });
        }
        for line in rendered.lines() {
            println!("cargo:warning={line}");
        }
        Ok(outcome.model.expect("no errors means a model").packages)
    }

    /// The manifests of the remote interfaces: lock + cache, then the
    /// registry for what they lack; new pins are written to the lock file.
    fn resolve_remotes(&self) -> Result<Vec<crate::manifest::Manifest>, BuildError> {
        if self.remotes.is_empty() {
            return Ok(Vec::new());
        }
        let lock_path = self.lock_file.clone().unwrap_or_else(|| {
            std::env::var_os("CARGO_MANIFEST_DIR")
                .map(PathBuf::from)
                .unwrap_or_default()
                .join("rfidl.lock")
        });
        if self.emit_rerun_if_changed {
            println!("cargo:rerun-if-changed={}", lock_path.display());
            println!("cargo:rerun-if-env-changed=RFIDL_REGISTRY");
        }
        let mut lock = LockFile::load(&lock_path)?;
        let cache = Cache::new(self.cache_dir.clone().unwrap_or_else(Cache::default_dir));
        let source = self.source()?;
        let manifests = registry::resolve(
            &self.remotes,
            &mut lock,
            &cache,
            source.as_deref(),
            LockPolicy::Keep,
        )?;
        lock.save(&lock_path)?;
        if let Some(source) = source.as_deref() {
            // Newer revisions or versions, or how old the cached copy is
            // when the registry is unreachable (then it is not asked again).
            let freshness = registry::freshness::check(
                &self.remotes,
                &lock,
                &cache,
                source,
                std::time::SystemTime::now(),
            );
            for warning in &freshness.warnings {
                println!("cargo:warning=rfidl: {warning}");
            }
            if freshness.reachable {
                for warning in registry::decommission_warnings(&self.remotes, source) {
                    println!("cargo:warning={warning}");
                }
            }
        }
        Ok(manifests)
    }

    #[cfg(feature = "registry")]
    fn source(&self) -> Result<Option<Box<dyn registry::Source>>, BuildError> {
        let url = self.registry.clone().or_else(|| {
            std::env::var("RFIDL_REGISTRY")
                .ok()
                .filter(|u| !u.is_empty())
        });
        match url {
            Some(url) => Ok(Some(Box::new(registry::client::RegistryClient::new(&url)?))),
            None => Ok(None),
        }
    }

    #[cfg(not(feature = "registry"))]
    fn source(&self) -> Result<Option<Box<dyn registry::Source>>, BuildError> {
        if self.registry.is_some() {
            println!(
                "cargo:warning=rfidl: Builder::registry is ignored: rfidl-codegen was built \
                 without the `registry` feature, so only rfidl.lock and the cache are read"
            );
        }
        Ok(None)
    }
}
