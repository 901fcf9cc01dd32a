//! The HTTP API: publish, fetch, revisions, refusals with their codes.

use rfidl_codegen::manifest::Manifest;
use rfidl_registry::{Registry, StoreError};
use serde_json::json;

use crate::support::{
    Server, breaking_revision, compatible_revision, get, manifest_path, put, schema_manifest,
    schema_manifests,
};

fn parse(text: &str) -> Manifest {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not a manifest ({e}): {text}"))
}

#[test]
fn published_manifests_come_back_equal_and_listed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let manifests = schema_manifests();
    for manifest in &manifests {
        let (status, body) = put(
            &server.url,
            &manifest_path(manifest),
            manifest.to_pretty_json(),
            None,
        );
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["revision"], 1);
        assert_eq!(body["created"], true);
        assert_eq!(body["fingerprint"], manifest.fingerprint.as_str());

        let response = reqwest::blocking::get(format!("{}{}", server.url, manifest_path(manifest)))
            .expect("get");
        assert_eq!(response.status().as_u16(), 200);
        let etag = response.headers()["etag"]
            .to_str()
            .expect("etag")
            .to_owned();
        assert_eq!(etag, format!("\"{}\"", manifest.fingerprint));
        assert_eq!(&parse(&response.text().expect("body")), manifest);
        let (status, text) = get(
            &server.url,
            &format!("{}/{}", manifest_path(manifest), manifest.fingerprint),
        );
        assert_eq!(status, 200);
        assert_eq!(&parse(&text), manifest);
    }
    let (status, text) = get(&server.url, "/v1/interfaces");
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_str(&text).expect("json");
    let interfaces = listed["interfaces"].as_array().expect("array");
    assert_eq!(interfaces.len(), 2, "{listed}");
    assert_eq!(interfaces[0]["interface"], "hr.employees.EmpService");
    assert_eq!(interfaces[0]["versions"][1]["version"], 2);
    assert_eq!(interfaces[0]["versions"][1]["revisions"], 1);

    // The same fingerprint again: 200, nothing new.
    let (status, body) = put(
        &server.url,
        &manifest_path(&manifests[0]),
        manifests[0].to_pretty_json(),
        None,
    );
    assert_eq!((status, body["created"].clone()), (200, json!(false)));
    assert_eq!(body["revision"], 1);
}

#[test]
fn a_compatible_revision_is_added_and_a_breaking_one_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let first = schema_manifest("hr.employees.EmpService", 2);
    let path = manifest_path(&first);
    assert_eq!(put(&server.url, &path, first.to_pretty_json(), None).0, 201);

    let second = compatible_revision(&first, "note");
    let (status, body) = put(&server.url, &path, second.to_pretty_json(), None);
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["revision"], 2);
    let (_, latest) = get(&server.url, &path);
    assert_eq!(parse(&latest), second, "the latest revision is served");
    let (status, old) = get(&server.url, &format!("{path}/{}", first.fingerprint));
    assert_eq!(status, 200);
    assert_eq!(parse(&old), first, "revision 1 stays fetchable");

    let broken = breaking_revision(&second);
    let (status, body) = put(&server.url, &path, broken.to_pretty_json(), None);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "breaking_change");
    assert_eq!(body["changes"][0]["code"], "B0002", "{body}");
    let (_, latest) = get(&server.url, &path);
    assert_eq!(parse(&latest), second, "nothing stored");
    let (status, _) = get(&server.url, &format!("{path}/{}", broken.fingerprint));
    assert_eq!(status, 404);
}

