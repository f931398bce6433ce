//! The fleet launcher (`testkit::fleet`, which the load tester and the fleet tests run
//! on) against the real `shaddock` binary: a broker, a gate and echo workers as separate
//! processes, one request through them, and a teardown that leaves none of them behind.
//!
//! These live in the root package because only here does Cargo build the `shaddock`
//! binary before the tests and name it (`CARGO_BIN_EXE_shaddock`).

use std::path::PathBuf;

use broker::testing::EmbeddedServer;
use broker::testing::pki::Pki;
use broker::{Auth, Config};
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use proto::Message as _;
use proto::client::{self, Packet, packet::Kind};
use proto::echo::{EchoRequest, EchoResponse};
use testkit::fleet::{BrokerSpec, Role, Topology, TopologySpec};
use testkit::{DEADLINE, NatsServer};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

fn spec(broker: BrokerSpec) -> TopologySpec {
    TopologySpec {
        broker,
        gates: 1,
        workers: vec![("echo".to_owned(), 2)],
        shaddock_bin: PathBuf::from(env!("CARGO_BIN_EXE_shaddock")),
        ..TopologySpec::default()
    }
}

/// True once `pid` is no process at all (exited and reaped, not a zombie).
fn gone(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None) == Err(Errno::ESRCH)
}

