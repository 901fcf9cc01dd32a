//! Integration tests for rfidl-codegen (one binary: see house style).

mod cli;
mod ui;
