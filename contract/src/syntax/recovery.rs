//! Error recovery for [`super::parse_file_all_errors`]: after a syntax
//! error, where parsing resumes (the next line that plainly starts a field,
//! a method or an item) and how a piece's diagnostic is moved back to its
//! place in the file. Reads text only; never builds a tree or words an error.

use super::*;

/// A part of the text to parse on its own after a syntax error.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub(super) start: usize,
    /// Where to look for the item that ends the piece: a line after this.
    pub(super) search_from: usize,
    pub(super) rule: Rule,
}

/// An item start found by [`next_item`].
#[derive(Debug, Clone, Copy)]
pub(super) struct ItemStart {
    /// Its first line: the item line, or the `///` and `@` lines right above it.
    pub(super) start: usize,
    /// The line that plainly starts the item.
    pub(super) line: usize,
}

/// Where parsing resumes after an error at `position`: the next line before
/// `limit` that starts a field or a method of the record or service the
/// error is in, else the next item.
pub(super) fn resume_after(text: &str, position: usize, limit: usize) -> Option<Piece> {
    let line_after = text[position..]
        .find('\n')
        .map_or(text.len(), |n| position + n + 1);
    if let Some((item_line, keyword)) = enclosing_item(text, position)
        && body_depth(&text[item_line..position]) == 1
    {
        let (starts_member, rule): (fn(&str) -> bool, Rule) = match keyword {
            "record" => (starts_field, Rule::record_rest),
            "service" => (starts_method, Rule::service_rest),
            _ => (|_| false, Rule::file),
        };
        let boundary = next_item(text, position).map_or(text.len(), |item| item.line);
        let mut line_start = line_after;
        while line_start < boundary.min(limit) {
            let line_end = text[line_start..]
                .find('\n')
                .map_or(text.len(), |n| line_start + n);
            if starts_member(&text[line_start..line_end]) {
                return Some(Piece {
                    start: line_start,
                    search_from: line_start,
                    rule,
                });
            }
            line_start = line_end + 1;
        }
    }
    next_item(text, position).map(|item| Piece {
        start: item.start.max(line_after),
        search_from: item.line,
        rule: Rule::file,
    })
}

/// The last line at or before `position` that plainly starts an item, and
/// its keyword.
pub(super) fn enclosing_item(text: &str, position: usize) -> Option<(usize, &'static str)> {
    let mut found = None;
    let mut line_start = 0;
    while line_start <= position && line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |n| line_start + n);
        let line = &text[line_start..line_end];
        if starts_item(line) {
            let keyword = ["record", "enum", "service", "import"]
                .into_iter()
                .find(|k| line.starts_with(k))
                .unwrap_or("import");
            found = Some((line_start, keyword));
        }
        line_start = line_end + 1;
    }
    found
}

/// How many braces are open at the end of `text` (comments and strings skipped).
pub(super) fn body_depth(text: &str) -> usize {
    code_bytes(text).fold(0usize, |depth, (_, byte)| match byte {
        b'{' => depth + 1,
        b'}' => depth.saturating_sub(1),
        _ => depth,
    })
}

/// The bytes of `text` outside `//` comments and string literals, with
/// their positions: what brace and bracket counting must look at.
pub(super) fn code_bytes(text: &str) -> impl Iterator<Item = (usize, u8)> + '_ {
    let bytes = text.as_bytes();
    let mut index = 0;
    std::iter::from_fn(move || {
        while index < bytes.len() {
            match bytes[index] {
                b'/' if bytes.get(index + 1) == Some(&b'/') => {
                    while index < bytes.len() && bytes[index] != b'\n' {
                        index += 1;
                    }
                }
                b'"' => {
                    index += 1;
                    while index < bytes.len() && bytes[index] != b'"' && bytes[index] != b'\n' {
                        index += if bytes[index] == b'\\' { 2 } else { 1 };
                    }
                    index += 1;
                }
                byte => {
                    index += 1;
                    return Some((index - 1, byte));
                }
            }
        }
        None
    })
}

/// A name at the start of `line` (after indentation), and what follows it.
pub(super) fn leading_name(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_start();
    let end = line
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(line.len());
    (end > 0).then(|| (&line[..end], line[end..].trim_start()))
}

/// Whether a line plainly starts a record field: `name:`.
pub(super) fn starts_field(line: &str) -> bool {
    leading_name(line).is_some_and(|(_, rest)| rest.starts_with(':'))
}

/// Whether a line plainly starts a method: `signal Name(`, `pushcall …`, `command …`.
pub(super) fn starts_method(line: &str) -> bool {
    let Some((kind, rest)) = leading_name(line) else {
        return false;
    };
    matches!(kind, "signal" | "pushcall" | "command")
        && leading_name(rest).is_some_and(|(_, after)| after.starts_with('('))
        && rest.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// Moves a diagnostic made for `text[offset..]` onto `text`.
pub(super) fn shift(diagnostic: &mut Diagnostic, offset: usize) {
    let moved = |span: Span| Span::new(span.file, span.start + offset, span.end + offset);
    diagnostic.span = diagnostic.span.map(moved);
    for (span, _) in &mut diagnostic.secondary {
        *span = moved(*span);
    }
}

/// The furthest point a diagnostic covers (its primary and secondary spans):
/// for "expected `;` after this, found `record`" that is the found token.
pub(super) fn last_error_point(diagnostic: &Diagnostic) -> usize {
    diagnostic
        .secondary
        .iter()
        .map(|(span, _)| span.start)
        .chain(diagnostic.span.map(|s| s.start))
        .max()
        .unwrap_or(0)
}

/// Whether a line plainly starts a new item.
pub(super) fn starts_item(line: &str) -> bool {
    let word_then = |keyword: &str| {
        line.strip_prefix(keyword)
            .filter(|rest| rest.starts_with([' ', '\t']))
            .map(str::trim_start)
    };
    let name_then = |rest: &str| {
        let name_end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (name_end > 0).then(|| rest[name_end..].trim_start().to_owned())
    };
    if let Some(rest) = word_then("record").or_else(|| word_then("enum")) {
        return name_then(rest).is_some_and(|after| after.starts_with('{'));
    }
    if let Some(rest) = word_then("service") {
        return name_then(rest).is_some_and(|after| {
            after.starts_with('v') && after[1..].starts_with(|c: char| c.is_ascii_digit())
        });
    }
    word_then("import").is_some_and(|rest| rest.starts_with('"'))
}

/// The first item that starts on a line after the one holding `position`,
/// with the `///` and `@` lines right above it (but none of the line holding
/// `position`).
pub(super) fn next_item(text: &str, position: usize) -> Option<ItemStart> {
    let first_line = text[position..].find('\n').map(|n| position + n + 1)?;
    let mut line_start = first_line;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |n| line_start + n);
        if starts_item(&text[line_start..line_end]) {
            let mut start = line_start;
            while start > first_line {
                let above_start = text[..start - 1].rfind('\n').map_or(0, |n| n + 1);
                let above = text[above_start..start - 1].trim_start();
                if !(above.starts_with('@') || above.starts_with("///")) {
                    break;
                }
                start = above_start.max(first_line);
            }
            return Some(ItemStart {
                start,
                line: line_start,
            });
        }
        line_start = line_end + 1;
    }
    None
}
