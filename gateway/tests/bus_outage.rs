//! The gate's own bus connection through outages: a broker restart, a connection lost
//! with requests in flight, a server in lame duck mode. Real brokers over sockets.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use broker::{Config, Server};
use bus::BusOptions;
use bytes::Bytes;
use common::{Holds, TestGate, echo_worker_on, gate_config, queue_of, start_worker};
use futures::StreamExt as _;
use gateway::{AnyToken, GateConfig};
use proto::code;
use sdk::{Client, ClientOptions};
use services::{FrameConfig, Service};
use testkit::{DEADLINE, NatsServer, nats_server_path, within};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Our broker on a fixed address, restartable there.
struct Restartable {
    addr: SocketAddr,
    stop: Option<CancellationToken>,
}

impl Restartable {
    async fn start() -> Restartable {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut broker = Restartable { addr, stop: None };
        broker.serve(listener);
        broker
    }

    fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// A gate on this broker, accepting any token.
    async fn gate(&self, config: GateConfig) -> TestGate {
        TestGate::start_on(BusOptions::new([self.url()]), config, Arc::new(AnyToken)).await
    }

    fn serve(&mut self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let server = Server::new(Config::default());
        let run = stop.clone();
        tokio::spawn(async move { server.run(listener, run).await });
        self.stop = Some(stop);
    }

    fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.cancel();
        }
    }

    async fn restart(&mut self) {
        // The old listener is closed once its task has seen the stop: retry the bind.
        let listener = within(async {
            loop {
                match TcpListener::bind(self.addr).await {
                    Ok(listener) => return listener,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })
        .await;
        self.serve(listener);
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Requests `echo.raw` until `done` says stop; every code seen, in order.
async fn codes_until(client: &Client, mut done: impl FnMut(u32) -> bool) -> Vec<u32> {
    within(async {
        let mut codes = Vec::new();
        loop {
            let code = client.request("echo.raw", "x").await.map_or(0, |r| r.code);
            codes.push(code);
            if done(code) {
                return codes;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_within_the_hold_costs_latency_not_errors() {
    let mut broker = Restartable::start().await;
    let _echo = echo_worker_on(&broker.url()).await;
    let gate = broker.gate(gate_config(|c| c.bus_hold = DEADLINE)).await;
    let client = gate.client().await;
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );

    broker.kill();
    held_through(&gate, &client, broker.restart()).await;
}

/// Once `gate` knows its bus connection is gone (a request written before that may have
/// reached the worker: it would be answered `bus connection lost`, never sent again),
/// sends 20 requests, then `restart`s the bus: each is answered 200 with its own body,
/// held while the bus is away and sent again while the echo worker is not yet
/// subscribed again (no responders). Returns what `restart` gave.
async fn held_through<F: Future>(gate: &TestGate, client: &Client, restart: F) -> F::Output {
    within(async {
        while gate.gate.bus_connected() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let sent: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.request("echo.raw", format!("{i}")).await })
        })
        .collect();
    let restarted = restart.await;
    for (i, request) in sent.into_iter().enumerate() {
        let answer = within(request).await.unwrap().unwrap();
        assert_eq!(answer.code, code::OK, "request {i}: {answer:?}");
        assert_eq!(answer.body, format!("{i}").as_bytes());
    }
    restarted
}

/// The same on nats-server: killed, then started again on its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restart_within_the_hold_costs_latency_not_errors() {
    let server = NatsServer::start().await;
    let (url, port) = (server.url.clone(), server.addr.port().to_string());
    let _echo = echo_worker_on(&url).await;
    let config = gate_config(|c| c.bus_hold = DEADLINE);
    let gate = TestGate::start_on(BusOptions::new([url]), config, Arc::new(AnyToken)).await;
    let client = gate.client().await;
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );

    drop(server); // killed by its pid and reaped
    let (binary, args) = (nats_server_path(), ["-p", port.as_str()]);
    let _again = held_through(&gate, &client, NatsServer::start_binary(&binary, &args)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_longer_than_the_hold_answers_503_never_404_or_408_and_recovers() {
    let mut broker = Restartable::start().await;
    let _echo = echo_worker_on(&broker.url()).await;
    let hold = Duration::from_millis(200);
    let gate = broker.gate(gate_config(|c| c.bus_hold = hold)).await;
    let client = gate.client().await;
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );

    broker.kill();
    away_past_the_hold(&client, broker.restart()).await;
}

/// The same on nats-server: killed, then started again on its port once the gate has
/// answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_away_longer_than_the_hold_answers_503_never_404_or_408_and_recovers() {
    let server = NatsServer::start().await;
    let (url, port) = (server.url.clone(), server.addr.port().to_string());
    let _echo = echo_worker_on(&url).await;
    let config = gate_config(|c| c.bus_hold = Duration::from_millis(200));
    let gate = TestGate::start_on(BusOptions::new([url]), config, Arc::new(AnyToken)).await;
    let client = gate.client().await;
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );

    drop(server); // killed by its pid and reaped
    let (binary, args) = (nats_server_path(), ["-p", port.as_str()]);
    let _again = away_past_the_hold(&client, NatsServer::start_binary(&binary, &args)).await;
}

/// With the bus just lost: past the hold, a request the gate could not send is answered
/// 503 `bus unavailable` (never 404, never a timeout); then `restart` brings the bus
/// back, and requests are answered 200 again.
async fn away_past_the_hold<F: Future>(client: &Client, restart: F) -> F::Output {
    let down = codes_until(client, |c| c == code::UNAVAILABLE).await;
    let restarted = restart.await;
    let back = codes_until(client, |c| c == code::OK).await;
    for code in down.iter().chain(&back) {
        assert!(
            *code == code::OK || *code == code::UNAVAILABLE,
            "only 200 and 503 through a restart, saw {code}: {down:?} then {back:?}"
        );
    }
    restarted
}

/// Its worker dead with the broker, a request written to the lost connection is
/// answered 503 once `--bus-lost-wait` has passed, never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_on_a_lost_connection_are_answered_503_after_the_lost_wait() {
    let mut broker = Restartable::start().await;
    let mut holds = Holds::default();
    let _park = start_worker(&broker.url(), holds.service("park", "p"), queue_of(8)).await;
    // A request timeout far beyond the test's deadline: a 408 could not arrive in time.
    let config = gate_config(|c| {
        c.request_timeout = DEADLINE * 6;
        c.bus_lost_wait = Duration::from_millis(200);
    });
    let gate = broker.gate(config).await;
    let options = ClientOptions {
        request_timeout: DEADLINE * 6,
        ..ClientOptions::default()
    };
    let client = gate.client_with(options).await;
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.request("park.hold", "").await }
    });
    holds.started().await;
    broker.kill();
    let answer = within(held).await.unwrap().unwrap();
    assert_eq!(answer.code, code::UNAVAILABLE, "{answer:?}");
    assert_eq!(answer.message, "bus connection lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_no_worker_ever_served_stays_404() {
    let broker = Restartable::start().await;
    let _echo = echo_worker_on(&broker.url()).await;
    let gate = broker.gate(GateConfig::default()).await;
    let client = gate.client().await;
    let answer = client.request("nowhere.at_all", "x").await.unwrap();
    assert_eq!(answer.code, code::NOT_FOUND, "{answer:?}");
}

