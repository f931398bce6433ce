//! Load generators for Shaddock, run as `shaddock loadtest <subcommand>`.
//!
//! Each subcommand is a bounded experiment: it stops by itself, counts errors instead of
//! panicking, and prints one human-readable report (or one JSON line with `--json`) on
//! stdout so `scripts/bench-broker.sh` can parse it. Progress goes to `tracing` (stderr).
//!
//! - [`bus_rr`]: request-reply over NATS (BENCHMARKS.md B6), latency in an HDR histogram.
//! - [`idle_conns`]: resident memory a server spends per idle NATS connection.
//! - [`ws`]: open-loop WebSocket load through the gateway and its scenarios
//!   (`concurrency`, `pomelo-a`, `pomelo-b`, `saturate`, `idle`, `limit`, `broadcast`,
//!   `pomelo-compare`, `churn`).
//! - [`faults`]: steady load through the gates while the fleet changes phase by phase.

pub mod bus_rr;
pub mod duration;
pub mod faults;
pub mod idle_conns;
pub mod latency;
pub mod limit;
pub mod tls;
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
    /// Pomelo scenario A: 1 gate + 1 echo worker, 2 clients × 10,000 requests at 1 ms.
    PomeloA(ws::scenario::PomeloArgs),
    /// Pomelo scenario B: 4 gates + 1 echo worker, 4 clients, one per gate.
    PomeloB(ws::scenario::PomeloArgs),
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
    /// Steady load while the fleet changes (worker added, drained, killed; gate
    /// drained; bus node restarted): per phase, what the clients saw.
    Faults(faults::FaultsArgs),
}

/// Prints a tool's report on stdout: the JSON line when `json`, else the text. The
/// report is the tool's output, not a log line, hence stdout.
pub fn print_report(
    json_report: &serde_json::Value,
    text: impl FnOnce() -> String,
    json: bool,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let out = if json {
        json_report.to_string()
    } else {
        text()
    };
    writeln!(std::io::stdout().lock(), "{out}").context("writing the report")
}

/// Runs one load-test subcommand.
pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::BusRr(args) => bus_rr::run(args).await,
        Command::IdleConns(args) => idle_conns::run(args).await,
        Command::Concurrency(args) => ws::scenario::concurrency(args).await,
        Command::PomeloA(args) => ws::scenario::pomelo_a(args).await,
        Command::PomeloB(args) => ws::scenario::pomelo_b(args).await,
        Command::Saturate(args) => ws::scenario::saturate(args).await,
        Command::Idle(args) => ws::idle::idle(args).await,
        Command::Limit(args) => ws::scenario::limit(args).await,
        Command::Broadcast(args) => ws::broadcast::broadcast(args).await,
        Command::PomeloCompare(args) => ws::pomelo::pomelo_compare(args).await,
        Command::Churn(args) => ws::churn::churn(args).await,
        Command::Faults(args) => faults::faults(args).await,
    }
}
