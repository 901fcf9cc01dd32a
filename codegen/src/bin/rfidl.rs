//! The `rfidl` command-line tool: parses flags with clap and calls the
//! library. Exit codes: 0 success, 1 contract errors, 2 usage or I/O errors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use rfidl_codegen::cli::{self, DiagnosticFormat, ManifestFormat};
use rfidl_codegen::diagnostics::ColorChoice;

#[derive(Parser)]
#[command(
    name = "rfidl",
    version,
    about = "Check .rfidl contracts and generate Rust code from them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check contracts and report every problem (a directory means every .rfidl under it).
    Check {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// `human` (rustc-style) or `json` (one object per line).
        #[arg(long, value_enum, default_value = "human")]
        format: FormatArg,
        /// Colour human output: `auto` (when stderr is a terminal and
        /// `NO_COLOR` is unset), `always` or `never`.
        #[arg(long, value_enum, default_value = "auto")]
        color: ColorArg,
    },
    /// Generate Rust code and manifests into a folder (the same code as build.rs).
    Generate {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Output folder; it becomes a Rust module (`mod.rs` nests the packages).
        #[arg(long)]
        out: PathBuf,
        /// Which side(s) to generate.
        #[arg(long, value_enum, default_value = "both")]
        sides: SidesArg,
    },
    /// Format contracts in the canonical layout, keeping comments.
    Fmt {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Do not write: list files that are not formatted and exit 1.
        #[arg(long)]
        check: bool,
    },
    /// Report changes that break peers of an interface version already published:
    /// compares each version of the baseline with the same version in the contracts.
    Breaking {
        /// The contracts as they are now.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The baseline: a manifest `.json` (one, or the array `rfidl manifest`
        /// prints), a folder of them, or `.rfidl` contracts.
        #[arg(long)]
        against: PathBuf,
        /// `human` or `json` (one change per line).
        #[arg(long, value_enum, default_value = "human")]
        format: FormatArg,
    },
    /// Publish every service version of the contracts to a registry. A new
    /// revision of a published version must be compatible (exit 1 if not).
    Publish {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The registry's base URL, e.g. http://127.0.0.1:7300.
        #[arg(long, env = "RFIDL_REGISTRY")]
        registry: String,
        /// Bearer token, if the registry requires one to publish.
        #[arg(long, env = "RFIDL_REGISTRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Pin remote interface versions in the lock file and store their
    /// manifests in the offline cache (without REMOTES: everything locked).
    Fetch {
        /// `package.Service@vN`, e.g. hr.employees.EmpService@v2.
        remotes: Vec<rfidl_codegen::registry::Remote>,
        /// The registry's base URL; without it, only the lock and cache are checked.
        #[arg(long, env = "RFIDL_REGISTRY")]
        registry: Option<String>,
        #[arg(long, default_value = "rfidl.lock")]
        lock: PathBuf,
        /// Offline cache (default: $RFIDL_CACHE_DIR, else ~/.cache/rfidl).
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Move every pin to the latest revision instead of keeping it.
        #[arg(long)]
        update: bool,
    },
    /// Print the manifest of every service version.
    Manifest {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "json")]
        format: ManifestArg,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum ColorArg {
    Auto,
    Always,
    Never,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    Human,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum SidesArg {
    Both,
    Service,
    Engine,
}

#[derive(Clone, Copy, ValueEnum)]
enum ManifestArg {
    Json,
    Yaml,
}

fn diagnostic_format(format: FormatArg) -> DiagnosticFormat {
    match format {
        FormatArg::Human => DiagnosticFormat::Human,
        FormatArg::Json => DiagnosticFormat::Json,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Check {
            paths,
            format,
            color,
        } => {
            let format = diagnostic_format(format);
            let color = match color {
                ColorArg::Auto => ColorChoice::Auto,
                ColorArg::Always => ColorChoice::Always,
                ColorArg::Never => ColorChoice::Never,
            };
            cli::check(&paths, format, color)
        }
        Command::Generate { paths, out, sides } => {
            let sides = match sides {
                SidesArg::Both => rfidl_codegen::Sides::Both,
                SidesArg::Service => rfidl_codegen::Sides::Service,
                SidesArg::Engine => rfidl_codegen::Sides::Engine,
            };
            cli::generate(&paths, &out, sides)
        }
        Command::Fmt { paths, check } => cli::fmt(
            &paths,
            if check {
                cli::FmtMode::Check
            } else {
                cli::FmtMode::Write
            },
        ),
        Command::Breaking {
            paths,
            against,
            format,
        } => cli::breaking(&against, &paths, diagnostic_format(format)),
        Command::Publish {
            paths,
            registry,
            token,
        } => publish(&registry, token.as_deref(), &paths),
        Command::Fetch {
            remotes,
            registry,
            lock,
            cache,
            update,
        } => fetch(registry.as_deref(), &lock, cache, &remotes, update),
        Command::Manifest { paths, format } => {
            let format = match format {
                ManifestArg::Json => ManifestFormat::Json,
                ManifestArg::Yaml => ManifestFormat::Yaml,
            };
            cli::manifest(&paths, format)
        }
    };
    ExitCode::from(outcome.exit_code())
}

#[cfg(feature = "registry")]
fn publish(registry: &str, token: Option<&str>, paths: &[PathBuf]) -> cli::Outcome {
    cli::publish(registry, token, paths)
}

#[cfg(feature = "registry")]
fn fetch(
    registry: Option<&str>,
    lock: &std::path::Path,
    cache: Option<PathBuf>,
    remotes: &[rfidl_codegen::registry::Remote],
    update: bool,
) -> cli::Outcome {
    use rfidl_codegen::registry::{Cache, LockPolicy};
    let cache = Cache::new(cache.unwrap_or_else(Cache::default_dir));
    let policy = if update {
        LockPolicy::Update
    } else {
        LockPolicy::Keep
    };
    cli::fetch(registry, lock, &cache, remotes, policy)
}

#[cfg(not(feature = "registry"))]
fn publish(_: &str, _: Option<&str>, _: &[PathBuf]) -> cli::Outcome {
    without_registry_feature()
}

#[cfg(not(feature = "registry"))]
fn fetch(
    _: Option<&str>,
    _: &std::path::Path,
    _: Option<PathBuf>,
    _: &[rfidl_codegen::registry::Remote],
    _: bool,
) -> cli::Outcome {
    without_registry_feature()
}

#[cfg(not(feature = "registry"))]
fn without_registry_feature() -> cli::Outcome {
    eprintln!(
        "error: this rfidl was built without the `registry` feature; \
         run it with `cargo run -p rfidl-codegen --features registry --bin rfidl -- …` \
         or install it with `cargo install rfidl-codegen --features registry`"
    );
    cli::Outcome::UsageOrIo
}
