//! A gate process of two shards (`--shards 2`, docs/gateway.md "Shards") as a real
//! process on a real broker, with raw WebSocket clients: connections spread over both
//! shards, each answered by the shard that holds it; what spans shards (a group push,
//! one session per player, a resume) works across them as between gates; SIGTERM drains
//! every shard and the process exits; and `shaddock up --shards 2`, whose shards reach
//! its embedded broker in process. A client knows its shard by its resume token, which
//! names the gate (shard) that issued it.

#[allow(dead_code)] // the gate tests' raw client, reused whole
#[path = "../gateway/tests/common/raw.rs"]
mod raw;
#[allow(dead_code)]
#[path = "../gateway/tests/common/resumable.rs"]
mod resumable;
#[path = "common/worker.rs"]
mod worker;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::process::Command;
use std::time::{Duration, Instant};

use broker::testing::EmbeddedServer;
use nix::sys::signal::Signal;
use proto::client::packet::Kind;
use proto::code;
use raw::Frame;
use resumable::{Got, Player, room_service};
use services::WorkerConfig;
use testkit::fleet::UP_FREE_PORTS;
use testkit::{Cut, DEADLINE, Process, within, word_after};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;
use worker::RustWorker;

/// The shards every test here runs.
const SHARDS: usize = 2;
/// Connections opened at most to find one on each shard: the kernel spreads them by a
/// hash of their addresses, so all of them on one shard has odds of 2^-63.
const MAX_TRIES: usize = 64;

/// A broker, a worker of the room service on it, and `shaddock gate --shards 2`.
struct Sharded {
    gate: Process,
    /// `ws://127.0.0.1:PORT`
    url: String,
    /// `http://127.0.0.1:PORT/metrics`
    metrics: String,
    _worker: RustWorker,
    _broker: EmbeddedServer,
}

impl Sharded {
    /// Starts the broker, the worker and the gate, with `extra` gate flags.
    async fn start(extra: &[&str]) -> Sharded {
        let broker = EmbeddedServer::start(broker::Config::default()).await;
        let worker =
            RustWorker::start(&broker.url, "room", room_service(), WorkerConfig::default()).await;
        let mut command = Command::new(env!("CARGO_BIN_EXE_shaddock"));
        command
            .args(["gate", "--shards", "2", "--listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0", "--nats", &broker.url])
            .args(extra)
            .env("RUST_LOG", "info");
        let mut gate = Process::spawn("gate", command);
        let line = gate.line("Serving Prometheus metrics on ").await;
        let metrics = word_after(&line, "Serving Prometheus metrics on ").to_owned();
        let addr = gate
            .addr_after("Gate listening for WebSocket clients on ")
            .await;
        gate.line("Gate is ready").await;
        Sharded {
            gate,
            url: format!("ws://{addr}"),
            metrics,
            _worker: worker,
            _broker: broker,
        }
    }
}

/// The shard (gate id) a player's session is on: its resume token's first part.
fn shard(player: &Player) -> String {
    let gate = player.token.split('.').next();
    gate.unwrap_or_default().to_owned()
}

/// Opens resumable sessions at `url` until there is one on each shard; returns them
/// by shard id. The others are closed (with a close frame: ended, not kept to resume).
async fn one_per_shard(url: &str) -> BTreeMap<String, Player> {
    let mut players = BTreeMap::new();
    for _ in 0..MAX_TRIES {
        let mut player = Player::open(url, "").await;
        match players.entry(shard(&player)) {
            Entry::Occupied(_) => player.raw.send(Message::Close(None)).await,
            Entry::Vacant(slot) => {
                slot.insert(player);
            }
        }
        if players.len() == SHARDS {
            return players;
        }
    }
    panic!("{MAX_TRIES} connections, all on {:?}", players.keys());
}

/// Sends `route` with `body` and returns the answer's body, which must be 200.
async fn ask(player: &mut Player, route: &str, body: &str) -> String {
    let id = player.send(route, body).await;
    match within(player.next()).await {
        Got::Response(got, code::OK, answer) if got == id => answer,
        other => panic!("{route} {body:?}: {other:?}"),
    }
}

/// Waits until `check` holds, polling; fails the test after [`DEADLINE`].
async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn connections_spread_over_the_shards_and_each_is_served_by_its_own() {
    let sharded = Sharded::start(&[]).await;
    let mut players = one_per_shard(&sharded.url).await;
    let ids: Vec<&String> = players.keys().collect();
    let base = ids[0].strip_suffix("-0").expect("shard ids end in -<n>");
    assert_eq!(ids, [&format!("{base}-0"), &format!("{base}-1")]);
    for (on, player) in &mut players {
        // Services see the session on the shard that holds it.
        let who = ask(player, "room.who", "").await;
        assert_eq!(who.split(' ').next(), Some(on.as_str()), "{who}");
    }
    // The sessions gauge counts both shards' sessions, neither overwriting the other.
    let sessions = || async {
        let read = testkit::fleet::scrape(&sharded.metrics, &["gate_sessions"]).await;
        read == Some(vec![SHARDS as f64])
    };
    eventually("gate_sessions counts both shards' sessions", sessions).await;
}

