//! Unit tests of the schema, its indexes and query plans, and the
//! pre-flight check, on real SQLite files.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::migrations::{hex_digit_sql, outbox_seq_sql, uuid_glob};
use super::preflight::file_of;
use super::*;
use crate::config::Durability;
use crate::store::StoreError;

#[test]
fn creates_schema_and_refuses_newer_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rt.db");
    let conn = open(&path, Durability::Normal).expect("open");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, MIGRATIONS.len() as i64);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "user_version", 99).expect("bump");
    drop(conn);
    match open(&path, Durability::Full) {
        Err(StoreError::TooNew { found: 99, .. }) => {}
        other => panic!("expected TooNew, got {other:?}"),
    }
}

/// The opcodes of `sql`'s program.
/// Every row `sql` reads, each as its values joined by `|`: what a
/// migration must keep, compared before and after.
fn dump_rows(conn: &Connection, sql: &str) -> Vec<String> {
    let mut statement = conn.prepare(sql).expect("select");
    let columns = statement.column_count();
    statement
        .query_map([], |row| {
            (0..columns)
                .map(|i| {
                    row.get::<_, rusqlite::types::Value>(i)
                        .map(|v| format!("{v:?}"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|values| values.join("|"))
        })
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
    let mut statement = conn.prepare(&format!("EXPLAIN {sql}")).expect("explain");
    let nulls = vec![rusqlite::types::Null; statement.parameter_count()];
    statement
        .query_map(rusqlite::params_from_iter(nulls), |row| {
            row.get::<_, String>(1)
        })
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn writing_an_outbox_row_builds_no_temporary_btree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open(dir.path().join("o.db"), Durability::Normal).expect("open");
    for sql in [
        "INSERT INTO outbox_messages (seq, message_id, correlation_id, message_type, \
         destination, interface, version, fingerprint, endpoint, payload, headers, status, \
         max_retries, next_retry_at, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'Pending', ?12, ?13, ?13, ?14)",
        "UPDATE outbox_messages SET status = 'Sent', sent_at = ?3 WHERE seq = ?1 AND lease_token = ?2",
        "UPDATE outbox_messages SET status = ?2 WHERE seq = ?1",
    ] {
        let ops = opcodes(&conn, sql);
        assert!(
            !ops.iter().any(|op| op == "OpenEphemeral"),
            "{sql}\nevaluates an IN-list through a temporary b-tree per row: {ops:?}"
        );
    }
}

#[test]
fn queries_for_rows_that_need_a_human_use_the_attention_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open(dir.path().join("o.db"), Durability::Normal).expect("open");
    let sql = concat!(
        "SELECT message_id FROM outbox_messages WHERE ",
        attention!(),
        " AND (?1 IS NULL OR status = ?1) ORDER BY created_at LIMIT 10"
    );
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("plan")
        .query_map([rusqlite::types::Null], |row| row.get(3))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(
        plan.iter().any(|step| step.contains("outbox_attention")),
        "{plan:?}"
    );
}

#[test]
fn the_outbox_rebuild_keeps_every_row_and_its_indexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v3.db");
    let statuses = [
        "Pending",
        "Sending",
        "Sent",
        "Failed",
        "DeadLetter",
        "Expired",
    ];
    {
        let mut conn = Connection::open(&path).expect("create");
        let tx = conn.transaction().expect("tx");
        for script in &MIGRATIONS[..3] {
            tx.execute_batch(script).expect("migrate to 3");
        }
        tx.pragma_update(None, "user_version", 3).expect("version");
        for (n, status) in statuses.iter().enumerate() {
            tx.execute(
                "INSERT INTO outbox_messages (message_id, correlation_id, message_type, \
                 destination, interface, version, fingerprint, endpoint, payload, headers, \
                 status, retry_count, max_retries, next_retry_at, lease_token, \
                 last_attempt_at, last_error, response, created_at, expires_at, sent_at) \
                 VALUES (?1, 'c', 'Command', 'peer', 'p.S', 1, 'sha256:f', 'E', '{}', '{}', \
                 ?2, 2, 5, 100, 'lease', 90, 'boom', '{\"ok\":1}', ?3, 1000, 95)",
                rusqlite::params![format!("id-{n}"), status, n as i64],
            )
            .expect("row");
        }
        tx.commit().expect("commit");
    }
    let dump = |conn: &Connection| -> Vec<String> {
        let mut statement = conn
            .prepare(
                "SELECT message_id, correlation_id, message_type, destination, interface, \
                 version, fingerprint, endpoint, payload, headers, status, retry_count, \
                 max_retries, next_retry_at, lease_token, last_attempt_at, last_error, \
                 response, created_at, expires_at, sent_at \
                 FROM outbox_messages ORDER BY message_id",
            )
            .expect("select");
        let columns = statement.column_count();
        statement
            .query_map([], |row| {
                (0..columns)
                    .map(|i| {
                        row.get::<_, rusqlite::types::Value>(i)
                            .map(|v| format!("{v:?}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(|values| values.join("|"))
            })
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    let before = dump(&Connection::open(&path).expect("reopen"));
    let conn = open(&path, Durability::Normal).expect("migrate");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("version");
    assert_eq!(version, MIGRATIONS.len() as i64);
    assert_eq!(dump(&conn), before, "every row and column kept");
    assert_eq!(before.len(), statuses.len());
    let indexes: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'index' \
             AND tbl_name = 'outbox_messages' AND sql IS NOT NULL ORDER BY name",
        )
        .expect("indexes")
        .query_map([], |row| row.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        indexes,
        [
            "outbox_attention",
            "outbox_discarded",
            "outbox_due",
            "outbox_sent"
        ]
    );
    let refused = conn.execute(
        "UPDATE outbox_messages SET status = 'Lost' WHERE message_id = 'id-0'",
        [],
    );
    assert!(
        refused
            .expect_err("the CHECK still holds")
            .to_string()
            .contains("CHECK"),
    );
}

#[test]
fn the_claim_and_the_look_ups_by_id_use_their_indexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open(dir.path().join("o.db"), Durability::Normal).expect("open");
    let plan = |sql: &str| -> String {
        let mut statement = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plan");
        let nulls = vec![rusqlite::types::Null; statement.parameter_count()];
        let steps: Vec<String> = statement
            .query_map(rusqlite::params_from_iter(nulls), |row| row.get(3))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        steps.join("; ")
    };
    let claim = plan(
        "UPDATE outbox_messages SET status = 'Sending' WHERE seq IN \
         (SELECT seq FROM outbox_messages WHERE destination = ?1 \
          AND status IN ('Pending', 'Sending') AND next_retry_at <= ?2 \
          ORDER BY next_retry_at LIMIT ?3)",
    );
    assert!(
        claim.contains("INDEX outbox_due (destination=? AND next_retry_at<?)"),
        "{claim}"
    );
    assert!(!claim.contains("SCAN outbox_messages"), "{claim}");
    let by_id = plan("SELECT status FROM outbox_messages WHERE message_id = ?1 AND seq = ?2");
    assert!(by_id.contains("INTEGER PRIMARY KEY (rowid=?)"), "{by_id}");
}

#[test]
fn the_seq_of_an_id_is_the_same_in_rust_and_in_the_migration_sql() {
    let conn = Connection::open_in_memory().expect("memory");
    let sql = concat!(
        "SELECT CASE WHEN message_id GLOB '",
        uuid_glob!(),
        "' THEN ",
        outbox_seq_sql!(),
        " END FROM (SELECT ?1 AS message_id)"
    );
    let mut ids: Vec<String> = (0..2_000)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let mut state: u128 = 0x2545_f491_4f6c_dd1d;
    ids.extend((0..200).map(|_| {
        state = state
            .wrapping_mul(0x2d99_7879_26d4_6932_a4c1_f326_80f5_abfd)
            .wrapping_add(0x0123_4567_89ab_cdef);
        uuid::Uuid::from_u128(state).to_string()
    }));
    ids.extend(
        [
            "ffffffff-ffff-7fff-bfff-ffffffffffff",
            "00000000-0000-7000-8000-000000000000",
            "019ab5d3-7f00-7abc-8def-0123456789ab",
        ]
        .map(String::from),
    );
    for id in &ids {
        let in_sql: Option<i64> = conn.query_row(sql, [id], |row| row.get(0)).expect("sql");
        assert_eq!(in_sql, outbox_seq(id), "{id}");
        assert!(in_sql.is_some_and(|seq| seq >= 0), "{id}");
    }
    for text in [
        "id-0",
        "",
        "019AB5D3-7F00-7ABC-8DEF-0123456789AB",
        "019ab5d3-7f00-7abc-8def-0123456789ag",
        "019ab5d37f007abc8def0123456789ab",
        "019ab5d3-7f00-7abc-8def-0123456789abc",
    ] {
        let in_sql: Option<i64> = conn.query_row(sql, [text], |row| row.get(0)).expect("sql");
        assert_eq!((in_sql, outbox_seq(text)), (None, None), "{text:?}");
    }
    // The ids one process makes get distinct values, in their order
    // but for the rare wrap of the counter's low 15 bits.
    let seqs: Vec<i64> = ids[..2_000]
        .iter()
        .map(|id| outbox_seq(id).expect("uuid"))
        .collect();
    let distinct: std::collections::HashSet<_> = seqs.iter().collect();
    assert_eq!(distinct.len(), seqs.len());
    let in_order = seqs.windows(2).filter(|pair| pair[0] < pair[1]).count();
    assert!(in_order >= seqs.len() - 10, "{in_order} of {}", seqs.len());
}

#[test]
fn migration_6_keeps_every_row_findable_and_dispatchable() {
    use crate::circuit::Admission;
    use crate::dispatcher::records::DispatchDb as _;
    use crate::dispatcher::{Outcome, Verdict};

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v5.db");
    let statuses = [
        "Pending",
        "Sending",
        "Sent",
        "Failed",
        "DeadLetter",
        "Expired",
    ];
    let now = now_ms();
    let mut ids: Vec<String> = statuses
        .iter()
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    // Two ids of one millisecond whose counters end alike share a seq;
    // and an id that is no UUID at all (written by hand).
    ids.push("00000000-0001-7000-8aaa-000000000000".to_owned());
    ids.push("00000000-0001-7000-9bbb-000000000001".to_owned());
    ids.push("hand-written".to_owned());
    {
        let mut conn = Connection::open(&path).expect("create");
        let tx = conn.transaction().expect("tx");
        for script in &MIGRATIONS[..5] {
            tx.execute_batch(script).expect("migrate to 5");
        }
        tx.pragma_update(None, "user_version", 5).expect("version");
        for (n, id) in ids.iter().enumerate() {
            let status = statuses.get(n).copied().unwrap_or("Pending");
            // Due now; a Sending row's lease ran out.
            tx.execute(
                "INSERT INTO outbox_messages (message_id, correlation_id, message_type, \
                 destination, interface, version, fingerprint, endpoint, payload, headers, \
                 status, retry_count, max_retries, next_retry_at, lease_token, \
                 last_attempt_at, last_error, response, created_at, expires_at, sent_at, \
                 answered_at) \
                 VALUES (?1, 'c', 'Command', 'peer', 'p.S', 1, 'sha256:f', 'E', '{}', '{}', \
                 ?2, 2, 5, ?3, 'lease', 90, 'boom', '{\"ok\":1}', ?4, ?5, 95, 96)",
                rusqlite::params![id, status, now - 1_000, n as i64, now + 3_600_000],
            )
            .expect("row");
        }
        tx.commit().expect("commit");
    }
    let columns = "message_id, correlation_id, message_type, destination, interface, \
        version, fingerprint, endpoint, payload, headers, status, retry_count, max_retries, \
        next_retry_at, lease_token, last_attempt_at, last_error, response, created_at, \
        expires_at, sent_at, answered_at";
    let dump = |conn: &Connection| -> Vec<String> {
        let mut statement = conn
            .prepare(&format!(
                "SELECT {columns} FROM outbox_messages ORDER BY message_id"
            ))
            .expect("select");
        let count = statement.column_count();
        statement
            .query_map([], |row| {
                (0..count)
                    .map(|i| {
                        row.get::<_, rusqlite::types::Value>(i)
                            .map(|v| format!("{v:?}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(|values| values.join("|"))
            })
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    let before = dump(&Connection::open(&path).expect("reopen"));
    assert_eq!(before.len(), ids.len());
    let conn = open(&path, Durability::Normal).expect("migrate");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("version");
    assert_eq!(version, MIGRATIONS.len() as i64, "migrated to the latest");
    assert_eq!(dump(&conn), before, "every row and column kept");
    let seq_of = |id: &str| -> i64 {
        conn.query_row(
            "SELECT seq FROM outbox_messages WHERE message_id = ?1",
            [id],
            |row| row.get(0),
        )
        .expect("seq")
    };
    let max_derived = ids[..statuses.len()]
        .iter()
        .map(|id| seq_of(id))
        .max()
        .expect("rows");
    for (n, id) in ids.iter().enumerate() {
        if n < statuses.len() {
            assert_eq!(Some(seq_of(id)), outbox_seq(id), "{id}");
            let parsed = uuid::Uuid::parse_str(id).expect("uuid");
            let found = crate::store::sqlite::outbox_row(&conn, &parsed).expect("row");
            assert_eq!(found.map(|row| row.status.as_str()), Some(statuses[n]));
        } else {
            // Shared or no derived seq: a rowid past every derived one.
            assert!(seq_of(id) > max_derived, "{id}");
        }
    }
    let indexes: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'index' \
             AND tbl_name = 'outbox_messages' AND sql IS NOT NULL ORDER BY name",
        )
        .expect("indexes")
        .query_map([], |row| row.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        indexes,
        [
            "outbox_attention",
            "outbox_discarded",
            "outbox_due",
            "outbox_sent"
        ]
    );
    assert!(
        conn.execute(
            "UPDATE outbox_messages SET status = 'Lost' WHERE message_id = ?1",
            [&ids[0]],
        )
        .expect_err("the CHECK still holds")
        .to_string()
        .contains("CHECK")
    );

    // The dispatcher claims the Pending rows and the Sending row whose
    // lease ran out (not the others), and records them Sent.
    let dispatch = crate::store::sqlite::dispatch::SqliteDispatch::new(
        conn,
        None,
        Durability::Normal,
        Vec::new(),
        Default::default(),
    );
    let (claimed, result) = tokio::sync::oneshot::channel();
    dispatch.claim(
        &[("peer".to_owned(), Admission::Closed { batch_limit: 50 })],
        30_000,
        100,
        4,
        claimed,
        crate::dispatcher::records::ClaimCommit::Now,
    );
    let claim = result.blocking_recv().expect("an answer").expect("claim");
    assert_eq!(claim.expired, 0);
    let claimed: Vec<crate::dispatcher::Claimed> = claim
        .groups
        .into_iter()
        .flat_map(|group| group.rows)
        .collect();
    let mut claimed_ids: Vec<&str> = claimed.iter().map(|row| row.message_id.as_str()).collect();
    claimed_ids.sort_unstable();
    let mut expected: Vec<&str> = vec![&ids[0], &ids[1]];
    expected.extend(ids[statuses.len()..].iter().map(String::as_str));
    expected.sort_unstable();
    assert_eq!(claimed_ids, expected);
    let attempts: Vec<_> = claimed
        .into_iter()
        .map(|row| {
            (
                (row, Outcome::Unsendable(String::new()), Duration::ZERO),
                Verdict::Sent {
                    response: serde_json::json!({"ok": true}),
                },
            )
        })
        .collect();
    let counts = dispatch
        .record(&attempts, &crate::config::Config::default())
        .expect("record");
    assert_eq!(counts.sent, expected.len() as u64);
    let conn = open(&path, Durability::Normal).expect("reopen");
    let sent: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'",
            [],
            |row| row.get(0),
        )
        .expect("count");
    assert_eq!(sent, 1 + expected.len() as i64);
}

/// The migration that adds `Discarded` rebuilds the outbox (its CHECK
/// names every status): every row and column comes through, `seq`
/// included, the new status is accepted and any other text still refused.
#[test]
fn the_discarded_migration_keeps_every_row_and_accepts_the_new_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    let discard = MIGRATIONS
        .iter()
        .position(|script| script.contains("outbox_messages_discard"))
        .expect("the migration");
    let statuses = [
        "Pending",
        "Sending",
        "Sent",
        "Failed",
        "DeadLetter",
        "Expired",
    ];
    {
        let mut conn = Connection::open(&path).expect("create");
        let tx = conn.transaction().expect("tx");
        for script in &MIGRATIONS[..discard] {
            tx.execute_batch(script).expect("migrate");
        }
        tx.pragma_update(None, "user_version", discard as i64)
            .expect("version");
        for (n, status) in statuses.iter().enumerate() {
            let id = format!("00000000-000{n}-7000-8000-00000000000{n}");
            tx.execute(
                "INSERT INTO outbox_messages (message_id, correlation_id, message_type, \
                 destination, interface, version, fingerprint, endpoint, payload, headers, \
                 status, retry_count, max_retries, next_retry_at, lease_token, \
                 last_attempt_at, last_error, response, created_at, expires_at, sent_at, \
                 answered_at, seq) \
                 VALUES (?1, 'c', 'Command', 'peer', 'p.S', 1, 'sha256:f', 'E', '{\"a\":1}', \
                 '{}', ?2, 2, 5, 10, 'lease', 90, 'boom', NULL, ?3, 99, 95, 96, ?4)",
                rusqlite::params![id, status, n as i64, outbox_seq(&id)],
            )
            .expect("row");
        }
        tx.commit().expect("commit");
    }
    let dump = |conn: &Connection| {
        dump_rows(
            conn,
            "SELECT message_id, correlation_id, message_type, destination, interface, \
             version, fingerprint, endpoint, payload, headers, status, retry_count, \
             max_retries, next_retry_at, lease_token, last_attempt_at, last_error, \
             response, created_at, expires_at, sent_at, answered_at, seq \
             FROM outbox_messages ORDER BY seq",
        )
    };
    let before = dump(&Connection::open(&path).expect("reopen"));
    assert_eq!(before.len(), statuses.len());
    let conn = open(&path, Durability::Normal).expect("migrate");
    assert_eq!(dump(&conn), before, "every row, every column, the same seq");
    let first = "00000000-0003-7000-8000-000000000003";
    assert_eq!(
        conn.execute(
            "UPDATE outbox_messages SET status = 'Discarded', discarded_at = 5 \
             WHERE message_id = ?1",
            [first],
        )
        .expect("Discarded is a status"),
        1
    );
    assert!(
        conn.execute(
            "UPDATE outbox_messages SET status = 'Lost' WHERE message_id = ?1",
            [first],
        )
        .expect_err("the CHECK still holds")
        .to_string()
        .contains("CHECK")
    );
    // Retention reads discarded rows through their index.
    let plan: Vec<String> = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT seq FROM outbox_messages \
             WHERE status = 'Discarded' AND discarded_at < 10 ORDER BY discarded_at",
        )
        .expect("plan")
        .query_map([], |row| row.get(3))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(
        plan.iter().any(|step| step.contains("outbox_discarded")),
        "{plan:?}"
    );
}

fn sha256_of(path: &Path) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(path).expect("read")).to_vec()
}

#[test]
fn a_newer_rollback_journal_database_is_refused_unchanged() {
    let newer = MIGRATIONS.len() as i64 + 1;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("newer.db");
    {
        // Written by a "newer version": rollback journal, a
        // user_version one past this build's.
        let conn = Connection::open(&path).expect("create");
        conn.execute_batch(&format!(
            "CREATE TABLE t (x); PRAGMA user_version = {};",
            newer
        ))
        .expect("schema");
    }
    let before = sha256_of(&path);
    match open(&path, Durability::Full) {
        Err(error @ StoreError::TooNew { found, .. }) if found == newer => {
            assert!(
                error.to_string().contains("refusing to touch it"),
                "{error}"
            );
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
    assert_eq!(
        sha256_of(&path),
        before,
        "the file is byte-for-byte unchanged"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("newer.db")],
        "no -wal or -shm created"
    );
}

#[test]
fn garbage_in_the_middle_of_a_database_is_refused_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("damaged.db");
    {
        let conn = open(&path, Durability::Normal).expect("create");
        conn.execute_batch(
            "CREATE TABLE business (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
             CREATE INDEX business_text ON business (text);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
             INSERT INTO business (text) SELECT printf('row %d %s', i, hex(randomblob(40))) FROM n;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .expect("fill");
    }
    let len = std::fs::metadata(&path).expect("size").len();
    assert!(len > 100_000, "a file of some size: {len}");
    {
        use std::io::{Seek as _, SeekFrom, Write as _};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open for damage");
        file.seek(SeekFrom::Start(len / 2)).expect("seek");
        file.write_all(&[0xA5; 8192]).expect("garbage");
    }
    let before = sha256_of(&path);
    match preflight(&path, MIGRATIONS.len() as i64) {
        Err(error @ StoreError::Corrupt { .. }) => {
            assert!(error.to_string().contains("damaged"), "{error}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        sha256_of(&path),
        before,
        "the file is byte-for-byte unchanged"
    );
}

#[test]
fn uri_filenames_are_opened_and_preflighted_like_paths() {
    assert_eq!(
        file_of(Path::new("file:///srv/a%20b.db?vfs=unix#x")),
        Path::new("/srv/a b.db")
    );
    assert_eq!(
        file_of(Path::new("file://localhost/srv/a.db")),
        Path::new("/srv/a.db")
    );
    assert_eq!(file_of(Path::new("/srv/a.db")), Path::new("/srv/a.db"));
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.db");
    let uri = |file: &Path| format!("file:{}?vfs=unix", file.display());
    drop(open(uri(&good), Durability::Normal).expect("open through a URI"));
    assert!(good.exists());
    let notes = dir.path().join("notes.db");
    std::fs::write(&notes, vec![b'x'; 4096]).expect("write");
    assert!(matches!(
        open(uri(&notes), Durability::Normal),
        Err(StoreError::Corrupt { .. })
    ));
}

#[test]
fn a_file_that_is_not_a_database_is_refused_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notes.db");
    std::fs::write(&path, vec![b'x'; 4096]).expect("write");
    let before = sha256_of(&path);
    assert!(matches!(
        open(&path, Durability::Normal),
        Err(StoreError::Corrupt { .. })
    ));
    assert_eq!(sha256_of(&path), before);
}

#[test]
fn reopening_is_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rt.db");
    drop(open(&path, Durability::Normal).expect("first open"));
    let conn = open(&path, Durability::Full).expect("second open");
    let sync: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .expect("sync");
    assert_eq!(sync, 2, "FULL");
}
