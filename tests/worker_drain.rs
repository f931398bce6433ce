//! A worker that gets SIGTERM under steady load loses nothing (issue #15): clients keep
//! sending `echo.raw` through gates while, round after round, one of three echo workers
//! is stopped and replaced; every request is answered 200, no client times out, each
//! stopped worker exits 0 having answered requests that reached it after it started
//! draining, and it left its queue group by count (the lossless way, see
//! `services/src/drain.rs`).
//!
//! On a three-node nats-server cluster with routes (gates on two nodes, one worker on
//! each node, so requests cross routes while interest is withdrawn) and on our broker.
//! Everything is a real process: nats-server, `shaddock broker`, `shaddock gate`,
//! `shaddock worker`.

#[path = "common/fleet.rs"]
mod fleet;
#[path = "common/load.rs"]
mod load;

use load::{
    CLIENTS, GATE_TIMEOUT, LOAD_BEFORE_STOP, assert_all_answered, assert_drained_by_count, load,
};
use nix::sys::signal::Signal;
use testkit::fleet::{BrokerSpec, Topology};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// Workers stopped (and replaced), one after another, per test.
const ROUNDS: usize = 6;

/// The tests load the machine (three servers, a gate, workers, thousands of requests a
/// second): they run one at a time, or each would measure the others.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// Runs the load while `ROUNDS` times a worker is stopped with SIGTERM and replaced by a
/// new one on the same URLs (`workers[i]` connects to `urls[i]`); returns the stopped
/// workers' logs after checking each exited 0.
async fn drain_under_load(
    fleet: &mut Topology,
    gates: Vec<String>,
    urls: Vec<String>,
) -> Vec<String> {
    let mut workers = Vec::new();
    for url in &urls {
        let on_url = std::slice::from_ref(url);
        workers.push(fleet.add_worker_on("echo", on_url).await.unwrap());
    }
    let stop = CancellationToken::new();
    let clients = tokio::spawn(load(gates, CLIENTS, stop.clone()));
    let mut logs = Vec::new();
    for round in 0..ROUNDS {
        tokio::time::sleep(LOAD_BEFORE_STOP).await;
        // The last worker first: on the cluster it shares no node with a gate, so every
        // request it gets crosses a route.
        let i = urls.len() - 1 - round % urls.len();
        let on_url = std::slice::from_ref(&urls[i]);
        let replacement = fleet.add_worker_on("echo", on_url).await.unwrap();
        let victim = std::mem::replace(&mut workers[i], replacement);
        let mut victim = fleet.take(&victim).unwrap();
        victim.signal(Signal::SIGTERM);
        let status = victim.exit().await;
        assert!(
            status.success(),
            "{} exited {status}:\n{}",
            victim.name(),
            victim.log()
        );
        logs.push(victim.log());
    }
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    stop.cancel();
    assert_all_answered(clients).await;
    logs
}

/// The gates' flags: a request lost on the bus comes back 408.
const GATE_ARGS: [&str; 2] = ["--request-timeout", GATE_TIMEOUT];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_nothing_on_a_nats_server_cluster() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = fleet::spec(BrokerSpec::NatsCluster(3), &GATE_ARGS);
    let mut fleet = Topology::start(cluster).await.unwrap();
    let urls = fleet.nats_urls().to_vec();
    let (_, gate0) = fleet.add_gate_on(&urls[0..1]).await.unwrap();
    let (_, gate1) = fleet.add_gate_on(&urls[1..2]).await.unwrap();
    let logs = drain_under_load(&mut fleet, vec![gate0, gate1], urls).await;
    assert_drained_by_count(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_nothing_on_our_broker() {
    let _one_at_a_time = SERIAL.lock().await;
    let broker = fleet::spec(BrokerSpec::Embedded, &GATE_ARGS);
    let mut fleet = Topology::start(broker).await.unwrap();
    let urls = fleet.nats_urls().to_vec();
    let (_, gate) = fleet.add_gate_on(&urls).await.unwrap();
    let logs = drain_under_load(&mut fleet, vec![gate], vec![urls[0].clone(); 3]).await;
    assert_drained_by_count(&logs);
}
