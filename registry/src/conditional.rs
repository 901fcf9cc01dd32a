//! Conditional GETs (RFC 9110, section 13.1.2): every `GET` answers an
//! `ETag`, and a request whose `If-None-Match` matches it gets `304 Not
//! Modified` with no body. A manifest's tag is its fingerprint; a list's
//! is the SHA-256 of its JSON body.
//!
//! `If-None-Match` uses the weak comparison: `W/"x"` matches `"x"`. `*`
//! matches any representation (every answer that reaches these functions
//! has one); a list of tags matches if any does. A malformed header matches
//! nothing, so the client gets the full answer.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};

/// Whether the request's `If-None-Match` matches `etag` (a quoted tag such
/// as `"sha256:…"`), so the answer is 304. Every `If-None-Match` header
/// line counts.
pub fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    let current = opaque(etag.strip_prefix("W/").unwrap_or(etag));
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| {
            if value.trim() == "*" {
                return true;
            }
            entity_tags(value).is_some_and(|tags| tags.iter().any(|tag| Some(*tag) == current))
        })
}

/// The text between the quotes of `"x"`.
fn opaque(tag: &str) -> Option<&str> {
    tag.strip_prefix('"')?.strip_suffix('"')
}

/// The opaque parts of a comma-separated list of entity tags (`"a", W/"b"`),
/// weak or strong; `None` when the list is malformed.
fn entity_tags(list: &str) -> Option<Vec<&str>> {
    let mut tags = Vec::new();
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return Some(tags);
        }
        rest = rest.strip_prefix("W/").unwrap_or(rest);
        let inner = rest.strip_prefix('"')?;
        let end = inner.find('"')?;
        tags.push(&inner[..end]);
        rest = &inner[end + 1..];
        if !(rest.is_empty() || rest.starts_with([' ', '\t', ','])) {
            return None;
        }
    }
}

/// `304 Not Modified` with the tag (and the caching rule) it confirms.
pub fn not_modified(etag: &str, cache_control: Option<&str>) -> Response {
    let mut response = StatusCode::NOT_MODIFIED.into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    if let Some(value) = cache_control.and_then(|v| HeaderValue::from_str(v).ok()) {
        headers.insert(header::CACHE_CONTROL, value);
    }
    response
}

/// `value` as a JSON answer tagged with the SHA-256 of its bytes, or 304
/// when the client holds that tag. Revalidated on every use (`no-cache`):
/// lists change with every publish.
pub fn json_response(headers: &HeaderMap, value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).expect("answers always serialise");
    let etag = format!("\"sha256:{}\"", hex::encode(Sha256::digest(&body)));
    if none_match(headers, &etag) {
        return not_modified(&etag, Some("no-cache"));
    }
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, "no-cache".to_owned()),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(value: &str, etag: &str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_str(value).unwrap());
        none_match(&headers, etag)
    }

    #[test]
    fn if_none_match_uses_the_weak_comparison_over_a_list() {
        assert!(matches("\"a\"", "\"a\""));
        assert!(matches("W/\"a\"", "\"a\""));
        assert!(matches("\"b\", W/\"a\"", "\"a\""));
        assert!(matches("\"b\",\"a\"", "\"a\""));
        assert!(matches("*", "\"a\""));
        assert!(matches("\"x,y\"", "\"x,y\""), "a comma inside a tag");
        assert!(!matches("\"b\"", "\"a\""));
        assert!(!matches("\"ab\"", "\"a\""));
        assert!(!matches("a", "\"a\""), "unquoted is malformed");
        assert!(!matches("\"a\"x", "\"a\""), "junk after a tag is malformed");
        assert!(!matches("", "\"a\""));
        assert!(!matches("\"a", "\"a\""));
    }

    #[test]
    fn no_header_matches_nothing() {
        assert!(!none_match(&HeaderMap::new(), "\"a\""));
    }
}
