//! `shaddock loadtest faults`: what clients see while the fleet changes under steady
//! load (issue #15). The fleet is a bus (one `shaddock broker`, or 3 nats-server nodes
//! routed into a cluster: `--bus`), 2 gates and 3 echo workers, each its own process.
//! N clients send `echo.raw` at a steady rate through the gates for the whole run, while
//! the phases do one thing each to the fleet at their start, then run `--phase` longer
//! under the same load:
//!
//! 1. baseline: nothing;
//! 2. add a worker;
//! 3. drain a worker (SIGTERM, wait for it to exit);
//! 4. kill a worker (SIGKILL);
//! 5. drain a gate (SIGTERM, wait for it to exit), then start a new gate on its port;
//! 6. restart a bus node: SIGKILL the broker (or one cluster node, the others staying
//!    up) and start it again on its ports.
//!
//! Every request counts in the phase it was sent in: answered (by code), cut (the
//! connection closed under it), timed out, or lost (no outcome at all by the end, plus
//! `--drain-timeout`). The report gives that per phase with the clients' reconnection
//! gaps and the longest stretch without any 200, and checks it against what the issue
//! expects of the phase (`phases::Expectation`); `--check` makes a missed expectation
//! the command's failure.

mod fleet;
mod load;
mod phases;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::proc::CpuSample;
use crate::report::OutputArgs;
use crate::topology::Topology;
use load::{LoadConfig, PhaseClock};
use phases::{Limits, PHASES, Struck, Window};
use report::{FaultsReport, PhaseReport, PhaseRun};

pub use phases::Bus;

/// The request body: small, as a game's request is.
const BODY: &[u8] = b"Hello World, faults";
/// How long a client task may take to end past its last request's timeout and the
/// drain timeout (closing the connection) before the run is declared stuck.
const CLIENT_END_SLACK: Duration = Duration::from_secs(5);

/// `loadtest faults` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct FaultsArgs {
    /// The bus: one `shaddock broker`, or 3 nats-server nodes in a cluster.
    #[arg(long, value_enum, default_value_t = Bus::Shaddock)]
    pub bus: Bus,
    /// Clients, spread over the gates round-robin.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub clients: u32,
    /// Requests per second of each client (open loop).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rate: u32,
    /// How long each phase runs after its fault is done (the fault itself, a drain or a
    /// restart, takes what it takes at the phase's start).
    #[arg(long, default_value = "5s", value_parser = net::duration::parse)]
    pub phase: Duration,
    /// The clients' request timeout.
    #[arg(long, default_value = "10s", value_parser = net::duration::parse)]
    pub timeout: Duration,
    /// After sending stopped and the last request's timeout, how long an outstanding
    /// request may still take before it counts as lost.
    #[arg(long, default_value = "2s", value_parser = net::duration::parse)]
    pub drain_timeout: Duration,
    /// A 503 slower than this breaks the restarted broker's expectation ("fast 503s").
    #[arg(long = "fast-503", default_value = "500ms", value_parser = net::duration::parse)]
    pub fast_503: Duration,
    /// Longest stretch without any 200 a restarted broker may cost.
    #[arg(long, default_value = "2s", value_parser = net::duration::parse)]
    pub max_bus_gap: Duration,
    /// Requests sent up to this long after a SIGKILL may still reach the killed process
    /// (the bus notices its connection closed a moment later): they count as held by it.
    #[arg(long, default_value = "10ms", value_parser = net::duration::parse)]
    pub held_slack: Duration,
    /// Gates at the start (a drained one is replaced).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub gates: u32,
    /// Echo workers at the start (the phases add one, then drain one and kill one).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=16))]
    pub workers: u32,
    /// Extra flag for every gate, repeatable: `--gate-arg=--request-timeout-ms=2000`.
    #[arg(long, allow_hyphen_values = true)]
    pub gate_arg: Vec<String>,
    /// The `shaddock` binary to launch (default: $SHADDOCK_BIN, else this executable
    /// when it is `shaddock`, else `shaddock` beside it).
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// Fail (exit status 1) when a phase misses its expectation. Without it the report
    /// still says, per phase, what was expected and what was seen.
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The longest a phase's fault waits for the requests of the phase before to end.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often that is looked at.
const SETTLE_POLL: Duration = Duration::from_millis(1);

/// Runs the scenario: launches the fleet, runs the phases under load, reports.
pub async fn faults(args: FaultsArgs) -> anyhow::Result<()> {
    let mut fleet = fleet::start(&args).await?;
    let outcome = run_phases(&args, &mut fleet).await;
    let stopped = fleet.shutdown().await;
    let report = outcome?;
    stopped.context("stopping the fleet")?;
    finish(&report, &args)
}

