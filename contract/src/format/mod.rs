//! `rfidl fmt`: prints a contract in the one canonical layout, keeping every
//! comment.
//!
//! Doc comments are part of the AST. Plain `//` comments are not: they are
//! recovered from the source text with their byte positions and re-attached
//! while the printer walks the tree in source order: a comment on a line of
//! its own is printed before the next node that starts after it; a comment
//! after code on the same line stays at the end of that node's line.
//! Formatting never changes meaning: `parse(format(x))` equals `parse(x)`
//! apart from spans, and `format(format(x)) == format(x)`.

use crate::diagnostics::{Diagnostic, FileId};
use crate::syntax::{self, ast};

const INDENT: &str = "    ";
/// A method whose one-line form is longer than this (in characters) is split, one parameter per line.
const MAX_WIDTH: usize = 100;

/// Formats one source text.
pub fn format_source(text: &str) -> Result<String, Box<Diagnostic>> {
    let file = syntax::parse_file(FileId(0), text)?;
    let mut printer = Printer {
        out: Vec::new(),
        comments: comments(text),
        next_comment: 0,
        line_starts: std::iter::once(0)
            .chain(text.match_indices('\n').map(|(index, _)| index + 1))
            .collect(),
        text,
    };
    printer.file(&file);
    let mut result = printer.out.join("\n");
    while result.ends_with("\n\n") {
        result.pop();
    }
    result.push('\n');
    Ok(result)
}

#[derive(Debug)]
struct Comment {
    start: usize,
    line: usize,
    /// The comment text including `//`, trailing white space removed.
    text: String,
    /// Code precedes it on its line.
    trailing: bool,
}

/// Every `//` comment that is not a doc comment, outside string literals.
fn comments(text: &str) -> Vec<Comment> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut line = 1;
    let mut line_has_code = false;
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'\n' => {
                line += 1;
                line_has_code = false;
            }
            b'"' => {
                line_has_code = true;
                index += 1;
                while index < bytes.len() && bytes[index] != b'"' && bytes[index] != b'\n' {
                    index += if bytes[index] == b'\\' { 2 } else { 1 };
                }
                // An escape may have stepped into a multi-byte character.
                while index < bytes.len() && !text.is_char_boundary(index) {
                    index += 1;
                }
            }
            b'/' if bytes.get(index + 1) == Some(&b'/') => {
                let end = text[index..].find('\n').map_or(text.len(), |n| index + n);
                let body = text[index..end].trim_end();
                let is_doc = body.starts_with("///") && !body.starts_with("////");
                if !is_doc {
                    found.push(Comment {
                        start: index,
                        line,
                        text: body.to_owned(),
                        trailing: line_has_code,
                    });
                }
                index = end;
                continue;
            }
            b' ' | b'\t' | b'\r' => {}
            _ => line_has_code = true,
        }
        index += 1;
    }
    found
}

struct Printer<'a> {
    out: Vec<String>,
    comments: Vec<Comment>,
    next_comment: usize,
    /// Byte offset where each line starts, for [`Printer::line_of`].
    line_starts: Vec<usize>,
    text: &'a str,
}

