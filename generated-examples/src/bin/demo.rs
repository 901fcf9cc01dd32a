//! The rfidl demo: an HR service and a stand-in workflow engine, each with
//! its own SQLite file (or its own schema of one PostgreSQL database, `--db
//! postgres://…`) and HTTP receiver on loopback, talking only through
//! generated code. It hires employees while the engine goes down for a while
//! and acknowledgements get lost, then prints what the databases say.
//!
//! `cargo run -p rfidl-examples --bin demo [-- --hires 300 --dir DIR --db postgres://…]`

// EmpService v1 is deprecated in the contract; the demo still publishes and
// serves it on purpose, as a service does while old peers move to v2.
#![allow(deprecated)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use rfidl_examples::demo::engine::Engine;
use rfidl_examples::demo::hr::{HrService, outbox_counts};
use rfidl_examples::demo::pg::PgDatabase;
use rfidl_examples::demo::registry::{DemoRegistry, registered};
use rfidl_examples::demo::store::replay_sent;
use rfidl_examples::demo::{Database, Settings, count, shutdown_signal};
use rfidl_examples::generated::hr::employees::{emp_service_v1, emp_service_v2};

#[derive(Parser)]
#[command(
    about = "Run the HR + engine demo on embedded defaults (SQLite files, loopback HTTP, an in-process registry)"
)]
struct Args {
    /// How many employees to hire.
    #[arg(long, default_value_t = 300)]
    hires: u32,
    /// Where the SQLite files go (default: a fresh temporary folder).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// How long the engine stays down in the middle of the run.
    #[arg(long, default_value_t = 2)]
    outage_secs: u64,
    /// Run both services on this PostgreSQL database (sqlx, async
    /// handlers) instead of SQLite files:
    /// `postgres://user:password@host:port/database`. HR's tables go in the
    /// schema `hr`, the engine's in `engine` (created if missing).
    #[arg(long, value_name = "URL", value_parser = PgDatabase::parse)]
    db: Option<PgDatabase>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rfidl_examples::demo::init_logging();
    let args = Args::parse();
    let signal = shutdown_signal()?;
    let temp = tempfile_dir()?;
    let dir = args.dir.clone().unwrap_or_else(|| temp.clone());
    std::fs::create_dir_all(&dir)?;

    // The contract's owner publishes; its peer checks what it was built
    // against. Both services then register with the registry's directory.
    // It also issues both services their signing keys: no secret below.
    let registry = DemoRegistry::start(&dir.join("registry.db"), &dir.join("registry.key")).await?;
    for (version, manifest) in [
        (1, emp_service_v1::MANIFEST_JSON),
        (2, emp_service_v2::MANIFEST_JSON),
    ] {
        registry
            .publish(emp_service_v1::INTERFACE, version, manifest)
            .await?;
    }

    let database = |name: &str| match &args.db {
        Some(postgres) => Database::Postgres(postgres.clone().in_schema(name)),
        None => Database::Sqlite(dir.join(format!("{name}.db"))),
    };
    // Free ports first: each service needs the other's URL.
    let engine_listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let hr_listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let engine_settings = Settings {
        service_id: "engine".into(),
        listen: engine_listen,
        grpc_listen: None,
        db: database("engine"),
        peer_id: "hr-service".into(),
        peer_url: format!("http://{hr_listen}"),
        peer_urls: Vec::new(),
        signing_secret: String::new(),
        peer_secret: String::new(),
        base_config: None,
        registry: Some(registry.url.clone()),
        nats: None,
        ops_token: None,
        registry_publish_token: None,
        amqp: None,
    };
    let hr_settings = Settings {
        service_id: "hr-service".into(),
        listen: hr_listen,
        grpc_listen: None,
        db: database("hr"),
        peer_id: "engine".into(),
        peer_url: format!("http://{engine_listen}"),
        peer_urls: Vec::new(),
        signing_secret: String::new(),
        peer_secret: String::new(),
        base_config: None,
        registry: Some(registry.url.clone()),
        nats: None,
        ops_token: None,
        registry_publish_token: None,
        amqp: None,
    };
    // HR (the provider of EmpService) registers first: the registry's
    // manifest scan accepts the engine (its consumer) only once a provider
    // is registered.
    let hr = HrService::start(&hr_settings).await?;
    registered(&hr.host, Duration::from_secs(10)).await?;
    // Its HTTP served by the demo itself, which cuts it for the outage.
    let mut engine = Engine::start_for_outages(&engine_settings).await?;
    registered(&engine.host, Duration::from_secs(10)).await?;

