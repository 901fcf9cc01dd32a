//! Human-readable durations (`"500ms"`, `"2s"`, `"5m"`, `"24h"`, `"7d"`, `"1h30m"`).
//!
//! The same form the contract language uses for `@delivery(ttl = "48h")`, so a
//! value copied from a contract into `rfidl.yaml` means the same thing: both
//! use the one parser in the `rfidl-duration` crate (its tests live there).

pub use rfidl_duration::{DurationError, format_duration, parse_duration};

/// `serde(with = "rfidl_runtime::duration::serde_human")` for `Duration` fields.
pub mod serde_human {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the duration in the human form (`"1h30m"`, `"500ms"`), as
    /// [`format_duration`](super::format_duration) does.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*value))
    }

    /// Reads a string in the human form; a bare number or an unknown unit
    /// is an error naming the accepted form (see
    /// [`parse_duration`](super::parse_duration)).
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}
