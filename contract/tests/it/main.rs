//! Integration tests for rfidl-contract (one binary: see house style).

mod check;
mod docs;
mod format;
mod format_properties;
mod layers;
mod robustness;
mod schemas;
mod ui;
