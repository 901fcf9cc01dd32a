//! Names in generated code: two different contract names that become the
//! same Rust name (E0014, and E0026 for methods), and contract names that
//! would take a name the generated code uses for itself (E0015).
//!
//! Every Rust name here comes from [`crate::names`], the functions
//! the generator names things with, so a contract passes these rules exactly
//! when its generated names are distinct.

use std::collections::BTreeMap;

use super::{Checker, Target};
use crate::diagnostics::{Diagnostic, ErrorCode, Span};
use crate::names;
use crate::syntax::ast;

/// One contract name in one Rust namespace.
pub(super) struct Entry {
    /// What the contract declares, for messages: "`self`", "service `EmpService v1`".
    pub(super) contract: String,
    /// Identity of the contract name: two entries with the same identity are
    /// one name (shared package prefixes) or a duplicate other rules report.
    pub(super) identity: String,
    /// What the Rust name is: "field", "module", "type".
    pub(super) rust_kind: &'static str,
    /// The Rust name, as a path where that helps (`hr::employees::emp_service_v1`).
    pub(super) rust: String,
    pub(super) span: Span,
}

/// Collects entries of one namespace and reports each whose Rust name an
/// entry with another identity already has.
#[derive(Default)]
pub(super) struct Namespace {
    taken: BTreeMap<String, Entry>,
}

impl Namespace {
    pub(super) fn add(&mut self, checker: &Checker<'_>, entry: Entry) {
        let Some(first) = self.taken.get(&entry.rust) else {
            self.taken.insert(entry.rust.clone(), entry);
            return;
        };
        if first.identity == entry.identity {
            return;
        }
        let rust_kind = if first.rust_kind == entry.rust_kind {
            entry.rust_kind
        } else {
            "name"
        };
        let rust = &entry.rust;
        checker.report(
            Diagnostic::error(
                ErrorCode::GeneratedNameCollision,
                entry.span,
                format!(
                    "{} and {} both become the Rust {rust_kind} `{rust}`",
                    entry.contract, first.contract
                ),
            )
            .with_label(format!("becomes `{rust}`"))
            .with_secondary(first.span, format!("also becomes `{rust}`"))
            .with_help("rename one of them: generated code cannot hold both"),
        );
    }
}

