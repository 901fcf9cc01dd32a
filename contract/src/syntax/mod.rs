//! Text -> syntax tree. Owns the pest grammar (`rfidl.pest`) and the
//! conversion of pest pairs into [`ast`] nodes with spans.
//!
//! Never resolves names or applies language rules: that is `check`'s job.
//! Input that pest could only handle by deep recursion (types nested more
//! than [`MAX_TYPE_DEPTH`] levels) is refused before parsing, so hostile
//! input cannot overflow the stack.

pub mod ast;

use pest::Parser as _;
use pest::iterators::Pair;

use crate::diagnostics::{Diagnostic, ErrorCode, FileId, Span, suggest};
use ast::*;

#[derive(pest_derive::Parser)]
#[grammar = "syntax/rfidl.pest"]
struct RfidlParser;

/// Deepest allowed nesting of `list<…>`/`map<…>` and parentheses.
pub use crate::limits::MAX_TYPE_DEPTH;

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

/// A part of the text to parse on its own after a syntax error.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: usize,
    /// Where to look for the item that ends the piece: a line after this.
    search_from: usize,
    rule: Rule,
}

/// An item start found by [`next_item`].
#[derive(Debug, Clone, Copy)]
struct ItemStart {
    /// Its first line: the item line, or the `///` and `@` lines right above it.
    start: usize,
    /// The line that plainly starts the item.
    line: usize,
}

