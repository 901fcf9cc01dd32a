//! The failed list's paging and grouping: the filter resolved for a store
//! ([`RowFilter`]), the opaque cursor bound to its filter, the error code
//! of a `last_error`, and the folding of a store's groups into
//! [`FailureGroup`]s.
//!
//! Plain logic over values: it never runs a query or serves a route.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;

use super::types::rfc3339;
use super::{AttentionFilter, DiagnosticsError};
use crate::outbox::Status;

/// The filter of the failed list as a store applies it: every member
/// optional, `None` matching everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RowFilter {
    pub status: Option<Status>,
    pub destination: Option<String>,
    pub interface: Option<String>,
    /// The method (`endpoint` column).
    pub method: Option<String>,
    /// Text the `last_error` contains.
    pub error: Option<String>,
    /// Only rows created before this (ms).
    pub created_before: Option<i64>,
    /// Only rows after this (`created_at`, `message_id`) in list order.
    pub after: Option<(i64, String)>,
}

/// One group of `GET /_rf/outbox/failed/groups`: messages of one
/// destination that stopped with one error code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureGroup {
    /// The destination name.
    pub destination: String,
    /// The code of their last error ([`error_code`]).
    pub error_code: String,
    /// How many messages.
    pub count: u64,
    /// When the oldest of them was enqueued (RFC 3339).
    pub oldest: String,
    /// When the newest of them was enqueued (RFC 3339).
    pub newest: String,
}

/// A store's group: destination, last error, rows, oldest and newest
/// `created_at` (ms).
pub(crate) type ErrorGroupRow = (String, Option<String>, i64, i64, i64);

/// The code of a `last_error`: the receiver's code in `"500 handler_failed:
/// …"`, `http_<status>` for a status without one, the text before the first
/// `:` otherwise (a transport error, `time to live exceeded`), `none` when
/// there is no error.
pub fn error_code(last_error: Option<&str>) -> String {
    let Some(text) = last_error.map(str::trim) else {
        return "none".to_owned();
    };
    let mut words = text.split_whitespace();
    if let Some(first) = words.next()
        && first.len() == 3
        && first.bytes().all(|b| b.is_ascii_digit())
    {
        return match words.next() {
            Some(code)
                if code.ends_with(':')
                    && code.len() > 1
                    && code[..code.len() - 1]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                code[..code.len() - 1].to_owned()
            }
            _ => format!("http_{first}"),
        };
    }
    let head = text.split(':').next().unwrap_or(text).trim();
    head.chars().take(60).collect()
}

/// `rows` folded by (destination, error code), sorted by destination then
/// by count, largest first.
pub(crate) fn fold_groups(rows: Vec<ErrorGroupRow>) -> Vec<FailureGroup> {
    let mut by_key: BTreeMap<(String, String), (u64, i64, i64)> = BTreeMap::new();
    for (destination, last_error, count, oldest, newest) in rows {
        let entry = by_key
            .entry((destination, error_code(last_error.as_deref())))
            .or_insert((0, i64::MAX, i64::MIN));
        entry.0 += count.max(0) as u64;
        entry.1 = entry.1.min(oldest);
        entry.2 = entry.2.max(newest);
    }
    let mut groups: Vec<FailureGroup> = by_key
        .into_iter()
        .map(
            |((destination, error_code), (count, oldest, newest))| FailureGroup {
                destination,
                error_code,
                count,
                oldest: rfc3339(oldest),
                newest: rfc3339(newest),
            },
        )
        .collect();
    groups.sort_by(|a, b| {
        a.destination
            .cmp(&b.destination)
            .then(b.count.cmp(&a.count))
            .then(a.error_code.cmp(&b.error_code))
    });
    groups
}

/// The version tag of a cursor.
const CURSOR_VERSION: &str = "c1";

