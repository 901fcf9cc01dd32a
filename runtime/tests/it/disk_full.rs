//! A full disk under the receiver and under the sender (the fault VFS's byte
//! quota, [`crate::faultfs`]): refusals are retryable, nothing is half
//! written, the database stays intact, and once space returns every message
//! is processed exactly once.
//!
//! SQLite-only: the quota is a SQLite VFS's; the store-independent failures
//! run on both stores in `faults.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rfidl_runtime::Durability;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, OutboxError, Status};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::transport::{HttpTransport, OutgoingRequest, SendFuture, Transport};
use uuid::Uuid;

use crate::dispatcher::{message, sender_config};
use crate::faultfs::FaultDir;
use crate::powerloss::{FaultyReceiver, assert_integrity};
use crate::support;

/// A read-only connection with the ordinary VFS to a live database.
fn peek(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open read-only")
}

fn traces(conn: &rusqlite::Connection, id: &Uuid) -> (i64, i64) {
    let count = |sql: &str| -> i64 {
        conn.query_row(sql, [id.to_string()], |r| r.get(0))
            .expect("count")
    };
    (
        count("SELECT count(*) FROM inbox_messages WHERE message_id = ?1"),
        count("SELECT count(*) FROM ledger WHERE message_id = ?1"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_receiver_answers_retryable_and_recovers_exactly_once() {
    let receiver = FaultyReceiver::start(Durability::Full).await;
    let first = Uuid::now_v7();
    assert_eq!(receiver.credit(&first, 1).await.0, 200);

    // The disk is full: no file may grow any more.
    receiver.fault.set_quota(Some(receiver.fault.usage()));
    let refused: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    for id in &refused {
        let (status, retry_after, body) = receiver.credit_with_headers(id, 10).await;
        assert_eq!(
            (status, body["error"].as_str(), retry_after.as_deref()),
            (503, Some("storage_unavailable"), Some("1")),
            "a full disk must be refused as retryable: {body}"
        );
    }
    // The handler ran (its effect was written in the transaction) and was rolled back.
    assert!(receiver.ledger.calls.load(Ordering::SeqCst) >= 4);
    {
        let live = peek(&receiver.live_db());
        assert_integrity(&live);
        assert_eq!(traces(&live, &first), (1, 1));
        for id in &refused {
            assert_eq!(traces(&live, id), (0, 0), "half-written message {id}");
        }
    }
    // A duplicate of a committed message needs no space: still answered.
    let (status, body) = receiver.credit(&first, 1).await;
    assert_eq!(
        (status, &body["duplicate"]),
        (200, &serde_json::json!(true))
    );

    // Space returns: the retries are processed, once.
    receiver.fault.set_quota(None);
    for id in &refused {
        let (status, body) = receiver.credit(id, 10).await;
        assert_eq!(
            (status, &body["duplicate"]),
            (200, &serde_json::json!(false)),
            "{body}"
        );
        let (status, body) = receiver.credit(id, 10).await;
        assert_eq!(
            (status, &body["duplicate"]),
            (200, &serde_json::json!(true)),
            "{body}"
        );
    }
    let live = peek(&receiver.live_db());
    assert_integrity(&live);
    for id in refused.iter().chain([&first]) {
        assert_eq!(traces(&live, id), (1, 1), "{id} processed exactly once");
    }
    drop(live);
    receiver.stop().await;
}

/// The batch endpoint on a full disk: each new item is refused retryably,
/// a duplicate of a stored message is still acknowledged; the same batch
/// goes through once space returns, each effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_receiver_batch_refuses_each_new_item_retryably() {
    let receiver = FaultyReceiver::start(Durability::Full).await;
    let stored = Uuid::now_v7();
    assert_eq!(receiver.credit(&stored, 1).await.0, 200);
    receiver.fault.set_quota(Some(receiver.fault.usage()));
    let mut ids = vec![stored];
    ids.extend((0..4).map(|_| Uuid::now_v7()));
    let results = receiver.credit_batch(&ids).await;
    assert_eq!(results.len(), ids.len());
    assert_eq!(
        (&results[0]["status"], &results[0]["body"]["duplicate"]),
        (&serde_json::json!(200), &serde_json::json!(true)),
        "{results:?}"
    );
    for result in &results[1..] {
        assert_eq!(
            (&result["status"], &result["body"]["error"]),
            (
                &serde_json::json!(503),
                &serde_json::json!("storage_unavailable")
            ),
            "{results:?}"
        );
    }
    {
        let live = peek(&receiver.live_db());
        assert_integrity(&live);
        for id in &ids[1..] {
            assert_eq!(traces(&live, id), (0, 0), "half-written batch item {id}");
        }
    }
    receiver.fault.set_quota(None);
    let results = receiver.credit_batch(&ids).await;
    for (result, duplicate) in results.iter().zip([true, false, false, false, false]) {
        assert_eq!(
            (&result["status"], &result["body"]["duplicate"]),
            (&serde_json::json!(200), &serde_json::json!(duplicate)),
            "{results:?}"
        );
    }
    let live = peek(&receiver.live_db());
    assert_integrity(&live);
    for id in &ids {
        assert_eq!(traces(&live, id), (1, 1), "{id} processed exactly once");
    }
    drop(live);
    receiver.stop().await;
}

/// A quota a little above the usage: the receiver takes messages until it
/// fills up mid-stream, refuses (retryably) from then on, never answers 2xx
/// for something it did not keep, and takes the rest once space returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_receiver_fills_up_mid_stream() {
    let receiver = FaultyReceiver::start(Durability::Full).await;
    receiver
        .fault
        .set_quota(Some(receiver.fault.usage() + 64 * 1024));
    let ids: Vec<Uuid> = (0..60).map(|_| Uuid::now_v7()).collect();
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for id in &ids {
        let (status, body) = receiver.credit(id, 1).await;
        match status {
            200 => accepted.push(*id),
            503 => {
                assert_eq!(body["error"], "storage_unavailable", "{body}");
                refused.push(*id);
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(
        !accepted.is_empty() && !refused.is_empty(),
        "the quota should bite mid-stream: {} accepted, {} refused",
        accepted.len(),
        refused.len()
    );
    {
        let live = peek(&receiver.live_db());
        assert_integrity(&live);
        for id in &accepted {
            assert_eq!(traces(&live, id), (1, 1));
        }
        for id in &refused {
            assert_eq!(traces(&live, id), (0, 0));
        }
    }
    receiver.fault.set_quota(None);
    for id in &refused {
        assert_eq!(receiver.credit(id, 1).await.0, 200);
    }
    let live = peek(&receiver.live_db());
    assert_integrity(&live);
    for id in &ids {
        assert_eq!(traces(&live, id), (1, 1), "{id} processed exactly once");
    }
    eprintln!(
        "disk_full mid-stream: {} accepted before the disk filled, {} refused with 503 and accepted later",
        accepted.len(),
        refused.len()
    );
    drop(live);
    receiver.stop().await;
}

/// `Outbox::enqueue` in the caller's transaction and `Outbox::send` (own
/// transaction, group commit) on a full disk: an error, nothing of the failed
/// transaction stored, nothing stored before lost; fine again with space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_outbox_enqueue_and_send_fail_cleanly() {
    let fault = FaultDir::new();
    let uri = fault.db_uri("sender.db");
    let mut conn = rfidl_runtime::store::sqlite::open(&uri, Durability::Normal).expect("open");
    conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
        .expect("business table");
    let outbox = Outbox::new(sender_config(Duration::from_secs(1)), &uri);
    let payload = || serde_json::json!({"account": "acme", "amount": 1, "pad": "x".repeat(2000)});
    let stored = {
        let tx = conn.transaction().expect("tx");
        let id = outbox
            .enqueue(&tx, message("ledger", "Credit", payload()))
            .expect("enqueue");
        tx.commit().expect("commit");
        id
    };

    fault.set_quota(Some(fault.usage()));
    // In the caller's transaction: the commit fails, the transaction rolls back.
    let failed = {
        let tx = conn.transaction().expect("tx");
        tx.execute("INSERT INTO orders (note) VALUES ('paid')", [])
            .expect("business row");
        let mut failed = Vec::new();
        let mut error = None;
        for _ in 0..20 {
            match outbox.enqueue(&tx, message("ledger", "Credit", payload())) {
                Ok(id) => failed.push(id),
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        match error {
            // Spilling the page cache already needed room.
            Some(error) => {
                assert!(error.contains("full"), "{error}");
                eprintln!("disk_full enqueue: `enqueue` failed: {error}");
                drop(tx);
            }
            None => {
                let error = tx.commit().expect_err("commit on a full disk");
                assert_eq!(
                    error.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DiskFull),
                    "{error}"
                );
                eprintln!("disk_full enqueue: the caller's commit failed: {error}");
            }
        }
        failed
    };
    // Through the outbox's own writer thread.
    let sent = outbox.send(message("ledger", "Credit", payload())).await;
    eprintln!("disk_full send: {sent:?}");
    match sent {
        Err(OutboxError::Write(text)) => assert!(text.contains("full"), "{text}"),
        Err(OutboxError::Sqlite(e)) => assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DiskFull),
            "{e}"
        ),
        other => panic!("send on a full disk: {other:?}"),
    }

    let live = peek(fault.path().join("sender.db").as_path());
    assert_integrity(&live);
    let rows = |sql: &str| -> i64 { live.query_row(sql, [], |r| r.get(0)).expect("count") };
    assert_eq!(
        rows("SELECT count(*) FROM orders"),
        0,
        "business row of the failed commit"
    );
    assert_eq!(
        rows("SELECT count(*) FROM outbox_messages"),
        1,
        "only the stored message"
    );
    assert_eq!(
        live.query_row(
            "SELECT count(*) FROM outbox_messages WHERE message_id = ?1",
            [stored.to_string()],
            |r| r.get::<_, i64>(0)
        )
        .expect("count"),
        1
    );
    for id in &failed {
        assert!(
            rfidl_runtime::store::sqlite::outbox_row(&live, id)
                .expect("query")
                .is_none()
        );
    }

    fault.set_quota(None);
    let tx = conn.transaction().expect("tx");
    outbox
        .enqueue(&tx, message("ledger", "Credit", payload()))
        .expect("enqueue");
    tx.commit().expect("commit with room");
    outbox
        .send(message("ledger", "Credit", payload()))
        .await
        .expect("send with room");
    assert_eq!(rows("SELECT count(*) FROM outbox_messages"), 3);
    assert_integrity(&live);
}

/// Fills the sender's disk at the moment of its first send: the receiver
/// processes the messages, but the dispatcher cannot record them as `Sent`.
struct FillDiskOnSend {
    inner: HttpTransport,
    fault: Arc<FaultDir>,
    filled: AtomicBool,
}

impl Transport for FillDiskOnSend {
    fn send(&self, request: OutgoingRequest) -> SendFuture<'_> {
        if !self.filled.swap(true, Ordering::SeqCst) {
            self.fault.set_quota(Some(self.fault.usage()));
        }
        self.inner.send(request)
    }
}

/// The dispatcher on a full disk: recording a delivery fails, the rows stay
/// claimed (nothing lost), and once space returns and the lease runs out they
/// are sent again, answered as duplicates and recorded `Sent`: the receiver's
/// effects happen exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_dispatcher_recording_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();
    let receiver = support::start_receiver(dir.path(), support::receiver_config(&[&secret])).await;

    let fault = Arc::new(FaultDir::new());
    let uri = fault.db_uri("sender.db");
    let mut config = sender_config(Duration::from_millis(20));
    config.outbox.lease_timeout = Duration::from_millis(400);
    drop(rfidl_runtime::store::sqlite::open(&uri, Durability::Normal).expect("open"));
    let outbox = Outbox::new(config, &uri);
    let mut ids = Vec::new();
    {
        let mut conn = rfidl_runtime::store::sqlite::open(&uri, Durability::Normal).expect("open");
        let tx = conn.transaction().expect("tx");
        for amount in 1..=5 {
            let payload = serde_json::json!({"account": "acme", "amount": amount});
            ids.push(
                outbox
                    .enqueue(&tx, message("ledger", "Credit", payload))
                    .expect("enqueue"),
            );
        }
        tx.commit().expect("commit");
    }
    let transport = FillDiskOnSend {
        inner: HttpTransport::new(&receiver.url, Duration::from_secs(2)).expect("transport"),
        fault: Arc::clone(&fault),
        filled: AtomicBool::new(false),
    };
    let dispatcher = Dispatcher::builder(&outbox)
        .route("ledger", transport, secret.clone())
        .start()
        .expect("dispatcher");

    let live_path = fault.path().join("sender.db");
    let statuses = |wanted: Status| -> usize {
        let live = peek(&live_path);
        ids.iter()
            .filter(|id| {
                rfidl_runtime::store::sqlite::outbox_row(&live, id)
                    .expect("query")
                    .is_some_and(|row| row.status == wanted)
            })
            .count()
    };
    // The receiver gets the messages while the sender cannot record them:
    // wait until the recording was refused (the first write that needs room
    // after the disk filled; claims of nothing write nothing).
    let deadline = Instant::now() + Duration::from_secs(5);
    while fault.full_refusals() == 0 {
        assert!(Instant::now() < deadline, "the recording was never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        receiver.ledger.calls.load(Ordering::SeqCst) > 0,
        "nothing was delivered"
    );
    assert_eq!(statuses(Status::Sent), 0, "recorded Sent on a full disk");
    let delivered_while_full = receiver.ledger.calls.load(Ordering::SeqCst);
    assert_integrity(&peek(&live_path));

    fault.set_quota(None);
    let deadline = Instant::now() + Duration::from_secs(8);
    while statuses(Status::Sent) < ids.len() {
        assert!(
            Instant::now() < deadline,
            "not all rows were recorded Sent after space returned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dispatcher.shutdown().await;
    assert_integrity(&peek(&live_path));
    let effects = support::count(&receiver.db, "SELECT count(*) FROM ledger");
    assert_eq!(
        effects,
        ids.len() as i64,
        "each message's effect exactly once"
    );
    let inbox = support::count(&receiver.db, "SELECT count(*) FROM inbox_messages");
    assert_eq!(inbox, ids.len() as i64);
    // The unrecorded deliveries were sent again and answered as duplicates.
    let duplicates = receiver.receiver.metrics().inbox_duplicates.get();
    assert!(duplicates >= 1, "no re-send after the failed recording");
    // A recording that did not commit counted nothing.
    assert_eq!(
        outbox.metrics().outbox_sent.get(),
        ids.len() as u64,
        "outbox_sent counts each message once"
    );
    eprintln!(
        "disk_full dispatcher: {delivered_while_full} deliveries while the sender's disk was full, \
         {duplicates} re-sent after space returned (answered as duplicates), \
         {} handler runs in all, {effects} effects",
        receiver.ledger.calls.load(Ordering::SeqCst)
    );
    receiver.receiver.shutdown().await;
}

/// The sqlx SQLite store's own connections on the file (migrations, inbox
/// look-up, dispatcher, retention, diagnostics) open it through the VFS the
/// pool's options name: a quota that VFS enforces stops the store's
/// migration of a fresh file, which the ordinary VFS would have written
/// past it. (Two VFSes on one file may lock it differently, and then two
/// writers get in at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_sqlx_sqlite_store_opens_the_file_through_the_pools_vfs() {
    let fault = FaultDir::new();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(fault.path().join("service.db"))
        .vfs(crate::faultfs::VFS_NAME)
        .create_if_missing(true);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("pool");
    fault.set_quota(Some(4_096));
    let refused = rfidl_runtime::store::sqlx_sqlite::SqliteStore::open(pool.clone()).await;
    assert!(
        refused.is_err(),
        "the migration wrote past the VFS's quota: it did not go through the pool's VFS"
    );
    assert!(
        fault.full_refusals() > 0,
        "the VFS refused the migration's writes"
    );
    fault.set_quota(None);
    let store = rfidl_runtime::store::sqlx_sqlite::SqliteStore::open(pool)
        .await
        .expect("opens once there is room");
    assert_eq!(store.path(), fault.path().join("service.db"));
    let version: i64 = peek(store.path())
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert!(version > 0, "migrated");
}