/// Where parsing resumes after an error at `position`: the next line before
/// `limit` that starts a field or a method of the record or service the
/// error is in, else the next item.
fn resume_after(text: &str, position: usize, limit: usize) -> Option<Piece> {
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
fn enclosing_item(text: &str, position: usize) -> Option<(usize, &'static str)> {
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
fn body_depth(text: &str) -> usize {
    code_bytes(text).fold(0usize, |depth, (_, byte)| match byte {
        b'{' => depth + 1,
        b'}' => depth.saturating_sub(1),
        _ => depth,
    })
}

/// The bytes of `text` outside `//` comments and string literals, with
/// their positions: what brace and bracket counting must look at.
fn code_bytes(text: &str) -> impl Iterator<Item = (usize, u8)> + '_ {
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
fn leading_name(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_start();
    let end = line
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(line.len());
    (end > 0).then(|| (&line[..end], line[end..].trim_start()))
}

/// Whether a line plainly starts a record field: `name:`.
fn starts_field(line: &str) -> bool {
    leading_name(line).is_some_and(|(_, rest)| rest.starts_with(':'))
}

/// Whether a line plainly starts a method: `signal Name(`, `pushcall …`, `command …`.
fn starts_method(line: &str) -> bool {
    let Some((kind, rest)) = leading_name(line) else {
        return false;
    };
    matches!(kind, "signal" | "pushcall" | "command")
        && leading_name(rest).is_some_and(|(_, after)| after.starts_with('('))
        && rest.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// Moves a diagnostic made for `text[offset..]` onto `text`.
fn shift(diagnostic: &mut Diagnostic, offset: usize) {
    let moved = |span: Span| Span::new(span.file, span.start + offset, span.end + offset);
    diagnostic.span = diagnostic.span.map(moved);
    for (span, _) in &mut diagnostic.secondary {
        *span = moved(*span);
    }
}

/// Most syntax errors reported for one file.
pub const MAX_SYNTAX_ERRORS: usize = 20;

/// The furthest point a diagnostic covers (its primary and secondary spans):
/// for "expected `;` after this, found `record`" that is the found token.
fn last_error_point(diagnostic: &Diagnostic) -> usize {
    diagnostic
        .secondary
        .iter()
        .map(|(span, _)| span.start)
        .chain(diagnostic.span.map(|s| s.start))
        .max()
        .unwrap_or(0)
}

/// Whether a line plainly starts a new item.
fn starts_item(line: &str) -> bool {
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
fn next_item(text: &str, position: usize) -> Option<ItemStart> {
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

/// Re-parses a failed input with pest's parse-attempt tracking on, to say
/// what was expected (`None` if it parses after all). Tracking costs time on every token, so the first parse
/// runs without it. The switch is process-wide: a lock keeps concurrent
/// explanations (parallel tests, several build scripts in one process) from
/// turning it off under each other.
fn explain_failure(file: FileId, text: &str, rule: Rule) -> Option<Diagnostic> {
    static DETAIL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = DETAIL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    pest::set_error_detail(true);
    let result = RfidlParser::parse(rule, text);
    pest::set_error_detail(false);
    drop(guard);
    result.err().map(|error| syntax_error(file, text, error))
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

fn syntax_error(file: FileId, text: &str, error: pest::error::Error<Rule>) -> Diagnostic {
    let reported = match error.location {
        pest::error::InputLocation::Pos(p) => p,
        pest::error::InputLocation::Span((start, _)) => start,
    };
    // pest places the error where the last alternative failed, which after
    // backtracking out of `(package_decl | item)*` is the start of the item;
    // the furthest position any token was tried at is where the user erred.
    let furthest = error
        .parse_attempts()
        .map_or(reported, |attempts| attempts.max_position);
    let mut position = furthest.max(reported);
    if let Some(open) = unterminated_string(text, position) {
        let line_end = text[open..]
            .find(['\r', '\n'])
            .map_or(text.len(), |n| open + n);
        return Diagnostic::error(
            ErrorCode::InvalidString,
            Span::new(file, open, line_end),
            "unterminated string",
        )
        .with_label("this string is not closed")
        .with_help("close it with `\"` on the same line: strings cannot span lines");
    }
    let mut expected: Vec<String> = Vec::new();
    if let Some(attempts) = error.parse_attempts() {
        // Literal tokens the grammar tried here (`;`, `}`, `->`, keywords);
        // whitespace, comment starts and character ranges say nothing useful.
        for token in attempts.expected_tokens() {
            let token = token.to_string();
            let useful = !token.trim().is_empty()
                && token != "BUILTIN_RULE"
                && !token.contains("..")
                && !token.starts_with("//")
                && !matches!(token.as_str(), "\"" | "\\" | "v" | "-" | "_" | "\u{feff}");
            if useful {
                expected.push(format!("`{token}`"));
            }
        }
    }
    // No literal token explains the furthest point (a character class was
    // expected, as in `v` without digits): explain where pest stopped instead.
    if expected.is_empty() {
        position = reported;
    }
    if position == reported
        && let pest::error::ErrorVariant::ParsingError { positives, .. } = &error.variant
    {
        expected.extend(
            positives
                .iter()
                .filter_map(|r| describe_rule(*r))
                .map(str::to_owned),
        );
    }
    tidy_expected(&mut expected);
    let found = describe_found(text, position);
    let message = match expected.len() {
        0 => format!("unexpected {found}"),
        1 => format!("expected {}, found {found}", expected[0]),
        _ => {
            let (last, rest) = expected.split_last().expect("non-empty");
            format!("expected {} or {last}, found {found}", rest.join(", "))
        }
    };
    // A line break is shown as the end of its line, not as a span onto the next.
    let end = match text[position..].chars().next() {
        Some('\r' | '\n') | None => position,
        Some(c) => position + c.len_utf8(),
    };
    let word_end = text[position..]
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(text.len(), |length| position + length)
        .max(end);
    let found_span = Span::new(file, position, word_end);
    // When the problem is a missing token at the end of a line (`package
    // shop` without `;`), point where it belongs, like rustc, rather than at
    // whatever starts the next line.
    let before = &text[..end_of_last_token(text, position)];
    let terminator_expected = end == position
        || expected
            .iter()
            .any(|e| matches!(e.as_str(), "`;`" | "`,`" | "`)`" | "`>`" | "`}`" | "`->`"));
    let mut diagnostic = match before.chars().next_back() {
        Some(last) if terminator_expected && text[before.len()..position].contains('\n') => {
            let at = before.len() - last.len_utf8();
            let diagnostic = Diagnostic::error(
                ErrorCode::Syntax,
                Span::new(file, at, before.len()),
                message,
            )
            .with_label("expected after this");
            if end > position {
                diagnostic.with_secondary(found_span, "found this")
            } else {
                diagnostic
            }
        }
        _ => {
            Diagnostic::error(ErrorCode::Syntax, found_span, message).with_label("unexpected here")
        }
    };
    let found_word = &text[position..word_end];
    let keywords = expected
        .iter()
        .flat_map(|e| {
            KEYWORDS
                .iter()
                .filter(move |k| e.contains(&format!("`{k}`")))
        })
        .copied();
    if let Some(keyword) = found_word
        .chars()
        .next()
        .filter(|c| c.is_alphabetic())
        .and_then(|_| suggest(found_word, keywords))
    {
        diagnostic = diagnostic.with_help(format!("did you mean `{keyword}`?"));
    } else if text[position..].starts_with('<') {
        let name_before = before
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if !matches!(name_before, "list" | "map") && !name_before.is_empty() {
            diagnostic = diagnostic.with_help(
                "the containers are `list<T>` and `map<string, T>`; an optional value is `T?`",
            );
        }
    } else if text[before.len()..position]
        .lines()
        .any(|line| comment_start(line).is_some_and(|at| line[at..].starts_with("///")))
    {
        diagnostic = diagnostic.with_help(
            "a `///` doc comment documents what follows it; use `//` for a plain comment",
        );
    } else if position == 0 {
        diagnostic = diagnostic.with_help(PACKAGE_FIRST_HELP);
    }
    diagnostic
}

const PACKAGE_FIRST_HELP: &str = "a contract starts with its package: `package hr.employees;`";

/// The keywords a misspelt word is compared with ("did you mean").
const KEYWORDS: [&str; 10] = [
    "package", "import", "record", "enum", "service", "signal", "pushcall", "command", "list",
    "map",
];

/// Sorts the expectations and drops the ones that only add noise.
fn tidy_expected(expected: &mut Vec<String>) {
    expected.sort();
    expected.dedup();
    let has = |expected: &[String], what: &str| expected.iter().any(|e| e.starts_with(what));
    // `a type` covers `list` and `map`; `a method (…)` names its keywords.
    if has(expected, "a type") {
        expected.retain(|e| e != "`list`" && e != "`map`");
    }
    if has(expected, "a method") {
        expected.retain(|e| !matches!(e.as_str(), "`signal`" | "`pushcall`" | "`command`"));
    }
    // Annotations and doc comments may start almost anything: naming them
    // says nothing the user needs to hear. The package is accepted anywhere
    // by the grammar only to report a misplaced one well.
    expected.retain(|e| {
        !matches!(
            e.as_str(),
            "`@`" | "an annotation" | "a doc comment" | "`package`"
        )
    });
}

/// Where the last token before `position` ends, skipping whitespace and
/// `//` comments.
fn end_of_last_token(text: &str, position: usize) -> usize {
    let mut end = position;
    loop {
        let trimmed = text[..end].trim_end_matches([' ', '\t', '\r', '\n']);
        let line_start = trimmed.rfind('\n').map_or(0, |n| n + 1);
        match comment_start(&trimmed[line_start..]) {
            Some(offset) => end = line_start + offset,
            None => return trimmed.len(),
        }
    }
}

/// Byte offset of a `//` comment in one line, outside string literals.
fn comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut in_string = false;
    let mut index = 0;
    while index < bytes.len() {
        match (in_string, bytes[index]) {
            (false, b'/') if bytes.get(index + 1) == Some(&b'/') => return Some(index),
            (false, b'"') => in_string = true,
            (true, b'\\') => index += 1,
            (true, b'"') => in_string = false,
            _ => {}
        }
        index += 1;
    }
    None
}

/// If `position` (where parsing failed) is inside a string literal opened on
/// its line and the line ends there, the byte offset of the opening quote.
fn unterminated_string(text: &str, position: usize) -> Option<usize> {
    if !matches!(text[position..].chars().next(), None | Some('\r' | '\n')) {
        return None;
    }
    let line_start = text[..position].rfind('\n').map_or(0, |n| n + 1);
    let line = &text.as_bytes()[line_start..position];
    let mut open = None;
    let mut index = 0;
    while index < line.len() {
        match (open, line[index]) {
            (None, b'/') if line.get(index + 1) == Some(&b'/') => return None,
            (None, b'"') => open = Some(line_start + index),
            (Some(_), b'\\') => index += 1,
            (Some(_), b'"') => open = None,
            _ => {}
        }
        index += 1;
    }
    open
}

fn describe_found(text: &str, position: usize) -> String {
    let rest = &text[position..];
    match rest.chars().next() {
        None => "end of file".to_owned(),
        Some(c) if c.is_alphanumeric() || c == '_' => {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            format!("`{word}`")
        }
        Some('\n') | Some('\r') => "end of line".to_owned(),
        Some(c) => format!("`{c}`"),
    }
}

fn describe_rule(rule: Rule) -> Option<&'static str> {
    Some(match rule {
        Rule::ident | Rule::dotted_name => "a name",
        Rule::type_expr | Rule::named_type | Rule::list_type | Rule::map_type => "a type",
        Rule::string => "a string",
        Rule::version => "a version like `v1`",
        Rule::field => "a field",
        Rule::variant => "a variant",
        Rule::method | Rule::method_kind => "a method (`signal`, `pushcall` or `command`)",
        Rule::annotation => "an annotation",
        Rule::value | Rule::integer => "a value",
        Rule::kw_package | Rule::package_decl => "`package`",
        Rule::import_decl | Rule::kw_import => "`import`",
        Rule::record_decl | Rule::kw_record => "`record`",
        Rule::enum_decl | Rule::kw_enum => "`enum`",
        Rule::service_decl | Rule::kw_service => "`service`",
        Rule::response => "`->`",
        Rule::optional => "`?`",
        Rule::doc => "a doc comment",
        Rule::EOI => "end of file",
        _ => return None,
    })
}

struct Builder<'t> {
    file: FileId,
    text: &'t str,
    /// Bad escapes found in string literals (reported after the walk).
    string_errors: std::cell::RefCell<Vec<Diagnostic>>,
}

impl Builder<'_> {
    fn span(&self, pair: &Pair<'_, Rule>) -> Span {
        let s = pair.as_span();
        Span::new(self.file, s.start(), s.end())
    }

    /// The first line of an item (its keyword, or its first doc comment),
    /// for diagnostics about the item as a whole.
    fn start_of(&self, item: &Item) -> Span {
        let span = item.span();
        let text = &self.text[span.start..span.end];
        let first_line = text.find(['\r', '\n']).unwrap_or(text.len());
        Span::new(self.file, span.start, span.start + first_line)
    }

    fn ident(&self, pair: Pair<'_, Rule>) -> Ident {
        Ident {
            text: pair.as_str().to_owned(),
            span: self.span(&pair),
        }
    }

    fn file(&self, pair: Pair<'_, Rule>) -> Result<File, Box<Diagnostic>> {
        let span = self.span(&pair);
        let mut package: Option<PackageDecl> = None;
        let mut items = Vec::new();
        let mut trailing_docs = Vec::new();
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::package_decl => {
                    let declared = self.package(child);
                    if let Some(first) = &package {
                        return Err(Box::new(
                            Diagnostic::error(
                                ErrorCode::DuplicatePackage,
                                declared.span,
                                "a contract declares its package only once",
                            )
                            .with_label("second package declaration")
                            .with_secondary(first.span, "the package is declared here")
                            .with_help("one file holds one package: move the items into a file of their own"),
                        ));
                    }
                    if let Some(first_item) = items.first().map(|item| self.start_of(item)) {
                        return Err(Box::new(
                            Diagnostic::error(
                                ErrorCode::MissingPackage,
                                first_item,
                                "the package declaration must come first",
                            )
                            .with_label("this comes before the package declaration")
                            .with_secondary(declared.span, "the package is declared here")
                            .with_help(format!(
                                "move `package {};` to the top of the file",
                                declared.name.text
                            )),
                        ));
                    }
                    package = Some(declared);
                }
                Rule::import_decl => items.push(Item::Import(self.import(child)?)),
                Rule::record_decl => items.push(Item::Record(self.record(child))),
                Rule::enum_decl => items.push(Item::Enum(self.enumeration(child))),
                Rule::service_decl => items.push(Item::Service(self.service(child))),
                Rule::trailing_docs => {
                    trailing_docs = child
                        .into_inner()
                        .map(|d| (doc_text(&d), self.span(&d)))
                        .collect();
                }
                _ => {}
            }
        }
        let Some(package) = package else {
            let at = items
                .first()
                .map_or(Span::new(self.file, 0, 0), |item| self.start_of(item));
            return Err(Box::new(
                Diagnostic::error(ErrorCode::MissingPackage, at, "missing package declaration")
                    .with_label("expected `package …;` before this")
                    .with_help(PACKAGE_FIRST_HELP),
            ));
        };
        Ok(File {
            package,
            items,
            trailing_docs,
            span,
        })
    }

    fn package(&self, pair: Pair<'_, Rule>) -> PackageDecl {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let name = pair
            .into_inner()
            .find(|child| child.as_rule() == Rule::dotted_name)
            .map(|child| self.ident(child));
        PackageDecl {
            docs,
            annotations,
            name: name.expect("grammar"),
            span,
        }
    }

    fn import(&self, pair: Pair<'_, Rule>) -> Result<Import, Box<Diagnostic>> {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let string = pair
            .into_inner()
            .find(|child| child.as_rule() == Rule::string)
            .expect("grammar");
        let path_span = self.span(&string);
        let path = self.string(string)?;
        Ok(Import {
            docs,
            annotations,
            path,
            path_span,
            span,
        })
    }

    fn string(&self, pair: Pair<'_, Rule>) -> Result<String, Box<Diagnostic>> {
        let span = self.span(&pair);
        let inner = pair.into_inner().next().map_or("", |p| p.as_str());
        unescape(inner).map_err(|(offset, problem)| {
            let at = span.start + 1 + offset;
            Box::new(
                Diagnostic::error(
                    ErrorCode::InvalidString,
                    Span::new(self.file, at, at + 2),
                    problem,
                )
                .with_label("here")
                .with_help("strings allow the escapes \\\" \\\\ \\n \\t \\r and \\u{…}"),
            )
        })
    }

    fn annotations_and_docs(&self, pair: &Pair<'_, Rule>) -> (Docs, Vec<Annotation>) {
        let mut docs = Vec::new();
        let mut annotations = Vec::new();
        for child in pair.clone().into_inner() {
            match child.as_rule() {
                Rule::doc => docs.push(doc_text(&child)),
                Rule::annotation => annotations.push(self.annotation(child)),
                _ => {}
            }
        }
        (docs, annotations)
    }

    fn annotation(&self, pair: Pair<'_, Rule>) -> Annotation {
        let mut span = self.span(&pair);
        let mut name = None;
        let mut args = None;
        for child in pair.into_inner() {
            // The pair also holds the white space after `@name` when no
            // arguments follow: end the span at the last token instead.
            span.end = child.as_span().end();
            match child.as_rule() {
                Rule::ident => name = Some(self.ident(child)),
                Rule::annotation_args => {
                    args = Some(
                        child
                            .into_inner()
                            .map(|arg| self.annotation_arg(arg))
                            .collect(),
                    );
                }
                _ => {}
            }
        }
        Annotation {
            name: name.expect("grammar"),
            args,
            span,
        }
    }

    fn annotation_arg(&self, pair: Pair<'_, Rule>) -> AnnotationArg {
        let span = self.span(&pair);
        let mut name = None;
        let mut value = Value::Path(String::new());
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::ident => name = Some(self.ident(child)),
                Rule::value => {
                    let inner = child.into_inner().next().expect("grammar");
                    value = match inner.as_rule() {
                        Rule::string => match self.string(inner) {
                            Ok(text) => Value::String(text),
                            Err(error) => {
                                self.string_errors.borrow_mut().push(*error);
                                Value::String(String::new())
                            }
                        },
                        Rule::integer => Value::Integer(inner.as_str().to_owned()),
                        _ => Value::Path(inner.as_str().to_owned()),
                    };
                }
                _ => {}
            }
        }
        AnnotationArg { name, value, span }
    }

    fn record(&self, pair: Pair<'_, Rule>) -> Record {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let mut name = None;
        let mut fields = Vec::new();
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::ident => name = Some(self.ident(child)),
                Rule::fields => fields = child.into_inner().map(|f| self.field(f)).collect(),
                _ => {}
            }
        }
        Record {
            docs,
            annotations,
            name: name.expect("grammar"),
            fields,
            span,
        }
    }

    fn field(&self, pair: Pair<'_, Rule>) -> Field {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let mut name = None;
        let mut ty = None;
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::ident => name = Some(self.ident(child)),
                Rule::type_expr => ty = Some(self.type_expr(child)),
                _ => {}
            }
        }
        Field {
            docs,
            annotations,
            name: name.expect("grammar"),
            ty: ty.expect("grammar"),
            span,
        }
    }

    fn type_expr(&self, pair: Pair<'_, Rule>) -> TypeExpr {
        let span = self.span(&pair);
        let mut optional = false;
        let mut kind = None;
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::optional => optional = true,
                Rule::named_type => {
                    kind = Some(TypeKind::Named(
                        self.ident(child.into_inner().next().expect("grammar")),
                    ));
                }
                Rule::list_type => {
                    let inner = child
                        .into_inner()
                        .find(|p| p.as_rule() == Rule::type_expr)
                        .expect("grammar");
                    kind = Some(TypeKind::List(Box::new(self.type_expr(inner))));
                }
                Rule::map_type => {
                    let mut parts = child
                        .into_inner()
                        .filter(|p| p.as_rule() == Rule::type_expr);
                    let key = self.type_expr(parts.next().expect("grammar"));
                    let value = self.type_expr(parts.next().expect("grammar"));
                    kind = Some(TypeKind::Map(Box::new(key), Box::new(value)));
                }
                _ => {}
            }
        }
        TypeExpr {
            kind: kind.expect("grammar"),
            optional,
            span,
        }
    }

    fn enumeration(&self, pair: Pair<'_, Rule>) -> Enum {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let mut name = None;
        let mut variants = Vec::new();
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::ident => name = Some(self.ident(child)),
                Rule::variants => {
                    variants = child
                        .into_inner()
                        .map(|v| {
                            let span = self.span(&v);
                            let (docs, annotations) = self.annotations_and_docs(&v);
                            let name = v
                                .into_inner()
                                .find(|p| p.as_rule() == Rule::ident)
                                .expect("grammar");
                            Variant {
                                docs,
                                annotations,
                                name: self.ident(name),
                                span,
                            }
                        })
                        .collect();
                }
                _ => {}
            }
        }
        Enum {
            docs,
            annotations,
            name: name.expect("grammar"),
            variants,
            span,
        }
    }

    fn service(&self, pair: Pair<'_, Rule>) -> Service {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let mut name = None;
        let mut version = None;
        let mut version_span = span;
        let mut methods = Vec::new();
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::ident => name = Some(self.ident(child)),
                Rule::version => {
                    version_span = self.span(&child);
                    version = child.as_str()[1..].parse().ok();
                }
                Rule::method => methods.push(self.method(child)),
                _ => {}
            }
        }
        Service {
            docs,
            annotations,
            name: name.expect("grammar"),
            version,
            version_span,
            methods,
            span,
        }
    }

    fn method(&self, pair: Pair<'_, Rule>) -> Method {
        let span = self.span(&pair);
        let (docs, annotations) = self.annotations_and_docs(&pair);
        let mut kind = MethodKind::Signal;
        let mut kind_span = span;
        let mut name = None;
        let mut params = Vec::new();
        let mut response = None;
        for child in pair.into_inner() {
            match child.as_rule() {
                Rule::method_kind => {
                    kind_span = self.span(&child);
                    kind = match child.as_str() {
                        "pushcall" => MethodKind::Pushcall,
                        "command" => MethodKind::Command,
                        _ => MethodKind::Signal,
                    };
                }
                Rule::ident => name = Some(self.ident(child)),
                Rule::params => params = child.into_inner().map(|p| self.field(p)).collect(),
                Rule::response => {
                    response = Some(self.type_expr(child.into_inner().next().expect("grammar")));
                }
                _ => {}
            }
        }
        Method {
            docs,
            annotations,
            kind,
            kind_span,
            name: name.expect("grammar"),
            params,
            response,
            span,
        }
    }
}

