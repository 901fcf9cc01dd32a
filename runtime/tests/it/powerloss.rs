//! Power loss: what an acknowledged message survives, shown on a real
//! receiver (HTTP on loopback, signed requests, the real writer thread) whose
//! database runs under the fault VFS ([`crate::faultfs`]). Each trial sends
//! messages, waits for each 2xx, cuts the power right after the last one,
//! restores what was durable into a fresh directory, reopens it with the
//! ordinary VFS and counts the inbox row and the handler's effect (a `ledger`
//! row) of every acknowledged message.
//!
//! SQLite-only: power loss is a property of the SQLite file and its
//! `synchronous` setting (PostgreSQL's durability is the server's); the
//! store-independent failures run on every store in `faults.rs`. Both
//! SQLite stores: the blocking one opens the file's `file:…?vfs=` URI; the
//! sqlx one ([`Backend::SqlxSqlite`]) a `SqlitePool` whose options name the
//! fault VFS (`SqliteConnectOptions::vfs`), and the store opens the file
//! through that VFS too (`disk_full.rs` shows it). The `full` trials run on
//! both (`powerloss_full_on_sqlx_sqlite_*`); the `normal` findings, the
//! write-back variants and the sender's are the SQLite file's and run on
//! the blocking store only (the sqlx store's writer commits with the same
//! SQLite and the pool's `synchronous`).
//!
//! Findings (see `docs/guarantees-durability.md`):
//! * `inbox.durability: full` (`synchronous=FULL`): every acknowledged
//!   message survives, in every trial.
//! * `normal` (`synchronous=NORMAL`): messages acknowledged since the last
//!   WAL checkpoint are lost (the WAL is synced only at checkpoints); the
//!   ones before it survive; inbox row and effect are never split.
//! * The sender's outbox row, committed in the caller's transaction with
//!   NORMAL, shares the business row's fate: both or neither.

use std::sync::Arc;

use rand::Rng as _;
use rfidl_runtime::Durability;
use rfidl_runtime::outbox::Outbox;
use rfidl_runtime::signing::{Secret, unix_now};
use uuid::Uuid;

mod harness;

pub(crate) use harness::{Backend, FaultyReceiver, Rebooted, assert_integrity};

use crate::faultfs::{FaultDir, PowerCut};
use crate::support;

/// Forces a checkpoint (WAL synced, copied into the database, database
/// synced) through the shim, as SQLite's auto-checkpoint would.
fn checkpoint(fault: &FaultDir, name: &str) {
    let conn = rusqlite::Connection::open(fault.db_uri(name)).expect("open");
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("sync");
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(FULL)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .expect("checkpoint");
    assert_eq!(busy, 0, "checkpoint completed");
}

/// What the kernel wrote back on its own before the cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writeback {
    /// Nothing unsynced reached the disk.
    Nothing,
    /// Per file, the oldest unsynced writes up to a random point did (the
    /// last one may leave a torn WAL frame: its header without its page).
    RandomPrefix,
    /// Each unsynced write did or did not, at random, in any order.
    RandomSubset,
}

impl Writeback {
    /// Whether the kernel wrote back change `index` of a file's `count`.
    fn decider(self) -> crate::faultfs::WrittenBack {
        use rand::SeedableRng as _;
        let mut rng = rand::rngs::StdRng::from_rng(&mut rand::rng());
        match self {
            Writeback::Nothing => Box::new(|_, _, _| false),
            Writeback::RandomPrefix => {
                let mut cutoff = 0;
                Box::new(move |_, index, count| {
                    if index == 0 {
                        cutoff = rng.random_range(0..=count);
                    }
                    index < cutoff
                })
            }
            Writeback::RandomSubset => Box::new(move |_, _, _| rng.random_bool(0.5)),
        }
    }

    fn cut(self, fault: &FaultDir) -> PowerCut {
        fault.cut_power_with_writeback(self.decider())
    }
}

/// Sends `before` messages, checkpoints if `before > 0`, sends `after` more,
/// cuts the power right after the last 2xx. Returns the acknowledged ids in
/// order and the rebooted disk.
async fn trial(durability: Durability, before: usize, after: usize) -> (Vec<Uuid>, Rebooted) {
    trial_with(
        Backend::Rusqlite,
        durability,
        before,
        after,
        Writeback::Nothing,
    )
    .await
}

