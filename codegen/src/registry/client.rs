//! The HTTP client of an rfidl registry (`docs/registry.md`), blocking, for
//! the CLI and build scripts (cargo feature `registry`). Every manifest it
//! receives is verified (interface, version, fingerprint against content)
//! before anyone uses it: the registry is not trusted to be right.

use std::time::Duration;

use super::{Published, RegistryError, Remote, Source, verify};
use crate::manifest::Manifest;
use crate::manifest::compat::BreakingChange;

/// The largest answer [`Source::versions`] reads from a registry.
pub const VERSIONS_LIMIT: usize = 1 << 20;

/// A registry at a base URL such as `http://registry.internal:7300`.
#[derive(Debug, Clone)]
pub struct RegistryClient {
    base: String,
    token: Option<String>,
    http: reqwest::blocking::Client,
}

#[derive(serde::Deserialize)]
struct ErrorBody {
    error: String,
    message: String,
    #[serde(default)]
    changes: Vec<WireChange>,
}

#[derive(serde::Deserialize)]
struct WireChange {
    code: String,
    path: String,
    message: String,
}

impl RegistryClient {
    /// A client of the registry at `base_url` (`http://…` or `https://…`;
    /// a trailing `/` is ignored). Requests time out after 30 s, connecting
    /// after 5 s. Nothing is sent until a method is called.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Unreachable`] when the HTTP client cannot be set up
    /// (its TLS backend failed to initialise).
    pub fn new(base_url: &str) -> Result<Self, RegistryError> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| RegistryError::Unreachable {
                url: base_url.to_owned(),
                message: error_chain(&e),
            })?;
        Ok(Self {
            base: base_url.trim_end_matches('/').to_owned(),
            token: None,
            http,
        })
    }

    /// Sends `Authorization: Bearer <token>` with publishes.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The URL of an interface version; the caller has checked the id
    /// ([`super::check_remote`]), so it is one path segment.
    fn url_of(&self, interface: &str, version: u32) -> String {
        format!("{}/v1/interfaces/{interface}/v{version}", self.base)
    }

    fn unreachable(&self, url: &str, error: reqwest::Error) -> RegistryError {
        RegistryError::Unreachable {
            url: url.to_owned(),
            message: error_chain(&error.without_url()),
        }
    }

    fn refused(&self, url: &str, response: reqwest::blocking::Response) -> RegistryError {
        let status = response.status().as_u16();
        let text = response.text().unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => RegistryError::Refused {
                url: url.to_owned(),
                status,
                code: body.error,
                message: body.message,
            },
            Err(_) => RegistryError::Refused {
                url: url.to_owned(),
                status,
                code: "unexpected_answer".to_owned(),
                message: text.chars().take(200).collect(),
            },
        }
    }

    /// Publishes `manifest`. A new revision of a published version that is
    /// not compatible comes back as [`RegistryError::Breaking`].
    pub fn publish(&self, manifest: &Manifest) -> Result<Published, RegistryError> {
        // The registry refuses it too; refusing here keeps a hostile name
        // out of the URL.
        manifest
            .validate()
            .map_err(|problems| RegistryError::InvalidManifest {
                origin: format!("{} v{}", manifest.interface, manifest.version),
                problems,
            })?;
        let url = self.url_of(&manifest.interface, manifest.version);
        let mut request = self
            .http
            .put(&url)
            .header("content-type", "application/json")
            .body(manifest.to_pretty_json());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().map_err(|e| self.unreachable(&url, e))?;
        if response.status().is_success() {
            return response.json().map_err(|e| RegistryError::BadManifest {
                url,
                reason: format!("unreadable publish answer: {}", error_chain(&e)),
            });
        }
        if response.status() == reqwest::StatusCode::CONFLICT {
            let text = response.text().unwrap_or_default();
            if let Ok(body) = serde_json::from_str::<ErrorBody>(&text)
                && body.error == "breaking_change"
            {
                return Err(RegistryError::Breaking {
                    url,
                    interface: manifest.interface.clone(),
                    version: manifest.version,
                    changes: body
                        .changes
                        .into_iter()
                        .map(|c| BreakingChange {
                            code: known_code(&c.code),
                            path: c.path,
                            message: c.message,
                        })
                        .collect(),
                });
            }
            return Err(RegistryError::Refused {
                url,
                status: 409,
                code: "conflict".to_owned(),
                message: text,
            });
        }
        Err(self.refused(&url, response))
    }

    fn get_manifest(
        &self,
        url: String,
        remote: &Remote,
        fingerprint: Option<&str>,
    ) -> Result<Manifest, RegistryError> {
        let response = self
            .http
            .get(&url)
            .send()
            .map_err(|e| self.unreachable(&url, e))?;
        if !response.status().is_success() {
            return Err(self.refused(&url, response));
        }
        // Read at most the limit: a registry cannot make us hold more.
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(response, crate::validate::MAX_MANIFEST_BYTES as u64 + 1),
            &mut bytes,
        )
        .map_err(|e| RegistryError::Unreachable {
            url: url.clone(),
            message: e.to_string(),
        })?;
        crate::validate::check_size(bytes.len()).map_err(|problems| {
            RegistryError::InvalidManifest {
                origin: url.clone(),
                problems,
            }
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| RegistryError::BadManifest {
                url: url.clone(),
                reason: format!("not a manifest: {e}"),
            })?;
        verify(&manifest, &remote.interface, remote.version, fingerprint).map_err(|reason| {
            RegistryError::BadManifest {
                url: url.clone(),
                reason,
            }
        })?;
        manifest
            .validate()
            .map_err(|problems| RegistryError::InvalidManifest {
                origin: url,
                problems,
            })?;
        Ok(manifest)
    }
}

