//! `rfidl fmt`: idempotent, keeps comments, and never changes meaning.

use std::path::{Path, PathBuf};

use rfidl_contract::format::format_source;

/// Every contract we have: the example schemas and the UI test inputs.
fn corpus() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["../schemas", "tests/ui"] {
        files
            .extend(rfidl_contract::check::load::contract_files(Path::new(dir)).expect("readable"));
    }
    assert!(files.len() > 20, "corpus too small: {files:?}");
    files
}

/// The syntax tree with spans removed, or `None` when `text` does not parse.
fn shape(text: &str) -> Option<String> {
    crate::format_properties::shape(text).ok()
}

#[test]
fn formatting_is_idempotent_and_preserves_the_tree() {
    let mut formatted_files = 0;
    for path in corpus() {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Some(before) = shape(&text) else { continue }; // inputs with syntax errors
        let once = format_source(&text).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        let twice = format_source(&once).expect("formatted output parses");
        assert_eq!(once, twice, "{}: not idempotent", path.display());
        assert_eq!(
            shape(&once),
            Some(before),
            "{}: formatting changed the tree",
            path.display()
        );
        formatted_files += 1;
    }
    assert!(formatted_files > 20);
}

#[test]
fn the_example_schemas_are_formatted() {
    for path in
        rfidl_contract::check::load::contract_files(Path::new("../schemas")).expect("schemas")
    {
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            format_source(&text).expect("parses"),
            text,
            "{} is not canonical: run `rfidl fmt schemas`",
            path.display()
        );
    }
}

#[test]
fn comments_survive_and_layout_is_canonical() {
    let messy = "// header\npackage  a.b ;   // trailing\nimport \"x.rfidl\";\n\n\n/// A thing.\nrecord   Thing{id:uuid,// the id\n// before name\nname : string ?,}\nenum E{A,B}\nservice S v1{@deprecated(\"old \\\"one\\\"\") signal Ping ( ) ; // ping\n}\n// the end\n";
    let expected = "// header\npackage a.b; // trailing\n\nimport \"x.rfidl\";\n\n/// A thing.\nrecord Thing {\n    id: uuid, // the id\n    // before name\n    name: string?,\n}\n\nenum E {\n    A,\n    B,\n}\n\nservice S v1 {\n    @deprecated(\"old \\\"one\\\"\")\n    signal Ping(); // ping\n}\n\n// the end\n";
    assert_eq!(format_source(messy).expect("parses"), expected);
}
