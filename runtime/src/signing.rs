//! Standard Webhooks signing and verification (HMAC-SHA256).
//!
//! `webhook-signature: v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`,
//! several space-separated entries allowed; secrets are `whsec_<base64 key>`.
//! Comparison is constant-time. This module never reads the body as JSON: it
//! signs and checks exact bytes.
//!
//! Verification costs one HMAC over the body per configured secret, whatever
//! the header holds: every secret's tag is computed once and each `v1`
//! entry is compared against all of them, and a header with more than
//! [`MAX_SIGNATURES`] `v1` entries is refused before any HMAC is computed
//! (`too_many_signatures`). A request can therefore never make the receiver
//! hash its body more often than the operator has secrets for its source.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Header carrying the message id (the envelope's `messageId`).
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying integer Unix seconds at send time.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying one or more `v1,<base64>` signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// The most `v1,` entries a `webhook-signature` header may carry; more is
/// refused (401 `too_many_signatures`) before any HMAC is computed. A sender
/// rotating keys signs with two or three; eight leaves room for the rest.
pub const MAX_SIGNATURES: usize = 8;

const SECRET_PREFIX: &str = "whsec_";

type HmacSha256 = Hmac<Sha256>;
/// A computed tag; its `==` is constant-time.
type Tag = hmac::digest::CtOutput<HmacSha256>;

/// Standard alphabet, padding optional: secrets are often pasted unpadded.
const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// A signing key, parsed from its `whsec_<base64>` form.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Why a secret string was refused by [`Secret::parse`]. The messages never
/// quote the secret; fix the configured value (an entry of `peers.<id>`,
/// a destination's `secret`, or the secret file it was read from).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The text (after trimming whitespace) does not start with `whsec_`.
    #[error("a signing secret must start with `whsec_`")]
    MissingPrefix,
    /// What follows `whsec_` is not standard base64 (padding optional); the
    /// payload is the decoder's reason (a position or length, not the
    /// secret).
    #[error("a signing secret must be `whsec_` followed by standard base64: {0}")]
    Base64(String),
    /// The key decodes to fewer than 16 bytes (the payload: how many it
    /// holds). Generate at least 16 random bytes; 24 or 32 is usual.
    #[error("a signing secret must hold at least 16 key bytes (it holds {0})")]
    TooShort(usize),
}

impl Secret {
    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = LENIENT
            .decode(encoded)
            .map_err(|e| SecretError::Base64(e.to_string()))?;
        if key.len() < 16 {
            return Err(SecretError::TooShort(key.len()));
        }
        Ok(Self { key })
    }

    /// Wraps raw key bytes.
    pub fn from_bytes(key: impl Into<Vec<u8>>) -> Self {
        Self { key: key.into() }
    }

    /// A fresh random 32-byte secret.
    pub fn generate() -> Self {
        let key: [u8; 32] = rand::random();
        Self { key: key.to_vec() }
    }

    /// The `whsec_<base64>` form.
    pub fn to_whsec(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.key))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC accepts any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// `v1,<base64 signature>` for one message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self.mac(id, timestamp, body).finalize().into_bytes();
        format!("v1,{}", STANDARD.encode(tag))
    }
}

/// The three headers of a signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureHeaders {
    /// [`HEADER_ID`]: the message id, which must equal the envelope's
    /// `messageId` (else 400 `id_mismatch`).
    pub id: String,
    /// [`HEADER_TIMESTAMP`]: Unix seconds at signing time; a receiver
    /// refuses it beyond `inbox.signature_tolerance` (5 min by default)
    /// from its own clock.
    pub timestamp: i64,
    /// [`HEADER_SIGNATURE`]: one `v1,<base64>` entry per secret, separated
    /// by spaces (at most [`MAX_SIGNATURES`] are accepted).
    pub signature: String,
}

impl SignatureHeaders {
    /// Signs `body` with every secret (a sender rotating keys may send both).
    pub fn sign(id: &str, timestamp: i64, body: &[u8], secrets: &[Secret]) -> Self {
        let signature = secrets
            .iter()
            .map(|s| s.sign(id, timestamp, body))
            .collect::<Vec<_>>()
            .join(" ");
        Self {
            id: id.to_owned(),
            timestamp,
            signature,
        }
    }