impl Printer<'_> {
    /// The 1-based line of `byte` (a binary search: formatting stays linear).
    fn line_of(&self, byte: usize) -> usize {
        self.line_starts.partition_point(|start| *start <= byte)
    }

    fn push(&mut self, depth: usize, line: impl AsRef<str>) {
        self.out
            .push(format!("{}{}", INDENT.repeat(depth), line.as_ref()));
    }

    fn blank(&mut self) {
        if self.out.last().is_some_and(|l| !l.is_empty()) {
            self.out.push(String::new());
        }
    }

    /// Prints the comments that start before `position` on lines of their own.
    fn comments_before(&mut self, depth: usize, position: usize) {
        while let Some(comment) = self.comments.get(self.next_comment) {
            if comment.start >= position {
                break;
            }
            let text = comment.text.clone();
            self.push(depth, text);
            self.next_comment += 1;
        }
    }

    /// Appends a comment that follows code on the line where `end` is,
    /// when only separators (`,` `;` `{`) stand between that code and it.
    fn trailing_comment(&mut self, end: usize) {
        let line = self.line_of(end.saturating_sub(1));
        if let Some(comment) = self.comments.get(self.next_comment)
            && comment.trailing
            && comment.line == line
            && comment.start >= end
            && self.text[end..comment.start]
                .chars()
                .all(|c| c.is_whitespace() || matches!(c, ',' | ';' | '{'))
        {
            let text = comment.text.clone();
            if let Some(last) = self.out.last_mut() {
                last.push(' ');
                last.push_str(&text);
            }
            self.next_comment += 1;
        }
    }

    fn docs(&mut self, depth: usize, docs: &[String]) {
        for doc in docs {
            if doc.is_empty() {
                self.push(depth, "///");
            } else {
                self.push(depth, format!("/// {doc}"));
            }
        }
    }

    fn annotations(&mut self, depth: usize, annotations: &[ast::Annotation]) {
        for annotation in annotations {
            self.comments_before(depth, annotation.span.start);
            self.push(depth, annotation_text(annotation));
            self.trailing_comment(annotation.span.end);
        }
    }

    fn file(&mut self, file: &ast::File) {
        self.comments_before(0, file.package.span.start);
        if !self.out.is_empty() && !file.package.docs.is_empty() {
            self.blank();
        }
        self.docs(0, &file.package.docs);
        self.annotations(0, &file.package.annotations);
        self.push(0, format!("package {};", file.package.name.text));
        self.trailing_comment(file.package.span.end);
        let mut previous_was_import = false;
        for item in &file.items {
            let is_import = matches!(item, ast::Item::Import(_));
            if !(is_import && previous_was_import) {
                self.blank();
            }
            previous_was_import = is_import;
            self.comments_before(0, item.span().start);
            match item {
                ast::Item::Import(import) => {
                    self.docs(0, &import.docs);
                    self.annotations(0, &import.annotations);
                    self.push(0, format!("import {};", quote(&import.path)));
                    self.trailing_comment(import.span.end);
                }
                ast::Item::Record(record) => self.record(record),
                ast::Item::Enum(enumeration) => self.enumeration(enumeration),
                ast::Item::Service(service) => self.service(service),
            }
        }
        if !file.trailing_docs.is_empty() {
            self.blank();
            self.comments_before(0, file.trailing_docs[0].1.start);
            for (doc, _) in &file.trailing_docs {
                self.push(
                    0,
                    if doc.is_empty() {
                        "///".to_owned()
                    } else {
                        format!("/// {doc}")
                    },
                );
            }
        }
        let remaining = self.comments.len() - self.next_comment;
        if remaining > 0 {
            self.blank();
            self.comments_before(0, usize::MAX);
        }
    }

    /// `header {`, then the members, then `}` (or `header {}` when empty).
    fn block(
        &mut self,
        header: String,
        name_end: usize,
        end: usize,
        members: impl FnOnce(&mut Self),
    ) {
        let before = self.out.len();
        self.push(0, format!("{header} {{"));
        self.trailing_comment(name_end);
        let opened = self.out.len();
        members(self);
        self.comments_before(1, end);
        if self.out.len() == opened
            && self.out.len() == before + 1
            && self.out[before].ends_with('{')
        {
            self.out[before].push('}');
        } else {
            self.push(0, "}");
        }
        self.trailing_comment(end);
    }

    fn record(&mut self, record: &ast::Record) {
        self.docs(0, &record.docs);
        self.annotations(0, &record.annotations);
        self.comments_before(0, record.name.span.start);
        self.block(
            format!("record {}", record.name.text),
            record.name.span.end,
            record.span.end,
            |p| {
                for field in &record.fields {
                    p.field(1, field, ",");
                }
            },
        );
    }

    fn field(&mut self, depth: usize, field: &ast::Field, terminator: &str) {
        self.comments_before(depth, field.span.start);
        self.docs(depth, &field.docs);
        self.annotations(depth, &field.annotations);
        self.comments_before(depth, field.name.span.start);
        self.push(
            depth,
            format!("{}: {}{terminator}", field.name.text, type_text(&field.ty)),
        );
        self.trailing_comment(field.span.end);
    }

    fn enumeration(&mut self, enumeration: &ast::Enum) {
        self.docs(0, &enumeration.docs);
        self.annotations(0, &enumeration.annotations);
        self.comments_before(0, enumeration.name.span.start);
        self.block(
            format!("enum {}", enumeration.name.text),
            enumeration.name.span.end,
            enumeration.span.end,
            |p| {
                for variant in &enumeration.variants {
                    p.comments_before(1, variant.span.start);
                    p.docs(1, &variant.docs);
                    p.annotations(1, &variant.annotations);
                    p.comments_before(1, variant.name.span.start);
                    p.push(1, format!("{},", variant.name.text));
                    p.trailing_comment(variant.span.end);
                }
            },
        );
    }

    fn service(&mut self, service: &ast::Service) {
        self.docs(0, &service.docs);
        self.annotations(0, &service.annotations);
        self.comments_before(0, service.name.span.start);
        // `v01` is printed `v1`; a number too large for a version is kept as written.
        let version = match service.version {
            Some(number) => format!("v{number}"),
            None => self.text[service.version_span.start..service.version_span.end].to_owned(),
        };
        let header = format!("service {} {version}", service.name.text);
        self.block(header, service.version_span.end, service.span.end, |p| {
            for (index, method) in service.methods.iter().enumerate() {
                if index > 0 {
                    p.blank();
                }
                p.method(method);
            }
        });
    }

    fn method(&mut self, method: &ast::Method) {
        self.comments_before(1, method.span.start);
        self.docs(1, &method.docs);
        self.annotations(1, &method.annotations);
        // Comments before the name go above the signature.
        self.comments_before(1, method.name.span.start);
        let response = method
            .response
            .as_ref()
            .map(|r| format!(" -> {}", type_text(r)))
            .unwrap_or_default();
        // Any comment left inside the method (in or after the parameter
        // list, before `;`) forces one parameter per line, and is printed
        // before the closing `)`: where the next run finds it again.
        let comment_inside = self
            .comments
            .get(self.next_comment)
            .is_some_and(|c| c.start < method.span.end);
        let simple_params = !comment_inside
            && method
                .params
                .iter()
                .all(|p| p.docs.is_empty() && p.annotations.is_empty());
        let inline: Vec<String> = method
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name.text, type_text(&p.ty)))
            .collect();
        let one_line = format!(
            "{} {}({}){response};",
            method.kind.keyword(),
            method.name.text,
            inline.join(", ")
        );
        if simple_params && INDENT.len() + one_line.chars().count() <= MAX_WIDTH {
            self.push(1, one_line);
        } else {
            self.push(
                1,
                format!("{} {}(", method.kind.keyword(), method.name.text),
            );
            for param in &method.params {
                self.field(2, param, ",");
            }
            self.comments_before(2, method.span.end);
            self.push(1, format!("){response};"));
        }
        self.trailing_comment(method.span.end);
    }
}

fn annotation_text(annotation: &ast::Annotation) -> String {
    let name = &annotation.name.text;
    match &annotation.args {
        None => format!("@{name}"),
        Some(args) => {
            let args: Vec<String> = args
                .iter()
                .map(|arg| {
                    let value = match &arg.value {
                        ast::Value::String(text) => quote(text),
                        ast::Value::Integer(text) | ast::Value::Path(text) => text.clone(),
                    };
                    match &arg.name {
                        Some(name) => format!("{} = {value}", name.text),
                        None => value,
                    }
                })
                .collect();
            format!("@{name}({})", args.join(", "))
        }
    }
}

fn type_text(ty: &ast::TypeExpr) -> String {
    let base = match &ty.kind {
        ast::TypeKind::Named(name) => name.text.clone(),
        ast::TypeKind::List(inner) => format!("list<{}>", type_text(inner)),
        ast::TypeKind::Map(key, value) => format!("map<{}, {}>", type_text(key), type_text(value)),
    };
    if ty.optional {
        format!("{base}?")
    } else {
        base
    }
}

/// A string literal that parses back to `text`.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
