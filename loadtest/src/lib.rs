//! Load generators for Shaddock, run as `shaddock loadtest <subcommand>`. Each subcommand
//! is a bounded experiment: it stops by itself, counts errors instead of panicking, and
//! prints one report on stdout (one JSON line with `--json -`, for scripts); progress
//! goes to `tracing` (stderr).
//!
//! Layers, each importing only those before it: the leaves [`hist`], [`proc`],
//! [`report`]; the parts [`limit`], [`topology`], [`spread`]; the scenarios [`bus_rr`],
//! [`idle_conns`], [`ws`] and [`faults`]. `python3 scripts/check-layers.py loadtest`.

pub mod bus_rr;
pub mod faults;
pub mod hist;
pub mod idle_conns;
pub mod limit;
pub mod proc;
pub mod report;
pub mod spread;
pub mod topology;
pub mod ws;

/// Load-test subcommands (`shaddock loadtest ...`).
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Request-reply over NATS: closed-loop requesters against queue-group responders.
    BusRr(bus_rr::Args),
    /// Resident memory per idle NATS connection of a server given by pid.
    IdleConns(idle_conns::Args),
    /// Open-loop WebSocket load through the gateway, one run per client count
    /// (BENCHMARKS.md "Gateway end to end").
    Concurrency(ws::scenario::ConcurrencyArgs),
    /// Raise the per-client rate to the highest whose p99 stays under a target.
    Saturate(ws::scenario::SaturateArgs),
    /// Resident memory a gate spends per idle WebSocket session.
    Idle(ws::idle::IdleArgs),
    /// The same load against a bare WebSocket echo server: the machine's limit.
    Limit(ws::scenario::LimitArgs),
    /// Room fan-out: one chat room, many members over the gates, one sender.
    Broadcast(ws::broadcast::BroadcastArgs),
    /// One pomelo-protocol client against the gate and against a pomelo server.
    PomeloCompare(ws::pomelo::PomeloCompareArgs),
    /// Sessions opened and closed, each doing a mix of requests: what each closed
    /// session leaves behind in each process's RSS.
    Churn(ws::churn::ChurnArgs),
    /// A keyed service under a game's load: arena matches × players at 20 Hz, the
    /// input-to-state latency, and what a drained owner costs the players.
    Matches(ws::matches::MatchesArgs),
    /// Steady load while the fleet changes (worker added, drained, killed; gate
    /// drained; bus node restarted): per phase, what the clients saw.
    Faults(faults::FaultsArgs),
}

/// Runs one load-test subcommand.
pub async fn run(command: Command) -> anyhow::Result<()> {
    // Every session is a descriptor: hold as many as the hard limit allows
    // (spread::explain names it when a connect hits it).
    net::nofile::raise().map_err(|e| anyhow::anyhow!("raising the open-file limit: {e}"))?;
    match command {
        Command::BusRr(args) => bus_rr::run(args).await,
        Command::IdleConns(args) => idle_conns::run(args).await,
        Command::Concurrency(args) => ws::scenario::concurrency(args).await,
        Command::Saturate(args) => ws::scenario::saturate(args).await,
        Command::Idle(args) => ws::idle::idle(args).await,
        Command::Limit(args) => ws::scenario::limit(args).await,
        Command::Broadcast(args) => ws::broadcast::broadcast(args).await,
        Command::PomeloCompare(args) => ws::pomelo::pomelo_compare(args).await,
        Command::Churn(args) => ws::churn::churn(args).await,
        Command::Matches(args) => ws::matches::matches(args).await,
        Command::Faults(args) => faults::faults(args).await,
    }
}