async fn trial_with(
    backend: Backend,
    durability: Durability,
    before: usize,
    after: usize,
    writeback: Writeback,
) -> (Vec<Uuid>, Rebooted) {
    let receiver = FaultyReceiver::start_on(backend, durability).await;
    let mut acknowledged = Vec::new();
    for round in 0..before + after {
        if round == before && before > 0 {
            checkpoint(&receiver.fault, "receiver.db");
        }
        let id = Uuid::now_v7();
        let (status, body) = receiver.credit(&id, 1).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["duplicate"], false, "{body}");
        acknowledged.push(id);
    }
    let cut = writeback.cut(&receiver.fault);
    // The dead receiver can no longer acknowledge anything.
    let late = Uuid::now_v7();
    let (status, _) = receiver.credit(&late, 1).await;
    assert_ne!(
        status, 200,
        "a receiver without power acknowledged a message"
    );
    receiver.stop().await;
    (acknowledged, Rebooted::from(&cut))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_full_keeps_every_acknowledged_message() {
    full_keeps_every_acknowledged_message(Backend::Rusqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_full_on_sqlx_sqlite_keeps_every_acknowledged_message() {
    full_keeps_every_acknowledged_message(Backend::SqlxSqlite).await;
}

/// Five trials on `backend` under `full`, each cut right after the last 2xx.
async fn full_keeps_every_acknowledged_message(backend: Backend) {
    let mut rng = rand::rng();
    // Cut right after the first 2xx, then after a random one of up to 20.
    let mut counts = vec![1];
    counts.extend((0..4).map(|_| rng.random_range(2..=20)));
    let mut total = 0;
    for count in counts {
        let (acknowledged, disk) =
            trial_with(backend, Durability::Full, 0, count, Writeback::Nothing).await;
        for (index, id) in acknowledged.iter().enumerate() {
            assert_eq!(
                disk.traces(id),
                (1, 1),
                "FULL on {backend:?}: acknowledged message #{index} of {count} lost its inbox \
                 row or effect"
            );
        }
        // Nothing else was processed: no effect without an acknowledgement.
        let effects: i64 = disk
            .conn
            .query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))
            .expect("count");
        assert_eq!(effects, count as i64);
        total += count;
    }
    eprintln!(
        "powerloss FULL on {backend:?}: {total} acknowledged messages in 5 trials, {total} survived"
    );
}

/// The cut lands while many requests are in flight (the writer group-commits
/// them): every message answered 200, before or after the cut, is on the
/// restored disk (a commit whose fsync came after the cut fails, so it is
/// never acknowledged); a refused one may or may not be, but never half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_full_cut_mid_stream_keeps_every_acknowledged_message() {
    let receiver = Arc::new(FaultyReceiver::start(Durability::Full).await);
    // 8 concurrent senders, 10 messages each, one after the other.
    let (workers, each) = (8, 10);
    let senders = workers * each;
    let cut_at = rand::rng().random_range(1..=senders / 2);
    let acknowledged = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cut: Arc<std::sync::Mutex<Option<PowerCut>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let receiver = Arc::clone(&receiver);
        let acknowledged = Arc::clone(&acknowledged);
        let cut = Arc::clone(&cut);
        tasks.spawn(async move {
            let mut answers = Vec::new();
            for _ in 0..each {
                let id = Uuid::now_v7();
                let (status, body) = receiver.credit(&id, 1).await;
                if status == 200 {
                    assert_eq!(body["duplicate"], false, "{body}");
                    let seen = acknowledged.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    if seen == cut_at {
                        *cut.lock().expect("cut") = Some(receiver.fault.cut_power());
                    }
                }
                answers.push((id, status));
            }
            answers
        });
    }
    let answers: Vec<(Uuid, u16)> = tasks.join_all().await.into_iter().flatten().collect();
    let cut = cut.lock().expect("cut").take().expect("the power was cut");
    let disk = Rebooted::from(&cut);
    let mut kept_refused = 0;
    let acked = answers.iter().filter(|(_, status)| *status == 200).count();
    for (id, status) in &answers {
        let (inbox, effect) = disk.traces(id);
        assert_eq!(inbox, effect, "{id}: inbox row and effect split by the cut");
        if *status == 200 {
            assert_eq!(inbox, 1, "FULL: {id} was acknowledged, then lost");
        } else {
            assert_eq!(*status, 503, "refusals after the cut are retryable");
            kept_refused += inbox;
        }
    }
    eprintln!(
        "powerloss FULL mid-stream: {senders} messages from {workers} concurrent senders, cut after 2xx number {cut_at}; \
         {acked} acknowledged (all kept), {} refused ({kept_refused} of them kept anyway)",
        senders - acked
    );
    match Arc::try_unwrap(receiver) {
        Ok(receiver) => receiver.stop().await,
        Err(_) => panic!("receiver still shared"),
    }
}

