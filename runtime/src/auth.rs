//! The one bearer-token check of rfidl's HTTP surfaces: the diagnostics
//! routes of a service ([`crate::diagnostics`]) and the registry's writes
//! (`rfidl-registry` uses this function too, so the two cannot drift).
//!
//! * The scheme is case-insensitive (RFC 9110, section 11.1): `Bearer`,
//!   `bearer` and `BEARER` all count; spaces around the token are ignored.
//! * An empty expected token fails closed: nothing is authorised, not even
//!   a request without an `Authorization` header.
//! * The comparison takes the same time wherever the tokens differ.

/// The token of an `Authorization: Bearer <token>` value; `None` for
/// another scheme or an empty token.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether the `Authorization` header value `authorization` (if any)
/// carries `expected`. An empty `expected` authorises nothing.
pub fn bearer_matches(authorization: Option<&str>, expected: &str) -> bool {
    let presented = authorization.and_then(bearer_token).unwrap_or("");
    !expected.is_empty() && constant_time_eq(presented.as_bytes(), expected.as_bytes())
}

/// [`bearer_matches`] on a request's headers.
pub fn authorized(headers: &axum::http::HeaderMap, expected: &str) -> bool {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    bearer_matches(value, expected)
}

/// Compares without an early exit, so the time taken says nothing about
/// how much of the token matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_is_case_insensitive_and_spaces_do_not_matter() {
        for value in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "  Bearer   s3cret  ",
        ] {
            assert!(bearer_matches(Some(value), "s3cret"), "{value:?}");
        }
    }

    #[test]
    fn a_missing_wrong_or_other_scheme_token_is_refused() {
        for value in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("Basic s3cret"),
            Some("s3cret"),
            Some("Bearers3cret"),
        ] {
            assert!(!bearer_matches(value, "s3cret"), "{value:?}");
        }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }

    #[test]
    fn an_empty_expected_token_authorises_nothing() {
        // The old diagnostics check let a request without any
        // `Authorization` header through when the token was "".
        for value in [None, Some(""), Some("Bearer "), Some("Bearer x")] {
            assert!(!bearer_matches(value, ""), "{value:?}");
        }
    }
}
