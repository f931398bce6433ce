//! The topology's runtime changes that `loadtest faults` makes, on real processes: a
//! nats-server cluster launched, one node killed and started again on its ports, a gate
//! replaced on its port, a worker added. Needs `nats-server` (PATH or
//! `$(go env GOPATH)/bin`) and the `shaddock` binary beside the test (`cargo test`
//! builds it; or set SHADDOCK_BIN).

use std::time::Duration;

use gateway::sdk::{Backoff, Client, ClientOptions};
use loadtest::topology::{BrokerSpec, Role, Topology, TopologySpec};
use nix::sys::signal::Signal;
use tokio::time::Instant;

/// How long the fleet has to answer 200 again after a change.
const RECOVERY: Duration = Duration::from_secs(15);

/// Sends `echo.raw` until it is answered 200, or fails after [`RECOVERY`].
async fn answers(client: &Client) {
    let deadline = Instant::now() + RECOVERY;
    loop {
        let answer = client.request("echo.raw", b"ping").await;
        if answer.as_ref().is_ok_and(|r| r.code == 200) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no 200 in time; last: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(5),
        reconnect: Some(Backoff::default()),
        ..ClientOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_node_comes_back_on_its_ports_and_rejoins() {
    let spec = TopologySpec {
        broker: BrokerSpec::NatsCluster(3),
        ..TopologySpec::default()
    };
    let mut topology = Topology::start(spec).await.expect("cluster starts");
    let nodes = [Role::Node(0), Role::Node(1), Role::Node(2)];
    assert_eq!(topology.bus_roles(), nodes);
    assert_eq!(
        topology.nats_url().split(',').count(),
        3,
        "gates and workers get every node"
    );
    let client = Client::connect(&topology.gate_urls()[0], options())
        .await
        .expect("client connects");
    answers(&client).await;

    let before = topology
        .listen_addr(&Role::Node(0))
        .expect("node 0 listens");
    let stopped = topology
        .stop_one(&Role::Node(0), Signal::SIGKILL)
        .await
        .expect("node 0 stops");
    assert!(!stopped.killed_after_timeout);
    assert!(topology.listen_addr(&Role::Node(0)).is_none());
    answers(&client).await;
    // Returns once node 0 has routes to both others again.
    topology.restart_bus_node(0).await.expect("node 0 restarts");
    assert_eq!(topology.listen_addr(&Role::Node(0)), Some(before));
    assert!(
        topology.restart_bus_node(0).await.is_err(),
        "a running node is not started twice"
    );
    answers(&client).await;
    client.close().await;
    topology.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_is_replaced_on_its_port_and_workers_come_and_go() {
    let mut topology = Topology::start(TopologySpec::default())
        .await
        .expect("topology starts");
    assert_eq!(topology.bus_roles(), [Role::Broker]);
    let gate = Role::Gate(0);
    let addr = topology.listen_addr(&gate).expect("gate listens");
    let client = Client::connect(&topology.gate_urls()[0], options())
        .await
        .expect("client connects");
    answers(&client).await;

    let added = topology.add_worker("echo").await.expect("worker added");
    let echo = |r: &Role| matches!(r, Role::Worker { .. });
    assert_eq!(topology.running(echo).len(), 2);
    let stopped = topology
        .stop_one(&added, Signal::SIGTERM)
        .await
        .expect("worker drains");
    assert!(stopped.status.is_some_and(|s| s.success()), "{stopped:?}");
    assert_eq!(topology.running(echo).len(), 1);

    topology
        .stop_one(&gate, Signal::SIGTERM)
        .await
        .expect("gate drains");
    let new = topology.add_gate(addr).await.expect("gate replaced");
    assert_eq!(new, Role::Gate(1));
    assert_eq!(topology.listen_addr(&new), Some(addr));
    // A client of the old gate: closed for good by its shutdown, or reconnected.
    let again = Client::connect(&format!("ws://{addr}"), options())
        .await
        .expect("connects to the new gate");
    answers(&again).await;

    topology
        .stop_one(&Role::Broker, Signal::SIGKILL)
        .await
        .expect("broker killed");
    topology.restart_bus_node(0).await.expect("broker restarts");
    answers(&again).await;
    client.close().await;
    again.close().await;
    topology.shutdown().await.expect("clean shutdown");
}
