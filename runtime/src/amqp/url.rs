//! Where an AMQP 1.0 destination or consumer is: an
//! `amqp[s]://[user:password@]host[:port]/<address>` URL, or an Azure
//! Service Bus connection string as the portal shows it
//! (`Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…;EntityPath=…`),
//! parsed once, with the credentials kept out of every `Debug`, `Display`
//! and error text.

use crate::transport::UrlError;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::sasl_profile::SaslProfile;

use crate::transport::TransportError;

/// The AMQP port when an `amqp://` URL names none.
pub const DEFAULT_PORT: u16 = 5672;
/// The AMQP-over-TLS port when an `amqps://` URL (or a connection string)
/// names none.
pub const DEFAULT_TLS_PORT: u16 = 5671;

/// A parsed AMQP location. Its `Debug` and [`shown`](Self::shown) never
/// contain the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    tls: bool,
    host: String,
    port: u16,
    /// SASL PLAIN user (a Service Bus key name) and password (its key).
    credentials: Option<(String, String)>,
    address: String,
}

impl std::fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpUrl")
            .field("server", &self.server())
            .field("tls", &self.tls)
            .field(
                "credentials",
                &if self.credentials.is_some() {
                    "user and password (redacted)"
                } else {
                    "none (SASL ANONYMOUS)"
                },
            )
            .field("address", &self.address)
            .finish()
    }
}

impl std::fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl AmqpUrl {
    /// Whether `text` is for this transport: an `amqp://` or `amqps://` URL,
    /// or a Service Bus connection string (`Endpoint=sb://…`).
    pub fn is_amqp(text: &str) -> bool {
        let text = text.trim_start();
        text.starts_with("amqp://")
            || text.starts_with("amqps://")
            || text
                .get(..9)
                .is_some_and(|head| head.eq_ignore_ascii_case("endpoint="))
    }