    /// `(name, value)` pairs, ready to put on a request.
    pub fn to_pairs(&self) -> [(&'static str, String); 3] {
        [
            (HEADER_ID, self.id.clone()),
            (HEADER_TIMESTAMP, self.timestamp.to_string()),
            (HEADER_SIGNATURE, self.signature.clone()),
        ]
    }
}

/// Why a request's signature was refused. Each maps to a 401 error code
/// ([`code`](Self::code)); nothing was written for the request.
///
/// An rfidl sender retries every one of them with backoff: counted, then
/// `DeadLetter` after `max_retries` (a secret may be rotating), except
/// [`TimestampOutOfRange`](Self::TimestampOutOfRange), which it retries
/// uncounted as a clock problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// `missing_header`: the named header (one of [`HEADER_ID`],
    /// [`HEADER_TIMESTAMP`], [`HEADER_SIGNATURE`]) is absent or empty, the
    /// timestamp is not an integer, or the signature header has no
    /// `version,signature` entry at all.
    #[error("missing or malformed `{0}` header")]
    MissingHeader(&'static str),
    /// `bad_signature`: no `v1` entry matches any of the source's secrets
    /// (entries of other versions are ignored). Usually the two sides hold
    /// different secrets, or the body was changed after signing (a proxy
    /// re-encoding JSON).
    #[error("no `v1` signature matches any secret configured for this source")]
    BadSignature,
    /// `too_many_signatures`: more than [`MAX_SIGNATURES`] `v1` entries;
    /// refused before any HMAC is computed.
    #[error(
        "`webhook-signature` carries {found} `v1` entries; at most {MAX_SIGNATURES} are accepted"
    )]
    TooManySignatures {
        /// The number of `v1` entries in the header.
        found: usize,
    },
    /// `timestamp_out_of_range`: the signing time is further from the
    /// receiver's clock than the tolerance (exactly the tolerance is still
    /// inside). A clock problem on one side, or a request replayed late;
    /// fix the clocks (NTP), the message itself is fine.
    #[error(
        "webhook-timestamp {timestamp} is {skew_secs} s away from now, outside the {tolerance_secs} s tolerance"
    )]
    TimestampOutOfRange {
        /// The header's value, Unix seconds.
        timestamp: i64,
        /// The receiver's now less `timestamp`, in seconds: positive when
        /// the signature is older than the receiver's clock, negative when
        /// it is from the future.
        skew_secs: i64,
        /// The tolerance (`inbox.signature_tolerance`), in seconds.
        tolerance_secs: u64,
    },
}

impl VerifyError {
    /// The wire error code (`wire-protocol.md`, order of checks, step 4).
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::MissingHeader(_) => "missing_header",
            VerifyError::BadSignature => "bad_signature",
            VerifyError::TooManySignatures { .. } => "too_many_signatures",
            VerifyError::TimestampOutOfRange { .. } => "timestamp_out_of_range",
        }
    }
}

