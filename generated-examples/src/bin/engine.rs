//! The stand-in workflow engine as a process of its own:
//! `engine --listen 127.0.0.1:7002 [--grpc-listen 127.0.0.1:7012] --db engine.db --peer-url http://127.0.0.1:7001 [--peer-url URL …] --secret whsec_… --peer-secret whsec_…`.
//! A `grpc://` peer URL sends over gRPC; `--grpc-listen` also serves the
//! receiver over gRPC.
//! Runs until SIGTERM or SIGINT, then stops gracefully (exit 0 within 10 s);
//! safe to kill at any moment (SIGKILL included).

use clap::Parser;
use rfidl_examples::demo::engine::Engine;
use rfidl_examples::demo::{ServiceArgs, run_until_signal};

#[derive(Parser)]
#[command(
    about = "Stand-in workflow engine: handles EmpService v1 and v2 hires, sends ProvisionLaptop commands"
)]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
    /// Fault drill: the hire handler takes this long (inside its
    /// transaction, on the receiver's writer thread), for one hire in
    /// `--slow-every`.
    #[arg(long, value_parser = rfidl_runtime::duration::parse_duration, default_value = "0s")]
    slow_handler: std::time::Duration,
    /// Which hires are slow: one in this many (1: all).
    #[arg(long, default_value_t = 1)]
    slow_every: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rfidl_examples::demo::init_logging();
    let args = Args::parse();
    let signal = rfidl_examples::demo::shutdown_signal()?;
    let slow = rfidl_examples::demo::engine::SlowHandler {
        delay: args.slow_handler,
        every: args.slow_every.max(1),
    };
    let engine = Engine::start_with(&args.service.settings("engine", "hr-service")?, slow).await?;
    println!("engine listening on {}", engine.url);
    if let Some(url) = &engine.grpc_url {
        println!("engine receiving over gRPC on {url}");
    }
    run_until_signal("engine", signal, engine.host).await
}
