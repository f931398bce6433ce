//! Keyed services end to end, on both buses: real gates, real workers, clients over
//! WebSockets. The service under test keeps a count per key; each key is one session's,
//! which sends one request at a time, so the answers of a key must count 1, 2, 3, ...
//! exactly: a lost request or state, a request run twice, or two workers acting on one
//! key at once all break the sequence.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::proxy::Proxy;
use common::{Bus, DEADLINE, TestGate, TestWorker, start_worker_with, within};
use futures::StreamExt as _;
use gateway::GateConfig;
use proto::Message as _;
use proto::arena::{InputRequest, InputResponse, JoinRequest, State};
use proto::chat::LoginRequest;
use proto::code;
use proto::keyed::{first_in_order, members_subject, partition_of};
use proto::rpc::KeyedMember;
use sdk::Client;
use services::config::DEFAULT_PREFIX;
use services::{KeyedConfig, WorkerConfig};

broker::on_every_bus!(
    one_key_reaches_one_worker_in_order_from_every_gate,
    a_drained_owner_hands_its_state_over_and_nothing_is_lost;
    tcp_only:
    a_worker_added_under_load_takes_a_share_and_nothing_is_lost,
    a_dead_owner_s_partitions_go_on_at_their_standby,
    without_standbys_a_dead_owner_s_partitions_start_fresh_elsewhere,
    an_arena_match_moves_twice_under_inputs_without_losing_a_move_or_a_tick,
);

use services::tally::PARTITIONS;
const KEYS: usize = 12;
/// Workers started in turn until one wins a share of the partitions that fits a test
/// ([`Ids::start_winning`]); one in 128 misses, so ten in a row means something is wrong.
const STARTS: usize = 10;

