//! Text -> syntax tree. Owns the pest grammar (`rfidl.pest`) and the
//! conversion of pest pairs into [`ast`] nodes with spans.
//!
//! Never resolves names or applies language rules: that is `check`'s job.
//! Input that pest could only handle by deep recursion (types nested more
//! than [`MAX_TYPE_DEPTH`] levels) is refused before parsing, so hostile
//! input cannot overflow the stack.

pub mod ast;
mod errors;
mod lower;
mod recovery;

use pest::Parser as _;

use crate::diagnostics::{Diagnostic, ErrorCode, FileId, Span, suggest};
use ast::*;
use errors::*;
pub use lower::unescape;
use lower::*;
use recovery::*;

/// The pest parser, in a module of its own: the derive also defines
/// `pub enum Rule` (one variant per grammar rule), which is this module's
/// business and not part of the crate's API.
mod grammar {
    #[derive(pest_derive::Parser)]
    #[grammar = "syntax/rfidl.pest"]
    pub(super) struct RfidlParser;
}

use grammar::{RfidlParser, Rule};

/// Deepest allowed nesting of `list<…>`/`map<…>` and parentheses.
pub use crate::limits::MAX_TYPE_DEPTH;

/// Most syntax errors reported for one file.
pub const MAX_SYNTAX_ERRORS: usize = 20;

/// Parses one source file.
pub fn parse_file(file: FileId, text: &str) -> Result<File, Box<Diagnostic>> {
    check_depth(file, text)?;
    let mut pairs = match RfidlParser::parse(Rule::file, text) {
        Ok(pairs) => pairs,
        Err(_) => {
            let explained = explain_failure(file, text, Rule::file).unwrap_or_else(|| {
                Diagnostic::error(ErrorCode::Syntax, Span::new(file, 0, 0), "syntax error")
            });
            return Err(Box::new(explained));
        }
    };
    let root = pairs.next().expect("the file rule always yields one pair");
    let builder = Builder {
        file,
        text,
        string_errors: Default::default(),
    };
    let parsed = builder.file(root)?;
    match builder.string_errors.into_inner().into_iter().next() {
        Some(error) => Err(Box::new(error)),
        None => Ok(parsed),
    }
}

/// Like [`parse_file`], but on a syntax error keeps looking for more. The
/// rest of the file is cut at the lines that plainly start an item
/// (`record Name {`, `enum Name {`, `service Name v…`, `import "…"` at the
/// start of a line, with the `///` and `@` lines right above it) and each
/// piece is parsed on its own. An error inside a record or a service body
/// resumes at the next line there that plainly starts a field (`name:`) or a
/// method (`signal Name(`, …), which is parsed as the rest of that body. In
/// valid text such lines always are what they look like, so a piece fails
/// only where the text really does. At most [`MAX_SYNTAX_ERRORS`] are
/// reported, and each piece is parsed once.
pub fn parse_file_all_errors(file: FileId, text: &str) -> Result<File, Vec<Diagnostic>> {
    let first = match parse_file(file, text) {
        Ok(parsed) => return Ok(parsed),
        Err(first) => *first,
    };
    let resumable =
        |error: &Diagnostic| matches!(error.code, ErrorCode::Syntax | ErrorCode::InvalidString);
    let mut next = resumable(&first)
        .then(|| resume_after(text, last_error_point(&first), text.len()))
        .flatten();
    let mut errors = vec![first];
    while let Some(piece) = next {
        if errors.len() >= MAX_SYNTAX_ERRORS {
            break;
        }
        let following = next_item(text, piece.search_from);
        let end = following.map_or(text.len(), |item| item.start);
        let text_of_piece = &text[piece.start..end];
        let fails = check_depth(file, text_of_piece).is_ok()
            && RfidlParser::parse(piece.rule, text_of_piece).is_err();
        let error = fails
            .then(|| explain_failure(file, text_of_piece, piece.rule))
            .flatten();
        next = following.map(|item| Piece {
            start: item.start,
            search_from: item.line,
            rule: Rule::file,
        });
        if let Some(mut error) = error {
            if error.help.as_deref() == Some(PACKAGE_FIRST_HELP) {
                // A piece of a file does not start with its package, of course.
                error.help = None;
            }
            shift(&mut error, piece.start);
            if resumable(&error)
                && let Some(inside) = resume_after(text, last_error_point(&error), end)
                && inside.start < end
            {
                next = Some(inside);
            }
            errors.push(error);
        }
    }
    Err(errors)
}