/// Cuts the power inside every sync of a workload in turn (8 messages with
/// a checkpoint halfway: mid-commit, between a checkpoint's WAL sync and its
/// database sync, ...), once with nothing unsynced written back and once
/// with a random subset of it (database pages half-copied by a checkpoint).
/// Every 2xx is on the restored disk, a refused message is there whole or
/// not at all, and `integrity_check` is `ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_full_cut_at_every_sync_point_keeps_every_acknowledged_message() {
    full_cut_at_every_sync_point(Backend::Rusqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_full_on_sqlx_sqlite_cut_at_every_sync_point_keeps_every_acknowledged_message() {
    full_cut_at_every_sync_point(Backend::SqlxSqlite).await;
}

async fn full_cut_at_every_sync_point(backend: Backend) {
    let mut points = 0;
    let mut acknowledged = 0;
    let mut refused_but_kept = 0;
    for writeback in [Writeback::Nothing, Writeback::RandomSubset] {
        for point in 1..=100 {
            let receiver = FaultyReceiver::start_on(backend, Durability::Full).await;
            receiver.fault.cut_at_sync(point, writeback.decider());
            let mut answers = Vec::new();
            for round in 0..8 {
                if round == 4 {
                    // Errors after the cut are expected; the cut may land inside.
                    if let Ok(conn) =
                        rusqlite::Connection::open(receiver.fault.db_uri("receiver.db"))
                    {
                        let _ = conn.execute_batch(
                            "PRAGMA synchronous = FULL; PRAGMA wal_checkpoint(FULL);",
                        );
                    }
                }
                let id = Uuid::now_v7();
                let (status, _) = receiver.credit(&id, 1).await;
                answers.push((id, status));
            }
            let tripped = receiver.fault.tripped();
            receiver.stop().await;
            let Some(cut) = tripped else {
                // The workload has fewer syncs than `point`: every point was cut.
                assert!(point > 5, "the workload syncs more than {point} times");
                break;
            };
            let disk = Rebooted::from(&cut);
            for (index, (id, status)) in answers.iter().enumerate() {
                let traces = disk.traces(id);
                if *status == 200 {
                    assert_eq!(
                        traces,
                        (1, 1),
                        "{backend:?}, {writeback:?}, cut in sync {point}: acknowledged message \
                         #{index} lost"
                    );
                    acknowledged += 1;
                } else {
                    assert!(
                        traces == (0, 0) || traces == (1, 1),
                        "{backend:?}, {writeback:?}, cut in sync {point}: message #{index} split: \
                         {traces:?}"
                    );
                    refused_but_kept += traces.0;
                }
            }
            points += 1;
        }
    }
    eprintln!(
        "powerloss FULL on {backend:?} at every sync point: {points} cuts, {acknowledged} acknowledged messages \
         (all kept), {refused_but_kept} refused ones kept anyway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_normal_loses_acknowledged_messages_since_the_last_checkpoint() {
    let mut rng = rand::rng();
    let mut acknowledged_total = 0;
    let mut lost_total = 0;
    let trials = 4;
    for _ in 0..trials {
        let before = rng.random_range(1..=8);
        let after = rng.random_range(1..=8);
        let (acknowledged, disk) = trial(Durability::Normal, before, after).await;
        let mut lost_after = 0;
        for (index, id) in acknowledged.iter().enumerate() {
            let (inbox, effect) = disk.traces(id);
            assert_eq!(
                inbox, effect,
                "message #{index}: inbox row and effect split by the cut"
            );
            if index < before {
                assert_eq!(
                    inbox, 1,
                    "NORMAL: message #{index}, acknowledged before the checkpoint, was lost"
                );
            } else if inbox == 0 {
                lost_after += 1;
            } else {
                // WAL recovery replays a prefix: nothing survives after a loss.
                assert_eq!(lost_after, 0, "a later message survived an earlier loss");
            }
        }
        // What NORMAL gives up: an acknowledged message can disappear.
        assert!(
            lost_after >= 1,
            "NORMAL: expected the {after} messages acknowledged since the checkpoint to be \
             at risk, but all survived"
        );
        acknowledged_total += acknowledged.len();
        lost_total += lost_after;
        eprintln!(
            "powerloss NORMAL trial: {before} before the checkpoint (all kept), \
             {after} after it ({lost_after} lost)"
        );
    }
    eprintln!(
        "powerloss NORMAL: {lost_total} of {acknowledged_total} acknowledged messages lost in {trials} trials"
    );
}

/// The same under kinder, messier cuts: the kernel had written back part of
/// the unsynced writes (a random prefix per file, or a random subset), torn
/// WAL frames included. FULL still keeps every acknowledged message; with
/// NORMAL, whatever survives is a prefix, never an inbox row without its
/// effect, and the database is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_with_random_writeback_keeps_prefixes_and_integrity() {
    let mut rng = rand::rng();
    let mut kept_after = 0;
    let mut sent_after = 0;
    for writeback in [
        Writeback::RandomPrefix,
        Writeback::RandomPrefix,
        Writeback::RandomPrefix,
        Writeback::RandomSubset,
    ] {
        let count = rng.random_range(1..=12);
        let (acknowledged, disk) =
            trial_with(Backend::Rusqlite, Durability::Full, 0, count, writeback).await;
        for id in &acknowledged {
            assert_eq!(disk.traces(id), (1, 1), "FULL: acknowledged {id} lost");
        }
        let before = rng.random_range(1..=6);
        let after = rng.random_range(1..=12);
        let (acknowledged, disk) = trial_with(
            Backend::Rusqlite,
            Durability::Normal,
            before,
            after,
            writeback,
        )
        .await;
        let mut lost = false;
        for (index, id) in acknowledged.iter().enumerate() {
            let (inbox, effect) = disk.traces(id);
            assert_eq!(inbox, effect, "message #{index}: split by the cut");
            if index < before {
                assert_eq!(inbox, 1, "message #{index} before the checkpoint lost");
                continue;
            }
            if inbox == 0 {
                lost = true;
            } else {
                assert!(!lost, "message #{index} survived an earlier loss");
                kept_after += 1;
            }
        }
        sent_after += after;
    }
    eprintln!(
        "powerloss NORMAL with random write-back: {kept_after} of {sent_after} messages \
         acknowledged after the checkpoint survived"
    );
}

/// The sender side: a business row and the outbox row enqueued in the same
/// transaction survive a cut together or not at all (NORMAL, the
/// `outbox.durability` default, and FULL); a checkpoint makes everything
/// before it durable; with FULL every commit is.
#[test]
fn powerloss_outbox_row_shares_the_fate_of_the_business_row() {
    for (durability, writeback) in [
        (Durability::Normal, Writeback::Nothing),
        (Durability::Normal, Writeback::RandomPrefix),
        (Durability::Normal, Writeback::RandomSubset),
        (Durability::Full, Writeback::Nothing),
        (Durability::Full, Writeback::RandomPrefix),
    ] {
        let fault = FaultDir::new();
        let uri = fault.db_uri("sender.db");
        let mut conn = rfidl_runtime::store::sqlite::open(&uri, durability).expect("open");
        conn.execute_batch(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL)",
        )
        .expect("business table");
        let mut config = crate::dispatcher::sender_config(std::time::Duration::from_secs(1));
        config.outbox.durability = durability;
        let outbox = Outbox::new(config, &uri);
        let checkpoint_after = rand::rng().random_range(1..=10);
        let total = checkpoint_after + rand::rng().random_range(1..=10);
        let mut committed = Vec::new();
        for order in 0..total {
            if order == checkpoint_after {
                checkpoint(&fault, "sender.db");
            }
            let tx = conn.transaction().expect("tx");
            let id = outbox
                .enqueue(
                    &tx,
                    crate::dispatcher::message("ledger", "Credit", serde_json::json!({"n": order})),
                )
                .expect("enqueue");
            tx.execute(
                "INSERT INTO orders (id, message_id) VALUES (?1, ?2)",
                rusqlite::params![order as i64, id.to_string()],
            )
            .expect("order");
            tx.commit().expect("commit");
            committed.push(id);
        }
        let cut = writeback.cut(&fault);
        drop(conn);
        let after = tempfile::tempdir().expect("tempdir");
        cut.restore_into(after.path());
        let disk = rusqlite::Connection::open(after.path().join("sender.db")).expect("reopen");
        assert_integrity(&disk);
        let mut kept = 0;
        for (order, id) in committed.iter().enumerate() {
            let count = |sql: &str| -> i64 {
                disk.query_row(sql, [id.to_string()], |r| r.get(0))
                    .expect("count")
            };
            let business = count("SELECT count(*) FROM orders WHERE message_id = ?1");
            let message = count("SELECT count(*) FROM outbox_messages WHERE message_id = ?1");
            assert_eq!(
                business, message,
                "{durability:?}: order {order} and its outbox row split by the cut"
            );
            if order < checkpoint_after || durability == Durability::Full {
                assert_eq!(business, 1, "{durability:?}: order {order} lost");
            }
            // Commits survive in order: none after one that was lost.
            assert!(
                business == 0 || kept == order as i64,
                "{durability:?}: order {order} survived an earlier loss"
            );
            kept += business;
        }
        if (durability, writeback) == (Durability::Normal, Writeback::Nothing) {
            assert!(
                (kept as usize) < total,
                "NORMAL: expected commits after the checkpoint to be at risk"
            );
        }
        eprintln!(
            "powerloss sender {durability:?}, write-back {writeback:?}: {kept} of {total} \
             committed (order, outbox) pairs kept, checkpoint after {checkpoint_after}"
        );
    }
}