    // SIGTERM or SIGINT ends the run early; both services then stop
    // gracefully (nothing left `Sending`) and the demo exits 0.
    let outcome = tokio::select! {
        outcome = scenario(&args, &registry, &hr, &mut engine) => outcome,
        signal = signal => {
            eprintln!("demo: {signal} received, stopping");
            Ok(())
        }
    };
    registry.server.abort();
    // Each stops in order within its bound: nothing left `Sending`.
    let stop = async {
        hr.host.shutdown().await?;
        engine.stop().await
    };
    if let Err(error) = stop.await {
        eprintln!("demo: {error}; exiting 1");
        std::process::exit(1);
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    outcome
}

/// Checks the manifests, hires through an outage and lost acknowledgements,
/// and prints what the databases and the registry's dashboard say.
async fn scenario(
    args: &Args,
    registry: &DemoRegistry,
    hr: &HrService,
    engine: &mut Engine,
) -> anyhow::Result<()> {
    for (version, compiled) in [
        (1, emp_service_v1::FINGERPRINT),
        (2, emp_service_v2::FINGERPRINT),
    ] {
        let published = registry
            .latest_fingerprint(emp_service_v1::INTERFACE, version)
            .await?;
        anyhow::ensure!(
            published == compiled,
            "the engine was built against EmpService v{version} {compiled}, the registry has {published}"
        );
    }
    println!(
        "rfidl demo: HR at {}, engine at {}, databases {} and {}",
        hr.url, engine.url, hr.db, engine.db
    );
    println!(
        "  both registered with the registry; dashboard at {}/ (while the demo runs)",
        registry.url
    );

    let started = Instant::now();
    let third = args.hires / 3;
    for number in 0..args.hires {
        if number == third {
            println!(
                "  engine goes down for {} s after {number} hires (HR keeps hiring)",
                args.outage_secs
            );
            engine.take_down();
        }
        if number == 2 * third {
            tokio::time::sleep(Duration::from_secs(args.outage_secs)).await;
            engine.bring_up().await?;
            println!("  engine is back");
        }
        hr.hire(number).await?;
        if number % 25 == 0 {
            tokio::task::yield_now().await;
        }
    }
    wait_until_delivered(hr, engine, args.hires).await?;

    // Lost acknowledgements: HR believes 50 hires were never answered and
    // sends them again; the engine must answer from its inbox.
    let replayed = replay_sent(&hr.db, 50)?;
    println!("  replaying {replayed} delivered messages as if their acknowledgements were lost");
    wait_until_delivered(hr, engine, args.hires).await?;
    let elapsed = started.elapsed();

    let hired = count(&hr.db, "SELECT COUNT(*) FROM employees")?;
    let workflows = count(&engine.db, "SELECT COUNT(*) FROM workflows")?;
    let tickets = count(&hr.db, "SELECT COUNT(*) FROM laptop_tickets")?;
    // HR's answers to ProvisionLaptop, acted on by the engine's
    // ServiceAnswers handler in the transaction that recorded each answer.
    let answered = count(
        &engine.db,
        "SELECT COUNT(*) FROM workflows WHERE laptop_ticket IS NOT NULL",
    )?;
    let retries = count(
        &hr.db,
        "SELECT COALESCE(SUM(retry_count), 0) FROM outbox_messages",
    )?;
    let hr_outbox = outbox_counts(&hr.db)?;
    let engine_outbox = outbox_counts(&engine.db)?;
    let duplicates =
        engine.host.metrics().inbox_duplicates.get() + hr.host.metrics().inbox_duplicates.get();
    println!();
    println!(
        "summary (counted from the databases after {:.1} s)",
        elapsed.as_secs_f64()
    );
    println!("  employees hired (HR rows)                 {hired}");
    println!("  HR outbox  -> engine                      {hr_outbox:?}");
    println!("  send attempts retried during the outage   {retries}");
    println!("  workflows started (engine effects)        {workflows}");
    println!("  engine outbox -> HR (ProvisionLaptop)     {engine_outbox:?}");
    println!("  laptop tickets (HR effects of commands)   {tickets}");
    println!("  tickets back at the engine (answers)      {answered}");
    println!("  duplicate deliveries suppressed           {duplicates}");
    let health = |url: String| async move {
        let health: serde_json::Value = reqwest::get(format!("{url}/_rf/health"))
            .await?
            .json()
            .await?;
        anyhow::Ok(health["status"].as_str().unwrap_or("?").to_owned())
    };
    println!(
        "  GET /_rf/health                           hr: {}, engine: {}",
        health(hr.url.clone()).await?,
        health(engine.url.clone()).await?
    );
    println!(
        "  registry (in-process, SQLite)             EmpService v1 + v2 published by HR; \
         the engine's compiled fingerprints match"
    );
    // One round of the health aggregator, as the dashboard shows it.
    registry
        .registry
        .poll_health_once(Duration::from_secs(2))
        .await?;
    let listed: serde_json::Value = reqwest::get(format!("{}/v1/services", registry.url))
        .await?
        .json()
        .await?;
    let colours: Vec<String> = listed["services"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|service| {
            format!(
                "{}: {}",
                service["service"].as_str().unwrap_or("?"),
                service["instances"][0]["health"]["status"]
                    .as_str()
                    .unwrap_or("?")
            )
        })
        .collect();
    println!(
        "  dashboard (health aggregator)             {}",
        colours.join(", ")
    );
    // A message that ended Failed, DeadLetter or Expired waits for a human:
    // the run is not OK even if the counts happen to match.
    let needs_a_human = |counts: &std::collections::BTreeMap<String, u64>| -> u64 {
        ["Failed", "DeadLetter", "Expired"]
            .iter()
            .filter_map(|status| counts.get(*status))
            .sum()
    };
    let stuck = needs_a_human(&hr_outbox) + needs_a_human(&engine_outbox);
    println!("  messages waiting for an operator          {stuck}");
    let exactly_once =
        hired == workflows && workflows == tickets && tickets == answered && stuck == 0;
    println!(
        "  exactly once                              {}",
        if exactly_once { "yes" } else { "NO" }
    );
    anyhow::ensure!(
        exactly_once,
        "effects do not match hires: {hired} hired, {workflows} workflows, {tickets} tickets, \
         {answered} tickets back at the engine, {stuck} messages Failed, dead-lettered or expired"
    );
    Ok(())
}

/// Waits until neither outbox has anything left to send.
async fn wait_until_delivered(hr: &HrService, engine: &Engine, hires: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open = |db: &Database| {
            count(
                db,
                "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')",
            )
        };
        let (hr_open, engine_open) = (open(&hr.db)?, open(&engine.db)?);
        let commands = count(&engine.db, "SELECT COUNT(*) FROM outbox_messages")?;
        if hr_open == 0 && engine_open == 0 && commands >= i64::from(hires) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not delivered within 60 s: {hr_open} HR and {engine_open} engine messages open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("rfidl-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
