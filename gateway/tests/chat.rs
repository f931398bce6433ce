//! The chat service end to end: two gates, three chat workers in one queue group, and
//! SDK clients (serial sessions) spread over both gates. What crosses the bus (rooms
//! across gates, logins, kicks, peers' state, reconnects) runs on our embedded broker
//! and on the real nats-server; the chat service's refusals of bad requests, once.
//!
//! Each test ends by closing every client and checking nothing is left behind: no
//! session, group or user on either gate, and no subscription on the bus for the rooms
//! and players it used.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use broker::testing::{Bus, round_trip};
use futures::future::join_all;
use gateway::{AnyToken, Gate, GateConfig, UidConflict};
use proto::Message;
use proto::chat::*;
use proto::code;
use sdk::{Client, ClientOptions, Push, Pushes};
use services::chat::{self, REASON_DISCONNECTED, REASON_LEFT};
use services::profile;
use services::{Pusher, Worker, WorkerConfig};
use testkit::{DEADLINE, within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

broker::on_every_bus!(
    room_messages_reach_every_member_once_in_send_order,
    leaving_or_closing_stops_delivery_and_announces_it,
    a_second_login_kicks_the_first_session,
    refuse_mode_answers_409_to_a_second_login,
    a_worker_kicks_a_player_by_uid_from_outside_a_handler,
    pushes_reach_a_player_on_the_other_gate,
    member_lists_follow_comings_and_goings,
    a_senders_own_message_arrives_before_its_answer;
    tcp_only:
    a_late_worker_learns_the_rooms_from_a_peer,
    a_worker_back_from_a_lost_connection_catches_up,
    a_lone_worker_back_from_a_lost_connection_keeps_its_state,
    a_login_takes_the_player_s_profile_by_a_call_to_the_keyed_profile_service,
);

const PREFIX: &str = "shaddock";

/// Two gates, chat workers, and (on the embedded broker) its monitoring address.
struct Cluster {
    bus: Bus,
    gates: Vec<RunningGate>,
    workers: Vec<RunningWorker>,
    monitor: Option<SocketAddr>,
}

struct RunningGate {
    gate: Gate,
    url: String,
    shutdown: CancellationToken,
}

struct RunningWorker {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), services::WorkerError>>,
}

impl Drop for RunningGate {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Cluster {
    async fn start(bus: Bus, uid_conflict: UidConflict) -> Cluster {
        let monitor = match &bus {
            Bus::Embedded(server) => Some(server.start_monitor().await),
            Bus::NatsServer(_) | Bus::InProcess(_) => None,
        };
        let mut cluster = Cluster {
            bus,
            gates: Vec::new(),
            workers: Vec::new(),
            monitor,
        };
        for id in ["gate-a", "gate-b"] {
            let config = GateConfig {
                gate_id: id.into(),
                uid_conflict,
                ..GateConfig::default()
            };
            cluster.gates.push(cluster.gate(config).await);
        }
        for _ in 0..3 {
            cluster.add_worker().await;
        }
        cluster
    }

    async fn gate(&self, config: GateConfig) -> RunningGate {
        let options = common::bus_options(&self.bus);
        let gate = within(Gate::new(options, config, Arc::new(AnyToken)))
            .await
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let (running, stop) = (gate.clone(), shutdown.clone());
        tokio::spawn(async move { running.run(listener, stop).await });
        RunningGate {
            gate,
            url,
            shutdown,
        }
    }

    /// Starts one more chat worker; returns once it takes requests (after its snapshot).
    async fn add_worker(&mut self) {
        let url = self.bus.url().to_owned();
        self.add_worker_via(url).await;
    }

    /// [`Cluster::add_worker`] with the worker's bus connection through a [`Switch`].
    async fn add_switched_worker(&mut self) -> Switched {
        let switch = Switch::start(self.bus.addr()).await;
        let client = self.add_worker_via(switch.url.clone()).await;
        Switched { switch, client }
    }

