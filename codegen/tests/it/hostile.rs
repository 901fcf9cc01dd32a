//! Hostile manifests at every entry point of the codegen side: the
//! validator itself (each code, and the same verdict as the checker on names
//! a contract can spell), a registry answering over real HTTP (`rfidl
//! fetch`: refused, nothing cached or locked), a file planted in the offline
//! cache (refused at read), and `Builder::remote` (hostile names never become
//! paths, hostile manifests never become code). The registry's own publish
//! check is tested in `registry/tests/it/hostile.rs`.

use std::path::{Path, PathBuf};

use crate::support::manifests_of;
use rfidl_codegen::Builder;
use rfidl_codegen::builder::BuildError;
use rfidl_codegen::check::check_paths;
use rfidl_codegen::manifest::{Field, Manifest, MethodKind, TypeDef, TypeRef, Variant};
use rfidl_codegen::registry::{Cache, LockFile, RegistryError, Remote};

fn orders() -> Manifest {
    manifests_of(&[PathBuf::from("../schemas")])
        .into_iter()
        .find(|m| m.interface == "shop.orders.OrderService")
        .expect("OrderService v1")
}

/// `orders()` after `edit`, with a fingerprint that matches the edited
/// content (so only the rule the edit breaks fires, not M0008).
fn edited(edit: impl FnOnce(&mut Manifest)) -> Manifest {
    let mut manifest = orders();
    edit(&mut manifest);
    manifest.with_fingerprint()
}

fn codes(manifest: &Manifest) -> Vec<String> {
    match manifest.validate() {
        Ok(()) => Vec::new(),
        Err(invalid) => invalid.problems.into_iter().map(|p| p.code).collect(),
    }
}

fn field(name: &str, ty: &str) -> Field {
    Field {
        name: name.into(),
        ty: ty.parse().expect("type"),
        docs: Vec::new(),
        deprecated: None,
    }
}

/// What a hostile manifest is, the manifest, and the code it is refused with.
type Case = (&'static str, Manifest, &'static str);

/// The hostile manifests of issue 15 and the other rules, each with the code
/// it must be refused with. Built once per test binary (the 10 MB name is
/// slow to fingerprint in a debug build).
fn hostile_cases() -> Vec<Case> {
    static CASES: std::sync::OnceLock<Vec<Case>> = std::sync::OnceLock::new();
    CASES.get_or_init(build_hostile_cases).clone()
}

