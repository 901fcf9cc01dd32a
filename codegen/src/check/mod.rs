//! Checking: name resolution and every rule of the language, each with its
//! own error code; then the resolved model.
//!
//! All problems of a run are reported, not only the first. The model is
//! built only when no error was found, so later stages never see a contract
//! that breaks a rule.

pub mod load;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::diagnostics::{Diagnostic, ErrorCode, FileId, SourceMap, Span, suggest};
use crate::manifest::{
    self, Delivery, Manifest, MethodKind, PackageContract, Scalar, TypeDef, TypeRef,
};
use crate::model::Model;
use crate::syntax::ast;
pub use load::LoadError;

/// The result of checking a set of contracts.
#[derive(Debug)]
pub struct CheckOutcome {
    pub sources: SourceMap,
    /// Present only when there are no errors.
    pub model: Option<Model>,
    pub diagnostics: Vec<Diagnostic>,
    /// Every contract file read (roots and imports), canonical paths.
    pub read_paths: Vec<PathBuf>,
}

impl CheckOutcome {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// Every diagnostic rendered rustc-style, in order.
    pub fn render_human(&self) -> String {
        self.diagnostics
            .iter()
            .map(|d| crate::diagnostics::render_human(&self.sources, d))
            .collect()
    }
}

/// Loads, parses and checks `roots` (files or directories).
pub fn check_paths(roots: &[PathBuf]) -> Result<CheckOutcome, LoadError> {
    check_paths_with_includes(roots, &[])
}

/// Like [`check_paths`], also searching `include_paths` for imports.
pub fn check_paths_with_includes(
    roots: &[PathBuf],
    include_paths: &[PathBuf],
) -> Result<CheckOutcome, LoadError> {
    let loaded = load::load_with_includes(roots, include_paths)?;
    let mut checker = Checker {
        loaded: &loaded,
        diagnostics: Default::default(),
        types: BTreeMap::new(),
    };
    checker.types = checker.collect_types();
    checker.check_items();
    checker.check_required_cycles();
    checker.check_deprecated_uses();
    let mut diagnostics = loaded.diagnostics.clone();
    diagnostics.append(&mut checker.diagnostics.borrow_mut());
    diagnostics.sort_by_key(|d| d.span.map(|s| (s.file, s.start)));
    let model = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        Some(checker.build_model())
    };
    let load::Loaded {
        sources,
        read_paths,
        ..
    } = loaded;
    Ok(CheckOutcome {
        sources,
        model,
        diagnostics,
        read_paths,
    })
}

const SCALARS: [&str; 14] = [
    "bool",
    "i32",
    "i64",
    "u32",
    "u64",
    "f64",
    "string",
    "bytes",
    "uuid",
    "timestamp",
    "date",
    "duration",
    "decimal",
    "json",
];
const ANNOTATIONS: [&str; 3] = ["correlate", "delivery", "deprecated"];
const DELIVERY_ARGS: [&str; 2] = ["max_retries", "ttl"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeclKind {
    Record,
    Enum,
}

#[derive(Debug, Clone)]
struct Decl {
    kind: DeclKind,
    span: Span,
    file: FileId,
    /// The `@deprecated` reason, if the type is deprecated.
    deprecated: Option<String>,
}

/// Where an annotation sits, for the wrong-target rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Record,
    Field,
    Enum,
    Variant,
    Service,
    Method,
    Param,
}

impl Target {
    fn describe(self) -> &'static str {
        match self {
            Target::Record => "a record",
            Target::Field => "a field",
            Target::Enum => "an enum",
            Target::Variant => "an enum variant",
            Target::Service => "a service",
            Target::Method => "a method",
            Target::Param => "a parameter",
        }
    }
}

struct Checker<'a> {
    loaded: &'a load::Loaded,
    diagnostics: std::cell::RefCell<Vec<Diagnostic>>,
    /// package -> type name -> declaration.
    types: BTreeMap<String, BTreeMap<String, Decl>>,
}

