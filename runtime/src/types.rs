//! The Rust types behind the contract language's scalars, with their JSON forms.
//!
//! Generated code names these through `::rfidl_runtime::types`, so a user crate
//! needs no direct dependency on `uuid`, `jiff` or `rust_decimal`.
//!
//! | contract | Rust | JSON |
//! | --- | --- | --- |
//! | `uuid` | [`Uuid`] | `"0192f0c4-6c1e-7c7a-9b1e-3f1d2a4b5c6d"` |
//! | `timestamp` | [`Timestamp`] (jiff) | RFC 3339 in UTC, `"2026-11-23T10:15:00Z"` |
//! | `date` | [`Date`] (jiff civil date) | `"2026-11-23"` |
//! | `duration` | [`Duration`] | `"1h30m"` (units `d h m s ms`, as `@delivery(ttl)`) |
//! | `decimal` | [`Decimal`] (rust_decimal) | a string, `"12.50"`, never a float |
//! | `bytes` | [`Bytes`] | standard base64 with padding |
//! | `json` | [`Json`] | any JSON value |

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use jiff::Timestamp;
pub use jiff::civil::Date;
pub use rust_decimal::Decimal;
pub use serde_json::Value as Json;
pub use uuid::Uuid;

/// A contract `duration`: whole milliseconds, written `"1h30m"` in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

impl From<std::time::Duration> for Duration {
    fn from(value: std::time::Duration) -> Self {
        Self(value)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(value: Duration) -> Self {
        value.0
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::duration::format_duration(self.0))
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::duration::serde_human::serialize(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::duration::serde_human::deserialize(deserializer).map(Self)
    }
}

/// A contract `bytes`: raw bytes, standard base64 in JSON.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({})", STANDARD.encode(&self.0))
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(value: Vec<u8>) -> Self {
        Self(value)
    }
}

impl From<&[u8]> for Bytes {
    fn from(value: &[u8]) -> Self {
        Self(value.to_vec())
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        STANDARD
            .decode(text.as_bytes())
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_forms_match_the_language_reference() {
        let ts: Timestamp = "2026-11-23T10:15:00Z".parse().expect("timestamp");
        assert_eq!(
            serde_json::to_value(ts).expect("ser"),
            json!("2026-11-23T10:15:00Z")
        );
        let date: Date = "2026-11-23".parse().expect("date");
        assert_eq!(
            serde_json::to_value(date).expect("ser"),
            json!("2026-11-23")
        );
        let amount: Decimal = "12.50".parse().expect("decimal");
        assert_eq!(serde_json::to_value(amount).expect("ser"), json!("12.50"));
        let ttl = Duration(std::time::Duration::from_secs(5400));
        assert_eq!(serde_json::to_value(ttl).expect("ser"), json!("1h30m"));
        assert_eq!(
            serde_json::from_value::<Duration>(json!("48h"))
                .expect("de")
                .0
                .as_secs(),
            172_800
        );
        let bytes = Bytes(b"hi!".to_vec());
        assert_eq!(serde_json::to_value(&bytes).expect("ser"), json!("aGkh"));
        assert_eq!(
            serde_json::from_value::<Bytes>(json!("aGkh")).expect("de"),
            bytes
        );
        assert!(serde_json::from_value::<Bytes>(json!("not base64!")).is_err());
    }
}
