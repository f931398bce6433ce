//! Load generators for Shaddock, run as `shaddock loadtest <subcommand>`.
//!
//! Each subcommand is a bounded experiment: it stops by itself, counts errors instead of
//! panicking, and prints one human-readable report (or one JSON line with `--json`) on
//! stdout so `scripts/bench-broker.sh` can parse it. Progress goes to `tracing` (stderr).
//!
//! - [`bus_rr`]: request-reply over NATS (BENCHMARKS.md B6), latency in an HDR histogram.
//! - [`idle_conns`]: resident memory a server spends per idle NATS connection.

pub mod bus_rr;
pub mod duration;
pub mod idle_conns;
pub mod latency;
pub mod limit;
pub mod topology;

/// Load-test subcommands (`shaddock loadtest ...`).
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Request-reply over NATS: closed-loop requesters against queue-group responders.
    BusRr(bus_rr::Args),
    /// Resident memory per idle NATS connection of a server given by pid.
    IdleConns(idle_conns::Args),
}

/// Runs one load-test subcommand.
pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::BusRr(args) => bus_rr::run(args).await,
        Command::IdleConns(args) => idle_conns::run(args).await,
    }
}