    /// Parses an `amqp[s]://[user:password@]host[:port]/<address>` URL or a
    /// Service Bus connection string.
    ///
    /// The address is the URL's path after its first `/`, percent-decoded:
    /// `amqps://ns.servicebus.windows.net/orders` sends to `orders`,
    /// `amqp://host//queue/orders` (RabbitMQ 3.x) to `/queue/orders`.
    /// Percent escapes are decoded in the user and password too (a Service
    /// Bus key name and key: `amqps://keyname:key@ns…/orders`).
    ///
    /// # Errors
    ///
    /// A message naming the field that is wrong, never containing the URL or
    /// a credential.
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let text = text.trim();
        if text
            .get(..9)
            .is_some_and(|head| head.eq_ignore_ascii_case("endpoint="))
        {
            return Self::parse_connection_string(text);
        }
        let (tls, rest) = if let Some(rest) = text.strip_prefix("amqps://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("amqp://") {
            (false, rest)
        } else {
            return Err(
                "is neither an amqp:// or amqps:// URL nor a Service Bus connection string"
                    .to_owned()
                    .into(),
            );
        };
        let (authority, path) = rest.split_once('/').ok_or_else(|| {
            "the URL has no address: write amqp://host:port/<queue or address>".to_owned()
        })?;
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        let credentials = match userinfo {
            None => None,
            Some(info) => {
                let (user, password) = info.split_once(':').ok_or_else(|| {
                    "the URL's user has no password: write user:password@ (a Service Bus \
                     key name and key)"
                        .to_owned()
                })?;
                Some((decode(user, "user")?, decode(password, "password")?))
            }
        };
        let (host, port) = parse_host(hostport, if tls { DEFAULT_TLS_PORT } else { DEFAULT_PORT })?;
        let address = decode(path, "address")?;
        validate_address(&address)?;
        Ok(Self {
            tls,
            host,
            port,
            credentials,
            address,
        })
    }

    /// `Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…;EntityPath=…`:
    /// `amqps://ns.servicebus.windows.net:5671/<EntityPath>` with SASL
    /// PLAIN (the key name as user, the key as password).
    fn parse_connection_string(text: &str) -> Result<Self, UrlError> {
        let mut endpoint = None;
        let mut key_name = None;
        let mut key = None;
        let mut entity = None;
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = part.split_once('=') else {
                return Err("a connection string part is not `Name=value`"
                    .to_owned()
                    .into());
            };
            match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => endpoint = Some(value.trim()),
                "sharedaccesskeyname" => key_name = Some(value.trim()),
                "sharedaccesskey" => key = Some(value.trim()),
                "entitypath" => entity = Some(value.trim()),
                "sharedaccesssignature" => {
                    return Err("`SharedAccessSignature`: SAS tokens need CBS token \
                                authentication, which this transport does not do; use a \
                                connection string with `SharedAccessKeyName` and \
                                `SharedAccessKey`"
                        .to_owned()
                        .into());
                }
                // TransportType=Amqp and the like: nothing to change.
                _ => {}
            }
        }
        let endpoint = endpoint.ok_or("`Endpoint` is missing from the connection string")?;
        let host = endpoint
            .strip_prefix("sb://")
            .or_else(|| endpoint.strip_prefix("amqps://"))
            .ok_or("`Endpoint` is not an sb:// address")?
            .trim_end_matches('/');
        let (host, port) = parse_host(host, DEFAULT_TLS_PORT)
            .map_err(|message| format!("`Endpoint`: {message}"))?;
        let key_name = key_name
            .filter(|v| !v.is_empty())
            .ok_or("`SharedAccessKeyName` is missing from the connection string")?;
        let key = key
            .filter(|v| !v.is_empty())
            .ok_or("`SharedAccessKey` is missing from the connection string")?;
        let entity = entity.filter(|v| !v.is_empty()).ok_or(
            "`EntityPath` is missing from the connection string: copy the queue's own \
             connection string, or add `;EntityPath=<queue>`",
        )?;
        validate_address(entity).map_err(|message| format!("`EntityPath`: {message}"))?;
        Ok(Self {
            tls: true,
            host,
            port,
            credentials: Some((key_name.to_owned(), key.to_owned())),
            address: entity.to_owned(),
        })
    }

    /// The address (queue, topic or a broker's address string) messages go
    /// to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// This location with another address (an answers address).
    pub fn with_address(&self, address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            ..self.clone()
        }
    }

    /// `host:port`.
    pub fn server(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Whether the connection runs over TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The location without its credentials: `amqps://host:port/<address>`.
    pub fn shown(&self) -> String {
        format!(
            "{}://{}:{}/{}",
            if self.tls { "amqps" } else { "amqp" },
            self.host,
            self.port,
            self.address
        )
    }

    /// Opens a connection (TCP, TLS for `amqps`, SASL PLAIN with the
    /// credentials or ANONYMOUS without), within `timeout`.
    pub(crate) async fn connect(
        &self,
        timeout: Duration,
        container_id: &str,
    ) -> Result<ConnectionHandle<()>, TransportError> {
        tokio::time::timeout(timeout, self.connect_inner(container_id))
            .await
            .map_err(|_| TransportError::Timeout)?
    }

    async fn connect_inner(
        &self,
        container_id: &str,
    ) -> Result<ConnectionHandle<()>, TransportError> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| TransportError::Connect(format!("{}: {e}", self.server())))?;
        let _ = tcp.set_nodelay(true);
        let profile = match &self.credentials {
            Some((username, password)) => SaslProfile::Plain {
                username: username.clone(),
                password: password.clone(),
            },
            None => SaslProfile::Anonymous,
        };
        let builder = fe2o3_amqp::Connection::builder()
            .container_id(container_id)
            .hostname(self.host.as_str())
            .sasl_hostname(self.host.as_str())
            .idle_time_out(60_000u32)
            // TLS, when asked for, is set up below: the AMQP header
            // exchange runs inside it.
            .scheme("amqp")
            .sasl_profile(profile);
        let opened = if self.tls {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(self.host.clone())
                .map_err(|e| TransportError::Connect(format!("host name: {e}")))?;
            let stream = tls_connector()?
                .connect(name, tcp)
                .await
                .map_err(|e| TransportError::Connect(format!("TLS to {}: {e}", self.server())))?;
            builder.open_with_stream(stream).await
        } else {
            builder.open_with_stream(tcp).await
        };
        opened.map_err(|e| TransportError::Connect(format!("AMQP open of {}: {e}", self.server())))
    }
}

