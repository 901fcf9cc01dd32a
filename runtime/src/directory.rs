//! Registration with the engine registry's service directory
//! (`docs/registry.md`, "Service directory"; `docs/operations.md`).
//!
//! A service configured with [`RegistryConfig`] (`registry:` in the YAML
//! config, `--registry URL` on the demo services) tells the registry its
//! base URL, the interface versions it hosts and the ones it calls (with
//! their fingerprints), and renews that with a heartbeat every
//! [`RegistryConfig::heartbeat`].
//!
//! The registry refuses a consumer whose called versions no registered
//! provider hosts (409 `unsatisfied_dependencies`, the manifest scan). Two
//! services that call each other would then wait for each other forever, so
//! [`DirectoryClient::spawn`] registers what it hosts first when the full
//! registration is refused, logs what is missing, and retries the full
//! registration on every heartbeat tick until it is accepted. A heartbeat
//! answered 404 `unknown_instance` (the registry lost its database)
//! registers again, and so does one answered 409 `registration_changed`:
//! each heartbeat carries the `registrationDigest` the registration was
//! answered with, and the registry says when what it stores for this
//! instance is not that any more (an operator edit, a restored database, or
//! someone else's registration on an open registry). A 403
//! `instance_owned` (another credential registered this instance) is
//! logged as an error: an operator must delete the instance first.
//! Nothing here ever stops the service: the registry being
//! down only delays its entry in the directory.
//!
//! With [`DirectoryClient::issued_keys`], the `keys` a registry started with
//! `--issue-keys` puts in its registration and heartbeat answers go into
//! that [`IssuedKeys`] set (the receiver and dispatcher read it), and a
//! receiver that meets a source it has no key for asks for a renewal at
//! once (at most one a second) instead of waiting for the next beat.
//!
//! The registration says how often the instance heartbeats (`heartbeatMs`):
//! the registry counts an instance that missed a few heartbeats as gone
//! (no longer a provider) until its next heartbeat.
//!
//! A service that holds the registry's publish token may report the
//! interface versions it hosts on start-up
//! ([`DirectoryClient::publish_on_registration`]): before registering, it
//! publishes each manifest with `PUT /v1/interfaces/{interface}/v{version}`,
//! the route of `rfidl publish`, so the registry runs the same checks (a
//! manifest a contract could produce, its fingerprint, compatibility with
//! the published revisions). A refused publish is logged and retried with
//! the registration.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::duration::serde_human;
use crate::keys::{IssuedKeys, KeySnapshot, WireKeys};

/// The shortest time between two renewals a receiver asks for.
const MIN_REFRESH: Duration = Duration::from_secs(1);

/// `registry:` in the runtime configuration.
///
/// Build it with [`RegistryConfig::new`] (or read it from YAML) and the
/// `with_…` methods, or change its public fields; the struct is
/// `#[non_exhaustive]`, so new settings can be added without breaking
/// callers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RegistryConfig {
    /// The registry's base URL, e.g. `http://127.0.0.1:7300`.
    pub url: String,
    /// The registration credential this service presents (one of the
    /// registry's `--registration-token-file` lines), when the registry has
    /// them. The registry binds this instance to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// How often the registration is renewed (default 30 s).
    #[serde(with = "serde_human", default = "default_heartbeat")]
    pub heartbeat: Duration,
}

fn default_heartbeat() -> Duration {
    Duration::from_secs(30)
}

impl RegistryConfig {
    /// A registry at `url`, no token, the default heartbeat.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            token: None,
            heartbeat: default_heartbeat(),
        }
    }

    /// Presents `token`, the registration credential
    /// ([`token`](Self::token)).
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Renews the registration every `heartbeat`
    /// ([`heartbeat`](Self::heartbeat)).
    #[must_use]
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }
}

/// One interface version at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceRef {
    /// The interface, `package.Service` (a generated module's `INTERFACE`).
    pub interface: String,
    /// Its service version (the generated `VERSION`).
    pub version: u32,
    /// `sha256:…` of the manifest revision (the generated `FINGERPRINT`).
    pub fingerprint: String,
}

impl InterfaceRef {
    /// `interface` `version` at `fingerprint`: a generated module's
    /// `INTERFACE`, `VERSION` and `FINGERPRINT`.
    pub fn new(interface: &str, version: u32, fingerprint: &str) -> Self {
        Self {
            interface: interface.to_owned(),
            version,
            fingerprint: fingerprint.to_owned(),
        }
    }
}

