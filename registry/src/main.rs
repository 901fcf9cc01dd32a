//! `rfidl-registry serve --db FILE --listen ADDR [--publish-token TOKEN]`:
//! the manifest registry as a process. Prints `listening on http://ADDR`
//! once it accepts connections (`--listen 127.0.0.1:0` picks a free port).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rfidl-registry",
    version,
    about = "Stores versioned, immutable rfidl interface manifests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the registry API (docs/registry.md).
    Serve {
        /// SQLite file holding the manifests (created if missing).
        #[arg(long)]
        db: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7300")]
        listen: SocketAddr,
        /// Require this bearer token to publish (reads stay open).
        #[arg(long, env = "RFIDL_REGISTRY_TOKEN", hide_env_values = true)]
        publish_token: Option<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `info` by default, so each publish is logged (on stderr: stdout carries
    // only the `listening on` line); RUST_LOG overrides.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve {
        db,
        listen,
        publish_token,
    } = Cli::parse().command;
    let mut registry = rfidl_registry::Registry::open(&db)?;
    if let Some(token) = publish_token {
        anyhow::ensure!(
            !token.is_empty(),
            "the publish token is empty; give a non-empty --publish-token or RFIDL_REGISTRY_TOKEN, \
             or neither for an open registry"
        );
        registry = registry.publish_token(token);
    }
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, registry.router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
