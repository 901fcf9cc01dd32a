//! Checking: name resolution and every rule of the language, each with its
//! own error code; then the resolved model.
//!
//! All problems of a run are reported, not only the first. The model is
//! built only when no error was found, so later stages never see a contract
//! that breaks a rule.

mod annotations;
mod build;
pub(crate) mod cycles;
pub mod load;
mod names;
mod scope;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::diagnostics::{Diagnostic, ErrorCode, FileId, SourceMap, Span};
use crate::manifest::TypeRef;
use crate::model::Model;
use crate::syntax::ast;
use cycles::{RequiredEdges, required_cycles};
pub use load::LoadError;
use scope::Scope;

/// The result of checking a set of contracts.
///
/// Contract errors are data here, not an `Err`: a run that found broken
/// contracts still returns `Ok(CheckOutcome)`, with the errors in
/// [`diagnostics`](Self::diagnostics) and no [`model`](Self::model).
#[derive(Debug)]
pub struct CheckOutcome {
    /// Every file read (roots and imports), with its text: the
    /// [`Span`]s of the diagnostics point into it, and the renderers
    /// ([`render_human`](crate::diagnostics::render_human), …) need it.
    pub sources: SourceMap,
    /// The resolved contracts; present only when no diagnostic is an error
    /// (warnings do not prevent it).
    pub model: Option<Model>,
    /// Every error and warning of the run, sorted by file (load order) and
    /// byte position; diagnostics without a span come first.
    pub diagnostics: Vec<Diagnostic>,
    /// Every contract file read (roots and imports), canonical paths.
    pub read_paths: Vec<PathBuf>,
}

impl CheckOutcome {
    /// Whether any diagnostic is an error (then [`model`](Self::model) is
    /// `None`); warnings alone return `false`.
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
///
/// A directory stands for every `.rfidl` file below it, recursively; each
/// file's imports are loaded too, relative to the importing file. Every rule
/// of the language is checked and every problem reported (see
/// [`CheckOutcome`]).
///
/// # Errors
///
/// [`LoadError`] only when a root cannot be read at all (missing, not
/// readable, a directory without `.rfidl` files). Problems inside the
/// contracts, a missing import included, are diagnostics in the outcome.
pub fn check_paths(roots: &[PathBuf]) -> Result<CheckOutcome, LoadError> {
    check_paths_with_includes(roots, &[])
}

/// Like [`check_paths`], also searching `include_paths` for imports: an
/// import not found beside the importing file is looked for in each of
/// them, in order (`Builder::include_path` in `rfidl-codegen`).
///
/// # Errors
///
/// As [`check_paths`].
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
    checker.check_module_names();
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
    /// Its index in its file's items.
    item: usize,
    /// `Some` if the type is deprecated: the reason, empty when none is given.
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
            for (index, item) in file.items.iter().enumerate() {
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
                        item: index,
                        deprecated: annotations
                            .iter()
                            .any(|a| a.name.text == "deprecated")
                            .then(|| deprecation_reason(annotations)),
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
            self.refuse_annotations(&file.package.annotations, "the package declaration");
            let scope = Scope::new(self, *file_id, file);
            for item in &file.items {
                match item {
                    ast::Item::Import(import) => {
                        self.refuse_annotations(&import.annotations, "an import");
                    }
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

    /// E0071 for every annotation on a `package` or `import`: they describe
    /// no generated code and no part of an interface.
    fn refuse_annotations(&self, annotations: &[ast::Annotation], target: &str) {
        for annotation in annotations {
            self.report(
                Diagnostic::error(
                    ErrorCode::AnnotationTarget,
                    annotation.span,
                    format!("annotations are not allowed on {target}"),
                )
                .with_label("not allowed here")
                .with_help(format!(
                    "annotations go on records, enums, services and their members: {}",
                    match target {
                        "an import" => "annotate them in the imported file",
                        _ => "to deprecate a package, mark its items `@deprecated`",
                    }
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
        self.check_field_names(fields, target);
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
        self.check_variant_names(enumeration);
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
        self.check_method_names(service);
        let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
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
                            match reason.as_str() {
                                "" => format!("`{}` is deprecated", name.text),
                                reason => format!("`{}` is deprecated: {reason}", name.text),
                            },
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
}

/// The reason given to `@deprecated("…")`, empty when none is given.
fn deprecation_reason(annotations: &[ast::Annotation]) -> String {
    annotations
        .iter()
        .filter(|a| a.name.text == "deprecated")
        .find_map(|a| match a.args.as_deref() {
            Some(
                [
                    ast::AnnotationArg {
                        value: ast::Value::String(why),
                        ..
                    },
                ],
            ) => Some(why.clone()),
            _ => None,
        })
        .unwrap_or_default()
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

/// `"1h30m"`-style durations in milliseconds (units d, h, m, s, ms), or
/// `None` for anything else. The parser is `rfidl_duration::parse_duration`,
/// the one the runtime reads its configuration with.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let duration = rfidl_duration::parse_duration(text).ok()?;
    u64::try_from(duration.as_millis()).ok()
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
}
