//! Name resolution as one file sees it: scalars, the types of its own file
//! and of its direct imports, qualified names of imported packages; and the
//! resolved forms (types, fields, methods, `@correlate` paths) the checker
//! and the model builder need.

use std::collections::{BTreeMap, BTreeSet};

use super::{Checker, Decl, DeclKind, deprecation, load, parse_duration_ms};
use crate::diagnostics::{Diagnostic, ErrorCode, FileId, Span, suggest};
use crate::manifest::{self, Delivery, MethodKind, Scalar, TypeRef};
use crate::syntax::ast;

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
pub(super) struct Scope<'a> {
    package: String,
    /// qualifier (last segment or full package name) -> package.
    qualifiers: BTreeMap<String, String>,
    /// Last segments shared by two imported packages: usable only in full.
    ambiguous: BTreeMap<String, Vec<String>>,
    /// Some import of this file did not load (missing, cycle, syntax error).
    pub(super) has_failed_imports: bool,
    /// The files whose types this file sees: itself and its direct imports.
    visible_files: BTreeSet<FileId>,
    loaded: &'a load::Loaded,
    types: &'a BTreeMap<String, BTreeMap<String, Decl>>,
    file: &'a ast::File,
}

impl<'a> Scope<'a> {
    pub(super) fn new(checker: &'a Checker<'_>, id: FileId, file: &'a ast::File) -> Self {
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

    pub(super) fn kind_of(&self, qualified: &str) -> Option<DeclKind> {
        let (package, name) = qualified.rsplit_once('.')?;
        self.types.get(package)?.get(name).map(|d| d.kind)
    }

    pub(super) fn resolve(&self, name: &ast::Ident) -> Result<TypeRef, Box<Diagnostic>> {
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
                let mut candidates: Vec<String> =
                    Scalar::ALL.iter().map(|s| s.keyword().to_owned()).collect();
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
    pub(super) fn try_resolve_type(&self, ty: &ast::TypeExpr) -> Option<TypeRef> {
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

    pub(super) fn resolve_type(&self, ty: &ast::TypeExpr) -> TypeRef {
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

    pub(super) fn model_field(&self, field: &ast::Field) -> manifest::Field {
        manifest::Field {
            name: field.name.text.clone(),
            ty: self.resolve_type(&field.ty),
            docs: field.docs.clone(),
            deprecated: deprecation(&field.annotations),
        }
    }

    pub(super) fn model_method(&self, method: &ast::Method) -> manifest::Method {
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
    pub(super) fn resolve_correlate(
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
pub(super) fn record_fields(
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
    // The declaration's own item (found by index, not by scanning the file).
    match file.items.get(decl.item) {
        Some(ast::Item::Record(r)) if r.name.text == name => Some(r),
        _ => None,
    }
    .map(|record| {
        record
            .fields
            .iter()
            .map(|f| (f.name.text.clone(), owner.try_resolve_type(&f.ty)))
            .collect()
    })
    .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn import_paths_are_relative_to_the_importing_file() {
        let rel = |from: &str, to: &str| relative_path(Path::new(from), Path::new(to));
        assert_eq!(
            rel("/c/hr.rfidl", "/c/common/money.rfidl"),
            "common/money.rfidl"
        );
        assert_eq!(rel("/c/org/desk.rfidl", "/c/main.rfidl"), "../main.rfidl");
        assert_eq!(rel("/c/a/b/x.rfidl", "/c/d/y.rfidl"), "../../d/y.rfidl");
        assert_eq!(rel("/c/x.rfidl", "/c/y.rfidl"), "y.rfidl");
    }

    #[test]
    fn scalar_hints_cover_common_foreign_names() {
        assert!(scalar_hint("int").is_some_and(|h| h.contains("i64")));
        assert!(scalar_hint("Double").is_some_and(|h| h.contains("f64")));
        assert!(scalar_hint("DateTime").is_some_and(|h| h.contains("timestamp")));
        assert_eq!(scalar_hint("Employee"), None);
    }
}
