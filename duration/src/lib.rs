//! Human-readable durations (`"500ms"`, `"2s"`, `"5m"`, `"24h"`, `"7d"`, `"1h30m"`).
//!
//! The one parser of this form in rfidl: the contract checker reads
//! `@delivery(ttl = "48h")` with it and the runtime reads `rfidl.yaml` with it,
//! so a value copied from a contract into the configuration means the same
//! thing. A crate of its own because `rfidl-codegen` must not depend on
//! `rfidl-runtime` (nor the other way round); it has no dependencies.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

use std::time::Duration;

/// Error for a duration string that is not of the `"1h30m"` form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid duration `{}`: {} (expected e.g. \"500ms\", \"2s\", \"5m\", \"24h\", \"7d\", \"1h30m\")",
            self.input, self.reason
        )
    }
}

impl std::error::Error for DurationError {}

/// Parses `"1h30m"`-style durations: one or more `<integer><unit>` parts with
/// units `ms`, `s`, `m`, `h`, `d`, largest unit first is not required.
///
/// Parts add up (`"1d12h"` is 36 hours, `"30m1h"` is 90 minutes); white
/// space around the whole text is ignored, none is allowed inside. The
/// result is whole milliseconds.
///
/// # Errors
///
/// [`DurationError`] for an empty text, a part without digits or without a
/// known unit (`"5"`, `"h"`, `"5x"`, `"1.5h"`, `"-1s"`, ISO 8601's
/// `"PT1H"`), or a part too large (its milliseconds beyond `u64::MAX`).
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_owned(),
        reason,
    };
    let mut rest = input.trim();
    if rest.is_empty() {
        return Err(err("empty"));
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let (unit_ms, unit_len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('d') {
            (86_400_000, 1)
        } else {
            return Err(err("missing or unknown unit"));
        };
        rest = &rest[unit_len..];
        let part = value
            .checked_mul(unit_ms)
            .ok_or_else(|| err("number too large"))?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(|| err("number too large"))?;
    }
    Ok(total)
}

/// Formats a duration in the shortest `"1h30m"` form that parses back exactly.
///
/// Largest unit first, zero parts left out (`"1d2h"`, never `"26h"`); zero
/// is `"0s"`. Sub-millisecond precision is dropped (`1.5ms` -> `"1ms"`).
pub fn format_duration(duration: Duration) -> String {
    let mut ms = duration.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_round_trip() {
        for (text, ms) in [
            ("500ms", 500),
            ("2s", 2_000),
            ("5m", 300_000),
            ("23h", 82_800_000),
            ("7d", 604_800_000),
            ("1h30m", 5_400_000),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
            assert_eq!(format_duration(Duration::from_millis(ms)), text);
        }
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
    }

    #[test]
    fn rejects_malformed() {
        for text in ["", "5", "h", "5x", "-1s", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }
}
