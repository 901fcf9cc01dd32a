//! `rfidl-codegen`'s registry client and CLI functions against a real
//! registry: publish, refusals, resolution into the lock and the cache, and
//! a registry that serves something other than what was asked for.

use std::path::PathBuf;

use rfidl_cli::{self as cli, Outcome};
use rfidl_codegen::registry::client::RegistryClient;
use rfidl_codegen::registry::{Cache, LockFile, LockPolicy, RegistryError, Remote, resolve};

use crate::support::{Server, breaking_revision, compatible_revision, schema_manifest};

fn remote(text: &str) -> Remote {
    text.parse().expect("remote")
}

#[test]
fn the_client_publishes_and_reports_breaking_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let client = RegistryClient::new(&server.url).expect("client");
    let manifest = schema_manifest("hr.employees.EmpService", 2);

    let first = client.publish(&manifest).expect("publish");
    assert_eq!((first.revision, first.created), (1, true));
    let again = client.publish(&manifest).expect("publish again");
    assert_eq!((again.revision, again.created), (1, false));
    let second = client
        .publish(&compatible_revision(&manifest, "note"))
        .expect("compatible revision");
    assert_eq!(second.revision, 2);

    match client.publish(&breaking_revision(&manifest)) {
        Err(RegistryError::Breaking { changes, .. }) => {
            assert!(changes.iter().any(|c| c.code == "B0002"), "{changes:?}");
        }
        other => panic!("expected Breaking, got {other:?}"),
    }
}

#[test]
fn publish_and_fetch_commands_fill_the_lock_and_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    assert_eq!(
        cli::publish(&server.url, None, &[PathBuf::from("../schemas")]),
        Outcome::Success
    );
    let lock_path = dir.path().join("rfidl.lock");
    let cache = Cache::new(dir.path().join("cache"));
    let remotes = [remote("hr.employees.EmpService@v2")];
    assert_eq!(
        cli::fetch(
            Some(&server.url),
            &lock_path,
            &cache,
            &remotes,
            LockPolicy::Keep
        ),
        Outcome::Success
    );
    let manifest = schema_manifest("hr.employees.EmpService", 2);
    let lock = LockFile::load(&lock_path).expect("lock");
    assert_eq!(
        lock.get(&remotes[0]).map(|l| l.fingerprint.as_str()),
        Some(manifest.fingerprint.as_str())
    );
    assert_eq!(
        cache
            .get(&manifest.interface, 2, &manifest.fingerprint)
            .expect("read cache"),
        Some(manifest.clone())
    );
    // Offline, `fetch` without a registry checks that the cache has the pins.
    assert_eq!(
        cli::fetch(None, &lock_path, &cache, &[], LockPolicy::Keep),
        Outcome::Success
    );
    std::fs::remove_dir_all(cache.root()).expect("empty the cache");
    assert_eq!(
        cli::fetch(None, &lock_path, &cache, &[], LockPolicy::Keep),
        Outcome::UsageOrIo
    );
    // A new revision: Keep stays, --update moves the pin.
    let revised = compatible_revision(&manifest, "note");
    RegistryClient::new(&server.url)
        .expect("client")
        .publish(&revised)
        .expect("publish revision");
    assert_eq!(
        cli::fetch(
            Some(&server.url),
            &lock_path,
            &cache,
            &[],
            LockPolicy::Update
        ),
        Outcome::Success
    );
    let lock = LockFile::load(&lock_path).expect("lock");
    assert_eq!(
        lock.get(&remotes[0]).map(|l| l.fingerprint.clone()),
        Some(revised.fingerprint)
    );

    // A breaking change to a published version: publish exits 1.
    let edited = dir.path().join("contracts");
    std::fs::create_dir_all(edited.join("common")).expect("mkdir");
    std::fs::copy(
        "../schemas/common/common.rfidl",
        edited.join("common/common.rfidl"),
    )
    .expect("copy");
    let hr = std::fs::read_to_string("../schemas/hr.rfidl").expect("read");
    std::fs::write(
        edited.join("hr.rfidl"),
        hr.replacen("weekly_hours: f64", "weekly_hours: decimal", 1),
    )
    .expect("write");
    assert_eq!(
        cli::publish(&server.url, None, &[edited.join("hr.rfidl")]),
        Outcome::ContractErrors
    );
}

