//! `rfidl-contract`: the contract language, shared by the generator
//! (`rfidl-codegen`), the `rfidl` tool (`rfidl-cli`) and the registry
//! (`rfidl-registry`).
//!
//! The pipeline is `syntax` (text -> AST with spans) -> `check` (rules,
//! diagnostics) -> `model` (resolved, immutable) -> `manifest`. Each stage
//! reads only the output of the one before it. This crate never generates
//! code, writes files or touches the network: that is `rfidl-codegen`'s job.
//!
//! Entry points:
//! - [`syntax::parse_file`]: one file's text -> [`syntax::ast::File`] (every
//!   node with a [`diagnostics::Span`]; `///` docs kept, `//` comments left in
//!   the text for the formatter), or the first syntax error.
//! - [`check::check_paths`]: files or folders -> [`check::CheckOutcome`] with
//!   the loaded [`SourceMap`], every [`Diagnostic`] (errors and warnings, in
//!   file and position order) and, when there is no error, the [`model::Model`].
//! - [`diagnostics::render_human`] / [`diagnostics::render_json`]: one
//!   diagnostic as rustc-style text or one JSON line. Codes: [`ErrorCode`],
//!   documented in `docs/errors.md`.
//! - [`manifest`]: a service version's canonical manifest, its fingerprint
//!   and the compatibility rules between two revisions ([`manifest::compat`]);
//!   [`validate`]: whether a manifest from outside (a registry, a cache)
//!   is one a contract could produce.
//! - [`format::format_source`]: the canonical layout of a contract file.
//! - [`wire`]: the registry's answers that its server and its client share.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod check;
pub mod diagnostics;
pub mod format;
pub mod limits;
pub mod manifest;
pub mod model;
pub mod names;
pub mod syntax;
pub mod validate;
pub mod wire;

pub use diagnostics::{Diagnostic, ErrorCode, SourceMap};
