//! The demo's in-process registry (an `rfidl-registry` on a SQLite file and
//! loopback HTTP): HR publishes the manifests its code was generated from,
//! and the engine checks that the fingerprints it was compiled against are
//! what the registry holds, before any message flows. It issues the
//! services' signing keys at registration (`--issue-keys`): the demo
//! configures no secret.

use std::path::Path;

use rfidl_registry::Registry;

/// A registry served on a free loopback port until the task is aborted.
pub struct DemoRegistry {
    pub url: String,
    pub server: tokio::task::JoinHandle<()>,
    /// The registry itself, e.g. for `poll_health_once`.
    pub registry: Registry,
}

impl DemoRegistry {
    /// Serves the registry on `db`, issuing keys sealed under `key_file`
    /// (created if missing).
    pub async fn start(db: &Path, key_file: &Path) -> anyhow::Result<Self> {
        let authority = rfidl_registry::keys::KeyAuthority::load_or_create(key_file)?;
        let registry = Registry::open(db)?.issue_keys(authority)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let router = registry.router();
        let server = tokio::spawn(async move {
            if let Err(error) = rfidl_runtime::serve(listener, router).await {
                tracing::error!(%error, "the registry stopped");
            }
        });
        Ok(Self {
            url,
            server,
            registry,
        })
    }

    /// Publishes a manifest constant (`MANIFEST_JSON` of a generated
    /// module); returns the revision it got.
    pub async fn publish(
        &self,
        interface: &str,
        version: u32,
        manifest_json: &str,
    ) -> anyhow::Result<u64> {
        let response = reqwest::Client::new()
            .put(format!("{}/v1/interfaces/{interface}/v{version}", self.url))
            .header("content-type", "application/json")
            .body(manifest_json.to_owned())
            .send()
            .await?;
        let status = response.status();
        let body: serde_json::Value = response.json().await?;
        anyhow::ensure!(status.is_success(), "publish refused ({status}): {body}");
        Ok(body["revision"].as_u64().unwrap_or_default())
    }

    /// The fingerprint of the latest published revision.
    pub async fn latest_fingerprint(
        &self,
        interface: &str,
        version: u32,
    ) -> anyhow::Result<String> {
        let response =
            reqwest::get(format!("{}/v1/interfaces/{interface}/v{version}", self.url)).await?;
        anyhow::ensure!(
            response.status().is_success(),
            "{interface} v{version} is not published"
        );
        let etag = response
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        Ok(etag.trim_matches('"').to_owned())
    }
}

/// Waits until `host` has its full registration accepted (at most
/// `within`); the error names the last failure.
pub async fn registered(
    host: &rfidl_runtime::Host,
    within: std::time::Duration,
) -> anyhow::Result<String> {
    let directory = host
        .directory()
        .ok_or_else(|| anyhow::anyhow!("no --registry given"))?;
    let mut state = directory.clone();
    let waited = tokio::time::timeout(within, state.wait_for(|s| s.complete)).await;
    let last = directory.borrow().clone();
    match waited {
        Ok(Ok(state)) => Ok(state.instance_id.clone().unwrap_or_default()),
        _ => anyhow::bail!(
            "not registered within {within:?}: {}",
            last.last_error.unwrap_or_else(|| "no answer".into())
        ),
    }
}