impl Checker<'_> {
    /// E0014 for the fields of one record or the parameters of one method,
    /// E0015 for parameters named like the generated functions' own arguments.
    pub(super) fn check_field_names(&self, fields: &[ast::Field], target: Target) {
        let rust_kind = match target {
            Target::Param => "parameter",
            _ => "field",
        };
        let mut namespace = Namespace::default();
        for field in fields {
            let rust = names::field_name(&field.name.text);
            if target == Target::Param && names::CALL_ARGUMENTS.contains(&rust.as_str()) {
                self.report(
                    Diagnostic::error(
                        ErrorCode::ReservedGeneratedName,
                        field.name.span,
                        format!(
                            "parameter `{}` would clash with the argument `{rust}` that every generated client or handler function takes",
                            field.name.text
                        ),
                    )
                    .with_label("taken by generated code")
                    .with_help(
                        "rename the parameter; generated functions take `call` and `tx` \
                         (`conn` in the async API) before the parameters",
                    ),
                );
            }
            namespace.add(
                self,
                Entry {
                    contract: format!("`{}`", field.name.text),
                    identity: field.name.text.clone(),
                    rust_kind,
                    rust,
                    span: field.name.span,
                },
            );
        }
    }

    /// E0014 for the variants of one enum.
    pub(super) fn check_variant_names(&self, enumeration: &ast::Enum) {
        let mut namespace = Namespace::default();
        for variant in &enumeration.variants {
            namespace.add(
                self,
                Entry {
                    contract: format!("`{}`", variant.name.text),
                    identity: variant.name.text.clone(),
                    rust_kind: "variant",
                    rust: names::variant_name(&variant.name.text),
                    span: variant.name.span,
                },
            );
        }
    }

    /// E0026 for methods of one service version whose functions or request
    /// structs would share a name, E0015 for a method named like a function
    /// or type the generated module defines itself.
    pub(super) fn check_method_names(&self, service: &ast::Service) {
        let mut functions: BTreeMap<String, (&str, Span)> = BTreeMap::new();
        let mut requests: BTreeMap<String, (&str, Span)> = BTreeMap::new();
        for method in &service.methods {
            let name = method.name.text.as_str();
            let span = method.name.span;
            let function = names::method_fn_name(name);
            let request = names::request_struct_name(name);
            if names::CLIENT_FUNCTIONS.contains(&function.as_str()) {
                self.report(
                    Diagnostic::error(
                        ErrorCode::ReservedGeneratedName,
                        span,
                        format!(
                            "method `{name}` would become the function `{function}`, which the generated client already defines"
                        ),
                    )
                    .with_label(format!("becomes `{function}`"))
                    .with_help(if function.starts_with("deliver_") {
                        format!(
                            "rename the method; `{function}` makes the client's durable-timer view"
                        )
                    } else {
                        format!("rename the method; `{function}` is the client's constructor")
                    }),
                );
            }
            if names::SERVICE_MODULE_TYPES.contains(&request.as_str()) {
                self.report(
                    Diagnostic::error(
                        ErrorCode::ReservedGeneratedName,
                        span,
                        format!(
                            "method `{name}` would get the request struct `{request}`, a name the generated module already uses"
                        ),
                    )
                    .with_label(format!("its request struct would be `{request}`"))
                    .with_help("rename the method"),
                );
            }
            let clash = match (functions.get(&function), requests.get(&request)) {
                (Some(&(other, _)), _) | (_, Some(&(other, _))) if other == name => continue,
                (Some(&(other, first)), _) => Some((other, first, function.clone())),
                (None, Some(&(other, first))) => Some((other, first, request.clone())),
                (None, None) => None,
            };
            match clash {
                Some((other, first, rust_name)) => self.report(
                    Diagnostic::error(
                        ErrorCode::MethodRustNameClash,
                        span,
                        format!(
                            "methods `{other}` and `{name}` would both be `{rust_name}` in Rust"
                        ),
                    )
                    .with_label(format!("becomes `{rust_name}`"))
                    .with_secondary(first, format!("also becomes `{rust_name}`"))
                    .with_help("rename one of them so the names differ by more than case"),
                ),
                None => {
                    functions.insert(function, (name, span));
                    requests.insert(request, (name, span));
                }
            }
        }
    }

    /// E0014 across the module tree: package modules, the service-version
    /// modules and the types inside each package module, over every file of
    /// the run; E0015 for types named like what generated code imports or
    /// names from the prelude.
    pub(super) fn check_module_names(&self) {
        // Module path (Rust) -> the names declared directly in it.
        let mut modules: BTreeMap<Vec<String>, Namespace> = BTreeMap::new();
        for file in self.loaded.files.values() {
            let package = &file.package.name;
            let segments: Vec<&str> = package.text.split('.').collect();
            let path: Vec<String> = segments.iter().map(|s| names::package_module(s)).collect();
            let mut offset = package.span.start;
            for (index, segment) in segments.iter().enumerate() {
                let span = Span::new(package.span.file, offset, offset + segment.len());
                offset += segment.len() + 1;
                let prefix = segments[..=index].join(".");
                modules.entry(path[..index].to_vec()).or_default().add(
                    self,
                    Entry {
                        contract: format!("package `{prefix}`"),
                        identity: format!("package {prefix}"),
                        rust_kind: "module",
                        rust: path[..=index].join("::"),
                        span,
                    },
                );
            }
            let inside = |name: &str| {
                let mut full = path.clone();
                full.push(name.to_owned());
                full.join("::")
            };
            for item in &file.items {
                let (what, name) = match item {
                    ast::Item::Record(record) => ("record", &record.name),
                    ast::Item::Enum(enumeration) => ("enum", &enumeration.name),
                    ast::Item::Service(service) => {
                        let Some(version) = service.version else {
                            continue;
                        };
                        let contract = format!("service `{} v{version}`", service.name.text);
                        let module = names::service_module(&service.name.text, version);
                        modules.entry(path.clone()).or_default().add(
                            self,
                            Entry {
                                identity: contract.clone(),
                                contract,
                                rust_kind: "module",
                                rust: inside(&module),
                                span: service.name.span,
                            },
                        );
                        continue;
                    }
                    ast::Item::Import(_) => continue,
                };
                let rust = names::type_name(&name.text);
                self.check_reserved_type_name(what, name, &rust);
                modules.entry(path.clone()).or_default().add(
                    self,
                    Entry {
                        contract: format!("{what} `{}`", name.text),
                        identity: format!("type {}", name.text),
                        rust_kind: "type",
                        rust: inside(&rust),
                        span: name.span,
                    },
                );
            }
        }
    }

    fn check_reserved_type_name(&self, what: &str, name: &ast::Ident, rust: &str) {
        let problem = if names::PACKAGE_MODULE_IMPORTS.contains(&rust) {
            format!("each generated package module imports serde's `{rust}`")
        } else if names::PRELUDE_TRAITS_USED.contains(&rust) {
            format!(
                "a type of that name would hide Rust's `{rust}` trait, which the generated service modules use"
            )
        } else {
            return;
        };
        self.report(
            Diagnostic::error(
                ErrorCode::ReservedGeneratedName,
                name.span,
                format!(
                    "the name of {what} `{}` is taken in generated code: {problem}",
                    name.text
                ),
            )
            .with_label("taken by generated code")
            .with_help(format!(
                "rename it; generated code keeps these names for itself: `{}`",
                names::PACKAGE_MODULE_IMPORTS
                    .iter()
                    .chain(names::PRELUDE_TRAITS_USED)
                    .copied()
                    .collect::<Vec<_>>()
                    .join("`, `")
            )),
        );
    }
}
