//! Integration tests for rfidl-codegen (one binary: see house style). The
//! language's tests are rfidl-contract's, the `rfidl` tool's rfidl-cli's.

mod fast_layout;
mod generate;
mod hostile;
mod layers;
mod remote;
mod support;
mod user_crate;
