//! `shaddock loadtest faults` (issue #15): N clients send `echo.raw` at a steady rate,
//! through TCP hops of ours ([`testkit::Cut`]), to a fleet of a bus (`--bus`), 2 gates
//! and 3 echo workers, while seven phases each do one thing at their start (baseline,
//! cut every link, add/drain/kill a worker, drain a gate, restart a bus node) and run
//! `--phase` on. A request counts in the phase it was sent in: answered (by code), cut,
//! timed out or lost; each phase is checked against the issue (`--check`: a miss fails).

mod load;
mod phases;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::Signal::{SIGKILL, SIGTERM};
use testkit::Cut;
use testkit::fleet::{Role, Topology, or_interrupted};

use crate::proc::CpuSample;
use crate::report::{OutputArgs, Report};
use crate::topology::{Bus, LaunchArgs};
use load::PhaseClock;
use phases::{Fault, FaultsReport, NodeStop, PHASES, PhaseRun};

/// The service the load goes to.
const SERVICE: &str = "echo";
/// How long a client may take to close past its last timeout and the drain timeout.
const CLIENT_END_SLACK: Duration = Duration::from_secs(5);
/// The longest a phase's fault waits for the requests of the phase before to end.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often that is looked at.
const SETTLE_POLL: Duration = Duration::from_millis(1);
/// Requests held for the bus and sent again after "no responders" (gateway.md "Bus blips").
const BLIP_COUNTERS: [&str; 2] = ["gate_requests_held_total", "gate_requests_resent_total"];

/// `loadtest faults` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct FaultsArgs {
    /// How the restart phase stops a node of the nats-server cluster: in lame duck mode
    /// (SIGUSR2, as operators restart one: its clients move first), or at once, with
    /// SIGTERM (nats-server's shutdown: `docker restart`, a plain `systemctl restart`)
    /// or SIGKILL (a crash). The single broker is always killed.
    #[arg(long, value_enum, default_value_t = NodeStop::LameDuck)]
    pub node_stop: NodeStop,
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
    /// Requests sent up to this long after a SIGKILL may still reach the killed process
    /// (the bus notices its connection closed a moment later): they count as held by it.
    #[arg(long, default_value = "10ms", value_parser = net::duration::parse)]
    pub held_slack: Duration,
    /// The fleet: 2 gates (a drained one is replaced) and 3 echo workers (the phases add
    /// one, then drain one and kill one) unless told otherwise.
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// Fail (exit status 1) when a phase misses its expectation. Without it the report
    /// still says, per phase, what was expected and what was seen.
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs the scenario: launches the fleet, runs the phases under load, reports.
pub async fn faults(args: FaultsArgs) -> anyhow::Result<()> {
    let spec = args.launch.spec(2, 3, &[SERVICE]);
    let why = "--workers: at least 2, one to drain and one to kill";
    anyhow::ensure!(spec.workers[0].1 >= 2, why);
    let mut fleet = Topology::start(spec).await.context("launching the fleet")?;
    let pids = fleet.pids().into_iter();
    let processes: Vec<String> = pids.map(|(role, pid)| format!("{role} {pid}")).collect();
    let processes = processes.join(", ");
    let outcome = or_interrupted(run_phases(&args, &mut fleet)).await;
    let stopped = fleet.shutdown().await;
    let report = outcome?;
    stopped.context("stopping the fleet")?;
    let stop = match args.launch.bus {
        Bus::Shaddock => String::new(),
        Bus::NatsCluster => format!(" (a node stopped by {:?})", args.node_stop.signal()),
    };
    let setup = format!("{}{stop}: {processes}", args.launch.bus.describe());
    let report = Report::new("faults", setup, report).written(&args.output)?;
    if !report.errors.is_empty() {
        bail!("the run stopped early: {}", report.errors.join("; "));
    }
    if args.check && !report.passed {
        bail!("phases that missed their expectation: {}", report.missed());
    }
    Ok(())
}

