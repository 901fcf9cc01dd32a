//! `rfidl-cli`: the `rfidl` tool. `src/main.rs` defines and parses the
//! flags (clap) and calls the functions of this library, one file per
//! subcommand, so every behaviour is testable without spawning the binary.
//!
//! Every subcommand that reports takes a [`Report`]: the format (`text`:
//! rustc-style on stderr; `json`: one object per line on stdout; `github`:
//! GitHub Actions annotations on stdout for what failed, text on stderr for
//! the rest) and whether text is coloured. Each returns an [`Outcome`], the
//! process exit code.
//!
//! The subcommands that talk to a registry (`publish`, `fetch`,
//! `deploy-check`, `decommission`) or to a running service (`messages`)
//! need the cargo feature `registry`, on by default: `cargo install
//! rfidl-cli` gives the whole tool.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod breaking;
mod check;
mod completions;
#[cfg(feature = "registry")]
mod decommission;
#[cfg(feature = "registry")]
mod deploy_check;
#[cfg(feature = "registry")]
mod fetch;
mod fmt;
mod generate;
mod man;
mod manifest;
#[cfg(feature = "registry")]
mod messages;
#[cfg(feature = "registry")]
mod publish;
mod report;

pub use breaking::{VersionChange, baseline_manifests, breaking, breaking_between};
pub use check::check;
pub use completions::completions;
#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub use decommission::decommission_with;
#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub use deploy_check::deploy_check_with;
#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub use fetch::{fetch, fetch_with};
pub use fmt::{FmtMode, fmt};
pub use generate::generate;
pub use man::man;
pub use manifest::{ManifestFormat, manifest};
#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub use messages::{
    FailedFilter, MessagesService, Pages, Selection, messages_discard, messages_error,
    messages_groups, messages_list, messages_retry, messages_show,
};
#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub use publish::{publish, publish_with};
pub use report::{DiagnosticFormat, Outcome, Report};
pub use rfidl_codegen::diagnostics::ColorChoice;
