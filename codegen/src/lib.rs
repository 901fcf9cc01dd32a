//! `rfidl-codegen`: the contract compiler.
//!
//! The pipeline is `syntax` (text -> AST with spans) -> `check` (rules,
//! diagnostics) -> `model` (resolved, immutable) -> `generate` / `manifest`.
//! Each stage reads only the output of the one before it.
//!
//! Entry points of the contract front-end:
//! - [`syntax::parse_file`]: one file's text -> [`syntax::ast::File`] (every
//!   node with a [`diagnostics::Span`]; `///` docs kept, `//` comments left in
//!   the text for the formatter), or the first syntax error.
//! - [`check::check_paths`]: files or folders -> [`check::CheckOutcome`] with
//!   the loaded [`SourceMap`], every [`Diagnostic`] (errors and warnings, in
//!   file and position order) and, when there is no error, the [`model::Model`].
//! - [`diagnostics::render_human`] / [`diagnostics::render_json`]: one
//!   diagnostic as rustc-style text or one JSON line. Codes: [`ErrorCode`],
//!   documented in `docs/errors.md`.

pub mod builder;
pub mod check;
pub mod cli;
pub mod diagnostics;
pub mod format;
pub mod generate;
pub mod limits;
pub mod manifest;
pub mod model;
pub mod names;
pub mod output;
pub mod registry;
pub mod syntax;
pub mod validate;

pub use builder::Builder;
pub use diagnostics::{Diagnostic, ErrorCode, SourceMap};
pub use generate::{GeneratedFile, Options, Sides};
