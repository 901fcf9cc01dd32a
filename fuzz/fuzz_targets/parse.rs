//! Feeds arbitrary bytes to the parser and the formatter. Neither may panic,
//! and for every input that parses, formatting must:
//! - give text that parses to the same tree (spans aside),
//! - be idempotent (`format(format(x)) == format(x)`).
//!
//! Run: `cargo +nightly fuzz run parse` from the repository root; seed the
//! corpus with `schemas/` and `contract/tests/ui/` for a fast start:
//! `cargo +nightly fuzz run parse fuzz/corpus/parse schemas contract/tests/ui`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rfidl_contract::diagnostics::FileId;
use rfidl_contract::format::format_source;
use rfidl_contract::syntax::parse_file;

/// The syntax tree's debug form with every `Span { .. }` removed.
fn shape(text: &str) -> Option<String> {
    let file = parse_file(FileId::default(), text).ok()?;
    let debug = format!("{file:?}");
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug.as_str();
    while let Some(start) = rest.find("Span {") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').map_or(rest.len(), |e| start + e + 1);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(before) = shape(text) else {
        // Not a contract: the formatter must refuse it, not panic.
        assert!(format_source(text).is_err());
        return;
    };
    let once = format_source(text).expect("text that parses formats");
    assert_eq!(shape(&once), Some(before), "formatting changed the tree");
    let twice = format_source(&once).expect("formatted text formats");
    assert_eq!(once, twice, "formatting is not idempotent");
});