/// The restored disk is a working database: a receiver started on it
/// processes a retried copy of a lost message (NORMAL), and answers one of a
/// kept message as a duplicate: after a cut, the sender's retry repairs the
/// loss (its own outbox row must have survived for that: see above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_receiver_restarts_on_the_restored_disk() {
    let receiver = FaultyReceiver::start(Durability::Normal).await;
    let kept = Uuid::now_v7();
    assert_eq!(receiver.credit(&kept, 5).await.0, 200);
    checkpoint(&receiver.fault, "receiver.db");
    let lost = Uuid::now_v7();
    assert_eq!(receiver.credit(&lost, 7).await.0, 200);
    let cut = receiver.fault.cut_power();
    let secret = receiver.secret.clone();
    receiver.stop().await;

    let dir = tempfile::tempdir().expect("tempdir");
    cut.restore_into(dir.path());
    let db = dir.path().join("receiver.db");
    let restarted = support::start_receiver(dir.path(), support::receiver_config(&[&secret])).await;
    assert_eq!(restarted.db, db);
    let effects = |id: &Uuid| {
        support::count(
            &db,
            &format!("SELECT count(*) FROM ledger WHERE message_id = '{id}'"),
        )
    };
    assert_eq!(
        (effects(&kept), effects(&lost)),
        (1, 0),
        "before the retries"
    );
    let client = reqwest::Client::new();
    for (id, amount, duplicate) in [(kept, 5, true), (lost, 7, false)] {
        let body = support::envelope(
            &id.to_string(),
            "Credit",
            serde_json::json!({"account": "acme", "amount": amount}),
        )
        .to_string();
        let (status, answer) = support::post_signed(
            &client,
            &restarted.url,
            body.as_bytes(),
            &id.to_string(),
            &secret,
            unix_now(),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["duplicate"], duplicate, "{id}: {answer}");
    }
    assert_eq!(
        (effects(&kept), effects(&lost)),
        (1, 1),
        "after the retries"
    );
    assert_integrity(&rusqlite::Connection::open(&db).expect("open"));
    restarted.receiver.shutdown().await;
}

