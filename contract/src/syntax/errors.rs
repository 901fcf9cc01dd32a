//! The wording of syntax errors: what pest expected, said the way a
//! contract author reads it (keywords, "a type", "`;`"), what was found
//! instead, and help for the usual slips. Never recovers or builds a tree.

use super::*;

/// Re-parses a failed input with pest's parse-attempt tracking on, to say
/// what was expected (`None` if it parses after all). Tracking costs time on every token, so the first parse
/// runs without it. The switch is process-wide: a lock keeps concurrent
/// explanations (parallel tests, several build scripts in one process) from
/// turning it off under each other.
pub(super) fn explain_failure(file: FileId, text: &str, rule: Rule) -> Option<Diagnostic> {
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

pub(super) fn syntax_error(
    file: FileId,
    text: &str,
    error: pest::error::Error<Rule>,
) -> Diagnostic {
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

pub(super) const PACKAGE_FIRST_HELP: &str =
    "a contract starts with its package: `package hr.employees;`";

/// The keywords a misspelt word is compared with ("did you mean").
pub(super) const KEYWORDS: [&str; 10] = [
    "package", "import", "record", "enum", "service", "signal", "pushcall", "command", "list",
    "map",
];

/// Sorts the expectations and drops the ones that only add noise.
pub(super) fn tidy_expected(expected: &mut Vec<String>) {
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
pub(super) fn end_of_last_token(text: &str, position: usize) -> usize {
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
pub(super) fn comment_start(line: &str) -> Option<usize> {
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
pub(super) fn unterminated_string(text: &str, position: usize) -> Option<usize> {
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

pub(super) fn describe_found(text: &str, position: usize) -> String {
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

pub(super) fn describe_rule(rule: Rule) -> Option<&'static str> {
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
