//! `nats://[user:password@|token@]host[:port][,host[:port]…]/<subject>[?replicas=N]`:
//! where a JetStream destination or consumer is, parsed once, with the
//! credentials kept out of every `Debug`, `Display` and error text. Several
//! comma-separated servers are seeds of one cluster, as NATS tools take
//! them: the client connects to any that answers and moves to another when
//! it goes; `replicas` is the replica count of the stream rfidl creates
//! (1 to 5, default 1; 3 on a 3-node cluster survives losing any node).

use crate::transport::UrlError;
use std::time::Duration;

/// Default NATS port when a URL names none.
pub const DEFAULT_PORT: u16 = 4222;
/// The most stream replicas JetStream allows.
pub const MAX_REPLICAS: usize = 5;

/// A parsed `nats://` URL. Its `Debug` and [`shown`](Self::shown) never
/// contain the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl {
    /// `(host, port)` of each seed server, in the URL's order.
    servers: Vec<(String, u16)>,
    credentials: Credentials,
    subject: String,
    replicas: usize,
}

#[derive(Clone, PartialEq, Eq)]
enum Credentials {
    None,
    Token(String),
    UserPassword(String, String),
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsUrl")
            .field("server", &self.server())
            .field(
                "credentials",
                &match self.credentials {
                    Credentials::None => "none",
                    Credentials::Token(_) => "token (redacted)",
                    Credentials::UserPassword(..) => "user and password (redacted)",
                },
            )
            .field("subject", &self.subject)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl NatsUrl {
    /// Parses `nats://[user:password@|token@]host[:port][,host[:port]…]/<subject>[?replicas=N]`.
    ///
    /// The subject is one or more dot-separated tokens of letters, digits,
    /// `-` and `_` (no wildcards: messages are published to it). Percent
    /// escapes are decoded in the user, password and token. The one query
    /// parameter is `replicas` (1 to [`MAX_REPLICAS`]).
    ///
    /// # Errors
    ///
    /// A message naming what is wrong, never containing the URL (it may
    /// hold credentials).
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let Some(rest) = url.strip_prefix("nats://") else {
            return Err("is not a nats:// URL".to_owned().into());
        };
        let (authority, path) = rest.split_once('/').ok_or_else(|| {
            "nats:// URL has no subject: write nats://host:port/<subject>".to_owned()
        })?;
        let (subject, replicas) = match path.split_once('?') {
            Some((subject, query)) => (subject, parse_replicas(query)?),
            None => (path, 1),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let credentials = match userinfo {
            None => Credentials::None,
            Some(info) => match info.split_once(':') {
                Some((user, password)) => {
                    Credentials::UserPassword(decode(user, "user")?, decode(password, "password")?)
                }
                None => Credentials::Token(decode(info, "token")?),
            },
        };
        let servers = hosts
            .split(',')
            .map(parse_server)
            .collect::<Result<Vec<_>, _>>()?;
        validate_subject(subject)?;
        Ok(Self {
            servers,
            credentials,
            subject: subject.to_owned(),
            replicas,
        })
    }

    /// This URL with the stream replica count `replicas` (a destination's
    /// `replicas` setting), unless the URL gave one.
    pub fn with_default_replicas(mut self, replicas: usize) -> Self {
        if self.replicas == 1 {
            self.replicas = replicas.clamp(1, MAX_REPLICAS);
        }
        self
    }

    /// The replica count of the stream rfidl creates.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The subject messages are published to (the destination's inbound
    /// messages); the stream also takes `<subject>.>` (answers).
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The stream's name: the subject with `.` replaced by `_`, prefixed
    /// `RF_` (stream names may not contain dots).
    pub fn stream_name(&self) -> String {
        format!("RF_{}", self.subject.replace('.', "_"))
    }

    /// `nats://host:port[,host:port…]`, without credentials or subject:
    /// safe to log.
    pub fn server(&self) -> String {
        format!("nats://{}", self.hosts())
    }

    /// The seed servers, each `nats://host:port`.
    pub fn servers(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|(host, port)| format!("nats://{host}:{port}"))
            .collect()
    }

    fn hosts(&self) -> String {
        self.servers
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The URL as it may be shown: servers and subject, credentials
    /// replaced by `***`.
    pub fn shown(&self) -> String {
        let credentials = match self.credentials {
            Credentials::None => "",
            _ => "***@",
        };
        let replicas = match self.replicas {
            1 => String::new(),
            n => format!("?replicas={n}"),
        };
        format!(
            "nats://{credentials}{}/{}{replicas}",
            self.hosts(),
            self.subject
        )
    }

    /// Connects, failing after `timeout` (no background retry of the first
    /// connection: the caller retries). Once connected, the client
    /// reconnects by itself, forever.
    pub(crate) async fn connect(
        &self,
        timeout: Duration,
    ) -> Result<async_nats::Client, crate::transport::TransportError> {
        let mut options = async_nats::ConnectOptions::new()
            .connection_timeout(timeout)
            .max_reconnects(None)
            // Reconnect quickly on loopback, at most every 2 s.
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((50u64 << attempts.min(6)).min(2_000))
            });
        options = match &self.credentials {
            Credentials::None => options,
            Credentials::Token(token) => options.token(token.clone()),
            Credentials::UserPassword(user, password) => {
                options.user_and_password(user.clone(), password.clone())
            }
        };
        let server = self.server();
        match tokio::time::timeout(timeout, options.connect(self.servers())).await {
            Ok(Ok(client)) => Ok(client),
            // The error names the server, never credentials.
            Ok(Err(error)) => Err(crate::transport::TransportError::Connect(format!(
                "{server}: {}",
                error.kind()
            ))),
            Err(_) => Err(crate::transport::TransportError::Timeout),
        }
    }
}