/// Verifies raw header values against `body`. `now` is Unix seconds.
///
/// Header presence and shape are checked first, then the number of `v1`
/// entries (at most [`MAX_SIGNATURES`]), then the timestamp window (exactly
/// `tolerance` away is inside), then the signatures: any `v1` entry that
/// matches any secret is enough; entries of other versions are ignored.
/// Each secret's tag is computed once, however many entries there are.
pub fn verify(
    id: Option<&str>,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    secrets: &[Secret],
    now: i64,
    tolerance: Duration,
) -> Result<(), VerifyError> {
    let id = id
        .filter(|v| !v.is_empty())
        .ok_or(VerifyError::MissingHeader(HEADER_ID))?;
    let timestamp: i64 = timestamp
        .and_then(|v| v.trim().parse().ok())
        .ok_or(VerifyError::MissingHeader(HEADER_TIMESTAMP))?;
    let signature = signature
        .filter(|v| !v.trim().is_empty())
        .ok_or(VerifyError::MissingHeader(HEADER_SIGNATURE))?;
    let mut saw_entry = false;
    let mut candidates = Vec::new();
    for entry in signature.split_whitespace() {
        let Some((version, encoded)) = entry.split_once(',') else {
            continue;
        };
        saw_entry = true;
        if version != "v1" {
            continue;
        }
        candidates.push(encoded);
    }
    if candidates.len() > MAX_SIGNATURES {
        return Err(VerifyError::TooManySignatures {
            found: candidates.len(),
        });
    }
    if !saw_entry {
        return Err(VerifyError::MissingHeader(HEADER_SIGNATURE));
    }
    let skew = now.saturating_sub(timestamp);
    if skew.unsigned_abs() > tolerance.as_secs() {
        return Err(VerifyError::TimestampOutOfRange {
            timestamp,
            skew_secs: skew,
            tolerance_secs: tolerance.as_secs(),
        });
    }
    // Only entries of a tag's length can match; decoding them is cheap.
    let tags: Vec<Tag> = candidates
        .into_iter()
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .filter(|tag| tag.len() == TAG_LEN)
        .map(|tag| {
            Tag::new(hmac::digest::generic_array::GenericArray::clone_from_slice(
                &tag,
            ))
        })
        .collect();
    if tags.is_empty() {
        return Err(VerifyError::BadSignature);
    }
    let matched = secrets.iter().any(|secret| {
        let expected = secret.mac(id, timestamp, body).finalize();
        // No early exit across entries: each comparison is constant-time and
        // all of them run, so timing says nothing about which entry matched.
        tags.iter()
            .fold(false, |found, tag| (*tag == expected) | found)
    });
    if matched {
        Ok(())
    } else {
        Err(VerifyError::BadSignature)
    }
}

/// Refuses a `webhook-signature` header with more than [`MAX_SIGNATURES`]
/// `v1` entries. [`verify`] checks this too; a receiver calls it first, before
/// it reads the body, so such a request costs no more than its headers.
pub fn check_signature_count(signature: Option<&str>) -> Result<(), VerifyError> {
    let found = signature
        .unwrap_or_default()
        .split_whitespace()
        .filter(|entry| entry.starts_with("v1,"))
        .count();
    if found > MAX_SIGNATURES {
        return Err(VerifyError::TooManySignatures { found });
    }
    Ok(())
}

/// The length of an HMAC-SHA256 tag, in bytes.
const TAG_LEN: usize = 32;