fn worker_config(url: &str) -> WorkerConfig {
    WorkerConfig {
        nats: vec![url.to_owned()],
        keyed: KeyedConfig {
            keyed_heartbeat: Duration::from_millis(100),
            keyed_member_timeout: Duration::from_millis(500),
            handover_timeout: Duration::from_secs(1),

            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    }
}

async fn start(url: &str, name: &'static str) -> (TestWorker, Arc<AtomicUsize>) {
    start_as(name, worker_config(url)).await
}

/// A tally worker answering as `name`, and the partitions it took fresh.
async fn start_as(name: &'static str, config: WorkerConfig) -> (TestWorker, Arc<AtomicUsize>) {
    let fresh = Arc::new(AtomicUsize::new(0));
    let worker = start_worker_with(services::tally::service(name, fresh.clone()), config).await;
    (worker, fresh)
}

/// The ids the tally workers heartbeat with, heard on the bus: a worker's id is random
/// per start, and which partitions it owns follows from the ids (rendezvous).
struct Ids {
    heartbeats: async_nats::Subscriber,
    heard: BTreeSet<String>,
    _bus: async_nats::Client,
}

impl Ids {
    /// Listens from now: start the workers after.
    async fn listen(url: &str) -> Ids {
        let bus = async_nats::connect(url).await.unwrap();
        let subject = members_subject(DEFAULT_PREFIX, services::tally::NAME);
        let heartbeats = bus.subscribe(subject).await.unwrap();
        bus.flush().await.unwrap();
        Ids {
            heartbeats,
            heard: BTreeSet::new(),
            _bus: bus,
        }
    }

    /// The id of the worker started since the last call: the first not heard before.
    async fn newcomer(&mut self) -> String {
        within(async {
            loop {
                let message = self.heartbeats.next().await.unwrap();
                let member = KeyedMember::decode(message.payload).unwrap();
                if self.heard.insert(member.id.clone()) {
                    return member.id;
                }
            }
        })
        .await
    }

    /// Starts workers with `start` until one wins a number of partitions from the worker
    /// `other` that `fits` (rendezvous, the two alone); stops those that do not. With
    /// tally's 8 partitions, one random pair in 128 leaves one of the two nothing, and a
    /// test of keys moving between them nothing to test.
    async fn start_winning(
        &mut self,
        other: &str,
        fits: impl Fn(u32) -> bool,
        start: impl AsyncFn() -> (TestWorker, Arc<AtomicUsize>),
    ) -> (TestWorker, Arc<AtomicUsize>) {
        for _ in 0..STARTS {
            let started = start().await;
            let id = self.newcomer().await;
            let won = (0..PARTITIONS)
                .filter(|&p| first_in_order([other, id.as_str()].into_iter(), p) == Some(&id))
                .count();
            if fits(won as u32) {
                return started;
            }
            started.0.stop().await;
        }
        panic!("{STARTS} workers in a row won a share that does not fit");
    }
}

/// Whether each of two workers owns some partitions, the newcomer having won `won`.
fn shared(won: u32) -> bool {
    won > 0 && won < PARTITIONS
}

/// Workers `a` then `b`, each started by `start` (given its name), that share the
/// partitions.
async fn sharing_pair(
    url: &str,
    start: impl AsyncFn(&'static str) -> (TestWorker, Arc<AtomicUsize>),
) -> [(TestWorker, Arc<AtomicUsize>); 2] {
    let mut ids = Ids::listen(url).await;
    let a = start("a").await;
    let a_id = ids.newcomer().await;
    let b = ids
        .start_winning(&a_id, shared, async || start("b").await)
        .await;
    [a, b]
}

/// A gate that has learnt `services`' schemas, so that a keyed one is known as keyed
/// (until then the gate would send its requests unkeyed, which its workers answer 503).
async fn gate_for(bus: &Bus, services: &[&str]) -> TestGate {
    let gate = TestGate::start(bus, GateConfig::default()).await;
    assert!(gate.gate.wait_for_schemas(services, DEADLINE).await);
    gate
}

async fn gate(bus: &Bus) -> TestGate {
    gate_for(bus, &["tally"]).await
}

/// Waits until the workers' fresh take-overs add up to every partition: the service is
/// served, and a test's counts start from there.
async fn all_taken(fresh: &[&AtomicUsize]) {
    within(async {
        while fresh
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .sum::<usize>()
            < PARTITIONS as usize
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// One answer: which worker, and the key's count there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    worker: String,
    count: u64,
}

async fn add(client: &Client, key: &str) -> Result<Answer, String> {
    let response = client
        .request_keyed("tally.add", key, "")
        .await
        .map_err(|e| e.to_string())?;
    if response.code != code::OK {
        return Err(format!("{} {}", response.code, response.message));
    }
    let text = std::str::from_utf8(&response.body).unwrap();
    let (worker, count) = text.split_once(' ').unwrap();
    Ok(Answer {
        worker: worker.to_owned(),
        count: count.parse().unwrap(),
    })
}

fn key(n: usize) -> String {
    format!("match-{n}")
}

/// Sends one request per key, pass after pass, until the owners have stayed the same,
/// both workers among them, for two member timeouts: whatever the workers' first views
/// made them take (each may take partitions fresh before it hears the other) has been
/// handed over to its owner. Returns each key's owner and count.
async fn settled(client: &Client) -> (Vec<String>, Vec<u64>) {
    let steady = worker_config("").keyed.keyed_member_timeout * 2;
    within(async {
        let mut since: Option<(Vec<String>, std::time::Instant)> = None;
        loop {
            let mut owners = Vec::new();
            let mut counts = Vec::new();
            for n in 0..KEYS {
                let answer = add(client, &key(n)).await.unwrap();
                owners.push(answer.worker);
                counts.push(answer.count);
            }
            let both = owners
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == 2;
            match &since {
                Some((before, at)) if both && *before == owners => {
                    if at.elapsed() >= steady {
                        return (owners, counts);
                    }
                }
                _ => since = Some((owners, std::time::Instant::now())),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Each key's answers, sent one at a time from its own session until `stop`.
async fn load(gates: &[&TestGate], stop: Arc<AtomicBool>) -> Vec<Vec<Result<Answer, String>>> {
    let mut tasks = Vec::new();
    for n in 0..KEYS {
        let client = gates[n % gates.len()].client().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                answers.push(add(&client, &key(n)).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            answers
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(within(task).await.unwrap());
    }
    all
}

/// Every answer is 200 and each key counts 1, 2, 3, ... with no gap or repeat; returns
/// each key's workers in the order they answered (each listed once per stretch).
fn counted_exactly(answers: &[Vec<Result<Answer, String>>]) -> Vec<Vec<String>> {
    answers
        .iter()
        .enumerate()
        .map(|(n, answers)| {
            assert!(answers.len() > 3, "key {n}: only {} answers", answers.len());
            let mut stretches: Vec<String> = Vec::new();
            for (i, answer) in answers.iter().enumerate() {
                let answer = answer
                    .as_ref()
                    .unwrap_or_else(|e| panic!("key {n}, request {i}: {e}"));
                assert_eq!(answer.count, i as u64 + 1, "key {n}: {answers:?}");
                if stretches.last() != Some(&answer.worker) {
                    stretches.push(answer.worker.clone());
                }
            }
            stretches
        })
        .collect()
}

/// Waits until `worker` answers some key of one set (not the load's: its counts are the
/// load's own), by its own requests one after another: it holds partitions.
async fn serves(client: &Client, worker: &str) {
    within(async {
        for n in 0.. {
            let answer = add(client, &format!("probe-{}", n % 32)).await.unwrap();
            if answer.worker == worker {
                return;
            }
        }
    })
    .await;
}

async fn run_load_while(
    gates: &[&TestGate],
    during: impl AsyncFnOnce(),
) -> Vec<Vec<Result<Answer, String>>> {
    let stop = Arc::new(AtomicBool::new(false));
    let load = load(gates, stop.clone());
    let change = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        during().await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        stop.store(true, Ordering::Relaxed);
    };
    let (answers, ()) = tokio::join!(load, change);
    answers
}

async fn one_key_reaches_one_worker_in_order_from_every_gate(bus: Bus) {
    let [(_a, fresh_a), (_b, fresh_b)] =
        sharing_pair(bus.url(), async |name| start(bus.url(), name).await).await;
    all_taken(&[&fresh_a, &fresh_b]).await;
    let gates = [gate(&bus).await, gate(&bus).await];
    let clients = [gates[0].client().await, gates[1].client().await];
    let (workers, counts) = settled(&clients[0]).await;
    // Each key from two sessions, one on each gate, taking turns.
    for round in 1..=6u64 {
        for n in 0..KEYS {
            let answer = add(&clients[(n + round as usize) % 2], &key(n))
                .await
                .unwrap();
            assert_eq!(answer.count, counts[n] + round, "key {n}");
            assert_eq!(workers[n], answer.worker, "key {n} moved with no reason to");
        }
    }
    // Keys of one partition share its owner.
    for n in 0..KEYS {
        for m in 0..KEYS {
            let p = |k: usize| partition_of(key(k).as_bytes(), PARTITIONS);
            if p(n) == p(m) {
                assert_eq!(workers[n], workers[m]);
            }
        }
    }
}

async fn a_worker_added_under_load_takes_a_share_and_nothing_is_lost(bus: Bus) {
    let mut ids = Ids::listen(bus.url()).await;
    let (_a, fresh_a) = start(bus.url(), "a").await;
    let a_id = ids.newcomer().await;
    let gate = gate(&bus).await;
    all_taken(&[&fresh_a]).await;
    let mut added = None;
    let probe = gate.client().await;
    let answers = run_load_while(&[&gate], async || {
        let b = async || start(bus.url(), "b").await;
        // b taking every partition is a share too.
        added = Some(ids.start_winning(&a_id, |won| won > 0, b).await);
        serves(&probe, "b").await;
    })
    .await;
    let (_b, fresh_b) = added.unwrap();
    let stretches = counted_exactly(&answers);
    let moved = stretches.iter().filter(|s| **s == ["a", "b"]).count();
    assert!(moved > 0, "b took no key: {stretches:?}");
    assert!(
        stretches.iter().all(|s| *s == ["a"] || *s == ["a", "b"]),
        "a key moved once, to the newcomer: {stretches:?}"
    );
    assert_eq!(fresh_a.load(Ordering::Relaxed), PARTITIONS as usize);
    assert_eq!(
        fresh_b.load(Ordering::Relaxed),
        0,
        "b took state, not fresh"
    );
}

async fn a_drained_owner_hands_its_state_over_and_nothing_is_lost(bus: Bus) {
    // a holds every partition before b starts: started together on a busy machine, b
    // could take them all before hearing a, and a would have nothing to hand over.
    let mut ids = Ids::listen(bus.url()).await;
    let (a, fresh_a) = start(bus.url(), "a").await;
    let a_id = ids.newcomer().await;
    all_taken(&[&fresh_a]).await;
    let b = async || start(bus.url(), "b").await;
    let (_b, fresh_b) = ids.start_winning(&a_id, shared, b).await;
    let gates = [gate(&bus).await, gate(&bus).await];
    let taken = fresh_b.load(Ordering::Relaxed);
    let answers = run_load_while(&[&gates[0], &gates[1]], async || a.stop().await).await;
    let stretches = counted_exactly(&answers);
    assert!(
        stretches.iter().any(|s| *s == ["a", "b"]),
        "a owned keys: {stretches:?}"
    );
    assert!(
        stretches.iter().all(|s| s.last().unwrap() == "b"),
        "b ends with every key: {stretches:?}"
    );
    assert_eq!(
        fresh_b.load(Ordering::Relaxed),
        taken,
        "b took a's partitions with their state"
    );
}

/// Worker a is cut off the bus (its connection dies, as in a crash): b, standing by for
/// every partition of a's, serves all keys, a's going on from their counts.
async fn a_dead_owner_s_partitions_go_on_at_their_standby(bus: Bus) {
    a_dead_owner(&bus, true).await;
}

/// The same with `--standby false`: a's keys start over at b, which is told they start
/// fresh.
async fn without_standbys_a_dead_owner_s_partitions_start_fresh_elsewhere(bus: Bus) {
    a_dead_owner(&bus, false).await;
}

async fn a_dead_owner(bus: &Bus, standby: bool) {
    let proxy = Proxy::start(bus.addr()).await;
    let config = |url: &str| {
        let mut config = worker_config(url);
        config.keyed.standby = standby;
        config
    };
    let url = |name| if name == "a" { proxy.url() } else { bus.url() };
    let [(_a, fresh_a), (_b, fresh_b)] = sharing_pair(bus.url(), async |name| {
        start_as(name, config(url(name))).await
    })
    .await;
    all_taken(&[&fresh_a, &fresh_b]).await;
    let gate = gate(bus).await;
    let client = gate.client().await;
    let (owners, counts) = settled(&client).await;
    let before = fresh_b.load(Ordering::Relaxed);
    proxy.cut().await;
    let cut = std::time::Instant::now();
    // Every key is served again, by b; b's go on, and a's too with standbys.
    for (n, owner) in owners.iter().enumerate() {
        let answer = add(&client, &key(n)).await.unwrap();
        assert_eq!(answer.worker, "b", "key {n}");
        let expected = if owner == "a" && !standby {
            1
        } else {
            counts[n] + 1
        };
        assert_eq!(answer.count, expected, "key {n}, was {owner}'s");
    }
    let told_fresh = fresh_b.load(Ordering::Relaxed) > before;
    assert_eq!(
        told_fresh, !standby,
        "b took a's partitions fresh: {told_fresh}"
    );
    // Re-homed within the member timeout, a heartbeat to notice, and the gate's resend
    // back-off (at most 400 ms): docs/workers.md, "Crashes"; plus a second for a busy
    // machine and the twelve requests themselves.
    let config = worker_config(bus.url()).keyed;
    let bound = config.keyed_member_timeout
        + config.keyed_heartbeat
        + Duration::from_millis(400)
        + Duration::from_secs(1);
    assert!(cut.elapsed() < bound, "re-homed in {:?}", cut.elapsed());
}

/// A player of the arena: logged in (chat), joined to `name`.
async fn player(gate: &TestGate, uid: &str, name: &str) -> Client {
    let client = gate.client().await;
    let login = LoginRequest { name: uid.into() }.encode_to_vec();
    assert_eq!(
        client.request("chat.login", login).await.unwrap().code,
        code::OK
    );
    let join = JoinRequest {
        r#match: name.into(),
    };
    let joined = client
        .request_keyed("arena.join", name, join.encode_to_vec())
        .await
        .unwrap();
    assert_eq!(joined.code, code::OK, "{}", joined.message);
    client
}

async fn an_arena_match_moves_twice_under_inputs_without_losing_a_move_or_a_tick(bus: Bus) {
    const INPUTS: usize = 60;
    let _chat =
        common::start_worker(bus.url(), services::chat::service(), Default::default()).await;
    let a = start_worker_with(services::arena::service(), worker_config(bus.url())).await;
    let gate = gate_for(&bus, &["arena", "chat"]).await;
    let ann = player(&gate, "ann", "m1").await;
    let mut states = ann.pushes().unwrap();
    let bob = player(&gate, "bob", "m1").await;
    // Inputs every 10 ms, each sent without waiting for the one before.
    let send_inputs = |client: Client, (dx, dy): (i32, i32)| {
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for _ in 0..INPUTS {
                let client = client.clone();
                let body = InputRequest { dx, dy }.encode_to_vec();
                sent.push(tokio::spawn(async move {
                    client.request("arena.input", body).await
                }));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for input in sent {
                let answer = input.await.unwrap().unwrap();
                assert_eq!(answer.code, code::OK, "{}", answer.message);
            }
            client
        })
    };
    let inputs = [send_inputs(ann, (1, 2)), send_inputs(bob, (-1, 0))];
    // Meanwhile: a second worker takes its share (maybe the match), then the first
    // drains (the match surely moves).
    tokio::time::sleep(Duration::from_millis(150)).await;
    let _b = start_worker_with(services::arena::service(), worker_config(bus.url())).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.stop().await;
    let mut players = Vec::new();
    for input in inputs {
        players.push(within(input).await.unwrap());
    }
    // Every move counted once: the positions are the sums of the inputs.
    let n = INPUTS as i64;
    for (client, expected) in players.iter().zip([(n, 2 * n), (-n, 0)]) {
        let body = InputRequest { dx: 0, dy: 0 }.encode_to_vec();
        let at = client.request("arena.input", body).await.unwrap();
        let at = InputResponse::decode(at.body).unwrap();
        assert_eq!((at.x, at.y), expected);
    }
    // The match's ticks, as a player saw them: one more each push, across both moves.
    let mut ticks = Vec::new();
    while let Some(push) = states.try_recv() {
        if push.route == "arena.state" {
            ticks.push(State::decode(push.body).unwrap().tick);
        }
    }
    assert!(ticks.len() > 10, "{} state pushes", ticks.len());
    assert!(
        ticks.windows(2).all(|w| w[1] == w[0] + 1),
        "ticks go on one by one: {ticks:?}"
    );
}