/// A called interface version the registry found no active compatible
/// provider for (`POST /v1/deploy-check` answered 409
/// `unsatisfied_dependencies`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unsatisfied {
    /// The called interface, `package.Service`.
    pub interface: String,
    /// The called version, the `N` of `vN`.
    pub version: u32,
    /// The fingerprint the caller's lock file pins.
    pub fingerprint: String,
    /// Why: `decommissioned` (the version is retired), `not_published` (the
    /// locked fingerprint is not a revision the registry stores),
    /// `no_provider` (no active registered instance hosts the version) or
    /// `older_provider` (the newest hosted revision is older than the locked
    /// one). Kept as text: a newer registry may add reasons.
    pub reason: String,
    /// The registry's explanation for a human (when the providers went away,
    /// which revision they host).
    pub message: String,
}

#[derive(serde::Deserialize)]
struct UnsatisfiedBody {
    error: String,
    #[serde(default)]
    missing: Vec<Unsatisfied>,
}

impl RegistryClient {
    /// The manifest scan of the registry for `calls`: empty when every
    /// called version is hosted by a registered provider at the locked or
    /// a later revision, otherwise what is missing.
    pub fn deploy_check(&self, calls: &[super::Locked]) -> Result<Vec<Unsatisfied>, RegistryError> {
        let url = format!("{}/v1/deploy-check", self.base);
        let response = self
            .http
            .post(&url)
            .json(&serde_json::json!({ "calls": calls }))
            .send()
            .map_err(|e| self.unreachable(&url, e))?;
        if response.status().is_success() {
            return Ok(Vec::new());
        }
        if response.status() == reqwest::StatusCode::CONFLICT {
            let text = response.text().unwrap_or_default();
            return match serde_json::from_str::<UnsatisfiedBody>(&text) {
                Ok(body) if body.error == "unsatisfied_dependencies" => Ok(body.missing),
                _ => Err(RegistryError::Refused {
                    url,
                    status: 409,
                    code: "conflict".to_owned(),
                    message: text.chars().take(200).collect(),
                }),
            };
        }
        Err(self.refused(&url, response))
    }
}

impl RegistryClient {
    /// Decommissions (`on`) or re-commissions `remote` (needs the publish
    /// token when the registry has one); the state it is in afterwards.
    pub fn decommission(&self, remote: &Remote, on: bool) -> Result<Decommission, RegistryError> {
        let url = format!(
            "{}/v1/decommissioned/{}/v{}",
            self.base, remote.interface, remote.version
        );
        let mut request = if on {
            self.http.put(&url)
        } else {
            self.http.delete(&url)
        };
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().map_err(|e| self.unreachable(&url, e))?;
        if !response.status().is_success() {
            return Err(self.refused(&url, response));
        }
        let body: serde_json::Value = response.json().map_err(|e| RegistryError::Refused {
            url: url.clone(),
            status: 200,
            code: "unexpected_answer".to_owned(),
            message: error_chain(&e),
        })?;
        Ok(Decommission {
            decommissioned: body["decommissioned"].as_bool().unwrap_or(on),
            commands_sent_to: body["commandsSentTo"].as_array().map(|urls| {
                urls.iter()
                    .filter_map(|url| url.as_str().map(str::to_owned))
                    .collect()
            }),
        })
    }
}

