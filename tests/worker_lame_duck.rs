//! Workers whose server enters lame duck mode (SIGUSR2, as `nats-server --signal ldm`
//! sends) move to another server make before break (`services/src/worker/hop.rs`), well
//! within the server's grace period: under steady load no request is lost or refused
//! meanwhile, a chat worker's room state stays whole, and a move that cannot be made in
//! time is given up. Everything is a real process: a three-node nats-server cluster
//! with routes, `shaddock gate`, `shaddock worker`.

#[path = "common/fleet.rs"]
mod fleet;
#[path = "common/load.rs"]
mod load;

use std::time::Duration;

use load::{
    CLIENTS, GATE_TIMEOUT, LOAD_BEFORE_STOP, assert_all_answered, assert_drained_by_count, load,
};
use nix::sys::signal::Signal;
use proto::Message as _;
use proto::chat::{
    ChatMessage, JoinRequest, JoinResponse, LoginRequest, LoginResponse, MembersRequest,
    MembersResponse, SayRequest, SayResponse,
};
use sdk::{Client, ClientOptions};
use testkit::fleet::{BrokerSpec, Role, Topology, TopologySpec};
use testkit::{DEADLINE, word_after};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The tests load the machine: they run one at a time, or each would measure the
/// others.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// The lame-duck grace period of the cluster's nodes: a worker that only waited to be
/// closed would still be connected when half of it has passed.
const LAME_DUCK_GRACE: Duration = Duration::from_secs(10);

/// What a worker logged when its inputs left a server in lame duck mode.
const LEFT_LAME_DUCK: &str = "left the server in lame duck mode";

/// Two workers on the one node that enters lame duck mode, each given only that node's
/// URL (they learn the others from it), a gate on another node, clients sending all
/// along. Each worker moves its inputs to another node, make before break, well within
/// half the grace period, leaving the old node by count: every request is answered 200,
/// none lost on the wire and none refused for want of a worker. Then one of them is
/// stopped under load on its new node: the move did not cost it its lossless drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_move_off_a_server_in_lame_duck_mode_losing_nothing() {
    let _one_at_a_time = SERIAL.lock().await;
    let (mut fleet, urls, workers) =
        two_workers_on_the_first_node("echo", LAME_DUCK_GRACE, &GATE_ARGS).await;
    let (_, gate_url) = fleet.add_gate_on(&urls[1..2]).await.unwrap();
    let stop = CancellationToken::new();
    let clients = tokio::spawn(load(vec![gate_url], CLIENTS, stop.clone()));
    tokio::time::sleep(LOAD_BEFORE_STOP).await;

    let node = fleet.process(&Role::Node(0)).unwrap();
    node.signal(Signal::SIGUSR2);
    node.line("Entering lame duck mode").await;
    for worker in &workers {
        let worker = fleet.process(worker).unwrap();
        let left = worker
            .line_within(LEFT_LAME_DUCK, LAME_DUCK_GRACE / 2)
            .await;
        eprintln!("{}: {left}", worker.name());
        assert!(left.contains("left=Some(ByCount)"), "{left}");
        let moved = worker.log();
        let to = moved
            .lines()
            .find(|l| l.contains("moved to another NATS server"))
            .expect("no move logged");
        assert_ne!(
            word_after(to, " to="),
            port_of(&urls[0]),
            "moved to the server in lame duck mode: {to}"
        );
    }
    // Served from the new nodes alone for a while.
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    fleet.add_worker_on("echo", &urls[2..3]).await.unwrap();
    let mut stopped = fleet.take(&workers[0]).unwrap();
    stopped.signal(Signal::SIGTERM);
    assert!(stopped.exit().await.success(), "{}", stopped.log());
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    stop.cancel();
    assert_all_answered(clients).await;
    assert_drained_by_count(&[stopped.log()]);
}

