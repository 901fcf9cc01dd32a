//! `rfidl fmt` on generated contracts: random but well-formed files, with
//! random white space, line ends and `//` comments between the tokens.
//!
//! For each: the file parses; formatting it keeps the tree (spans aside),
//! keeps every `//` comment in order, is idempotent, and prints nothing
//! but the canonical layout (no trailing spaces, no tabs, no double blank
//! lines, ends with one newline).

use proptest::prelude::*;
use rfidl_contract::diagnostics::FileId;
use rfidl_contract::format::format_source;
use rfidl_contract::syntax::parse_file;

/// A small deterministic generator (xorshift64*): proptest picks the seed,
/// the failure message shows the text, which is what a human needs.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        choices[self.below(choices.len())]
    }
}

/// Where a token boundary may carry a comment.
#[derive(Clone, Copy, PartialEq)]
enum Gap {
    /// Anything: spaces, line ends, comments.
    Free,
    /// White space only (`list` and `map` must see their `<` after white space alone).
    WhiteSpaceOnly,
}

struct Writer {
    random: Random,
    text: String,
    comments: usize,
}

impl Writer {
    /// Separates the next token from the previous one.
    fn gap(&mut self, gap: Gap) {
        let choice = self.random.below(if gap == Gap::Free { 24 } else { 5 });
        match choice {
            0 => self.text.push(' '),
            1 => self.text.push('\n'),
            2 => self.text.push_str("\t "),
            3 => self.text.push_str("\r\n"),
            4 => self.text.push_str("  \n\n\n"),
            5 | 6 => {
                let comment = self.comment_text();
                self.text.push_str(&format!(" {comment}\n"));
            }
            7 => {
                let comment = self.comment_text();
                self.text.push_str(&format!("\n\n    {comment}\r\n"));
            }
            _ => self.text.push(' '),
        }
    }

    fn comment_text(&mut self) -> String {
        self.comments += 1;
        let n = self.comments;
        let body = self.random.pick(&[
            "plain",
            "with \"quotes\" and a // second marker",
            "ends with a backslash \\",
            "non-ASCII: straße, 日本, 😀",
            "",
            "{ braces } ( parens ) < angles > ; , ?",
        ]);
        match self.random.below(4) {
            0 => format!("//// four slashes {n} {body}"),
            1 => format!("//c{n} {body}"),
            _ => format!("// c{n} {body}"),
        }
    }

    /// A token after a free gap.
    fn token(&mut self, token: &str) {
        self.gap(Gap::Free);
        self.text.push_str(token);
    }

    /// `///` lines; a doc comment always ends its line.
    fn docs(&mut self) {
        for _ in 0..self.random.below(3) {
            self.gap(Gap::Free);
            let body = self.random.pick(&[
                "/// A doc line.",
                "///",
                "///   indented, with `code` and \"quotes\"",
                "///no space",
                "/// trailing white space \t ",
                "///   ",
            ]);
            self.text.push_str(body);
            let line_end = if self.random.chance(20) { "\r\n" } else { "\n" };
            self.text.push_str(line_end);
        }
    }

    fn name(&mut self, upper: bool) -> String {
        let choices: &[&str] = if upper {
            &[
                "Employee", "Money", "OrgUnit", "Straße", "X", "R2d2", "_Hidden",
            ]
        } else {
            &[
                "id", "name", "type", "match", "record", "list", "map", "größe", "_x", "v1",
            ]
        };
        self.random.pick(choices).to_owned()
    }

    fn string_literal(&mut self) -> String {
        self.random
            .pick(&[
                "\"48h\"",
                "\"use \\\"v2\\\" instead\"",
                "\"tab\\tand newline\\n and \\\\ and \\u{1F600}\"",
                "\"\"",
                "\"common/money.rfidl\"",
            ])
            .to_owned()
    }

    fn annotations(&mut self) {
        for _ in 0..self.random.below(3) {
            self.token("@");
            let name = self
                .random
                .pick(&["deprecated", "correlate", "delivery", "unknown"]);
            self.token(name);
            match self.random.below(4) {
                0 => {}
                1 => {
                    self.token("(");
                    self.token(")");
                }
                2 => {
                    self.token("(");
                    let value = self.string_literal();
                    self.token(&value);
                    self.token(")");
                }
                _ => {
                    self.token("(");
                    let arguments = 1 + self.random.below(3);
                    for index in 0..arguments {
                        if index > 0 {
                            self.token(",");
                        }
                        if self.random.chance(50) {
                            let name = self.name(false);
                            self.token(&name);
                            self.token("=");
                        }
                        let value = match self.random.below(3) {
                            0 => self.string_literal(),
                            1 => self.random.pick(&["10", "-3", "0"]).to_owned(),
                            _ => self.random.pick(&["employee.id", "order_id"]).to_owned(),
                        };
                        self.token(&value);
                    }
                    if self.random.chance(30) {
                        self.token(",");
                    }
                    self.token(")");
                }
            }
        }
    }

