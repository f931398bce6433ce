//! The fleet tests' fleet, on the one fleet launcher (`testkit::fleet`): this package's
//! `shaddock` binary over a bus (our broker, a nats-server, a nats-server cluster), with
//! no gates or workers of its own: each test adds them on the bus nodes it wants them on
//! (`Topology::add_gate_on`, `add_worker_on`) and reaches into a process
//! (`Topology::process`, `take`) to signal it or read its log.

use std::path::PathBuf;

use testkit::fleet::{BrokerSpec, TopologySpec};

/// A bus of `broker`, nothing on it yet; the gates it will be given take `gate_args`.
pub fn spec(broker: BrokerSpec, gate_args: &[&str]) -> TopologySpec {
    TopologySpec {
        broker,
        gates: 0,
        workers: Vec::new(),
        shaddock_bin: PathBuf::from(env!("CARGO_BIN_EXE_shaddock")),
        gate_args: gate_args.iter().map(|a| (*a).to_owned()).collect(),
        // Nobody scrapes them here.
        metrics: false,
        ..TopologySpec::default()
    }
}