/// The load and the phases, on a running fleet.
async fn run_phases(args: &FaultsArgs, fleet: &mut Topology) -> anyhow::Result<FaultsReport> {
    let clock = Arc::new(PhaseClock::new(PHASES.len()));
    let (hops, gates) = fleet.gate_hops().await?;
    let mut clients = load::start(args, &gates, clock.clone()).await?;
    let origin = Instant::now();
    let mut runs: Vec<PhaseRun> = Vec::new();
    let mut errors = Vec::new();
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
        let counted = fleet.gate_counters(&BLIP_COUNTERS).await;
        if !args.output.quiet {
            eprintln!("phase {}: {}", index + 1, fault.name());
        }
        let mut events = Vec::new();
        let acted = act(fleet, &hops, fault, args.node_stop, &mut events).await;
        tokio::time::sleep(args.phase).await;
        let struck = acted.unwrap_or_else(|e| {
            errors.push(format!("{}: {e:#}", fault.name()));
            None
        });
        if let Err(e) = fleet.check() {
            errors.push(format!("after {}: {e:#}", fault.name()));
        }
        runs.push(PhaseRun {
            fault,
            start,
            end: Instant::now(),
            events,
            struck,
            cpu: cpu.until(&CpuSample::take(&[])),
            blips: blips(&counted, &fleet.gate_counters(&BLIP_COUNTERS).await),
        });
        if !errors.is_empty() {
            break;
        }
    }
    // Past the last phase: clients stop sending and wait for their answers.
    clock.set(PHASES.len());
    let give_up = args.timeout + args.drain_timeout + CLIENT_END_SLACK;
    // A client that panicked is an error here, not a panic of the whole tool.
    let joined = tokio::time::timeout(give_up, async {
        let mut records = Vec::with_capacity(clients.len());
        while let Some(record) = clients.join_next().await {
            records.push(record.context("a load-test client failed")?);
        }
        anyhow::Ok(records)
    });
    let records =
        (joined.await).context("load-test clients still running past their deadline")??;
    Ok(FaultsReport::new(args, &runs, &records, origin, errors))
}

/// Requests held and sent again over a phase, summed over the gates that ran through it
/// (a gate replaced meanwhile starts from 0: its predecessor's count is lost with it).
fn blips(before: &HashMap<Role, Vec<f64>>, after: &HashMap<Role, Vec<f64>>) -> [u64; 2] {
    let mut sums = [0u64; 2];
    for (role, end) in after {
        let start = before.get(role).map_or(&[0.0, 0.0][..], Vec::as_slice);
        for (i, sum) in sums.iter_mut().enumerate() {
            let delta = end.get(i).copied().unwrap_or(0.0) - start.get(i).copied().unwrap_or(0.0);
            *sum += delta.max(0.0) as u64;
        }
    }
    sums
}

/// Does `fault`, each step with its timing in `events`; returns once done (stopped
/// processes exited, started ones ready), with when it killed something, if it did.
async fn act(
    fleet: &mut Topology,
    hops: &[Cut],
    fault: Fault,
    node_stop: NodeStop,
    events: &mut Vec<String>,
) -> anyhow::Result<Option<Instant>> {
    let started = Instant::now();
    let first = |fleet: &Topology, kind: fn(&Role) -> bool| {
        (fleet.running(kind).into_iter().next()).context("no such process left running")
    };
    let mut struck = None;
    match fault {
        Fault::Baseline => {}
        Fault::FlapClients => {
            hops.iter().for_each(Cut::cut);
            events.push("cut every client's link".to_owned());
        }
        Fault::AddWorker => {
            let role = fleet.add_worker(SERVICE).await?;
            let took = started.elapsed();
            events.push(format!("started {role}: ready in {took:.2?}"));
        }
        Fault::DrainWorker | Fault::KillWorker => {
            let role = first(fleet, |r| matches!(r, Role::Worker { .. }))?;
            let kill = fault == Fault::KillWorker;
            struck = kill.then(Instant::now);
            let signal = if kill { SIGKILL } else { SIGTERM };
            events.push(fleet.stop_one(&role, signal).await?.to_string());
        }
        Fault::DrainGate => {
            let role = first(fleet, |r| matches!(r, Role::Gate(_)))?;
            let addr =
                (fleet.listen_addr(&role)).with_context(|| format!("{role} has no address"))?;
            let stopped = fleet.stop_one(&role, SIGTERM).await?;
            events.push(stopped.to_string());
            let restart = Instant::now();
            let new = fleet.add_gate(addr).await?;
            let took = restart.elapsed();
            events.push(format!("started {new} on {addr}: ready in {took:.2?}"));
        }
        Fault::RestartBus => {
            let roles = fleet.bus_roles();
            let role = roles.first().context("the fleet runs no bus")?.clone();
            // A cluster node is restarted as `--node-stop` says: by default as operators
            // do, in lame duck mode (SIGUSR2, as `nats-server --signal ldm` sends), its
            // clients moving to the other nodes before it goes. The single broker is
            // killed: there is nowhere to move, and the gap is what is measured.
            let single = roles.len() == 1;
            let stop = if single { NodeStop::Kill } else { node_stop };
            struck = (stop != NodeStop::LameDuck).then(Instant::now);
            events.push(fleet.stop_one(&role, stop.signal()).await?.to_string());
            let restart = Instant::now();
            fleet.restart_bus_node(0).await?;
            let (took, all) = (restart.elapsed(), started.elapsed());
            events.push(format!(
                "started {role} again on its ports: ready in {took:.2?} ({all:.2?} after the signal)"
            ));
        }
    }
    Ok(struck)
}