#[test]
fn each_refusal_has_its_code_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let manifest = schema_manifest("shop.orders.OrderService", 1);
    let path = manifest_path(&manifest);

    let mut tampered = serde_json::to_value(&manifest).expect("json");
    tampered["methods"][0]["name"] = json!("Renamed");
    let oversized = format!(
        "{{\"padding\": \"{}\"}}",
        "x".repeat(rfidl_registry::BODY_LIMIT)
    );
    let cases: Vec<(&str, String, String, u16, &str)> = vec![
        (
            "not JSON",
            path.clone(),
            "{ nope".into(),
            422,
            "invalid_manifest",
        ),
        (
            "JSON, not a manifest",
            path.clone(),
            r#"{"interface": "x"}"#.into(),
            422,
            "invalid_manifest",
        ),
        (
            "another interface's path",
            "/v1/interfaces/hr.employees.EmpService/v1".into(),
            manifest.to_pretty_json(),
            422,
            "path_mismatch",
        ),
        (
            "content edited, fingerprint kept",
            path.clone(),
            tampered.to_string(),
            422,
            "fingerprint_mismatch",
        ),
        (
            "too large",
            path.clone(),
            oversized,
            413,
            "payload_too_large",
        ),
        (
            "not a version",
            "/v1/interfaces/shop.orders.OrderService/one".into(),
            manifest.to_pretty_json(),
            400,
            "bad_request",
        ),
    ];
    let mut cases = cases;
    for segment in ["v+1", "v01", "v0", "v", "V1"] {
        cases.push((
            "a version not in its one canonical form",
            format!("/v1/interfaces/shop.orders.OrderService/{segment}"),
            manifest.to_pretty_json(),
            400,
            "bad_request",
        ));
    }
    for (what, path, body, status, code) in cases {
        let (got, answer) = put(&server.url, &path, body, None);
        assert_eq!(
            (got, answer["error"].as_str()),
            (status, Some(code)),
            "{what}: {answer}"
        );
        assert!(answer["message"].is_string(), "{what}: {answer}");
    }
    let (status, text) = get(&server.url, &path);
    assert_eq!(status, 404, "nothing was stored: {text}");
    assert!(text.contains("\"not_found\""), "{text}");

    let (status, text) = get(&server.url, "/v2/nothing/here");
    assert_eq!(status, 404);
    assert!(text.contains("\"not_found\""), "{text}");
    let response = reqwest::blocking::Client::new()
        .delete(format!("{}{path}", server.url))
        .send()
        .expect("delete");
    assert_eq!(
        response.status().as_u16(),
        405,
        "manifests are never deleted"
    );
    assert!(
        response
            .text()
            .expect("body")
            .contains("method_not_allowed")
    );
}

#[test]
fn a_publish_token_guards_writes_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::open(&dir.path().join("registry.db"))
        .expect("open")
        .publish_token("ops-token");
    let server = Server::start(registry);
    let manifest = schema_manifest("shop.orders.OrderService", 1);
    let path = manifest_path(&manifest);
    for token in [None, Some("guess")] {
        let (status, body) = put(&server.url, &path, manifest.to_pretty_json(), token);
        assert_eq!(
            (status, body["error"].clone()),
            (401, json!("unauthorized"))
        );
    }
    assert_eq!(
        get(&server.url, &path).0,
        404,
        "the refused publish stored nothing"
    );
    let (status, _) = put(
        &server.url,
        &path,
        manifest.to_pretty_json(),
        Some("ops-token"),
    );
    assert_eq!(status, 201);
    assert_eq!(get(&server.url, &path).0, 200, "reads need no token");

    // The scheme is case-insensitive (RFC 9110): curl users write `bearer`.
    let revision = compatible_revision(&manifest, "note");
    let response = reqwest::blocking::Client::new()
        .put(format!("{}{path}", server.url))
        .header("authorization", "bearer ops-token")
        .body(revision.to_pretty_json())
        .send()
        .expect("put");
    assert_eq!(response.status().as_u16(), 201);
    for header in ["Bearer", "Bearer ", "Basic ops-token", "Bearerops-token"] {
        let response = reqwest::blocking::Client::new()
            .put(format!("{}{path}", server.url))
            .header("authorization", header)
            .body(revision.to_pretty_json())
            .send()
            .expect("put");
        assert_eq!(response.status().as_u16(), 401, "{header:?}");
    }
}

#[test]
fn an_empty_publish_token_fails_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::open(&dir.path().join("registry.db"))
        .expect("open")
        .publish_token("");
    let server = Server::start(registry);
    let manifest = schema_manifest("shop.orders.OrderService", 1);
    let path = manifest_path(&manifest);
    for token in [None, Some("")] {
        let (status, body) = put(&server.url, &path, manifest.to_pretty_json(), token);
        assert_eq!(
            (status, body["error"].clone()),
            (401, json!("unauthorized"))
        );
    }
    assert_eq!(get(&server.url, &path).0, 404, "nothing stored");
}