/// What a service tells the directory about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// This service's id (`Config::service_id`).
    #[serde(skip)]
    pub service_id: String,
    /// Where its receiver and `/_rf/…` routes answer, e.g. `http://10.0.0.7:7001`.
    pub base_url: String,
    /// The interface versions its receiver serves. The registry lists the
    /// instance as their provider, and decommissions them per instance.
    pub hosts: Vec<InterfaceRef>,
    /// The interface versions its clients send to. The registry refuses
    /// the full registration (409 `unsatisfied_dependencies`) while one has
    /// no compatible registered provider; the client then registers `hosts`
    /// alone and retries on every heartbeat.
    pub calls: Vec<InterfaceRef>,
    /// The bearer token of its diagnostics routes, for the health aggregator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics_token: Option<String>,
}

/// Why a call to the registry failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirectoryError {
    /// 409 `unsatisfied_dependencies`: the called versions without a provider.
    #[error("the registry has no compatible provider for: {}", .0.join("; "))]
    Unsatisfied(Vec<String>),
    /// 404 `unknown_instance` on a heartbeat.
    #[error("the registry does not know this instance")]
    NotRegistered,
    /// 409 `registration_changed` on a heartbeat: register again.
    #[error("the registry stores another registration for this instance")]
    RegistrationChanged,
    /// Any other answer: status, code and message.
    #[error("the registry answered {status} {code}: {message}")]
    Refused {
        /// The HTTP status; 0 when the request was refused before it was
        /// sent (a manifest to publish that does not parse).
        status: u16,
        /// The registry's wire code (e.g. `instance_owned` with 403).
        code: String,
        /// The registry's message.
        message: String,
    },
    /// It could not be reached.
    #[error("cannot reach the registry: {0}")]
    Unreachable(String),
}

/// Where registration stands, for tests and start-up messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirectoryState {
    /// Set once any registration was accepted.
    pub instance_id: Option<String>,
    /// True once the full registration (with the calls) was accepted.
    pub complete: bool,
    /// The last failure, if the last attempt failed.
    pub last_error: Option<String>,
    /// The digest the last accepted full registration was answered with;
    /// every heartbeat carries it.
    pub registration_digest: Option<String>,
}

/// Talks to the registry's directory for one service instance.
#[derive(Debug, Clone)]
pub struct DirectoryClient {
    config: RegistryConfig,
    registration: Registration,
    http: reqwest::Client,
    issued: Option<IssuedKeys>,
    /// Bound to the instance id of every accepted registration.
    lifecycle: Option<crate::lifecycle::Lifecycle>,
    publish: Option<PublishOnRegistration>,
}

/// The manifests a service publishes before it registers, and the
/// registry's publish token (see [`DirectoryClient::publish_on_registration`]).
#[derive(Clone)]
pub struct PublishOnRegistration {
    /// The registry's publish token.
    pub token: String,
    /// The manifests of what it hosts, as JSON (a generated module's
    /// `MANIFEST_JSON`).
    pub manifests: Vec<String>,
}

impl std::fmt::Debug for PublishOnRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishOnRegistration")
            .field("manifests", &self.manifests.len())
            .finish_non_exhaustive()
    }
}

/// The body of a registration: the service's [`Registration`] and its
/// heartbeat interval.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RegistrationBody<'a> {
    #[serde(flatten)]
    registration: &'a Registration,
    heartbeat_ms: u64,
}

/// The interface and version a manifest names.
#[derive(Deserialize)]
struct ManifestName {
    interface: String,
    version: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Registered {
    instance_id: String,
    /// Absent from registries older than the digest.
    #[serde(default)]
    registration_digest: Option<String>,
    /// Present when the registry issues keys.
    #[serde(default)]
    keys: Option<WireKeys>,
}

/// A heartbeat's answer: only its keys matter here.
#[derive(Deserialize, Default)]
struct Renewed {
    #[serde(default)]
    keys: Option<WireKeys>,
}

#[derive(Deserialize, Default)]
struct ErrorAnswer {
    #[serde(default)]
    error: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    missing: Vec<Missing>,
}

#[derive(Deserialize)]
struct Missing {
    message: String,
}

impl DirectoryClient {
    /// A client for `registration` at the registry of `config`.
    pub fn new(config: RegistryConfig, registration: Registration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Self {
            config,
            registration,
            http,
            issued: None,
            lifecycle: None,
            publish: None,
        }
    }

    /// Puts the keys the registry issues (`rfidl-registry serve
    /// --issue-keys`) into `keys`, at registration and at every heartbeat;
    /// give the same set to the receiver and the dispatcher.
    #[must_use]
    pub fn issued_keys(mut self, keys: &IssuedKeys) -> Self {
        self.issued = Some(keys.clone());
        self
    }

    /// Puts `keys` (from an answer) in force; a set that cannot be parsed
    /// is logged (without a secret) and the keys in force are kept.
    fn take_keys(&self, keys: Option<&WireKeys>) {
        let (Some(issued), Some(keys)) = (&self.issued, keys) else {
            return;
        };
        match KeySnapshot::from_wire(keys) {
            Ok(snapshot) => {
                let counts = format!("{:?}", snapshot);
                if issued.replace(snapshot) {
                    tracing::info!(keys = %counts, "issued keys renewed");
                }
            }
            Err(error) => tracing::error!(%error, "keeping the keys in force"),
        }
    }

