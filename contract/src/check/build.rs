//! The resolved model, built from checked contracts: each package's types
//! and each service version's manifest with its type closure. Runs only
//! when the check found no error.

use std::collections::BTreeMap;

use super::scope::Scope;
use super::{Checker, deprecation};
use crate::manifest::{self, Manifest, PackageContract, TypeDef};
use crate::model::Model;
use crate::syntax::ast;

impl Checker<'_> {
    pub(super) fn build_model(&self) -> Model {
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
        // Each type's canonical JSON, serialised once for every manifest
        // that holds it (the fingerprints hash it).
        let mut type_json = manifest::TypeJsonCache::default();
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
                .with_fingerprint_cached(&mut type_json);
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
