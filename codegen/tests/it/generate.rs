//! Generated code and manifests for `schemas/`, pinned with insta snapshots
//! (review changes with `cargo insta review`, or `INSTA_UPDATE=always` then
//! read the diff), and the fingerprint's stability rules.

use std::path::{Path, PathBuf};

use rfidl_codegen::generate::{Layout, generate_files};

use crate::support::{model_of, write_hr};

#[test]
fn generated_code_and_manifests_for_the_schemas() {
    let model = model_of(&[PathBuf::from("../schemas")]);
    let files = generate_files(
        &model.packages,
        &rfidl_codegen::Options::default(),
        Layout::SourceDir,
    )
    .expect("generate");
    for file in files {
        let name = file.name.replace('/', "__");
        insta::assert_snapshot!(name, file.contents);
    }
}

fn fingerprints(dir: &Path, hr: &str) -> Vec<(String, String)> {
    model_of(&[write_hr(dir, hr)])
        .manifests()
        .map(|m| {
            (
                format!("{} v{}", m.interface, m.version),
                m.fingerprint.clone(),
            )
        })
        .collect()
}

#[test]
fn fingerprints_ignore_layout_and_docs_but_not_meaning() {
    let original = std::fs::read_to_string("../schemas/hr.rfidl").expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    let base = fingerprints(dir.path(), &original);
    assert_eq!(base.len(), 2);

    // Reformatted: whitespace squeezed, comments dropped.
    let squeezed: String = original
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") || l.trim_start().starts_with("///"))
        .map(|l| l.split(" //").next().unwrap_or(l).trim().to_owned() + "\n")
        .collect();
    assert_ne!(squeezed, original);
    assert_eq!(
        fingerprints(dir.path(), &squeezed),
        base,
        "layout changed the fingerprint"
    );

    // Doc comments edited.
    let redocumented = original.replace(
        "/// Stable identifier issued by HR.",
        "/// The id HR issued, never reused.",
    );
    assert_ne!(redocumented, original);
    assert_eq!(
        fingerprints(dir.path(), &redocumented),
        base,
        "a doc edit changed the fingerprint"
    );

    // A field type changed: both versions use Employee, both change.
    let retyped = original.replace("    weekly_hours: f64,", "    weekly_hours: u32,");
    assert_ne!(retyped, original);
    let changed = fingerprints(dir.path(), &retyped);
    assert_ne!(changed[0].1, base[0].1);
    assert_ne!(changed[1].1, base[1].1);

    // A method added to v2 only changes v2.
    let extended = original.replacen(
        "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n\n    /// An employee goes on leave",
        "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n\n    signal BadgeIssued(employee_id: uuid);\n\n    /// An employee goes on leave",
        1,
    );
    assert_ne!(extended, original);
    let extended = fingerprints(dir.path(), &extended);
    assert_eq!(extended[0].1, base[0].1);
    assert_ne!(extended[1].1, base[1].1);
}