    fn type_expr(&mut self, depth: usize) {
        let kind = if depth > 3 { 0 } else { self.random.below(5) };
        match kind {
            0 | 1 => {
                let name = self.random.pick(&[
                    "string",
                    "u64",
                    "decimal",
                    "json",
                    "common.Money",
                    "hr.employees.Employee",
                    "OrgUnit",
                    "list",
                    "map",
                ]);
                self.token(name);
            }
            2 | 3 => {
                self.token("list");
                self.gap(Gap::WhiteSpaceOnly);
                self.text.push('<');
                self.type_expr(depth + 1);
                self.token(">");
            }
            _ => {
                self.token("map");
                self.gap(Gap::WhiteSpaceOnly);
                self.text.push('<');
                self.type_expr(depth + 1);
                self.token(",");
                self.type_expr(depth + 1);
                self.token(">");
            }
        }
        if self.random.chance(30) {
            self.token("?");
        }
    }

    /// `field: Type` list, separated by commas, maybe with a trailing one.
    fn fields(&mut self, max: usize) {
        let count = self.random.below(max + 1);
        for index in 0..count {
            if index > 0 {
                self.token(",");
            }
            self.docs();
            self.annotations();
            let name = self.name(false);
            self.token(&name);
            self.token(":");
            self.type_expr(0);
        }
        if count > 0 && self.random.chance(50) {
            self.token(",");
        }
    }

    fn record(&mut self) {
        self.token("record");
        let name = self.name(true);
        self.token(&name);
        self.token("{");
        self.fields(4);
        self.token("}");
    }

    fn enumeration(&mut self) {
        self.token("enum");
        let name = self.name(true);
        self.token(&name);
        self.token("{");
        let count = self.random.below(4);
        for index in 0..count {
            if index > 0 {
                self.token(",");
            }
            self.docs();
            self.annotations();
            let name = self.name(true);
            self.token(&name);
        }
        if count > 0 && self.random.chance(50) {
            self.token(",");
        }
        self.token("}");
    }

    fn service(&mut self) {
        self.token("service");
        let name = self.name(true);
        self.token(&name);
        let version = self
            .random
            .pick(&["v1", "v2", "v0", "v007", "v99999999999"]);
        self.token(version);
        self.token("{");
        for _ in 0..self.random.below(4) {
            self.docs();
            self.annotations();
            let kind = self.random.pick(&["signal", "pushcall", "command"]);
            self.token(kind);
            let name = self.name(true);
            self.token(&name);
            self.token("(");
            // Sometimes many parameters, so the printer has to split the line.
            let most = if self.random.chance(20) { 9 } else { 3 };
            self.fields(most);
            self.token(")");
            if self.random.chance(50) {
                self.token("->");
                self.type_expr(0);
            }
            self.token(";");
        }
        self.token("}");
    }

    fn file(seed: u64) -> Self {
        let mut writer = Writer {
            random: Random(seed | 1),
            text: String::new(),
            comments: 0,
        };
        if writer.random.chance(20) {
            writer.text.push('\u{feff}');
        }
        writer.docs();
        writer.token("package");
        let package = writer.random.pick(&["hr.employees", "common", "a.b_c.d2"]);
        writer.token(package);
        writer.token(";");
        for _ in 0..writer.random.below(7) {
            match writer.random.below(5) {
                0 => {
                    writer.docs();
                    writer.token("import");
                    let path = writer.string_literal();
                    writer.token(&path);
                    writer.token(";");
                }
                1 => {
                    writer.docs();
                    writer.annotations();
                    writer.record();
                }
                2 => {
                    writer.docs();
                    writer.annotations();
                    writer.enumeration();
                }
                _ => {
                    writer.docs();
                    writer.annotations();
                    writer.service();
                }
            }
        }
        if writer.random.chance(20) {
            writer.docs();
        }
        writer.gap(Gap::Free);
        writer
    }
}