impl Checker<'_> {
    fn report(&self, diagnostic: Diagnostic) {
        self.diagnostics.borrow_mut().push(diagnostic);
    }

    fn collect_types(&self) -> BTreeMap<String, BTreeMap<String, Decl>> {
        let loaded = self.loaded;
        let mut types: BTreeMap<String, BTreeMap<String, Decl>> = BTreeMap::new();
        for (file_id, file) in loaded.files.iter() {
            let package = file.package.name.text.clone();
            for item in &file.items {
                let (name, kind, annotations) = match item {
                    ast::Item::Record(r) => (&r.name, DeclKind::Record, &r.annotations),
                    ast::Item::Enum(e) => (&e.name, DeclKind::Enum, &e.annotations),
                    _ => continue,
                };
                let table = types.entry(package.clone()).or_default();
                if let Some(previous) = table.get(&name.text) {
                    let previous = previous.span;
                    self.report(
                        Diagnostic::error(
                            ErrorCode::DuplicateType,
                            name.span,
                            format!(
                                "the type `{}` is defined more than once in package `{package}`",
                                name.text
                            ),
                        )
                        .with_label("redefined here")
                        .with_secondary(previous, "first defined here")
                        .with_help("rename one of them"),
                    );
                    continue;
                }
                table.insert(
                    name.text.clone(),
                    Decl {
                        kind,
                        span: name.span,
                        file: *file_id,
                        deprecated: deprecation(annotations),
                    },
                );
            }
        }
        types
    }

    fn check_items(&self) {
        let loaded = self.loaded;
        // (package, service, version) -> where it was first declared: a
        // package may spread its service versions over several files.
        let mut versions: BTreeMap<(String, String, u32), Span> = BTreeMap::new();
        for (file_id, file) in loaded.files.iter() {
            self.check_package_name(&file.package.name);
            let scope = Scope::new(self, *file_id, file);
            for item in &file.items {
                match item {
                    ast::Item::Import(_) => {}
                    ast::Item::Record(record) => self.check_record(&scope, record),
                    ast::Item::Enum(enumeration) => self.check_enum(enumeration),
                    ast::Item::Service(service) => {
                        self.check_service(&scope, service);
                        if let Some(version) = service.version {
                            let key = (
                                file.package.name.text.clone(),
                                service.name.text.clone(),
                                version,
                            );
                            if let Some(first) = versions.get(&key) {
                                let first = *first;
                                self.report(
                                    Diagnostic::error(
                                        ErrorCode::DuplicateServiceVersion,
                                        service.version_span,
                                        format!(
                                            "`{} v{version}` is defined more than once",
                                            service.name.text
                                        ),
                                    )
                                    .with_label("defined again here")
                                    .with_secondary(first, "first defined here")
                                    .with_help(
                                        "a changed interface needs a new version: `v{next}`"
                                            .replace("{next}", &(version + 1).to_string()),
                                    ),
                                );
                            } else {
                                versions.insert(key, service.version_span);
                            }
                        }
                    }
                }
            }
            for (_, span) in &file.trailing_docs {
                self.report(
                    Diagnostic::warning(
                        ErrorCode::DanglingDocComment,
                        *span,
                        "doc comment documents nothing",
                    )
                    .with_label("nothing follows this doc comment")
                    .with_help("use `//` for a plain comment"),
                );
            }
        }
    }

    fn check_package_name(&self, name: &ast::Ident) {
        let valid = name.text.split('.').all(|segment| {
            segment
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase())
                && segment
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        });
        if !valid {
            self.report(
                Diagnostic::error(
                    ErrorCode::InvalidPackageName,
                    name.span,
                    format!(
                        "package name `{}` should be lowercase dotted segments",
                        name.text
                    ),
                )
                .with_label("not a valid package name")
                .with_help(format!(
                    "try `{}`",
                    name.text.to_lowercase().replace('-', "_")
                )),
            );
        }
    }

    fn check_upper_camel(&self, name: &ast::Ident, what: &str) {
        let text = &name.text;
        // Letters without case (東京) are accepted, as rustc's lint does.
        let first_fine = text
            .chars()
            .next()
            .is_some_and(|c| c != '_' && !c.is_lowercase());
        if !first_fine || text.contains('_') {
            let fixed = heck::ToUpperCamelCase::to_upper_camel_case(text.as_str());
            let mut diagnostic = Diagnostic::error(
                ErrorCode::NotUpperCamelCase,
                name.span,
                format!("{what} `{text}` should have an UpperCamelCase name"),
            )
            .with_label("not UpperCamelCase");
            if !fixed.is_empty() && fixed != *text {
                diagnostic = diagnostic.with_help(format!("rename it to `{fixed}`"));
            }
            self.report(diagnostic);
        }
    }

    fn check_snake(&self, name: &ast::Ident, what: &str) {
        let text = &name.text;
        if text.chars().any(char::is_uppercase) || text.contains("__") {
            let fixed = heck::ToSnakeCase::to_snake_case(text.as_str());
            let mut diagnostic = Diagnostic::error(
                ErrorCode::NotSnakeCase,
                name.span,
                format!("{what} `{text}` should have a snake_case name"),
            )
            .with_label("not snake_case");
            if !fixed.is_empty() && fixed != *text {
                diagnostic = diagnostic.with_help(format!("rename it to `{fixed}`"));
            }
            self.report(diagnostic);
        }
    }

    fn check_record(&self, scope: &Scope, record: &ast::Record) {
        self.check_upper_camel(&record.name, "record");
        self.check_annotations(&record.annotations, Target::Record, None);
        self.check_fields(scope, &record.fields, Target::Field);
    }

    fn check_fields(&self, scope: &Scope, fields: &[ast::Field], target: Target) {
        let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
        let (what, code) = match target {
            Target::Param => ("parameter", ErrorCode::DuplicateParam),
            _ => ("field", ErrorCode::DuplicateField),
        };
        for field in fields {
            if let Some(first) = seen.get(field.name.text.as_str()) {
                let first = *first;
                self.report(
                    Diagnostic::error(
                        code,
                        field.name.span,
                        format!("{what} `{}` is declared more than once", field.name.text),
                    )
                    .with_label(format!("duplicate {what}"))
                    .with_secondary(first, "first declared here"),
                );
            } else {
                seen.insert(&field.name.text, field.name.span);
            }
            self.check_snake(&field.name, what);
            self.check_annotations(&field.annotations, target, None);
            self.check_type(scope, &field.ty);
        }
    }

    fn check_enum(&self, enumeration: &ast::Enum) {
        self.check_upper_camel(&enumeration.name, "enum");
        self.check_annotations(&enumeration.annotations, Target::Enum, None);
        if enumeration.variants.is_empty() {
            self.report(
                Diagnostic::error(
                    ErrorCode::EmptyEnum,
                    enumeration.name.span,
                    format!("enum `{}` has no variants", enumeration.name.text),
                )
                .with_label("no value of this type can exist")
                .with_help("add a variant, or use an empty `record` for a value without content"),
            );
        }
        let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
        for variant in &enumeration.variants {
            if let Some(first) = seen.get(variant.name.text.as_str()) {
                let first = *first;
                self.report(
                    Diagnostic::error(
                        ErrorCode::DuplicateVariant,
                        variant.name.span,
                        format!("variant `{}` is declared more than once", variant.name.text),
                    )
                    .with_label("duplicate variant")
                    .with_secondary(first, "first declared here"),
                );
            } else {
                seen.insert(&variant.name.text, variant.name.span);
            }
            self.check_upper_camel(&variant.name, "variant");
            self.check_annotations(&variant.annotations, Target::Variant, None);
        }
    }

    fn check_service(&self, scope: &Scope, service: &ast::Service) {
        self.check_upper_camel(&service.name, "service");
        self.check_annotations(&service.annotations, Target::Service, None);
        match service.version {
            Some(0) => self.report(
                Diagnostic::error(
                    ErrorCode::InvalidVersion,
                    service.version_span,
                    "a service version must be 1 or more",
                )
                .with_label("invalid version")
                .with_help("versions count from `v1`"),
            ),
            None => self.report(
                Diagnostic::error(
                    ErrorCode::InvalidVersion,
                    service.version_span,
                    format!("a service version must be at most {}", u32::MAX),
                )
                .with_label("too large")
                .with_help("versions count up from `v1`, one per breaking change"),
            ),
            Some(_) => {}
        }
        let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
        // Generated clients and handlers name methods in snake_case.
        let mut rust_names: BTreeMap<String, (&str, Span)> = BTreeMap::new();
        for method in &service.methods {
            if let Some(first) = seen.get(method.name.text.as_str()) {
                let first = *first;
                self.report(
                    Diagnostic::error(
                        ErrorCode::DuplicateMethod,
                        method.name.span,
                        format!(
                            "method `{}` is declared more than once in `{}`",
                            method.name.text, service.name.text
                        ),
                    )
                    .with_label("duplicate method")
                    .with_secondary(first, "first declared here"),
                );
            } else {
                seen.insert(&method.name.text, method.name.span);
                let rust_name = heck::ToSnakeCase::to_snake_case(method.name.text.as_str());
                match rust_names.get(&rust_name) {
                    Some((other, first)) => self.report(
                        Diagnostic::error(
                            ErrorCode::MethodRustNameClash,
                            method.name.span,
                            format!(
                                "methods `{other}` and `{}` would both be `{rust_name}` in Rust",
                                method.name.text
                            ),
                        )
                        .with_label(format!("becomes `{rust_name}`"))
                        .with_secondary(*first, format!("also becomes `{rust_name}`"))
                        .with_help("rename one of them so the names differ by more than case"),
                    ),
                    None => {
                        rust_names.insert(rust_name, (method.name.text.as_str(), method.name.span));
                    }
                }
            }
            self.check_upper_camel(&method.name, "method");
            self.check_fields(scope, &method.params, Target::Param);
            if let Some(response) = &method.response {
                if method.kind == ast::MethodKind::Signal {
                    self.report(
                        Diagnostic::error(
                            ErrorCode::SignalWithResponse,
                            response.span,
                            "a signal cannot have a response",
                        )
                        .with_label("response declared here")
                        .with_secondary(method.kind_span, "this is a signal")
                        .with_help("remove `-> …`, or make it a `pushcall` if the engine answers"),
                    );
                }
                self.check_type(scope, response);
            }
            self.check_annotations(&method.annotations, Target::Method, Some((scope, method)));
        }
    }

    fn check_type(&self, scope: &Scope, ty: &ast::TypeExpr) {
        match &ty.kind {
            ast::TypeKind::Named(name) => {
                if let Err(diagnostic) = scope.resolve(name) {
                    // A name from an import that failed (missing file, cycle,
                    // syntax error) is a consequence of that error, already
                    // reported: do not bury it under follow-up errors.
                    let follow_up = scope.has_failed_imports
                        && matches!(
                            diagnostic.code,
                            ErrorCode::UnknownPackage | ErrorCode::UnknownType
                        );
                    if !follow_up {
                        self.report(*diagnostic);
                    }
                }
            }
            ast::TypeKind::List(inner) => self.check_type(scope, inner),
            ast::TypeKind::Map(key, value) => {
                let is_string = matches!(&key.kind, ast::TypeKind::Named(n) if n.text == "string")
                    && !key.optional;
                if !is_string {
                    self.report(
                        Diagnostic::error(
                            ErrorCode::MapKeyNotString,
                            key.span,
                            "map keys must be `string`",
                        )
                        .with_label("not `string`")
                        .with_help(
                            "maps are JSON objects, whose keys are strings: use `map<string, …>`",
                        ),
                    );
                }
                self.check_type(scope, value);
            }
        }
    }

    fn check_annotations(
        &self,
        annotations: &[ast::Annotation],
        target: Target,
        method: Option<(&Scope, &ast::Method)>,
    ) {
        let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
        for annotation in annotations {
            let name = annotation.name.text.as_str();
            if !ANNOTATIONS.contains(&name) {
                let mut diagnostic = Diagnostic::error(
                    ErrorCode::UnknownAnnotation,
                    annotation.name.span,
                    format!("unknown annotation `@{name}`"),
                )
                .with_label("not a known annotation");
                diagnostic = match suggest(name, ANNOTATIONS) {
                    Some(close) => diagnostic.with_help(format!("did you mean `@{close}`?")),
                    None => diagnostic.with_help(
                        "the annotations are `@correlate`, `@delivery` and `@deprecated`",
                    ),
                };
                self.report(diagnostic);
                continue;
            }
            if let Some(first) = seen.get(name) {
                let first = *first;
                self.report(
                    Diagnostic::error(
                        ErrorCode::DuplicateAnnotation,
                        annotation.span,
                        format!("`@{name}` is given twice"),
                    )
                    .with_label("repeated here")
                    .with_secondary(first, "first given here"),
                );
                continue;
            }
            seen.insert(name, annotation.span);
            if name != "deprecated" && target != Target::Method {
                self.report(
                    Diagnostic::error(
                        ErrorCode::AnnotationTarget,
                        annotation.span,
                        format!("`@{name}` is not allowed on {}", target.describe()),
                    )
                    .with_label("not allowed here")
                    .with_help(format!("`@{name}` goes on a method")),
                );
                continue;
            }
            match name {
                "deprecated" => self.check_deprecated_args(annotation),
                "delivery" => self.check_delivery_args(annotation),
                _ => {
                    if let Some((scope, method)) = method {
                        self.check_correlate(scope, method, annotation);
                    }
                }
            }
        }
    }

    fn check_deprecated_args(&self, annotation: &ast::Annotation) {
        let args = annotation.args.as_deref().unwrap_or_default();
        let fine = match args {
            [] => true,
            [arg] => arg.name.is_none() && matches!(arg.value, ast::Value::String(_)),
            _ => false,
        };
        if !fine {
            self.report(
                Diagnostic::error(
                    ErrorCode::AnnotationArguments,
                    annotation.span,
                    "`@deprecated` takes one string: the reason",
                )
                .with_label("invalid arguments")
                .with_help("write `@deprecated(\"use v2\")` or `@deprecated`"),
            );
        }
    }

    fn check_delivery_args(&self, annotation: &ast::Annotation) {
        let args = annotation.args.as_deref().unwrap_or_default();
        if args.is_empty() {
            self.report(
                Diagnostic::error(
                    ErrorCode::AnnotationArguments,
                    annotation.span,
                    "`@delivery` needs `max_retries`, `ttl` or both",
                )
                .with_label("no arguments")
                .with_help("write `@delivery(max_retries = 10, ttl = \"48h\")`"),
            );
            return;
        }
        let mut seen = BTreeSet::new();
        for arg in args {
            let Some(name) = &arg.name else {
                self.report(
                    Diagnostic::error(
                        ErrorCode::AnnotationArguments,
                        arg.span,
                        "`@delivery` arguments are named",
                    )
                    .with_label("unnamed argument")
                    .with_help("write `max_retries = N` or `ttl = \"48h\"`"),
                );
                continue;
            };
            if !seen.insert(name.text.as_str()) {
                self.report(
                    Diagnostic::error(
                        ErrorCode::AnnotationArguments,
                        name.span,
                        format!("`{}` is given twice", name.text),
                    )
                    .with_label("repeated argument"),
                );
                continue;
            }
            match (name.text.as_str(), &arg.value) {
                ("max_retries", ast::Value::Integer(n)) if n.parse::<u32>().is_ok() => {}
                ("max_retries", _) => self.report(
                    Diagnostic::error(
                        ErrorCode::AnnotationArguments,
                        arg.span,
                        "`max_retries` must be a whole number from 0 up",
                    )
                    .with_label(format!("found {}", arg.value.describe())),
                ),
                ("ttl", ast::Value::String(text))
                    if parse_duration_ms(text).is_some_and(|ms| ms > 0) => {}
                ("ttl", _) => self.report(
                    Diagnostic::error(
                        ErrorCode::AnnotationArguments,
                        arg.span,
                        "`ttl` must be a positive duration string such as \"48h\"",
                    )
                    .with_label("not a positive duration")
                    .with_help("units are `d`, `h`, `m`, `s` and `ms`, combinable: \"1h30m\""),
                ),
                (other, _) => {
                    let mut diagnostic = Diagnostic::error(
                        ErrorCode::AnnotationArguments,
                        name.span,
                        format!("`@delivery` has no argument `{other}`"),
                    )
                    .with_label("unknown argument");
                    if let Some(close) = suggest(other, DELIVERY_ARGS) {
                        diagnostic = diagnostic.with_help(format!("did you mean `{close}`?"));
                    }
                    self.report(diagnostic);
                }
            }
        }
    }

    fn check_correlate(&self, scope: &Scope, method: &ast::Method, annotation: &ast::Annotation) {
        let path = match annotation.args.as_deref() {
            Some([arg]) if arg.name.is_none() => match &arg.value {
                ast::Value::Path(path) => Some((path.clone(), arg.span)),
                _ => None,
            },
            _ => None,
        };
        let Some((path, span)) = path else {
            self.report(
                Diagnostic::error(
                    ErrorCode::AnnotationArguments,
                    annotation.span,
                    "`@correlate` takes one path through the parameters",
                )
                .with_label("invalid arguments")
                .with_help("write e.g. `@correlate(employee.id)`"),
            );
            return;
        };
        if let Err(diagnostic) = scope.resolve_correlate(self, method, &path, span) {
            self.report(*diagnostic);
        }
    }

    /// Rule 4: a record may not contain itself through required fields alone.
    fn check_required_cycles(&self) {
        let loaded = self.loaded;
        // record (qualified) -> required record-typed fields (target, field span).
        let mut edges: RequiredEdges = BTreeMap::new();
        let mut record_spans: BTreeMap<String, Span> = BTreeMap::new();
        for (file_id, file) in loaded.files.iter() {
            let scope = Scope::new(self, *file_id, file);
            for item in &file.items {
                let ast::Item::Record(record) = item else {
                    continue;
                };
                let qualified = format!("{}.{}", file.package.name.text, record.name.text);
                record_spans.insert(qualified.clone(), record.name.span);
                let list = edges.entry(qualified).or_default();
                for field in &record.fields {
                    if field.ty.optional {
                        continue;
                    }
                    if let ast::TypeKind::Named(name) = &field.ty.kind
                        && let Ok(TypeRef::Named(target)) = scope.resolve(name)
                        && scope.kind_of(&target) == Some(DeclKind::Record)
                    {
                        list.push((target, field.name.span));
                    }
                }
            }
        }
        for cycle in required_cycles(&edges) {
            let start = &cycle[0].0;
            let names: Vec<&str> = cycle.iter().map(|(r, _)| r.as_str()).collect();
            let mut diagnostic = Diagnostic::error(
                ErrorCode::RequiredCycle,
                record_spans[start],
                format!("record `{start}` contains itself through required fields"),
            )
            .with_label("this record can never be built")
            .with_note(format!("cycle: {} -> {start}", names.join(" -> ")))
            .with_help("make one field of the cycle optional (`T?`) or a `list<T>`");
            for (_, span) in &cycle {
                diagnostic = diagnostic.with_secondary(*span, "required field in the cycle");
            }
            self.report(diagnostic);
        }
    }

    /// W0002: a deprecated record or enum used by an item that is not
    /// itself deprecated (inside deprecated items the use is expected).
    fn check_deprecated_uses(&self) {
        for (file_id, file) in self.loaded.files.iter() {
            let scope = Scope::new(self, *file_id, file);
            let current = |annotations: &[ast::Annotation]| deprecation(annotations).is_none();
            for item in &file.items {
                match item {
                    ast::Item::Record(record) if current(&record.annotations) => {
                        for field in &record.fields {
                            if current(&field.annotations) {
                                self.warn_deprecated(&scope, &field.ty);
                            }
                        }
                    }
                    ast::Item::Service(service) if current(&service.annotations) => {
                        for method in &service.methods {
                            if !current(&method.annotations) {
                                continue;
                            }
                            for param in &method.params {
                                if current(&param.annotations) {
                                    self.warn_deprecated(&scope, &param.ty);
                                }
                            }
                            if let Some(response) = &method.response {
                                self.warn_deprecated(&scope, response);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn warn_deprecated(&self, scope: &Scope, ty: &ast::TypeExpr) {
        match &ty.kind {
            ast::TypeKind::Named(name) => {
                let Ok(TypeRef::Named(qualified)) = scope.resolve(name) else {
                    return;
                };
                let Some(decl) = qualified
                    .rsplit_once('.')
                    .and_then(|(package, short)| self.types.get(package)?.get(short))
                else {
                    return;
                };
                if let Some(reason) = &decl.deprecated {
                    self.report(
                        Diagnostic::warning(
                            ErrorCode::DeprecatedUse,
                            name.span,
                            format!("`{}` is deprecated: {reason}", name.text),
                        )
                        .with_label("deprecated type used here")
                        .with_help("move to its replacement, or mark this item `@deprecated` too"),
                    );
                }
            }
            ast::TypeKind::List(inner) => self.warn_deprecated(scope, inner),
            ast::TypeKind::Map(_, value) => self.warn_deprecated(scope, value),
        }
    }

    fn build_model(&self) -> Model {
        let loaded = self.loaded;
        let mut packages: BTreeMap<String, PackageContract> = BTreeMap::new();
        // All declared types, resolved, by qualified name.
        let mut all_types: BTreeMap<String, TypeDef> = BTreeMap::new();
        for (file_id, file) in loaded.files.iter() {
            let scope = Scope::new(self, *file_id, file);
            let package = &file.package.name.text;
            let entry = packages
                .entry(package.clone())
                .or_insert_with(|| PackageContract {
                    package: package.clone(),
                    docs: Vec::new(),
                    types: Vec::new(),
                    services: Vec::new(),
                });
            entry.docs.extend(file.package.docs.iter().cloned());
            for item in &file.items {
                let (name, def) = match item {
                    ast::Item::Record(record) => (
                        &record.name,
                        TypeDef::Record {
                            docs: record.docs.clone(),
                            deprecated: deprecation(&record.annotations),
                            fields: record.fields.iter().map(|f| scope.model_field(f)).collect(),
                        },
                    ),
                    ast::Item::Enum(enumeration) => (
                        &enumeration.name,
                        TypeDef::Enum {
                            docs: enumeration.docs.clone(),
                            deprecated: deprecation(&enumeration.annotations),
                            variants: enumeration
                                .variants
                                .iter()
                                .map(|v| manifest::Variant {
                                    name: v.name.text.clone(),
                                    docs: v.docs.clone(),
                                    deprecated: deprecation(&v.annotations),
                                })
                                .collect(),
                        },
                    ),
                    _ => continue,
                };
                let qualified = format!("{package}.{}", name.text);
                all_types.insert(qualified.clone(), def.clone());
                entry.types.push((qualified, def));
            }
        }
        for (file_id, file) in loaded.files.iter() {
            let scope = Scope::new(self, *file_id, file);
            let package = &file.package.name.text;
            for item in &file.items {
                let ast::Item::Service(service) = item else {
                    continue;
                };
                let methods: Vec<manifest::Method> = service
                    .methods
                    .iter()
                    .map(|m| scope.model_method(m))
                    .collect();
                let manifest = Manifest {
                    format: manifest::FORMAT_VERSION,
                    interface: format!("{package}.{}", service.name.text),
                    package: package.clone(),
                    service: service.name.text.clone(),
                    version: service.version.unwrap_or(1),
                    fingerprint: String::new(),
                    docs: service.docs.clone(),
                    deprecated: deprecation(&service.annotations),
                    types: type_closure(&methods, &all_types),
                    methods,
                }
                .with_fingerprint();
                if let Some(entry) = packages.get_mut(package) {
                    entry.services.push(manifest);
                }
            }
        }
        Model {
            packages: packages.into_values().collect(),
        }
    }
}

/// Required-field edges: record -> (record a required field holds, that field's span).
type RequiredEdges = BTreeMap<String, Vec<(String, Span)>>;

/// One cycle of required record fields per strongly connected group of
/// records, starting at the group's first record by name: each step is the
/// record and the span of its field that leads to the next. Iterative, so a
/// long chain of records cannot overflow the stack, and linear in the graph.
fn required_cycles(edges: &RequiredEdges) -> Vec<Vec<(String, Span)>> {
    strongly_connected(edges)
        .into_iter()
        .filter_map(|mut component| {
            component.sort_unstable();
            let start = *component.first()?;
            shortest_cycle(edges, start, &component)
        })
        .collect()
}

/// Strongly connected components (Tarjan), iteratively.
fn strongly_connected(edges: &RequiredEdges) -> Vec<Vec<&str>> {
    const UNVISITED: usize = usize::MAX;
    let nodes: Vec<&str> = edges.keys().map(String::as_str).collect();
    let index_of: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let successors: Vec<Vec<usize>> = nodes
        .iter()
        .map(|node| {
            edges[*node]
                .iter()
                .filter_map(|(target, _)| index_of.get(target.as_str()).copied())
                .collect()
        })
        .collect();
    let mut index = vec![UNVISITED; nodes.len()];
    let mut lowlink = vec![0; nodes.len()];
    let mut on_stack = vec![false; nodes.len()];
    let mut stack = Vec::new();
    let mut next_index = 0;
    let mut components = Vec::new();
    for root in 0..nodes.len() {
        if index[root] != UNVISITED {
            continue;
        }
        index[root] = next_index;
        lowlink[root] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root] = true;
        // (node, position of the next successor to look at)
        let mut work = vec![(root, 0usize)];
        while let Some((node, position)) = work.last().copied() {
            if let Some(&next) = successors[node].get(position) {
                if let Some(top) = work.last_mut() {
                    top.1 += 1;
                }
                if index[next] == UNVISITED {
                    index[next] = next_index;
                    lowlink[next] = next_index;
                    next_index += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    work.push((next, 0));
                } else if on_stack[next] {
                    lowlink[node] = lowlink[node].min(index[next]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                lowlink[parent] = lowlink[parent].min(lowlink[node]);
            }
            if lowlink[node] == index[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(nodes[member]);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// The shortest path of required fields from `start` back to itself within
/// `component` (breadth first); `None` for a lone record without a self-edge.
fn shortest_cycle(
    edges: &RequiredEdges,
    start: &str,
    component: &[&str],
) -> Option<Vec<(String, Span)>> {
    // record -> (record before it on the path, the field leading here)
    let mut previous: BTreeMap<&str, (&str, Span)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for (target, span) in edges.get(node).map(Vec::as_slice).unwrap_or_default() {
            let target = target.as_str();
            if target == start {
                let mut path = vec![(node.to_owned(), *span)];
                let mut at = node;
                while at != start {
                    let (before, field) = previous[at];
                    path.push((before.to_owned(), field));
                    at = before;
                }
                path.reverse();
                return Some(path);
            }
            if component.binary_search(&target).is_ok() && !previous.contains_key(target) {
                previous.insert(target, (node, *span));
                queue.push_back(target);
            }
        }
    }
    None
}

/// Every record and enum reachable from the methods' parameters and responses.
fn type_closure(
    methods: &[manifest::Method],
    all: &BTreeMap<String, TypeDef>,
) -> BTreeMap<String, TypeDef> {
    let mut pending: Vec<String> = methods
        .iter()
        .flat_map(|m| m.params.iter().map(|p| &p.ty).chain(m.response.iter()))
        .flat_map(|t| t.named().into_iter().map(str::to_owned))
        .collect();
    let mut closure = BTreeMap::new();
    while let Some(name) = pending.pop() {
        if closure.contains_key(&name) {
            continue;
        }
        let Some(def) = all.get(&name) else { continue };
        if let TypeDef::Record { fields, .. } = def {
            pending.extend(
                fields
                    .iter()
                    .flat_map(|f| f.ty.named().into_iter().map(str::to_owned)),
            );
        }
        closure.insert(name, def.clone());
    }
    closure
}

fn deprecation(annotations: &[ast::Annotation]) -> Option<String> {
    let annotation = annotations.iter().find(|a| a.name.text == "deprecated")?;
    match annotation.args.as_deref() {
        Some(
            [
                ast::AnnotationArg {
                    value: ast::Value::String(why),
                    ..
                },
            ],
        ) => Some(why.clone()),
        _ => Some("deprecated".to_owned()),
    }
}

/// What other languages' type names are called here (`int`, `float`, `DateTime`).
fn scalar_hint(name: &str) -> Option<&'static str> {
    Some(match name.to_lowercase().as_str() {
        "int" | "integer" | "long" | "short" | "i8" | "i16" | "i128" | "isize" | "u8" | "u16"
        | "u128" | "usize" | "int32" | "int64" | "uint32" | "uint64" => {
            "the integer types are `i32`, `i64`, `u32` and `u64`"
        }
        "float" | "double" | "f32" | "number" | "real" => "the floating-point type is `f64`",
        "boolean" => "the boolean type is `bool`",
        "str" | "text" | "char" => "the text type is `string`",
        "datetime" | "instant" | "time" | "offsetdatetime" | "systemtime" => {
            "a point in time is a `timestamp` (RFC 3339, UTC); a calendar day is a `date`"
        }
        "byte" | "blob" | "binary" => "binary data is `bytes` (base64 in JSON)",
        "guid" => "the identifier type is `uuid`",
        "bigdecimal" | "money" | "numeric" => "an exact number is a `decimal`",
        "value" | "any" | "object" | "dynamic" => "any JSON value is `json`",
        _ => return None,
    })
}

/// `"1h30m"`-style durations in milliseconds (units d, h, m, s, ms).
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let value: u64 = rest.get(..digits).filter(|d| !d.is_empty())?.parse().ok()?;
        rest = &rest[digits..];
        let (unit, length) = [
            ("ms", 1u64),
            ("s", 1_000),
            ("m", 60_000),
            ("h", 3_600_000),
            ("d", 86_400_000),
        ]
        .into_iter()
        .find(|(suffix, _)| rest.starts_with(suffix))
        .map(|(suffix, unit)| (unit, suffix.len()))?;
        rest = &rest[length..];
        total = total.checked_add(value.checked_mul(unit)?)?;
    }
    Some(total)
}

/// The path of file `to` relative to the folder of file `from`, with `/`
/// separators, as an `import` in `from` would spell it.
fn relative_path(from: &std::path::Path, to: &std::path::Path) -> String {
    let from: Vec<_> = from
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_owned(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// Whether a file sees a type.
enum Lookup<'a> {
    Visible,
    /// Declared in a loaded file that this file does not import.
    NotImported(&'a Decl),
    Missing,
}

/// Name resolution as seen from one file: types of its own file and of the
/// files it imports directly (its own package unqualified, other packages by
/// last segment or full name). The result does not depend on which other
/// files happen to be loaded in the same run.
struct Scope<'a> {
    package: String,
    /// qualifier (last segment or full package name) -> package.
    qualifiers: BTreeMap<String, String>,
    /// Last segments shared by two imported packages: usable only in full.
    ambiguous: BTreeMap<String, Vec<String>>,
    /// Some import of this file did not load (missing, cycle, syntax error).
    has_failed_imports: bool,
    /// The files whose types this file sees: itself and its direct imports.
    visible_files: BTreeSet<FileId>,
    loaded: &'a load::Loaded,
    types: &'a BTreeMap<String, BTreeMap<String, Decl>>,
    file: &'a ast::File,
}

impl<'a> Scope<'a> {
    fn new(checker: &'a Checker<'_>, id: FileId, file: &'a ast::File) -> Self {
        let mut qualifiers: BTreeMap<String, String> = BTreeMap::new();
        let mut ambiguous: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let own = file.package.name.text.clone();
        let imported = checker
            .loaded
            .imports
            .get(&id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let import_count = file
            .items
            .iter()
            .filter(|item| matches!(item, ast::Item::Import(_)))
            .count();
        let mut loaded_imports = 0;
        let mut visible_files: BTreeSet<FileId> = imported.iter().copied().collect();
        visible_files.insert(id);
        for imported in imported {
            if let Some(other) = checker.loaded.files.get(imported) {
                loaded_imports += 1;
                let package = other.package.name.text.clone();
                let last = package.rsplit('.').next().unwrap_or(&package).to_owned();
                if last != package && last != own {
                    match qualifiers.get(&last) {
                        Some(existing) if *existing != package => {
                            ambiguous
                                .entry(last.clone())
                                .or_insert_with(|| vec![existing.clone()])
                                .push(package.clone());
                        }
                        _ => {
                            qualifiers.insert(last, package.clone());
                        }
                    }
                }
                qualifiers.insert(package.clone(), package);
            }
        }
        for short in ambiguous.keys() {
            qualifiers.remove(short);
        }
        qualifiers.insert(own.clone(), own.clone());
        Self {
            package: own,
            qualifiers,
            ambiguous,
            has_failed_imports: loaded_imports < import_count,
            visible_files,
            loaded: checker.loaded,
            types: &checker.types,
            file,
        }
    }

    /// A declared type, if this file sees it.
    fn lookup(&self, package: &str, name: &str) -> Lookup<'a> {
        match self.types.get(package).and_then(|t| t.get(name)) {
            Some(decl) if self.visible_files.contains(&decl.file) => Lookup::Visible,
            Some(decl) => Lookup::NotImported(decl),
            None => Lookup::Missing,
        }
    }

    /// E0013: the type exists, in a file this file does not import.
    fn not_imported(&self, name: &ast::Ident, decl: &Decl) -> Box<Diagnostic> {
        let sources = &self.loaded.sources;
        let import = relative_path(sources.path(name.span.file), sources.path(decl.file));
        Box::new(
            Diagnostic::error(
                ErrorCode::NotImported,
                name.span,
                format!(
                    "`{}` is declared in `{import}`, which this file does not import",
                    name.text
                ),
            )
            .with_label("not imported here")
            .with_help(format!("add `import \"{import}\";`")),
        )
    }

    fn kind_of(&self, qualified: &str) -> Option<DeclKind> {
        let (package, name) = qualified.rsplit_once('.')?;
        self.types.get(package)?.get(name).map(|d| d.kind)
    }

    fn resolve(&self, name: &ast::Ident) -> Result<TypeRef, Box<Diagnostic>> {
        let text = name.text.as_str();
        if let Some(scalar) = Scalar::from_keyword(text) {
            return Ok(TypeRef::Scalar(scalar));
        }
        match text.rsplit_once('.') {
            None => {
                match self.lookup(&self.package, text) {
                    Lookup::Visible => {
                        return Ok(TypeRef::Named(format!("{}.{text}", self.package)));
                    }
                    Lookup::NotImported(decl) => return Err(self.not_imported(name, decl)),
                    Lookup::Missing => {}
                }
                let mut candidates: Vec<String> = SCALARS.iter().map(|s| s.to_string()).collect();
                if let Some(local) = self.types.get(&self.package) {
                    candidates.extend(local.keys().cloned());
                }
                for (qualifier, package) in &self.qualifiers {
                    if qualifier.contains('.') || *package == self.package {
                        continue;
                    }
                    if let Some(types) = self.types.get(package) {
                        candidates.extend(types.keys().map(|t| format!("{qualifier}.{t}")));
                    }
                }
                let mut diagnostic = Diagnostic::error(
                    ErrorCode::UnknownType,
                    name.span,
                    format!("unknown type `{text}`"),
                )
                .with_label("not a scalar, nor a type of this package");
                if let Some(close) = suggest(text, candidates.iter().map(String::as_str)) {
                    diagnostic = diagnostic.with_help(format!("did you mean `{close}`?"));
                } else if let Some(hint) = scalar_hint(text) {
                    diagnostic = diagnostic.with_help(hint);
                } else if self.types.values().any(|t| t.contains_key(text)) {
                    diagnostic = diagnostic.with_help("a type of another package is written qualified: `package.Name`, after importing its file");
                }
                Err(Box::new(diagnostic))
            }
            Some((qualifier, type_name)) => {
                if let Some(packages) = self.ambiguous.get(qualifier) {
                    let full: Vec<String> = packages
                        .iter()
                        .map(|p| format!("`{p}.{type_name}`"))
                        .collect();
                    return Err(Box::new(
                        Diagnostic::error(
                            ErrorCode::AmbiguousPackage,
                            name.span,
                            format!("`{qualifier}` could mean more than one imported package"),
                        )
                        .with_label("ambiguous qualifier")
                        .with_help(format!(
                            "write the full package name: {}",
                            full.join(" or ")
                        )),
                    ));
                }
                let Some(package) = self.qualifiers.get(qualifier) else {
                    let mut diagnostic = Diagnostic::error(
                        ErrorCode::UnknownPackage,
                        name.span,
                        format!("unknown package `{qualifier}`"),
                    )
                    .with_label("no imported package is called this");
                    let known: Vec<&str> = self.qualifiers.keys().map(String::as_str).collect();
                    diagnostic = match suggest(qualifier, known) {
                        Some(close) => diagnostic.with_help(format!("did you mean `{close}.{type_name}`?")),
                        None => diagnostic.with_help("import the file that declares the package: `import \"path/to/file.rfidl\";`"),
                    };
                    return Err(Box::new(diagnostic));
                };
                match self.lookup(package, type_name) {
                    Lookup::Visible => {
                        return Ok(TypeRef::Named(format!("{package}.{type_name}")));
                    }
                    Lookup::NotImported(decl) => return Err(self.not_imported(name, decl)),
                    Lookup::Missing => {}
                }
                let mut diagnostic = Diagnostic::error(
                    ErrorCode::UnknownPackage,
                    name.span,
                    format!("package `{package}` has no type `{type_name}`"),
                )
                .with_label("not declared in that package");
                let candidates: Vec<&str> = self
                    .types
                    .get(package)
                    .map(|t| t.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                if let Some(close) = suggest(type_name, candidates) {
                    diagnostic =
                        diagnostic.with_help(format!("did you mean `{qualifier}.{close}`?"));
                }
                Err(Box::new(diagnostic))
            }
        }
    }

    /// The resolved type, or `None` when a name in it does not resolve (an
    /// error already reported by `check_type`).
    fn try_resolve_type(&self, ty: &ast::TypeExpr) -> Option<TypeRef> {
        let inner = match &ty.kind {
            ast::TypeKind::Named(name) => self.resolve(name).ok()?,
            ast::TypeKind::List(inner) => TypeRef::List(Box::new(self.try_resolve_type(inner)?)),
            ast::TypeKind::Map(_, value) => TypeRef::Map(Box::new(self.try_resolve_type(value)?)),
        };
        Some(if ty.optional {
            TypeRef::Optional(Box::new(inner))
        } else {
            inner
        })
    }

    fn resolve_type(&self, ty: &ast::TypeExpr) -> TypeRef {
        let inner = match &ty.kind {
            ast::TypeKind::Named(name) => {
                self.resolve(name).unwrap_or(TypeRef::Scalar(Scalar::Json))
            }
            ast::TypeKind::List(inner) => TypeRef::List(Box::new(self.resolve_type(inner))),
            ast::TypeKind::Map(_, value) => TypeRef::Map(Box::new(self.resolve_type(value))),
        };
        if ty.optional {
            TypeRef::Optional(Box::new(inner))
        } else {
            inner
        }
    }

    fn model_field(&self, field: &ast::Field) -> manifest::Field {
        manifest::Field {
            name: field.name.text.clone(),
            ty: self.resolve_type(&field.ty),
            docs: field.docs.clone(),
            deprecated: deprecation(&field.annotations),
        }
    }

    fn model_method(&self, method: &ast::Method) -> manifest::Method {
        let correlate = method
            .annotations
            .iter()
            .find(|a| a.name.text == "correlate")
            .and_then(|a| match a.args.as_deref() {
                Some(
                    [
                        ast::AnnotationArg {
                            value: ast::Value::Path(path),
                            ..
                        },
                    ],
                ) => Some(path.split('.').map(str::to_owned).collect()),
                _ => None,
            });
        let delivery = method
            .annotations
            .iter()
            .find(|a| a.name.text == "delivery")
            .map(|a| {
                let mut delivery = Delivery {
                    max_retries: None,
                    ttl_ms: None,
                };
                for arg in a.args.as_deref().unwrap_or_default() {
                    match (arg.name.as_ref().map(|n| n.text.as_str()), &arg.value) {
                        (Some("max_retries"), ast::Value::Integer(n)) => {
                            delivery.max_retries = n.parse().ok()
                        }
                        (Some("ttl"), ast::Value::String(text)) => {
                            delivery.ttl_ms = parse_duration_ms(text)
                        }
                        _ => {}
                    }
                }
                delivery
            });
        manifest::Method {
            name: method.name.text.clone(),
            kind: match method.kind {
                ast::MethodKind::Signal => MethodKind::Signal,
                ast::MethodKind::Pushcall => MethodKind::Pushcall,
                ast::MethodKind::Command => MethodKind::Command,
            },
            docs: method.docs.clone(),
            deprecated: deprecation(&method.annotations),
            params: method.params.iter().map(|p| self.model_field(p)).collect(),
            response: method.response.as_ref().map(|r| self.resolve_type(r)),
            correlate,
            delivery,
        }
    }

    /// Rule 8: the `@correlate` path walks parameters, then record fields,
    /// and ends on a scalar.
    fn resolve_correlate(
        &self,
        checker: &Checker<'_>,
        method: &ast::Method,
        path: &str,
        span: Span,
    ) -> Result<(), Box<Diagnostic>> {
        let segments: Vec<&str> = path.split('.').collect();
        let mut candidates: Vec<(String, Option<TypeRef>)> = method
            .params
            .iter()
            .map(|p| (p.name.text.clone(), self.try_resolve_type(&p.ty)))
            .collect();
        let mut walked = String::new();
        for (index, segment) in segments.iter().enumerate() {
            let Some((_, ty)) = candidates.iter().find(|(name, _)| name == segment) else {
                let place = if index == 0 {
                    "no parameter".to_owned()
                } else {
                    format!("`{walked}` has no field")
                };
                let mut diagnostic = Diagnostic::error(
                    ErrorCode::CorrelatePath,
                    span,
                    format!("`@correlate({path})`: {place} `{segment}`"),
                )
                .with_label("does not resolve");
                if let Some(close) = suggest(segment, candidates.iter().map(|(n, _)| n.as_str())) {
                    diagnostic = diagnostic.with_help(format!("did you mean `{close}`?"));
                }
                return Err(Box::new(diagnostic));
            };
            let Some(ty) = ty else {
                // The type did not resolve: that error is reported already.
                return Ok(());
            };
            if !walked.is_empty() {
                walked.push('.');
            }
            walked.push_str(segment);
            let mut ty = ty.clone();
            if let TypeRef::Optional(inner) = ty {
                ty = *inner;
            }
            let last = index + 1 == segments.len();
            match (&ty, last) {
                (TypeRef::Scalar(_), true) => return Ok(()),
                (TypeRef::Named(name), false) => {
                    candidates = record_fields(checker, self, name);
                    if candidates.is_empty() {
                        break;
                    }
                }
                _ => break,
            }
        }
        Err(Box::new(
            Diagnostic::error(
                ErrorCode::CorrelatePath,
                span,
                format!("`@correlate({path})` must end on a scalar field, `{walked}` is not one"),
            )
            .with_label("not a scalar")
            .with_help("point at an id: e.g. `@correlate(order.id)`; lists, maps, records and enums cannot be keys"),
        ))
    }
}

/// The fields (name, resolved type) of a record, for walking `@correlate` paths.
fn record_fields(
    checker: &Checker<'_>,
    scope: &Scope,
    qualified: &str,
) -> Vec<(String, Option<TypeRef>)> {
    let Some((package, name)) = qualified.rsplit_once('.') else {
        return Vec::new();
    };
    let Some(decl) = scope.types.get(package).and_then(|t| t.get(name)) else {
        return Vec::new();
    };
    if decl.kind != DeclKind::Record {
        return Vec::new();
    }
    let Some(file) = checker.loaded.files.get(&decl.file) else {
        return Vec::new();
    };
    let owner = Scope::new(checker, decl.file, file);
    let _ = scope.file;
    file.items
        .iter()
        .find_map(|item| match item {
            ast::Item::Record(r) if r.name.text == name => Some(r),
            _ => None,
        })
        .map(|record| {
            record
                .fields
                .iter()
                .map(|f| (f.name.text.clone(), owner.try_resolve_type(&f.ty)))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_combine_units() {
        assert_eq!(parse_duration_ms("48h"), Some(48 * 3_600_000));
        assert_eq!(parse_duration_ms("1h30m"), Some(90 * 60_000));
        assert_eq!(parse_duration_ms("1d2h3m4s5ms"), Some(93_784_005));
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        for bad in ["", "h", "10", "1x", "1.5h", "-1h", "99999999999999999999d"] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
    }

    fn span(start: usize) -> Span {
        Span::new(FileId::default(), start, start + 1)
    }

    #[test]
    fn required_cycles_are_found_once_per_group_without_deep_recursion() {
        // A chain of 50,000 records closing on itself: one cycle, and no
        // stack overflow (the search is iterative).
        let count = 50_000;
        let name = |i: usize| format!("p.R{i:06}");
        let mut edges: RequiredEdges = (0..count)
            .map(|i| (name(i), vec![(name((i + 1) % count), span(i))]))
            .collect();
        let cycles = required_cycles(&edges);
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].len(), count);
        assert_eq!(cycles[0][0].0, name(0));
        // Open the chain: no cycle at all.
        edges.insert(name(count - 1), Vec::new());
        assert!(required_cycles(&edges).is_empty());
    }

    #[test]
    fn required_cycles_report_the_shortest_loop_and_self_references() {
        let edges: RequiredEdges = [
            ("p.A", vec![("p.B", span(1)), ("p.C", span(2))]),
            ("p.B", vec![("p.C", span(3))]),
            ("p.C", vec![("p.A", span(4))]),
            ("p.Selfish", vec![("p.Selfish", span(5))]),
            ("p.Leaf", vec![]),
        ]
        .into_iter()
        .map(|(from, to)| {
            (
                from.to_owned(),
                to.into_iter().map(|(t, s)| (t.to_owned(), s)).collect(),
            )
        })
        .collect();
        let mut cycles = required_cycles(&edges);
        cycles.sort();
        let names: Vec<Vec<&str>> = cycles
            .iter()
            .map(|c| c.iter().map(|(r, _)| r.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["p.A", "p.C"], vec!["p.Selfish"]]);
    }
}
