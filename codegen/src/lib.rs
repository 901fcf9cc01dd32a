//! `rfidl-codegen`: Rust code from `.rfidl` contracts, for build scripts.
//!
//! [`Builder`] checks contracts (with `rfidl-contract`), adds remote
//! interfaces pinned in `rfidl.lock` ([`registry`]: the lock file, the
//! offline cache and, with the cargo feature `registry`, the HTTP client),
//! generates the code ([`generate`]) and writes it to `OUT_DIR` only where
//! it changed ([`output`]). No flag parsing lives here: the `rfidl` tool is
//! the `rfidl-cli` crate, so a build script compiles no clap.
//!
//! The contract language itself (parser, checker, model, manifests,
//! validation, formatter, diagnostics) is `rfidl-contract`; its modules are
//! re-exported here under the same names ([`check`], [`manifest`], …), so a
//! build script needs one dependency.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod builder;
pub mod generate;
pub mod output;
pub mod registry;

pub use rfidl_contract::{
    check, diagnostics, format, limits, manifest, model, names, syntax, validate,
};

pub use builder::Builder;
pub use diagnostics::{Diagnostic, ErrorCode, SourceMap};
pub use generate::{GeneratedFile, Options, Sides};
