//! `shaddock-loadtest`: the load-test subcommands as a standalone binary, the same as
//! `shaddock loadtest <subcommand>` but on mimalloc (see below): the binary to measure
//! with. Only parses flags and sets up logging.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc for the load generator only: under overload glibc's per-thread arenas shrank
/// and grew with the backlog, and re-faulting their pages made the generator collapse (3
/// of 10 runs at 200 clients, none of 16 with mimalloc). The servers stay on jemalloc,
/// which gives memory back after a burst (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "shaddock-loadtest", about = "Shaddock load generators")]
struct Cli {
    #[command(subcommand)]
    command: loadtest::Command,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs to stderr so stdout carries only the report a script parses.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,loadtest=info")),
        )
        .init();
    match loadtest::run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line with the cause chain, as `shaddock` prints it: no backtrace, even
            // with RUST_BACKTRACE set (a failed scenario is not a bug in this program).
            eprintln!("shaddock-loadtest: {error:#}");
            ExitCode::FAILURE
        }
    }
}