/// Two workers of a keyed service (arena) on the one node that enters lame duck mode:
/// each moves its partitions to another node, then makes its own connection, which its
/// answers leave through, again elsewhere, well within half the grace period. Left on
/// the node, that connection would be closed under the answers on the wire (seen as
/// 408s in `loadtest matches --fault lame-duck`), and a partition's state handed over
/// meanwhile could be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_workers_leave_a_server_in_lame_duck_mode_with_every_connection() {
    let _one_at_a_time = SERIAL.lock().await;
    let (mut fleet, _, workers) =
        two_workers_on_the_first_node("arena", LAME_DUCK_GRACE, &GATE_ARGS).await;
    assert_eq!(
        arena_connections_on(&fleet, 0).await,
        2,
        "each worker starts on node 0"
    );

    let node = fleet.process(&Role::Node(0)).unwrap();
    node.signal(Signal::SIGUSR2);
    node.line("Entering lame duck mode").await;
    for worker in &workers {
        let worker = fleet.process(worker).unwrap();
        (worker.line_within(
            "the partitions moved to another NATS server",
            LAME_DUCK_GRACE / 2,
        ))
        .await;
    }
    until_arena_connections_on(&fleet, 0, 0).await;
}

/// The same two arena workers, then the second step of a rolling upgrade: the node now
/// holding most of their connections (the partitions' from the first move, the answers'
/// made again) enters lame duck mode too. Every connection of theirs leaves it again
/// well within half the grace period, for the third node: a partitions' connection of
/// the first move is let go once they have moved again, and an answering connection
/// moved once moves again on its new server's notice. Which kinds that node holds
/// depends on where the first move's connections landed, so a run may take one path
/// only (checked: with the later notice ignored, 2 of 3 runs failed; with the
/// partitions' old connection kept, 2 of 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_workers_leave_a_second_server_in_lame_duck_mode_with_every_connection() {
    let _one_at_a_time = SERIAL.lock().await;
    let (mut fleet, _, workers) =
        two_workers_on_the_first_node("arena", LAME_DUCK_GRACE, &GATE_ARGS).await;
    for first in [true, false] {
        // First node 0; then the node holding most of their four connections (each
        // worker's partitions' and its answers', made again away from node 0).
        let node = if first {
            0
        } else {
            let on_one = arena_connections_on(&fleet, 1).await;
            let on_two = arena_connections_on(&fleet, 2).await;
            assert_eq!(
                on_one + on_two,
                4,
                "two connections per worker, on nodes 1 and 2"
            );
            eprintln!("after the first move: node 1 holds {on_one}, node 2 {on_two}");
            if on_one >= on_two { 1 } else { 2 }
        };
        let process = fleet.process(&Role::Node(node)).unwrap();
        process.signal(Signal::SIGUSR2);
        process.line("Entering lame duck mode").await;
        until_arena_connections_on(&fleet, node, 0).await;
        if !first {
            until_arena_connections_on(&fleet, 3 - node, 4).await;
        }
    }
    for worker in &workers {
        let log = fleet.process(worker).unwrap().log();
        assert!(
            log.contains("the partitions moved to another NATS server"),
            "{log}"
        );
    }
}

/// How many connections of arena workers `node` holds, by its `/connz`.
async fn arena_connections_on(fleet: &Topology, node: usize) -> usize {
    let name = services::worker_connection_name("arena");
    let names = fleet.node_connection_names(node).await.unwrap();
    names.iter().filter(|n| **n == name).count()
}