/// Refuses nesting deeper than [`MAX_TYPE_DEPTH`] before pest recurses into it.
fn check_depth(file: FileId, text: &str) -> Result<(), Box<Diagnostic>> {
    let mut depth = 0usize;
    for (index, byte) in code_bytes(text) {
        match byte {
            b'<' | b'(' | b'{' => {
                depth += 1;
                if depth > MAX_TYPE_DEPTH {
                    let span = Span::new(file, index, index + 1);
                    return Err(Box::new(
                        Diagnostic::error(
                            ErrorCode::NestingTooDeep,
                            span,
                            format!("nesting deeper than {MAX_TYPE_DEPTH} levels"),
                        )
                        .with_label("too deep here")
                        .with_help(
                            "flatten the type: give an inner part a name with its own `record`",
                        ),
                    ));
                }
            }
            b'>' | b')' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes_and_lines(text: &str) -> Vec<(ErrorCode, usize)> {
        match parse_file_all_errors(FileId::default(), text) {
            Ok(_) => Vec::new(),
            Err(errors) => errors
                .iter()
                .map(|d| {
                    let start = d.span.map_or(0, |s| s.start);
                    (d.code, text[..start].matches('\n').count() + 1)
                })
                .collect(),
        }
    }

    #[test]
    fn recovery_resumes_at_the_next_item_and_invents_nothing() {
        // A field called `record` at the start of a line is not an item
        // start; the error after it is the only one.
        let text = "package a;\nrecord A {\nrecord: string,\nx y\n}\nrecord B {}\n";
        assert_eq!(codes_and_lines(text), vec![(ErrorCode::Syntax, 4)]);

        let text = "package a;\nrecord A { x y }\nrecord B { ok: u32 }\nenum C { D E }\n";
        assert_eq!(
            codes_and_lines(text),
            vec![(ErrorCode::Syntax, 2), (ErrorCode::Syntax, 4)]
        );

        // Valid input has no errors; an error in the last item is the only one.
        assert!(codes_and_lines("package a;\nrecord A {}\n").is_empty());
        assert_eq!(
            codes_and_lines("package a;\nrecord A {}\nrecord B {\n"),
            vec![(ErrorCode::Syntax, 3)]
        );
    }

    #[test]
    fn recovery_resumes_at_the_next_field_or_method_of_the_same_body() {
        let text = "package a;\nrecord A {\n  x y,\n  ok: u32,\n  z w,\n}\nservice S v1 {\n  signal P(a: u32)\n  @deprecated\n  signal Q(b u32);\n  signal R();\n}\n";
        assert_eq!(
            codes_and_lines(text),
            vec![
                (ErrorCode::Syntax, 3),
                (ErrorCode::Syntax, 5),
                (ErrorCode::Syntax, 8),
                (ErrorCode::Syntax, 10),
            ]
        );
        // A line that looks like a field after the body closed is not resumed
        // into the body; enums resume at the next item only.
        let text = "package a;\nenum E {\n  A B\n  C,\n}\nrecord R { ok: u32 }\n";
        assert_eq!(codes_and_lines(text), vec![(ErrorCode::Syntax, 3)]);
    }

    #[test]
    fn the_prefix_of_the_next_item_stays_with_it() {
        // `@deprecated` above `record C` belongs to C: the piece before it
        // (record B) must not end in a dangling annotation.
        let text = "package a;\nrecord A {\n  x y,\n}\nrecord B { z: u32 }\n/// C.\n@deprecated\nrecord C { z: u32 }\n";
        assert_eq!(codes_and_lines(text), vec![(ErrorCode::Syntax, 3)]);
        let text = "package a;\nrecord A {\n  x y,\n}\n@deprecated(\"x\"\nrecord C { z: u32 }\n";
        assert_eq!(
            codes_and_lines(text),
            vec![(ErrorCode::Syntax, 3), (ErrorCode::Syntax, 5)]
        );
    }

    #[test]
    fn member_starts_are_recognised_only_in_plain_form() {
        for line in ["  id: uuid,", "record: string", "\tx :u32"] {
            assert!(starts_field(line), "{line}");
        }
        for line in ["  id uuid,", "/// id: the id", ": uuid", "@x(a: b)"] {
            assert!(!starts_field(line), "{line}");
        }
        for line in [
            "  signal Placed(",
            "command Ship (id: uuid);",
            "pushcall _P()",
        ] {
            assert!(starts_method(line), "{line}");
        }
        for line in [
            "  signal: string,",
            "signalPlaced(",
            "command Ship;",
            "event Ship(",
        ] {
            assert!(!starts_method(line), "{line}");
        }
    }

    #[test]
    fn recovery_stops_at_the_limit() {
        let mut text = String::from("package a;\n");
        for i in 0..(MAX_SYNTAX_ERRORS + 10) {
            text.push_str(&format!("record R{i} {{ broken field }}\n"));
        }
        assert_eq!(codes_and_lines(&text).len(), MAX_SYNTAX_ERRORS);
    }

    #[test]
    fn item_starts_are_recognised_only_in_plain_form() {
        for line in [
            "record Order {",
            "enum Status{",
            "service Shop v1 {",
            "import \"common.rfidl\";",
        ] {
            assert!(starts_item(line), "{line}");
        }
        for line in [
            "record: string,",
            "  record Order {",
            "record Order",
            "service Shop {",
            "enum_field: u32,",
            "import common;",
        ] {
            assert!(!starts_item(line), "{line}");
        }
    }
}