fn build_hostile_cases() -> Vec<Case> {
    let interface = |name: &'static str| {
        edited(move |m| {
            m.interface = name.into();
        })
    };
    vec![
        (
            "interface ../../etc/passwd",
            interface("../../etc/passwd"),
            "M0002",
        ),
        ("interface a/b", interface("a/b"), "M0002"),
        ("empty interface", interface(""), "M0002"),
        ("interface <script>", interface("<script>"), "M0002"),
        (
            "package with a slash",
            edited(|m| {
                m.package = "../shop".into();
                m.interface = "../shop.OrderService".into();
            }),
            "M0003",
        ),
        (
            "empty service name",
            edited(|m| {
                m.service = String::new();
                m.interface = "shop.orders.".into();
            }),
            "M0004",
        ),
        (
            "service <script>",
            edited(|m| {
                m.service = "<script>".into();
                m.interface = "shop.orders.<script>".into();
            }),
            "M0004",
        ),
        (
            "method `Hired(); } fn pwn() {`",
            edited(|m| m.methods[0].name = "Hired(); } fn pwn() {".into()),
            "M0004",
        ),
        (
            "undefined type",
            edited(|m| {
                m.methods[1]
                    .params
                    .push(field("ghost", "shop.orders.Ghost"))
            }),
            "M0012",
        ),
        (
            "type name with a space",
            edited(|m| {
                let def = m.types.remove("shop.orders.Order").expect("Order");
                m.types.insert("shop.orders.Or der".into(), def);
            }),
            "M0004",
        ),
        (
            "field named r#fn",
            edited(|m| m.methods[1].params[1].name = "r#fn".into()),
            "M0004",
        ),
        (
            "10 MB method name",
            edited(|m| m.methods[0].name = "A".repeat(10 * 1024 * 1024)),
            "M0005",
        ),
        (
            "non-ASCII that is not an identifier",
            edited(|m| m.methods[0].name = "Hire\u{200b}d".into()),
            "M0004",
        ),
        (
            "method named like a Rust keyword in lowercase",
            edited(|m| m.methods[0].name = "fn".into()),
            "M0006",
        ),
        ("version 0", edited(|m| m.version = 0), "M0007"),
        (
            "stated fingerprint is not the content's",
            {
                let mut manifest = orders();
                manifest.methods[0].name = "Renamed".into();
                manifest
            },
            "M0008",
        ),
        (
            "duplicate method",
            edited(|m| {
                let first = m.methods[0].clone();
                m.methods.push(first);
            }),
            "M0009",
        ),
        (
            "parameter named like a generated argument",
            edited(|m| m.methods[1].params[1].name = "tx".into()),
            "M0010",
        ),
        (
            "fields self and self_",
            edited(|m| {
                m.methods[1].params[0].name = "self".into();
                m.methods[1].params[1].name = "self_".into();
            }),
            "M0011",
        ),
        (
            "methods GetURL and GetUrl",
            edited(|m| {
                m.methods[0].name = "GetURL".into();
                m.methods[1].name = "GetUrl".into();
            }),
            "M0011",
        ),
        (
            "a package module named like the service-version module",
            edited(|m| {
                m.methods[1]
                    .params
                    .push(field("flag", "shop.orders.order_service_v1.Flag"));
                m.types.insert(
                    "shop.orders.order_service_v1.Flag".into(),
                    TypeDef::Enum {
                        docs: Vec::new(),
                        deprecated: None,
                        variants: vec![Variant {
                            name: "On".into(),
                            docs: Vec::new(),
                            deprecated: None,
                        }],
                    },
                );
            }),
            "M0011",
        ),
        (
            "type named like a trait generated code uses",
            edited(|m| {
                m.methods[1].params.push(field("sync", "shop.orders.Sync"));
                m.types.insert(
                    "shop.orders.Sync".into(),
                    TypeDef::Enum {
                        docs: Vec::new(),
                        deprecated: None,
                        variants: vec![Variant {
                            name: "On".into(),
                            docs: Vec::new(),
                            deprecated: None,
                        }],
                    },
                );
            }),
            "M0010",
        ),
        (
            "type nobody uses",
            edited(|m| {
                m.types.insert(
                    "shop.orders.Unused".into(),
                    TypeDef::Enum {
                        docs: Vec::new(),
                        deprecated: None,
                        variants: vec![Variant {
                            name: "One".into(),
                            docs: Vec::new(),
                            deprecated: None,
                        }],
                    },
                );
            }),
            "M0013",
        ),
        (
            "optional of an optional",
            edited(|m| {
                m.methods[1].params[1].ty = TypeRef::Optional(Box::new(TypeRef::Optional(
                    Box::new("string".parse().expect("type")),
                )))
            }),
            "M0014",
        ),
        (
            "lists nested deeper than a contract may",
            edited(|m| {
                m.methods[1].params[1].ty =
                    format!("{}string{}", "list<".repeat(65), ">".repeat(65))
                        .parse()
                        .expect("parses: under the parser's guard")
            }),
            "M0014",
        ),
        (
            "signal with a response",
            edited(|m| {
                let signal = m
                    .methods
                    .iter_mut()
                    .find(|m| m.kind == MethodKind::Signal)
                    .expect("a signal");
                signal.response = Some("string".parse().expect("type"));
            }),
            "M0016",
        ),
        (
            "correlate through nothing",
            edited(|m| m.methods[0].correlate = Some(vec!["order".into(), "ghost".into()])),
            "M0018",
        ),
        (
            "doc comment line that ends the comment",
            edited(|m| m.methods[0].docs = vec!["x\n} fn pwn() {".into()]),
            "M0020",
        ),
    ]
}

#[test]
fn hostile_every_manifest_the_checker_makes_is_valid() {
    let mut roots = vec![PathBuf::from("../schemas")];
    roots.retain(|p| p.exists());
    let manifests = manifests_of(&roots);
    assert!(manifests.len() >= 3, "the schemas hold several services");
    for manifest in manifests {
        assert_eq!(
            manifest.validate(),
            Ok(()),
            "{} v{}",
            manifest.interface,
            manifest.version
        );
    }
}

#[test]
fn hostile_manifests_are_refused_with_their_codes() {
    for (what, manifest, code) in hostile_cases() {
        let codes = codes(&manifest);
        assert!(codes.contains(&code.to_owned()), "{what}: {codes:?}");
        // Messages never carry a long name in full.
        let message = manifest.validate().expect_err(what).to_string();
        assert!(
            message.len() < 10_000,
            "{what}: message of {} bytes",
            message.len()
        );
    }
}

