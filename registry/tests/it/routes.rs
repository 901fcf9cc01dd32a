//! The API beyond publish and fetch: an interface's versions, the dry-run
//! compatibility check, conditional GETs, 404 messages and the probes.

use serde_json::Value;

use crate::support::{
    Server, breaking_revision, compatible_revision, get, manifest_path, put, schema_manifest,
    schema_manifests,
};

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn post(url: &str, path: &str, body: String) -> (u16, Value) {
    let response = reqwest::blocking::Client::new()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .expect("post");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn get_if_none_match(url: &str, path: &str, tag: &str) -> reqwest::blocking::Response {
    reqwest::blocking::Client::new()
        .get(format!("{url}{path}"))
        .header("if-none-match", tag)
        .send()
        .expect("get")
}

fn etag(response: &reqwest::blocking::Response) -> String {
    response.headers()["etag"]
        .to_str()
        .expect("etag")
        .to_owned()
}

#[test]
fn an_interface_lists_its_versions_and_every_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let v1 = schema_manifest("hr.employees.EmpService", 1);
    let v2 = schema_manifest("hr.employees.EmpService", 2);
    let v2b = compatible_revision(&v2, "note");
    for manifest in [&v2, &v1, &v2b] {
        let (status, body) = put(
            &server.url,
            &manifest_path(manifest),
            manifest.to_pretty_json(),
            None,
        );
        assert_eq!(status, 201, "{body}");
    }
    let (status, text) = get(&server.url, "/v1/interfaces/hr.employees.EmpService");
    assert_eq!(status, 200, "{text}");
    let listed = json(&text);
    assert_eq!(listed["interface"], "hr.employees.EmpService");
    let versions = listed["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 2, "{listed}");
    assert_eq!(versions[0]["version"], 1);
    assert_eq!(
        versions[0]["revisions"]
            .as_array()
            .expect("revisions")
            .len(),
        1
    );
    assert_eq!(versions[1]["version"], 2);
    let revisions = versions[1]["revisions"].as_array().expect("revisions");
    let fingerprints: Vec<&str> = revisions
        .iter()
        .map(|r| r["fingerprint"].as_str().expect("fingerprint"))
        .collect();
    assert_eq!(
        fingerprints,
        [v2.fingerprint.as_str(), v2b.fingerprint.as_str()]
    );
    assert_eq!(revisions[0]["revision"], 1);
    assert_eq!(revisions[1]["revision"], 2);
    let published = revisions[1]["publishedAt"].as_str().expect("publishedAt");
    let stamp: jiff::Timestamp = published.parse().expect("RFC 3339");
    let age = jiff::Timestamp::now().duration_since(stamp);
    assert!(
        age >= jiff::SignedDuration::ZERO && age < jiff::SignedDuration::from_secs(60),
        "{published}"
    );
}

#[test]
fn a_404_names_what_is_missing_and_what_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    let v2 = schema_manifest("hr.employees.EmpService", 2);
    assert_eq!(
        put(&server.url, &manifest_path(&v2), v2.to_pretty_json(), None).0,
        201
    );

    let cases = [
        (
            "/v1/interfaces/hr.employees.EmpServce",
            "interface `hr.employees.EmpServce` is not published; did you mean `hr.employees.EmpService`?",
        ),
        (
            "/v1/interfaces/hr.employees.EmpServce/v2",
            "interface `hr.employees.EmpServce` is not published; did you mean `hr.employees.EmpService`?",
        ),
        (
            "/v1/interfaces/shop.Nothing",
            "interface `shop.Nothing` is not published",
        ),
        (
            "/v1/interfaces/hr.employees.EmpService/v7",
            "`hr.employees.EmpService` v7 is not published; its published versions are v2",
        ),
    ];
    for (path, message) in cases {
        let (status, text) = get(&server.url, path);
        assert_eq!(status, 404, "{path}: {text}");
        let body = json(&text);
        assert_eq!(body["error"], "not_found", "{path}");
        assert_eq!(body["message"], message, "{path}");
    }
    let (status, text) = get(&server.url, &format!("{}/sha256:00", manifest_path(&v2)));
    assert_eq!(status, 404);
    assert_eq!(
        json(&text)["message"],
        format!(
            "`hr.employees.EmpService` v2 has no revision with fingerprint `sha256:00`; it has 1 \
             revision, the latest is {}",
            v2.fingerprint
        )
    );
    for (method, path) in [
        (
            reqwest::Method::POST,
            "/v1/interfaces/hr.employees.EmpService",
        ),
        (
            reqwest::Method::GET,
            "/v1/compatibility/interfaces/hr.employees.EmpService/v2",
        ),
        (reqwest::Method::PUT, "/readyz"),
    ] {
        let response = reqwest::blocking::Client::new()
            .request(method.clone(), format!("{}{path}", server.url))
            .send()
            .expect("send");
        assert_eq!(response.status().as_u16(), 405, "{method} {path}");
        assert_eq!(
            json(&response.text().expect("body"))["error"],
            "method_not_allowed"
        );
    }
    let (status, text) = get(&server.url, "/v2/nothing");
    assert_eq!(status, 404);
    assert_eq!(
        json(&text)["message"],
        "no route for /v2/nothing; the API is under /v1/interfaces (docs/registry.md)"
    );
}