/// Waits until `node` holds `count` connections of arena workers, for half the grace
/// period at most.
async fn until_arena_connections_on(fleet: &Topology, node: usize, count: usize) {
    let deadline = tokio::time::Instant::now() + LAME_DUCK_GRACE / 2;
    loop {
        let held = arena_connections_on(fleet, node).await;
        if held == count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {node} holds {held} arena worker connections, not {count}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The gates' flags: a request lost on the bus comes back 408.
const GATE_ARGS: [&str; 2] = ["--request-timeout", GATE_TIMEOUT];

/// A three-node cluster whose nodes have lame duck grace period `grace` (its gates to
/// come given `gate_args`), its URLs, and two `service` workers given only the first
/// node's URL: both sit on it.
async fn two_workers_on_the_first_node(
    service: &str,
    grace: Duration,
    gate_args: &[&str],
) -> (Topology, Vec<String>, Vec<Role>) {
    let spec = TopologySpec {
        lame_duck_grace: grace,
        ..fleet::spec(BrokerSpec::NatsCluster(3), gate_args)
    };
    let mut fleet = Topology::start(spec).await.unwrap();
    let urls = fleet.nats_urls().to_vec();
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(fleet.add_worker_on(service, &urls[0..1]).await.unwrap());
    }
    (fleet, urls, workers)
}

/// The port of a `nats://host:port` URL.
fn port_of(url: &str) -> &str {
    url.rsplit(':').next().unwrap_or_default()
}

/// The first two steps of a rolling upgrade under load: the workers' node enters lame
/// duck mode and goes, then the node they moved to (theirs, or their answering
/// connection's) goes too. Each node exits soon after its grace period, so nothing
/// stayed on it to be closed, and every request is still answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_follow_two_nodes_going_one_after_the_other() {
    /// Short: each node's exit is waited for, and it comes only after the grace.
    const GRACE: Duration = Duration::from_secs(1);
    let _one_at_a_time = SERIAL.lock().await;
    let (mut fleet, urls, workers) = two_workers_on_the_first_node("echo", GRACE, &GATE_ARGS).await;
    let (_, gate_url) = fleet.add_gate_on(&urls[2..3]).await.unwrap();
    let stop = CancellationToken::new();
    let clients = tokio::spawn(load(vec![gate_url], CLIENTS, stop.clone()));
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    for n in 0..2 {
        let node = fleet.process(&Role::Node(n)).unwrap();
        node.signal(Signal::SIGUSR2);
        let status = node.exit().await;
        assert!(status.success(), "{status}:\n{}", node.log());
        tokio::time::sleep(LOAD_BEFORE_STOP).await;
    }
    stop.cancel();
    assert_all_answered(clients).await;
    for worker in &workers {
        let worker = fleet.process(worker).unwrap();
        let log = worker.log();
        let moves: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("moved to another NATS server") || l.contains("going away"))
            .collect();
        eprintln!("{}:\n{}", worker.name(), moves.join("\n"));
        assert!(log.contains("moved to another NATS server"), "{log}");
    }
}

/// `--move-timeout` bounds a move: the only other server the worker knows accepts
/// connections but never says a word, so after the timeout, and not before, the worker
/// gives the move up with a warning and goes on serving from the server in lame duck
/// mode, which has not closed it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_not_made_within_the_move_timeout_is_given_up() {
    const MOVE_TIMEOUT: Duration = Duration::from_millis(300);
    let _one_at_a_time = SERIAL.lock().await;
    let spec = TopologySpec {
        lame_duck_grace: LAME_DUCK_GRACE,
        worker_args: vec!["--move-timeout".into(), "300ms".into()],
        ..fleet::spec(BrokerSpec::NatsServer, &GATE_ARGS)
    };
    let mut fleet = Topology::start(spec).await.unwrap();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("nats://{}", silent.local_addr().unwrap());
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            held.push(connection);
        }
    });
    let server = fleet.nats_urls()[0].clone();
    let (_, gate_url) = fleet
        .add_gate_on(std::slice::from_ref(&server))
        .await
        .unwrap();
    let worker = (fleet.add_worker_on("echo", &[server, silent_url]).await).unwrap();
    echo_once(&gate_url).await;

    let node = fleet.process(&Role::Broker).unwrap();
    node.signal(Signal::SIGUSR2);
    node.line("Entering lame duck mode").await;
    let worker = fleet.process(&worker).unwrap();
    let notice = worker.line("the NATS server is going away").await;
    let gave_up = worker.line("cannot move").await;
    let took = logged_at(&gave_up) - logged_at(&notice);
    assert!(gave_up.contains("in time"), "{gave_up}");
    assert!(took >= MOVE_TIMEOUT, "gave up after {took:?}");
    assert!(took < LAME_DUCK_GRACE / 2, "gave up after {took:?}");
    // Still serving from where it was.
    echo_once(&gate_url).await;
    holding.abort();
}

/// One `echo.raw` through `gate`, answered 200.
async fn echo_once(gate: &str) {
    let client = Client::connect(gate, ClientOptions::default())
        .await
        .unwrap();
    let response = client.request("echo.raw", b"once").await.unwrap();
    assert_eq!(response.code, 200, "{response:?}");
    client.close().await;
}

