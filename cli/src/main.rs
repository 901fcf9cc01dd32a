//! The `rfidl` command-line tool: parses flags with clap and calls the
//! `rfidl_cli` library (one file per subcommand). Exit codes: 0 success,
//! 1 contract errors, 2 usage or I/O errors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory as _, Parser, Subcommand, ValueEnum};
use rfidl_cli::{self as cli, DiagnosticFormat, ManifestFormat, Report};
use rfidl_codegen::diagnostics::ColorChoice;

#[derive(Parser)]
#[command(
    name = "rfidl",
    version,
    about = "Check .rfidl contracts and generate Rust code from them"
)]
struct Cli {
    /// Colour text output: `auto` (when stderr is a terminal and `NO_COLOR`
    /// is unset), `always` or `never`.
    #[arg(long, global = true, value_enum, default_value = "auto")]
    color: ColorArg,
    #[command(subcommand)]
    command: Command,
}

/// `--format` of the subcommands that report.
#[derive(Args)]
struct FormatOpt {
    /// `text` (rustc-style, on stderr), `json` (one object per line, on
    /// stdout) or `github` (GitHub Actions annotations, on stdout).
    #[arg(long, value_enum, default_value = "text")]
    format: FormatArg,
}

/// The registry's operator token, for `decommission` and `recommission`.
#[derive(Args)]
struct OperatorTokenOpt {
    /// The registry's operator token (sent as a bearer token), if it has
    /// one. Prefer --operator-token-file or the environment: a flag is
    /// visible to every user of the machine in the process list.
    #[arg(
        long = "operator-token",
        alias = "token",
        env = "RFIDL_REGISTRY_OPERATOR_TOKEN",
        hide_env_values = true,
        conflicts_with = "operator_token_file"
    )]
    operator_token: Option<String>,
    /// Read the operator token from this file (its first line).
    #[arg(long, env = "RFIDL_REGISTRY_OPERATOR_TOKEN_FILE")]
    operator_token_file: Option<PathBuf>,
}