#[test]
fn manifests_survive_a_restart_and_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let manifest = schema_manifest("hr.employees.EmpService", 1);
    {
        let server = Server::on_file(&db);
        assert_eq!(
            put(
                &server.url,
                &manifest_path(&manifest),
                manifest.to_pretty_json(),
                None
            )
            .0,
            201
        );
    }
    let server = Server::on_file(&db);
    let (status, text) = get(&server.url, &manifest_path(&manifest));
    assert_eq!(status, 200);
    assert_eq!(parse(&text), manifest);
    drop(server);

    let conn = rusqlite_connection(&db);
    conn.pragma_update(None, "user_version", 99).expect("bump");
    drop(conn);
    match Registry::open(&db) {
        Err(StoreError::TooNew { found: 99, .. }) => {}
        Err(other) => panic!("expected TooNew, got {other}"),
        Ok(_) => panic!("a newer schema was opened"),
    }
}

fn rusqlite_connection(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).expect("open")
}

#[test]
fn concurrent_publishes_of_one_revision_store_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let first = schema_manifest("shop.orders.OrderService", 1);
    let path = manifest_path(&first);
    assert_eq!(put(&server.url, &path, first.to_pretty_json(), None).0, 201);
    let second = compatible_revision(&first, "note");
    let answers: Vec<(u16, serde_json::Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| put(&server.url, &path, second.to_pretty_json(), None)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let created = answers.iter().filter(|(status, _)| *status == 201).count();
    assert_eq!(created, 1, "{answers:?}");
    assert!(
        answers.iter().all(|(_, body)| body["revision"] == 2),
        "{answers:?}"
    );
    let (_, text) = get(&server.url, "/v1/interfaces");
    let listed: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(listed["interfaces"][0]["versions"][0]["revisions"], 2);
}

/// `manifest` with a deprecation note: compatible with it and with every
/// other such revision, in either order.
fn deprecated_revision(manifest: &Manifest, note: &str) -> Manifest {
    let mut revised = manifest.clone();
    revised.deprecated = Some(note.to_owned());
    revised.with_fingerprint()
}

#[test]
fn concurrent_different_revisions_from_two_registries_on_one_file_get_distinct_numbers() {
    // Two registries on one file have two connections, as two processes
    // would: only the IMMEDIATE transaction serialises them, not the
    // in-process connection lock.
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let servers = [Server::on_file(&db), Server::on_file(&db)];
    let first = schema_manifest("hr.employees.EmpService", 2);
    let path = manifest_path(&first);
    assert_eq!(
        put(&servers[0].url, &path, first.to_pretty_json(), None).0,
        201
    );

    const ROUNDS: u32 = 5;
    let mut published = vec![(1, first.fingerprint.clone())];
    for round in 0..ROUNDS {
        let revisions = [
            deprecated_revision(&first, &format!("a{round}")),
            deprecated_revision(&first, &format!("b{round}")),
        ];
        let start = std::sync::Barrier::new(2);
        let answers: Vec<(u16, serde_json::Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = servers
                .iter()
                .zip(&revisions)
                .map(|(server, revision)| {
                    let (start, path) = (&start, &path);
                    scope.spawn(move || {
                        start.wait();
                        put(&server.url, path, revision.to_pretty_json(), None)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        let mut numbers: Vec<u64> = Vec::new();
        for ((status, body), revision) in answers.iter().zip(&revisions) {
            assert_eq!(*status, 201, "round {round}: {answers:?}");
            assert_eq!(body["fingerprint"], revision.fingerprint.as_str());
            let number = body["revision"].as_u64().expect("revision number");
            numbers.push(number);
            published.push((number, revision.fingerprint.clone()));
        }
        numbers.sort_unstable();
        let expected = u64::from(2 * round + 2);
        assert_eq!(
            numbers,
            [expected, expected + 1],
            "round {round}: {answers:?}"
        );
    }

    let (_, text) = get(&servers[1].url, "/v1/interfaces");
    let listed: serde_json::Value = serde_json::from_str(&text).expect("json");
    let version = &listed["interfaces"][0]["versions"][0];
    assert_eq!(version["version"], 2, "{listed}");
    assert_eq!(version["revisions"], 2 * ROUNDS + 1, "{listed}");
    published.sort();
    let (_, latest) = published.last().expect("revisions").clone();
    assert_eq!(version["latestFingerprint"], latest.as_str(), "{listed}");
    for (number, fingerprint) in &published {
        let (status, text) = get(&servers[0].url, &format!("{path}/{fingerprint}"));
        assert_eq!(status, 200, "revision {number}: {text}");
        assert_eq!(&parse(&text).fingerprint, fingerprint);
    }
}
