//! The README's first command, run as a process with a smaller load (150 hires, a 1 s outage): it
//! must end with exactly-once effects, healthy services and the registry
//! check passed, both services registered in the registry's directory and
//! healthy on its dashboard, and exit 0.

use std::process::Command;

#[test]
fn the_demo_runs_on_embedded_defaults_and_reports_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--hires", "150", "--outage-secs", "1", "--dir"])
        .arg(dir.path())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "employees hired (HR rows)                 150",
        "workflows started (engine effects)        150",
        "laptop tickets (HR effects of commands)   150",
        "tickets back at the engine (answers)      150",
        "hr: healthy, engine: healthy",
        "messages waiting for an operator          0",
        "the engine's compiled fingerprints match",
        "exactly once                              yes",
        "both registered with the registry; dashboard at http://127.0.0.1:",
        "dashboard (health aggregator)             engine: healthy, hr-service: healthy",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from\n{stdout}");
    }
    for db in ["hr.db", "engine.db", "registry.db"] {
        assert!(dir.path().join(db).is_file(), "{db} is a real file");
    }
}