    /// Publishes `publish.manifests` with `publish.token` before each
    /// registration attempt until all are accepted: a service can then
    /// register against a registry where nobody published what it hosts.
    #[must_use]
    pub fn publish_on_registration(mut self, publish: PublishOnRegistration) -> Self {
        self.publish = Some(publish);
        self
    }

    /// Publishes each manifest of [`DirectoryClient::publish_on_registration`]
    /// (200 stored already, 201 stored); the first refusal ends it.
    pub async fn publish_manifests(&self) -> Result<(), DirectoryError> {
        let Some(publish) = &self.publish else {
            return Ok(());
        };
        for manifest in &publish.manifests {
            let name: ManifestName =
                serde_json::from_str(manifest).map_err(|e| DirectoryError::Refused {
                    status: 0,
                    code: "invalid_manifest".into(),
                    message: format!("a manifest to publish is not a manifest: {e}"),
                })?;
            let url = format!(
                "{}/v1/interfaces/{}/v{}",
                self.base(),
                name.interface,
                name.version
            );
            let response = self
                .http
                .put(url)
                .bearer_auth(&publish.token)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(manifest.clone())
                .send()
                .await
                .map_err(|e| DirectoryError::Unreachable(e.to_string()))?;
            if !response.status().is_success() {
                return Err(Self::refusal(response).await);
            }
            if response.status() == reqwest::StatusCode::CREATED {
                tracing::info!(
                    interface = %name.interface,
                    version = name.version,
                    registry = %self.config.url,
                    "published the manifest of a hosted interface version"
                );
            }
        }
        Ok(())
    }

    /// Binds `lifecycle` (the set the receiver's lifecycle commands update)
    /// to the instance id of every accepted registration, so that the
    /// registry's commands addressed to another instance are refused
    /// ([`crate::lifecycle`]).
    pub fn lifecycle(mut self, lifecycle: &crate::lifecycle::Lifecycle) -> Self {
        self.lifecycle = Some(lifecycle.clone());
        self
    }

    fn base(&self) -> &str {
        self.config.url.trim_end_matches('/')
    }

