//! Tree building: pest pairs -> [`ast`] nodes with spans, string escapes
//! resolved. Runs only on text the grammar accepted; its only errors are
//! bad escapes (E0004) and the item rules the grammar leaves to it.

use pest::iterators::Pair;

use super::*;

pub(super) struct Builder<'t> {
    pub(super) file: FileId,
    pub(super) text: &'t str,
    /// Bad escapes found in string literals (reported after the walk).
    pub(super) string_errors: std::cell::RefCell<Vec<Diagnostic>>,
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

    pub(super) fn file(&self, pair: Pair<'_, Rule>) -> Result<File, Box<Diagnostic>> {
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
pub(super) fn doc_text(pair: &Pair<'_, Rule>) -> String {
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