/// A free port, for a cluster's route listeners, which nats-server cannot pick itself.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Two nats-server nodes routed to each other; told to, each goes into lame duck mode
/// and closes its clients after 500 ms.
async fn two_nodes() -> (NatsServer, NatsServer) {
    let (route_a, route_b) = (free_port(), free_port());
    let node = |own: u16, other: u16| {
        format!(
            "listen: 127.0.0.1:-1\nlame_duck_grace_period: 500ms\nlame_duck_duration: 30s\n\
             cluster {{ name: ldm, listen: 127.0.0.1:{own}, routes: [nats-route://127.0.0.1:{other}] }}\n"
        )
    };
    let a = NatsServer::with_config(&node(route_a, route_b)).await;
    let b = NatsServer::with_config(&node(route_b, route_a)).await;
    (a, b)
}

/// A gate connected to `a` first, `b` next.
async fn gate_on_first(a: &NatsServer, b: &NatsServer) -> TestGate {
    let mut options = BusOptions::new([a.url.clone(), b.url.clone()]);
    options.randomize = false;
    TestGate::start_on(options, GateConfig::default(), Arc::new(AnyToken)).await
}

/// Puts `server` into lame duck mode, as `nats-server --signal ldm=PID` does.
fn lame_duck(server: &NatsServer) {
    let signalled = std::process::Command::new(nats_server_path())
        .args(["--signal", &format!("ldm={}", server.process.pid())])
        .status()
        .unwrap();
    assert!(signalled.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_lame_duck_mode_loses_nothing() {
    let (a, b) = two_nodes().await;
    // The worker on B, the gate on A first: the gate's server goes away.
    let _echo = echo_worker_on(&b.url).await;
    let gate = gate_on_first(&a, &b).await;
    let client = gate.client().await;
    // Once the route is up, requests cross it.
    codes_until(&client, |c| c == code::OK).await;

    let steady = tokio::spawn({
        let client = client.clone();
        async move {
            let mut codes = Vec::new();
            for _ in 0..1500 {
                codes.push(client.request("echo.raw", "x").await.map_or(0, |r| r.code));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            codes
        }
    });
    lame_duck(&a);
    let codes = within(steady).await.unwrap();
    let failed: Vec<&u32> = codes.iter().filter(|c| **c != code::OK).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        codes.len()
    );
    // Served from B now; A closes its clients over its lame-duck duration.
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );
}

/// The gate's node of a cluster stopped at once (killed) while a worker on another node
/// holds one of its requests: the worker answers the gate's reply subject, which the
/// gate's next connection subscribes again, and the answer comes through it within
/// `--bus-lost-wait` (docs/gateway.md, "Bus blips"). Answered 503 `bus connection lost`
/// at the loss before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_owed_when_the_gate_s_node_dies_comes_through_its_next_connection() {
    let (a, b) = two_nodes().await;
    let mut holds = Holds::default();
    let _park = start_worker(&b.url, holds.service("park", "p"), queue_of(8)).await;
    let _echo = echo_worker_on(&b.url).await;
    let mut options = BusOptions::new([a.url.clone(), b.url.clone()]);
    options.randomize = false;
    // A wait beyond the test's deadline: the answer is what ends it, not the window.
    let config = gate_config(|c| c.bus_lost_wait = DEADLINE * 2);
    let ask = proto::schema::ask_subject(&config.prefix);
    let gate = TestGate::start_on(options, config, Arc::new(AnyToken)).await;
    let client = gate.client().await;
    // Once the route is up, requests cross it.
    codes_until(&client, |c| c == code::OK).await;
    let watcher = async_nats::connect(&b.url).await.unwrap();
    let mut asks = watcher.subscribe(ask).await.unwrap();
    watcher.flush().await.unwrap();
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.request("park.hold", "owed").await }
    });
    holds.started().await;

    drop(a); // killed by its pid and reaped: no lame duck notice
    // A new connection asks the workers for their schemas once it has sent every
    // subscription: seen on B, the gate's replies are subscribed there.
    within(asks.next()).await.unwrap();
    holds.release("p");
    let answer = within(held).await.unwrap().unwrap();
    assert_eq!(answer.code, code::OK, "{answer:?}");
    assert_eq!(&answer.body[..], b"owed");
}

