//! The chaos harness as a library (`rfidl_chaos`): the checks it
//! makes before it starts anything, called without spawning the binary.

use clap::Parser as _;
use rfidl_chaos::{Args, SCENARIOS, run};

fn args(flags: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("chaos").chain(flags.iter().copied())).expect("flags")
}

#[test]
fn an_unknown_scenario_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("runs");
    let root_flag = root.display().to_string();
    let error =
        run(args(&["--scenario", "nope", "--dir", &root_flag])).expect_err("an unknown scenario");
    let message = error.to_string();
    assert!(message.contains("unknown scenario `nope`"), "{message}");
    for scenario in SCENARIOS {
        assert!(message.contains(scenario), "{scenario} missing: {message}");
    }
    assert!(!root.exists(), "nothing was created");
}

#[test]
fn a_folder_without_the_service_binaries_is_refused_naming_the_build_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bins = dir.path().display().to_string();
    let error =
        run(args(&["--scenario", "lost-acks", "--bin-dir", &bins])).expect_err("no binaries");
    let message = error.to_string();
    assert!(message.contains("hr-service is missing"), "{message}");
    assert!(message.contains("cargo xtask chaos"), "{message}");
}

#[test]
fn the_jetstream_cluster_scenario_runs_with_all_and_takes_its_hires_from_messages() {
    assert!(
        SCENARIOS.contains(&"jetstream-cluster"),
        "`cargo xtask chaos` (all scenarios, what CI runs) includes it"
    );
    // Without --messages every scenario picks its own default (5,000 hires
    // for jetstream-cluster); CI's `--messages 200` reaches it too.
    assert_eq!(args(&[]).messages, None);
    assert_eq!(args(&["--messages", "200"]).messages, Some(200));
}