/// What the sender's setting means for the receiver: with NORMAL, a
/// committed transaction is not yet durable, yet the dispatcher may send its
/// message. Cut the sender's power after the receiver acknowledged (and the
/// row was recorded `Sent`): the sender must still have the business row and
/// the outbox row, or the receiver would keep the effect of a transaction
/// that, after the reboot, never happened. (It failed with NORMAL until the
/// dispatcher's connection was made FULL: its claim's fsync of the WAL makes
/// the enqueuing transaction durable before the send.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powerloss_sender_normal_never_delivers_a_transaction_it_can_lose() {
    for durability in [Durability::Normal, Durability::Full] {
        let receiver_dir = tempfile::tempdir().expect("tempdir");
        let secret = Secret::generate();
        let receiver =
            support::start_receiver(receiver_dir.path(), support::receiver_config(&[&secret]))
                .await;
        let fault = FaultDir::new();
        let uri = fault.db_uri("sender.db");
        let mut conn = rfidl_runtime::store::sqlite::open(&uri, durability).expect("open");
        conn.execute_batch(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL)",
        )
        .expect("business table");
        // The schema is durable; only the message's transaction is at stake.
        checkpoint(&fault, "sender.db");
        let mut config = crate::dispatcher::sender_config(std::time::Duration::from_millis(20));
        config.outbox.durability = durability;
        config.outbox.lease_timeout = std::time::Duration::from_millis(200);
        let outbox = Outbox::new(config.clone(), &uri);
        let dispatcher = rfidl_runtime::dispatcher::Dispatcher::builder(&outbox)
            .route(
                "ledger",
                rfidl_runtime::transport::HttpTransport::new(
                    &receiver.url,
                    std::time::Duration::from_secs(2),
                )
                .expect("transport"),
                secret.clone(),
            )
            .start()
            .expect("dispatcher");
        let tx = conn.transaction().expect("tx");
        let id = outbox
            .enqueue(
                &tx,
                crate::dispatcher::message(
                    "ledger",
                    "Credit",
                    serde_json::json!({"account": "acme", "amount": 3}),
                ),
            )
            .expect("enqueue");
        tx.execute(
            "INSERT INTO orders (message_id) VALUES (?1)",
            [id.to_string()],
        )
        .expect("order");
        let before_commit = fault.syncs();
        tx.commit().expect("commit");
        let after_commit = fault.syncs();
        let row = crate::dispatcher::wait_for(
            &fault.path().join("sender.db"),
            &id,
            rfidl_runtime::outbox::Status::Sent,
        )
        .await;
        assert_eq!(row.status, rfidl_runtime::outbox::Status::Sent);
        // Where the fsync that makes the enqueue durable happens: under
        // `normal` in the dispatcher's claim, under `full` in the enqueuing
        // commit, so that the claim syncs nothing and commit -> send has no
        // fsync on its path. (A NORMAL commit may sync too: the first write
        // after a checkpoint restarts the WAL.)
        let (in_commit, until_sent) = (after_commit - before_commit, fault.syncs() - after_commit);
        match durability {
            Durability::Normal => assert!(
                until_sent >= 1,
                "normal: {in_commit} syncs in the commit, {until_sent} until Sent"
            ),
            Durability::Full => assert!(
                in_commit >= 1 && until_sent == 0,
                "full: {in_commit} syncs in the commit, {until_sent} until Sent"
            ),
        }
        let cut = fault.cut_power();
        dispatcher.abort();
        drop(conn);

        let after = tempfile::tempdir().expect("tempdir");
        cut.restore_into(after.path());
        let disk = rusqlite::Connection::open(after.path().join("sender.db")).expect("reopen");
        assert_integrity(&disk);
        let count = |sql: &str| -> i64 {
            disk.query_row(sql, [id.to_string()], |r| r.get(0))
                .expect("count")
        };
        let business = count("SELECT count(*) FROM orders WHERE message_id = ?1");
        let message = count("SELECT count(*) FROM outbox_messages WHERE message_id = ?1");
        let effect = support::count(
            &receiver.db,
            &format!("SELECT count(*) FROM ledger WHERE message_id = '{id}'"),
        );
        assert_eq!(effect, 1, "the receiver processed the message");
        assert_eq!(business, message, "business row and outbox row split");
        assert_eq!(
            business, 1,
            "{durability:?}: the receiver processed a message whose transaction the sender lost"
        );
        // The `Sent` record needs no fsync of its own (NORMAL): if the cut
        // took it, the row is still `Sending`, and a dispatcher on the
        // restored disk sends it again once the lease ran out; the receiver
        // answers a duplicate, and the effect stays single. Under `full` the
        // claim has no fsync either: the cut may take it too, leaving the
        // row `Pending`, sent again at once and answered as a duplicate.
        let status = rfidl_runtime::store::sqlite::outbox_row(&disk, &id)
            .expect("query")
            .expect("row")
            .status;
        use rfidl_runtime::outbox::Status;
        let possible: &[Status] = match durability {
            Durability::Normal => &[Status::Sending, Status::Sent],
            Durability::Full => &[Status::Pending, Status::Sending, Status::Sent],
        };
        assert!(possible.contains(&status), "{durability:?}: {status:?}");
        drop(disk);
        let restored = after.path().join("sender.db");
        let outbox = Outbox::new(config, &restored);
        let dispatcher = rfidl_runtime::dispatcher::Dispatcher::builder(&outbox)
            .route(
                "ledger",
                rfidl_runtime::transport::HttpTransport::new(
                    &receiver.url,
                    std::time::Duration::from_secs(2),
                )
                .expect("transport"),
                secret.clone(),
            )
            .start()
            .expect("dispatcher");
        crate::dispatcher::wait_for(&restored, &id, rfidl_runtime::outbox::Status::Sent).await;
        dispatcher.shutdown().await;
        let effect = support::count(
            &receiver.db,
            &format!("SELECT count(*) FROM ledger WHERE message_id = '{id}'"),
        );
        assert_eq!(effect, 1, "the effect happened once");
        eprintln!(
            "powerloss sender {durability:?} after delivery: sender keeps {business} \
             (order + outbox row, {status:?}), receiver keeps {effect} effect, \
             {} duplicate deliveries after the restart",
            receiver.receiver.metrics().inbox_duplicates.get()
        );
        receiver.receiver.shutdown().await;
    }
}

