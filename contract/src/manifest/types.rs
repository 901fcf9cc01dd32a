//! Type references in their canonical text form: `uuid`, `list<common.Money>`,
//! `map<string, hr.employees.Employee>`, `string?`. Named types are always
//! fully qualified (`package.Name`), so a manifest stands on its own.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The contract language's scalar types.
///
/// Each variant's doc says what the type holds and its JSON form on the
/// wire; the Rust type generated for it is in `docs/language.md`, "Types".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scalar {
    /// `bool`: `true` or `false`.
    Bool,
    /// `i32`: a signed 32-bit integer, a JSON number.
    I32,
    /// `i64`: a signed 64-bit integer, a plain JSON number (peers that read
    /// numbers as doubles lose precision beyond 2^53).
    I64,
    /// `u32`: an unsigned 32-bit integer, a JSON number.
    U32,
    /// `u64`: an unsigned 64-bit integer, a plain JSON number.
    U64,
    /// `f64`: an IEEE double, a JSON number; finite only (JSON has no `NaN`
    /// or infinity).
    F64,
    /// `string`: UTF-8 text.
    String,
    /// `bytes`: raw bytes, a JSON string in standard base64 with padding.
    Bytes,
    /// `uuid`: a UUID, a JSON string, hyphenated lowercase.
    Uuid,
    /// `timestamp`: an instant in UTC, a JSON string in RFC 3339
    /// (`"2026-11-23T10:15:00Z"`).
    Timestamp,
    /// `date`: a calendar date, a JSON string `"YYYY-MM-DD"`.
    Date,
    /// `duration`: a length of time in whole milliseconds, a JSON string in
    /// the `"1h30m"` form (`rfidl-duration`).
    Duration,
    /// `decimal`: an exact decimal number, a JSON string (`"1250.00"`),
    /// never a JSON float.
    Decimal,
    /// `json`: any JSON value, carried as is.
    Json,
}

impl Scalar {
    /// Every scalar, in the order of the variants.
    pub const ALL: [Scalar; 14] = [
        Scalar::Bool,
        Scalar::I32,
        Scalar::I64,
        Scalar::U32,
        Scalar::U64,
        Scalar::F64,
        Scalar::String,
        Scalar::Bytes,
        Scalar::Uuid,
        Scalar::Timestamp,
        Scalar::Date,
        Scalar::Duration,
        Scalar::Decimal,
        Scalar::Json,
    ];

    /// The keyword as written in contracts.
    pub fn keyword(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::I32 => "i32",
            Scalar::I64 => "i64",
            Scalar::U32 => "u32",
            Scalar::U64 => "u64",
            Scalar::F64 => "f64",
            Scalar::String => "string",
            Scalar::Bytes => "bytes",
            Scalar::Uuid => "uuid",
            Scalar::Timestamp => "timestamp",
            Scalar::Date => "date",
            Scalar::Duration => "duration",
            Scalar::Decimal => "decimal",
            Scalar::Json => "json",
        }
    }

    /// The scalar a contract keyword names (`"uuid"` -> [`Scalar::Uuid`]);
    /// `None` for anything else, other spellings (`"Bool"`) included.
    pub fn from_keyword(word: &str) -> Option<Scalar> {
        // A `match` rather than a search of `ALL`: the checker asks this for
        // every type it resolves.
        Some(match word {
            "bool" => Scalar::Bool,
            "i32" => Scalar::I32,
            "i64" => Scalar::I64,
            "u32" => Scalar::U32,
            "u64" => Scalar::U64,
            "f64" => Scalar::F64,
            "string" => Scalar::String,
            "bytes" => Scalar::Bytes,
            "uuid" => Scalar::Uuid,
            "timestamp" => Scalar::Timestamp,
            "date" => Scalar::Date,
            "duration" => Scalar::Duration,
            "decimal" => Scalar::Decimal,
            "json" => Scalar::Json,
            _ => return None,
        })
    }
}

/// A resolved type reference.
///
/// Its text form ([`Display`](fmt::Display), [`FromStr`], and serde, which
/// uses the text) is the canonical one of the module docs: `list<common.Money>`,
/// `map<string, hr.employees.Employee>`, `string?`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeRef {
    /// A built-in scalar: `uuid`, `string`, ….
    Scalar(Scalar),
    /// A record or enum, fully qualified: `common.Money`.
    Named(String),
    /// `list<T>`: an ordered sequence, a JSON array (`Vec<T>` in Rust).
    List(Box<TypeRef>),
    /// `map<string, T>`: keys are always strings.
    Map(Box<TypeRef>),
    /// `T?`: the value may be missing (JSON member absent or `null`,
    /// `Option<T>` in Rust). A field or parameter of this type is optional,
    /// which is what makes adding one a compatible change.
    Optional(Box<TypeRef>),
}