/// When a process logged `line` (`[pid] YYYY/MM/DD HH:MM:SS.micros ...`), from midnight.
fn logged_at(line: &str) -> Duration {
    let time = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no time in {line:?}"));
    let (hms, micros) = time.split_once('.').expect("a time with microseconds");
    let seconds = hms
        .split(':')
        .map(|part| part.parse::<u64>().expect("a number"))
        .fold(0, |total, part| total * 60 + part);
    Duration::from_secs(seconds) + Duration::from_micros(micros.parse().expect("microseconds"))
}

/// Two chat workers on the node that enters lame duck mode, players in a room through a
/// gate on another node. Both workers move, their room state with them (the `All`
/// events of replication move, and each asks the other for a snapshot): afterwards a
/// player who joins is seen by both workers (every members request, whichever worker
/// answers it, lists all three), and a message said in the room reaches the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_workers_move_with_their_rooms() {
    let _one_at_a_time = SERIAL.lock().await;
    let (mut fleet, urls, workers) =
        two_workers_on_the_first_node("chat", LAME_DUCK_GRACE, &[]).await;
    let (_, gate_url) = fleet.add_gate_on(&urls[1..2]).await.unwrap();
    let alice = Player::login(&gate_url, "alice").await;
    let mut bob = Player::login(&gate_url, "bob").await;
    alice.join("hall").await;
    bob.join("hall").await;

    fleet
        .process(&Role::Node(0))
        .unwrap()
        .signal(Signal::SIGUSR2);
    for worker in &workers {
        let worker = fleet.process(worker).unwrap();
        worker
            .line_within("moved to another NATS server", LAME_DUCK_GRACE / 2)
            .await;
        worker.line("asking a peer for the state").await;
    }
    let carol = Player::login(&gate_url, "carol").await;
    let mut everyone = carol.join("hall").await;
    everyone.sort();
    assert_eq!(everyone, ["alice", "bob", "carol"]);
    // The queue group spreads these over both workers.
    for _ in 0..10 {
        let mut members = bob.members("hall").await;
        members.sort();
        assert_eq!(members, everyone);
    }
    let _: SayResponse = alice
        .call(
            "chat.say",
            SayRequest {
                room: "hall".into(),
                text: "after the move".into(),
            },
        )
        .await;
    loop {
        let push = tokio::time::timeout(DEADLINE, bob.pushes.recv())
            .await
            .expect("no message in time")
            .expect("bob's pushes ended");
        if push.route == "chat.message" {
            let message = ChatMessage::decode(push.body).unwrap();
            assert_eq!(
                (message.from.as_str(), message.text.as_str()),
                ("alice", "after the move")
            );
            break;
        }
    }
}

/// A chat player through the SDK.
struct Player {
    client: Client,
    pushes: sdk::Pushes,
}

impl Player {
    async fn login(gate: &str, name: &str) -> Player {
        let client = Client::connect(gate, ClientOptions::default())
            .await
            .unwrap();
        let pushes = client.pushes().unwrap();
        let player = Player { client, pushes };
        let answer: LoginResponse = player
            .call("chat.login", LoginRequest { name: name.into() })
            .await;
        assert_eq!(answer.name, name);
        player
    }

    async fn join(&self, room: &str) -> Vec<String> {
        let answer: JoinResponse = self
            .call("chat.join", JoinRequest { room: room.into() })
            .await;
        answer.members
    }

    async fn members(&self, room: &str) -> Vec<String> {
        let answer: MembersResponse = self
            .call("chat.members", MembersRequest { room: room.into() })
            .await;
        answer.members
    }

    /// `route` answered 200, decoded.
    async fn call<R: proto::Message + Default>(
        &self,
        route: &str,
        request: impl proto::Message,
    ) -> R {
        let response = self
            .client
            .request(route, request.encode_to_vec())
            .await
            .unwrap_or_else(|e| panic!("{route}: {e}"));
        assert_eq!(response.code, 200, "{route}: {response:?}");
        R::decode(response.body).unwrap()
    }
}