/// Empty enums and required cycles need a manifest of their own shape.
#[test]
fn hostile_shapes_the_generator_cannot_build_are_refused() {
    let empty_enum = edited(|m| {
        m.methods[1]
            .params
            .push(field("state", "shop.orders.Nothing"));
        m.types.insert(
            "shop.orders.Nothing".into(),
            TypeDef::Enum {
                docs: Vec::new(),
                deprecated: None,
                variants: Vec::new(),
            },
        );
    });
    assert!(codes(&empty_enum).contains(&"M0015".to_owned()));
    let cycle = edited(|m| {
        m.methods[1].params.push(field("node", "shop.orders.Node"));
        m.types.insert(
            "shop.orders.Node".into(),
            TypeDef::Record {
                docs: Vec::new(),
                deprecated: None,
                fields: vec![field("next", "shop.orders.Node")],
            },
        );
    });
    assert!(codes(&cycle).contains(&"M0017".to_owned()));
    let optional = edited(|m| {
        m.methods[1].params.push(field("node", "shop.orders.Node"));
        m.types.insert(
            "shop.orders.Node".into(),
            TypeDef::Record {
                docs: Vec::new(),
                deprecated: None,
                fields: vec![field("next", "shop.orders.Node?")],
            },
        );
    });
    assert_eq!(
        codes(&optional),
        Vec::<String>::new(),
        "an optional edge is fine"
    );
}