#[tokio::test]
async fn a_group_push_reaches_members_on_both_shards_once_each() {
    let sharded = Sharded::start(&[]).await;
    let mut players: Vec<Player> = one_per_shard(&sharded.url).await.into_values().collect();
    for (n, player) in players.iter_mut().enumerate() {
        ask(player, "room.enter", &format!("p{n}")).await;
    }
    let mut sayer = Player::open(&sharded.url, "").await;
    ask(&mut sayer, "room.say", "one").await;
    ask(&mut sayer, "room.say", "two").await;
    for player in &mut players {
        // A second copy of "one" would come before "two": the worker published them in
        // this order, and a shard's bus connection delivers in order.
        assert_eq!(within(player.next()).await, Got::Push("one".into()));
        assert_eq!(within(player.next()).await, Got::Push("two".into()));
    }
}

#[tokio::test]
async fn the_same_player_on_another_shard_kicks_the_older_session() {
    let sharded = Sharded::start(&[]).await;
    let players = one_per_shard(&sharded.url).await;
    let [mut older, mut newer]: [Player; 2] = players
        .into_values()
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("two shards"));
    ask(&mut older, "room.enter", "ann").await;
    ask(&mut newer, "room.enter", "ann").await;
    loop {
        match within(older.raw.next_packet()).await.kind {
            Some(Kind::Kick(kick)) => {
                assert_eq!(kick.reason, "logged in elsewhere");
                break;
            }
            Some(Kind::Heartbeat(_)) => {}
            other => panic!("expected a kick, got {other:?}"),
        }
    }
    let who = ask(&mut newer, "room.who", "").await;
    assert!(who.ends_with(" ann"), "{who}");
}

#[tokio::test]
async fn a_session_resumes_on_either_shard_with_what_it_missed() {
    let sharded = Sharded::start(&[]).await;
    let gate: std::net::SocketAddr = sharded.url.trim_start_matches("ws://").parse().unwrap();
    let mut sayer = Player::open(&sharded.url, "").await;
    let mut hop = Cut::start(gate).await.unwrap();
    let mut victim = Player::enter(&hop.ws_url(), "victim").await;
    let mut crossed = false;
    // Each resume lands on a shard the kernel picks: go on until one crossed shards.
    for round in 0..MAX_TRIES {
        let before = shard(&victim);
        hop.cut();
        let missed = format!("missed {round}");
        ask(&mut sayer, "room.say", &missed).await;
        hop = Cut::start(gate).await.unwrap();
        within(victim.resume(&hop.ws_url())).await;
        assert_eq!(within(victim.next()).await, Got::Push(missed));
        let who = ask(&mut victim, "room.who", "").await;
        assert!(who.ends_with(" victim"), "the same player: {who}");
        if shard(&victim) != before {
            crossed = true;
            break;
        }
    }
    assert!(crossed, "{MAX_TRIES} resumes, none on the other shard");
}

#[tokio::test]
async fn sigterm_drains_every_shard_and_the_process_exits() {
    // Sessions close at the end of the grace: a short one keeps the test short.
    let mut sharded = Sharded::start(&["--shutdown-grace", "1s"]).await;
    let players = one_per_shard(&sharded.url).await;
    sharded.gate.signal(Signal::SIGTERM);
    for (on, mut player) in players {
        let frame = within(player.raw.next_frame()).await;
        assert!(
            matches!(&frame, Frame::Packet(p) if matches!(p.kind, Some(Kind::Drain(_)))),
            "{on}: expected a drain, got {frame:?}"
        );
        loop {
            match within(player.raw.next_frame()).await {
                Frame::Close(_, reason) => {
                    assert_eq!(reason, "gate shutting down", "{on}");
                    break;
                }
                Frame::Packet(_) => {}
                other => panic!("{on}: expected a close, got {other:?}"),
            }
        }
    }
    let status = within(sharded.gate.exit()).await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn up_serves_every_shard_on_its_in_process_bus_and_stops_on_sigterm() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shaddock"));
    command
        .args(["up", "--shards", "2", "--store=memory"])
        .args(UP_FREE_PORTS)
        .env("RUST_LOG", "info");
    let mut up = Process::spawn("shaddock up", command);
    up.line("Server is ready").await;
    let ws = word_after(&up.line("WebSocket clients:").await, "WebSocket clients:").to_owned();
    for (on, mut player) in one_per_shard(&ws).await {
        assert_eq!(ask(&mut player, "echo.raw", &on).await, on);
    }
    // The first shard runs on the workers' host thread (docs/workers.md, "In Rust:
    // threads"); the second on its own; no worker has a thread of its own.
    let threads = threads(up.pid());
    assert!(threads.contains(&"host-up".to_owned()), "{threads:?}");
    assert!(threads.contains(&"gate-shard-1".to_owned()), "{threads:?}");
    let apart =
        |name: &String| name == "gate-shard-0" || name.starts_with("host-") && name != "host-up";
    assert!(!threads.iter().any(apart), "{threads:?}");
    // The demo page, from whichever shard each connection lands on.
    let host = ws.trim_start_matches("ws://").to_owned();
    for _ in 0..4 {
        let mut stream = within(tokio::net::TcpStream::connect(&host)).await.unwrap();
        let get = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(get.as_bytes()).await.unwrap();
        let mut page = Vec::new();
        within(stream.read_to_end(&mut page)).await.unwrap();
        let page = String::from_utf8_lossy(&page);
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    }
    up.signal(Signal::SIGTERM);
    let status = within(up.exit()).await;
    assert!(status.success(), "{status:?}");
}

/// The names of process `pid`'s threads (Linux: /proc/PID/task/TID/comm).
fn threads(pid: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .map(|task| {
            let comm = task.unwrap().path().join("comm");
            std::fs::read_to_string(comm).unwrap().trim().to_owned()
        })
        .collect()
}
