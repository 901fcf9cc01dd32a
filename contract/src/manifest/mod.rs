//! Interface manifests: the canonical, self-contained description of one
//! service version, and its fingerprint.
//!
//! A manifest holds the interface id, version, methods, and the closure of
//! every record and enum they use (fully qualified names), so it can be
//! published, fetched and turned into code without the contract files. The
//! code generator works from manifests for that reason: a local contract and
//! one fetched from a registry take the same path.
//!
//! **Canonical form**: the manifest serialised as compact JSON with struct
//! members in declaration order, maps sorted by key, methods, fields, params
//! and variants in source order, empty lists and absent options omitted.
//! **Fingerprint**: `sha256:` + hex of the canonical form of the manifest
//! with every doc comment and the fingerprint itself removed, so editing a
//! doc comment or reformatting a contract keeps the identity, and any change
//! of a name, type, kind, order or annotation changes it.

pub mod compat;
pub mod types;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use types::{Scalar, TypeRef};

/// The manifest format version; bumped only for incompatible format changes.
pub const FORMAT_VERSION: u32 = 1;

/// One service version, self-contained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// The manifest format this document follows: [`FORMAT_VERSION`] for
    /// every manifest this crate writes.
    pub format: u32,
    /// `package.Service`: `hr.employees.EmpService`. With
    /// [`version`](Self::version), the identity of the interface in a
    /// registry and a lock file.
    pub interface: String,
    /// The contract's package, dotted lowercase: `hr.employees`.
    pub package: String,
    /// The service name as declared, `UpperCamelCase`: `EmpService`.
    pub service: String,
    /// The `N` of `service Name vN`, from 1.
    pub version: u32,
    /// `sha256:<hex>`; see the module docs. Empty (and left out of the JSON)
    /// until computed ([`with_fingerprint`](Self::with_fingerprint)); every
    /// manifest of a [`Model`](crate::model::Model) has it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
    /// The service's `///` doc comment, one string per line (without the
    /// `///` and one leading space). Not part of the fingerprint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub docs: Vec<String>,
    /// `Some(reason)` when the service version is `@deprecated("reason")`;
    /// a bare `@deprecated` gives the reason `"deprecated"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<String>,
    /// The methods, in source order (the order is part of the fingerprint,
    /// though not of compatibility).
    pub methods: Vec<Method>,
    /// Every record and enum the methods use, directly or through other types.
    pub types: BTreeMap<String, TypeDef>,
}

/// The three method kinds and their direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MethodKind {
    /// Service -> engine, no response.
    Signal,
    /// Service -> engine, optional response.
    Pushcall,
    /// Engine -> service, optional response.
    Command,
}

impl MethodKind {
    /// Whether the service sends it to the engine (signals, pushcalls).
    pub fn to_engine(self) -> bool {
        matches!(self, MethodKind::Signal | MethodKind::Pushcall)
    }
}

/// One method of a service version: a `signal`, `pushcall` or `command`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Method {
    /// The method name as declared, `UpperCamelCase`: `EmployeeHired`
    /// (generated code calls it `employee_hired`).
    pub name: String,
    /// Which of the three kinds, hence who sends it and whether it may answer.
    pub kind: MethodKind,
    /// The method's `///` doc comment, one string per line. Not part of the
    /// fingerprint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub docs: Vec<String>,
    /// `Some(reason)` when the method is `@deprecated` (a bare
    /// `@deprecated` gives `"deprecated"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<String>,
    /// The parameters, in source order; together they are the message's JSON
    /// payload, one member per parameter.
    pub params: Vec<Field>,
    /// The `-> T` answer type, if declared; always `None` for a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<TypeRef>,
    /// `@correlate(a.b.c)`: the path through the parameters to a scalar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlate: Option<Vec<String>>,
    /// `@delivery(…)`: this method's override of the runtime's retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
}

