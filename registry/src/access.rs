//! Who may do what at the registry (`docs/registry.md`, "Credentials" and
//! "Threat model"), and what the registry may reach on the network.
//!
//! Three credentials, each a bearer token:
//!
//! * the **publish token** publishes manifests;
//! * a **registration credential** registers an instance and renews it with
//!   heartbeats; an instance is bound to the SHA-256 of the credential that
//!   registered it ([`Registrant`]), so holders of different credentials
//!   cannot rewrite each other's instances (several may be configured: one
//!   per service, or per instance);
//! * the **operator token** decommissions, re-commissions, deletes
//!   instances, opens the dashboard's failed-list page and signs in to
//!   retry and discard from the dashboard (`crate::session`).
//!
//! A registry with none of them is **open** (a loopback dev registry: the
//! binary refuses to listen beyond loopback so); as soon as one is
//! configured the registry is **closed**: an operation whose credential is
//! not configured is refused (403 `operation_disabled`), never open.
//!
//! Also here: the optional allow-list of networks for registered base URLs
//! (checked at registration, and again at connect time by the resolver of
//! every client the registry uses, so a host name cannot be re-pointed
//! elsewhere later) and the per-service registration rate limit.
//!
//! Never: print, log or answer a credential; compare one in variable time.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use base64::Engine as _;
use sha2::Digest as _;

use crate::ApiError;

/// What a request wants to do, by the credential it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Publish a manifest: the publish token.
    Publish,
    /// Register an instance or renew it: a registration credential.
    Registration,
    /// Decommission, re-commission, delete an instance, read an instance's
    /// failed list, retry or discard from the dashboard: the operator token.
    Operator,
}

impl Access {
    /// The credential's name, as the flags spell it.
    pub fn credential(self) -> &'static str {
        match self {
            Access::Publish => "publish token",
            Access::Registration => "registration token",
            Access::Operator => "operator token",
        }
    }

    /// The flag that configures it.
    pub fn flag(self) -> &'static str {
        match self {
            Access::Publish => "--publish-token-file",
            Access::Registration => "--registration-token-file",
            Access::Operator => "--operator-token-file",
        }
    }
}

/// The configured credentials. Debug never shows them.
#[derive(Clone, Default)]
pub(crate) struct Credentials {
    pub publish: Option<String>,
    pub operator: Option<String>,
    pub registration: Vec<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("publish", &self.publish.is_some())
            .field("operator", &self.operator.is_some())
            .field("registration", &self.registration.len())
            .finish()
    }
}

impl Credentials {
    /// No credential at all: every operation is allowed (a dev registry).
    pub fn is_open(&self) -> bool {
        self.publish.is_none() && self.operator.is_none() && self.registration.is_empty()
    }

    /// 401 without the credential `access` needs, 403 `operation_disabled`
    /// when the registry is closed and that credential is not configured.
    pub fn authorize(&self, headers: &HeaderMap, access: Access) -> Result<(), ApiError> {
        if self.is_open() {
            return Ok(());
        }
        let presented = presented(headers);
        let presented = presented.as_deref();
        let accepted = match access {
            Access::Publish => self.publish.as_deref().map(|t| matches(presented, t)),
            Access::Operator => self.operator.as_deref().map(|t| matches(presented, t)),
            Access::Registration => (!self.registration.is_empty()).then(|| {
                self.registration
                    .iter()
                    .fold(false, |any, t| matches(presented, t) | any)
            }),
        };
        match accepted {
            Some(true) => Ok(()),
            Some(false) => Err(ApiError::Unauthorized(access)),
            None => Err(ApiError::OperationDisabled(access)),
        }
    }

    /// Whether `presented` (a sign-in form's field) is the operator token:
    /// the same answers as [`Credentials::authorize`] for
    /// [`Access::Operator`]; on an open registry anything is.
    pub fn authorize_operator_token(&self, presented: &str) -> Result<(), ApiError> {
        if self.is_open() {
            return Ok(());
        }
        match self.operator.as_deref() {
            None => Err(ApiError::OperationDisabled(Access::Operator)),
            Some(token) if matches(Some(presented), token) => Ok(()),
            Some(_) => Err(ApiError::Unauthorized(Access::Operator)),
        }
    }

