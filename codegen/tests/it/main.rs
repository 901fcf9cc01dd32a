//! Integration tests for rfidl-codegen (one binary: see house style).

mod cli;
mod format;
mod generate;
mod robustness;
mod ui;
