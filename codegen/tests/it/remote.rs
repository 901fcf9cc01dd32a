//! Remote interfaces without a registry: the lock file, the offline cache,
//! resolution and merging into generation, and what a build says when the
//! registry is down. (The registry server and the HTTP client are tested
//! against a real server in `registry/tests`, the staleness warnings too:
//! `registry/tests/it/client.rs`.)

use std::cell::Cell;
use std::path::{Path, PathBuf};

use crate::support::manifests_of;
use rfidl_codegen::Builder;
use rfidl_codegen::builder::BuildError;
use rfidl_codegen::manifest::Manifest;
use rfidl_codegen::registry::{
    Cache, LockFile, LockPolicy, RegistryError, Remote, Source, resolve,
};

fn schema_manifests() -> Vec<Manifest> {
    manifests_of(&[PathBuf::from("../schemas")])
}

fn orders() -> Manifest {
    schema_manifests()
        .into_iter()
        .find(|m| m.interface == "shop.orders.OrderService")
        .expect("OrderService v1")
}

fn remote(text: &str) -> Remote {
    text.parse().expect("valid remote")
}

/// A registry stand-in for the resolution policy (which source is asked
/// when); counts how often it is asked.
struct Published {
    manifests: Vec<Manifest>,
    asked: Cell<u32>,
}

impl Source for Published {
    fn name(&self) -> String {
        "test".into()
    }

    fn latest(&self, remote: &Remote) -> Result<Manifest, RegistryError> {
        self.asked.set(self.asked.get() + 1);
        self.manifests
            .iter()
            .rev()
            .find(|m| m.interface == remote.interface && m.version == remote.version)
            .cloned()
            .ok_or_else(|| RegistryError::Refused {
                url: "test".into(),
                status: 404,
                code: "not_found".into(),
                message: remote.to_string(),
            })
    }

    fn exact(&self, remote: &Remote, fingerprint: &str) -> Result<Manifest, RegistryError> {
        self.asked.set(self.asked.get() + 1);
        self.manifests
            .iter()
            .find(|m| m.interface == remote.interface && m.fingerprint == fingerprint)
            .cloned()
            .ok_or_else(|| RegistryError::Refused {
                url: "test".into(),
                status: 404,
                code: "not_found".into(),
                message: fingerprint.into(),
            })
    }
}

/// Caches `manifest` in `cache_dir` and pins it in a new lock at `lock_path`.
fn pin_and_cache(manifest: &Manifest, lock_path: &Path, cache_dir: &Path) {
    Cache::new(cache_dir).put(manifest).expect("cache");
    let mut lock = LockFile::default();
    lock.pin(
        &remote(&format!("{}@v{}", manifest.interface, manifest.version)),
        &manifest.fingerprint,
    );
    lock.save(lock_path).expect("lock");
}

fn build(
    dir: &Path,
    lock: &Path,
    cache: &Path,
) -> Result<Vec<rfidl_codegen::GeneratedFile>, BuildError> {
    Builder::new()
        .skip_rerun_if_changed()
        .remote("shop.orders.OrderService", 1)
        .lock_file(lock)
        .cache_dir(cache)
        .out_dir(dir)
        .compile(&[] as &[&str])
}

#[test]
fn a_locked_and_cached_interface_generates_without_any_registry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (lock_path, cache_dir, out) = (
        dir.path().join("rfidl.lock"),
        dir.path().join("cache"),
        dir.path().join("out"),
    );
    std::fs::create_dir_all(&out).expect("mkdir");
    let manifest = orders();
    pin_and_cache(&manifest, &lock_path, &cache_dir);
    let lock_before = std::fs::read_to_string(&lock_path).expect("lock");

    let files = build(&out, &lock_path, &cache_dir).expect("offline build");
    let orders_rs = files
        .iter()
        .find(|f| f.name == "shop.orders.rs")
        .expect("the remote package is generated");
    assert!(orders_rs.contents.contains("pub mod order_service_v1"));
    assert!(
        orders_rs.contents.contains(&manifest.fingerprint),
        "the generated constant carries the locked fingerprint"
    );
    assert!(
        files.iter().any(|f| f.name == "common.rs"),
        "types of other packages in the closure are generated too"
    );
    // Same manifest, same code as from the local contract.
    let local_dir = tempfile::tempdir().expect("tempdir");
    let local = Builder::new()
        .skip_rerun_if_changed()
        .out_dir(local_dir.path())
        .compile(&["../schemas/orders.rfidl"])
        .expect("local build");
    let local_orders = local
        .iter()
        .find(|f| f.name == "shop.orders.rs")
        .expect("local package");
    let service = |text: &str| {
        let start = text
            .find("pub mod order_service_v1")
            .expect("service module");
        text[start..].to_owned()
    };
    assert_eq!(
        service(&orders_rs.contents),
        service(&local_orders.contents)
    );
    assert_eq!(
        std::fs::read_to_string(&lock_path).expect("lock"),
        lock_before,
        "a build that pins nothing new leaves the lock file alone"
    );
}

