//! Hostile input never panics: random bytes, random mutations of the example
//! schemas, extreme nesting. Every failure is a diagnostic.

use std::path::PathBuf;

use proptest::prelude::*;
use rfidl_contract::ErrorCode;
use rfidl_contract::check::check_paths;
use rfidl_contract::diagnostics::FileId;
use rfidl_contract::format::format_source;
use rfidl_contract::syntax::parse_file;

fn schemas() -> Vec<String> {
    rfidl_contract::check::load::contract_files(std::path::Path::new("../schemas"))
        .expect("schemas")
        .into_iter()
        .map(|p| std::fs::read_to_string(p).expect("read"))
        .collect()
}

/// Checks `bytes` as a file of its own (imports of the mutated file may
/// point anywhere; missing ones are diagnostics too).
fn check_bytes(dir: &tempfile::TempDir, bytes: &[u8]) -> rfidl_contract::check::CheckOutcome {
    let path: PathBuf = dir.path().join("input.rfidl");
    std::fs::write(&path, bytes).expect("write");
    check_paths(&[path]).expect("the file exists")
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, String),
    Swap(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let tokens = prop::sample::select(vec![
        "{",
        "}",
        "<",
        ">",
        "(",
        ")",
        "?",
        ";",
        ",",
        ":",
        "@",
        "\"",
        "\\",
        "///",
        "//",
        "\n",
        "list<",
        "map<",
        "record",
        "service",
        "v0",
        "v99999999999",
        "signal",
        "->",
        "é",
        "\u{0}",
        "\r\n",
        "\t",
    ]);
    prop_oneof![
        (any::<usize>(), 1usize..20).prop_map(|(at, len)| Mutation::Delete(at, len)),
        (any::<usize>(), tokens).prop_map(|(at, token)| Mutation::Insert(at, token.to_owned())),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(text: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    for mutation in mutations {
        let len = bytes.len().max(1);
        match mutation {
            Mutation::Delete(at, n) => {
                let start = at % len;
                let end = (start + n).min(bytes.len());
                bytes.drain(start.min(end)..end);
            }
            Mutation::Insert(at, token) => {
                let at = at % (bytes.len() + 1);
                bytes.splice(at..at, token.bytes());
            }
            Mutation::Swap(a, b) if !bytes.is_empty() => {
                let (a, b) = (a % bytes.len(), b % bytes.len());
                bytes.swap(a, b);
            }
            Mutation::Truncate(at) => bytes.truncate(at % len),
            Mutation::Swap(..) => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics_the_parser_or_formatter(text in "\\PC{0,300}") {
        let _ = parse_file(FileId::default(), &text);
        let _ = format_source(&text);
    }

    #[test]
    fn mutated_schemas_never_panic_and_errors_are_diagnostics(
        which in 0usize..3,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let schemas = schemas();
        let bytes = apply(&schemas[which % schemas.len()], &mutations);
        let dir = tempfile::tempdir().expect("tempdir");
        let outcome = check_bytes(&dir, &bytes);
        // Either a model or at least one error, never neither.
        prop_assert!(outcome.model.is_some() != outcome.has_errors());
        let _ = outcome.render_human();
        if let Ok(text) = std::str::from_utf8(&bytes) {
            let _ = format_source(text);
        }
    }
}

#[test]
fn random_bytes_get_a_diagnostic_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut seed: u64 = 0x5eed;
    for _ in 0..200 {
        let len = (seed % 200) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as u8
            })
            .collect();
        let outcome = check_bytes(&dir, &bytes);
        assert!(
            outcome.has_errors(),
            "random bytes were accepted: {bytes:?}"
        );
    }
}

#[test]
fn non_utf8_input_gets_e0002() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outcome = check_bytes(&dir, b"package a;\nrecord R { name: string } // \xff\xfe\n");
    assert_eq!(outcome.diagnostics.len(), 1);
    assert_eq!(outcome.diagnostics[0].code, ErrorCode::InvalidUtf8);
}

#[test]
fn ten_thousand_deep_nesting_is_a_diagnostic_not_a_stack_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (open, close) in [
        ("list<", ">"),
        ("map<string, ", ">"),
        ("(", ")"),
        ("{", "}"),
    ] {
        let text = format!(
            "package deep;\nrecord R {{ x: {}string{} }}\n",
            open.repeat(10_000),
            close.repeat(10_000)
        );
        let outcome = check_bytes(&dir, text.as_bytes());
        assert_eq!(outcome.diagnostics.len(), 1, "{open}");
        assert_eq!(
            outcome.diagnostics[0].code,
            ErrorCode::NestingTooDeep,
            "{open}"
        );
        assert!(format_source(&text).is_err());
    }
}
