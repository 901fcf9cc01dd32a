//! The rules themselves: one method of [`Validator`] per part of a
//! manifest (names, type references, fields, methods, types, usage,
//! cycles, module names), each reporting with its `M0…` code.

use std::collections::BTreeSet;

use super::*;
use crate::check::cycles::{RequiredEdges, required_cycles};
use crate::diagnostics::{FileId, Span};
use crate::manifest::{Field, MethodKind, TypeDef, TypeRef};
use crate::names;

impl<'a> Validator<'a> {
    fn report(&mut self, code: &'static str, path: impl Into<String>, message: impl Into<String>) {
        self.total += 1;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(ManifestProblem {
                code: code.to_owned(),
                path: path.into(),
                message: message.into(),
            });
        }
    }

    /// M0004 / M0005 / M0006: returns whether the name is a usable identifier.
    fn name(&mut self, path: &str, what: &str, name: &str, case: Case) -> bool {
        if name.len() > MAX_NAME_LEN {
            self.report(
                "M0005",
                path,
                format!(
                    "{what} {} is {} bytes long, over the {MAX_NAME_LEN}-byte limit",
                    shown(name),
                    name.len()
                ),
            );
            return false;
        }
        if !is_identifier(name) {
            self.report(
                "M0004",
                path,
                format!(
                    "{what} {} is not an identifier (a letter or `_`, then letters, digits and `_`)",
                    shown(name)
                ),
            );
            return false;
        }
        let (fine, wanted) = match case {
            Case::UpperCamel => (is_upper_camel(name), "UpperCamelCase"),
            Case::Snake => (is_snake(name), "snake_case"),
        };
        if !fine {
            self.report(
                "M0006",
                path,
                format!("{what} {} is not {wanted}", shown(name)),
            );
        }
        true
    }

    fn text(&mut self, path: &str, what: &str, text: &str) {
        if text.contains(['\n', '\r']) {
            self.report(
                "M0020",
                path,
                format!("{what} holds a line break, which no `///` line can"),
            );
        }
    }

    fn docs(&mut self, path: &str, docs: &[String], deprecated: Option<&String>) {
        for line in docs {
            self.text(path, "a doc comment line", line);
        }
        if let Some(note) = deprecated {
            self.text(path, "the deprecation note", note);
        }
    }

    pub(super) fn run(&mut self) {
        let manifest = self.manifest;
        if manifest.format != crate::manifest::FORMAT_VERSION {
            self.report(
                "M0001",
                "manifest",
                format!(
                    "format {} is not the format {} this rfidl knows",
                    manifest.format,
                    crate::manifest::FORMAT_VERSION
                ),
            );
        }
        self.interface();
        if manifest.version == 0 {
            self.report("M0007", "manifest", "a service version must be 1 or more");
        }
        let computed = manifest.compute_fingerprint();
        if manifest.fingerprint != computed {
            self.report(
                "M0008",
                "manifest",
                format!(
                    "the fingerprint {} is not the content's ({computed})",
                    shown(&manifest.fingerprint)
                ),
            );
        }
        self.docs("service", &manifest.docs, manifest.deprecated.as_ref());
        let defined = self.type_names();
        self.methods(&defined);
        self.types(&defined);
        self.usage(&defined);
        self.cycles();
        self.modules(&defined);
    }

    /// M0002, M0003 and the service's name.
    fn interface(&mut self) {
        let manifest = self.manifest;
        if !is_package_name(&manifest.package) {
            self.report(
                "M0003",
                "manifest",
                format!(
                    "package {} is not lowercase dotted segments (`hr.employees`)",
                    shown(&manifest.package)
                ),
            );
        }
        self.name("manifest", "service", &manifest.service, Case::UpperCamel);
        let expected = format!("{}.{}", manifest.package, manifest.service);
        if manifest.interface != expected || !is_interface_id(&manifest.interface) {
            self.report(
                "M0002",
                "manifest",
                format!(
                    "interface {} is not `package.Service` of its package {} and service {}",
                    shown(&manifest.interface),
                    shown(&manifest.package),
                    shown(&manifest.service)
                ),
            );
        }
    }

    /// The defined types' names, each checked (`package.Name`).
    fn type_names(&mut self) -> BTreeSet<&'a str> {
        let manifest = self.manifest;
        let mut defined = BTreeSet::new();
        for name in manifest.types.keys() {
            let path = format!("type {}", shown(name));
            if name.len() > MAX_NAME_LEN {
                self.name(&path, "type", name, Case::UpperCamel);
                continue;
            }
            let Some((package, short)) = name.rsplit_once('.') else {
                self.report(
                    "M0014",
                    path,
                    "a defined type is named `package.Name`, fully qualified",
                );
                continue;
            };
            if !is_package_name(package) {
                self.report(
                    "M0003",
                    &path,
                    format!(
                        "package {} is not lowercase dotted segments",
                        shown(package)
                    ),
                );
                continue;
            }
            if self.name(&path, "type", short, Case::UpperCamel) {
                defined.insert(name.as_str());
            }
        }
        defined
    }

    /// Checks a type reference: no `T??`, no deeper nesting than a contract
    /// allows ([`crate::limits::MAX_TYPE_DEPTH`]), named types defined.
    fn type_ref(&mut self, path: &str, ty: &TypeRef, defined: &BTreeSet<&str>) {
        let mut stack = vec![(ty, false, 0usize)];
        let mut too_deep = false;
        while let Some((ty, in_optional, depth)) = stack.pop() {
            if depth > crate::limits::MAX_TYPE_DEPTH && !too_deep {
                too_deep = true;
                self.report(
                    "M0014",
                    path,
                    format!(
                        "`list<…>`/`map<…>` nested deeper than {} levels",
                        crate::limits::MAX_TYPE_DEPTH
                    ),
                );
            }
            match ty {
                TypeRef::Scalar(_) => {}
                TypeRef::Named(name) => {
                    if !defined.contains(name.as_str()) {
                        let known = self.manifest.types.contains_key(name);
                        self.report(
                            if known { "M0014" } else { "M0012" },
                            path,
                            if known {
                                format!("type {} is defined with an invalid name", shown(name))
                            } else {
                                format!(
                                    "type {} is not defined in the manifest's types",
                                    shown(name)
                                )
                            },
                        );
                    }
                }
                TypeRef::List(inner) | TypeRef::Map(inner) => {
                    stack.push((inner, false, depth + 1));
                }
                TypeRef::Optional(inner) => {
                    if in_optional {
                        self.report(
                            "M0014",
                            path,
                            "an optional of an optional (`T??`) is not a contract type",
                        );
                    }
                    stack.push((inner, true, depth));
                }
            }
        }
    }

    /// Fields of a record or parameters of a method: names, duplicates
    /// (M0009), Rust name clashes (M0011), reserved parameter names (M0010),
    /// types and docs.
    fn fields(&mut self, owner: &str, fields: &[Field], params: bool, defined: &BTreeSet<&str>) {
        let what = if params { "param" } else { "field" };
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut rust: BTreeMap<String, &str> = BTreeMap::new();
        for field in fields {
            let path = format!("{owner} {what} {}", shown(&field.name));
            self.docs(&path, &field.docs, field.deprecated.as_ref());
            self.type_ref(&path, &field.ty, defined);
            if !self.name(&path, what, &field.name, Case::Snake) {
                continue;
            }
            if !seen.insert(&field.name) {
                self.report("M0009", &path, format!("{what} declared more than once"));
                continue;
            }
            let rust_name = names::field_name(&field.name);
            if params && names::CALL_ARGUMENTS.contains(&rust_name.as_str()) {
                self.report(
                    "M0010",
                    &path,
                    format!(
                        "would clash with the argument `{rust_name}` every generated client or handler function takes"
                    ),
                );
            }
            if let Some(other) = rust.insert(rust_name.clone(), &field.name) {
                self.report(
                    "M0011",
                    &path,
                    format!(
                        "{} and {} both become the Rust field `{rust_name}`",
                        shown(other),
                        shown(&field.name)
                    ),
                );
            }
        }
    }

    fn methods(&mut self, defined: &BTreeSet<&str>) {
        let manifest = self.manifest;
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut functions: BTreeMap<String, &str> = BTreeMap::new();
        let mut requests: BTreeMap<String, &str> = BTreeMap::new();
        for method in &manifest.methods {
            let path = format!("method {}", shown(&method.name));
            self.docs(&path, &method.docs, method.deprecated.as_ref());
            self.fields(&path, &method.params, true, defined);
            if let Some(response) = &method.response {
                self.type_ref(&format!("{path} response"), response, defined);
                if method.kind == MethodKind::Signal {
                    self.report("M0016", &path, "a signal cannot have a response");
                }
            }
            self.correlate(&path, method);
            if let Some(delivery) = &method.delivery {
                if delivery.max_retries.is_none() && delivery.ttl_ms.is_none() {
                    self.report(
                        "M0019",
                        &path,
                        "`@delivery` needs `max_retries`, `ttl` or both",
                    );
                }
                if delivery.ttl_ms == Some(0) {
                    self.report("M0019", &path, "`ttl` must be a positive duration");
                }
            }
            if !self.name(&path, "method", &method.name, Case::UpperCamel) {
                continue;
            }
            if !seen.insert(&method.name) {
                self.report("M0009", &path, "method declared more than once");
                continue;
            }
            let function = names::method_fn_name(&method.name);
            let request = names::request_struct_name(&method.name);
            if names::CLIENT_FUNCTIONS.contains(&function.as_str()) {
                self.report(
                    "M0010",
                    &path,
                    format!("would become the function `{function}`, which the generated client already defines"),
                );
            }
            if names::SERVICE_MODULE_TYPES.contains(&request.as_str()) {
                self.report(
                    "M0010",
                    &path,
                    format!("would get the request struct `{request}`, a name the generated module already uses"),
                );
            }
            let clash = functions
                .get(&function)
                .map(|other| (*other, function.clone()))
                .or_else(|| {
                    requests
                        .get(&request)
                        .map(|other| (*other, request.clone()))
                });
            match clash {
                Some((other, rust_name)) => self.report(
                    "M0011",
                    &path,
                    format!(
                        "methods {} and {} would both be `{rust_name}` in Rust",
                        shown(other),
                        shown(&method.name)
                    ),
                ),
                None => {
                    functions.insert(function, &method.name);
                    requests.insert(request, &method.name);
                }
            }
        }
    }

    /// The checker's rule 8: the path walks parameters, then record fields,
    /// and ends on a scalar.
    fn correlate(&mut self, path: &str, method: &crate::manifest::Method) {
        let Some(segments) = &method.correlate else {
            return;
        };
        let mut fields: &[Field] = &method.params;
        let mut problem = None;
        if segments.is_empty() {
            problem = Some("the path is empty".to_owned());
        }
        for (index, segment) in segments.iter().enumerate() {
            let Some(field) = fields.iter().find(|f| &f.name == segment) else {
                problem = Some(format!("nothing is named {}", shown(segment)));
                break;
            };
            let mut ty = &field.ty;
            if let TypeRef::Optional(inner) = ty {
                ty = inner;
            }
            let last = index + 1 == segments.len();
            match (ty, last) {
                (TypeRef::Scalar(_), true) => break,
                (TypeRef::Named(name), false) => match self.manifest.types.get(name) {
                    Some(TypeDef::Record {
                        fields: inner_fields,
                        ..
                    }) => fields = inner_fields,
                    _ => {
                        problem = Some(format!("{} is not a record", shown(segment)));
                        break;
                    }
                },
                _ => {
                    problem = Some(format!(
                        "it must end on a scalar field, {} is not one",
                        shown(segment)
                    ));
                    break;
                }
            }
        }
        if let Some(problem) = problem {
            self.report("M0018", path, format!("`@correlate`: {problem}"));
        }
    }

    fn types(&mut self, defined: &BTreeSet<&str>) {
        let manifest = self.manifest;
        for (name, def) in &manifest.types {
            let path = format!("type {}", shown(name));
            match def {
                TypeDef::Record {
                    docs,
                    deprecated,
                    fields,
                } => {
                    self.docs(&path, docs, deprecated.as_ref());
                    self.fields(&path, fields, false, defined);
                }
                TypeDef::Enum {
                    docs,
                    deprecated,
                    variants,
                } => {
                    self.docs(&path, docs, deprecated.as_ref());
                    if variants.is_empty() {
                        self.report("M0015", &path, "an enum needs at least one variant");
                    }
                    let mut seen: BTreeSet<&str> = BTreeSet::new();
                    let mut rust: BTreeMap<String, &str> = BTreeMap::new();
                    for variant in variants {
                        let path = format!("{path} variant {}", shown(&variant.name));
                        self.docs(&path, &variant.docs, variant.deprecated.as_ref());
                        if !self.name(&path, "variant", &variant.name, Case::UpperCamel) {
                            continue;
                        }
                        if !seen.insert(&variant.name) {
                            self.report("M0009", &path, "variant declared more than once");
                            continue;
                        }
                        let rust_name = names::variant_name(&variant.name);
                        if let Some(other) = rust.insert(rust_name.clone(), &variant.name) {
                            self.report(
                                "M0011",
                                &path,
                                format!(
                                    "{} and {} both become the Rust variant `{rust_name}`",
                                    shown(other),
                                    shown(&variant.name)
                                ),
                            );
                        }
                    }
                }
            }
        }
    }

    /// M0013: the types are exactly the closure of the methods' types.
    fn usage(&mut self, defined: &BTreeSet<&str>) {
        let manifest = self.manifest;
        let mut pending: Vec<&str> = manifest
            .methods
            .iter()
            .flat_map(|m| m.params.iter().map(|p| &p.ty).chain(m.response.iter()))
            .flat_map(TypeRef::named)
            .collect();
        let mut reached: BTreeSet<&str> = BTreeSet::new();
        while let Some(name) = pending.pop() {
            if !reached.insert(name) {
                continue;
            }
            if let Some(TypeDef::Record { fields, .. }) = manifest.types.get(name) {
                pending.extend(fields.iter().flat_map(|f| f.ty.named()));
            }
        }
        for name in defined {
            if !reached.contains(name) {
                self.report(
                    "M0013",
                    format!("type {}", shown(name)),
                    "no method uses it, directly or through other types",
                );
            }
        }
    }

    /// M0017, with the checker's own cycle search.
    fn cycles(&mut self) {
        let manifest = self.manifest;
        let mut edges: RequiredEdges = BTreeMap::new();
        for (name, def) in &manifest.types {
            let TypeDef::Record { fields, .. } = def else {
                continue;
            };
            let list = edges.entry(name.clone()).or_default();
            for field in fields {
                if let TypeRef::Named(target) = &field.ty
                    && matches!(manifest.types.get(target), Some(TypeDef::Record { .. }))
                {
                    list.push((target.clone(), Span::new(FileId::default(), 0, 0)));
                }
            }
        }
        for cycle in required_cycles(&edges) {
            let names: Vec<String> = cycle.iter().map(|(r, _)| shown(r)).collect();
            self.report(
                "M0017",
                format!("type {}", names[0]),
                format!(
                    "contains itself through required fields: {} -> {}",
                    names.join(" -> "),
                    names[0]
                ),
            );
        }
    }

    /// M0010 and M0011 across the module tree the generator builds: package
    /// modules, the service-version module and the types in each package.
    fn modules(&mut self, defined: &BTreeSet<&str>) {
        let manifest = self.manifest;
        // module path -> Rust name -> what takes it.
        let mut modules: BTreeMap<Vec<String>, BTreeMap<String, String>> = BTreeMap::new();
        let mut packages: BTreeSet<&str> = defined
            .iter()
            .filter_map(|name| name.rsplit_once('.').map(|(package, _)| package))
            .collect();
        if is_package_name(&manifest.package) {
            packages.insert(&manifest.package);
        }
        let mut entries: Vec<(Vec<String>, String, String)> = Vec::new();
        for package in &packages {
            let segments: Vec<&str> = package.split('.').collect();
            let path: Vec<String> = segments.iter().map(|s| names::package_module(s)).collect();
            for index in 0..segments.len() {
                entries.push((
                    path[..index].to_vec(),
                    path[index].clone(),
                    format!("package `{}`", segments[..=index].join(".")),
                ));
            }
        }
        for name in defined {
            let Some((package, short)) = name.rsplit_once('.') else {
                continue;
            };
            let path: Vec<String> = package.split('.').map(names::package_module).collect();
            let rust = names::type_name(short);
            if names::PACKAGE_MODULE_IMPORTS.contains(&rust.as_str())
                || names::PRELUDE_TRAITS_USED.contains(&rust.as_str())
            {
                self.report(
                    "M0010",
                    format!("type {}", shown(name)),
                    format!("`{rust}` is a name generated code keeps for itself"),
                );
            }
            entries.push((path, rust, format!("type {}", shown(name))));
        }
        if is_package_name(&manifest.package) && is_identifier(&manifest.service) {
            let path: Vec<String> = manifest
                .package
                .split('.')
                .map(names::package_module)
                .collect();
            let module = names::service_module(&manifest.service, manifest.version);
            entries.push((
                path,
                module,
                format!("service {} v{}", shown(&manifest.service), manifest.version),
            ));
        }
        for (path, rust, what) in entries {
            let namespace = modules.entry(path.clone()).or_default();
            match namespace.get(&rust) {
                Some(first) if *first == what => {}
                Some(first) => {
                    let first = first.clone();
                    let mut full = path;
                    full.push(rust);
                    self.report(
                        "M0011",
                        what.clone(),
                        format!(
                            "{what} and {first} both become the Rust name `{}`",
                            full.join("::")
                        ),
                    );
                }
                None => {
                    namespace.insert(rust, what);
                }
            }
        }
    }
}