impl TypeRef {
    /// Named types this reference mentions, in order.
    pub fn named(&self) -> Vec<&str> {
        match self {
            TypeRef::Scalar(_) => Vec::new(),
            TypeRef::Named(name) => vec![name.as_str()],
            TypeRef::List(inner) | TypeRef::Map(inner) | TypeRef::Optional(inner) => inner.named(),
        }
    }
}

impl fmt::Display for TypeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeRef::Scalar(scalar) => f.write_str(scalar.keyword()),
            TypeRef::Named(name) => f.write_str(name),
            TypeRef::List(inner) => write!(f, "list<{inner}>"),
            TypeRef::Map(inner) => write!(f, "map<string, {inner}>"),
            TypeRef::Optional(inner) => write!(f, "{inner}?"),
        }
    }
}

/// A type text that is not in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid type reference `{0}`")]
pub struct TypeRefError(String);

impl FromStr for TypeRef {
    type Err = TypeRefError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // Parsing recurses once per `list<`, `map<` and `?`: refuse deeper
        // nesting than a contract allows before recursing, so a hostile
        // manifest (`list<list<…` a million deep) cannot overflow the stack.
        let depth = text.bytes().filter(|b| matches!(b, b'<' | b'?')).count();
        if depth > 2 * crate::limits::MAX_TYPE_DEPTH + 1 {
            return Err(TypeRefError(format!(
                "{}… (nested deeper than {} levels)",
                text.chars().take(40).collect::<String>(),
                crate::limits::MAX_TYPE_DEPTH
            )));
        }
        let err = || TypeRefError(text.chars().take(200).collect());
        let text = text.trim();
        if let Some(inner) = text.strip_suffix('?') {
            return Ok(TypeRef::Optional(Box::new(
                inner.parse().map_err(|_| err())?,
            )));
        }
        if let Some(inner) = text.strip_prefix("list<").and_then(|t| t.strip_suffix('>')) {
            return Ok(TypeRef::List(Box::new(inner.parse().map_err(|_| err())?)));
        }
        if let Some(inner) = text.strip_prefix("map<").and_then(|t| t.strip_suffix('>')) {
            let value = inner
                .trim_start()
                .strip_prefix("string")
                .and_then(|t| t.trim_start().strip_prefix(','));
            let value = value.ok_or_else(err)?;
            return Ok(TypeRef::Map(Box::new(value.parse().map_err(|_| err())?)));
        }
        if let Some(scalar) = Scalar::from_keyword(text) {
            return Ok(TypeRef::Scalar(scalar));
        }
        let is_name = !text.is_empty()
            && text.split('.').all(|part| {
                part.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && part.chars().all(|c| c.is_alphanumeric() || c == '_')
            });
        if is_name && text.contains('.') {
            Ok(TypeRef::Named(text.to_owned()))
        } else {
            Err(err())
        }
    }
}

impl Serialize for TypeRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TypeRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scalar_keyword_reads_back() {
        for scalar in Scalar::ALL {
            assert_eq!(Scalar::from_keyword(scalar.keyword()), Some(scalar));
        }
        for other in ["", "Bool", "int", "string?", "i32 ", "jsonb"] {
            assert_eq!(Scalar::from_keyword(other), None, "{other}");
        }
    }

    #[test]
    fn text_form_round_trips() {
        for text in [
            "uuid",
            "common.Money",
            "list<string>",
            "map<string, hr.employees.Employee>",
            "list<map<string, list<date>?>>?",
            "string?",
        ] {
            let parsed: TypeRef = text.parse().expect(text);
            assert_eq!(parsed.to_string(), text);
        }
        for bad in ["", "Money", "map<i32, string>", "list<", "str ing", "1x.Y"] {
            assert!(bad.parse::<TypeRef>().is_err(), "{bad}");
        }
        // Deep nesting is refused before the parser recurses into it.
        let deep = format!(
            "{}string{}",
            "list<".repeat(1_000_000),
            ">".repeat(1_000_000)
        );
        assert!(deep.parse::<TypeRef>().is_err());
        assert!(
            format!("string{}", "?".repeat(1_000_000))
                .parse::<TypeRef>()
                .is_err()
        );
    }
}
