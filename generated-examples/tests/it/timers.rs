//! Durable timers through the checked-in generated clients:
//! `client.deliver_after(delay)` and `client.deliver_at(when)` write the row
//! now, due later (its `next_retry_at` and `created_at`), with its TTL from
//! then; the client they came from still sends at once. A real SQLite file.

#![allow(
    deprecated,
    reason = "EmpService v1 is deprecated in the contract; it is the smallest version with a client"
)]

use std::path::Path;
use std::time::{Duration, SystemTime};

use rfidl_examples::generated::hr::employees::emp_service_v1::EngineClient;
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::types::{Timestamp, Uuid};
use rfidl_runtime::{Config, Durability};

/// (`next_retry_at`, `created_at`, `expires_at`) of the row of `id`.
fn times(db: &Path, id: &Uuid) -> (i64, i64, i64) {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.query_row(
        "SELECT next_retry_at, created_at, expires_at FROM outbox_messages WHERE message_id = ?1",
        [id.to_string()],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .expect("row")
}

fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

#[test]
fn generated_clients_schedule_messages_with_deliver_at_and_deliver_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("hr.db");
    let config = Config::for_service("hr");
    let ttl = config.outbox.ttl.as_millis() as i64;
    let client = EngineClient::new(Outbox::new(config, &db), "engine");
    let mut conn = rfidl_runtime::store::sqlite::open(&db, Durability::Normal).expect("open");
    let tx = conn.transaction().expect("tx");
    let before = unix_ms(SystemTime::now());
    let later = client
        .deliver_after(Duration::from_secs(3600))
        .onboarding_completed(&tx, Uuid::now_v7(), Timestamp::now())
        .expect("enqueue");
    let deadline: Timestamp = "2100-01-01T00:00:00Z".parse().expect("timestamp");
    let at = client
        .deliver_at(deadline)
        .onboarding_completed(&tx, Uuid::now_v7(), Timestamp::now())
        .expect("enqueue");
    let now = client
        .onboarding_completed(&tx, Uuid::now_v7(), Timestamp::now())
        .expect("enqueue");
    tx.commit().expect("commit");
    let after = unix_ms(SystemTime::now());

    let (due, created, expires) = times(&db, &later);
    assert!(
        (before + 3_600_000..=after + 3_600_000).contains(&due),
        "{due}"
    );
    assert_eq!((created, expires), (due, due + ttl));
    let due = deadline.as_millisecond();
    assert_eq!(times(&db, &at), (due, due, due + ttl));
    let (due, created, _) = times(&db, &now);
    assert!(
        (before..=after).contains(&due),
        "the plain client sends at once"
    );
    assert_eq!(created, due);
}
