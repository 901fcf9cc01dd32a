//! `nats://[user:password@|token@]host[:port]/<subject>`: where a JetStream
//! destination or consumer is, parsed once, with the credentials kept out of
//! every `Debug`, `Display` and error text.

use std::time::Duration;

/// Default NATS port when a URL names none.
pub const DEFAULT_PORT: u16 = 4222;

/// A parsed `nats://` URL. Its `Debug` and [`shown`](Self::shown) never
/// contain the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl {
    host: String,
    port: u16,
    credentials: Credentials,
    subject: String,
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
            .finish()
    }
}

impl NatsUrl {
    /// Parses `nats://[user:password@|token@]host[:port]/<subject>`.
    ///
    /// The subject is one or more dot-separated tokens of letters, digits,
    /// `-` and `_` (no wildcards: messages are published to it). Percent
    /// escapes are decoded in the user, password and token.
    ///
    /// # Errors
    ///
    /// A message naming what is wrong, never containing the URL (it may
    /// hold credentials).
    pub fn parse(url: &str) -> Result<Self, String> {
        let Some(rest) = url.strip_prefix("nats://") else {
            return Err("is not a nats:// URL".to_owned());
        };
        let (authority, subject) = rest.split_once('/').ok_or_else(|| {
            "nats:// URL has no subject: write nats://host:port/<subject>".to_owned()
        })?;
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
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
        let (host, port) = match hostport.rsplit_once(':') {
            // `[::1]:4222` and `host:4222`; a bare `[::1]` has no port.
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|port| *port != 0)
                    .ok_or_else(|| {
                        "nats:// URL has an invalid port (want 1 to 65535)".to_owned()
                    })?;
                (host, port)
            }
            _ => (hostport, DEFAULT_PORT),
        };
        if host.is_empty()
            || host
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '/' | '?' | '#' | '@'))
        {
            return Err("nats:// URL has no valid host".to_owned());
        }
        validate_subject(subject)?;
        Ok(Self {
            host: host.to_owned(),
            port,
            credentials,
            subject: subject.to_owned(),
        })
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

    /// `nats://host:port`, without credentials or subject: safe to log.
    pub fn server(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }

    /// The URL as it may be shown: server and subject, credentials replaced
    /// by `***`.
    pub fn shown(&self) -> String {
        let credentials = match self.credentials {
            Credentials::None => "",
            _ => "***@",
        };
        format!(
            "nats://{credentials}{}:{}/{}",
            self.host, self.port, self.subject
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
        match tokio::time::timeout(timeout, options.connect(server.as_str())).await {
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

/// Checks a publish subject: dot-separated non-empty tokens of
/// `[A-Za-z0-9_-]`.
pub(crate) fn validate_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("nats:// URL has no subject: write nats://host:port/<subject>".to_owned());
    }
    if subject.len() > 200 {
        return Err("nats:// URL subject is longer than 200 bytes".to_owned());
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
                    .to_owned(),
            );
        }
    }
    Ok(())
}

/// Percent-decodes a URL part; `what` names it in the error.
fn decode(text: &str, what: &str) -> Result<String, String> {
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
    String::from_utf8(out).map_err(|_| format!("nats:// URL {what} is not UTF-8"))
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
        ] {
            let error = NatsUrl::parse(url).expect_err(url);
            assert!(error.contains(wanted), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{url}: {error}");
        }
    }
}