impl OperatorTokenOpt {
    /// The token, from the flag, the variable or the file; the error names
    /// the file, never its content.
    #[cfg_attr(not(feature = "registry"), allow(dead_code))]
    fn resolve(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.operator_token_file else {
            return Ok(self.operator_token.clone());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the operator token file {}: {}",
                path.display(),
                e.kind()
            )
        })?;
        let token = text.lines().next().unwrap_or("").trim();
        if token.is_empty() {
            return Err(format!(
                "the operator token file {} is empty",
                path.display()
            ));
        }
        Ok(Some(token.to_owned()))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check contracts and report every problem (a directory means every .rfidl under it).
    Check {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[command(flatten)]
        format: FormatOpt,
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
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Format contracts in the canonical layout, keeping comments.
    Fmt {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Do not write: list files that are not formatted and exit 1.
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        format: FormatOpt,
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
        #[command(flatten)]
        format: FormatOpt,
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
        #[command(flatten)]
        format: FormatOpt,
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
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Before a deploy: ask the registry whether every interface version
    /// this build calls is hosted by a registered provider at the locked
    /// fingerprint or a later compatible revision (exit 1 if not).
    DeployCheck {
        /// Lock files (`*.lock`) or contracts; default: rfidl.lock.
        paths: Vec<PathBuf>,
        /// The registry's base URL, e.g. http://127.0.0.1:7300.
        #[arg(long, env = "RFIDL_REGISTRY")]
        registry: String,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Mark interface versions decommissioned in the registry: consumers
    /// that call them fail `rfidl deploy-check` and cannot register.
    Decommission {
        /// `package.Service@vN`, e.g. hr.employees.EmpService@v1.
        #[arg(required = true)]
        remotes: Vec<rfidl_codegen::registry::Remote>,
        /// The registry's base URL, e.g. http://127.0.0.1:7300.
        #[arg(long, env = "RFIDL_REGISTRY")]
        registry: String,
        #[command(flatten)]
        operator: OperatorTokenOpt,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Undo `rfidl decommission`.
    Recommission {
        /// `package.Service@vN`.
        #[arg(required = true)]
        remotes: Vec<rfidl_codegen::registry::Remote>,
        /// The registry's base URL.
        #[arg(long, env = "RFIDL_REGISTRY")]
        registry: String,
        #[command(flatten)]
        operator: OperatorTokenOpt,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Print the manifest of every service version.
    Manifest {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The manifests' format (diagnostics, if any, are text on stderr).
        #[arg(long, value_enum, default_value = "json")]
        format: ManifestArg,
    },
    /// Print a shell completion script, e.g. `rfidl completions bash >
    /// ~/.local/share/bash-completion/completions/rfidl`.
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout, or write one page per
    /// subcommand into a folder.
    Man {
        /// Write `rfidl.1`, `rfidl-check.1`, … into this folder instead.
        #[arg(long)]
        out: Option<PathBuf>,
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
    /// rustc-style text on stderr (also accepted as `human`).
    #[value(alias = "human")]
    Text,
    /// One JSON object per line on stdout.
    Json,
    /// GitHub Actions annotations (`::error file=…,line=…::…`) on stdout.
    Github,
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

impl FormatOpt {
    fn report(&self, color: ColorArg) -> Report {
        let format = match self.format {
            FormatArg::Text => DiagnosticFormat::Human,
            FormatArg::Json => DiagnosticFormat::Json,
            FormatArg::Github => DiagnosticFormat::Github,
        };
        let color = match color {
            ColorArg::Auto => ColorChoice::Auto,
            ColorArg::Always => ColorChoice::Always,
            ColorArg::Never => ColorChoice::Never,
        };
        Report::new(format, color)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let color = cli.color;
    let outcome = match cli.command {
        Command::Check { paths, format } => cli::check(&paths, &format.report(color)),
        Command::Generate {
            paths,
            out,
            sides,
            format,
        } => {
            let sides = match sides {
                SidesArg::Both => rfidl_codegen::Sides::Both,
                SidesArg::Service => rfidl_codegen::Sides::Service,
                SidesArg::Engine => rfidl_codegen::Sides::Engine,
            };
            cli::generate(&paths, &out, sides, &format.report(color))
        }
        Command::Fmt {
            paths,
            check,
            format,
        } => cli::fmt(
            &paths,
            if check {
                cli::FmtMode::Check
            } else {
                cli::FmtMode::Write
            },
            &format.report(color),
        ),
        Command::Breaking {
            paths,
            against,
            format,
        } => cli::breaking(&against, &paths, &format.report(color)),
        Command::Publish {
            paths,
            registry,
            token,
            format,
        } => publish(&registry, token.as_deref(), &paths, &format.report(color)),
        Command::Fetch {
            remotes,
            registry,
            lock,
            cache,
            update,
            format,
        } => fetch(
            registry.as_deref(),
            &lock,
            cache,
            &remotes,
            update,
            &format.report(color),
        ),
        Command::DeployCheck {
            paths,
            registry,
            format,
        } => deploy_check(&registry, &paths, &format.report(color)),
        Command::Decommission {
            remotes,
            registry,
            operator,
            format,
        } => decommission(&registry, &operator, &remotes, true, &format.report(color)),
        Command::Recommission {
            remotes,
            registry,
            operator,
            format,
        } => decommission(&registry, &operator, &remotes, false, &format.report(color)),
        Command::Manifest { paths, format } => {
            let format = match format {
                ManifestArg::Json => ManifestFormat::Json,
                ManifestArg::Yaml => ManifestFormat::Yaml,
            };
            let report = FormatOpt {
                format: FormatArg::Text,
            }
            .report(color);
            cli::manifest(&paths, format, &report)
        }
        Command::Completions { shell } => cli::completions(Cli::command(), shell),
        Command::Man { out } => cli::man(Cli::command(), out),
    };
    ExitCode::from(outcome.exit_code())
}

#[cfg(feature = "registry")]
fn publish(
    registry: &str,
    token: Option<&str>,
    paths: &[PathBuf],
    report: &Report,
) -> cli::Outcome {
    cli::publish_with(registry, token, paths, report)
}

#[cfg(feature = "registry")]
fn fetch(
    registry: Option<&str>,
    lock: &std::path::Path,
    cache: Option<PathBuf>,
    remotes: &[rfidl_codegen::registry::Remote],
    update: bool,
    report: &Report,
) -> cli::Outcome {
    use rfidl_codegen::registry::{Cache, LockPolicy};
    let cache = Cache::new(cache.unwrap_or_else(Cache::default_dir));
    let policy = if update {
        LockPolicy::Update
    } else {
        LockPolicy::Keep
    };
    cli::fetch_with(registry, lock, &cache, remotes, policy, report)
}

#[cfg(feature = "registry")]
fn deploy_check(registry: &str, paths: &[PathBuf], report: &Report) -> cli::Outcome {
    cli::deploy_check_with(registry, paths, report)
}

#[cfg(feature = "registry")]
fn decommission(
    registry: &str,
    operator: &OperatorTokenOpt,
    remotes: &[rfidl_codegen::registry::Remote],
    on: bool,
    report: &Report,
) -> cli::Outcome {
    let token = match operator.resolve() {
        Ok(token) => token,
        Err(error) => {
            report.error(&error);
            return cli::Outcome::UsageOrIo;
        }
    };
    cli::decommission_with(registry, token.as_deref(), remotes, on, report)
}

#[cfg(not(feature = "registry"))]
fn decommission(
    _: &str,
    _: &OperatorTokenOpt,
    _: &[rfidl_codegen::registry::Remote],
    _: bool,
    report: &Report,
) -> cli::Outcome {
    without_registry_feature(report)
}

#[cfg(not(feature = "registry"))]
fn deploy_check(_: &str, _: &[PathBuf], report: &Report) -> cli::Outcome {
    without_registry_feature(report)
}

#[cfg(not(feature = "registry"))]
fn publish(_: &str, _: Option<&str>, _: &[PathBuf], report: &Report) -> cli::Outcome {
    without_registry_feature(report)
}

#[cfg(not(feature = "registry"))]
fn fetch(
    _: Option<&str>,
    _: &std::path::Path,
    _: Option<PathBuf>,
    _: &[rfidl_codegen::registry::Remote],
    _: bool,
    report: &Report,
) -> cli::Outcome {
    without_registry_feature(report)
}

#[cfg(not(feature = "registry"))]
fn without_registry_feature(report: &Report) -> cli::Outcome {
    report.error(
        "this rfidl was built without the `registry` feature (on by default); \
         install it with `cargo install rfidl-cli`, or run it here with `cargo run -p rfidl-cli -- …`",
    );
    cli::Outcome::UsageOrIo
}