/// A fingerprint of the filter a cursor was made for (FNV-1a, 64 bits, of
/// its members; not a secret, only a binding).
fn filter_fingerprint(filter: &AttentionFilter) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for member in [
        &filter.status,
        &filter.destination,
        &filter.interface,
        &filter.method,
        &filter.error,
        &filter.older_than,
    ] {
        // A marker for absence, a separator after each member.
        let bytes = member.as_deref().map_or(&[0xff][..], str::as_bytes);
        for &byte in bytes.iter().chain(&[0x00]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The cursor of the page after the row (`created_at`, `message_id`) under
/// `filter`.
pub(crate) fn encode_cursor(filter: &AttentionFilter, created_at: i64, message_id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!(
        "{CURSOR_VERSION}.{}.{created_at}.{message_id}",
        filter_fingerprint(filter)
    ))
}

/// The position `cursor` continues from, if it was made for `filter`.
fn decode_cursor(
    filter: &AttentionFilter,
    cursor: &str,
) -> Result<(i64, String), DiagnosticsError> {
    let invalid = || DiagnosticsError::InvalidCursor(cursor.chars().take(80).collect());
    let text = URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(invalid)?;
    let mut parts = text.splitn(4, '.');
    let (Some(CURSOR_VERSION), Some(fingerprint), Some(created_at), Some(message_id)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid());
    };
    let created_at: i64 = created_at.parse().map_err(|_| invalid())?;
    if fingerprint != filter_fingerprint(filter) {
        return Err(DiagnosticsError::CursorMismatch);
    }
    Ok((created_at, message_id.to_owned()))
}

/// `filter` resolved at `now_ms` for a store; `with_cursor` reads its
/// cursor (the list), else a cursor is refused (the groups).
pub(crate) fn resolve(
    filter: &AttentionFilter,
    now_ms: i64,
    with_cursor: bool,
) -> Result<RowFilter, DiagnosticsError> {
    let created_before = filter
        .older_than
        .as_deref()
        .map(|text| {
            crate::duration::parse_duration(text)
                .map(|age| {
                    now_ms.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
                })
                .map_err(|error| {
                    DiagnosticsError::BadRequest(format!(
                        "olderThan `{text}` is not a duration (`30m`, `2h`, `7d`): {error}"
                    ))
                })
        })
        .transpose()?;
    let after = match (&filter.cursor, with_cursor) {
        (None, _) => None,
        (Some(cursor), true) => Some(decode_cursor(filter, cursor)?),
        (Some(_), false) => {
            return Err(DiagnosticsError::BadRequest(
                "`cursor` pages the list only".to_owned(),
            ));
        }
    };
    // No stored value holds a NUL (PostgreSQL's TEXT cannot), and the
    // stores would read one differently: refused alike on every store.
    for (name, value) in [
        ("destination", &filter.destination),
        ("interface", &filter.interface),
        ("method", &filter.method),
        ("error", &filter.error),
    ] {
        if value.as_deref().is_some_and(|text| text.contains('\0')) {
            return Err(DiagnosticsError::BadRequest(format!(
                "`{name}` holds a NUL character"
            )));
        }
    }
    let nonempty = |value: &Option<String>| value.clone().filter(|text| !text.is_empty());
    Ok(RowFilter {
        status: filter.status()?,
        destination: nonempty(&filter.destination),
        interface: nonempty(&filter.interface),
        method: nonempty(&filter.method),
        error: nonempty(&filter.error),
        created_before,
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_of_the_dispatchers_last_errors() {
        for (text, code) in [
            (Some("500 handler_failed: boom"), "handler_failed"),
            (
                Some("422 beyond_dedup_horizon: too old"),
                "beyond_dedup_horizon",
            ),
            (Some("502"), "http_502"),
            (Some("404 Not Found"), "http_404"),
            (Some("time to live exceeded"), "time to live exceeded"),
            (Some("connect: refused"), "connect"),
            (None, "none"),
        ] {
            assert_eq!(error_code(text), code, "{text:?}");
        }
    }

    #[test]
    fn a_nul_in_a_text_filter_is_a_bad_request() {
        let filter = AttentionFilter {
            error: Some("time\0out".into()),
            ..AttentionFilter::default()
        };
        assert!(matches!(
            resolve(&filter, 0, true),
            Err(DiagnosticsError::BadRequest(text)) if text.contains("`error`")
        ));
        let fine = AttentionFilter {
            error: Some("timeout".into()),
            ..AttentionFilter::default()
        };
        assert!(resolve(&fine, 0, true).is_ok());
    }

    #[test]
    fn a_cursor_is_bound_to_its_filter() {
        let filter = AttentionFilter {
            destination: Some("ledger".into()),
            ..AttentionFilter::default()
        };
        let cursor = encode_cursor(&filter, 42, "id-1");
        assert_eq!(decode_cursor(&filter, &cursor), Ok((42, "id-1".to_owned())));
        let other = AttentionFilter {
            destination: Some("billing".into()),
            ..AttentionFilter::default()
        };
        assert_eq!(
            decode_cursor(&other, &cursor),
            Err(DiagnosticsError::CursorMismatch)
        );
        assert!(matches!(
            decode_cursor(&filter, "not a cursor"),
            Err(DiagnosticsError::InvalidCursor(_))
        ));
    }
}