/// `/// text` -> `text` (one leading space removed, trailing white space and
/// `\r` dropped, so `rfidl fmt` never prints trailing white space).
fn doc_text(pair: &Pair<'_, Rule>) -> String {
    let text = pair.clone().into_inner().next().map_or("", |p| p.as_str());
    let text = text.trim_end_matches([' ', '\t', '\r']);
    text.strip_prefix(' ').unwrap_or(text).to_owned()
}

/// Resolves string escapes; on error, the byte offset in `raw` and a message.
pub fn unescape(raw: &str) -> Result<String, (usize, String)> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.char_indices();
    while let Some((offset, c)) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some((_, '"')) => out.push('"'),
            Some((_, '\\')) => out.push('\\'),
            Some((_, 'n')) => out.push('\n'),
            Some((_, 't')) => out.push('\t'),
            Some((_, 'r')) => out.push('\r'),
            Some((_, 'u')) => {
                let rest = &raw[offset + 2..];
                let code = rest
                    .strip_prefix('{')
                    .and_then(|r| r.split_once('}'))
                    .and_then(|(hex, _)| u32::from_str_radix(hex, 16).ok())
                    .and_then(char::from_u32)
                    .ok_or((
                        offset,
                        "invalid unicode escape: expected `\\u{hex}`".to_owned(),
                    ))?;
                out.push(code);
                let consumed = rest.find('}').map_or(0, |i| i + 1);
                for _ in 0..rest[..consumed].chars().count() {
                    chars.next();
                }
            }
            Some((_, other)) => return Err((offset, format!("unknown escape `\\{other}`"))),
            None => return Err((offset, "a string cannot end with `\\`".to_owned())),
        }
    }
    Ok(out)
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
