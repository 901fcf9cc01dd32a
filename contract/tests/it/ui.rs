//! UI tests: every `tests/ui/*.rfidl` file (or `tests/ui/<case>/main.rfidl`
//! for multi-file cases) is checked, and the rendered diagnostics must equal
//! the `.stderr` file beside it. `BLESS=1 cargo test -p rfidl-contract` rewrites
//! the expectations; read the diff before committing it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rfidl_contract::ErrorCode;
use rfidl_contract::check::check_paths;

/// (case name, root file to check, expectation file).
fn cases() -> Vec<(String, PathBuf, PathBuf)> {
    let dir = Path::new("tests/ui");
    let mut cases = Vec::new();
    for entry in std::fs::read_dir(dir).expect("tests/ui exists") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .expect("stem")
            .to_string_lossy()
            .into_owned();
        if path.is_dir() {
            cases.push((
                name.clone(),
                path.join("main.rfidl"),
                dir.join(format!("{name}.stderr")),
            ));
        } else if path.extension().is_some_and(|e| e == "rfidl") {
            cases.push((
                name.clone(),
                path.clone(),
                dir.join(format!("{name}.stderr")),
            ));
        }
    }
    cases.sort();
    cases
}

fn render(root: &Path) -> (String, BTreeSet<&'static str>) {
    let outcome = check_paths(&[root.to_path_buf()]).expect("ui inputs are readable");
    let codes = outcome.diagnostics.iter().map(|d| d.code.code()).collect();
    (outcome.render_human(), codes)
}

#[test]
fn diagnostics_match_expectations() {
    let bless = std::env::var_os("BLESS").is_some();
    let mut failures = Vec::new();
    for (name, root, expected_path) in cases() {
        let (actual, _) = render(&root);
        if bless {
            std::fs::write(&expected_path, &actual).expect("write expectation");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            failures.push(format!(
                "--- {name}: expected\n{expected}\n--- {name}: actual\n{actual}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} UI case(s) differ (BLESS=1 to accept):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A case named `eXXXX_…` (or `wXXXX_…`) must report that code; an `ok_…`
/// case nothing at all.
#[test]
fn each_case_reports_the_code_in_its_name() {
    for (name, root, _) in cases() {
        let (rendered, codes) = render(&root);
        if let Some(code) = name
            .split('_')
            .next()
            .filter(|c| (c.starts_with('e') || c.starts_with('w')) && c.len() == 5)
        {
            let code = code.to_uppercase();
            assert!(
                codes.contains(code.as_str()),
                "{name} should report {code}, got {codes:?}:\n{rendered}"
            );
        }
        if name.starts_with("ok_") {
            assert!(rendered.is_empty(), "{name} should pass:\n{rendered}");
        }
    }
}

#[test]
fn every_error_code_has_a_ui_case() {
    let names: Vec<String> = cases().into_iter().map(|(name, _, _)| name).collect();
    let missing: Vec<&str> = ErrorCode::ALL
        .iter()
        .map(|c| c.code())
        .filter(|code| !names.iter().any(|n| n.starts_with(&code.to_lowercase())))
        .collect();
    assert!(
        missing.is_empty(),
        "error codes without a UI case: {missing:?}"
    );
}

#[test]
fn every_error_code_is_documented() {
    let docs = std::fs::read_to_string("../docs/errors.md").expect("docs/errors.md exists");
    let missing: Vec<&str> = ErrorCode::ALL
        .iter()
        .map(|c| c.code())
        .filter(|code| !docs.contains(&format!("## {code}")))
        .collect();
    assert!(
        missing.is_empty(),
        "error codes missing from docs/errors.md: {missing:?}"
    );
}
