//! The load tester's front on the fleet launcher ([`testkit::fleet`]): the flags that
//! shape a launched fleet (`--gates`, `--workers`, `--gate-arg`, `--worker-arg`,
//! `--bin`) and the `--bus` a fault scenario runs on, as clap reads them.

use std::path::PathBuf;

use testkit::fleet::{BrokerSpec, TopologySpec, default_shaddock_bin};

/// The bus a launched fleet runs on (`--bus`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bus {
    /// One `shaddock broker`.
    #[default]
    Shaddock,
    /// Three `nats-server` nodes routed into one cluster.
    NatsCluster,
}

/// Nodes of the nats-server cluster a [`Bus::NatsCluster`] fleet runs.
const CLUSTER_NODES: usize = 3;

impl Bus {
    /// What the fleet starts for this bus.
    pub fn spec(self) -> BrokerSpec {
        match self {
            Bus::Shaddock => BrokerSpec::Embedded,
            Bus::NatsCluster => BrokerSpec::NatsCluster(CLUSTER_NODES),
        }
    }

    /// The bus, as a report names it.
    pub fn describe(self) -> &'static str {
        match self {
            Bus::Shaddock => "shaddock broker",
            Bus::NatsCluster => "3-node nats-server cluster",
        }
    }
}

/// The flags that shape a launched topology, shared by every scenario that launches one.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LaunchArgs {
    /// Gate processes to launch (the scenario's default when absent).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gates: Option<u32>,
    /// The bus the launched fleet runs on: one `shaddock broker`, or 3 nats-server
    /// nodes in a cluster.
    #[arg(long, value_enum, default_value_t = Bus::Shaddock)]
    pub bus: Bus,
    /// Worker processes to launch, of each service (the scenario's default when absent).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: Option<u32>,
    /// Extra flag for every launched gate, repeatable: `--gate-arg=--max-in-flight=1024`.
    #[arg(long, allow_hyphen_values = true)]
    pub gate_arg: Vec<String>,
    /// Extra flag for every launched worker, repeatable.
    #[arg(long, allow_hyphen_values = true)]
    pub worker_arg: Vec<String>,
    /// The `shaddock` binary to launch (default: $SHADDOCK_BIN, else this executable
    /// when it is `shaddock`, else `shaddock` beside it).
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// Write each launched process's whole log to this directory as it comes, as
    /// `<role>-<pid>.log` (created if need be): a run killed midway leaves them too.
    /// Without it only the last lines of a process that failed are shown.
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
}

impl LaunchArgs {
    /// `gates` gates and `workers` workers of each of `services`, unless the flags say
    /// otherwise, on `--bus`.
    pub fn spec(&self, gates: u32, workers: u32, services: &[&str]) -> TopologySpec {
        let workers = self.workers.unwrap_or(workers) as usize;
        TopologySpec {
            gates: self.gates.unwrap_or(gates) as usize,
            workers: services.iter().map(|s| (s.to_string(), workers)).collect(),
            gate_args: self.gate_arg.clone(),
            worker_args: self.worker_arg.clone(),
            shaddock_bin: self.bin.clone().unwrap_or_else(default_shaddock_bin),
            log_dir: self.logs.clone(),
            broker: self.bus.spec(),
            ..TopologySpec::default()
        }
    }
}
