//! `rfidl fetch` as a library function against real HTTP on loopback: a
//! registry that is down (the cache carries the build), and one that
//! answers a manifest whose content is not its fingerprint (refused,
//! nothing written). Resolution itself is tested in `codegen/tests/it`.

use std::path::{Path, PathBuf};

use rfidl_cli::{DiagnosticFormat, Outcome, Report};
use rfidl_codegen::Builder;
use rfidl_codegen::manifest::Manifest;
use rfidl_codegen::registry::{Cache, LockFile, LockPolicy, Remote};

use crate::support::manifests_of;

fn orders() -> Manifest {
    manifests_of(&[PathBuf::from("../schemas")])
        .into_iter()
        .find(|m| m.interface == "shop.orders.OrderService")
        .expect("OrderService v1")
}

/// Caches `manifest` in `cache_dir` and pins it in a new lock at `lock_path`.
fn pin_and_cache(manifest: &Manifest, lock_path: &Path, cache_dir: &Path) {
    Cache::new(cache_dir).put(manifest).expect("cache");
    let mut lock = LockFile::default();
    let remote: Remote = format!("{}@v{}", manifest.interface, manifest.version)
        .parse()
        .expect("remote");
    lock.pin(&remote, &manifest.fingerprint);
    lock.save(lock_path).expect("lock");
}

/// Every file under `dir` (none when it does not exist).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A registry that answers every request with one JSON body, and counts
/// requests (std only).
struct OneAnswerServer {
    url: String,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl OneAnswerServer {
    fn start(body: String) -> Self {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&count);
        // Detached on purpose: it blocks in accept() until the process ends,
        // which is the test binary's end; each test starts its own.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { url, count }
    }

    fn requests(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A manifest whose stated fingerprint is not its content's: `rfidl fetch`
/// exits 2 with the reason, and writes neither the lock nor the cache; a
/// hostile name is refused before any request.
#[test]
fn fetch_refuses_a_manifest_that_is_not_its_fingerprint_and_writes_nothing() {
    let mut manifest = orders();
    manifest.fingerprint = format!("sha256:{}", "0".repeat(64));
    let server = OneAnswerServer::start(manifest.to_pretty_json());
    let dir = tempfile::tempdir().expect("tempdir");
    let (lock, cache_dir) = (dir.path().join("rfidl.lock"), dir.path().join("cache"));
    let remote: Remote = "shop.orders.OrderService@v1".parse().expect("remote");
    let report = Report::capturing(DiagnosticFormat::Json);
    let outcome = rfidl_cli::fetch_with(
        Some(&server.url),
        &lock,
        &Cache::new(&cache_dir),
        std::slice::from_ref(&remote),
        LockPolicy::Update,
        &report,
    );
    assert_eq!(outcome, Outcome::UsageOrIo, "{}", report.captured());
    assert!(
        report.captured().contains("\"severity\":\"error\""),
        "{}",
        report.captured()
    );
    assert!(server.requests() >= 1, "the registry was asked");
    assert!(files_under(dir.path()).is_empty(), "nothing written");

    let before = server.requests();
    let outcome = rfidl_cli::fetch(
        Some(&server.url),
        &lock,
        &Cache::new(&cache_dir),
        &[Remote {
            interface: "../../etc/passwd".into(),
            version: 1,
        }],
        LockPolicy::Update,
    );
    assert_eq!(outcome, Outcome::UsageOrIo);
    assert_eq!(server.requests(), before, "no request for a hostile name");
    assert!(files_under(dir.path()).is_empty());
}

/// `rfidl fetch` and the build against a registry on a closed port: both
/// go on from the cache, and `fetch` says how old the copy is.
#[test]
fn fetch_with_an_unreachable_registry_says_how_old_the_cached_copy_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (lock_path, cache_dir, out) = (
        dir.path().join("rfidl.lock"),
        dir.path().join("cache"),
        dir.path().join("out"),
    );
    std::fs::create_dir_all(&out).expect("mkdir");
    let manifest = orders();
    pin_and_cache(&manifest, &lock_path, &cache_dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");

    let report = Report::capturing(DiagnosticFormat::Json);
    let outcome = rfidl_cli::fetch_with(
        Some(&url),
        &lock_path,
        &Cache::new(&cache_dir),
        &[],
        LockPolicy::Keep,
        &report,
    );
    assert_eq!(outcome, Outcome::Success, "{}", report.captured());
    let warnings: Vec<serde_json::Value> = report
        .captured()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["severity"] == "warning")
        .collect();
    assert_eq!(warnings.len(), 1, "{}", report.captured());
    let message = warnings[0]["message"].as_str().expect("message");
    assert!(
        message.starts_with(&format!(
            "using the cached copy of shop.orders.OrderService v1 ({}) fetched less than a \
             minute ago; the registry {url} is unreachable (",
            manifest.fingerprint
        )),
        "{message}"
    );
    assert!(message.contains("Connection refused"), "{message}");

    let files = Builder::new()
        .skip_rerun_if_changed()
        .remote("shop.orders.OrderService", 1)
        .registry(&url)
        .lock_file(&lock_path)
        .cache_dir(&cache_dir)
        .out_dir(&out)
        .compile(&[] as &[&str])
        .expect("the build goes on from the cache");
    assert!(files.iter().any(|f| f.name == "shop.orders.rs"));
}