/// How many pushes one `room.burst` broadcasts.
const BURST: usize = 50;

/// A room: `join` puts the session in group `r`; `burst` broadcasts the next [`BURST`]
/// numbers of the room's count to it, one `room.n` push each.
fn numbered_room() -> Service {
    let next = Arc::new(AtomicUsize::new(0));
    Service::new("room")
        .raw_method("join", |ctx, _| {
            ctx.join("r");
            Ok(Bytes::new())
        })
        .raw_method("burst", move |ctx, _| {
            for _ in 0..BURST {
                let n = next.fetch_add(1, Ordering::Relaxed);
                ctx.broadcast("r", "room.n", n.to_string())?;
            }
            Ok(Bytes::new())
        })
}

/// Pushes published on the server the gate moves off, as it moves, arrive once each:
/// until that server has heard of the gate's new subscriptions (a route away), they
/// reach the old connection only, later ones both (docs/gateway.md, "Lame duck").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_published_as_the_gate_moves_off_a_server_arrive_once_each() {
    let (a, b) = two_nodes().await;
    // The room's worker and the gate on A: the pushes are published where the gate
    // leaves. The worker's own move off A would stop them; its server is the URL alone.
    let _room = start_worker(&a.url, numbered_room(), FrameConfig::default()).await;
    let gate = gate_on_first(&a, &b).await;
    let client = gate.client().await;
    // Read as they come (the client's push queue is bounded): how many times each came.
    let (tx, mut counted) = tokio::sync::watch::channel(BTreeMap::<usize, u32>::new());
    let mut pushes = client.pushes().unwrap();
    tokio::spawn(async move {
        while let Some(push) = pushes.recv().await {
            let n: usize = std::str::from_utf8(&push.body).unwrap().parse().unwrap();
            tx.send_modify(|seen| *seen.entry(n).or_default() += 1);
        }
    });
    assert_eq!(
        client.request("room.join", "").await.unwrap().code,
        code::OK
    );

    // Bursts before, during and after the move.
    let mut bursts = 0;
    let mut signalled = false;
    let moved_at = std::time::Instant::now() + Duration::from_millis(200);
    let until = moved_at + Duration::from_millis(400);
    while std::time::Instant::now() < until {
        let answer = client.request("room.burst", "").await.unwrap();
        assert_eq!(answer.code, code::OK, "{answer:?}");
        bursts += 1;
        if !signalled && std::time::Instant::now() >= moved_at {
            lame_duck(&a);
            signalled = true;
        }
    }
    assert!(signalled);
    // Every push published has come, or the deadline passed: the check says which not.
    let published = bursts * BURST;
    let arrived = |seen: &BTreeMap<usize, u32>| seen.values().sum::<u32>() as usize >= published;
    let _ = tokio::time::timeout(DEADLINE, counted.wait_for(arrived)).await;
    let seen = counted.borrow().clone();
    let wrong: Vec<(usize, u32)> = (0..published)
        .map(|n| (n, seen.get(&n).copied().unwrap_or(0)))
        .filter(|(_, times)| *times != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "pushes not received once (number, times): {wrong:?}"
    );
    assert_eq!(client.pushes_dropped(), 0);
}
