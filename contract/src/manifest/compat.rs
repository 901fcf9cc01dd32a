//! Compatibility of two revisions of one interface version.
//!
//! A published `vN` may change only in ways every peer built against an older
//! revision keeps working with (`docs/language.md`, "Identity, versions and
//! compatibility"):
//!
//! * **compatible**: a new method; a new optional (`T?`) field or parameter;
//!   doc comments; `@deprecated`; `@delivery` (a sender-side policy that is
//!   not part of what travels); the order of methods, fields and parameters
//!   (payloads are JSON objects keyed by name);
//! * **breaking**, each with its own code: everything else. A field or
//!   parameter removed, renamed or retyped (including `T` <-> `T?`), a new
//!   required one, a method removed or of another kind or response, a record
//!   that became an enum, an enum variant removed or added (an older receiver
//!   cannot decode a value it does not know), a changed `@correlate` path.
//!
//! Types are compared by fully qualified name: a record renamed is a type
//! change wherever it is used.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::{Field, Manifest, Method, TypeDef, TypeRef};

/// One change that needs a new version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakingChange {
    /// Stable code, `B0001`…, documented in `docs/errors.md` ([`CODES`]).
    pub code: &'static str,
    /// Where: `EmpService v1 method Hire param employee`,
    /// `record hr.employees.Employee field email`.
    pub path: String,
    /// What changed, one line: ``type was `string`, is `string?` ``.
    pub message: String,
}

impl fmt::Display for BreakingChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.code, self.path, self.message)
    }
}

/// Every code [`breaking_changes`] can report, with a one-line title.
pub const CODES: &[(&str, &str)] = &[
    ("B0001", "interface or version differs"),
    ("B0002", "method removed"),
    ("B0003", "method kind changed"),
    ("B0004", "method response changed"),
    ("B0005", "parameter removed"),
    ("B0006", "parameter type changed"),
    ("B0007", "required parameter added"),
    ("B0008", "field removed"),
    ("B0009", "field type changed"),
    ("B0010", "required field added"),
    ("B0011", "record became an enum or the reverse"),
    ("B0012", "enum variant removed"),
    ("B0013", "enum variant added"),
    ("B0014", "`@correlate` path changed"),
    ("B0015", "interface version removed"),
];

/// What `new` breaks for peers built against `old`; empty when `new` is a
/// compatible revision (or the same).
pub fn breaking_changes(old: &Manifest, new: &Manifest) -> Vec<BreakingChange> {
    let mut changes = Changes::default();
    if (old.interface.as_str(), old.version) != (new.interface.as_str(), new.version) {
        changes.push(
            "B0001",
            format!("{} v{}", new.interface, new.version),
            format!(
                "compares {} v{} with {} v{}: revisions of one version only",
                old.interface, old.version, new.interface, new.version
            ),
        );
        return changes.0;
    }
    let service = format!("{} v{}", old.service, old.version);
    let new_methods: BTreeMap<&str, &Method> =
        new.methods.iter().map(|m| (m.name.as_str(), m)).collect();
    for old_method in &old.methods {
        let path = format!("{service} method {}", old_method.name);
        let Some(new_method) = new_methods.get(old_method.name.as_str()) else {
            changes.push("B0002", path, "removed".to_owned());
            continue;
        };
        compare_method(&mut changes, &path, old_method, new_method);
    }
    // Every type both revisions know; a type only the old one uses is no
    // longer reachable, and the use that changed was reported above.
    for (name, old_def) in &old.types {
        if let Some(new_def) = new.types.get(name) {
            compare_type(&mut changes, name, old_def, new_def);
        }
    }
    changes.0
}

#[derive(Default)]
struct Changes(Vec<BreakingChange>);

impl Changes {
    fn push(&mut self, code: &'static str, path: String, message: String) {
        self.0.push(BreakingChange {
            code,
            path,
            message,
        });
    }
}