/// For names a contract can spell, the validator's verdict is the
/// checker's: a keyword as a field (`type`, `fn`, `self`) is accepted by
/// both, a lowercase keyword as a method is refused by both, and so on.
#[test]
fn hostile_names_get_the_checkers_verdict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let verdict_of_checker = |method: &str, param: &str| {
        let path = dir.path().join("names.rfidl");
        std::fs::write(
            &path,
            format!("package names;\nservice S v1 {{\n    signal {method}({param}: string);\n}}\n"),
        )
        .expect("write");
        let outcome = check_paths(&[path]).expect("readable");
        outcome
            .model
            .map(|model| model.packages[0].services[0].clone())
    };
    let base = verdict_of_checker("Base", "base").expect("a valid contract");
    let cases = [
        ("Fn", "fn"),
        ("Type", "type"),
        ("Self_", "self"),
        ("Self", "crate"),
        ("Super", "_"),
        ("fn", "x"),
        ("type", "x"),
        ("New", "x"),
        ("Émile", "straße"),
        ("東京", "x"),
        ("Hire", "Upper"),
        ("Hire", "double__under"),
        ("Hire", "tx"),
        ("Hire", "call"),
        ("Hire_Now", "x"),
        ("_Hire", "x"),
        ("Serialize", "x"),
    ];
    let mut verdicts = [0, 0];
    for (method, param) in cases {
        let checker_accepts = verdict_of_checker(method, param).is_some();
        verdicts[usize::from(checker_accepts)] += 1;
        let mut manifest = base.clone();
        manifest.methods[0].name = method.into();
        manifest.methods[0].params[0].name = param.into();
        let manifest = manifest.with_fingerprint();
        let validator_accepts = manifest.validate().is_ok();
        assert_eq!(
            validator_accepts,
            checker_accepts,
            "method `{method}`, parameter `{param}`: validator {validator_accepts}, checker {checker_accepts}: {:?}",
            manifest.validate()
        );
    }
    assert!(
        verdicts[0] >= 5 && verdicts[1] >= 5,
        "both verdicts are exercised: {verdicts:?}"
    );

    // Every name made of one or two pieces (keywords, case, underscores,
    // digits, letters without case), as a method and as a parameter.
    let pieces = [
        "fn",
        "Fn",
        "type",
        "self",
        "Self",
        "_",
        "a",
        "B",
        "é",
        "É",
        "東",
        "1",
        "tx",
        "call",
        "New",
        "Url",
        "URL",
        "Serialize",
        "r",
    ];
    let mut names: Vec<String> = pieces.iter().map(|p| (*p).to_owned()).collect();
    for first in pieces {
        for second in pieces {
            names.push(format!("{first}{second}"));
        }
    }
    let mut disagreements = Vec::new();
    for name in &names {
        for (method, param) in [(name.as_str(), "x"), ("Hire", name.as_str())] {
            let checker_accepts = verdict_of_checker(method, param).is_some();
            let mut manifest = base.clone();
            manifest.methods[0].name = method.into();
            manifest.methods[0].params[0].name = param.into();
            let validator_accepts = manifest.with_fingerprint().validate().is_ok();
            if checker_accepts != validator_accepts {
                disagreements.push(format!(
                    "method `{method}`, param `{param}`: checker {checker_accepts}, validator {validator_accepts}"
                ));
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} disagreement(s):\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

/// The code a reader (cache, registry client) refuses `manifest` with: a
/// text over the size limit is refused before it is parsed (M0021).
fn read_code(manifest: &Manifest, code: &'static str) -> &'static str {
    if manifest.to_pretty_json().len() > rfidl_codegen::validate::MAX_MANIFEST_BYTES {
        "M0021"
    } else {
        code
    }
}

/// Lock pins `manifest` and its (hostile) JSON is planted in the cache where
/// a genuine fetch would have put it.
fn plant(manifest: &Manifest, lock_path: &Path, cache_dir: &Path) -> PathBuf {
    let path = Cache::new(cache_dir)
        .path_of(&manifest.interface, manifest.version, &manifest.fingerprint)
        .expect("a valid id");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&path, manifest.to_pretty_json()).expect("plant");
    let mut lock = LockFile::default();
    lock.pin(
        &Remote {
            interface: manifest.interface.clone(),
            version: manifest.version,
        },
        &manifest.fingerprint,
    );
    lock.save(lock_path).expect("lock");
    path
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn hostile_files_planted_in_the_cache_are_refused_at_read() {
    // Hostile content under a valid interface id: the file is where a fetch
    // would have put it, and its fingerprint matches its content.
    for (what, manifest, code) in hostile_cases() {
        if !rfidl_codegen::validate::is_interface_id(&manifest.interface)
            || manifest.version == 0
            || manifest.fingerprint != manifest.compute_fingerprint()
            || manifest.interface != "shop.orders.OrderService"
        {
            continue;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let (lock, cache, out) = (
            dir.path().join("rfidl.lock"),
            dir.path().join("cache"),
            dir.path().join("out"),
        );
        std::fs::create_dir_all(&out).expect("mkdir");
        plant(&manifest, &lock, &cache);
        let error = Builder::new()
            .skip_rerun_if_changed()
            .remote("shop.orders.OrderService", 1)
            .lock_file(&lock)
            .cache_dir(&cache)
            .out_dir(&out)
            .compile(&[] as &[&str])
            .expect_err(what);
        let code = read_code(&manifest, code);
        match &error {
            BuildError::Registry(RegistryError::InvalidManifest { origin, problems }) => {
                assert!(origin.contains("cache"), "{what}: {origin}");
                assert!(problems.has(code), "{what}: {problems}");
            }
            other => panic!("{what}: {other}"),
        }
        assert!(files_under(&out).is_empty(), "{what}: nothing generated");
    }
}

#[test]
fn hostile_names_never_become_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("inside");
    let (lock, cache, out) = (
        root.join("rfidl.lock"),
        root.join("cache"),
        root.join("out"),
    );
    std::fs::create_dir_all(&out).expect("mkdir");
    for name in [
        "../../etc/passwd",
        "../escape.Service",
        "a/b",
        "",
        "<script>",
        "shop.orders/../../x.S",
        "shop.orders.Order Service",
    ] {
        // Builder::remote, without a registry: refused before any path.
        let error = Builder::new()
            .skip_rerun_if_changed()
            .remote(name, 1)
            .lock_file(&lock)
            .cache_dir(&cache)
            .out_dir(&out)
            .compile(&[] as &[&str])
            .expect_err(name);
        assert!(
            matches!(
                error,
                BuildError::Registry(RegistryError::InvalidName { .. })
            ),
            "{name}: {error}"
        );
        // The cache computes no path for it either.
        assert!(
            Cache::new(&cache)
                .path_of(name, 1, &orders().fingerprint)
                .is_err()
        );
    }
    assert!(
        Cache::new(&cache)
            .path_of("shop.orders.OrderService", 1, "sha256:../../../x")
            .is_err()
    );
    // A lock file naming a hostile interface or fingerprint is refused.
    for (interface, fingerprint) in [
        ("../../etc/passwd", orders().fingerprint),
        (
            "shop.orders.OrderService",
            "sha256:../../../../tmp/x".to_owned(),
        ),
    ] {
        std::fs::write(
            &lock,
            format!(
                r#"{{"format": 1, "interfaces": [{{"interface": "{interface}", "version": 1, "fingerprint": "{fingerprint}"}}]}}"#
            ),
        )
        .expect("lock");
        assert!(
            matches!(LockFile::load(&lock), Err(RegistryError::LockFile { .. })),
            "{interface} {fingerprint}"
        );
    }
    std::fs::remove_file(&lock).expect("rm");
    // Nothing was written anywhere: not in the cache, not next to it.
    assert_eq!(files_under(dir.path()), Vec::<PathBuf>::new());
}

/// Resolution (what `rfidl fetch` and `Builder::remote` run) against a
/// registry answering hostile manifests over real HTTP (a one-route server
/// on loopback, std only): refused, and nothing is written to the cache or
/// the lock. (`rfidl fetch` itself: `cli/tests/it/fetch.rs`.)
#[cfg(feature = "registry")]
#[test]
fn hostile_fetch_is_refused_and_writes_nothing() {
    use rfidl_codegen::registry::client::RegistryClient;
    use rfidl_codegen::registry::{LockPolicy, Source, resolve};

    /// What `rfidl fetch` does: resolve, then save the lock only on success.
    fn fetch(
        url: Option<&str>,
        lock_path: &Path,
        cache: &Cache,
        remotes: &[Remote],
        policy: LockPolicy,
    ) -> Result<(), RegistryError> {
        let mut lock = LockFile::load(lock_path)?;
        let client = url.map(RegistryClient::new).transpose()?;
        let source = client.as_ref().map(|c| c as &dyn Source);
        resolve(remotes, &mut lock, cache, source, policy)?;
        lock.save(lock_path).map(|_| ())
    }

    for (what, manifest, code) in hostile_cases() {
        if manifest.interface != "shop.orders.OrderService" || manifest.version != 1 {
            continue;
        }
        let body = manifest.to_pretty_json();
        let server = OneAnswerServer::start(body);
        let dir = tempfile::tempdir().expect("tempdir");
        let (lock, cache_dir) = (dir.path().join("rfidl.lock"), dir.path().join("cache"));
        let cache = Cache::new(&cache_dir);
        let remote: Remote = "shop.orders.OrderService@v1".parse().expect("remote");

        let client = RegistryClient::new(&server.url).expect("client");
        let code = read_code(&manifest, code);
        match client.latest(&remote) {
            Err(RegistryError::InvalidManifest { problems, .. }) => {
                assert!(problems.has(code), "{what}: {problems}");
            }
            // A stated fingerprint that is not the content's is caught by
            // the integrity check first.
            Err(RegistryError::BadManifest { .. }) if code == "M0008" => {}
            other => panic!("{what}: {other:?}"),
        }
        let outcome = fetch(
            Some(&server.url),
            &lock,
            &cache,
            std::slice::from_ref(&remote),
            LockPolicy::Update,
        );
        assert!(outcome.is_err(), "{what}");
        assert!(!lock.exists(), "{what}: the lock is not written");
        assert!(files_under(&cache_dir).is_empty(), "{what}: nothing cached");
        assert!(server.requests() >= 2, "{what}: the registry was asked");
    }
    // A hostile name is refused before any request or path.
    let server = OneAnswerServer::start(orders().to_pretty_json());
    let dir = tempfile::tempdir().expect("tempdir");
    let cache_dir = dir.path().join("cache");
    let outcome = fetch(
        Some(&server.url),
        &dir.path().join("rfidl.lock"),
        &Cache::new(&cache_dir),
        &[Remote {
            interface: "../../etc/passwd".into(),
            version: 1,
        }],
        LockPolicy::Update,
    );
    assert!(outcome.is_err());
    assert_eq!(server.requests(), 0, "no request for a hostile name");
    assert!(files_under(dir.path()).is_empty());
}

/// An HTTP/1.1 server on loopback that answers every request with one JSON
/// body, and counts requests (std only: codegen has no server stack).
#[cfg(feature = "registry")]
struct OneAnswerServer {
    url: String,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[cfg(feature = "registry")]
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

/// Every manifest code is in the table of `docs/errors.md` and has its own
/// section; every code the hostile cases expect is a known one.
#[test]
fn hostile_manifest_codes_are_documented() {
    use rfidl_codegen::validate::CODES;
    let errors = std::fs::read_to_string("../docs/errors.md").expect("docs/errors.md");
    for (code, _) in CODES {
        let anchor = code.to_lowercase();
        assert!(
            errors.contains(&format!("| [{code}](#{anchor}) |")),
            "{code} in the table"
        );
        assert!(
            errors.contains(&format!("\n## {code}\n")),
            "{code} has a section"
        );
    }
    let known: Vec<&str> = CODES.iter().map(|(code, _)| *code).collect();
    for (what, manifest, code) in hostile_cases() {
        assert!(known.contains(&code), "{what}: {code}");
        if let Err(invalid) = manifest.validate() {
            for problem in invalid.problems {
                assert!(known.contains(&problem.code.as_str()), "{what}: {problem}");
            }
        }
    }
}