/// `@delivery(max_retries = N, ttl = "D")`: a per-method override of the
/// sender's retry policy (`outbox.max_retries`, `outbox.ttl` in the
/// runtime's configuration), honoured by the generated client. At least one
/// of the two is set. A sender-side policy: changing it keeps a revision
/// compatible (but changes the fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Delivery {
    /// How many times a delivery the receiver refused (its handler failed, a
    /// 2xx without acknowledgement, …) is retried before the outbox row is
    /// `Failed`. An unreachable destination is retried until the TTL and
    /// never counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// How long the message may wait for delivery, in milliseconds, from
    /// the moment it is enqueued; past it the outbox row is `Expired`.
    /// Written `ttl = "48h"` in the contract; always above zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// A record field or a method parameter. Optional ones have a `T?` type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Field {
    /// The field or parameter name as declared, `snake_case`; also its JSON
    /// member name (the contract is the wire format).
    pub name: String,
    /// Its type; a [`TypeRef::Optional`] for `T?`, whose member may be
    /// absent or `null`. Serialised as the member `type`, in text form.
    #[serde(rename = "type")]
    pub ty: TypeRef,
    /// The field's `///` doc comment, one string per line. Not part of the
    /// fingerprint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub docs: Vec<String>,
    /// `Some(reason)` when the field is `@deprecated` (a bare `@deprecated`
    /// gives `"deprecated"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<String>,
}

/// A named type of the contract: a record or an enum. Serialised with a
/// `kind` member, `"record"` or `"enum"`; its fully qualified name is the
/// key it is stored under ([`Manifest::types`], [`PackageContract::types`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum TypeDef {
    /// `record Name { field: Type, … }`: a JSON object, one member per field.
    Record {
        /// The record's `///` doc comment, one string per line.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        docs: Vec<String>,
        /// `Some(reason)` when the record is `@deprecated`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deprecated: Option<String>,
        /// The fields in source order (possibly none: `record Ping {}`).
        fields: Vec<Field>,
    },
    /// `enum Name { Variant, … }`: unit variants, serialised as their name.
    Enum {
        /// The enum's `///` doc comment, one string per line.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        docs: Vec<String>,
        /// `Some(reason)` when the enum is `@deprecated`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deprecated: Option<String>,
        /// The variants in source order; at least one.
        variants: Vec<Variant>,
    },
}

/// One variant of an enum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Variant {
    /// The variant name, `UpperCamelCase`; also its JSON form (`"OnLeave"`).
    pub name: String,
    /// The variant's `///` doc comment, one string per line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub docs: Vec<String>,
    /// `Some(reason)` when the variant is `@deprecated` (a bare
    /// `@deprecated` gives `"deprecated"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<String>,
}

/// One contract package: every type it declares, in source order, and its
/// service versions as manifests. The unit of code generation.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageContract {
    /// The dotted package name: `hr.employees`.
    pub package: String,
    /// The `///` lines above `package` in each of its files, in load order.
    pub docs: Vec<String>,
    /// Fully qualified name and definition, in source order.
    pub types: Vec<(String, TypeDef)>,
    /// One manifest per service version declared in the package: files in
    /// load order, each in source order.
    pub services: Vec<Manifest>,
}

impl Manifest {
    /// The fingerprint of this manifest's content (see the module docs).
    pub fn compute_fingerprint(&self) -> String {
        let mut bare = self.clone();
        bare.fingerprint.clear();
        bare.strip_docs();
        let canonical = serde_json::to_vec(&bare).expect("manifests always serialise");
        format!("sha256:{}", hex::encode(Sha256::digest(&canonical)))
    }