#[test]
fn the_dry_run_answers_like_a_publish_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        rfidl_registry::Registry::open(&dir.path().join("registry.db"))
            .expect("open")
            .publish_token("s3cret-publish"),
    );
    let v2 = schema_manifest("hr.employees.EmpService", 2);
    let dry = format!("/v1/compatibility/interfaces/{}/v2", v2.interface);

    // Nothing published yet: compatible, against nothing.
    let (status, body) = post(&server.url, &dry, v2.to_pretty_json());
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        serde_json::json!({"compatible": true, "changes": [], "against": null})
    );
    assert_eq!(
        get(&server.url, &manifest_path(&v2)).0,
        404,
        "a dry run stores nothing"
    );

    assert_eq!(
        put(
            &server.url,
            &manifest_path(&v2),
            v2.to_pretty_json(),
            Some("s3cret-publish")
        )
        .0,
        201
    );
    let against = serde_json::json!({"revision": 1, "fingerprint": v2.fingerprint});
    let (status, body) = post(
        &server.url,
        &dry,
        compatible_revision(&v2, "note").to_pretty_json(),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["compatible"], true);
    assert_eq!(body["changes"], serde_json::json!([]));
    assert_eq!(body["against"], against);

    let breaking = breaking_revision(&v2);
    let (status, body) = post(&server.url, &dry, breaking.to_pretty_json());
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["compatible"], false);
    assert_eq!(body["against"], against);
    let changes = body["changes"].as_array().expect("changes");
    assert!(!changes.is_empty(), "{body}");
    // The same changes a publish is refused with.
    let (status, refused) = put(
        &server.url,
        &manifest_path(&v2),
        breaking.to_pretty_json(),
        Some("s3cret-publish"),
    );
    assert_eq!(status, 409);
    assert_eq!(&refused["changes"], &body["changes"]);

    // A publish's input checks, with their codes.
    let (status, body) = post(&server.url, &dry, "{".to_owned());
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("invalid_manifest"))
    );
    let (status, body) = post(
        &server.url,
        "/v1/compatibility/interfaces/hr.employees.EmpService/v1",
        v2.to_pretty_json(),
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("path_mismatch"))
    );
    let mut tampered = v2.clone();
    tampered.methods.remove(0);
    let (status, body) = post(&server.url, &dry, tampered.to_pretty_json());
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("fingerprint_mismatch"))
    );
    let (status, body) = post(
        &server.url,
        "/v1/compatibility/interfaces/hr.employees.EmpService/2",
        v2.to_pretty_json(),
    );
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
    let (status, body) = post(
        &server.url,
        &dry,
        " ".repeat(rfidl_registry::BODY_LIMIT + 1),
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("payload_too_large"))
    );

    // Still exactly one revision.
    let (_, text) = get(&server.url, "/v1/interfaces/hr.employees.EmpService");
    assert_eq!(
        json(&text)["versions"][0]["revisions"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

#[test]
fn conditional_gets_answer_304_without_a_body() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::on_file(&dir.path().join("registry.db"));
    for manifest in schema_manifests() {
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
    let v2 = schema_manifest("hr.employees.EmpService", 2);
    let latest = manifest_path(&v2);
    let exact = format!("{latest}/{}", v2.fingerprint);
    let tag = format!("\"{}\"", v2.fingerprint);
    for path in [latest.as_str(), exact.as_str()] {
        for matching in [
            tag.clone(),
            format!("W/{tag}"),
            "*".to_owned(),
            format!("\"sha256:other\", {tag}"),
            format!("W/\"x\",W/{tag}"),
        ] {
            let response = get_if_none_match(&server.url, path, &matching);
            assert_eq!(response.status().as_u16(), 304, "{path} with {matching}");
            assert_eq!(etag(&response), tag);
            assert_eq!(response.text().expect("body"), "", "a 304 has no body");
        }
        for other in ["\"sha256:other\"", "W/\"sha256:other\"", "garbage"] {
            let response = get_if_none_match(&server.url, path, other);
            assert_eq!(response.status().as_u16(), 200, "{path} with {other}");
            assert_eq!(etag(&response), tag);
            assert!(!response.text().expect("body").is_empty());
        }
    }
    let cache = |path: &str| {
        reqwest::blocking::get(format!("{}{path}", server.url))
            .expect("get")
            .headers()["cache-control"]
            .to_str()
            .expect("ascii")
            .to_owned()
    };
    assert_eq!(cache(&exact), "public, max-age=31536000, immutable");
    assert_eq!(cache(&latest), "no-cache");

    // Lists are tagged by content: a publish changes the tag.
    let mut current = schema_manifest("hr.employees.EmpService", 1);
    for (path, parameter) in [
        ("/v1/interfaces", "note_a"),
        ("/v1/interfaces/hr.employees.EmpService", "note_b"),
    ] {
        let first = reqwest::blocking::get(format!("{}{path}", server.url)).expect("get");
        let listed = etag(&first);
        assert_eq!(
            get_if_none_match(&server.url, path, &listed)
                .status()
                .as_u16(),
            304
        );
        let _ = first.text();
        current = compatible_revision(&current, parameter);
        let (status, body) = put(
            &server.url,
            &manifest_path(&current),
            current.to_pretty_json(),
            None,
        );
        assert_eq!(status, 201, "{body}");
        let response = get_if_none_match(&server.url, path, &listed);
        assert_eq!(response.status().as_u16(), 200, "{path} changed");
        assert_ne!(etag(&response), listed);
    }
}

#[test]
fn readiness_needs_a_writable_database_of_this_schema_and_liveness_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("registry.db");
    let server = Server::on_file(&db);
    let (status, text) = get(&server.url, "/readyz");
    assert_eq!(
        (status, json(&text)),
        (200, serde_json::json!({"status": "ready"}))
    );

    // Another writer holds the database: not ready, still alive.
    let mut other = rusqlite::Connection::open(&db).expect("open");
    let lock = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)
        .expect("lock");
    let started = std::time::Instant::now();
    let (status, text) = get(&server.url, "/readyz");
    assert_eq!(status, 503, "{text}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "answers within the busy bound"
    );
    let body = json(&text);
    assert_eq!(body["status"], "not_ready");
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cannot begin a write transaction")),
        "{body}"
    );
    assert_eq!(get(&server.url, "/livez").0, 200);
    assert_eq!(get(&server.url, "/health").0, 200);
    lock.rollback().expect("unlock");
    assert_eq!(get(&server.url, "/readyz").0, 200);

    // A schema this build does not know (a newer build migrated the file).
    other.pragma_update(None, "user_version", 99).expect("bump");
    let (status, text) = get(&server.url, "/readyz");
    assert_eq!(status, 503, "{text}");
    assert_eq!(
        json(&text)["reason"],
        format!(
            "the database has schema version 99, this build serves {}",
            rfidl_registry::store::MIGRATIONS.len()
        )
    );
    other
        .pragma_update(
            None,
            "user_version",
            rfidl_registry::store::MIGRATIONS.len() as i64,
        )
        .expect("restore");
    assert_eq!(get(&server.url, "/readyz").0, 200);
    assert_eq!(get(&server.url, "/livez").1, "{\"status\":\"ok\"}");
}
