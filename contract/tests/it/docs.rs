//! The examples in `docs/` are code too: the language reference's examples
//! parse, and each self-contained example of `docs/errors.md` does what its
//! section says (a "Fails" example reports that section's code, a "Fixed"
//! one reports no error at all). Fragments that do not parse on their own
//! (a method without its service, `…`) and examples spanning several files
//! are left to the UI tests.

use rfidl_contract::check::check_paths;
use rfidl_contract::diagnostics::FileId;
use rfidl_contract::syntax::parse_file;

/// The ```rfidl code blocks of a Markdown text, each with the paragraph
/// line just above it ("Fails:", "Fixed:", …).
fn rfidl_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = markdown;
    while let Some(start) = rest.find("```rfidl\n") {
        let before = rest[..start].trim_end();
        let caption = before.lines().last().unwrap_or_default().to_owned();
        let body = &rest[start + "```rfidl\n".len()..];
        let end = body.find("```").expect("closed code block");
        blocks.push((caption, body[..end].to_owned()));
        rest = &body[end + 3..];
    }
    blocks
}

#[test]
fn the_language_reference_examples_parse() {
    let reference = std::fs::read_to_string("../docs/language.md").expect("docs/language.md");
    let blocks = rfidl_blocks(&reference);
    assert!(!blocks.is_empty(), "no ```rfidl example found");
    for (index, (_, body)) in blocks.iter().enumerate() {
        if let Err(diagnostic) = parse_file(FileId::default(), body) {
            panic!(
                "example {} of docs/language.md does not parse: {diagnostic:?}\n{body}",
                index + 1
            );
        }
    }
}

/// Checks one example as a file of its own and returns its codes.
fn codes_of(dir: &tempfile::TempDir, body: &str) -> Vec<&'static str> {
    let path = dir.path().join("example.rfidl");
    std::fs::write(&path, body).expect("write the example");
    let outcome = check_paths(&[path]).expect("the example is readable");
    outcome
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code.code())
        .collect()
}

#[test]
fn the_error_code_examples_show_what_they_say() {
    let errors = std::fs::read_to_string("../docs/errors.md").expect("docs/errors.md");
    let dir = tempfile::tempdir().expect("temporary folder");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for section in errors.split("\n## ").skip(1) {
        let code = section.lines().next().unwrap_or_default().trim();
        // Warnings: checking succeeds either way. E0002 cannot be shown in
        // UTF-8 Markdown; E0011 to E0013 are about other files.
        if !code.starts_with('E') || matches!(code, "E0002" | "E0011" | "E0012" | "E0013") {
            continue;
        }
        for (caption, body) in rfidl_blocks(section) {
            // Examples that span files (imports, cycles) need their other
            // files; they are covered by the UI tests instead.
            if body.contains("import ") || !body.lines().any(|l| !l.starts_with("//")) {
                continue;
            }
            // Most examples leave the package line out for brevity.
            let needs_package = !body.contains("package ") && !matches!(code, "E0005" | "E0006");
            let text = if needs_package {
                format!("package example;\n{body}")
            } else {
                body.clone()
            };
            let codes = codes_of(&dir, &text);
            if codes.contains(&"E0001") && code != "E0001" {
                continue; // a fragment (a method without its service, `…`)
            }
            let fine = if caption.starts_with("Fails") {
                codes.contains(&code)
            } else if caption.starts_with("Fixed") {
                codes.is_empty()
            } else {
                continue;
            };
            checked += 1;
            if !fine {
                wrong.push(format!("{code} ({caption}) reports {codes:?}:\n{text}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} example(s) of docs/errors.md do not show what they say:\n\n{}",
        wrong.len(),
        wrong.join("\n\n")
    );
    assert!(checked >= 20, "only {checked} examples checked");
}