/// The load and the phases, on a running fleet.
async fn run_phases(args: &FaultsArgs, fleet: &mut Topology) -> anyhow::Result<FaultsReport> {
    let mut report = FaultsReport::now(args.bus, fleet::describe(fleet));
    let config = Arc::new(LoadConfig {
        clients: args.clients as usize,
        interval: Duration::from_secs(1) / args.rate,
        route: "echo.raw".to_owned(),
        body: bytes::Bytes::from_static(BODY),
        timeout: args.timeout,
        drain_timeout: args.drain_timeout,
    });
    report.clients = config.clients;
    report.rps_per_client = f64::from(args.rate);
    report.route.clone_from(&config.route);
    report.client_timeout_ms = args.timeout.as_millis();

    let clock = Arc::new(PhaseClock::default());
    let mut clients = load::start(
        config.clone(),
        &fleet.gate_urls(),
        clock.clone(),
        PHASES.len(),
    )
    .await?;
    let origin = Instant::now();
    let mut runs: Vec<PhaseRun> = Vec::new();
    let mut faults_at = Vec::new();
    for (index, fault) in PHASES.into_iter().enumerate() {
        let start = Instant::now();
        clock.set(index);
        // The phase before ends when its requests have: a fault does not strike them
        // (they would count against the phase before, which did nothing to them).
        if let Some(before) = index.checked_sub(1) {
            let settle = Instant::now() + SETTLE_TIMEOUT;
            while !clock.settled(before) && Instant::now() < settle {
                tokio::time::sleep(SETTLE_POLL).await;
            }
        }
        let cpu = CpuSample::take(&[]);
        if !args.output.quiet {
            eprintln!("phase {}: {}", index + 1, fault.name());
        }
        let acted = fleet::act(fleet, fault).await;
        tokio::time::sleep(args.phase).await;
        let checked = fleet.check();
        let (events, fault_at) = match acted {
            Ok(action) => (action.events, action.fault_at),
            Err(e) => {
                report.errors.push(format!("{}: {e:#}", fault.name()));
                (Vec::new(), None)
            }
        };
        if let Err(e) = checked {
            report.errors.push(format!("after {}: {e:#}", fault.name()));
        }
        faults_at.push(fault_at);
        runs.push(PhaseRun {
            fault,
            start,
            end: Instant::now(),
            events,
            cpu: cpu.until(&CpuSample::take(&[])),
        });
        if !report.errors.is_empty() {
            break;
        }
    }
    // Past the last phase: clients stop sending and wait for their answers.
    clock.set(PHASES.len());
    let give_up = Instant::now() + args.timeout + args.drain_timeout + CLIENT_END_SLACK;
    let mut records = Vec::new();
    loop {
        match tokio::time::timeout_at(give_up.into(), clients.join_next()).await {
            Ok(Some(joined)) => records.push(joined.context("a load-test client task failed")?),
            Ok(None) => break,
            Err(_) => {
                clients.abort_all();
                bail!("load-test clients still running past their deadline");
            }
        }
    }
    let end = Instant::now();

    let windows: Vec<Window> = runs
        .iter()
        .zip(&faults_at)
        .map(|(r, &fault_at)| Window {
            start: r.start,
            end: r.end,
            fault: fault_at.map(|at| Struck {
                at,
                held_until: at + args.held_slack,
            }),
        })
        .collect();
    let limits = Limits {
        fast_503: args.fast_503,
        max_bus_gap: args.max_bus_gap,
        held_slack: args.held_slack,
    };
    let tallies = phases::tally(&records, &windows);
    report.phases = runs
        .iter()
        .zip(&tallies)
        .map(|(run, t)| PhaseReport::new(run, t, args.bus, &limits, origin))
        .collect();
    report.timeline = report::timeline(&records, origin, end);
    report.passed = report.errors.is_empty() && report.phases.iter().all(PhaseReport::passed);
    Ok(report)
}

/// Prints the report, writes the requested files; with `--check`, fails when a phase
/// missed its expectation. A run stopped by an error always fails.
fn finish(report: &FaultsReport, args: &FaultsArgs) -> anyhow::Result<()> {
    args.output.write(report, &report.doc())?;
    if !report.errors.is_empty() {
        bail!("the run stopped early: {}", report.errors.join("; "));
    }
    if args.check && !report.passed {
        let missed: Vec<&str> = report
            .phases
            .iter()
            .filter(|p| !p.passed())
            .map(|p| p.name)
            .collect();
        bail!(
            "phases that missed their expectation: {}",
            missed.join(", ")
        );
    }
    Ok(())
}
