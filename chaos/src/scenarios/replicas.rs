//! Three engine replicas on one PostgreSQL database, SIGKILLed at random
//! while hires flow (`replicas`). Needs `RFIDL_POSTGRES_URL`; it creates and
//! drops only a database of its own on that server.

use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::Rng as _;
use rand::rngs::StdRng;
use sqlx::Connection as _;

use super::super::Context;
use super::super::cluster::{Cluster, free_port, wait_listening};
use super::super::report::Report;

/// Three `engine` replicas on one PostgreSQL database behind one
/// `hr-service` that lists all three (`--peer-url` three times), while
/// `--replica-hires` hires flow: SIGKILLs of a random replica at random
/// moments, each restarted on the same port after a pause. The database
/// decides which replica processes a message; every hire must still come
/// out exactly once. Needs `RFIDL_POSTGRES_URL` (`cargo xtask chaos` starts
/// a throw-away server).
pub(crate) async fn replicas(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    const REPLICAS: usize = 3;
    let server = std::env::var("RFIDL_POSTGRES_URL").context(
        "`replicas` needs a PostgreSQL server: set RFIDL_POSTGRES_URL (cargo xtask chaos starts one)",
    )?;
    let database = format!("rfidl_chaos_{}", std::process::id());
    let engine_url = postgres_database(&server, &database)?;
    // DROP and CREATE DATABASE cannot run in a transaction: one statement each.
    let mut admin = sqlx::postgres::PgConnection::connect(&server).await?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
        format!("CREATE DATABASE {database}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await?;
    }
    admin.close().await?;

    let hires = context.replica_hires;
    let mut cluster = Cluster::new(&Context {
        messages: hires,
        ..context.clone()
    })?;
    cluster.hire_rate = (hires / 10).max(1);
    let ports: Vec<u16> = (0..REPLICAS)
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let peers: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let peer_refs: Vec<&str> = peers.iter().map(String::as_str).collect();
    let engine_db = std::ffi::OsString::from(&engine_url);
    let start = |cluster: &Cluster, index: usize| {
        cluster.spawn(
            "engine",
            &format!("engine-{index}"),
            (ports[index], &engine_db, &[&cluster.engine_peer]),
            (&cluster.engine_secret, &cluster.hr_secret),
            |command| {
                command.args(["--slow-handler", "2ms", "--slow-every", "10"]);
            },
        )
    };
    let mut engines: Vec<Option<Child>> = Vec::new();
    for index in 0..REPLICAS {
        engines.push(Some(start(&cluster, index)?));
    }
    for port in &ports {
        wait_listening(*port, Duration::from_secs(20)).await?;
    }
    let hr = cluster.spawn(
        "hr-service",
        "hr",
        (cluster.hr_port, cluster.hr_db.as_os_str(), &peer_refs),
        (&cluster.hr_secret, &cluster.engine_secret),
        |command| {
            command
                .args(["--hire", &hires.to_string()])
                .args(["--hire-rate", &cluster.hire_rate.to_string()]);
        },
    )?;
    cluster.hr = Some(hr);
    let engine_database =
        rfidl_examples::demo::Database::parse(&engine_url).map_err(anyhow::Error::msg)?;
    let mut faults = 0;
    for _ in 0..context.kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..600))).await;
        cluster.check_alive()?;
        let victim = rng.random_range(0..REPLICAS);
        Cluster::kill(&mut engines[victim]);
        faults += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        engines[victim] = Some(start(&cluster, victim)?);
    }
    let open = "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')";
    let engine_count = |sql: &str| rfidl_examples::demo::count(&engine_database, sql).unwrap_or(-1);
    let started = Instant::now();
    let drained_in = loop {
        cluster.check_alive()?;
        for (index, engine) in engines.iter_mut().enumerate() {
            if let Some(child) = engine
                && let Some(status) = child.try_wait()?
            {
                bail!("engine-{index} exited by itself ({status})");
            }
        }
        let hired = i64::from(hires);
        if Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees") >= hired
            && Cluster::count(&cluster.hr_db, open) == 0
            && Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM laptop_tickets") >= hired
            && engine_count(open) == 0
            && engine_count("SELECT COUNT(*) FROM outbox_messages") >= hired
        {
            break Some(started.elapsed());
        }
        if started.elapsed() > context.drain_timeout {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let verdict = rfidl_examples::demo::verdict::verdict_of(
        &rfidl_examples::demo::Database::Sqlite(cluster.hr_db.clone()),
        &engine_database,
        &context.dir,
    )?;
    for engine in &mut engines {
        Cluster::kill(engine);
    }
    cluster.stop();
    let processed: Vec<String> = (0..REPLICAS)
        .map(|index| {
            let log = std::fs::read_to_string(context.dir.join(format!("engine-{index}.log")))
                .unwrap_or_default();
            format!(
                "engine-{index}:{}starts",
                log.matches("listening on").count()
            )
        })
        .collect();
    Ok(Report {
        messages: hires,
        faults,
        verdict,
        drained_in,
        notes: vec![format!("replicas={REPLICAS}"), processed.join(",")],
    })
}

/// `server` (a `postgres://` URL) with its database replaced by `name`.
pub(crate) fn postgres_database(server: &str, name: &str) -> anyhow::Result<String> {
    let (scheme, rest) = server
        .split_once("://")
        .context("RFIDL_POSTGRES_URL is not a URL")?;
    let (location, query) = rest
        .split_once('?')
        .map_or((rest, None), |(l, q)| (l, Some(q)));
    let authority = location.split_once('/').map_or(location, |(a, _)| a);
    Ok(match query {
        Some(query) => format!("{scheme}://{authority}/{name}?{query}"),
        None => format!("{scheme}://{authority}/{name}"),
    })
}
