//! The manifest validator: every rule the contract checker applies that a
//! manifest can break, with codes `M0001`… (`docs/errors.md`).
//!
//! A manifest is code another team's `build.rs` turns into Rust, and a
//! registry, a cache file or a lock file may hold one no contract could
//! produce: `../../etc/passwd` as an interface, `Hired(); } fn pwn() {` as a
//! method, a doc line with a line break, a type nobody defines. Every entry
//! point validates before it uses one (the registry at publish, the registry
//! client at fetch and at cache read, `Builder::remote` before generating),
//! so a manifest that passes here is one the checker could have built:
//! names are identifiers as the grammar defines them, in the case the
//! checker requires, no two become the same Rust name and none takes a name
//! generated code keeps for itself (the same [`crate::names`]
//! functions the checker calls), every named type is defined in the
//! manifest's closure and every defined one is used, and the fingerprint is
//! the content's.
//!
//! The validator never fails fast on the first problem (all are listed, up
//! to [`MAX_PROBLEMS`]), never recurses on input (type references are
//! walked with an explicit stack) and never copies a long name into a
//! message (see [`shown`]).

mod rules;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::manifest::Manifest;

/// Longest name (identifier, package or qualified type name) in bytes. The
/// contract language sets no limit; a manifest has one so that a hostile
/// one cannot make every later step (paths, messages, code) carry megabytes.
pub const MAX_NAME_LEN: usize = 256;

/// At most this many problems are listed; the count says how many more.
pub const MAX_PROBLEMS: usize = 50;

/// Largest manifest text read from a registry or the cache, in bytes (the
/// registry's publish limit): a larger one is refused before it is parsed.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;

/// Every code [`validate`] can report, with a one-line title.
pub const CODES: &[(&str, &str)] = &[
    ("M0001", "unsupported manifest format"),
    ("M0002", "interface is not `package.Service`"),
    ("M0003", "invalid package name"),
    ("M0004", "not an identifier"),
    ("M0005", "name too long"),
    ("M0006", "name not in the required case"),
    ("M0007", "invalid version"),
    ("M0008", "fingerprint does not match the content"),
    ("M0009", "duplicate name"),
    ("M0010", "name taken by generated code"),
    ("M0011", "two names become one Rust name"),
    ("M0012", "unknown type"),
    ("M0013", "type defined but not used"),
    ("M0014", "invalid type"),
    ("M0015", "empty enum"),
    ("M0016", "signal with a response"),
    ("M0017", "record contains itself through required fields"),
    ("M0018", "invalid `@correlate` path"),
    ("M0019", "invalid `@delivery`"),
    ("M0020", "line break in a doc comment or deprecation note"),
    ("M0021", "manifest too large"),
];

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestProblem {
    /// Stable code, `M0001`…, documented in `docs/errors.md` ([`CODES`]).
    pub code: String,
    /// Where: `method Hire param employee`, `type hr.Employee field email`.
    pub path: String,
    /// What is wrong, one line; names in it are escaped and cut short
    /// ([`shown`]), so it is safe to print.
    pub message: String,
}

impl fmt::Display for ManifestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.code, self.path, self.message)
    }
}

/// A manifest that breaks at least one rule: the problems, in the order
/// found (at most [`MAX_PROBLEMS`]), and how many there were in all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidManifest {
    /// The problems found, in the order found; at most [`MAX_PROBLEMS`],
    /// never empty.
    pub problems: Vec<ManifestProblem>,
    /// How many problems there were in all (at least `problems.len()`; the
    /// display says "… and N more" for the rest).
    pub total: usize,
}

impl InvalidManifest {
    /// Whether a problem with `code` was found.
    pub fn has(&self, code: &str) -> bool {
        self.problems.iter().any(|p| p.code == code)
    }
}

impl fmt::Display for InvalidManifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} problem{} (no contract could produce this manifest)",
            self.total,
            if self.total == 1 { "" } else { "s" }
        )?;
        for problem in &self.problems {
            write!(f, "\n  {problem}")?;
        }
        if self.total > self.problems.len() {
            write!(f, "\n  … and {} more", self.total - self.problems.len())?;
        }
        Ok(())
    }
}

