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
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub bus: Bus,
    pub gates: usize,
    pub workers: usize,
    /// Extra flags for every gate.
    pub gate_args: Vec<String>,
    pub shaddock_bin: Option<std::path::PathBuf>,
}

/// What a phase's fault did.
#[derive(Debug, Clone, Default)]
pub struct Action {
    /// What was done, with timings, in order ("SIGKILL worker-echo-1 (pid 42) ...").
    pub events: Vec<String>,
    /// When the fault struck: a kill was sent, the bus node went down.
    pub fault_at: Option<Instant>,
}

pub struct Fleet {
    topology: Topology,
}

impl Fleet {
    pub async fn start(spec: &FleetSpec) -> anyhow::Result<Fleet> {
        let broker = match spec.bus {
            Bus::Shaddock => BrokerSpec::Embedded,
            Bus::NatsCluster => BrokerSpec::NatsCluster(CLUSTER_NODES),
        };
        let mut topology_spec = TopologySpec {
            broker,
            gates: spec.gates,
            workers: vec![(SERVICE.to_owned(), spec.workers)],
            gate_args: spec.gate_args.clone(),
            ..TopologySpec::default()
        };
        if let Some(bin) = &spec.shaddock_bin {
            topology_spec.shaddock_bin = bin.clone();
        }
        let topology = Topology::start(topology_spec)
            .await
            .context("launching the fleet")?;
        Ok(Fleet { topology })
    }

    pub fn gate_urls(&self) -> Vec<String> {
        self.topology.gate_urls()
    }

    /// One line per process: `broker 1234`, `gate-0 1240`, ...
    pub fn describe(&self) -> String {
        self.topology
            .processes()
            .iter()
            .map(|(name, pid)| format!("{name} {pid}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Fails when a process the fleet still holds has exited by itself.
    pub fn check(&mut self) -> anyhow::Result<()> {
        self.topology.check()
    }

    /// Does `fault` and returns once it is done: the stopped process reaped, the new one
    /// ready.
    pub async fn act(&mut self, fault: Fault) -> anyhow::Result<Action> {
        let mut action = Action::default();
        let started = Instant::now();
        match fault {
            Fault::Baseline => {}
            Fault::AddWorker => {
                let role = self.topology.add_worker(SERVICE).await?;
                action.events.push(format!(
                    "started {role}: ready in {}",
                    secs(started.elapsed())
                ));
            }
            Fault::DrainWorker | Fault::KillWorker => {
                let role = self.first(|r| matches!(r, Role::Worker { .. }))?;
                let signal = if fault == Fault::KillWorker {
                    Signal::SIGKILL
                } else {
                    Signal::SIGTERM
                };
                action.fault_at = (signal == Signal::SIGKILL).then(Instant::now);
                let stopped = self.topology.stop_one(&role, signal).await?;
                action.events.push(stop_line(signal, &stopped));
            }
            Fault::DrainGate => {
                let role = self.first(|r| matches!(r, Role::Gate(_)))?;
                let addr = self
                    .topology
                    .listen_addr(&role)
                    .with_context(|| format!("{role} has no address"))?;
                let stopped = self.topology.stop_one(&role, Signal::SIGTERM).await?;
                action.events.push(stop_line(Signal::SIGTERM, &stopped));
                let restart = Instant::now();
                let new = self.topology.add_gate(addr).await?;
                action.events.push(format!(
                    "started {new} on {addr}: ready in {}",
                    secs(restart.elapsed())
                ));
            }
            Fault::RestartBus => {
                let role = self
                    .topology
                    .bus_roles()
                    .into_iter()
                    .next()
                    .context("the fleet runs no bus")?;
                // A cluster node is restarted as operators do, in lame duck mode
                // (SIGUSR2, as `nats-server --signal ldm` sends): its clients move to the
                // other nodes before it goes. The single broker is killed: there is
                // nowhere to move, and the gap is what is measured.
                let cluster = self.topology.bus_roles().len() > 1;
                let signal = if cluster {
                    Signal::SIGUSR2
                } else {
                    action.fault_at = Some(Instant::now());
                    Signal::SIGKILL
                };
                let stopped = self.topology.stop_one(&role, signal).await?;
                action.events.push(stop_line(signal, &stopped));
                let restart = Instant::now();
                self.topology.restart_bus_node(0).await?;
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
    fn first(&self, kind: impl Fn(&Role) -> bool) -> anyhow::Result<Role> {
        self.topology
            .running(kind)
            .into_iter()
            .next()
            .context("no such process left running")
    }

    /// Stops everything, gates first.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.topology.shutdown().await
    }
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
