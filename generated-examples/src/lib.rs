//! `rfidl-examples`: what `rfidl generate schemas --out generated-examples/src/generated`
//! produces, checked in so it can be read and so CI compiles it with
//! `clippy -D warnings`; plus the demo services built only on that code.
//! The fault-injection harness that runs them as processes is the
//! `rfidl-chaos` crate (`chaos/`).
//!
//! Regenerate with `cargo xtask regen`; a test fails when this copy drifts
//! from what the generator produces today.

pub mod demo;
pub mod generated;
