//! `rfidl-codegen`: the contract compiler.
//!
//! The pipeline is `syntax` (text -> AST with spans) -> `check` (rules,
//! diagnostics) -> `model` (resolved, immutable) -> `generate` / `manifest`.
//! Each stage reads only the output of the one before it.

pub mod builder;
pub mod check;
pub mod cli;
pub mod diagnostics;
pub mod format;
pub mod generate;
pub mod manifest;
pub mod model;
pub mod syntax;

pub use builder::{Builder, GeneratedFile, Options, Sides};
pub use diagnostics::{Diagnostic, ErrorCode, SourceMap};
