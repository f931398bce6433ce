//! `shaddock`: one binary, one subcommand per role.
//!
//! `up` runs every role in one process on the embedded broker; the other subcommands run
//! one role each. Each role's flags and logic live in its crate; this file only wires
//! them to subcommands.

use std::process::ExitCode;

use broker::cli::{BrokerArgs, ShutdownSignals, init_logging};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Game-server RPC gateway on NATS pub/sub.
#[derive(Debug, Parser)]
#[command(name = "shaddock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything in one process on the embedded broker.
    Up(UpArgs),
    /// Run the embedded NATS-protocol broker alone; flags follow nats-server's.
    Broker(Box<BrokerArgs>),
    /// Generate load and run benchmark scenarios.
    Loadtest {
        #[command(subcommand)]
        command: loadtest::Command,
    },
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// Port of the embedded broker for NATS clients (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = broker::cli::DEFAULT_PORT)]
    #[arg(env = "SHADDOCK_UP_BROKER_PORT")]
    broker_port: u16,

    /// Port of the embedded broker's HTTP monitoring (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = broker::cli::DEFAULT_MONITOR_PORT)]
    #[arg(env = "SHADDOCK_UP_MONITOR_PORT")]
    monitor_port: u16,
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Up(args) => up(args).await,
        Command::Broker(args) => broker::cli::run(*args).await,
        Command::Loadtest { command } => run_loadtest(command).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line with the whole cause chain, e.g. "config file x: line 3: ...".
            eprintln!("shaddock: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_loadtest(command: loadtest::Command) -> anyhow::Result<()> {
    init_logging(None, None)?;
    loadtest::run(command).await
}

/// Starts every role against the embedded broker, all sharing one shutdown token, and
/// stops them together on SIGINT/SIGTERM or when any of them fails.
async fn up(args: UpArgs) -> anyhow::Result<()> {
    let broker_args = BrokerArgs {
        port: Some(args.broker_port.into()),
        http_port: Some(args.monitor_port.into()),
        ..BrokerArgs::default()
    };
    let settings = broker_args.resolve()?;
    init_logging(None, settings.log_level)?;
    let mut signals = ShutdownSignals::install()?;
    let shutdown = CancellationToken::new();
    let broker = broker::cli::Broker::start(&settings, shutdown.clone()).await?;
    // Gates and workers start here, connecting to `broker.client_addr()` and sharing
    // `shutdown`.
    info!("Server is ready");
    signals.wait(&shutdown).await;
    info!("Initiating Shutdown...");
    shutdown.cancel();
    broker.stop().await
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
