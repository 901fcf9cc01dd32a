//! Hello on SQLite: a greeting service tells the engine that someone joined,
//! in the transaction that records the newcomer; the engine records the
//! arrival in the transaction that also records the message in its inbox, so
//! exactly once. Two services in one process, a SQLite file each, HTTP on
//! loopback.
//!
//! `cargo run -p rfidl-examples --example hello [DIR]` (DIR keeps the
//! databases; run it twice on the same DIR: nothing is sent twice).

// The code `cargo xtask regen` generates from `contracts/greeter.rfidl`
// (a build script with `rfidl_codegen::Builder` does the same in your crate).
// Each example uses part of it.
#[allow(dead_code)]
#[path = "generated/mod.rs"]
mod contracts;

use std::future::IntoFuture as _;
use std::path::PathBuf;
use std::time::Duration;

use contracts::greeter::greeter_v1;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::rusqlite::{Transaction, params};
use rfidl_runtime::store::sqlite;
use rfidl_runtime::{Config, Dispatcher, HandlerError, IncomingCall, Outbox, Receiver};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The secret the service signs with and the engine accepts from it (in
/// production: from a file or the registry, never in the code).
const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGhlLWRlbW8=";

/// The engine's side: one row per arrival, written with the inbox row.
struct Arrivals;

impl greeter_v1::EngineHandler for Arrivals {
    fn joined(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        name: String,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO arrivals (message_id, name) VALUES (?1, ?2)",
            params![call.message_id, name],
        )?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let kept = std::env::args_os().nth(1).map(PathBuf::from);
    let dir = kept.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("rfidl-hello-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let (engine_db, service_db) = (dir.join("engine.db"), dir.join("greeter.db"));

    // The engine: a receiver that accepts what `greeter` signs with SECRET.
    let engine = Config::for_service("engine").with_peer("greeter", SECRET);
    sqlite::open(&engine_db, engine.inbox.durability)?.execute_batch(
        "CREATE TABLE IF NOT EXISTS arrivals (message_id TEXT PRIMARY KEY, name TEXT NOT NULL)",
    )?;
    let receiver = Receiver::builder(engine, &engine_db)
        .service(greeter_v1::EngineReceiver(Arrivals))
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let engine_url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(rfidl_runtime::serve(listener, receiver.router()).into_future());

    // The greeting service: its outbox, dispatcher and client.
    let config = Config::for_service("greeter")
        .with_destination("engine", DestinationConfig::new(engine_url, SECRET));
    let mut conn = sqlite::open(&service_db, config.outbox.durability)?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS people (name TEXT PRIMARY KEY)")?;
    let outbox = Outbox::new(config, &service_db);
    let dispatcher = Dispatcher::builder(&outbox).start()?;
    let client = greeter_v1::EngineClient::new(outbox, "engine");

    // Newcomers and their messages commit together, or not at all. A name
    // already recorded (a second run) is skipped, and so is its message.
    let tx = conn.transaction()?;
    for name in ["Ada", "Grace"] {
        if tx.execute("INSERT OR IGNORE INTO people (name) VALUES (?1)", [name])? == 1 {
            client.joined(&tx, name.into())?;
        }
    }
    tx.commit()?;

    // Wait (at most 10 s) until the engine has both, then stop in order:
    // the dispatcher (nothing left in flight), the receiver, the server.
    let engine_conn = sqlite::open(&engine_db, rfidl_runtime::Durability::Normal)?;
    let mut arrived = 0;
    for _ in 0..100 {
        arrived = engine_conn.query_row("SELECT count(*) FROM arrivals", [], |row| {
            row.get::<_, i64>(0)
        })?;
        if arrived == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dispatcher.shutdown().await;
    receiver.shutdown().await;
    server.abort();
    if kept.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    if arrived != 2 {
        return Err(format!("{arrived} of 2 arrivals within 10 s").into());
    }
    println!(
        "the engine recorded 2 arrivals, each once ({})",
        dir.display()
    );
    Ok(())
}
