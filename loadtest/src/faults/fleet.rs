//! The fleet `loadtest faults` runs and changes: the bus (one `shaddock broker`, or 3
//! nats-server nodes), 2 gates and 3 echo workers, each its own process
//! ([`crate::topology`]); and each phase's fault done to it, with what happened when.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::Signal;

use super::phases::{Bus, Fault};
use crate::topology::{BrokerSpec, Role, Stopped, Topology, TopologySpec};

/// The service the load goes to.
pub const SERVICE: &str = "echo";
/// Nodes of the nats-server cluster.
pub const CLUSTER_NODES: usize = 3;

/// What the fleet is made of.
/// What a phase's fault did: a line per step with its timing, and when it struck (a
/// SIGKILL), for the requests it may hold.
#[derive(Debug, Clone, Default)]
pub struct Action {
    pub events: Vec<String>,
    pub fault_at: Option<Instant>,
}

/// Launches the fleet: the bus, `gates` gates and `workers` echo workers.
pub async fn start(args: &super::FaultsArgs) -> anyhow::Result<Topology> {
    let broker = match args.bus {
        Bus::Shaddock => BrokerSpec::Embedded,
        Bus::NatsCluster => BrokerSpec::NatsCluster(CLUSTER_NODES),
    };
    let mut spec = TopologySpec {
        broker,
        gates: args.gates as usize,
        workers: vec![(SERVICE.to_owned(), args.workers as usize)],
        gate_args: args.gate_arg.clone(),
        ..TopologySpec::default()
    };
    if let Some(bin) = &args.bin {
        spec.shaddock_bin.clone_from(bin);
    }
    Topology::start(spec).await.context("launching the fleet")
}

/// The processes, by name and pid.
pub fn describe(topology: &Topology) -> String {
    let names: Vec<String> = topology
        .processes()
        .iter()
        .map(|(name, pid)| format!("{name} {pid}"))
        .collect();
    names.join(", ")
}

/// Does `fault` to the fleet; returns once it is done (a stopped process exited, a
/// started one is ready).
pub async fn act(topology: &mut Topology, fault: Fault) -> anyhow::Result<Action> {
    let mut action = Action::default();
    let started = Instant::now();
    match fault {
        Fault::Baseline => {}
        Fault::AddWorker => {
            let role = topology.add_worker(SERVICE).await?;
            action.events.push(format!(
                "started {role}: ready in {}",
                secs(started.elapsed())
            ));
        }
        Fault::DrainWorker | Fault::KillWorker => {
            let role = first(topology, |r| matches!(r, Role::Worker { .. }))?;
            let signal = if fault == Fault::KillWorker {
                Signal::SIGKILL
            } else {
                Signal::SIGTERM
            };
            action.fault_at = (signal == Signal::SIGKILL).then(Instant::now);
            let stopped = topology.stop_one(&role, signal).await?;
            action.events.push(stop_line(signal, &stopped));
        }
        Fault::DrainGate => {
            let role = first(topology, |r| matches!(r, Role::Gate(_)))?;
            let addr = topology
                .listen_addr(&role)
                .with_context(|| format!("{role} has no address"))?;
            let stopped = topology.stop_one(&role, Signal::SIGTERM).await?;
            action.events.push(stop_line(Signal::SIGTERM, &stopped));
            let restart = Instant::now();
            let new = topology.add_gate(addr).await?;
            action.events.push(format!(
                "started {new} on {addr}: ready in {}",
                secs(restart.elapsed())
            ));
        }
        Fault::RestartBus => {
            let role = topology
                .bus_roles()
                .into_iter()
                .next()
                .context("the fleet runs no bus")?;
            // A cluster node is restarted as operators do, in lame duck mode
            // (SIGUSR2, as `nats-server --signal ldm` sends): its clients move to the
            // other nodes before it goes. The single broker is killed: there is
            // nowhere to move, and the gap is what is measured.
            let cluster = topology.bus_roles().len() > 1;
            let signal = if cluster {
                Signal::SIGUSR2
            } else {
                action.fault_at = Some(Instant::now());
                Signal::SIGKILL
            };
            let stopped = topology.stop_one(&role, signal).await?;
            action.events.push(stop_line(signal, &stopped));
            let restart = Instant::now();
            topology.restart_bus_node(0).await?;
            action.events.push(format!(
                "started {role} again on its ports: ready in {} ({} after the signal)",
                secs(restart.elapsed()),
                secs(started.elapsed())
            ));
        }
    }
    Ok(action)
}

/// The first running process of a kind.
fn first(topology: &Topology, kind: impl Fn(&Role) -> bool) -> anyhow::Result<Role> {
    topology
        .running(kind)
        .into_iter()
        .next()
        .context("no such process left running")
}

fn stop_line(signal: Signal, s: &Stopped) -> String {
    let status = s
        .status
        .map_or_else(|| "status unknown".to_owned(), |st| st.to_string());
    let killed = if s.killed_after_timeout {
        ", killed after the stop timeout"
    } else {
        ""
    };
    format!(
        "{signal} {} (pid {}): exited in {} ({status}{killed})",
        s.role,
        s.pid,
        secs(s.took)
    )
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
