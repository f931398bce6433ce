//! `shaddock-loadtest`: the load-test subcommands as a standalone binary, the same as
//! `shaddock loadtest <subcommand>`. Only parses flags and sets up logging.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "shaddock-loadtest", about = "Shaddock load generators")]
struct Cli {
    #[command(subcommand)]
    command: loadtest::Command,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Logs to stderr so stdout carries only the report a script parses.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,loadtest=info")),
        )
        .init();
    loadtest::run(cli.command).await
}
