//! `cargo xtask`: project chores (test set-up, regeneration, benchmarks).
fn main() {}
