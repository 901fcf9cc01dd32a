//! `rfidl messages` end to end (issue 30): the `rfidl` binary against a
//! real diagnostics router of rfidl-runtime, served over loopback HTTP on a
//! real SQLite outbox holding `Failed` and `DeadLetter` rows.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rfidl_runtime::{Config, Diagnostics, MessageType, Outbox, OutgoingMessage};
use serde_json::{Value, json};

const TOKEN: &str = "ops-token-for-tests";
/// In every payload: no output may ever contain it.
const SECRET: &str = "SALARY-987654-SECRET";

/// A service: its SQLite outbox, the router served on loopback (with or
/// without a token), and the token file.
struct Service {
    _dir: tempfile::TempDir,
    db: PathBuf,
    url: String,
    token_file: PathBuf,
    /// Serves the router until the test ends.
    _runtime: tokio::runtime::Runtime,
}

impl Service {
    /// `failed` `Failed` rows to `ledger`, `dead` `DeadLetter` rows to
    /// `billing`, one `Pending` row; the ids in that order.
    fn start(failed: usize, dead: usize, token: Option<&str>) -> (Self, Vec<String>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("service.db");
        let outbox: Outbox = Outbox::new(Config::default(), db.as_path());
        let mut conn = rfidl_runtime::store::sqlite::open(&db, rfidl_runtime::Durability::Normal)
            .expect("open");
        let tx = conn.transaction().expect("tx");
        let mut ids = Vec::new();
        for i in 0..failed + dead + 1 {
            let destination = if i < failed { "ledger" } else { "billing" };
            let message = OutgoingMessage {
                destination: destination.into(),
                message_type: MessageType::Command,
                interface: "hr.payroll.PayrollService".into(),
                version: 1,
                fingerprint: "sha256:test".into(),
                endpoint: "Credit".into(),
                correlation_id: Some(format!("c-{i}")),
                payload: json!({"salary": SECRET, "n": i}),
                headers: Default::default(),
                max_retries: None,
                ttl: None,
                deliver_at: None,
            };
            ids.push(outbox.enqueue(&tx, message).expect("enqueue").to_string());
        }
        tx.commit().expect("commit");
        // Many rows: one statement (every row but the Pending one).
        let many = dead == 0 && failed > 100;
        if many {
            conn.execute_batch(&format!(
                "UPDATE outbox_messages SET status = 'Failed', last_error = 'connect: refused' \
                 WHERE message_id <> '{}'",
                ids[failed]
            ))
            .expect("update");
        }
        for (i, id) in ids.iter().enumerate().filter(|_| !many) {
            let set = if i < failed {
                "status = 'Failed', retry_count = 5, last_error = '500 handler_failed: ledger down'"
            } else if i < failed + dead {
                "status = 'DeadLetter', retry_count = 1, last_error = '400 bad_request: `amount`'"
            } else {
                continue;
            };
            conn.execute_batch(&format!(
                "UPDATE outbox_messages SET {set} WHERE message_id = '{id}'"
            ))
            .expect("update");
        }
        let mut builder = Diagnostics::builder(db.as_path());
        if let Some(token) = token {
            builder = builder.bearer_token(token);
        }
        let router = builder.build().expect("diagnostics").router();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        runtime.spawn(async move { axum::serve(listener, router).await.expect("serve") });
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
        let service = Self {
            _dir: dir,
            db,
            url,
            token_file,
            _runtime: runtime,
        };
        (service, ids)
    }

    /// `rfidl messages ARGS --service URL --token-file F`.
    fn rfidl(&self, args: &[&str]) -> Output {
        self.rfidl_with(args, &["--token-file", path_str(&self.token_file)])
    }

    fn rfidl_with(&self, args: &[&str], extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_rfidl"))
            .arg("messages")
            .args(args)
            .args(["--service", &self.url])
            .args(extra)
            .env_remove("RFIDL_OPS_TOKEN")
            .env_remove("RFIDL_OPS_TOKEN_FILE")
            .output()
            .expect("run rfidl")
    }