/// M0021 for a manifest text of `len` bytes over [`MAX_MANIFEST_BYTES`],
/// checked before parsing.
pub fn check_size(len: usize) -> Result<(), InvalidManifest> {
    if len <= MAX_MANIFEST_BYTES {
        return Ok(());
    }
    Err(InvalidManifest {
        problems: vec![ManifestProblem {
            code: "M0021".to_owned(),
            path: "manifest".to_owned(),
            message: format!(
                "over {len} bytes, more than the {MAX_MANIFEST_BYTES}-byte limit; not read"
            ),
        }],
        total: 1,
    })
}

/// A name as messages show it: escaped (no control character reaches a
/// terminal or a log) and cut to 40 characters.
pub fn shown(name: &str) -> String {
    const KEEP: usize = 40;
    let mut text: String = name
        .chars()
        .take(KEEP)
        .flat_map(char::escape_debug)
        .collect();
    let count = name.chars().count();
    if count > KEEP {
        text.push_str(&format!("… ({} bytes)", name.len()));
    }
    format!("`{text}`")
}

/// Whether `name` is an identifier as the contract grammar defines it:
/// `(XID_Start | "_") XID_Continue*`.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || unicode_ident::is_xid_start(c))
        && chars.all(unicode_ident::is_xid_continue)
}

/// Whether `name` is a package name the checker accepts: dotted segments of
/// ASCII lowercase letters, digits and `_`, each starting with a letter.
pub fn is_package_name(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN
        && name.split('.').all(|segment| {
            segment
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase())
                && segment
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
}

/// Whether `interface` is `package.Service` with a valid package and an
/// UpperCamelCase identifier as the service: the only names that may become
/// part of a cache path or a lock entry.
pub fn is_interface_id(interface: &str) -> bool {
    interface.len() <= MAX_NAME_LEN
        && interface
            .rsplit_once('.')
            .is_some_and(|(package, service)| {
                is_package_name(package) && is_identifier(service) && is_upper_camel(service)
            })
}

/// Whether `fingerprint` is `sha256:` and 64 lowercase hex digits.
pub fn is_fingerprint(fingerprint: &str) -> bool {
    fingerprint.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The checker's UpperCamelCase rule (E0030): no `_`, and the first
/// character is not lowercase (letters without case are accepted).
fn is_upper_camel(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c != '_' && !c.is_lowercase())
        && !name.contains('_')
}

/// The checker's snake_case rule (E0031): no uppercase letter, no `__`.
fn is_snake(name: &str) -> bool {
    !name.chars().any(char::is_uppercase) && !name.contains("__")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    UpperCamel,
    Snake,
}

struct Validator<'a> {
    manifest: &'a Manifest,
    problems: Vec<ManifestProblem>,
    total: usize,
}

/// Checks every rule; `Ok` only when none is broken.
pub fn validate(manifest: &Manifest) -> Result<(), InvalidManifest> {
    let mut validator = Validator {
        manifest,
        problems: Vec::new(),
        total: 0,
    };
    validator.run();
    if validator.total == 0 {
        Ok(())
    } else {
        Err(InvalidManifest {
            problems: validator.problems,
            total: validator.total,
        })
    }
}

impl Manifest {
    /// [`validate`]: whether a contract could have produced this manifest.
    pub fn validate(&self) -> Result<(), InvalidManifest> {
        validate(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_grammar() {
        for good in ["a", "_", "_x", "Employee", "東京", "émile", "x1"] {
            assert!(is_identifier(good), "{good}");
        }
        for bad in ["", "1x", "a b", "a/b", "r#fn", "a.b", "<script>", "a-b"] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn interface_ids_and_fingerprints() {
        assert!(is_interface_id("hr.employees.EmpService"));
        for bad in [
            "../../etc/passwd",
            "a/b",
            "",
            "<script>",
            "EmpService",
            "hr.empService",
            "Hr.EmpService",
            "hr..EmpService",
            "hr.Emp Service",
        ] {
            assert!(!is_interface_id(bad), "{bad}");
        }
        assert!(is_fingerprint(&format!("sha256:{}", "a".repeat(64))));
        assert!(!is_fingerprint("sha256:../../x"));
        assert!(!is_fingerprint(&format!("sha256:{}", "A".repeat(64))));
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        let long = "a".repeat(10_000);
        assert!(shown(&long).len() < 80);
        assert_eq!(shown("a\nb"), "`a\\nb`");
    }
}
