//! The annotation rules: which annotations exist, where each may sit, and
//! their arguments (`@deprecated`, `@delivery`, `@correlate`): E0070-E0074.

use std::collections::{BTreeMap, BTreeSet};

use super::scope::Scope;
use super::{ANNOTATIONS, Checker, DELIVERY_ARGS, Target, parse_duration_ms};
use crate::diagnostics::{Diagnostic, ErrorCode, Span, suggest};
use crate::syntax::ast;

impl Checker<'_> {
    pub(super) fn check_annotations(
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

    pub(super) fn check_deprecated_args(&self, annotation: &ast::Annotation) {
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

    pub(super) fn check_delivery_args(&self, annotation: &ast::Annotation) {
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

    pub(super) fn check_correlate(
        &self,
        scope: &Scope,
        method: &ast::Method,
        annotation: &ast::Annotation,
    ) {
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
}