    /// (message id, status) of every outbox row, read from the file itself.
    fn rows(&self) -> Vec<(String, String)> {
        let conn = rfidl_runtime::store::sqlite::open(&self.db, rfidl_runtime::Durability::Normal)
            .expect("open");
        let mut statement = conn
            .prepare("SELECT message_id, status FROM outbox_messages ORDER BY message_id")
            .expect("prepare");
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("query")
            .map(|row| row.expect("row"))
            .collect()
    }

    fn status_of(&self, id: &str) -> String {
        self.rows()
            .into_iter()
            .find(|(row, _)| row == id)
            .map(|(_, status)| status)
            .expect("row exists")
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

fn out(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn err(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_ok(output: &Output) {
    assert_eq!(output.status.code(), Some(0), "stderr: {}", err(output));
}

/// Exit 2, `error[code]` on stderr, nothing on stdout.
fn assert_refused(output: &Output, code: &str) {
    assert_eq!(output.status.code(), Some(2), "stderr: {}", err(output));
    let wanted = format!("error[{code}]");
    assert!(err(output).contains(&wanted), "{wanted} in {}", err(output));
    assert!(out(output).is_empty(), "stdout: {}", out(output));
}

/// The ids of a list's JSON answer, in order.
fn listed_ids(answer: &Value) -> Vec<String> {
    answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["messageId"].as_str().expect("id").to_owned())
        .collect()
}

fn json_of(output: &Output) -> Value {
    serde_json::from_str(out(output).trim()).expect("one JSON document on stdout")
}

fn no_secret(output: &Output) {
    assert!(
        !out(output).contains(SECRET) && !err(output).contains(SECRET),
        "a payload was printed: {}{}",
        out(output),
        err(output)
    );
}

#[test]
fn list_prints_an_aligned_table_and_json_without_payloads() {
    let (service, ids) = Service::start(2, 1, Some(TOKEN));

    let table = service.rfidl(&["list"]);
    assert_ok(&table);
    no_secret(&table);
    let text = out(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three rows: {text}");
    assert!(lines[0].starts_with("ID"), "{text}");
    // Aligned: every column starts where its header does.
    let status_at = lines[0].find("STATUS").expect("STATUS column");
    let destination_at = lines[0].find("DESTINATION").expect("DESTINATION column");
    for (line, id) in lines[1..].iter().zip(&ids) {
        assert!(line.starts_with(id.as_str()), "oldest first: {text}");
        assert!(
            line[status_at..].starts_with("Failed") || line[status_at..].starts_with("DeadLetter"),
            "{text}"
        );
        assert!(
            line[destination_at..].starts_with("ledger")
                || line[destination_at..].starts_with("billing"),
            "{text}"
        );
    }
    assert!(
        lines[1].contains("500 handler_failed: ledger down"),
        "{text}"
    );
    assert!(
        !text.contains(&ids[3]),
        "the Pending row is not listed: {text}"
    );

    let json = service.rfidl(&["list", "--format", "json", "--status", "DeadLetter"]);
    assert_ok(&json);
    no_secret(&json);
    let answer = json_of(&json);
    let messages = answer["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1, "{answer}");
    assert_eq!(messages[0]["messageId"], json!(ids[2]));
    assert_eq!(messages[0]["destination"], "billing");
    assert!(answer.get("nextCursor").is_none(), "{answer}");
}

#[test]
fn list_follows_every_page_or_prints_one_with_its_cursor() {
    let (service, ids) = Service::start(5, 0, Some(TOKEN));

    let first = service.rfidl(&["list", "--format", "json", "--limit", "2"]);
    assert_ok(&first);
    let first = json_of(&first);
    assert_eq!(listed_ids(&first), ids[..2]);
    let cursor = first["nextCursor"].as_str().expect("a next cursor");
    let second = service.rfidl(&[
        "list", "--format", "json", "--limit", "2", "--cursor", cursor,
    ]);
    assert_ok(&second);
    assert_eq!(listed_ids(&json_of(&second)), ids[2..4]);

    // Text: the cursor to go on with, on stderr.
    let one = service.rfidl(&["list", "--limit", "2"]);
    assert_ok(&one);
    assert!(
        err(&one).contains("more follow: --cursor "),
        "{}",
        err(&one)
    );

    // Without --limit and --cursor: every page (the service's pages hold
    // up to 1,000; five rows are followed whatever the page size is).
    let all = service.rfidl(&["list", "--format", "json"]);
    assert_ok(&all);
    assert_eq!(listed_ids(&json_of(&all)), ids[..5]);

    // A cursor under another filter is the service's 400.
    let mismatch = service.rfidl(&[
        "list",
        "--limit",
        "2",
        "--cursor",
        cursor,
        "--destination",
        "billing",
    ]);
    assert_refused(&mismatch, "cursor_mismatch");
}

#[test]
fn list_follows_next_cursor_past_the_services_largest_page() {
    // The service's pages hold at most 1,000 messages: 1,003 take two.
    let (service, ids) = Service::start(1003, 0, Some(TOKEN));
    let all = service.rfidl(&["list", "--format", "json", "--destination", "ledger"]);
    assert_ok(&all);
    let answer = json_of(&all);
    assert_eq!(
        listed_ids(&answer),
        ids[..1003],
        "every row once, oldest first"
    );
    assert!(answer.get("nextCursor").is_none());
    let table = service.rfidl(&["list"]);
    assert_ok(&table);
    assert_eq!(out(&table).lines().count(), 1 + 1003);
    assert!(err(&table).contains("1003 messages"), "{}", err(&table));
}

#[test]
fn groups_count_per_destination_and_error_code() {
    let (service, _) = Service::start(3, 2, Some(TOKEN));
    let json = service.rfidl(&["groups", "--format", "json"]);
    assert_ok(&json);
    let mut groups: Vec<(String, String, u64)> = json_of(&json)["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            (
                g["destination"].as_str().expect("destination").to_owned(),
                g["errorCode"].as_str().expect("code").to_owned(),
                g["count"].as_u64().expect("count"),
            )
        })
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        [
            ("billing".into(), "bad_request".into(), 2),
            ("ledger".into(), "handler_failed".into(), 3)
        ]
    );
    let table = service.rfidl(&["groups"]);
    assert_ok(&table);
    let text = out(&table);
    assert!(text.starts_with("DESTINATION  ERROR"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ledger       handler_failed  3")),
        "{text}"
    );
}

#[test]
fn show_prints_the_metadata_and_never_the_payload() {
    let (service, ids) = Service::start(1, 1, Some(TOKEN));
    let shown = service.rfidl(&["show", &ids[1]]);
    assert_ok(&shown);
    no_secret(&shown);
    let text = out(&shown);
    for expected in [
        format!("id:             {}", ids[1]),
        "status:         DeadLetter".into(),
        "destination:    billing".into(),
        "interface:      hr.payroll.PayrollService".into(),
        "method:         Credit".into(),
        "correlation id: c-1".into(),
        "attempts:       1".into(),
        "last error:     400 bad_request: `amount`".into(),
    ] {
        assert!(
            text.lines().any(|l| l == expected),
            "{expected:?} in {text}"
        );
    }
    assert!(text.contains("created:"), "{text}");

    let json = service.rfidl(&["show", &ids[0], "--format", "json"]);
    assert_ok(&json);
    no_secret(&json);
    assert_eq!(json_of(&json)["status"], "Failed");
    assert!(json_of(&json).get("payload").is_none());

    // A Pending message is not among the failed ones; an unknown id neither.
    for id in [ids[2].as_str(), "0190f2c4-0000-7000-8000-000000000000"] {
        assert_refused(&service.rfidl(&["show", id]), "not_found");
    }
}

#[test]
fn retry_and_discard_change_the_rows() {
    let (service, ids) = Service::start(3, 2, Some(TOKEN));

    let one = service.rfidl(&["retry", &ids[0]]);
    assert_ok(&one);
    assert!(err(&one).contains("retried 1 message"), "{}", err(&one));
    assert_eq!(service.status_of(&ids[0]), "Pending");

    let bulk = service.rfidl(&["discard", "--destination", "billing", "--format", "json"]);
    assert_ok(&bulk);
    assert_eq!(json_of(&bulk), json!({"discarded": 2}));
    assert_eq!(service.status_of(&ids[3]), "Discarded");
    assert_eq!(service.status_of(&ids[4]), "Discarded");

    // Every filter of `list` selects: nothing matches this error text.
    let none = service.rfidl(&["discard", "--error", "no such error", "--format", "json"]);
    assert_ok(&none);
    assert_eq!(json_of(&none), json!({"discarded": 0}));
    let bulk = service.rfidl(&[
        "retry",
        "--interface",
        "hr.payroll.PayrollService",
        "--error",
        "ledger down",
        "--format",
        "json",
    ]);
    assert_ok(&bulk);
    assert_eq!(json_of(&bulk)["retried"], 2);
    assert_eq!(service.status_of(&ids[1]), "Pending");

    // A discarded message is not retried: the service's 409, nothing changed.
    let before = service.rows();
    let refused = service.rfidl(&["retry", &ids[3]]);
    assert_refused(&refused, "not_retryable");
    assert_eq!(service.rows(), before);

    // A Pending message (retried above) is not discardable.
    assert_refused(&service.rfidl(&["discard", &ids[0]]), "not_discardable");
    assert_eq!(service.rows(), before);
}

#[test]
fn refusals_have_the_service_code_and_exit_2_and_change_nothing() {
    let (service, ids) = Service::start(2, 1, Some(TOKEN));
    let before = service.rows();

    // No token, a wrong one: 401.
    let none = service.rfidl_with(&["retry", &ids[0]], &[]);
    assert_refused(&none, "unauthorized");
    assert!(err(&none).contains("(HTTP 401)"), "{}", err(&none));
    let wrong = service.rfidl_with(&["discard", "--all"], &["--token", "nope"]);
    assert_refused(&wrong, "unauthorized");
    assert!(!err(&wrong).contains("nope"), "the token is never printed");

    // An unknown id, an id that is no UUID, a bad filter: 404, 400, 400.
    let unknown = service.rfidl(&["retry", "0190f2c4-0000-7000-8000-000000000000"]);
    assert_refused(&unknown, "not_found");
    let bad_id = service.rfidl(&["discard", "../../health"]);
    assert_refused(&bad_id, "bad_request");
    let bad_status = service.rfidl(&["discard", "--status", "Sent"]);
    assert_refused(&bad_status, "bad_request");
    let bad_list = service.rfidl(&["list", "--older-than", "soon"]);
    assert_refused(&bad_list, "bad_request");
    assert!(out(&bad_list).is_empty());
    // json: the error as a JSON line on stderr, stdout empty for scripts.
    let bad_json = service.rfidl(&["list", "--older-than", "soon", "--format", "json"]);
    assert_eq!(bad_json.status.code(), Some(2));
    assert!(out(&bad_json).is_empty(), "{}", out(&bad_json));
    let error: Value = serde_json::from_str(err(&bad_json).trim()).expect("a JSON line");
    assert_eq!(
        (&error["code"], &error["status"]),
        (&json!("bad_request"), &json!(400)),
        "{error}"
    );

    assert_eq!(service.rows(), before, "no refusal changed a row");
}

#[test]
fn a_service_without_a_token_refuses_changes_with_token_required() {
    let (service, ids) = Service::start(1, 0, None);
    let before = service.rows();
    let refused = service.rfidl_with(&["retry", &ids[0]], &[]);
    assert_refused(&refused, "token_required");
    assert_eq!(service.rows(), before);
    // Reading needs no token there.
    assert_ok(&service.rfidl_with(&["list"], &[]));
}

#[test]
fn usage_errors_and_an_unreachable_service_exit_2() {
    let (service, _) = Service::start(1, 0, Some(TOKEN));
    // Neither an id nor a filter; both; a token file that is not there.
    for args in [
        vec!["retry"],
        vec![
            "discard",
            "0190f2c4-0000-7000-8000-000000000000",
            "--status",
            "Failed",
        ],
    ] {
        assert_eq!(service.rfidl(&args).status.code(), Some(2), "{args:?}");
    }
    let missing = service.rfidl_with(&["list"], &["--token-file", "/no/such/token"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        err(&missing).contains("cannot read the diagnostics token file /no/such/token"),
        "{}",
        err(&missing)
    );

    // A port nobody listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let output = Command::new(env!("CARGO_BIN_EXE_rfidl"))
        .args(["messages", "list", "--service", &url])
        .env_remove("RFIDL_OPS_TOKEN")
        .env_remove("RFIDL_OPS_TOKEN_FILE")
        .output()
        .expect("run rfidl");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        err(&output).contains(&format!("cannot reach the service at {url}")),
        "{}",
        err(&output)
    );
}