    /// Sets [`Manifest::fingerprint`] from the content. The same value as
    /// [`Manifest::compute_fingerprint`], without copying the manifest: the
    /// doc comments are moved out for the hash and moved back.
    pub fn with_fingerprint(mut self) -> Self {
        self.fingerprint.clear();
        let mut taken = Vec::new();
        self.each_docs(&mut |docs| taken.push(std::mem::take(docs)));
        // The canonical form goes into the hasher through a small buffer:
        // the same bytes as `to_vec`, without building the whole text first
        // (and without one hasher call per JSON token).
        let mut writer = std::io::BufWriter::with_capacity(8192, HashWriter(Sha256::new()));
        serde_json::to_writer(&mut writer, &self).expect("manifests always serialise");
        let hasher = writer
            .into_inner()
            .unwrap_or_else(|_| unreachable!("writing into a hasher cannot fail"));
        let mut taken = taken.into_iter();
        self.each_docs(&mut |docs| *docs = taken.next().expect("the same doc lists"));
        self.fingerprint = format!("sha256:{}", hex::encode(hasher.0.finalize()));
        self
    }

    /// [`Manifest::with_fingerprint`] for many manifests sharing types: the
    /// canonical JSON of each record and enum (doc comments removed) is
    /// written once into `cache` and reused by every manifest holding it,
    /// instead of serialising the type again per manifest. The bytes hashed
    /// are the same: `types` is the last member of the canonical form and
    /// always present, so the text is the manifest without its types
    /// (ending `"types":{}}`) with the types spliced in before the `}}`.
    pub(crate) fn with_fingerprint_cached(mut self, cache: &mut TypeJsonCache) -> Self {
        self.fingerprint.clear();
        let types = std::mem::take(&mut self.types);
        let mut taken = Vec::new();
        self.each_docs(&mut |docs| taken.push(std::mem::take(docs)));
        let mut head = serde_json::to_vec(&self).expect("manifests always serialise");
        let mut taken = taken.into_iter();
        self.each_docs(&mut |docs| *docs = taken.next().expect("the same doc lists"));
        assert!(head.ends_with(b"{}}"), "`types` is the last member");
        head.truncate(head.len() - 2);
        let mut hasher = HashWriter(Sha256::new());
        hasher.0.update(&head);
        for (index, (name, def)) in types.iter().enumerate() {
            if index > 0 {
                hasher.0.update(b",");
            }
            serde_json::to_writer(&mut hasher, name).expect("names always serialise");
            hasher.0.update(b":");
            if !cache.0.contains_key(name) {
                let mut bare = def.clone();
                bare.strip_docs();
                let json = serde_json::to_vec(&bare).expect("types always serialise");
                cache.0.insert(name.clone(), json);
            }
            hasher.0.update(&cache.0[name]);
        }
        hasher.0.update(b"}}");
        self.types = types;
        self.fingerprint = format!("sha256:{}", hex::encode(hasher.0.finalize()));
        self
    }

    /// The canonical compact JSON.
    pub fn to_canonical_json(&self) -> String {
        serde_json::to_string(self).expect("manifests always serialise")
    }

    /// Indented JSON for files and humans (same content as the canonical form).
    pub fn to_pretty_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("manifests always serialise")
    }

    /// YAML for files and humans (same content as the canonical form).
    pub fn to_yaml(&self) -> String {
        yaml_serde::to_string(self).expect("manifests always serialise")
    }

    fn strip_docs(&mut self) {
        self.each_docs(&mut Vec::clear);
    }

    /// Calls `f` on every doc comment list, always in the same order.
    fn each_docs(&mut self, f: &mut impl FnMut(&mut Vec<String>)) {
        f(&mut self.docs);
        for method in &mut self.methods {
            f(&mut method.docs);
            method.params.iter_mut().for_each(|p| f(&mut p.docs));
        }
        self.types.values_mut().for_each(|ty| ty.each_docs(f));
    }
}

/// Canonical JSON of records and enums with their doc comments removed, by
/// fully qualified name (see [`Manifest::with_fingerprint_cached`]). Only
/// for manifests of one model, where a name stands for one definition.
#[derive(Debug, Default)]
pub(crate) struct TypeJsonCache(std::collections::HashMap<String, Vec<u8>>);

