//! Integration tests for rfidl-codegen (one binary: see house style).

mod breaking;
mod check;
mod cli;
mod cli_report;
mod docs;
mod fast_layout;
mod fmt_cli;
mod format;
mod format_properties;
mod generate;
mod hostile;
mod layers;
mod remote;
mod robustness;
mod schemas;
mod support;
mod ui;
mod user_crate;
