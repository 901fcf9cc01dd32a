//! The example contracts in `schemas/` are the input of every later stage
//! (generation, manifests, the demo): they must check without a single
//! diagnostic, warnings included, and keep using every construct of the
//! language, so that a construct the examples drop is noticed here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rfidl_contract::check::check_paths;
use rfidl_contract::diagnostics::FileId;
use rfidl_contract::syntax::{ast, parse_file};

fn schema_files() -> Vec<PathBuf> {
    rfidl_contract::check::load::contract_files(Path::new("../schemas")).expect("schemas/")
}

#[test]
fn the_example_schemas_check_without_any_diagnostic() {
    let outcome = check_paths(&[PathBuf::from("../schemas")]).expect("schemas/ is readable");
    assert!(outcome.diagnostics.is_empty(), "{}", outcome.render_human());
    assert!(outcome.model.is_some());
    assert!(outcome.read_paths.len() >= 3, "{:?}", outcome.read_paths);
}

/// What the examples use, collected from their syntax trees.
#[derive(Default)]
struct Usage {
    packages: BTreeSet<String>,
    imports: usize,
    type_names: BTreeSet<String>,
    lists: usize,
    maps: usize,
    optionals: usize,
    method_kinds: BTreeSet<&'static str>,
    annotations: BTreeSet<String>,
    documented: usize,
    /// (service, version) pairs.
    service_versions: BTreeSet<(String, u32)>,
    /// Records with a field whose type mentions the record itself.
    self_recursive_records: BTreeSet<String>,
}

impl Usage {
    fn type_expr(&mut self, ty: &ast::TypeExpr, names: &mut Vec<String>) {
        if ty.optional {
            self.optionals += 1;
        }
        match &ty.kind {
            ast::TypeKind::Named(name) => {
                self.type_names.insert(name.text.clone());
                names.push(name.text.clone());
            }
            ast::TypeKind::List(inner) => {
                self.lists += 1;
                self.type_expr(inner, names);
            }
            ast::TypeKind::Map(key, value) => {
                self.maps += 1;
                self.type_expr(key, names);
                self.type_expr(value, names);
            }
        }
    }

    fn annotations(&mut self, annotations: &[ast::Annotation]) {
        self.annotations
            .extend(annotations.iter().map(|a| a.name.text.clone()));
    }

    fn docs(&mut self, docs: &ast::Docs) {
        if !docs.is_empty() {
            self.documented += 1;
        }
    }

    fn fields(&mut self, fields: &[ast::Field]) -> Vec<String> {
        let mut names = Vec::new();
        for field in fields {
            self.docs(&field.docs);
            self.annotations(&field.annotations);
            self.type_expr(&field.ty, &mut names);
        }
        names
    }

    fn file(&mut self, file: &ast::File) {
        self.packages.insert(file.package.name.text.clone());
        for item in &file.items {
            match item {
                ast::Item::Import(_) => self.imports += 1,
                ast::Item::Record(record) => {
                    self.docs(&record.docs);
                    self.annotations(&record.annotations);
                    if self.fields(&record.fields).contains(&record.name.text) {
                        self.self_recursive_records.insert(record.name.text.clone());
                    }
                }
                ast::Item::Enum(enumeration) => {
                    self.docs(&enumeration.docs);
                    self.annotations(&enumeration.annotations);
                }
                ast::Item::Service(service) => {
                    self.docs(&service.docs);
                    self.annotations(&service.annotations);
                    self.service_versions.insert((
                        service.name.text.clone(),
                        service.version.expect("a small version"),
                    ));
                    for method in &service.methods {
                        self.docs(&method.docs);
                        self.annotations(&method.annotations);
                        self.method_kinds.insert(method.kind.keyword());
                        self.fields(&method.params);
                        if let Some(response) = &method.response {
                            self.type_expr(response, &mut Vec::new());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_example_schemas_use_every_construct() {
    let mut usage = Usage::default();
    for path in schema_files() {
        let text = std::fs::read_to_string(&path).expect("read");
        let file = parse_file(FileId::default(), &text)
            .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        usage.file(&file);
    }

    assert!(usage.packages.len() >= 2, "{:?}", usage.packages);
    assert!(usage.imports >= 2);
    let scalars: Vec<&str> = rfidl_contract::manifest::Scalar::ALL
        .iter()
        .map(|s| s.keyword())
        .collect();
    let missing: Vec<_> = scalars
        .iter()
        .filter(|s| !usage.type_names.contains(**s))
        .collect();
    assert!(missing.is_empty(), "scalars no example uses: {missing:?}");
    assert!(
        usage.type_names.iter().any(|name| name.contains('.')),
        "no qualified (imported) type name"
    );
    assert!(usage.lists > 0 && usage.maps > 0 && usage.optionals > 0);
    assert_eq!(
        usage.method_kinds,
        BTreeSet::from(["command", "pushcall", "signal"])
    );
    for annotation in ["correlate", "delivery", "deprecated"] {
        assert!(
            usage.annotations.contains(annotation),
            "no example uses @{annotation}"
        );
    }
    assert!(usage.documented >= 10, "too few doc comments");
    assert!(
        !usage.self_recursive_records.is_empty(),
        "no record recursive through a container (e.g. an org chart)"
    );
    let versions_of_one_service = usage
        .service_versions
        .iter()
        .filter(|(name, _)| {
            usage
                .service_versions
                .iter()
                .filter(|(other, _)| other == name)
                .count()
                > 1
        })
        .count();
    assert!(
        versions_of_one_service >= 2,
        "no service evolves from v1 to v2: {:?}",
        usage.service_versions
    );
}
