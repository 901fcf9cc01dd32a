//! The chaos harness's verdict counts what it claims: on two databases
//! shaped like the demo's, each kind of failure moves exactly its count.

use std::path::Path;

use rfidl_examples::demo::verdict::verdict;
use rfidl_examples::demo::{engine, hr};
use rfidl_runtime::rusqlite::{Connection, params};

fn open(db: &Path, schema: &str) -> Connection {
    let conn =
        rfidl_runtime::store::sqlite::open(db, rfidl_runtime::Durability::Normal).expect("open");
    conn.execute_batch(schema).expect("schema");
    conn
}

fn outbox_row(conn: &Connection, message_id: &str, status: &str) {
    conn.execute(
        "INSERT INTO outbox_messages (message_id, message_type, destination, interface, version, \
         fingerprint, endpoint, payload, status, max_retries, next_retry_at, created_at, expires_at) \
         VALUES (?1, 'PushCall', 'peer', 'hr.employees.EmpService', 2, 'sha256:x', 'E', '{}', ?2, 5, 0, 0, 1)",
        params![message_id, status],
    )
    .expect("outbox row");
}

/// One hire that went all the way: employee, hire message, workflow,
/// command, ticket.
fn complete_hire(hr: &Connection, engine: &Connection, n: u32) {
    let (employee, hire, command) = (format!("e{n}"), format!("h{n}"), format!("c{n}"));
    hr.execute(
        "INSERT INTO employees (id, name, hired_on) VALUES (?1, 'x', '2026-11-24')",
        [&employee],
    )
    .expect("employee");
    outbox_row(hr, &hire, "Sent");
    engine
        .execute(
            "INSERT INTO workflows (id, employee_id, version, state, message_id) VALUES (?1, ?2, 2, 'p', ?3)",
            params![format!("w{n}"), employee, hire],
        )
        .expect("workflow");
    outbox_row(engine, &command, "Sent");
    hr.execute(
        "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES (?1, 'm', ?2)",
        params![employee, command],
    )
    .expect("ticket");
}

#[test]
fn each_kind_of_failure_moves_exactly_its_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (hr_db, engine_db) = (dir.path().join("hr.db"), dir.path().join("engine.db"));
    let hr = open(&hr_db, hr::SCHEMA.sqlite);
    let engine = open(&engine_db, engine::SCHEMA.sqlite);
    for n in 0..3 {
        complete_hire(&hr, &engine, n);
    }
    let clean = verdict(&hr_db, &engine_db).expect("verdict");
    assert!(clean.ok(), "{clean:?}");
    assert_eq!(clean.hires, 3);

    // A hire whose message never took effect: lost.
    hr.execute(
        "INSERT INTO employees (id, name, hired_on) VALUES ('e9', 'x', '2026-11-24')",
        [],
    )
    .expect("employee");
    outbox_row(&hr, "h9", "Sent");
    let v = verdict(&hr_db, &engine_db).expect("verdict");
    assert_eq!(
        (v.lost, v.duplicated, v.orphans, v.needs_a_human),
        (1, 0, 0, 0)
    );

    // A second workflow for one hire, caused by another message: duplicated.
    outbox_row(&hr, "h0-again", "Sent");
    engine
        .execute(
            "INSERT INTO workflows (id, employee_id, version, state, message_id) VALUES ('w0b', 'e0', 2, 'p', 'h0-again')",
            [],
        )
        .expect("second workflow");
    let v = verdict(&hr_db, &engine_db).expect("verdict");
    assert_eq!(
        (v.lost, v.duplicated, v.orphans, v.needs_a_human),
        (1, 1, 0, 0)
    );

    // An effect no message caused: an orphan.
    hr.execute(
        "INSERT INTO laptop_tickets (employee_id, model, message_id) VALUES ('e9', 'm', 'nobody-sent-this')",
        [],
    )
    .expect("orphan ticket");
    let v = verdict(&hr_db, &engine_db).expect("verdict");
    assert_eq!(v.orphans, 1, "{v:?}");

    // A message left for an operator.
    outbox_row(&engine, "c-failed", "Failed");
    let v = verdict(&hr_db, &engine_db).expect("verdict");
    assert_eq!(v.needs_a_human, 1, "{v:?}");
    assert!(!v.ok());
}