#[test]
fn what_is_missing_offline_is_an_error_that_says_what_to_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (lock_path, cache_dir) = (dir.path().join("rfidl.lock"), dir.path().join("cache"));

    let error = build(dir.path(), &lock_path, &cache_dir).expect_err("nothing locked");
    let message = error.to_string();
    assert!(matches!(
        error,
        BuildError::Registry(RegistryError::NotLocked { .. })
    ));
    assert!(
        message.contains("rfidl fetch --registry URL shop.orders.OrderService@v1"),
        "{message}"
    );

    let manifest = orders();
    let mut lock = LockFile::default();
    lock.pin(
        &remote("shop.orders.OrderService@v1"),
        &manifest.fingerprint,
    );
    lock.save(&lock_path).expect("lock");
    let error = build(dir.path(), &lock_path, &cache_dir).expect_err("nothing cached");
    assert!(
        matches!(error, BuildError::Registry(RegistryError::NotCached { .. })),
        "{error}"
    );
    assert!(error.to_string().contains(&manifest.fingerprint), "{error}");
}

#[test]
fn a_damaged_cache_entry_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (lock_path, cache_dir) = (dir.path().join("rfidl.lock"), dir.path().join("cache"));
    let manifest = orders();
    pin_and_cache(&manifest, &lock_path, &cache_dir);
    let path = Cache::new(&cache_dir)
        .path_of(&manifest.interface, manifest.version, &manifest.fingerprint)
        .expect("a valid interface id and fingerprint");

    // Same JSON shape, different meaning: the fingerprint no longer matches.
    let tampered = std::fs::read_to_string(&path)
        .expect("read")
        .replace("\"u64\"", "\"u32\"");
    std::fs::write(&path, tampered).expect("tamper");
    let error = build(dir.path(), &lock_path, &cache_dir).expect_err("tampered");
    assert!(
        matches!(
            &error,
            BuildError::Registry(RegistryError::CorruptCache { path: p, .. }) if p == &path
        ),
        "{error}"
    );

    std::fs::write(&path, "{ not json").expect("truncate");
    let error = build(dir.path(), &lock_path, &cache_dir).expect_err("garbage");
    assert!(
        error.to_string().contains("delete it and fetch again"),
        "{error}"
    );
}

#[test]
fn resolution_asks_the_source_only_for_what_the_lock_and_cache_lack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::new(dir.path().join("cache"));
    let all = schema_manifests();
    let source = Published {
        manifests: all.clone(),
        asked: Cell::new(0),
    };
    let remotes = [
        remote("hr.employees.EmpService@v2"),
        remote("shop.orders.OrderService@v1"),
    ];
    let mut lock = LockFile::default();

    let first = resolve(&remotes, &mut lock, &cache, Some(&source), LockPolicy::Keep)
        .expect("first resolution");
    assert_eq!(source.asked.get(), 2);
    assert_eq!(lock.interfaces.len(), 2, "both pinned");
    // Offline now: the lock and the cache are enough.
    let again = resolve(&remotes, &mut lock, &cache, None, LockPolicy::Keep).expect("offline");
    assert_eq!(first, again);

    // A newer revision exists: Keep stays on the pin, Update moves to it.
    let mut newer = all
        .iter()
        .find(|m| m.interface == "shop.orders.OrderService")
        .expect("orders")
        .clone();
    newer.docs = vec!["a doc edit only".into()];
    // A compatible revision (a contract could make it: the validator checks
    // every fetched manifest): one more optional parameter.
    newer.methods[0]
        .params
        .push(rfidl_codegen::manifest::Field {
            name: "note".into(),
            ty: "string?".parse().expect("type"),
            docs: Vec::new(),
            deprecated: None,
        });
    let newer = newer.with_fingerprint();
    let source = Published {
        manifests: [all, vec![newer.clone()]].concat(),
        asked: Cell::new(0),
    };
    let kept = resolve(&remotes, &mut lock, &cache, Some(&source), LockPolicy::Keep).expect("keep");
    assert_eq!(source.asked.get(), 0, "everything came from the cache");
    assert_ne!(kept[1].fingerprint, newer.fingerprint);
    let updated = resolve(
        &remotes,
        &mut lock,
        &cache,
        Some(&source),
        LockPolicy::Update,
    )
    .expect("update");
    assert_eq!(updated[1].fingerprint, newer.fingerprint);
    assert_eq!(
        lock.get(&remotes[1]).map(|l| l.fingerprint.clone()),
        Some(newer.fingerprint)
    );
}