/// Current Unix time in whole seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOLERANCE: Duration = Duration::from_secs(300);

    // Test vector from the Standard Webhooks specification's reference libraries.
    #[test]
    fn matches_the_standard_webhooks_reference_vector() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let body = br#"{"test": 2432232314}"#;
        let signature = secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn verifies_valid_and_rejects_each_fault() {
        let secret = Secret::generate();
        let other = Secret::generate();
        let body = b"{\"a\":1}";
        let now = 1_700_000_000;
        let headers = SignatureHeaders::sign("id1", now, body, std::slice::from_ref(&secret));
        let ts = now.to_string();
        let check = |id, ts: &str, sig: &str, body: &[u8], secrets: &[Secret], now| {
            verify(Some(id), Some(ts), Some(sig), body, secrets, now, TOLERANCE)
        };
        assert_eq!(
            check(
                "id1",
                &ts,
                &headers.signature,
                body,
                std::slice::from_ref(&secret),
                now
            ),
            Ok(())
        );
        // Rotation: the receiver holds old and new; the sender signs with either.
        assert_eq!(
            check(
                "id1",
                &ts,
                &headers.signature,
                body,
                &[other.clone(), secret.clone()],
                now
            ),
            Ok(())
        );
        assert_eq!(
            check(
                "id1",
                &ts,
                &headers.signature,
                body,
                std::slice::from_ref(&other),
                now
            ),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            check(
                "id1",
                &ts,
                &headers.signature,
                b"{\"a\":2}",
                std::slice::from_ref(&secret),
                now
            ),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            check(
                "id2",
                &ts,
                &headers.signature,
                body,
                std::slice::from_ref(&secret),
                now
            ),
            Err(VerifyError::BadSignature)
        );
        // Exactly the tolerance is inside; one second more is outside, both ways.
        assert_eq!(
            check(
                "id1",
                &ts,
                &headers.signature,
                body,
                std::slice::from_ref(&secret),
                now + 300
            ),
            Ok(())
        );
        assert!(matches!(
            check(
                "id1",
                &ts,
                &headers.signature,
                body,
                std::slice::from_ref(&secret),
                now + 301
            ),
            Err(VerifyError::TimestampOutOfRange { .. })
        ));
        assert!(matches!(
            check(
                "id1",
                &ts,
                &headers.signature,
                body,
                std::slice::from_ref(&secret),
                now - 301
            ),
            Err(VerifyError::TimestampOutOfRange { .. })
        ));
        // Other version prefixes are ignored, not fatal.
        let mixed = format!("v2,AAAA {}", headers.signature);
        assert_eq!(
            check("id1", &ts, &mixed, body, std::slice::from_ref(&secret), now),
            Ok(())
        );
        assert_eq!(
            verify(
                Some("id1"),
                None,
                Some(&headers.signature),
                body,
                std::slice::from_ref(&secret),
                now,
                TOLERANCE
            ),
            Err(VerifyError::MissingHeader(HEADER_TIMESTAMP))
        );
        assert_eq!(
            check(
                "id1",
                "soon",
                &headers.signature,
                body,
                std::slice::from_ref(&secret),
                now
            ),
            Err(VerifyError::MissingHeader(HEADER_TIMESTAMP))
        );
        assert_eq!(
            check(
                "id1",
                &ts,
                "garbage",
                body,
                std::slice::from_ref(&secret),
                now
            ),
            Err(VerifyError::MissingHeader(HEADER_SIGNATURE))
        );
    }

    #[test]
    fn at_most_max_signatures_v1_entries_are_read() {
        let secret = Secret::generate();
        let body = b"{}";
        let now = 1_700_000_000;
        let ts = now.to_string();
        let valid = secret.sign("id1", now, body);
        let bogus = Secret::generate().sign("id1", now, body);
        let header = |bogus_entries: usize| {
            let mut entries = vec![bogus.clone(); bogus_entries];
            entries.push(valid.clone());
            entries.join(" ")
        };
        let check = |sig: &str| {
            verify(
                Some("id1"),
                Some(&ts),
                Some(sig),
                body,
                std::slice::from_ref(&secret),
                now,
                TOLERANCE,
            )
        };
        assert_eq!(check(&header(MAX_SIGNATURES - 1)), Ok(()));
        assert_eq!(
            check(&header(MAX_SIGNATURES)),
            Err(VerifyError::TooManySignatures {
                found: MAX_SIGNATURES + 1
            })
        );
        assert_eq!(
            check(&header(999)),
            Err(VerifyError::TooManySignatures { found: 1000 })
        );
        // Entries of other versions do not count against the limit.
        let others = format!("{} {valid}", vec!["v2,AAAA"; 50].join(" "));
        assert_eq!(check(&others), Ok(()));
        // Tags of the wrong length never match and cost no HMAC.
        assert_eq!(check("v1,AAAA v1,!!!"), Err(VerifyError::BadSignature));
    }

    #[test]
    fn secrets_parse_strictly() {
        let secret = Secret::generate();
        assert_eq!(Secret::parse(&secret.to_whsec()), Ok(secret.clone()));
        let unpadded = secret.to_whsec().trim_end_matches('=').to_owned();
        assert_eq!(Secret::parse(&unpadded), Ok(secret));
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(SecretError::MissingPrefix)
        );
        assert!(matches!(
            Secret::parse("whsec_!!!"),
            Err(SecretError::Base64(_))
        ));
        assert_eq!(Secret::parse("whsec_AAAA"), Err(SecretError::TooShort(3)));
    }
}
