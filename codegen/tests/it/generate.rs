//! The fingerprint's stability rules on the code generated for `schemas/`.
//! That code itself is pinned once, as the checked-in
//! `generated-examples/src/generated/` (test `drift` there; `cargo xtask
//! regen` rewrites it and the diff is the review).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rfidl_codegen::generate::{Layout, generate_files};

use crate::support::{model_of, write_hr};

/// The checker fingerprints a manifest by moving its docs out and back
/// (`with_fingerprint`); the validators recompute from a stripped copy
/// (`compute_fingerprint`). Both must agree, and the docs must survive.
#[test]
fn the_checker_fingerprint_is_the_recomputed_one_and_docs_survive() {
    let model = model_of(&[PathBuf::from("../schemas")]);
    let mut documented = 0;
    for manifest in model.manifests() {
        assert_eq!(
            manifest.fingerprint,
            manifest.compute_fingerprint(),
            "{}",
            manifest.interface
        );
        let type_docs = manifest.types.values().any(|ty| match ty {
            rfidl_codegen::manifest::TypeDef::Record { docs, fields, .. } => {
                !docs.is_empty() || fields.iter().any(|f| !f.docs.is_empty())
            }
            rfidl_codegen::manifest::TypeDef::Enum { docs, variants, .. } => {
                !docs.is_empty() || variants.iter().any(|v| !v.docs.is_empty())
            }
        });
        if !manifest.docs.is_empty()
            && manifest.methods.iter().any(|m| !m.docs.is_empty())
            && type_docs
        {
            documented += 1;
        }
    }
    assert!(
        documented > 0,
        "no manifest of ../schemas has docs at every level: the test proves nothing"
    );
}

fn fingerprints(dir: &Path, hr: &str) -> Vec<(String, String)> {
    model_of(&[write_hr(dir, hr)])
        .manifests()
        .map(|m| {
            (
                format!("{} v{}", m.interface, m.version),
                m.fingerprint.clone(),
            )
        })
        .collect()
}

#[test]
fn fingerprints_ignore_layout_and_docs_but_not_meaning() {
    let original = std::fs::read_to_string("../schemas/hr.rfidl").expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    let base = fingerprints(dir.path(), &original);
    assert_eq!(base.len(), 2);

    // Reformatted: whitespace squeezed, comments dropped.
    let squeezed: String = original
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") || l.trim_start().starts_with("///"))
        .map(|l| l.split(" //").next().unwrap_or(l).trim().to_owned() + "\n")
        .collect();
    assert_ne!(squeezed, original);
    assert_eq!(
        fingerprints(dir.path(), &squeezed),
        base,
        "layout changed the fingerprint"
    );

    // Doc comments edited.
    let redocumented = original.replace(
        "/// Stable identifier issued by HR.",
        "/// The id HR issued, never reused.",
    );
    assert_ne!(redocumented, original);
    assert_eq!(
        fingerprints(dir.path(), &redocumented),
        base,
        "a doc edit changed the fingerprint"
    );

    // A field type changed: both versions use Employee, both change.
    let retyped = original.replace("    weekly_hours: f64,", "    weekly_hours: u32,");
    assert_ne!(retyped, original);
    let changed = fingerprints(dir.path(), &retyped);
    assert_ne!(changed[0].1, base[0].1);
    assert_ne!(changed[1].1, base[1].1);

    // A method added to v2 only changes v2.
    let extended = original.replacen(
        "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n\n    /// An employee goes on leave",
        "    signal OnboardingCompleted(employee_id: uuid, completed_at: timestamp);\n\n    signal BadgeIssued(employee_id: uuid);\n\n    /// An employee goes on leave",
        1,
    );
    assert_ne!(extended, original);
    let extended = fingerprints(dir.path(), &extended);
    assert_eq!(extended[0].1, base[0].1);
    assert_ne!(extended[1].1, base[1].1);
}