/// The syntax tree's debug form with every span removed.
pub(crate) fn shape(text: &str) -> Result<String, String> {
    let file = parse_file(FileId::default(), text).map_err(|d| format!("{d:?}"))?;
    let debug = format!("{file:?}");
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug.as_str();
    while let Some(start) = rest.find("Span {") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .map_or(rest.len(), |e| start + e + 1);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Every plain `//` comment, in order, found independently of the
/// formatter: outside string literals, not a `///` doc comment.
fn plain_comments(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| split_comment(line).1)
        .map(str::trim_end)
        .filter(|comment| !comment.starts_with("///") || comment.starts_with("////"))
        .map(str::to_owned)
        .collect()
}

/// A line's code, and its `//` comment (doc or plain) if it has one
/// outside a string literal.
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut in_string = false;
    let mut chars = line.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' if in_string => {
                chars.next();
            }
            '"' => in_string = !in_string,
            '/' if !in_string && line[index..].starts_with("//") => {
                return (&line[..index], Some(&line[index..]));
            }
            _ => {}
        }
    }
    (line, None)
}

fn canonical_layout(formatted: &str) -> Result<(), String> {
    if !formatted.ends_with('\n') || formatted.ends_with("\n\n") {
        return Err("not ending with exactly one newline".into());
    }
    if formatted.contains("\n\n\n") {
        return Err("double blank line".into());
    }
    // A plain comment is kept verbatim, tabs included (as rustfmt and
    // gofmt keep theirs); everything else is the formatter's.
    let code_has_tab = formatted
        .lines()
        .any(|line| split_comment(line).0.contains('\t'));
    if code_has_tab || formatted.contains('\r') || formatted.starts_with('\u{feff}') {
        return Err("a tab, a carriage return or a byte order mark was kept".into());
    }
    for line in formatted.lines() {
        if line.trim_end() != line {
            return Err(format!("trailing white space: {line:?}"));
        }
        if (line.len() - line.trim_start().len()) % 4 != 0 {
            return Err(format!("indent not a multiple of 4: {line:?}"));
        }
    }
    Ok(())
}

/// The first line where `left` and `right` differ, with its neighbours.
fn first_difference(left: &str, right: &str) -> String {
    let left: Vec<&str> = left.lines().collect();
    let right: Vec<&str> = right.lines().collect();
    let at = (0..left.len().max(right.len()))
        .find(|i| left.get(*i) != right.get(*i))
        .unwrap_or(0);
    let from = at.saturating_sub(3);
    let window =
        |lines: &[&str]| lines[from.min(lines.len())..(at + 3).min(lines.len())].join("\n");
    format!(
        "first difference at line {}\n--- left\n{}\n--- right\n{}",
        at + 1,
        window(&left),
        window(&right)
    )
}

/// Checks every property for one generated file; `Err` says which failed.
fn check_generated(seed: u64) -> Result<(), String> {
    let written = Writer::file(seed);
    let found = plain_comments(&written.text).len();
    if found != written.comments {
        return Err(format!(
            "the comment scanner found {found} comments, the generator wrote {}\n{}",
            written.comments, written.text
        ));
    }
    shape(&written.text).map_err(|e| {
        format!(
            "the generator wrote an unparsable file\n{e}\n{}",
            written.text
        )
    })?;
    check_formatting(&written.text)
}

/// Formats `text`, which parses, and checks every property of the result.
fn check_formatting(text: &str) -> Result<(), String> {
    let context = |what: &str, detail: String| format!("{what}\n{detail}\n--- input\n{text}");
    let before = shape(text).map_err(|e| context("the input does not parse", e))?;
    let once = format_source(text).map_err(|d| context("formatting failed", format!("{d:?}")))?;
    let after = shape(&once).map_err(|e| context("the formatted text does not parse", e))?;
    if after != before {
        return Err(context(
            "formatting changed the tree",
            first_difference(text, &once),
        ));
    }
    let (kept, original) = (plain_comments(&once), plain_comments(text));
    if kept != original {
        return Err(context(
            "formatting lost, changed or reordered comments",
            format!("kept {kept:#?}\n--- formatted\n{once}"),
        ));
    }
    let twice =
        format_source(&once).map_err(|d| context("reformatting failed", format!("{d:?}")))?;
    if twice != once {
        return Err(context("not idempotent", first_difference(&once, &twice)));
    }
    canonical_layout(&once).map_err(|e| context(&e, once.clone()))
}

