//! The `broker` binary: the embedded broker on its own, started with nats-server's flags
//! so that tools which start "a nats-server" can start it (see `broker::cli`).

use std::process::ExitCode;

use clap::Parser;

/// A NATS-protocol broker (core protocol v1) with nats-server's command-line flags.
#[derive(Debug, Parser)]
#[command(name = "broker", version, disable_version_flag = true)]
struct Cli {
    /// Print the version and exit (nats-server's -v).
    #[arg(short = 'v', long, action = clap::ArgAction::Version)]
    version: Option<bool>,

    #[command(flatten)]
    args: broker::cli::BrokerArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    match broker::cli::run(Cli::parse().args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line with the whole cause chain, like nats-server's fatal errors.
            eprintln!("broker: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