/// The names of one module's items, of each struct's fields and of each
/// function's arguments are distinct in the code generated for a contract
/// full of names the generator rewrites (keywords, `Self`, a type that
/// shadows `Option`): what E0014 and E0015 promise for accepted contracts.
#[test]
fn generated_names_stay_distinct_where_the_checker_accepts() {
    let model = model_of(&[PathBuf::from(
        "../contract/tests/ui/ok_generated_names_stay_distinct.rfidl",
    )]);
    let files = generate_files(
        &model.packages,
        &rfidl_codegen::Options::default(),
        Layout::SourceDir,
    )
    .expect("generate");
    let package = files
        .iter()
        .find(|f| f.name == "tricky.type.rs")
        .expect("the package file");
    // `record Option` shadows the prelude: serde must call the real one.
    assert!(
        package
            .contents
            .contains("skip_serializing_if = \"::std::option::Option::is_none\""),
        "{}",
        package.contents
    );
    assert!(!package.contents.contains("\"Option::is_none\""));
    let file = syn::parse_file(&package.contents).expect("generated code parses");
    let mut clashes = Vec::new();
    distinct_names("tricky::type", &file.items, &mut clashes);
    assert!(clashes.is_empty(), "{clashes:?}\n{}", package.contents);
}

fn distinct_names(module: &str, items: &[syn::Item], clashes: &mut Vec<String>) {
    let mut types = BTreeSet::new();
    for item in items {
        match item {
            syn::Item::Struct(s) => {
                check(clashes, &mut types, format!("{module}::{}", s.ident));
                let mut fields = BTreeSet::new();
                for field in &s.fields {
                    if let Some(ident) = &field.ident {
                        check(
                            clashes,
                            &mut fields,
                            format!("{module}::{}.{ident}", s.ident),
                        );
                    }
                }
            }
            syn::Item::Enum(e) => {
                check(clashes, &mut types, format!("{module}::{}", e.ident));
                let mut variants = BTreeSet::new();
                for variant in &e.variants {
                    check(
                        clashes,
                        &mut variants,
                        format!("{module}::{}::{}", e.ident, variant.ident),
                    );
                }
            }
            syn::Item::Trait(t) => {
                check(clashes, &mut types, format!("{module}::{}", t.ident));
                let mut functions = BTreeSet::new();
                for item in &t.items {
                    if let syn::TraitItem::Fn(f) = item {
                        check(
                            clashes,
                            &mut functions,
                            format!("{module}::{}::{}", t.ident, f.sig.ident),
                        );
                        distinct_arguments(module, &f.sig, clashes);
                    }
                }
            }
            syn::Item::Impl(i) => {
                let mut functions = BTreeSet::new();
                for item in &i.items {
                    if let syn::ImplItem::Fn(f) = item {
                        let owner = quote_type(&i.self_ty);
                        check(
                            clashes,
                            &mut functions,
                            format!("{module}::{owner}::{}", f.sig.ident),
                        );
                        distinct_arguments(module, &f.sig, clashes);
                    }
                }
            }
            syn::Item::Mod(m) => {
                let name = format!("{module}::{}", m.ident);
                check(clashes, &mut types, name.clone());
                if let Some((_, inner)) = &m.content {
                    distinct_names(&name, inner, clashes);
                }
            }
            _ => {}
        }
    }
}

fn check(clashes: &mut Vec<String>, seen: &mut BTreeSet<String>, name: String) {
    if !seen.insert(name.clone()) {
        clashes.push(name);
    }
}

fn distinct_arguments(module: &str, signature: &syn::Signature, clashes: &mut Vec<String>) {
    let mut names = BTreeSet::new();
    for input in &signature.inputs {
        if let syn::FnArg::Typed(typed) = input
            && let syn::Pat::Ident(ident) = typed.pat.as_ref()
            && !names.insert(ident.ident.to_string())
        {
            clashes.push(format!("{module}::{}({})", signature.ident, ident.ident));
        }
    }
}

fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(path) => path
            .path
            .segments
            .last()
            .map_or_else(String::new, |s| s.ident.to_string()),
        _ => String::from("?"),
    }
}
