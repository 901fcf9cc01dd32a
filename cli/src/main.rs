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
        token_from(
            self.operator_token.as_ref(),
            self.operator_token_file.as_ref(),
            "operator token",
        )
    }
}

/// A token from a flag or variable, or from the first line of a file; the
/// error names the file, never its content.
#[cfg_attr(not(feature = "registry"), allow(dead_code))]
fn token_from(
    token: Option<&String>,
    file: Option<&PathBuf>,
    what: &str,
) -> Result<Option<String>, String> {
    let Some(path) = file else {
        return Ok(token.cloned());
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the {what} file {}: {}",
            path.display(),
            e.kind()
        )
    })?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(format!("the {what} file {} is empty", path.display()));
    }
    Ok(Some(token.to_owned()))
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
    /// Dead letters of a running service: list, count, show, retry or
    /// discard its Failed, DeadLetter and Expired outbox messages.
    Messages {
        #[command(subcommand)]
        action: MessagesAction,
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

/// `rfidl messages …`.
#[derive(Subcommand)]
#[cfg_attr(not(feature = "registry"), allow(dead_code))]
enum MessagesAction {
    /// List the messages that need a human, oldest first (every page, or
    /// one with --limit / --cursor).
    List {
        #[command(flatten)]
        filter: FailedFilterOpt,
        /// One page of at most this many messages (1 to 1,000).
        #[arg(long)]
        limit: Option<u32>,
        /// The page after the one that printed this cursor (same filter).
        #[arg(long)]
        cursor: Option<String>,
        #[command(flatten)]
        service: ServiceOpt,
    },
    /// Count them per destination and error code.
    Groups {
        #[command(flatten)]
        filter: FailedFilterOpt,
        #[command(flatten)]
        service: ServiceOpt,
    },
    /// Show one message: routing, attempts, last error, status, times
    /// (never its payload).
    Show {
        /// The message id (a UUID).
        id: String,
        #[command(flatten)]
        service: ServiceOpt,
    },
    /// Put one message, or every one matching, back to Pending.
    Retry {
        #[command(flatten)]
        selection: SelectionOpt,
        #[command(flatten)]
        service: ServiceOpt,
    },
    /// Put one message, or every one matching, aside as Discarded: never
    /// sent again.
    Discard {
        #[command(flatten)]
        selection: SelectionOpt,
        #[command(flatten)]
        service: ServiceOpt,
    },
}

/// The service a `messages` subcommand asks, its token and the output.
#[derive(Args)]
#[cfg_attr(not(feature = "registry"), allow(dead_code))]
struct ServiceOpt {
    /// The service's base URL, e.g. http://127.0.0.1:7001.
    #[arg(long, env = "RFIDL_SERVICE")]
    service: String,
    /// The service's diagnostics token (sent as a bearer token). Prefer
    /// --token-file or the environment: a flag is visible in the process list.
    #[arg(
        long,
        env = "RFIDL_OPS_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// Read the diagnostics token from this file (its first line).
    #[arg(long, env = "RFIDL_OPS_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// `text` (aligned tables on stdout) or `json` (the service's JSON, one
    /// document per line, on stdout). Errors go to stderr in both.
    #[arg(long, value_enum, default_value = "text")]
    format: TableFormatArg,
}

/// The filter of `messages list` and `groups`.
#[derive(Args)]
#[cfg_attr(not(feature = "registry"), allow(dead_code))]
struct FailedFilterOpt {
    /// Failed, DeadLetter or Expired.
    #[arg(long)]
    status: Option<String>,
    /// A destination name.
    #[arg(long)]
    destination: Option<String>,
    /// A receiving interface, `package.Service`.
    #[arg(long)]
    interface: Option<String>,
    /// A method name.
    #[arg(long)]
    method: Option<String>,
    /// Text the last error contains (a code of `groups` matches its messages).
    #[arg(long)]
    error: Option<String>,
    /// Only messages created longer ago than this, e.g. 1h30m.
    #[arg(long)]
    older_than: Option<String>,
}

/// What `messages retry` and `discard` act on: an id, or every message
/// matching the filter (the filters of `list`), or `--all`.
#[derive(Args)]
#[cfg_attr(not(feature = "registry"), allow(dead_code))]
struct SelectionOpt {
    /// The message id (a UUID).
    #[arg(
        conflicts_with_all = SELECTORS,
        required_unless_present_any = SELECTORS
    )]
    id: Option<String>,
    #[command(flatten)]
    filter: FailedFilterOpt,
    /// Every Failed, DeadLetter and Expired message.
    #[arg(long, conflicts_with_all = FILTERS)]
    all: bool,
}

