//! Decides what the generated code looks like: Rust names, Rust types, which
//! side gets which client or handler, where `Box` breaks a recursive type.
//! Produces the template views; the templates only lay them out.

use std::collections::{BTreeMap, BTreeSet};

use super::options::{Options, TypeRuleKind};
use super::templates::{
    AioMethodView, EnumView, FieldView, GroupView, MethodView, PackageTemplate, RecordView,
    ServiceView, TreeStep, VariantView,
};
use crate::manifest::{Field, Manifest, MethodKind, PackageContract, Scalar, TypeDef, TypeRef};
use crate::names::{
    ENGINE_ANSWER_ROUTER, ENGINE_ANSWERS, ENGINE_CLIENT, ENGINE_FAILURE_ROUTER, ENGINE_FAILURES,
    ENGINE_HANDLER, ENGINE_RECEIVER, SERVICE_ANSWER_ROUTER, SERVICE_ANSWERS, SERVICE_CLIENT,
    SERVICE_FAILURE_ROUTER, SERVICE_FAILURES, SERVICE_HANDLER, SERVICE_RECEIVER, field_name,
    method_fn_name, package_module, request_struct_name, type_name, variant_name,
};

pub use crate::names::{rust_ident, service_module};

/// Where generated code refers to a type from: the package module itself,
/// or a service-version module one level below it.
#[derive(Debug, Clone, Copy)]
struct Scope<'a> {
    package: &'a str,
    nested: usize,
    /// Write `::std::string::String` etc. because the package declares a type
    /// that would shadow the prelude name.
    qualify_std: bool,
}

/// Prelude names generated code uses unqualified unless a contract type takes them.
const PRELUDE_TYPES: &[&str] = &["String", "Option", "Vec", "Box", "Result"];

fn shadows_prelude(contract: &PackageContract) -> bool {
    contract.types.iter().any(|(name, _)| {
        PRELUDE_TYPES
            .iter()
            .any(|p| name.rsplit('.').next() == Some(*p))
    })
}

impl Scope<'_> {
    fn path_to(&self, qualified: &str) -> String {
        let (package, name) = qualified.rsplit_once('.').unwrap_or(("", qualified));
        let name = type_name(name);
        if package == self.package {
            return format!("{}{name}", "super::".repeat(self.nested));
        }
        let ups = self.package.split('.').count() + self.nested;
        let path: Vec<String> = package.split('.').map(package_module).collect();
        format!("{}{}::{name}", "super::".repeat(ups), path.join("::"))
    }

    fn std(&self, short: &'static str, full: &'static str) -> &'static str {
        if self.qualify_std { full } else { short }
    }

    fn rust_type(&self, ty: &TypeRef, boxed: bool) -> String {
        let string = self.std("String", "::std::string::String");
        match ty {
            TypeRef::Scalar(Scalar::String) => string.to_owned(),
            TypeRef::Scalar(scalar) => scalar_type(*scalar).to_owned(),
            TypeRef::Named(name) if boxed => {
                format!(
                    "{}<{}>",
                    self.std("Box", "::std::boxed::Box"),
                    self.path_to(name)
                )
            }
            TypeRef::Named(name) => self.path_to(name),
            TypeRef::List(inner) => {
                format!(
                    "{}<{}>",
                    self.std("Vec", "::std::vec::Vec"),
                    self.rust_type(inner, false)
                )
            }
            TypeRef::Map(inner) => {
                format!(
                    "::std::collections::BTreeMap<{string}, {}>",
                    self.rust_type(inner, false)
                )
            }
            TypeRef::Optional(inner) => format!(
                "{}<{}>",
                self.std("Option", "::std::option::Option"),
                self.rust_type(inner, boxed)
            ),
        }
    }
}

