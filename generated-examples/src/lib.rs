//! `rfidl-examples`: what `rfidl generate schemas --out generated-examples/src/generated`
//! produces, checked in so it can be read and so CI compiles it with
//! `clippy -D warnings`; plus the demo services built only on that code.
//!
//! Regenerate with `cargo xtask regen`; a test fails when this copy drifts
//! from what the generator produces today.

pub mod chaos;
pub mod demo;
pub mod generated;
