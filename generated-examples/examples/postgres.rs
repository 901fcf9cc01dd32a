//! Hello on PostgreSQL: the `hello` example with each side in a PostgreSQL
//! database, on sqlx (the runtime creates its tables there). What differs
//! from SQLite: a `sqlx::PgPool` and a `PgStore` where a path was, the
//! handler async (`aio::EngineHandler<Postgres>`, writing on the
//! receiver's `&mut PgConnection`), and the client enqueuing in the
//! caller's own `sqlx::Transaction`.
//!
//! `cargo run -p rfidl-examples --example postgres -- GREETER_URL ENGINE_URL`
//! (two `postgres://` URLs; one database for both works too).

// The code `cargo xtask regen` generates from `contracts/greeter.rfidl`.
#[allow(dead_code)]
#[path = "generated/mod.rs"]
mod contracts;

use std::time::Duration;

use contracts::greeter::greeter_v1::aio;
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::store::sqlx_postgres::PgStore;
use rfidl_runtime::{Config, HandlerError, Host, IncomingCall};
use sqlx::{PgConnection, PgPool, Postgres};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The secret the service signs with and the engine accepts from it.
const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGhlLWRlbW8=";

/// The engine's side: one row per arrival, written with the inbox row.
struct Arrivals;

impl aio::EngineHandler<Postgres> for Arrivals {
    async fn joined(
        &self,
        call: &IncomingCall<'_>,
        conn: &mut PgConnection,
        name: String,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO arrivals (message_id, name) VALUES ($1, $2)")
            .bind(call.message_id)
            .bind(name)
            .execute(conn)
            .await
            .map_err(HandlerError::retryable)?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: postgres GREETER_URL ENGINE_URL";
    let greeter_db = PgPool::connect(&args.next().ok_or(usage)?).await?;
    let engine_db = PgPool::connect(&args.next().ok_or(usage)?).await?;

    // The engine.
    let config = Config::for_service("engine").with_peer("greeter", SECRET);
    let sql = "CREATE TABLE IF NOT EXISTS arrivals (message_id TEXT PRIMARY KEY, name TEXT)";
    sqlx::raw_sql(sql).execute(&engine_db).await?;
    let engine = Host::builder(config, PgStore::open(engine_db.clone()).await?)
        .service(aio::EngineReceiver(Arrivals))
        .listen("127.0.0.1:0")
        .await?;

    // The greeting service.
    let config = Config::for_service("greeter")
        .with_destination("engine", DestinationConfig::new(engine.url(), SECRET));
    let greeter = Host::builder(config, PgStore::open(greeter_db.clone()).await?);
    let client = aio::EngineClient::new(greeter.outbox().clone(), "engine");
    let greeter = greeter.listen("127.0.0.1:0").await?;

    // Newcomers and their messages commit together (a second run sends nothing).
    let sql = "CREATE TABLE IF NOT EXISTS people (name TEXT PRIMARY KEY)";
    sqlx::raw_sql(sql).execute(&greeter_db).await?;
    let mut tx = greeter_db.begin().await?;
    for name in ["Ada", "Grace"] {
        let sql = "INSERT INTO people (name) VALUES ($1) ON CONFLICT DO NOTHING";
        let added = sqlx::query(sql).bind(name).execute(&mut *tx).await?;
        if added.rows_affected() == 1 {
            client.joined(&mut tx, name.into()).await?;
        }
    }
    tx.commit().await?;

    // Wait (at most 10 s) until the engine has both, then stop in order.
    let mut arrived = 0;
    for _ in 0..100 {
        arrived = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM arrivals")
            .fetch_one(&engine_db)
            .await?;
        if arrived == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    greeter.shutdown().await?;
    engine.shutdown().await?;
    if arrived != 2 {
        return Err(format!("{arrived} of 2 arrivals within 10 s").into());
    }
    println!("the engine recorded 2 arrivals, each once");
    Ok(())
}