    /// [`Cluster::add_worker`] with the worker's bus connection to `url`; returns the
    /// worker's client.
    async fn add_worker_via(&mut self, url: String) -> async_nats::Client {
        self.add_service(url, chat::service()).await
    }

    /// Starts a worker of `service` connected to `url`; returns the worker's client once
    /// the broker has its subscriptions.
    async fn add_service(&mut self, url: String, service: services::Service) -> async_nats::Client {
        let name = format!("test-{}", service.name());
        let client = services::connect(std::slice::from_ref(&url), &name, &Default::default())
            .await
            .unwrap();
        let config = WorkerConfig {
            nats: vec![url],
            ..WorkerConfig::default()
        };
        let nats = client.as_nats().expect("a client over the network").clone();
        let worker = within(Worker::subscribe(client, service, config))
            .await
            .unwrap();
        // The worker's subscriptions are at the broker before another worker can stop.
        round_trip(&nats).await;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(worker.run(shutdown.clone()));
        self.workers.push(RunningWorker { shutdown, task });
        nats
    }

    /// Starts a worker of the profile service (keyed by uid), and returns once it
    /// serves: a request for a profile through a gate is answered.
    async fn add_profile_worker(&mut self) {
        let url = self.bus.url().to_owned();
        self.add_service(url, profile::service(services::store::Store::memory()))
            .await;
        // Until the worker has taken its partitions, a gate's request waits and is
        // sent again (its announcement came first); a call would get 503 meanwhile.
        let probe = Player::connect(self.url(0), "probe").await;
        within(async {
            loop {
                let get = probe.client.request_keyed(profile::ROUTE_GET, "probe", []);
                if get.await.unwrap().code == code::OK {
                    break;
                }
            }
        })
        .await;
        probe.close().await;
    }

    /// Stops the first `n` workers and waits for them to finish.
    async fn stop_workers(&mut self, n: usize) {
        for mut worker in self.workers.drain(..n) {
            worker.shutdown.cancel();
            within(&mut worker.task).await.unwrap().unwrap();
        }
    }

    fn url(&self, gate: usize) -> &str {
        &self.gates[gate].url
    }

    async fn pusher(&self) -> Pusher {
        let nats = within(async_nats::connect(self.bus.url())).await.unwrap();
        Pusher::new(nats, PREFIX).unwrap()
    }

