//! The dashboard's operator session: how a plain HTML form carries the
//! registry's operator token (`docs/registry.md`, "Acting from the
//! dashboard").
//!
//! A form cannot send a bearer token, and the browser's `Basic` password
//! (how the failed-list page is opened) is sent by the browser with every
//! request to the registry, also with a form another site posts to it: a
//! cross-site request forgery could retry or discard messages. So an
//! action needs a **session** and a **form token**:
//!
//! * `POST /dashboard/sign-in` with the operator token sets the cookie
//!   [`COOKIE`] = `v1.<expires ms>.<HMAC>`: `HttpOnly` (no script reads
//!   it), `SameSite=Strict` (a browser never sends it with a request
//!   another site starts), valid [`LIFETIME`]. The HMAC key is random per
//!   registry process ([`SessionKey`]): the token itself is never in the
//!   cookie, and a restart signs everyone out.
//! * Each form carries `csrf` = HMAC(key, session): a page of the registry
//!   has it, another site cannot read it. Checked in constant time.
//!
//! A script may instead send `Authorization: Bearer <operator token>`
//! (never sent by a browser on its own), which needs no form token.
//!
//! Never: put the operator token in a cookie or page; accept `Basic` for
//! an action.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use hmac::Mac as _;

use crate::access::Access;
use crate::{ApiError, Shared};

/// The session cookie's name.
pub const COOKIE: &str = "rfidl_operator";
/// How long a sign-in lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The key sessions and form tokens are signed with: random, made when
/// the registry is opened, never stored.
#[derive(Clone)]
pub(crate) struct SessionKey(Arc<[u8; 32]>);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    /// A new random key.
    pub fn random() -> Self {
        Self(Arc::new(rand::random()))
    }

    fn mac(&self, purpose: &str, text: &str) -> String {
        let mut mac = HmacSha256::new_from_slice(self.0.as_slice()).expect("any key length");
        mac.update(purpose.as_bytes());
        mac.update(&[0]);
        mac.update(text.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A session valid until `now_ms` + [`LIFETIME`]: the cookie's value.
    pub fn issue(&self, now_ms: i64) -> String {
        let expires = now_ms + LIFETIME.as_millis() as i64;
        format!("v1.{expires}.{}", self.mac("session", &expires.to_string()))
    }

    /// Whether `session` is one this key issued and not expired.
    pub fn is_valid(&self, session: &str, now_ms: i64) -> bool {
        let mut parts = session.splitn(3, '.');
        let (Some("v1"), Some(expires), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let Ok(at) = expires.parse::<i64>() else {
            return false;
        };
        same(mac, &self.mac("session", expires)) && at > now_ms
    }

    /// The form token of `session`.
    pub fn form_token(&self, session: &str) -> String {
        self.mac("csrf", session)
    }
}

/// Whether two strings are equal, in a time that does not depend on where
/// they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The session cookie of the request, if it has one.
pub(crate) fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// The request's valid session, if any.
pub(crate) fn valid_session(shared: &Shared, headers: &HeaderMap, now_ms: i64) -> Option<String> {
    session_of(headers).filter(|s| shared.session_key.is_valid(s, now_ms))
}

/// The `Set-Cookie` of a new session.
pub(crate) fn cookie(session: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        LIFETIME.as_secs()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("rfidl_operator=; Max-Age=0"))
}

/// The `Set-Cookie` that signs out.
pub(crate) fn expired_cookie() -> HeaderValue {
    HeaderValue::from_static("rfidl_operator=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

/// Who is acting, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Actor {
    /// A signed-in browser session, with a matching form token.
    Session,
    /// `Authorization: Bearer <operator token>`.
    Bearer,
}

impl Actor {
    /// As logged.
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Session => "operator session",
            Actor::Bearer => "operator bearer token",
        }
    }
}

/// May this request act (retry, discard)? 403 `operation_disabled` on a
/// closed registry without an operator token; a bearer operator token is
/// enough; otherwise 401 `unauthorized` without a valid session and 403
/// `csrf_mismatch` when `form_token` is not the session's.
pub(crate) fn authorize_action(
    shared: &Shared,
    headers: &HeaderMap,
    form_token: Option<&str>,
    now_ms: i64,
) -> Result<Actor, ApiError> {
    let credentials = &shared.credentials;
    if !credentials.is_open() && credentials.operator.is_none() {
        return Err(ApiError::OperationDisabled(Access::Operator));
    }
    if credentials.operator_bearer(headers) {
        return Ok(Actor::Bearer);
    }
    let session =
        valid_session(shared, headers, now_ms).ok_or(ApiError::Unauthorized(Access::Operator))?;
    let expected = shared.session_key.form_token(&session);
    match form_token {
        Some(token) if same(token, &expected) => Ok(Actor::Session),
        _ => Err(ApiError::CsrfMismatch(
            "the form's `csrf` token is missing or not this session's: reload the page and \
             submit its form again"
                .to_owned(),
        )),
    }
}

/// The path to go back to after signing in: a path of this registry
/// (`/…`, not `//host`), else `/`.
pub(crate) fn local_path(next: Option<&str>) -> String {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && path.len() <= 512
                && path.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            path.to_owned()
        }
        _ => "/".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_signed_and_expire() {
        let key = SessionKey::random();
        let session = key.issue(1_000);
        assert!(key.is_valid(&session, 1_000));
        assert!(!key.is_valid(&session, 1_000 + LIFETIME.as_millis() as i64));
        assert!(
            !SessionKey::random().is_valid(&session, 1_000),
            "another key"
        );
        let longer = session.replacen("v1.", "v1.9", 1);
        assert!(!key.is_valid(&longer, 1_000), "a changed expiry");
        for odd in ["", "v1", "v1.x.y", "v2.1.2", "v1..", "v1.1"] {
            assert!(!key.is_valid(odd, 0), "{odd}");
        }
        assert_ne!(key.form_token(&session), key.form_token(&key.issue(2_000)));
    }

    #[test]
    fn only_local_paths_are_followed_after_sign_in() {
        assert_eq!(
            local_path(Some("/services/hr/failures")),
            "/services/hr/failures"
        );
        for odd in [
            None,
            Some("//evil.example/"),
            Some("https://x"),
            Some("/\\x"),
            Some(""),
        ] {
            assert_eq!(local_path(odd), "/", "{odd:?}");
        }
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; rfidl_operator=v1.5.ab; c=d"),
        );
        assert_eq!(session_of(&headers).as_deref(), Some("v1.5.ab"));
        assert_eq!(session_of(&HeaderMap::new()), None);
    }
}