    /// Whether the request carries the operator token as a bearer token
    /// (not as `Basic`: a browser sends that one on its own, also with a
    /// form another site posts).
    pub fn operator_bearer(&self, headers: &HeaderMap) -> bool {
        let Some(token) = self.operator.as_deref() else {
            return false;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(rfidl_runtime::auth::bearer_token);
        bearer.is_some() && matches(bearer, token)
    }

    /// [`Credentials::authorize`] for a registration or heartbeat, and who
    /// is asking: the SHA-256 of the presented bearer token (on an open
    /// registry, of whatever was presented, or of nothing).
    pub fn registrant(&self, headers: &HeaderMap) -> Result<Registrant, ApiError> {
        self.authorize(headers, Access::Registration)?;
        Ok(Registrant::of(presented(headers).as_deref().unwrap_or("")))
    }

    /// Whether `owner` is the digest of a credential this registry still
    /// accepts (a retired one no longer protects its instances from an
    /// identical re-registration: that is how credentials are rotated).
    pub fn is_live(&self, owner: &str) -> bool {
        self.registration
            .iter()
            .any(|t| !t.is_empty() && Registrant::of(t).0 == owner)
    }
}

/// Who registered an instance: `sha256:<hex>` of the credential presented.
/// Stored with the instance; the credential itself never is. (Keys the
/// registry may issue at registration will be bound to this identity.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registrant(pub String);

impl Registrant {
    fn of(credential: &str) -> Self {
        Self(format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(credential.as_bytes()))
        ))
    }
}

/// The bearer token of the request, or the password of a `Basic`
/// authorization (a browser can send that one: the failed-list page asks
/// for it, with any user name).
fn presented(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    if let Some(token) = rfidl_runtime::auth::bearer_token(value) {
        return Some(token.to_owned());
    }
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_, password) = text.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

/// Whether `presented` is `expected`, in a time that does not depend on
/// where they differ; an empty `expected` matches nothing.
fn matches(presented: Option<&str>, expected: &str) -> bool {
    let presented = presented.unwrap_or("").as_bytes();
    let expected_bytes = expected.as_bytes();
    !expected.is_empty()
        && presented.len() == expected_bytes.len()
        && presented
            .iter()
            .zip(expected_bytes)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// One network of the allow-list, e.g. `10.0.0.0/8` or `fd00::/8` (a bare
/// address is that address alone).
///
/// The parsing and matching are `ipnet`'s (already in the dependency tree
/// through the HTTP client; its IPv6 and prefix edge cases are tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network(ipnet::IpNet);

impl FromStr for Network {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(net) = text.parse::<ipnet::IpNet>() {
            return Ok(Self(net.trunc()));
        }
        text.parse::<IpAddr>()
            .map(|ip| Self(ipnet::IpNet::from(ip)))
            .map_err(|_| format!("`{text}` is not a network like 10.0.0.0/8 or fd00::/8"))
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Network {
    /// Whether `ip` is inside (an IPv4-mapped IPv6 address counts as its
    /// IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

/// The allow-list; empty: any address.
#[derive(Debug, Clone, Default)]
pub(crate) struct Networks(pub Arc<Vec<Network>>);

impl Networks {
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.0.is_empty() || self.0.iter().any(|n| n.contains(ip))
    }

    /// Checks a registration's base URL: an address literal must be inside,
    /// a host name must resolve, and to addresses that all are. 422
    /// `network_not_allowed` otherwise.
    pub async fn check_base_url(&self, base_url: &str) -> Result<(), ApiError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let refused =
            |why: String| ApiError::NetworkNotAllowed(format!("baseUrl {base_url} {why}"));
        let url = reqwest::Url::parse(base_url).map_err(|e| refused(e.to_string()))?;
        let port = url.port_or_known_default().unwrap_or(80);
        let host = url
            .host_str()
            .ok_or_else(|| refused("has no host".into()))?;
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let addresses: Vec<IpAddr> = match literal.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|_| refused("does not resolve".into()))?
                .map(|a| a.ip())
                .collect(),
        };
        if addresses.is_empty() {
            return Err(refused("does not resolve".into()));
        }
        match addresses.iter().find(|ip| !self.allows(**ip)) {
            Some(outside) => Err(refused(format!(
                "is at {outside}, outside the registry's allowed networks"
            ))),
            None => Ok(()),
        }
    }
}

/// A resolver that only yields allowed addresses: a host name that was
/// inside at registration and points elsewhere now is not reached.
struct AllowedResolver(Networks);

impl reqwest::dns::Resolve for AllowedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let networks = self.0.clone();
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let allowed: Vec<SocketAddr> = found.filter(|a| networks.allows(a.ip())).collect();
            if allowed.is_empty() {
                return Err(
                    format!("{} resolves outside the allowed networks", name.as_str()).into(),
                );
            }
            let addresses: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addresses)
        })
    }
}