    fn authorised(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.config.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn refusal(response: reqwest::Response) -> DirectoryError {
        let status = response.status().as_u16();
        let answer: ErrorAnswer = response.json().await.unwrap_or_default();
        match (status, answer.error.as_str()) {
            (409, "unsatisfied_dependencies") => {
                DirectoryError::Unsatisfied(answer.missing.into_iter().map(|m| m.message).collect())
            }
            (404, "unknown_instance") => DirectoryError::NotRegistered,
            (409, "registration_changed") => DirectoryError::RegistrationChanged,
            _ => DirectoryError::Refused {
                status,
                code: answer.error,
                message: answer.message,
            },
        }
    }

    /// Registers this instance, with its calls or only what it hosts;
    /// returns the instance id.
    pub async fn register(&self, with_calls: bool) -> Result<String, DirectoryError> {
        self.register_answer(with_calls)
            .await
            .map(|registered| registered.instance_id)
    }

    async fn register_answer(&self, with_calls: bool) -> Result<Registered, DirectoryError> {
        let mut registration = self.registration.clone();
        if !with_calls {
            registration.calls.clear();
        }
        let url = format!(
            "{}/v1/services/{}/instances",
            self.base(),
            self.registration.service_id
        );
        let body = RegistrationBody {
            registration: &registration,
            heartbeat_ms: self.config.heartbeat.as_millis().clamp(100, 3_600_000) as u64,
        };
        let response = self
            .authorised(self.http.post(url).json(&body))
            .send()
            .await
            .map_err(|e| DirectoryError::Unreachable(e.to_string()))?;
        if !response.status().is_success() {
            return Err(Self::refusal(response).await);
        }
        // Not the decoder's message: it may quote a value, and the answer
        // may carry secrets.
        let registered: Registered = response.json().await.map_err(|_| {
            DirectoryError::Unreachable(
                "the registry's answer to the registration is not a registration answer".into(),
            )
        })?;
        if let Some(lifecycle) = &self.lifecycle {
            lifecycle.bind_instance(registered.instance_id.clone());
        }
        Ok(registered)
    }

    /// Renews the registration of `instance_id`; with the
    /// `registration_digest` the registration was answered with, the
    /// registry says whether it still stores that registration (409
    /// `registration_changed`: [`DirectoryError::RegistrationChanged`]).
    pub async fn heartbeat(
        &self,
        instance_id: &str,
        registration_digest: Option<&str>,
    ) -> Result<(), DirectoryError> {
        let url = format!(
            "{}/v1/services/{}/instances/{instance_id}/heartbeat",
            self.base(),
            self.registration.service_id
        );
        let mut request = self.http.put(url);
        if let Some(digest) = registration_digest {
            request = request.json(&serde_json::json!({ "registrationDigest": digest }));
        }
        let response = self
            .authorised(request)
            .send()
            .await
            .map_err(|e| DirectoryError::Unreachable(e.to_string()))?;
        if !response.status().is_success() {
            return Err(Self::refusal(response).await);
        }
        match response.json::<Renewed>().await {
            Ok(renewed) => self.take_keys(renewed.keys.as_ref()),
            // Not the decoder's message: it may quote a secret.
            Err(_) if self.issued.is_some() => {
                tracing::warn!("the registry's heartbeat answer is unreadable; keeping the keys")
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// One step of the loop of [`DirectoryClient::spawn`]; `published`
    /// says the manifests to publish were accepted already.
    async fn step(&self, state: &mut DirectoryState, published: &mut bool) {
        if !*published && !state.complete {
            match self.publish_manifests().await {
                Ok(()) => *published = true,
                Err(error) => {
                    tracing::warn!(%error, "cannot publish the manifests of this service; retrying");
                }
            }
        }
        let result = if state.complete {
            let id = state.instance_id.clone().unwrap_or_default();
            let digest = state.registration_digest.clone();
            match self.heartbeat(&id, digest.as_deref()).await {
                Err(DirectoryError::NotRegistered) => {
                    tracing::warn!("the registry forgot this instance; registering again");
                    state.complete = false;
                    self.register_full(state).await
                }
                Err(DirectoryError::RegistrationChanged) => {
                    tracing::warn!(
                        "the registry stores another registration for this instance; \
                         registering again"
                    );
                    state.complete = false;
                    self.register_full(state).await
                }
                // Bound to another credential: after a rotation (the old
                // one retired) an identical registration re-binds it.
                Err(DirectoryError::Refused {
                    status: 403, code, ..
                }) if code == "instance_owned" => {
                    state.complete = false;
                    self.register_full(state).await
                }
                other => other,
            }
        } else {
            self.register_full(state).await
        };
        state.last_error = result.err().map(|e| e.to_string());
    }

    async fn register_full(&self, state: &mut DirectoryState) -> Result<(), DirectoryError> {
        match self.register_answer(true).await {
            Ok(registered) => {
                if self.issued.is_some() && registered.keys.is_none() {
                    tracing::error!(
                        registry = %self.config.url,
                        "this service has no secrets configured and the registry issues no \
                         keys: its messages wait and its receiver refuses its peers; start the \
                         registry with --issue-keys, or configure the secrets"
                    );
                }
                self.take_keys(registered.keys.as_ref());
                let id = registered.instance_id;
                tracing::info!(instance = %id, registry = %self.config.url, "registered with the registry");
                state.instance_id = Some(id);
                state.registration_digest = registered.registration_digest;
                state.complete = true;
                Ok(())
            }
            Err(DirectoryError::Unsatisfied(missing)) => {
                tracing::warn!(
                    ?missing,
                    "the registry refused the calls of this service for now; registered what \
                     it hosts, retrying"
                );
                if let Ok(registered) = self.register_answer(false).await {
                    self.take_keys(registered.keys.as_ref());
                    state.instance_id = Some(registered.instance_id);
                }
                Err(DirectoryError::Unsatisfied(missing))
            }
            Err(error @ DirectoryError::Refused { status: 403, .. }) => {
                tracing::error!(
                    %error,
                    "the registry refuses this instance's credential; retrying"
                );
                Err(error)
            }
            Err(error) => {
                tracing::warn!(%error, "cannot register with the registry; retrying");
                Err(error)
            }
        }
    }

    /// Registers now and then renews every heartbeat, until the task is
    /// aborted. The receiver follows [`DirectoryState`].
    pub fn spawn(self) -> (tokio::task::JoinHandle<()>, watch::Receiver<DirectoryState>) {
        let (publish, follow) = watch::channel(DirectoryState::default());
        let task = tokio::spawn(async move {
            let mut state = DirectoryState::default();
            let mut published = false;
            let mut ticks = tokio::time::interval(self.config.heartbeat);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let issued = self.issued.clone().unwrap_or_default();
            let mut last = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    // A receiver met a peer it has no key for: renew now,
                    // at most once a second.
                    () = issued.refresh_requested(), if self.issued.is_some() => {
                        tokio::time::sleep_until(last + MIN_REFRESH).await;
                        ticks.reset();
                    }
                }
                last = tokio::time::Instant::now();
                self.step(&mut state, &mut published).await;
                publish.send_replace(state.clone());
            }
        });
        (task, follow)
    }
}
