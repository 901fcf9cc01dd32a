//! An async service on sqlx PostgreSQL: an axum route writes a row and
//! enqueues `AssignDesk` in one sqlx transaction; the greeter's async
//! handler assigns a desk and answers; the engine stores the answer. Each
//! write commits exactly once with the row that records its message.
//! `cargo run -p rfidl-examples --example axum_sqlx -- POSTGRES_URL`

#[allow(dead_code)] // `cargo xtask regen` generates it from contracts/greeter.rfidl
#[path = "generated/mod.rs"]
mod contracts;

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use contracts::greeter::{Desk, greeter_v1::aio};
use rfidl_runtime::{
    Config, HandlerError, Host, IncomingCall, config::DestinationConfig, responses::Answer,
    store::sqlx_postgres::PgStore,
};
use sqlx::{PgConnection, PgPool, Postgres};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The secret the engine signs with and the greeter accepts.
const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGhlLWRlbW8=";

/// The greeter: one desk per name, the same one when asked again.
struct Desks;

impl aio::ServiceHandler<Postgres> for Desks {
    async fn assign_desk(
        &self,
        _: &IncomingCall<'_>,
        conn: &mut PgConnection,
        name: String,
    ) -> Result<Desk, HandlerError> {
        let sql = "INSERT INTO greeter.desks (name) VALUES ($1) \
                   ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING number";
        let number = sqlx::query_scalar(sql).bind(name).fetch_one(conn).await;
        let number = number.map_err(HandlerError::retryable)?;
        Ok(Desk { number, floor: 1 })
    }
}

/// The engine: keeps the desk the greeter answered with.
struct Seats;

impl aio::ServiceAnswers<Postgres> for Seats {
    async fn assign_desk(
        &self,
        answer: &Answer<'_>,
        conn: &mut PgConnection,
        desk: Desk,
    ) -> Result<(), HandlerError> {
        let sql = "UPDATE engine.requests SET desk = $2 WHERE name = $1";
        let name = answer.correlation_id.unwrap_or_default();
        let query = sqlx::query(sql).bind(name).bind(desk.number);
        query.execute(conn).await.map_err(HandlerError::retryable)?;
        Ok(())
    }
}

type App = (PgPool, aio::ServiceClient<Postgres>);

/// `POST /desk/{name}`: the request row and its message commit together.
async fn ask(State((pool, greeter)): State<App>, Path(name): Path<String>) -> StatusCode {
    let asked = async {
        let mut tx = pool.begin().await?;
        let sql = "INSERT INTO engine.requests (name) VALUES ($1) ON CONFLICT DO NOTHING";
        let added = sqlx::query(sql).bind(&name).execute(&mut *tx).await?;
        if added.rows_affected() == 1 {
            greeter.assign_desk(&mut tx, name).await?;
        }
        Ok::<_, Error>(tx.commit().await?)
    };
    match asked.await {
        Ok(()) => StatusCode::ACCEPTED,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args().nth(1).ok_or("usage: axum_sqlx URL")?;
    let pool = PgPool::connect(&url).await?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS greeter; CREATE SCHEMA IF NOT EXISTS engine;
         CREATE TABLE IF NOT EXISTS greeter.desks (name TEXT PRIMARY KEY, number BIGSERIAL);
         CREATE TABLE IF NOT EXISTS engine.requests (name TEXT PRIMARY KEY, desk BIGINT)",
    )
    .execute(&pool)
    .await?;

    let config = Config::for_service("greeter").with_peer("engine", SECRET);
    let greeter = Host::builder(
        config,
        PgStore::open_in_schema(pool.clone(), "greeter").await?,
    )
    .service(aio::ServiceReceiver(Desks))
    .listen("127.0.0.1:0")
    .await?;

    let config = Config::for_service("engine")
        .with_destination("greeter", DestinationConfig::new(greeter.url(), SECRET));
    let engine = Host::builder(
        config,
        PgStore::open_in_schema(pool.clone(), "engine").await?,
    );
    let client = aio::ServiceClient::new(engine.outbox().clone(), "greeter");
    let app = axum::Router::new()
        .route("/desk/{name}", axum::routing::post(ask))
        .with_state((pool.clone(), client));
    let engine = engine
        .responses(aio::ServiceAnswerRouter(Seats))
        .router(app)
        .listen("127.0.0.1:0")
        .await?;

    // Two requests through the route, as the engine's users would send them.
    let http = reqwest::Client::new();
    for name in ["Ada", "Grace"] {
        let sent = http.post(format!("{}/desk/{name}", engine.url())).send();
        sent.await?.error_for_status()?;
    }
    // Wait (at most 20 s) until both have a desk, then stop in order.
    let sql = "SELECT name, desk FROM engine.requests WHERE desk IS NOT NULL ORDER BY name";
    let mut seated = Vec::new();
    for _ in 0..200 {
        seated = sqlx::query_as::<_, (String, i64)>(sql)
            .fetch_all(&pool)
            .await?;
        if seated.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    engine.shutdown().await?;
    greeter.shutdown().await?;
    for (name, desk) in &seated {
        println!("{name}: desk {desk}");
    }
    match seated.len() {
        2 => Ok(()),
        n => Err(format!("{n} of 2 desks assigned within 20 s").into()),
    }
}
