//! The HR service as a process of its own:
//! `hr-service --listen 127.0.0.1:7001 [--grpc-listen 127.0.0.1:7011] --db hr.db --peer-url http://127.0.0.1:7002 [--peer-url URL …] --secret whsec_… --peer-secret whsec_… [--hire 100] [--exit-when-done]`.
//! A `grpc://` peer URL (e.g. `grpc://127.0.0.1:7012`, the engine's
//! `--grpc-listen`) sends over gRPC; `--grpc-listen` also serves the
//! receiver over gRPC.
//! Stops gracefully on SIGTERM or SIGINT (exit 0 within 10 s).

use std::time::Duration;

use clap::Parser;
use rfidl_examples::demo::hr::HrService;
use rfidl_examples::demo::{ServiceArgs, count, finish, shutdown_signal};

#[derive(Parser)]
#[command(
    about = "HR service: hires employees (EmployeeHired to the engine) and handles ProvisionLaptop commands"
)]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
    /// Hire this many employees at start (counting those already in the
    /// database: a restarted process goes on where the last one stopped).
    #[arg(long, default_value_t = 0)]
    hire: u32,
    /// Hires per second (0: as fast as the database takes them).
    #[arg(long, default_value_t = 0)]
    hire_rate: u32,
    /// Exit 0 once every hire has its laptop ticket and every message this
    /// service sent is acknowledged.
    #[arg(long)]
    exit_when_done: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rfidl_examples::demo::init_logging();
    let args = Args::parse();
    let signal = shutdown_signal()?;
    tokio::pin!(signal);
    let hr = HrService::start(&args.service.settings("hr-service", "engine")?).await?;
    println!("hr-service listening on {}", hr.url);
    if let Some(url) = &hr.grpc_url {
        println!("hr-service receiving over gRPC on {url}");
    }
    let already = count(&hr.db, "SELECT COUNT(*) FROM employees")? as u32;
    let started = std::time::Instant::now();
    for (done, number) in (already..args.hire).enumerate() {
        // Each hire commits on its own; a signal between two stops cleanly.
        hr.hire(number).await?;
        let pause = if args.hire_rate > 0 {
            let due = Duration::from_secs_f64((done + 1) as f64 / f64::from(args.hire_rate));
            due.saturating_sub(started.elapsed())
        } else {
            Duration::ZERO
        };
        // A zero-length `sleep` would still wait for the timer's next tick
        // (about 1 ms: at most ~1,000 hires a second); without a pause the
        // signal is only polled.
        let paced = async {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        };
        tokio::select! {
            biased;
            received = &mut signal => return finish("hr-service", received, hr.host).await,
            () = paced => {}
        }
    }
    if args.exit_when_done {
        loop {
            let tickets = count(&hr.db, "SELECT COUNT(*) FROM laptop_tickets")?;
            let hired = count(&hr.db, "SELECT COUNT(*) FROM employees")?;
            // Rows a killed predecessor left `Sending` count too: they are
            // re-sent once their lease runs out, and acknowledged as duplicates.
            let unacknowledged = count(
                &hr.db,
                "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')",
            )?;
            if tickets >= hired && unacknowledged == 0 {
                println!("done: {hired} hired, {tickets} laptop tickets");
                break;
            }
            tokio::select! {
                received = &mut signal => return finish("hr-service", received, hr.host).await,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        Ok(hr.host.shutdown().await?)
    } else {
        let received = signal.await;
        finish("hr-service", received, hr.host).await
    }
}