    /// Waits until no gate holds a session, group or player, and the bus has no
    /// subscription left for `rooms` and `users`.
    async fn assert_no_leaks(&self, rooms: &[&str], users: &[&str]) {
        for g in &self.gates {
            let gate = &g.gate;
            eventually("gate empty", || {
                gate.session_count() == 0 && gate.group_count() == 0 && gate.user_count() == 0
            })
            .await;
        }
        let subjects: Vec<String> = rooms
            .iter()
            .map(|r| format!("{PREFIX}.grp.{}", chat::group_of(r)))
            .chain(users.iter().map(|u| format!("{PREFIX}.user.{u}")))
            .collect();
        // A gate counts a group or user gone at once; its UNSUB reaches the broker a
        // moment later: wait for that too.
        let deadline = tokio::time::Instant::now() + DEADLINE;
        if let Some(monitor) = self.monitor {
            for subject in &subjects {
                loop {
                    let subsz = http_get_json(monitor, &format!("/subsz?test={subject}")).await;
                    if subsz["total"] == 0 {
                        break;
                    }
                    assert!(tokio::time::Instant::now() < deadline, "{subject}: {subsz}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
        // On either broker: a request to a subject nobody holds has no responders.
        let nats = within(async_nats::connect(self.bus.url())).await.unwrap();
        for subject in subjects {
            loop {
                let asked = tokio::time::timeout(
                    Duration::from_millis(500),
                    nats.request(subject.clone(), "".into()),
                )
                .await;
                let no_responders = matches!(
                    &asked,
                    Ok(Err(e)) if e.kind() == async_nats::client::RequestErrorKind::NoResponders
                );
                if no_responders {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{subject} is still subscribed: {asked:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Polls `condition` until it holds, failing after [`DEADLINE`].
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// GET `path` from the broker's monitoring port; the JSON body.
async fn http_get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let mut stream = within(TcpStream::connect(addr)).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    within(stream.read_to_end(&mut response)).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A player: an SDK client with serial requests, and its pushes.
struct Player {
    name: String,
    client: Client,
    pushes: Pushes,
}

/// An answer that is not 200: its code and message.
#[derive(Debug, PartialEq)]
struct Refused(u32, String);

impl Player {
    async fn connect(url: &str, name: &str) -> Player {
        let options = ClientOptions {
            serial: true,
            ..ClientOptions::default()
        };
        let client = within(Client::connect(url, options)).await.unwrap();
        let pushes = client.pushes().unwrap();
        Player {
            name: name.into(),
            client,
            pushes,
        }
    }

    /// Connects and logs in as `name`.
    async fn login(url: &str, name: &str) -> Player {
        let player = Player::connect(url, name).await;
        player.log_in().await;
        player
    }

    /// Logs in under this player's name; the answer.
    async fn log_in(&self) -> LoginResponse {
        let name = self.name.clone();
        let answer: LoginResponse = self
            .call("chat.login", LoginRequest { name })
            .await
            .unwrap();
        assert_eq!(answer.name, self.name);
        answer
    }

    async fn call<Resp: Message + Default>(
        &self,
        route: &str,
        req: impl Message,
    ) -> Result<Resp, Refused> {
        let response = within(self.client.request(route, req.encode_to_vec()))
            .await
            .unwrap_or_else(|e| panic!("{} {route}: {e}", self.name));
        if response.code != code::OK {
            return Err(Refused(response.code, response.message));
        }
        Ok(Resp::decode(response.body).unwrap())
    }

    async fn join(&self, room: &str) -> Vec<String> {
        let answer: JoinResponse = self
            .call("chat.join", JoinRequest { room: room.into() })
            .await
            .unwrap();
        answer.members
    }

    async fn leave(&self, room: &str) {
        let _: LeaveResponse = self
            .call("chat.leave", LeaveRequest { room: room.into() })
            .await
            .unwrap();
    }

    async fn say(&self, room: &str, text: &str) -> Result<SayResponse, Refused> {
        let req = SayRequest {
            room: room.into(),
            text: text.into(),
        };
        self.call("chat.say", req).await
    }

    async fn members(&self, room: &str) -> Vec<String> {
        let answer: MembersResponse = self
            .call("chat.members", MembersRequest { room: room.into() })
            .await
            .unwrap();
        answer.members
    }

    async fn next_push(&mut self) -> Push {
        within(self.pushes.recv())
            .await
            .unwrap_or_else(|| panic!("{}: push stream ended", self.name))
    }

    /// The next push with `route`, skipping others (announcements, say).
    async fn next_on(&mut self, route: &str) -> Push {
        loop {
            let push = self.next_push().await;
            if push.route == route {
                return push;
            }
        }
    }

    async fn next_message(&mut self) -> ChatMessage {
        ChatMessage::decode(self.next_on(chat::ROUTE_MESSAGE).await.body).unwrap()
    }

    async fn next_left(&mut self) -> MemberEvent {
        MemberEvent::decode(self.next_on(chat::ROUTE_LEFT).await.body).unwrap()
    }

    async fn next_joined(&mut self) -> MemberEvent {
        MemberEvent::decode(self.next_on(chat::ROUTE_JOINED).await.body).unwrap()
    }

    async fn close(self) {
        within(self.client.close()).await;
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn room_messages_reach_every_member_once_in_send_order(bus: Bus) {
    const BURST: usize = 40;
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let mut players = Vec::new();
    for i in 0..6 {
        let player = Player::login(cluster.url(i % 2), &format!("p{i}")).await;
        player.join("lobby").await;
        players.push(player);
    }
    // Three senders, two on one gate, one on the other, each a pipelined burst.
    let bursts = players[..3].iter().map(|sender| async move {
        let texts: Vec<String> = (0..BURST).map(|i| format!("{}:{i}", sender.name)).collect();
        let says = texts.iter().map(|text| sender.say("lobby", text));
        for answer in join_all(says).await {
            answer.unwrap();
        }
    });
    within(join_all(bursts)).await;
    // Every burst was answered, so every message is on its way before this one.
    players[5].say("lobby", "end").await.unwrap();
    for player in &mut players {
        let mut next = [0usize; 3];
        loop {
            let message = player.next_message().await;
            if message.text == "end" {
                break;
            }
            let (from, seq) = message.text.split_once(':').unwrap();
            let sender: usize = from[1..].parse().unwrap();
            assert_eq!(message.from, from);
            assert_eq!(
                seq.parse::<usize>().unwrap(),
                next[sender],
                "{} got {from}'s messages out of order or twice",
                player.name
            );
            next[sender] += 1;
        }
        assert_eq!(next, [BURST; 3], "{} missed messages", player.name);
    }
    for player in players {
        player.close().await;
    }
    cluster
        .assert_no_leaks(&["lobby"], &["p0", "p1", "p2", "p3", "p4", "p5"])
        .await;
}

async fn leaving_or_closing_stops_delivery_and_announces_it(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let mut alice = Player::login(cluster.url(0), "alice").await;
    let mut bob = Player::login(cluster.url(1), "bob").await;
    let mut carol = Player::login(cluster.url(0), "carol").await;
    for p in [&alice, &bob, &carol] {
        p.join("lobby").await;
    }

    bob.leave("lobby").await;
    for p in [&mut alice, &mut carol] {
        let left = p.next_left().await;
        assert_eq!(
            (left.room.as_str(), left.name.as_str(), left.reason.as_str()),
            ("lobby", "bob", REASON_LEFT)
        );
    }
    assert_eq!(
        bob.say("lobby", "still here?").await,
        Err(Refused(
            code::FORBIDDEN,
            "join room \"lobby\" before saying something there".into()
        ))
    );
    alice.say("lobby", "after bob left").await.unwrap();
    assert_eq!(carol.next_message().await.text, "after bob left");
    // Had bob's gate still delivered the room to him, that message would come first.
    bob.join("lobby").await;
    alice.say("lobby", "welcome back").await.unwrap();
    assert_eq!(bob.next_message().await.text, "welcome back");
    assert_eq!(carol.next_message().await.text, "welcome back");

    carol.close().await;
    for p in [&mut alice, &mut bob] {
        let left = p.next_left().await;
        assert_eq!(
            (left.name.as_str(), left.reason.as_str()),
            ("carol", REASON_DISCONNECTED)
        );
    }
    assert_eq!(alice.members("lobby").await, names(&["alice", "bob"]));
    alice.say("lobby", "bye carol").await.unwrap();
    assert_eq!(bob.next_message().await.text, "bye carol");

    alice.close().await;
    assert_eq!(bob.next_left().await.name, "alice");
    bob.close().await;
    cluster
        .assert_no_leaks(&["lobby"], &["alice", "bob", "carol"])
        .await;
}

async fn a_second_login_kicks_the_first_session(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let first = Player::login(cluster.url(0), "alice").await;
    let mut bob = Player::login(cluster.url(1), "bob").await;
    first.join("lobby").await;
    bob.join("lobby").await;

    let second = Player::login(cluster.url(1), "alice").await;
    assert_eq!(within(first.client.closed()).await, "logged in elsewhere");
    let left = bob.next_left().await;
    assert_eq!(
        (left.name.as_str(), left.reason.as_str()),
        ("alice", REASON_DISCONNECTED)
    );
    assert_eq!(bob.members("lobby").await, names(&["bob"]));

    assert_eq!(second.join("lobby").await, names(&["alice", "bob"]));
    assert_eq!(bob.next_joined().await.name, "alice");
    second.say("lobby", "it's me again").await.unwrap();
    let message = bob.next_message().await;
    assert_eq!(
        (message.from.as_str(), message.text.as_str()),
        ("alice", "it's me again")
    );

    for p in [first, second, bob] {
        p.close().await;
    }
    cluster.assert_no_leaks(&["lobby"], &["alice", "bob"]).await;
}

async fn refuse_mode_answers_409_to_a_second_login(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Refuse).await;
    let mut first = Player::login(cluster.url(0), "alice").await;
    first.join("lobby").await;
    let second = Player::connect(cluster.url(1), "alice").await;
    let refused = second
        .call::<LoginResponse>(
            "chat.login",
            LoginRequest {
                name: "alice".into(),
            },
        )
        .await;
    assert!(
        matches!(refused, Err(Refused(code::CONFLICT, _))),
        "{refused:?}"
    );
    // The refused session is not logged in; the first one is untouched.
    assert!(matches!(
        second.say("lobby", "x").await,
        Err(Refused(code::UNAUTHORIZED, _))
    ));
    first.say("lobby", "still mine").await.unwrap();
    assert_eq!(first.next_message().await.text, "still mine");
    assert!(!first.client.is_closed());

    first.close().await;
    second.close().await;
    cluster.assert_no_leaks(&["lobby"], &["alice"]).await;
}

async fn a_worker_kicks_a_player_by_uid_from_outside_a_handler(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let mallory = Player::login(cluster.url(1), "mallory").await;
    let mut alice = Player::login(cluster.url(0), "alice").await;
    mallory.join("lobby").await;
    alice.join("lobby").await;

    let pusher = cluster.pusher().await;
    pusher.kick_user("mallory", "banned").await.unwrap();
    within(pusher.flush()).await.unwrap();
    assert_eq!(within(mallory.client.closed()).await, "banned");
    let left = alice.next_left().await;
    assert_eq!(
        (left.name.as_str(), left.reason.as_str()),
        ("mallory", REASON_DISCONNECTED)
    );
    assert_eq!(alice.members("lobby").await, names(&["alice"]));

    mallory.close().await;
    alice.close().await;
    cluster
        .assert_no_leaks(&["lobby"], &["alice", "mallory"])
        .await;
}

async fn pushes_reach_a_player_on_the_other_gate(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let alice = Player::login(cluster.url(0), "alice").await;
    let mut bob = Player::login(cluster.url(1), "bob").await;

    // From a handler: chat.whisper pushes to the player's user subject.
    let _: WhisperResponse = alice
        .call(
            "chat.whisper",
            WhisperRequest {
                to: "bob".into(),
                text: "psst".into(),
            },
        )
        .await
        .unwrap();
    let whisper = ChatMessage::decode(bob.next_on(chat::ROUTE_WHISPER).await.body).unwrap();
    assert_eq!(
        (whisper.from.as_str(), whisper.text.as_str()),
        ("alice", "psst")
    );

    // From outside a handler: a pusher, to a player and to a room. Each push is sent
    // right after the login or join it depends on, on another connection than the gate's,
    // so it races the gate's subscription (docs/chat.md): repeat until one lands.
    let pusher = cluster.pusher().await;
    let notice = until_received(&mut bob, "game.notice", || {
        pusher.push_to_user("bob", "game.notice", "you won")
    })
    .await;
    assert_eq!(&notice.body[..], b"you won");
    bob.join("lobby").await;
    let lobby = chat::group_of("lobby");
    let notice = until_received(&mut bob, "game.notice", || {
        pusher.broadcast(&lobby, "game.notice", "restart soon")
    })
    .await;
    assert_eq!(&notice.body[..], b"restart soon");
    assert!(
        pusher
            .broadcast("no.dots", "game.notice", "")
            .await
            .is_err()
    );

    alice.close().await;
    bob.close().await;
    cluster.assert_no_leaks(&["lobby"], &["alice", "bob"]).await;
}

/// Sends with `send` until `player` receives a push on `route` (within [`DEADLINE`]).
async fn until_received<F, Fut>(player: &mut Player, route: &str, send: F) -> Push
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), services::PushError>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        send().await.unwrap();
        let wait = Duration::from_millis(200);
        if let Ok(push) = tokio::time::timeout(wait, player.next_on(route)).await {
            return push;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{route} never arrived"
        );
    }
}

async fn member_lists_follow_comings_and_goings(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let mut players = Vec::new();
    for (i, name) in ["ann", "ben", "cat", "dan"].into_iter().enumerate() {
        players.push(Player::login(cluster.url(i % 2), name).await);
    }
    check_members(&players, &[]).await;
    assert_eq!(players[2].join("lobby").await, names(&["cat"]));
    assert_eq!(players[0].join("lobby").await, names(&["ann", "cat"]));
    assert_eq!(
        players[3].join("lobby").await,
        names(&["ann", "cat", "dan"])
    );
    check_members(&players, &["ann", "cat", "dan"]).await;
    players[2].leave("lobby").await;
    check_members(&players, &["ann", "dan"]).await;
    players[1].join("lobby").await;
    players[1].join("den").await;
    check_members(&players, &["ann", "ben", "dan"]).await;
    let ben = players.remove(1);
    ben.close().await;
    // A close is announced asynchronously: wait for the announcement, then check.
    loop {
        let left = players[0].next_left().await;
        if left.name == "ben" {
            break;
        }
    }
    check_members(&players, &["ann", "dan"]).await;
    assert!(players[0].members("den").await.is_empty());

    for p in players {
        p.close().await;
    }
    cluster
        .assert_no_leaks(&["lobby", "den"], &["ann", "ben", "cat", "dan"])
        .await;
}

/// After a change is answered, every member list shows it, whichever worker answers
/// (each player asks three times; the bus spreads the asks over the workers).
async fn check_members(players: &[Player], want: &[&str]) {
    for _ in 0..3 {
        for p in players {
            assert_eq!(p.members("lobby").await, names(want), "asked by {}", p.name);
        }
    }
}

async fn a_late_worker_learns_the_rooms_from_a_peer(bus: Bus) {
    let mut cluster = Cluster::start(bus, UidConflict::Kick).await;
    let alice = Player::login(cluster.url(0), "alice").await;
    let mut bob = Player::login(cluster.url(1), "bob").await;
    alice.join("lobby").await;
    bob.join("lobby").await;
    alice.join("den").await;

    // A fourth worker starts (asking a peer for the rooms); then the first three stop,
    // so everything below is answered by the newcomer.
    cluster.add_worker().await;
    cluster.stop_workers(3).await;
    assert_eq!(bob.members("lobby").await, names(&["alice", "bob"]));
    assert_eq!(bob.members("den").await, names(&["alice"]));
    alice.say("lobby", "who's serving?").await.unwrap();
    assert_eq!(bob.next_message().await.text, "who's serving?");
    alice.close().await;
    assert_eq!(bob.next_left().await.name, "alice");
    assert_eq!(bob.members("lobby").await, names(&["bob"]));

    bob.close().await;
    cluster
        .assert_no_leaks(&["lobby", "den"], &["alice", "bob"])
        .await;
}

/// A TCP hop between a worker and the broker that the test takes down, as a network
/// fault would, and brings back: while down it drops every connection through it and
/// each new one at once, so the worker's client keeps trying to reconnect.
struct Switch {
    url: String,
    up: Arc<watch::Sender<bool>>,
}

impl Switch {
    async fn start(broker: SocketAddr) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let up = Arc::new(watch::Sender::new(true));
        let accepting = up.clone();
        tokio::spawn(async move {
            while let Ok((mut worker, _)) = listener.accept().await {
                let mut up = accepting.subscribe();
                if !*up.borrow_and_update() {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut broker) = TcpStream::connect(broker).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut worker, &mut broker) => {}
                        _ = up.wait_for(|up| !up) => {}
                    }
                });
            }
        });
        Switch { url, up }
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

/// A worker whose bus connection goes through a [`Switch`], and its client.
struct Switched {
    switch: Switch,
    client: async_nats::Client,
}

impl Switched {
    /// Takes the connection down; returns once the worker's client has noticed.
    async fn down(&self) {
        self.switch.set(false);
        eventually("the worker lost its connection", || {
            self.client.connection_state() == async_nats::connection::State::Disconnected
        })
        .await;
    }

    /// Brings it back; returns once the client has subscribed everything again and the
    /// broker has it, so that a request finds the worker.
    async fn up(&self) {
        self.switch.set(true);
        eventually("the worker reconnected", || {
            self.client.connection_state() == async_nats::connection::State::Connected
        })
        .await;
        round_trip(&self.client).await;
    }
}

/// A worker whose bus connection drops misses the changes made meanwhile; back, it asks
/// a peer for the state again before it answers, and the missed leave is gone too.
async fn a_worker_back_from_a_lost_connection_catches_up(bus: Bus) {
    let mut cluster = Cluster::start(bus, UidConflict::Kick).await;
    let fourth = cluster.add_switched_worker().await;
    let alice = Player::login(cluster.url(0), "alice").await;
    let ben = Player::login(cluster.url(1), "ben").await;
    alice.join("lobby").await;
    ben.join("lobby").await;

    fourth.down().await;
    // The three other workers handle these; the fourth misses their changes.
    ben.leave("lobby").await;
    let cat = Player::login(cluster.url(0), "cat").await;
    cat.join("lobby").await;
    fourth.up().await;

    // Left: one worker that saw every change and the one back, each answering about
    // half of the asks.
    cluster.stop_workers(2).await;
    for _ in 0..20 {
        assert_eq!(alice.members("lobby").await, names(&["alice", "cat"]));
    }

    for p in [alice, ben, cat] {
        p.close().await;
    }
    cluster
        .assert_no_leaks(&["lobby"], &["alice", "ben", "cat"])
        .await;
}

/// With no peer to ask, a worker back from a lost connection keeps its state, and
/// answers at once: its ask for a snapshot must not reach its own loop, which waits
/// behind it (that would hold the next request for 3 × 3 s, and the gate answer 408).
async fn a_lone_worker_back_from_a_lost_connection_keeps_its_state(bus: Bus) {
    let mut cluster = Cluster::start(bus, UidConflict::Kick).await;
    let lone = cluster.add_switched_worker().await;
    cluster.stop_workers(3).await;
    let alice = Player::login(cluster.url(0), "alice").await;
    alice.join("lobby").await;
    // The worker applies its own join when the change comes back to it over the bus:
    // the connection must not go before that, or there is no state to keep.
    within(async {
        while alice.members("lobby").await != names(&["alice"]) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    lone.down().await;
    lone.up().await;
    assert_eq!(alice.members("lobby").await, names(&["alice"]));

    alice.close().await;
    cluster.assert_no_leaks(&["lobby"], &["alice"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused() {
    let bus = Bus::embedded().await;
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let anon = Player::connect(cluster.url(0), "anon").await;
    let join = anon
        .call::<JoinResponse>(
            "chat.join",
            JoinRequest {
                room: "lobby".into(),
            },
        )
        .await;
    assert!(
        matches!(join, Err(Refused(code::UNAUTHORIZED, _))),
        "{join:?}"
    );
    for name in ["", "Bob", "a.b", "a*", "a b"] {
        let login = anon
            .call::<LoginResponse>("chat.login", LoginRequest { name: name.into() })
            .await;
        assert!(
            matches!(login, Err(Refused(code::BAD_REQUEST, _))),
            "{name:?}: {login:?}"
        );
    }
    let alice = Player::login(cluster.url(0), "alice").await;
    for room in ["", "Lobby", "a.>", "*"] {
        let join = alice
            .call::<JoinResponse>("chat.join", JoinRequest { room: room.into() })
            .await;
        assert!(
            matches!(join, Err(Refused(code::BAD_REQUEST, _))),
            "{room:?}: {join:?}"
        );
    }
    alice.join("lobby").await;
    assert!(matches!(
        alice.say("lobby", "").await,
        Err(Refused(code::BAD_REQUEST, _))
    ));
    let garbage = within(alice.client.request("chat.say", [0xff, 0xff]))
        .await
        .unwrap();
    assert_eq!(garbage.code, code::BAD_REQUEST);

    anon.close().await;
    alice.close().await;
    cluster.assert_no_leaks(&["lobby"], &["alice"]).await;
}

/// A sender's own room message before its answer: the gate's router never lets a reply
/// overtake a push that reached the gate first (`gateway/src/router.rs`). Once a race
/// between two tasks, swapping 50 to 150 of 300.
///
/// The chat worker publishes a say's broadcast before its answer, so the sender's own
/// message should be in its push queue by the time the answer arrives.
async fn a_senders_own_message_arrives_before_its_answer(bus: Bus) {
    let cluster = Cluster::start(bus, UidConflict::Kick).await;
    let mut alice = Player::login(cluster.url(0), "alice").await;
    let bob = Player::login(cluster.url(0), "bob").await;
    bob.join("lobby").await;
    alice.join("lobby").await;
    let mut late = 0;
    for i in 0..300 {
        let text = format!("m{i}");
        alice.say("lobby", &text).await.unwrap();
        // The worker published the message before its answer: it should be queued.
        let mut found = false;
        while let Some(push) = alice.pushes.try_recv() {
            if push.route == chat::ROUTE_MESSAGE {
                assert_eq!(ChatMessage::decode(push.body).unwrap().text, text);
                found = true;
                break;
            }
        }
        if !found {
            late += 1;
            assert_eq!(alice.next_message().await.text, text);
        }
    }
    assert_eq!(late, 0, "own message after the answer {late} times of 300");
    alice.close().await;
    bob.close().await;
    cluster.assert_no_leaks(&["lobby"], &["alice", "bob"]).await;
}

/// `chat.login` defers, calls `profile.get` (a keyed service: the call is routed by the
/// player's name to its partition's subject, where a keyed worker serves), and answers
/// with the profile; the session keeps it, and the player's messages carry it.
async fn a_login_takes_the_player_s_profile_by_a_call_to_the_keyed_profile_service(bus: Bus) {
    let mut cluster = Cluster::start(bus, UidConflict::Kick).await;
    cluster.add_profile_worker().await;
    let carol = Player::connect(cluster.url(0), "carol").await;
    let first = carol.log_in().await;
    let default = profile::default_profile("carol");
    assert_eq!(
        (first.display.as_str(), first.color.as_str()),
        ("carol", default.color.as_str())
    );
    let set = proto::profile::SetRequest {
        display: "Carol".into(),
        color: "#00ff7f".into(),
    };
    let _: proto::profile::Profile = carol.call("profile.set", set).await.unwrap();
    carol.close().await;

    let mut bob = Player::login(cluster.url(1), "bob").await;
    bob.join("lobby").await;
    let carol = Player::connect(cluster.url(0), "carol").await;
    let again = carol.log_in().await;
    assert_eq!(
        (again.display.as_str(), again.color.as_str()),
        ("Carol", "#00ff7f")
    );
    carol.join("lobby").await;
    carol.say("lobby", "hi").await.unwrap();
    let heard = bob.next_message().await;
    assert_eq!(
        (
            heard.from.as_str(),
            heard.display.as_str(),
            heard.color.as_str()
        ),
        ("carol", "Carol", "#00ff7f")
    );
    carol.close().await;
    bob.close().await;
    cluster.assert_no_leaks(&["lobby"], &["bob", "carol"]).await;
}