#[test]
fn a_remote_that_contradicts_a_local_type_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (lock_path, cache_dir) = (dir.path().join("rfidl.lock"), dir.path().join("cache"));
    // The remote's idea of common.Money differs from the local contract's.
    let mut manifest = orders();
    let money = manifest
        .types
        .get_mut("common.Money")
        .expect("Money in the closure");
    if let rfidl_codegen::manifest::TypeDef::Record { fields, .. } = money {
        fields.pop();
    }
    let manifest = manifest.with_fingerprint();
    pin_and_cache(&manifest, &lock_path, &cache_dir);
    let error = Builder::new()
        .skip_rerun_if_changed()
        .remote("shop.orders.OrderService", 1)
        .lock_file(&lock_path)
        .cache_dir(&cache_dir)
        .out_dir(dir.path())
        .compile(&["../schemas/common/common.rfidl"])
        .expect_err("conflict");
    assert!(
        matches!(&error, BuildError::Registry(RegistryError::Conflict { name, .. }) if name == "common.Money"),
        "{error}"
    );
}

#[test]
fn a_lock_file_from_the_future_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rfidl.lock");
    std::fs::write(&path, r#"{"format": 2, "interfaces": []}"#).expect("write");
    let error = LockFile::load(&path).expect_err("newer format");
    assert!(error.to_string().contains("format 2 is newer"), "{error}");
}

/// A registry that cannot be reached, counting how often it is asked.
struct Down {
    asked: Cell<u32>,
}

impl Source for Down {
    fn name(&self) -> String {
        "http://registry.invalid".into()
    }

    fn latest(&self, remote: &Remote) -> Result<Manifest, RegistryError> {
        self.exact(remote, "")
    }

    fn exact(&self, _remote: &Remote, _fingerprint: &str) -> Result<Manifest, RegistryError> {
        self.asked.set(self.asked.get() + 1);
        Err(RegistryError::Unreachable {
            url: self.name(),
            message: "connection refused".into(),
        })
    }

    fn versions(
        &self,
        _interface: &str,
    ) -> Result<Vec<rfidl_codegen::registry::PublishedVersion>, RegistryError> {
        self.exact(&remote("a.B@v1"), "").map(|_| Vec::new())
    }
}

#[test]
fn offline_each_cached_copy_is_named_with_its_age_and_the_registry_is_asked_once() {
    use rfidl_codegen::registry::freshness;
    use std::time::{Duration, SystemTime};

    let dir = tempfile::tempdir().expect("tempdir");
    let (lock_path, cache_dir) = (dir.path().join("rfidl.lock"), dir.path().join("cache"));
    let cache = Cache::new(&cache_dir);
    let mut lock = LockFile::default();
    let mut remotes = Vec::new();
    for manifest in schema_manifests()
        .into_iter()
        .filter(|m| m.interface == "shop.orders.OrderService" || m.version == 2)
    {
        cache.put(&manifest).expect("cache");
        let pinned = remote(&format!("{}@v{}", manifest.interface, manifest.version));
        lock.pin(&pinned, &manifest.fingerprint);
        remotes.push(pinned);
    }
    lock.save(&lock_path).expect("lock");
    assert!(remotes.len() >= 2, "{remotes:?}");

    // The orders copy was fetched three days (and an hour) ago.
    let orders = orders();
    let path = cache
        .path_of(&orders.interface, 1, &orders.fingerprint)
        .expect("path");
    let now = SystemTime::now();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|file| file.set_modified(now - Duration::from_secs(3 * 86_400 + 3_600)))
        .expect("age the cached copy");

    let down = Down {
        asked: Cell::new(0),
    };
    let checked = freshness::check(&remotes, &lock, &cache, &down, now);
    assert!(!checked.reachable);
    assert_eq!(down.asked.get(), 1, "asked once, not once per interface");
    assert_eq!(
        checked.warnings.len(),
        remotes.len(),
        "{:?}",
        checked.warnings
    );
    assert!(
        checked.warnings.contains(&format!(
            "using the cached copy of shop.orders.OrderService v1 ({}) fetched 3 days ago; the \
             registry http://registry.invalid is unreachable (connection refused), so a newer \
             revision or version would not be seen",
            orders.fingerprint
        )),
        "{:?}",
        checked.warnings
    );
    // The others were fetched just now.
    assert_eq!(
        checked
            .warnings
            .iter()
            .filter(|w| w.contains("fetched less than a minute ago"))
            .count(),
        remotes.len() - 1,
        "{:?}",
        checked.warnings
    );
}