fn scalar_type(scalar: Scalar) -> &'static str {
    match scalar {
        Scalar::Bool => "bool",
        Scalar::I32 => "i32",
        Scalar::I64 => "i64",
        Scalar::U32 => "u32",
        Scalar::U64 => "u64",
        Scalar::F64 => "f64",
        Scalar::String => "String",
        Scalar::Bytes => "::rfidl_runtime::types::Bytes",
        Scalar::Uuid => "::rfidl_runtime::types::Uuid",
        Scalar::Timestamp => "::rfidl_runtime::types::Timestamp",
        Scalar::Date => "::rfidl_runtime::types::Date",
        Scalar::Duration => "::rfidl_runtime::types::Duration",
        Scalar::Decimal => "::rfidl_runtime::types::Decimal",
        Scalar::Json => "::rfidl_runtime::types::Json",
    }
}

/// Record fields that must be boxed: an optional reference to a record that
/// can reach the containing record again without passing a list or map
/// (those already live on the heap). The checker has rejected cycles of
/// required fields alone, so boxing these breaks every infinite-size cycle.
fn boxed_fields(records: &BTreeMap<&str, &[Field]>) -> BTreeSet<(String, String)> {
    let edges = |fields: &[Field]| -> Vec<String> {
        fields
            .iter()
            .filter_map(|f| match &f.ty {
                TypeRef::Named(n) => Some(n.clone()),
                TypeRef::Optional(inner) => match inner.as_ref() {
                    TypeRef::Named(n) => Some(n.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    };
    let reaches = |from: &str, target: &str| -> bool {
        let mut stack = vec![from.to_owned()];
        let mut seen = BTreeSet::new();
        while let Some(node) = stack.pop() {
            if node == target {
                return true;
            }
            if seen.insert(node.clone())
                && let Some(fields) = records.get(node.as_str())
            {
                stack.extend(edges(fields));
            }
        }
        false
    };
    let mut boxed = BTreeSet::new();
    for (record, fields) in records {
        for field in fields.iter() {
            if let TypeRef::Optional(inner) = &field.ty
                && let TypeRef::Named(target) = inner.as_ref()
                && reaches(target, record)
            {
                boxed.insert((record.to_string(), field.name.clone()));
            }
        }
    }
    boxed
}

/// The qualified names of every deprecated type `contracts` declare or their
/// manifests carry.
pub fn deprecated_types(contracts: &[PackageContract]) -> BTreeSet<String> {
    let declared = contracts
        .iter()
        .flat_map(|c| c.types.iter().map(|(name, def)| (name, def)));
    let carried = contracts
        .iter()
        .flat_map(|c| c.services.iter().flat_map(|m| m.types.iter()));
    declared
        .chain(carried)
        .filter(|(_, def)| match def {
            TypeDef::Record { deprecated, .. } | TypeDef::Enum { deprecated, .. } => {
                deprecated.is_some()
            }
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Builds the template view of one package.
pub fn plan_package(contract: &PackageContract, options: &Options) -> PackageTemplate {
    let deprecated = deprecated_types(std::slice::from_ref(contract));
    plan_package_with(contract, options, &deprecated)
}

/// [`plan_package`], knowing which types of other packages are deprecated
/// (generated code that names them must allow it).
pub fn plan_package_with(
    contract: &PackageContract,
    options: &Options,
    deprecated_types: &BTreeSet<String>,
) -> PackageTemplate {
    // Recursion can run through other packages' records: look at all known types.
    let mut all_records: BTreeMap<&str, &[Field]> = BTreeMap::new();
    let declared = contract.types.iter().map(|(n, d)| (n, d));
    for (name, def) in declared.chain(contract.services.iter().flat_map(|m| m.types.iter())) {
        if let TypeDef::Record { fields, .. } = def {
            all_records.insert(name.as_str(), fields.as_slice());
        }
    }
    let boxed = boxed_fields(&all_records);
    let qualify_std = shadows_prelude(contract);
    let scope = Scope {
        package: &contract.package,
        nested: 0,
        qualify_std,
    };
    let mut records = Vec::new();
    let mut enums = Vec::new();
    for (qualified, def) in &contract.types {
        let name = type_name(qualified.rsplit('.').next().unwrap_or(qualified));
        let (extra_derives, extra_attributes) = type_rules(options, qualified);
        match def {
            TypeDef::Record {
                docs,
                deprecated,
                fields,
            } => records.push(RecordView {
                name,
                docs: docs.clone(),
                deprecated: deprecated.clone(),
                uses_deprecated: fields.iter().any(|f| {
                    f.deprecated.is_some()
                        || f.ty.named().iter().any(|n| deprecated_types.contains(*n))
                }),
                extra_derives,
                extra_attributes,
                fields: fields
                    .iter()
                    .map(|f| {
                        field_view(
                            f,
                            scope,
                            boxed.contains(&(qualified.clone(), f.name.clone())),
                        )
                    })
                    .collect(),
            }),
            TypeDef::Enum {
                docs,
                deprecated,
                variants,
            } => enums.push(EnumView {
                name,
                docs: docs.clone(),
                deprecated: deprecated.clone(),
                extra_derives,
                extra_attributes,
                variants: variants
                    .iter()
                    .map(|v| VariantView {
                        name: variant_name(&v.name),
                        docs: v.docs.clone(),
                        deprecated: v.deprecated.clone(),
                    })
                    .collect(),
            }),
        }
    }
    let services = contract
        .services
        .iter()
        .map(|m| service_view(m, options, qualify_std))
        .collect();
    PackageTemplate {
        records,
        enums,
        services,
    }
}

fn type_rules(options: &Options, qualified: &str) -> (Vec<String>, Vec<String>) {
    let mut derives = Vec::new();
    let mut attributes = Vec::new();
    for rule in options.type_rules.iter().filter(|r| r.matches(qualified)) {
        match &rule.kind {
            TypeRuleKind::Derive(d) => derives.extend(
                d.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty()),
            ),
            TypeRuleKind::Attribute(a) => attributes.push(a.clone()),
        }
    }
    (derives, attributes)
}

fn field_view(field: &Field, scope: Scope<'_>, boxed: bool) -> FieldView {
    FieldView {
        rust_name: field_name(&field.name),
        json_name: field.name.clone(),
        docs: field.docs.clone(),
        deprecated: field.deprecated.clone(),
        rust_type: scope.rust_type(&field.ty, boxed),
        optional: matches!(field.ty, TypeRef::Optional(_)),
        is_none: scope.std("Option::is_none", "::std::option::Option::is_none"),
    }
}

/// The module tree over `packages` (sorted, deduplicated dotted names).
pub fn plan_tree(packages: &[&str]) -> Vec<TreeStep> {
    let mut steps = Vec::new();
    let mut open: Vec<&str> = Vec::new();
    let mut sorted: Vec<&str> = packages.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for package in sorted {
        let segments: Vec<&str> = package.split('.').collect();
        let common = open
            .iter()
            .zip(&segments)
            .take_while(|(a, b)| a == b)
            .count();
        for _ in common..open.len() {
            steps.push(TreeStep::Close);
        }
        open.truncate(common);
        for (index, segment) in segments.iter().enumerate().skip(common) {
            let ends_here = index + 1 == segments.len();
            steps.push(TreeStep::Open {
                module: package_module(segment),
                package: ends_here.then(|| package.to_owned()),
            });
            open.push(segment);
        }
        steps.push(TreeStep::Include {
            package: package.to_owned(),
        });
    }
    steps.extend(open.iter().map(|_| TreeStep::Close));
    steps
}

fn service_view(manifest: &Manifest, options: &Options, qualify_std: bool) -> ServiceView {
    let scope = Scope {
        package: &manifest.package,
        nested: 1,
        qualify_std,
    };
    let methods: Vec<MethodView> = manifest
        .methods
        .iter()
        .map(|m| method_view(manifest, m, scope))
        .collect();
    let of_kind = |to_engine: bool| -> Vec<MethodView> {
        manifest
            .methods
            .iter()
            .zip(&methods)
            .filter(|(m, _)| m.kind.to_engine() == to_engine)
            .map(|(_, v)| v.clone())
            .collect()
    };
    let mut groups = Vec::new();
    let to_engine = of_kind(true);
    if !to_engine.is_empty() {
        groups.push(GroupView {
            peer: "engine",
            client: ENGINE_CLIENT,
            handler: ENGINE_HANDLER,
            receiver: ENGINE_RECEIVER,
            hosted_const: "ENGINE_HOSTED",
            kinds_doc: "signals and pushcalls",
            client_enabled: options.sides.service(),
            handler_enabled: options.sides.engine(),
            answers: ENGINE_ANSWERS,
            answer_router: ENGINE_ANSWER_ROUTER,
            failures: ENGINE_FAILURES,
            failure_router: ENGINE_FAILURE_ROUTER,
            answered: to_engine
                .iter()
                .filter(|m| m.has_response)
                .cloned()
                .collect(),
            endpoints_inline: super::layout::endpoints_inline(20, &to_engine),
            receiver_too_many_lines: handle_may_be_long(to_engine.iter().map(|m| m.params.len())),
            answer_router_too_many_lines: handle_may_be_long(
                to_engine.iter().filter(|m| m.has_response).map(|_| 1),
            ),
            failure_router_too_many_lines: handle_may_be_long(to_engine.iter().map(|_| 1)),
            aio_endpoints_inline: super::layout::endpoints_inline(24, &to_engine),
            aio_answer_router_for_inline: super::layout::aio_answer_router_for_inline(
                ENGINE_ANSWER_ROUTER,
            ),
            aio_failure_router_for_inline: super::layout::aio_failure_router_for_inline(
                ENGINE_FAILURE_ROUTER,
            ),
            aio_failures_header_inline: super::layout::aio_failures_header_inline(ENGINE_FAILURES),
            methods: to_engine,
        });
    }
    let to_service = of_kind(false);
    if !to_service.is_empty() {
        groups.push(GroupView {
            peer: "service",
            client: SERVICE_CLIENT,
            handler: SERVICE_HANDLER,
            receiver: SERVICE_RECEIVER,
            hosted_const: "SERVICE_HOSTED",
            kinds_doc: "commands",
            client_enabled: options.sides.engine(),
            handler_enabled: options.sides.service(),
            answers: SERVICE_ANSWERS,
            answer_router: SERVICE_ANSWER_ROUTER,
            failures: SERVICE_FAILURES,
            failure_router: SERVICE_FAILURE_ROUTER,
            answered: to_service
                .iter()
                .filter(|m| m.has_response)
                .cloned()
                .collect(),
            endpoints_inline: super::layout::endpoints_inline(20, &to_service),
            receiver_too_many_lines: handle_may_be_long(to_service.iter().map(|m| m.params.len())),
            answer_router_too_many_lines: handle_may_be_long(
                to_service.iter().filter(|m| m.has_response).map(|_| 1),
            ),
            failure_router_too_many_lines: handle_may_be_long(to_service.iter().map(|_| 1)),
            aio_endpoints_inline: super::layout::endpoints_inline(24, &to_service),
            aio_answer_router_for_inline: super::layout::aio_answer_router_for_inline(
                SERVICE_ANSWER_ROUTER,
            ),
            aio_failure_router_for_inline: super::layout::aio_failure_router_for_inline(
                SERVICE_FAILURE_ROUTER,
            ),
            aio_failures_header_inline: super::layout::aio_failures_header_inline(SERVICE_FAILURES),
            methods: to_service,
        });
    }
    ServiceView {
        module: service_module(&manifest.service, manifest.version),
        interface: manifest.interface.clone(),
        version: manifest.version,
        fingerprint: manifest.fingerprint.clone(),
        manifest_json: manifest.to_canonical_json(),
        docs: manifest.docs.clone(),
        deprecated: manifest.deprecated.clone(),
        endpoints_inline: super::layout::endpoints_inline(8, &methods),
        methods,
        groups,
    }
}

/// clippy's default `too-many-arguments-threshold`: a function with more
/// arguments (`self` included) is linted. Generated functions take one
/// argument per contract parameter, so only those beyond it get an `allow`.
const CLIPPY_MAX_ARGUMENTS: usize = 7;

/// clippy's default `too-many-lines-threshold` (a pedantic lint): a function
/// whose body has more lines is linted.
const CLIPPY_MAX_LINES: usize = 100;

/// A `handle` function with one match arm per method (a receiver's or an
/// answer router's, blocking or async), whose calls take `arguments` each
/// besides `call`/`answer` and `tx`/`conn`, may pass clippy's
/// `too_many_lines`. An upper bound, so that only long ones get an `allow`:
/// an arm takes at most 13 lines and one per argument (its call broken one
/// argument per line), the rest of the body at most 13.
fn handle_may_be_long(arguments: impl Iterator<Item = usize>) -> bool {
    let arms: usize = arguments.map(|count| 13 + count).sum();
    13 + arms > CLIPPY_MAX_LINES
}

fn method_view(
    manifest: &Manifest,
    method: &crate::manifest::Method,
    scope: Scope<'_>,
) -> MethodView {
    let (message_type, kind_doc) = match method.kind {
        MethodKind::Signal => ("Signal", "signal"),
        MethodKind::Pushcall => ("PushCall", "pushcall"),
        MethodKind::Command => ("Command", "command"),
    };
    let fn_name = method_fn_name(&method.name);
    let request = request_struct_name(&method.name);
    let params: Vec<FieldView> = method
        .params
        .iter()
        .map(|p| field_view(p, scope, false))
        .collect();
    let response_type = method
        .response
        .as_ref()
        .map_or_else(|| "()".to_owned(), |t| scope.rust_type(t, false));
    let correlation = correlation_expr(manifest, method);
    let aio = aio_method_view(method, &fn_name, &request, scope);
    let mut layout = super::layout::method_layout(
        &method.name,
        &fn_name,
        &request,
        &response_type,
        method.response.is_some(),
        &params,
    );
    layout.correlation_inline = super::layout::correlation_inline(&correlation.expr);
    MethodView {
        name: method.name.clone(),
        fn_name,
        request,
        docs: method.docs.clone(),
        deprecated: method.deprecated.clone(),
        message_type,
        kind_doc,
        params,
        has_response: method.response.is_some(),
        response_type,
        correlation_expr: correlation.expr,
        correlation_segments: correlation.segments,
        correlation_in_some: correlation.in_some,
        max_retries: method
            .delivery
            .as_ref()
            .and_then(|d| d.max_retries)
            .map(|n| int_literal(u64::from(n))),
        ttl: method
            .delivery
            .as_ref()
            .and_then(|d| d.ttl_ms)
            .map(duration_expr),
        client_too_many_args: 2 + method.params.len() > CLIPPY_MAX_ARGUMENTS,
        handler_too_many_args: 3 + method.params.len() > CLIPPY_MAX_ARGUMENTS,
        layout,
        aio,
    }
}

/// `method` as the `aio` submodule of its service-version module writes it
/// (`scope` is the service-version module's).
fn aio_method_view(
    method: &crate::manifest::Method,
    fn_name: &str,
    request: &str,
    scope: Scope<'_>,
) -> AioMethodView {
    let scope = Scope {
        nested: scope.nested + 1,
        ..scope
    };
    let params: Vec<FieldView> = method
        .params
        .iter()
        .map(|p| field_view(p, scope, false))
        .collect();
    AioMethodView {
        response_type: method
            .response
            .as_ref()
            .map_or_else(|| "()".to_owned(), |t| scope.rust_type(t, false)),
        layout: super::layout::aio_method_layout(
            fn_name,
            request,
            method.response.is_some(),
            &params,
        ),
        params,
    }
}

/// An integer literal with `_` between groups of three digits, as clippy's
/// `unreadable_literal` wants from five digits on.
fn int_literal(value: u64) -> String {
    let digits = value.to_string();
    if digits.len() < 5 {
        return digits;
    }
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push('_');
        }
        out.push(digit);
    }
    out
}

/// A `Duration` of `ms` milliseconds. `Duration::new(secs, nanos)` rather
/// than `from_millis`/`from_secs`: clippy's `duration_suboptimal_units` asks
/// for `from_hours` and the like, which need a newer Rust than ours.
fn duration_expr(ms: u64) -> String {
    format!(
        "::std::time::Duration::new({}, {})",
        int_literal(ms / 1_000),
        int_literal((ms % 1_000) * 1_000_000)
    )
}

/// An `Option<String>` expression reading the `@correlate` path from the
/// local `request`, stepping through optional fields with `Option` combinators.
fn correlation_expr(manifest: &Manifest, method: &crate::manifest::Method) -> Correlation {
    let none = Correlation {
        expr: "None".to_owned(),
        segments: Vec::new(),
        in_some: false,
    };
    let Some(path) = &method.correlate else {
        return none;
    };
    let mut fields: &[Field] = &method.params;
    let mut segments = Vec::new();
    let mut in_option = false;
    for segment in path {
        let Some(field) = fields.iter().find(|f| &f.name == segment) else {
            // The checker resolved the path; a manifest from elsewhere may not.
            return none;
        };
        let ident = field_name(&field.name);
        let optional = matches!(field.ty, TypeRef::Optional(_));
        match (in_option, optional) {
            (false, false) => segments.push(format!(".{ident}")),
            (false, true) => {
                segments.push(format!(".{ident}"));
                segments.push(".as_ref()".to_owned());
            }
            (true, false) => segments.push(format!(".map(|v| &v.{ident})")),
            (true, true) => segments.push(format!(".and_then(|v| v.{ident}.as_ref())")),
        }
        in_option |= optional;
        let named = field.ty.named();
        fields = match named.first().and_then(|n| manifest.types.get(*n)) {
            Some(TypeDef::Record { fields, .. }) => fields,
            _ => &[],
        };
    }
    if in_option {
        segments.push(".map(::std::string::ToString::to_string)".to_owned());
    } else {
        segments.push(".to_string()".to_owned());
    }
    let chain = format!("request{}", segments.concat());
    Correlation {
        expr: if in_option {
            chain
        } else {
            format!("Some({chain})")
        },
        segments,
        in_some: !in_option,
    }
}

/// [`correlation_expr`]'s result: the expression, and its method chain for
/// a layout that breaks it one call per line.
struct Correlation {
    expr: String,
    /// `.employee`, `.as_ref()`, …: what follows `request`; empty for `None`.
    segments: Vec<String>,
    /// The chain is wrapped in `Some(…)`.
    in_some: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_durations_read_well() {
        assert_eq!(int_literal(7), "7");
        assert_eq!(int_literal(9_999), "9999");
        assert_eq!(int_literal(10_000), "10_000");
        assert_eq!(int_literal(172_800_000), "172_800_000");
        assert_eq!(int_literal(u64::MAX), "18_446_744_073_709_551_615");
        assert_eq!(
            duration_expr(48 * 3_600_000),
            "::std::time::Duration::new(172_800, 0)"
        );
        assert_eq!(
            duration_expr(1_500),
            "::std::time::Duration::new(1, 500_000_000)"
        );
    }

    #[test]
    fn paths_cross_packages_from_each_scope() {
        let top = Scope {
            package: "hr.employees",
            nested: 0,
            qualify_std: false,
        };
        let inner = Scope {
            package: "hr.employees",
            nested: 1,
            qualify_std: false,
        };
        assert_eq!(top.path_to("hr.employees.Employee"), "Employee");
        assert_eq!(inner.path_to("hr.employees.Employee"), "super::Employee");
        assert_eq!(top.path_to("common.Money"), "super::super::common::Money");
        assert_eq!(
            inner.path_to("common.Money"),
            "super::super::super::common::Money"
        );
    }
}