#[test]
fn a_registry_that_answers_with_another_manifest_is_not_believed() {
    let impostor = schema_manifest("hr.employees.EmpService", 1).to_pretty_json();
    let router = axum::Router::new().fallback(move || {
        let body = impostor.clone();
        async move { body }
    });
    let server = Server::serve(router);
    let client = RegistryClient::new(&server.url).expect("client");
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::new(dir.path().join("cache"));
    let mut lock = LockFile::default();
    let error = resolve(
        &[remote("hr.employees.EmpService@v2")],
        &mut lock,
        &cache,
        Some(&client),
        LockPolicy::Keep,
    )
    .expect_err("asked for v2, got v1");
    assert!(
        matches!(error, RegistryError::BadManifest { .. }),
        "{error}"
    );
    assert!(lock.interfaces.is_empty(), "nothing pinned");
    assert!(!cache.root().exists(), "nothing cached");
}

#[test]
fn an_unreachable_registry_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let client = RegistryClient::new(&format!("http://127.0.0.1:{port}")).expect("client");
    let error = client
        .publish(&schema_manifest("shop.orders.OrderService", 1))
        .expect_err("nothing listens");
    assert!(
        matches!(error, RegistryError::Unreachable { .. }),
        "{error}"
    );
    // The whole cause, down to the operating system's.
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "registry http://127.0.0.1:{port}/v1/interfaces/shop.orders.OrderService/v1: \
             error sending request: "
        )),
        "{text}"
    );
    assert!(
        text.contains("tcp connect error") && text.contains("Connection refused (os error"),
        "{text}"
    );
    assert_eq!(text.matches("error sending request").count(), 1, "{text}");
}

/// The JSON warning lines of a capturing report.
fn warnings(report: &cli::Report) -> Vec<String> {
    report
        .captured()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["severity"] == "warning")
        .filter_map(|line| line["message"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_pin_behind_the_registry_is_warned_about_by_fetch_and_the_build() {
    use rfidl_cli::{DiagnosticFormat, Report};
    use rfidl_codegen::registry::freshness;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let client = RegistryClient::new(&server.url).expect("client");
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    client.publish(&v1).expect("publish v1");
    let lock_path = dir.path().join("rfidl.lock");
    let cache = Cache::new(dir.path().join("cache"));
    let remotes = [remote("hr.employees.EmpService@v1")];
    let fetch = |policy| {
        let report = Report::capturing(DiagnosticFormat::Json);
        let outcome = cli::fetch_with(
            Some(&server.url),
            &lock_path,
            &cache,
            &remotes,
            policy,
            &report,
        );
        assert_eq!(outcome, Outcome::Success, "{}", report.captured());
        warnings(&report)
    };

    // Pinned at the latest revision of the latest version: nothing to say.
    assert_eq!(fetch(LockPolicy::Keep), Vec::<String>::new());

    // A newer revision of the pinned version: fetch (keeping the pin) says
    // so, with what to run, and so does the build's check.
    let revised = compatible_revision(&v1, "note");
    client.publish(&revised).expect("publish revision 2");
    let said = fetch(LockPolicy::Keep);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with(&format!(
            "the registry {} has a newer revision of hr.employees.EmpService v1: revision 2 ({}, \
             published 20",
            server.url, revised.fingerprint
        )),
        "{said:?}"
    );
    assert!(
        said[0].contains(&format!(
            "rfidl.lock pins revision 1 ({}). Run `rfidl fetch --update --registry {} \
             hr.employees.EmpService@v1`",
            v1.fingerprint, server.url
        )),
        "{said:?}"
    );
    let lock = LockFile::load(&lock_path).expect("lock");
    let checked = freshness::check(
        &remotes,
        &lock,
        &cache,
        &client,
        std::time::SystemTime::now(),
    );
    assert!(checked.reachable);
    assert_eq!(checked.warnings, said);

    // A newer version: said too, also after moving to the latest revision.
    client
        .publish(&schema_manifest("hr.employees.EmpService", 2))
        .expect("publish v2");
    assert_eq!(fetch(LockPolicy::Keep).len(), 2);
    let said = fetch(LockPolicy::Update);
    assert_eq!(
        said,
        [format!(
            "the registry {} publishes a newer version of hr.employees.EmpService (v2) than \
             this build uses (v1)",
            server.url
        )]
    );

    // The build with `Builder::remote` runs the same check (its warnings
    // are `cargo:warning` lines) and still builds from the lock.
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("mkdir");
    let files = rfidl_codegen::Builder::new()
        .skip_rerun_if_changed()
        .remote("hr.employees.EmpService", 1)
        .registry(&server.url)
        .lock_file(&lock_path)
        .cache_dir(cache.root())
        .out_dir(&out)
        .compile(&[] as &[&str])
        .expect("build");
    assert!(files.iter().any(|f| f.name == "hr.employees.rs"));
}