async fn next_kind(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> Kind {
    let frame = timeout(DEADLINE, ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Message::Binary(bytes) = frame else {
        panic!("expected a binary frame, got {frame:?}")
    };
    Packet::decode(bytes).unwrap().kind.unwrap()
}

/// Handshakes on `url` and sends one `echo.echo`; returns the response.
async fn echo_once(url: &str, body: &'static [u8]) -> client::Response {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let hello = Packet::new(Kind::Handshake(client::Handshake::default()));
    ws.send(Message::binary(hello.encode_to_vec()))
        .await
        .unwrap();
    let Kind::HandshakeAck(ack) = next_kind(&mut ws).await else {
        panic!("no handshake ack")
    };
    assert_eq!(ack.code, 200);
    let request = Packet::new(Kind::Request(client::Request {
        id: 1,
        route: "echo.echo".into(),
        body: EchoRequest {
            body: Bytes::from_static(body),
        }
        .encode_to_vec()
        .into(),
        key: String::new(),
    }));
    ws.send(Message::binary(request.encode_to_vec()))
        .await
        .unwrap();
    let Kind::Response(response) = next_kind(&mut ws).await else {
        panic!("no response")
    };
    let _ = ws.close(None).await;
    response
}

async fn echo_through(mut topology: Topology) {
    let urls = topology.gate_urls();
    assert_eq!(urls.len(), 1);
    assert!(urls[0].starts_with("ws://127.0.0.1:"), "{urls:?}");
    let pids = topology.pids();
    let roles: Vec<&Role> = pids.iter().map(|(role, _)| role).collect();
    assert_eq!(
        roles
            .iter()
            .filter(|r| matches!(r, Role::Worker { .. }))
            .count(),
        2
    );

    let response = echo_once(&urls[0], b"through the fleet").await;
    assert_eq!((response.id, response.code), (1, 200), "{response:?}");
    let echoed = EchoResponse::decode(response.body).unwrap();
    assert_eq!(&echoed.body[..], b"through the fleet");

    timeout(DEADLINE, topology.shutdown())
        .await
        .expect("shutdown took too long")
        .expect("every process stopped on SIGTERM");
    for (role, pid) in pids {
        assert!(gone(pid), "{role} (pid {pid}) is still there");
    }
    assert!(topology.pids().is_empty());
}

#[tokio::test]
async fn echo_request_crosses_separate_processes_and_teardown_leaves_none() {
    let topology = Topology::start(spec(BrokerSpec::Embedded)).await.unwrap();
    let metrics = topology.metrics_urls();
    // Broker, gate and two workers all serve Prometheus text.
    assert_eq!(metrics.len(), 4, "{metrics:?}");
    assert!(metrics.iter().all(|(_, url)| url.ends_with("/metrics")));
    assert!(topology.nats_url().starts_with("nats://127.0.0.1:"));
    echo_through(topology).await;
}

#[tokio::test]
async fn without_metrics_nothing_serves_them_and_requests_still_cross() {
    let topology = Topology::start(TopologySpec {
        metrics: false,
        ..spec(BrokerSpec::Embedded)
    })
    .await
    .unwrap();
    assert_eq!(topology.metrics_urls(), []);
    echo_through(topology).await;
}

#[tokio::test]
async fn the_same_topology_runs_on_nats_server() {
    if testkit::go_binary("nats-server").is_none() {
        eprintln!("skipped: nats-server is not installed (scripts/test.sh installs it)");
        return;
    }
    let topology = Topology::start(spec(BrokerSpec::NatsServer)).await.unwrap();
    echo_through(topology).await;
}

/// `shaddock gate` and `shaddock worker` on a bus that requires TLS (trusting the test
/// CA) and a user and password, all given as flags.
fn on_secure_bus(pki: &Pki, url: String) -> TopologySpec {
    let ca = pki.ca.to_str().unwrap();
    let flags = ["--nats-user", "shaddock", "--nats-password", "bus-s3cret"];
    let flags: Vec<String> = [&flags[..], &["--nats-ca", ca]]
        .concat()
        .into_iter()
        .map(String::from)
        .collect();
    TopologySpec {
        gate_args: flags.clone(),
        worker_args: flags,
        ..spec(BrokerSpec::Urls(vec![url]))
    }
}

#[tokio::test]
async fn gate_and_workers_cross_a_tls_bus_with_a_password_on_nats_server() {
    let pki = Pki::new();
    let conf = format!(
        "{}authorization {{ user: shaddock, password: bus-s3cret }}\n",
        pki.conf_block(false)
    );
    let server = NatsServer::with_config(&conf).await;
    let topology = Topology::start(on_secure_bus(&pki, server.url.clone()))
        .await
        .unwrap();
    echo_through(topology).await;
}

#[tokio::test]
async fn gate_and_workers_cross_a_tls_bus_with_a_password_on_our_broker() {
    let pki = Pki::new();
    let server = EmbeddedServer::start(Config {
        tls: Some(pki.server_tls(false)),
        auth: Auth::UserPass {
            user: "shaddock".into(),
            pass: "bus-s3cret".into(),
        },
        ..Config::default()
    })
    .await;
    let topology = Topology::start(on_secure_bus(&pki, server.url.clone()))
        .await
        .unwrap();
    echo_through(topology).await;
}

#[tokio::test]
async fn with_tls_the_gate_serves_wss_with_a_throwaway_ca_removed_at_the_end() {
    let topology = Topology::start(TopologySpec {
        tls: true,
        ..spec(BrokerSpec::Embedded)
    })
    .await
    .unwrap();
    let tls_urls = topology.gate_tls_urls();
    assert_eq!(tls_urls.len(), 1);
    assert!(tls_urls[0].starts_with("wss://127.0.0.1:"), "{tls_urls:?}");
    let ca = topology.tls_ca().unwrap().to_owned();
    let options = sdk::ClientOptions {
        tls: Some(sdk::tls_client_config(&ca).unwrap()),
        ..Default::default()
    };
    let client = timeout(DEADLINE, sdk::Client::connect(&tls_urls[0], options))
        .await
        .unwrap()
        .unwrap();
    let request = EchoRequest {
        body: Bytes::from_static(b"over tls"),
    };
    let response = timeout(
        DEADLINE,
        client.request("echo.echo", request.encode_to_vec()),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(response.code, 200, "{response:?}");
    assert_eq!(
        &EchoResponse::decode(response.body).unwrap().body[..],
        b"over tls"
    );
    client.close().await;
    // The plain listener is still there beside it.
    echo_through(topology).await;
    assert!(!ca.exists(), "{} outlived the topology", ca.display());
}

#[tokio::test]
async fn a_worker_that_fails_to_start_fails_the_start_with_its_output() {
    let mut bad = spec(BrokerSpec::Embedded);
    bad.workers = vec![("no-such-service".to_owned(), 1)];
    let error = Topology::start(bad).await.unwrap_err();
    let message = format!("{error:#}");
    assert!(
        message.contains("worker-no-such-service-0") && message.contains("ended without logging"),
        "{message}"
    );
    // The child's own complaint (clap's) is in the error.
    assert!(
        message.contains("invalid value 'no-such-service'"),
        "{message}"
    );
}

#[tokio::test]
async fn dropping_a_topology_stops_its_processes() {
    let topology = Topology::start(spec(BrokerSpec::Embedded)).await.unwrap();
    let pids = topology.pids();
    assert_eq!(pids.len(), 4);
    drop(topology);
    for (role, pid) in pids {
        assert!(gone(pid), "{role} (pid {pid}) outlived the drop");
    }
}

#[tokio::test]
async fn run_serves_the_scenario_then_stops_everything() {
    let topology = Topology::start(spec(BrokerSpec::Embedded)).await.unwrap();
    let url = topology.gate_urls().remove(0);
    let pids = topology.pids();
    let response = timeout(DEADLINE, topology.run(echo_once(&url, b"scenario")))
        .await
        .expect("run took too long")
        .unwrap();
    assert_eq!(response.code, 200);
    for (role, pid) in pids {
        assert!(gone(pid), "{role} (pid {pid}) outlived run");
    }
}

#[tokio::test]
async fn one_process_runs_shaddock_up_and_its_gate_answers() {
    let spec = TopologySpec {
        one_process: true,
        ..spec(BrokerSpec::Embedded)
    };
    let mut topology = Topology::start(spec).await.unwrap();
    let pids = topology.pids();
    let roles: Vec<&Role> = pids.iter().map(|(role, _)| role).collect();
    assert_eq!(roles, [&Role::Up], "one process, nothing else");
    let urls = topology.gate_urls();
    assert_eq!(urls.len(), 1, "{urls:?}");
    assert_eq!(topology.gate_pids(), [pids[0].1]);
    let response = echo_once(&urls[0], b"in one process").await;
    assert_eq!((response.id, response.code), (1, 200), "{response:?}");
    timeout(DEADLINE, topology.shutdown())
        .await
        .expect("shutdown took too long")
        .expect("up stopped on SIGTERM");
    assert!(gone(pids[0].1));
}