/// Line-level edits of a schema: they keep it parsable often enough to
/// reach the printer with shapes the generator does not write.
#[derive(Debug, Clone)]
enum LineEdit {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    /// Joins a line with the next one (a `//` comment then swallows code).
    Join(usize),
    Comment(usize),
    Indent(usize, usize),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    prop_oneof![
        any::<usize>().prop_map(LineEdit::Delete),
        any::<usize>().prop_map(LineEdit::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| LineEdit::Swap(a, b)),
        any::<usize>().prop_map(LineEdit::Join),
        any::<usize>().prop_map(LineEdit::Comment),
        (any::<usize>(), 0usize..9).prop_map(|(a, n)| LineEdit::Indent(a, n)),
    ]
}

fn edit_lines(text: &str, edits: &[LineEdit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for edit in edits {
        if lines.is_empty() {
            break;
        }
        let n = lines.len();
        match edit {
            LineEdit::Delete(at) => {
                lines.remove(at % n);
            }
            LineEdit::Duplicate(at) => {
                let line = lines[at % n].clone();
                lines.insert(at % n, line);
            }
            LineEdit::Swap(a, b) => lines.swap(a % n, b % n),
            LineEdit::Join(at) if at % n + 1 < n => {
                let next = lines.remove(at % n + 1);
                lines[at % n].push(' ');
                lines[at % n].push_str(&next);
            }
            LineEdit::Join(_) => {}
            LineEdit::Comment(at) => lines.insert(at % (n + 1), "    // inserted".to_owned()),
            LineEdit::Indent(at, by) => lines[at % n].insert_str(0, &"\t ".repeat(*by)),
        }
    }
    lines.join("\n")
}

// 200 cases each keep the test binary fast in debug; a run with
// `cases: 6000` passed before the count came down.
proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn formatting_edited_schemas_keeps_tree_and_comments(
        which in 0usize..3,
        edits in prop::collection::vec(line_edit(), 1..5),
    ) {
        let schemas: Vec<String> =
            rfidl_contract::check::load::contract_files(std::path::Path::new("../schemas"))
                .expect("schemas")
                .into_iter()
                .map(|path| std::fs::read_to_string(path).expect("read"))
                .collect();
        let text = edit_lines(&schemas[which % schemas.len()], &edits);
        if shape(&text).is_ok()
            && let Err(failure) = check_formatting(&text)
        {
            prop_assert!(false, "{}", failure);
        }
    }

    #[test]
    fn formatting_generated_contracts_keeps_tree_and_comments(seed in any::<u64>()) {
        if let Err(failure) = check_generated(seed) {
            prop_assert!(false, "seed {}: {}", seed, failure);
        }
    }
}

#[test]
fn comment_scanner_ignores_strings_and_docs() {
    let text = "/// doc // not a comment\n@deprecated(\"a // b \\\" // c\") // real\n//// four\n";
    assert_eq!(plain_comments(text), ["// real", "//// four"]);
}

/// Found by the generator: a comment before the first parameter made the
/// first run split the parameters and the second join them again.
#[test]
fn comments_inside_a_parameter_list_keep_it_split() {
    let input = "package a;\nservice S v1 {\n    signal Ping( // why\n        at: timestamp) -> X // after\n    ;\n    @deprecated\n    // about the kind\n    command\n    // about the name\n    Go();\n}\n";
    let expected = "package a;\n\nservice S v1 {\n    signal Ping(\n        // why\n        at: timestamp,\n        // after\n    ) -> X;\n\n    @deprecated\n    // about the kind\n    // about the name\n    command Go();\n}\n";
    let once = format_source(input).expect("parses");
    assert_eq!(once, expected);
    assert_eq!(format_source(&once).expect("parses"), once);
}

#[test]
fn versions_are_printed_without_leading_zeros() {
    let once = format_source("package a;\nservice S v007 {}\nservice S v99999999999 {}\n")
        .expect("parses");
    assert_eq!(
        once,
        "package a;\n\nservice S v7 {}\n\nservice S v99999999999 {}\n"
    );
}

/// The 100-column limit counts characters, not UTF-8 bytes.
#[test]
fn the_line_limit_counts_characters() {
    // 96 characters with the indent, 171 bytes.
    let name = format!("Ä{}", "ä".repeat(74));
    let input = format!("package a;\nservice S v1 {{\n    signal Ping(x: {name});\n}}\n");
    let once = format_source(&input).expect("parses");
    let line = once
        .lines()
        .find(|l| l.contains("signal"))
        .expect("method line");
    assert!(line.chars().count() <= 100 && line.len() > 100, "{line}");
    assert!(line.ends_with(");"), "split although it fits: {once}");
}