/// Under `outbox.durability: full` the claim does not fsync, so an enqueue
/// on a connection that does not commit durably is refused, and writes
/// nothing.
#[test]
fn outbox_full_refuses_a_transaction_that_is_not_durable_at_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sender.db");
    let mut config = crate::dispatcher::sender_config(std::time::Duration::from_millis(20));
    config.outbox.durability = Durability::Full;
    let outbox = Outbox::new(config, &path);
    let message =
        || crate::dispatcher::message("ledger", "Credit", serde_json::json!({"amount": 1}));
    let mut normal = rfidl_runtime::store::sqlite::open(&path, Durability::Normal).expect("open");
    let tx = normal.transaction().expect("tx");
    let refused = outbox
        .enqueue(&tx, message())
        .expect_err("a NORMAL connection");
    assert!(
        matches!(
            refused,
            rfidl_runtime::outbox::OutboxError::NotDurable { found: "NORMAL" }
        ),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("synchronous=NORMAL"),
        "{refused}"
    );
    tx.commit().expect("commit");
    let count = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("SELECT count(*) FROM outbox_messages", [], |r| r.get(0))
            .expect("count")
    };
    assert_eq!(count(&normal), 0, "a refused enqueue wrote a row");
    let mut full = rfidl_runtime::store::sqlite::open(&path, Durability::Full).expect("open");
    let tx = full.transaction().expect("tx");
    outbox.enqueue(&tx, message()).expect("a FULL connection");
    tx.commit().expect("commit");
    assert_eq!(count(&full), 1);
}
