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

use fleet::{LameDuck, NatsCluster, echo_worker, gate, shaddock};
use load::{
    CLIENTS, GATE_TIMEOUT, LOAD_BEFORE_STOP, assert_all_answered, assert_drained_by_count, load,
};
use nix::sys::signal::Signal;
use testkit::{DEADLINE, Process};
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
async fn drain_under_load(gates: Vec<String>, urls: Vec<String>) -> Vec<String> {
    let mut workers = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        workers.push(echo_worker(&format!("worker-{i}"), std::slice::from_ref(url), &[]).await);
    }
    let stop = CancellationToken::new();
    let clients = tokio::spawn(load(gates, CLIENTS, stop.clone()));
    let mut logs = Vec::new();
    for round in 0..ROUNDS {
        tokio::time::sleep(LOAD_BEFORE_STOP).await;
        // The last worker first: on the cluster it shares no node with a gate, so every
        // request it gets crosses a route.
        let i = urls.len() - 1 - round % urls.len();
        let replacement = echo_worker(
            &format!("worker-{i}-r{round}"),
            std::slice::from_ref(&urls[i]),
            &[],
        )
        .await;
        let mut victim: Process = std::mem::replace(&mut workers[i], replacement);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_nothing_on_a_nats_server_cluster() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = NatsCluster::start(3, &LameDuck { grace: DEADLINE }).await;
    let urls = cluster.urls();
    let timeout = ["--request-timeout", GATE_TIMEOUT];
    let (_g0, gate0) = gate("gate-0", &urls[0], &timeout).await;
    let (_g1, gate1) = gate("gate-1", &urls[1], &timeout).await;
    let logs = drain_under_load(vec![gate0, gate1], urls).await;
    assert_drained_by_count(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_nothing_on_our_broker() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut broker = shaddock("broker", &["broker", "-a", "127.0.0.1", "-p", "-1"], &[]);
    let listening = broker.line("Listening for client connections on ").await;
    let addr = listening
        .rsplit("client connections on ")
        .next()
        .unwrap()
        .trim()
        .to_owned();
    broker.line("Server is ready").await;
    let url = format!("nats://{addr}");
    let timeout = ["--request-timeout", GATE_TIMEOUT];
    let (_gate, gate_url) = gate("gate", &url, &timeout).await;
    let logs = drain_under_load(vec![gate_url], vec![url; 3]).await;
    assert_drained_by_count(&logs);
}