/// One `host[:port]` of the server list.
fn parse_server(hostport: &str) -> Result<(String, u16), UrlError> {
    let (host, port) = match hostport.rsplit_once(':') {
        // `[::1]:4222` and `host:4222`; a bare `[::1]` has no port.
        Some((host, port)) if !port.contains(']') => {
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|port| *port != 0)
                .ok_or_else(|| "nats:// URL has an invalid port (want 1 to 65535)".to_owned())?;
            (host, port)
        }
        _ => (hostport, DEFAULT_PORT),
    };
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '/' | '?' | '#' | '@'))
    {
        return Err(
            "nats:// URL has no valid host (or an empty one in its server list)"
                .to_owned()
                .into(),
        );
    }
    Ok((host.to_owned(), port))
}

/// The query of a nats:// URL: `replicas=N` and nothing else.
fn parse_replicas(query: &str) -> Result<usize, UrlError> {
    let mut replicas = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("replicas", value)) if replicas.is_none() => {
                replicas = Some(
                    value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_REPLICAS).contains(n))
                        .ok_or_else(|| {
                            format!("nats:// URL `replicas` must be 1 to {MAX_REPLICAS}")
                        })?,
                );
            }
            _ => {
                return Err("nats:// URL takes one query parameter, `replicas=N`, once"
                    .to_owned()
                    .into());
            }
        }
    }
    Ok(replicas.unwrap_or(1))
}

/// Checks a publish subject: dot-separated non-empty tokens of
/// `[A-Za-z0-9_-]`.
pub(crate) fn validate_subject(subject: &str) -> Result<(), UrlError> {
    if subject.is_empty() {
        return Err(
            "nats:// URL has no subject: write nats://host:port/<subject>"
                .to_owned()
                .into(),
        );
    }
    if subject.len() > 200 {
        return Err("nats:// URL subject is longer than 200 bytes"
            .to_owned()
            .into());
    }
    for token in subject.split('.') {
        if token.is_empty()
            || !token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(
                "nats:// URL subject must be dot-separated tokens of letters, digits, `-` and `_` \
                 (no wildcards, spaces or empty tokens)"
                    .to_owned()
                    .into(),
            );
        }
    }
    Ok(())
}

/// Percent-decodes a URL part; `what` names it in the error.
fn decode(text: &str, what: &str) -> Result<String, UrlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("nats:// URL {what} has an invalid % escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::from(format!("nats:// URL {what} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_parse_and_never_show_credentials() {
        let url = NatsUrl::parse("nats://127.0.0.1:4333/orders.inbound").expect("plain");
        assert_eq!(url.server(), "nats://127.0.0.1:4333");
        assert_eq!(url.subject(), "orders.inbound");
        assert_eq!(url.stream_name(), "RF_orders_inbound");

        let url = NatsUrl::parse("nats://alice:s%40cret@broker/orders").expect("user");
        assert_eq!(url.server(), "nats://broker:4222");
        assert!(
            url.credentials == Credentials::UserPassword("alice".into(), "s@cret".into()),
            "user and percent-decoded password"
        );
        assert_eq!(url.shown(), "nats://***@broker:4222/orders");
        assert!(!format!("{url:?}").contains("cret"));
        assert!(!format!("{url:?}").contains("alice"));

        let url = NatsUrl::parse("nats://tok3n@[::1]:5000/x").expect("token");
        assert_eq!(url.server(), "nats://[::1]:5000");
        assert!(!format!("{url:?}").contains("tok3n"));
    }

    #[test]
    fn a_server_list_and_a_replica_count_parse() {
        let url =
            NatsUrl::parse("nats://u:p@h1:4301,h2,[::1]:4303/orders?replicas=3").expect("cluster");
        assert_eq!(
            url.servers(),
            ["nats://h1:4301", "nats://h2:4222", "nats://[::1]:4303"]
        );
        assert_eq!(url.replicas(), 3);
        assert_eq!(url.subject(), "orders");
        assert_eq!(
            url.shown(),
            "nats://***@h1:4301,h2:4222,[::1]:4303/orders?replicas=3"
        );
        let url = NatsUrl::parse("nats://h1/orders").expect("one");
        assert_eq!(url.replicas(), 1);
        assert_eq!(url.clone().with_default_replicas(3).replicas(), 3);
        let url = NatsUrl::parse("nats://h1/orders?replicas=2").expect("two");
        assert_eq!(url.with_default_replicas(3).replicas(), 2, "the URL wins");
    }

    #[test]
    fn malformed_urls_say_what_is_wrong_without_the_secret() {
        for (url, wanted) in [
            ("http://host/x", "not a nats://"),
            ("nats://host:4222", "no subject"),
            ("nats://host:4222/", "no subject"),
            ("nats://u:hunter2@host:99999/x", "invalid port"),
            ("nats://u:hunter2@host:0/x", "invalid port"),
            ("nats://u:hunter2@:4222/x", "no valid host"),
            ("nats://u:hunter2@host/a.*", "dot-separated"),
            ("nats://u:hunter2@host/a..b", "dot-separated"),
            ("nats://u:hunter2@host/a b", "dot-separated"),
            ("nats://u:hunter2%zz@host/a", "invalid % escape"),
            ("nats://u:hunter2@h1,,h3/a", "no valid host"),
            ("nats://u:hunter2@h1/a?replicas=0", "1 to 5"),
            ("nats://u:hunter2@h1/a?replicas=6", "1 to 5"),
            ("nats://u:hunter2@h1/a?replicas=3&replicas=3", "once"),
            ("nats://u:hunter2@h1/a?stream=x", "`replicas=N`"),
        ] {
            let error = NatsUrl::parse(url).expect_err(url).to_string();
            assert!(error.contains(wanted), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{url}: {error}");
        }
    }
}
