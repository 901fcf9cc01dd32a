//! A registry served on its own thread and runtime (so blocking clients can
//! call it from plain tests), and the manifests of `schemas/`.

use std::path::{Path, PathBuf};

use rfidl_codegen::check::check_paths;
use rfidl_codegen::manifest::Manifest;
use rfidl_registry::Registry;

/// A running registry; stops when dropped.
pub struct Server {
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(registry: Registry) -> Self {
        Self::serve(registry.router())
    }

    /// Serves any router (a misbehaving registry, for the client's checks).
    pub fn serve(router: axum::Router) -> Self {
        let (url_sender, url_receiver) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let url = format!("http://{}", listener.local_addr().expect("addr"));
                url_sender.send(url).expect("send url");
                axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("serve");
            });
        });
        let url = url_receiver.recv().expect("server url");
        Self {
            url,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn on_file(path: &Path) -> Self {
        Self::start(Registry::open(path).expect("open registry"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every manifest of `schemas/`.
pub fn schema_manifests() -> Vec<Manifest> {
    let outcome = check_paths(&[PathBuf::from("../schemas")]).expect("readable");
    assert!(!outcome.has_errors(), "{}", outcome.render_human());
    outcome
        .model
        .expect("no errors")
        .manifests()
        .cloned()
        .collect()
}

/// The manifest of `interface` `version` in `schemas/`.
pub fn schema_manifest(interface: &str, version: u32) -> Manifest {
    schema_manifests()
        .into_iter()
        .find(|m| m.interface == interface && m.version == version)
        .unwrap_or_else(|| panic!("{interface} v{version} in schemas/"))
}

/// `manifest` with one more optional parameter on its first method: a
/// compatible revision.
pub fn compatible_revision(manifest: &Manifest, parameter: &str) -> Manifest {
    let mut revised = manifest.clone();
    revised.methods[0]
        .params
        .push(rfidl_codegen::manifest::Field {
            name: parameter.to_owned(),
            ty: "string?".parse().expect("type"),
            docs: Vec::new(),
            deprecated: None,
        });
    revised.with_fingerprint()
}

/// `manifest` without its first method: a breaking revision. The types
/// only that method used go too, as a contract's manifest would have them
/// (the registry refuses a type nothing uses: M0013).
pub fn breaking_revision(manifest: &Manifest) -> Manifest {
    let mut revised = manifest.clone();
    revised.methods.remove(0);
    let mut pending: Vec<String> = revised
        .methods
        .iter()
        .flat_map(|m| m.params.iter().map(|p| &p.ty).chain(m.response.iter()))
        .flat_map(|t| t.named().into_iter().map(str::to_owned))
        .collect();
    let mut used = std::collections::BTreeSet::new();
    while let Some(name) = pending.pop() {
        if !used.insert(name.clone()) {
            continue;
        }
        if let Some(rfidl_codegen::manifest::TypeDef::Record { fields, .. }) =
            revised.types.get(&name)
        {
            pending.extend(
                fields
                    .iter()
                    .flat_map(|f| f.ty.named().into_iter().map(str::to_owned)),
            );
        }
    }
    revised.types.retain(|name, _| used.contains(name));
    revised.with_fingerprint()
}

/// `PUT` `body` as the manifest of `interface`/`version` (blocking).
pub fn put(
    url: &str,
    path: &str,
    body: impl Into<reqwest::blocking::Body>,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::blocking::Client::new()
        .put(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().expect("put");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(serde_json::Value::Null))
}

pub fn get(url: &str, path: &str) -> (u16, String) {
    let response = reqwest::blocking::get(format!("{url}{path}")).expect("get");
    (response.status().as_u16(), response.text().expect("body"))
}

pub fn manifest_path(manifest: &Manifest) -> String {
    format!(
        "/v1/interfaces/{}/v{}",
        manifest.interface, manifest.version
    )
}