fn compare_method(changes: &mut Changes, path: &str, old: &Method, new: &Method) {
    if old.kind != new.kind {
        changes.push(
            "B0003",
            path.to_owned(),
            format!(
                "was a {}, is a {}",
                kind_name(old.kind),
                kind_name(new.kind)
            ),
        );
    }
    if old.response != new.response {
        changes.push(
            "B0004",
            path.to_owned(),
            format!(
                "response was {}, is {}",
                shown(old.response.as_ref()),
                shown(new.response.as_ref())
            ),
        );
    }
    if old.correlate != new.correlate {
        let path_of = |c: &Option<Vec<String>>| {
            c.as_ref()
                .map_or("none".to_owned(), |p| format!("`{}`", p.join(".")))
        };
        changes.push(
            "B0014",
            path.to_owned(),
            format!(
                "`@correlate` was {}, is {}",
                path_of(&old.correlate),
                path_of(&new.correlate)
            ),
        );
    }
    compare_fields(
        changes,
        path,
        "param",
        &old.params,
        &new.params,
        ["B0005", "B0006", "B0007"],
    );
}

fn compare_type(changes: &mut Changes, name: &str, old: &TypeDef, new: &TypeDef) {
    match (old, new) {
        (TypeDef::Record { fields: old, .. }, TypeDef::Record { fields: new, .. }) => {
            compare_fields(
                changes,
                &format!("record {name}"),
                "field",
                old,
                new,
                ["B0008", "B0009", "B0010"],
            );
        }
        (TypeDef::Enum { variants: old, .. }, TypeDef::Enum { variants: new, .. }) => {
            let path = format!("enum {name}");
            for variant in old {
                if !new.iter().any(|v| v.name == variant.name) {
                    changes.push(
                        "B0012",
                        format!("{path} variant {}", variant.name),
                        "removed".to_owned(),
                    );
                }
            }
            for variant in new {
                if !old.iter().any(|v| v.name == variant.name) {
                    changes.push(
                        "B0013",
                        format!("{path} variant {}", variant.name),
                        "added: a receiver built against the older revision cannot decode it"
                            .to_owned(),
                    );
                }
            }
        }
        (old, new) => changes.push(
            "B0011",
            name.to_owned(),
            format!("was {}, is {}", def_kind(old), def_kind(new)),
        ),
    }
}

/// Fields of a record or parameters of a method; `codes` are
/// (removed, retyped, required added).
fn compare_fields(
    changes: &mut Changes,
    owner: &str,
    noun: &str,
    old: &[Field],
    new: &[Field],
    [removed, retyped, required_added]: [&'static str; 3],
) {
    for old_field in old {
        let path = format!("{owner} {noun} {}", old_field.name);
        match new.iter().find(|f| f.name == old_field.name) {
            None => changes.push(removed, path, "removed".to_owned()),
            Some(new_field) if new_field.ty != old_field.ty => changes.push(
                retyped,
                path,
                format!("type was `{}`, is `{}`", old_field.ty, new_field.ty),
            ),
            Some(_) => {}
        }
    }
    for new_field in new {
        let is_new = !old.iter().any(|f| f.name == new_field.name);
        if is_new && !matches!(new_field.ty, TypeRef::Optional(_)) {
            changes.push(
                required_added,
                format!("{owner} {noun} {}", new_field.name),
                format!(
                    "added as required `{}`: peers built against the older revision do not \
                     send it (make it `{}?`, or add it in a new version)",
                    new_field.ty, new_field.ty
                ),
            );
        }
    }
}

fn kind_name(kind: super::MethodKind) -> &'static str {
    match kind {
        super::MethodKind::Signal => "signal",
        super::MethodKind::Pushcall => "pushcall",
        super::MethodKind::Command => "command",
    }
}

fn def_kind(def: &TypeDef) -> &'static str {
    match def {
        TypeDef::Record { .. } => "a record",
        TypeDef::Enum { .. } => "an enum",
    }
}

fn shown(ty: Option<&TypeRef>) -> String {
    ty.map_or("none".to_owned(), |t| format!("`{t}`"))
}