/// What the registry answered to a decommission or re-commission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decommission {
    /// Whether the version is decommissioned now.
    pub decommissioned: bool,
    /// The provider instances (base URLs) the registry sent the lifecycle
    /// command to; `None` when it has no command secret configured.
    pub commands_sent_to: Option<Vec<String>>,
}

/// `error` and every source under it, joined with `: ` (`error sending
/// request: client error (Connect): tcp connect error: Connection refused
/// (os error 111)`), so the cause of a network error is never lost. A
/// source whose text its parent already ends with is not repeated.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !part.is_empty() && !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// Codes are `&'static str` in [`BreakingChange`]; map the registry's to ours.
fn known_code(code: &str) -> &'static str {
    crate::manifest::compat::CODES
        .iter()
        .find(|(known, _)| *known == code)
        .map_or("B0000", |(known, _)| known)
}

impl Source for RegistryClient {
    fn name(&self) -> String {
        self.base.clone()
    }

    /// `GET /v1/decommissioned`, best effort (an older registry without the
    /// route, or none reachable, says nothing).
    fn decommissioned(&self) -> Vec<(String, u32, String)> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Entry {
            interface: String,
            version: u32,
            decommissioned_at: String,
        }
        #[derive(serde::Deserialize)]
        struct List {
            decommissioned: Vec<Entry>,
        }
        let url = format!("{}/v1/decommissioned", self.base);
        self.http
            .get(&url)
            .send()
            .ok()
            .filter(|r| r.status().is_success())
            .and_then(|r| r.json::<List>().ok())
            .map(|list| {
                list.decommissioned
                    .into_iter()
                    .map(|e| (e.interface, e.version, e.decommissioned_at))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `GET /v1/interfaces/{interface}`, read up to [`VERSIONS_LIMIT`].
    fn versions(&self, interface: &str) -> Result<Vec<super::PublishedVersion>, RegistryError> {
        #[derive(serde::Deserialize)]
        struct Versions {
            versions: Vec<super::PublishedVersion>,
        }
        if !crate::validate::is_interface_id(interface) {
            return Err(RegistryError::InvalidName {
                name: crate::validate::shown(interface),
                expected: "an interface id `package.Service`",
            });
        }
        let url = format!("{}/v1/interfaces/{interface}", self.base);
        let response = self
            .http
            .get(&url)
            .send()
            .map_err(|e| self.unreachable(&url, e))?;
        if !response.status().is_success() {
            return Err(self.refused(&url, response));
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(response, VERSIONS_LIMIT as u64 + 1),
            &mut bytes,
        )
        .map_err(|e| RegistryError::Unreachable {
            url: url.clone(),
            message: e.to_string(),
        })?;
        if bytes.len() > VERSIONS_LIMIT {
            return Err(RegistryError::Refused {
                url,
                status: 200,
                code: "unexpected_answer".to_owned(),
                message: format!("the list of versions is larger than {VERSIONS_LIMIT} bytes"),
            });
        }
        serde_json::from_slice::<Versions>(&bytes)
            .map(|answer| answer.versions)
            .map_err(|e| RegistryError::Refused {
                url,
                status: 200,
                code: "unexpected_answer".to_owned(),
                message: format!("not a list of versions: {e}"),
            })
    }

    fn latest(&self, remote: &Remote) -> Result<Manifest, RegistryError> {
        super::check_remote(&remote.interface, remote.version)?;
        self.get_manifest(self.url_of(&remote.interface, remote.version), remote, None)
    }

    fn exact(&self, remote: &Remote, fingerprint: &str) -> Result<Manifest, RegistryError> {
        super::check_remote(&remote.interface, remote.version)?;
        if !crate::validate::is_fingerprint(fingerprint) {
            return Err(RegistryError::InvalidName {
                name: crate::validate::shown(fingerprint),
                expected: "a fingerprint (`sha256:` and 64 lowercase hex digits)",
            });
        }
        let url = format!(
            "{}/{fingerprint}",
            self.url_of(&remote.interface, remote.version)
        );
        self.get_manifest(url, remote, Some(fingerprint))
    }
}
