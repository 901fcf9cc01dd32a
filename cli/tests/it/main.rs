//! Integration tests for rfidl-cli (one binary: see house style): the
//! subcommands as library functions, and end-to-end runs of the `rfidl`
//! binary.

mod breaking;
mod cli;
mod cli_report;
#[cfg(feature = "registry")]
mod fetch;
mod fmt_cli;
// `rfidl messages` against a real service (needs `registry`: its HTTP client).
#[cfg(feature = "registry")]
mod messages;
// The README's CLI table against `rfidl --help` (all subcommands need the
// default feature `registry`).
#[cfg(feature = "registry")]
mod readme;
mod support;
