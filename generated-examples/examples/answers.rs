//! A command with a typed answer: the engine asks the greeting service for a
//! desk (`AssignDesk`); the service assigns one in the transaction that
//! records the command in its inbox and answers with it; the engine stores
//! the typed `Desk` in the transaction that marks its message `Sent`. Each
//! step happens exactly once, whatever is retried. SQLite, one process.
//!
//! `cargo run -p rfidl-examples --example answers [DIR]`

// The code `cargo xtask regen` generates from `contracts/greeter.rfidl`
// (a build script with `rfidl_codegen::Builder` does the same in your crate).
// Each example uses part of it.
#[allow(dead_code)]
#[path = "generated/mod.rs"]
mod contracts;

use std::future::IntoFuture as _;
use std::path::PathBuf;
use std::time::Duration;

use contracts::greeter::{Desk, greeter_v1};
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::responses::Answer;
use rfidl_runtime::rusqlite::{Transaction, params};
use rfidl_runtime::store::sqlite;
use rfidl_runtime::{Config, Dispatcher, HandlerError, IncomingCall, Outbox, Receiver};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The engine signs with this; the greeting service accepts it.
const SECRET: &str = "whsec_ZW5naW5lLXNlY3JldC1mb3ItdGhlLWV4YW1wbGU=";

/// The greeting service: the next free desk, assigned with the inbox row.
struct Desks;

impl greeter_v1::ServiceHandler for Desks {
    fn assign_desk(
        &self,
        _call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        name: String,
    ) -> Result<Desk, HandlerError> {
        tx.execute("INSERT INTO desks (name) VALUES (?1)", [&name])?;
        let number = tx.last_insert_rowid();
        Ok(Desk {
            number,
            floor: u32::try_from(number / 10 + 1).unwrap_or(u32::MAX),
        })
    }
}

/// The engine: the desk it is answered, stored with the `Sent` mark.
struct Seating;

impl greeter_v1::ServiceAnswers for Seating {
    fn assign_desk(
        &self,
        answer: &Answer<'_>,
        tx: &Transaction<'_>,
        desk: Desk,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "UPDATE seating SET desk = ?1, floor = ?2 WHERE name = ?3",
            params![desk.number, desk.floor, answer.correlation_id],
        )?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let kept = std::env::args_os().nth(1).map(PathBuf::from);
    let dir = kept.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("rfidl-answers-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let (service_db, engine_db) = (dir.join("greeter.db"), dir.join("engine.db"));

    // The greeting service hosts the command.
    let service = Config::for_service("greeter").with_peer("engine", SECRET);
    sqlite::open(&service_db, service.inbox.durability)?.execute_batch(
        "CREATE TABLE IF NOT EXISTS desks (number INTEGER PRIMARY KEY, name TEXT NOT NULL)",
    )?;
    let receiver = Receiver::builder(service, &service_db)
        .service(greeter_v1::ServiceReceiver(Desks))
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let service_url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(rfidl_runtime::serve(listener, receiver.router()).into_future());

    // The engine sends it, and acts on the answers.
    let config = Config::for_service("engine")
        .with_destination("greeter", DestinationConfig::new(service_url, SECRET));
    let mut conn = sqlite::open(&engine_db, config.outbox.durability)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS seating (name TEXT PRIMARY KEY, desk INTEGER, floor INTEGER)",
    )?;
    let outbox = Outbox::new(config, &engine_db);
    let dispatcher = Dispatcher::builder(&outbox)
        .responses(greeter_v1::ServiceAnswerRouter(Seating))
        .start()?;
    let client = greeter_v1::ServiceClient::new(outbox, "greeter");

    let tx = conn.transaction()?;
    if tx.execute("INSERT OR IGNORE INTO seating (name) VALUES ('Ada')", [])? == 1 {
        client.assign_desk(&tx, "Ada".into())?;
    }
    tx.commit()?;

    // Wait (at most 10 s) for the answer to be stored, then stop in order.
    let mut seated = None;
    for _ in 0..100 {
        seated = conn
            .query_row(
                "SELECT desk, floor FROM seating WHERE name = 'Ada' AND desk IS NOT NULL",
                [],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, u32>(1)?)),
            )
            .ok();
        if seated.is_some() {
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
    let (desk, floor) = seated.ok_or("no answer within 10 s")?;
    println!("Ada: desk {desk}, floor {floor} ({})", dir.display());
    Ok(())
}