/// The filters of [`FailedFilterOpt`], by argument id.
const FILTERS: [&str; 6] = [
    "status",
    "destination",
    "interface",
    "method",
    "error",
    "older_than",
];

/// What selects messages instead of an id: a filter, or `--all`.
const SELECTORS: [&str; 7] = [
    "status",
    "destination",
    "interface",
    "method",
    "error",
    "older_than",
    "all",
];

#[derive(Clone, Copy, ValueEnum)]
enum TableFormatArg {
    /// Aligned tables on stdout.
    Text,
    /// The service's JSON, one document per line, on stdout.
    Json,
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
        Command::Messages { action } => messages(action, color),
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

#[cfg(feature = "registry")]
fn messages(action: MessagesAction, color: ColorArg) -> cli::Outcome {
    let service = match &action {
        MessagesAction::List { service, .. }
        | MessagesAction::Groups { service, .. }
        | MessagesAction::Show { service, .. }
        | MessagesAction::Retry { service, .. }
        | MessagesAction::Discard { service, .. } => service,
    };
    let report = service.report(color);
    let token = match token_from(
        service.token.as_ref(),
        service.token_file.as_ref(),
        "diagnostics token",
    ) {
        Ok(token) => token,
        Err(error) => return cli::messages_error(&error, &report),
    };
    let client = match cli::MessagesService::new(&service.service, token) {
        Ok(client) => client,
        Err(error) => return cli::messages_error(&error, &report),
    };
    match action {
        MessagesAction::List {
            filter,
            limit,
            cursor,
            ..
        } => {
            let pages = if limit.is_none() && cursor.is_none() {
                cli::Pages::All
            } else {
                cli::Pages::One { limit, cursor }
            };
            cli::messages_list(&client, &filter.into(), &pages, &report)
        }
        MessagesAction::Groups { filter, .. } => {
            cli::messages_groups(&client, &filter.into(), &report)
        }
        MessagesAction::Show { id, .. } => cli::messages_show(&client, &id, &report),
        MessagesAction::Retry { selection, .. } => {
            cli::messages_retry(&client, &selection.into(), &report)
        }
        MessagesAction::Discard { selection, .. } => {
            cli::messages_discard(&client, &selection.into(), &report)
        }
    }
}

#[cfg(feature = "registry")]
impl From<FailedFilterOpt> for cli::FailedFilter {
    fn from(opt: FailedFilterOpt) -> Self {
        Self {
            status: opt.status,
            destination: opt.destination,
            interface: opt.interface,
            method: opt.method,
            error: opt.error,
            older_than: opt.older_than,
        }
    }
}

#[cfg(feature = "registry")]
impl From<SelectionOpt> for cli::Selection {
    fn from(opt: SelectionOpt) -> Self {
        match opt.id {
            Some(id) => Self::One(id),
            None => Self::Matching(opt.filter.into()),
        }
    }
}

impl ServiceOpt {
    fn report(&self, color: ColorArg) -> Report {
        FormatOpt {
            format: match self.format {
                TableFormatArg::Text => FormatArg::Text,
                TableFormatArg::Json => FormatArg::Json,
            },
        }
        .report(color)
    }
}

#[cfg(not(feature = "registry"))]
fn messages(action: MessagesAction, color: ColorArg) -> cli::Outcome {
    let (MessagesAction::List { service, .. }
    | MessagesAction::Groups { service, .. }
    | MessagesAction::Show { service, .. }
    | MessagesAction::Retry { service, .. }
    | MessagesAction::Discard { service, .. }) = action;
    without_registry_feature(&service.report(color))
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