/// rustls with ring and the public CA roots.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, TransportError> {
    use tokio_rustls::rustls;
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TransportError::Other(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `host[:port]`: a host name, IPv4 address or `[IPv6]`, and a port.
fn parse_host(hostport: &str, default_port: u16) -> Result<(String, u16), UrlError> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("the host's `[` has no `]`".to_owned())?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty()
        || host
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')))
    {
        return Err("the host is empty or not a host name".to_owned().into());
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or("the port is not a number from 1 to 65535".to_owned())?,
    };
    Ok((host.to_owned(), port))
}

/// An address is 1 to 1,000 printable characters without spaces.
fn validate_address(address: &str) -> Result<(), UrlError> {
    if address.is_empty() {
        return Err(
            "the address is empty: write amqp://host:port/<queue or address>"
                .to_owned()
                .into(),
        );
    }
    if address.len() > 1_000 || address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the address has spaces or control characters"
            .to_owned()
            .into());
    }
    Ok(())
}

/// Percent-decodes `text` (a URL's user, password or address).
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
                .ok_or_else(|| format!("the {what} has a malformed percent escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| UrlError::from(format!("the {what} is not UTF-8 once decoded")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let url = AmqpUrl::parse("amqp://guest:gu%40st@127.0.0.1:5673//queue/orders").unwrap();
        assert_eq!(url.address(), "/queue/orders");
        assert_eq!(url.server(), "127.0.0.1:5673");
        assert!(!url.tls());
        assert_eq!(
            url.credentials,
            Some(("guest".to_owned(), "gu@st".to_owned()))
        );
        assert!(!format!("{url:?}").contains("gu@st"));
        let url = AmqpUrl::parse("amqps://key:secret@ns.servicebus.windows.net/orders").unwrap();
        assert_eq!(url.server(), "ns.servicebus.windows.net:5671");
        assert_eq!(url.shown(), "amqps://ns.servicebus.windows.net:5671/orders");
        for (bad, field) in [
            ("amqp://host:99999/q", "port"),
            ("amqp://host", "address"),
            ("amqp://host/", "address"),
            ("amqp://user@host/q", "password"),
            ("http://host/q", "amqp://"),
            ("amqp://user:p%zz@host/q", "password"),
        ] {
            let error = AmqpUrl::parse(bad).unwrap_err().to_string();
            assert!(error.contains(field), "{bad}: {error}");
        }
    }

    #[test]
    fn connection_strings() {
        let url = AmqpUrl::parse(
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;\
             SharedAccessKey=c2VjcmV0PQ==;EntityPath=orders",
        )
        .unwrap();
        assert!(url.tls());
        assert_eq!(url.server(), "ns.servicebus.windows.net:5671");
        assert_eq!(url.address(), "orders");
        assert_eq!(
            url.credentials,
            Some(("send".to_owned(), "c2VjcmV0PQ==".to_owned()))
        );
        assert!(!format!("{url:?}{url}").contains("c2VjcmV0PQ=="));
        for (bad, field) in [
            (
                "Endpoint=sb://ns/;SharedAccessKeyName=a;SharedAccessKey=k",
                "EntityPath",
            ),
            (
                "Endpoint=sb://ns/;SharedAccessKey=k;EntityPath=q",
                "SharedAccessKeyName",
            ),
            (
                "Endpoint=sb://ns/;SharedAccessKeyName=a;EntityPath=q",
                "SharedAccessKey",
            ),
            (
                "Endpoint=https://ns/;SharedAccessKeyName=a;SharedAccessKey=k;EntityPath=q",
                "Endpoint",
            ),
            (
                "Endpoint=sb://ns/;SharedAccessSignature=SharedAccessSignature sr=x;EntityPath=q",
                "SharedAccessSignature",
            ),
        ] {
            let error = AmqpUrl::parse(bad).unwrap_err().to_string();
            assert!(error.contains(field), "{bad}: {error}");
            assert!(!error.contains("k;"), "{error}");
        }
    }
}
