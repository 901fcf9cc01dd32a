//! Integration tests for rfidl-cli (one binary: see house style): the
//! subcommands as library functions, and end-to-end runs of the `rfidl`
//! binary.

mod breaking;
mod cli;
mod cli_report;
#[cfg(feature = "registry")]
mod fetch;
mod fmt_cli;
// The README's CLI table against `rfidl --help` (all subcommands need the
// default feature `registry`).
#[cfg(feature = "registry")]
mod readme;
mod support;
