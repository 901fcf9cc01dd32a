//! Hello on PostgreSQL: the `hello` example with each side in a PostgreSQL
//! database (the runtime creates its tables there). Only the types differ
//! from SQLite: `&mut postgres::Transaction`, a `PostgresUrl` where a path
//! was, the handler impl naming `Postgres`. The `postgres` client is
//! synchronous: run it off the async executor (`spawn_blocking`).
//!
//! `cargo run -p rfidl-examples --example postgres -- GREETER_URL ENGINE_URL`
//! (two `postgres://` URLs; one database for both works too).

// The code `cargo xtask regen` generates from `contracts/greeter.rfidl`.
#[allow(dead_code)]
#[path = "generated/mod.rs"]
mod contracts;

use std::future::IntoFuture as _;
use std::time::Duration;

use contracts::greeter::greeter_v1;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::postgres::Transaction;
use rfidl_runtime::store::postgres::{self, PostgresUrl};
use rfidl_runtime::{Config, Dispatcher, HandlerError, IncomingCall, Outbox, Postgres, Receiver};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The secret the service signs with and the engine accepts from it.
const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGhlLWRlbW8=";

/// The engine's side: one row per arrival, written with the inbox row.
struct Arrivals;

impl greeter_v1::EngineHandler<Postgres> for Arrivals {
    fn joined(
        &self,
        call: &IncomingCall<'_>,
        tx: &mut Transaction<'_>,
        name: String,
    ) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO arrivals (message_id, name) VALUES ($1, $2)",
            &[&call.message_id, &name],
        )?;
        Ok(())
    }
}

/// Runs `work` on a fresh connection to `url`, off the async executor.
async fn blocking<T: Send + 'static>(
    url: &PostgresUrl,
    work: impl FnOnce(&mut rfidl_runtime::postgres::Client) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let url = url.clone();
    tokio::task::spawn_blocking(move || work(&mut postgres::open(&url)?)).await?
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: postgres GREETER_URL ENGINE_URL";
    let greeter_db = PostgresUrl::parse(&args.next().ok_or(usage)?)?;
    let engine_db = PostgresUrl::parse(&args.next().ok_or(usage)?)?;

    // The engine.
    let engine = Config::for_service("engine").with_peer("greeter", SECRET);
    blocking(&engine_db, |db| {
        let sql = "CREATE TABLE IF NOT EXISTS arrivals (message_id TEXT PRIMARY KEY, name TEXT)";
        Ok(db.batch_execute(sql)?)
    })
    .await?;
    let receiver = Receiver::builder(engine, &engine_db)
        .service(greeter_v1::EngineReceiver(Arrivals))
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let engine_url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(rfidl_runtime::serve(listener, receiver.router()).into_future());

    // The greeting service.
    let config = Config::for_service("greeter")
        .with_destination("engine", DestinationConfig::new(engine_url, SECRET));
    let outbox = Outbox::new(config, &greeter_db);
    let dispatcher = Dispatcher::builder(&outbox).start()?;
    let client = greeter_v1::EngineClient::new(outbox, "engine");

    // Newcomers and their messages commit together (a second run sends nothing).
    blocking(&greeter_db, move |db| {
        db.batch_execute("CREATE TABLE IF NOT EXISTS people (name TEXT PRIMARY KEY)")?;
        let mut tx = db.transaction()?;
        for name in ["Ada", "Grace"] {
            let sql = "INSERT INTO people (name) VALUES ($1) ON CONFLICT DO NOTHING";
            if tx.execute(sql, &[&name])? == 1 {
                client.joined(&mut tx, name.into())?;
            }
        }
        Ok(tx.commit()?)
    })
    .await?;

    // Wait (at most 10 s) until the engine has both, then stop in order.
    let mut arrived = 0;
    for _ in 0..100 {
        arrived = blocking(&engine_db, |db| {
            Ok(db
                .query_one("SELECT count(*) FROM arrivals", &[])?
                .get::<_, i64>(0))
        })
        .await?;
        if arrived == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dispatcher.shutdown().await;
    receiver.shutdown().await;
    server.abort();
    if arrived != 2 {
        return Err(format!("{arrived} of 2 arrivals within 10 s").into());
    }
    println!("the engine recorded 2 arrivals, each once");
    Ok(())
}
