//! `chaos`: "nothing lost, nothing done twice", measured under faults.
//!
//! Parses the flags and runs [`rfidl_chaos`], where the harness
//! lives (scenarios, process control, the proxy, the report). Run it
//! through `cargo xtask chaos [--messages N] [--scenario NAME]`, which
//! builds the binaries first. See docs/guarantees.md.

use clap::Parser as _;
use rfidl_chaos::{Args, run};

fn main() -> anyhow::Result<()> {
    run(Args::parse())
}