/// The HTTP client for requests to registered instances: no redirect is
/// followed (a 3xx is an answer like any other, never a hop to a host or
/// port the registration did not name), and with an allow-list host names
/// resolve only to allowed addresses.
pub(crate) fn instance_client(
    timeout: Duration,
    networks: &Networks,
) -> Result<reqwest::Client, ApiError> {
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none());
    if !networks.0.is_empty() {
        builder = builder.dns_resolver(Arc::new(AllowedResolver(networks.clone())));
    }
    builder
        .build()
        .map_err(|e| ApiError::Unavailable(e.to_string()))
}

/// Registrations per service per minute by default (a burst of as many).
pub const DEFAULT_REGISTRATIONS_PER_MINUTE: u32 = 600;
/// Services whose buckets are remembered before idle (full) ones are dropped.
const MAX_BUCKETS: usize = 10_000;

/// A token bucket per service id.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    per_minute: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute: f64::from(per_minute.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one registration of `service`, or says how long to wait
    /// (429 `rate_limited`, `Retry-After`).
    pub fn take(&self, service: &str) -> Result<(), ApiError> {
        self.take_at(service, Instant::now())
    }

    fn take_at(&self, service: &str, now: Instant) -> Result<(), ApiError> {
        let per_second = self.per_minute / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(service) {
            let capacity = self.per_minute;
            buckets.retain(|_, (tokens, at)| {
                *tokens + now.duration_since(*at).as_secs_f64() * per_second < capacity
            });
        }
        let (tokens, at) = buckets
            .entry(service.to_owned())
            .or_insert((self.per_minute, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f64() * per_second).min(self.per_minute);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - *tokens) / per_second).ceil().max(1.0) as u64;
        Err(ApiError::RateLimited {
            service: service.to_owned(),
            per_minute: self.per_minute as u32,
            retry_after: wait,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().expect("header"));
        headers
    }

    fn basic(user_password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )
    }

    #[test]
    fn each_operation_needs_its_own_credential() {
        let credentials = Credentials {
            publish: Some("pub".into()),
            operator: Some("op".into()),
            registration: vec!["reg-a".into(), "reg-b".into()],
        };
        let ok = |value: &str, access| credentials.authorize(&headers(value), access).is_ok();
        assert!(ok("Bearer pub", Access::Publish));
        assert!(!ok("Bearer op", Access::Publish));
        assert!(ok("Bearer op", Access::Operator));
        assert!(!ok("Bearer pub", Access::Operator));
        assert!(ok("Bearer reg-b", Access::Registration));
        assert!(!ok("Bearer op", Access::Registration));
        assert!(ok(&basic("anyone:op"), Access::Operator));
        assert!(!ok(&basic("op:wrong"), Access::Operator));
        assert!(!ok("Basic !!!", Access::Operator));
        let a = credentials.registrant(&headers("Bearer reg-a")).expect("a");
        let b = credentials.registrant(&headers("Bearer reg-b")).expect("b");
        assert_ne!(a, b);
        assert!(credentials.is_live(&a.0));
        assert!(!credentials.is_live(&Registrant::of("retired").0));
    }

    #[test]
    fn a_closed_registry_disables_what_has_no_credential() {
        let credentials = Credentials {
            publish: Some("pub".into()),
            ..Credentials::default()
        };
        let refused = credentials
            .authorize(&headers("Bearer pub"), Access::Operator)
            .expect_err("disabled");
        assert_eq!(refused.code(), "operation_disabled");
        let open = Credentials::default();
        assert!(open.authorize(&HeaderMap::new(), Access::Operator).is_ok());
    }

    #[test]
    fn networks_parse_and_match() {
        let net: Network = "10.1.0.0/16".parse().expect("cidr");
        assert!(net.contains("10.1.200.3".parse().expect("ip")));
        assert!(!net.contains("10.2.0.1".parse().expect("ip")));
        assert!(net.contains("::ffff:10.1.0.9".parse().expect("ip")));
        let host: Network = "127.0.0.1".parse().expect("address");
        assert!(host.contains("127.0.0.1".parse().expect("ip")));
        assert!(!host.contains("127.0.0.2".parse().expect("ip")));
        let v6: Network = "fd00::/8".parse().expect("v6");
        assert!(v6.contains("fd12::1".parse().expect("ip")));
        for bad in ["10.0.0.0/33", "nope", "", "10.0.0.0/"] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_bucket_refills_at_the_configured_rate() {
        let limiter = RateLimiter::new(60);
        let start = Instant::now();
        for _ in 0..60 {
            limiter.take_at("hr", start).expect("within the burst");
        }
        let Err(ApiError::RateLimited { retry_after, .. }) = limiter.take_at("hr", start) else {
            panic!("the 61st is limited");
        };
        assert_eq!(retry_after, 1);
        limiter.take_at("engine", start).expect("per service");
        limiter
            .take_at("hr", start + Duration::from_millis(1000))
            .expect("one more a second later");
    }
}