/// Feeds what is written into a SHA-256 hasher.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl TypeDef {
    /// Removes every doc comment (of the type and of its fields or variants).
    pub fn strip_docs(&mut self) {
        self.each_docs(&mut Vec::clear);
    }

    /// Calls `f` on every doc comment list, always in the same order.
    fn each_docs(&mut self, f: &mut impl FnMut(&mut Vec<String>)) {
        match self {
            TypeDef::Record { docs, fields, .. } => {
                f(docs);
                fields.iter_mut().for_each(|field| f(&mut field.docs));
            }
            TypeDef::Enum { docs, variants, .. } => {
                f(docs);
                variants.iter_mut().for_each(|variant| f(&mut variant.docs));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, ty: TypeRef, docs: &[&str]) -> Field {
        Field {
            name: name.to_owned(),
            ty,
            docs: docs.iter().map(|d| (*d).to_owned()).collect(),
            deprecated: None,
        }
    }

    fn manifest(service: &str, types: &[(&str, TypeDef)]) -> Manifest {
        Manifest {
            format: FORMAT_VERSION,
            interface: format!("shop.{service}"),
            package: "shop".to_owned(),
            service: service.to_owned(),
            version: 2,
            fingerprint: "sha256:stale".to_owned(),
            docs: vec!["Orders \"quoted\"".to_owned()],
            deprecated: Some("use v3".to_owned()),
            methods: vec![Method {
                name: "place".to_owned(),
                kind: MethodKind::Command,
                docs: vec!["Places.".to_owned()],
                deprecated: None,
                params: vec![field(
                    "order",
                    TypeRef::Named("shop.Order".to_owned()),
                    &["the order"],
                )],
                response: Some(TypeRef::List(Box::new(TypeRef::Named(
                    "shop.Status".to_owned(),
                )))),
                correlate: Some(vec!["order".to_owned(), "id".to_owned()]),
                delivery: Some(Delivery {
                    max_retries: Some(3),
                    ttl_ms: None,
                }),
            }],
            types: types
                .iter()
                .map(|(name, def)| ((*name).to_owned(), def.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_cached_fingerprint_hashes_the_same_bytes() {
        let order = TypeDef::Record {
            docs: vec!["An order.".to_owned()],
            deprecated: None,
            fields: vec![
                field("id", TypeRef::Scalar(Scalar::Uuid), &["its id"]),
                field(
                    "lines",
                    TypeRef::Map(Box::new(TypeRef::Optional(Box::new(TypeRef::Scalar(
                        Scalar::String,
                    ))))),
                    &[],
                ),
            ],
        };
        let status = TypeDef::Enum {
            docs: Vec::new(),
            deprecated: Some(String::new()),
            variants: vec![Variant {
                name: "Open\u{e9}".to_owned(),
                docs: vec!["x".to_owned()],
                deprecated: None,
            }],
        };
        let mut cache = TypeJsonCache::default();
        let cases = [
            manifest(
                "Orders",
                &[
                    ("shop.Order", order.clone()),
                    ("shop.Status", status.clone()),
                ],
            ),
            manifest("Audit", &[("shop.Status", status)]),
            manifest("Empty", &[]),
            manifest("Again", &[("shop.Order", order)]),
        ];
        for case in cases {
            let expected = case.compute_fingerprint();
            let plain = case.clone().with_fingerprint();
            let cached = case.clone().with_fingerprint_cached(&mut cache);
            assert_eq!(cached.fingerprint, expected);
            assert_eq!(plain.fingerprint, expected);
            // Nothing else changed: the docs are back in place.
            assert_eq!(
                Manifest {
                    fingerprint: case.fingerprint.clone(),
                    ..cached
                },
                case
            );
        }
        assert_eq!(cache.0.len(), 2, "each type serialised once");
    }
}
