//! A keyed service served by a Rust worker and a TypeScript worker together
//! (docs/workers.md, "Keyed services"), behind one gate, on our broker and on
//! nats-server. The service is `tally`, a count per key over 8 partitions: the Rust one
//! here (in-process, `services::Worker`) and the TypeScript one of `workers/ts`
//! (`src/tally.ts`, written with `@shaddock/worker`), which hand partitions to each
//! other with their counts in one text encoding, a `<key>=<count>\n` line per key.
//!
//! Each of 12 keys (covering every partition) is one client session's, which sends one
//! request at a time, so a key's answers must count 1, 2, 3, ... exactly: a lost
//! request or state, a request run twice, or two workers acting on one key at once all
//! break the sequence.
//!
//! - The two agree on owners: their heartbeats settle on each partition held by its
//!   rendezvous owner (the score of docs/workers.md, `proto::keyed::score`), both hold some,
//!   and while nothing changes each key is answered by that owner alone.
//! - The TypeScript worker stopped (SIGTERM) under load hands its partitions to the Rust
//!   one with their counts: every request is answered 200, no count lost or repeated,
//!   and the Rust worker took nothing fresh.
//! - A TypeScript worker started under load takes its share back from the Rust worker
//!   by hand-over, counts still exact; and when the Rust worker then leaves (its
//!   graceful stop) the TypeScript worker takes the rest with their counts. Neither
//!   took anything fresh after the start.
//! - Standbys (docs/workers.md, "Standbys"): the TypeScript worker SIGKILLed, the Rust
//!   one, its partitions' standby, takes them with their counts; and the Rust worker cut
//!   off the bus for good (its in-process stand-in for a crash), the TypeScript one takes
//!   its partitions with theirs. Each key counts on, nothing is taken fresh.
//!
//! Prerequisites: Node 20 with `npm ci` run in `workers/ts` (the test runs `npm run
//! build` there itself), and nats-server on PATH or in `$(go env GOPATH)/bin`.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/builds.rs"]
mod builds;
#[path = "common/worker.rs"]
mod worker;
use worker::RustWorker;
#[path = "common/gate.rs"]
mod gate;

use broker::testing::Bus;
use futures::StreamExt as _;
use gate::TestGate;
use nix::sys::signal::Signal;
use proto::Message as _;
use proto::code;
use proto::keyed::{first_in_order, members_subject, partition_of};
use proto::rpc::KeyedMember;
use sdk::Client;
use services::{KeyedConfig, WorkerConfig};
use testkit::{Cut, DEADLINE, Process, within, word_after};

const PREFIX: &str = "shaddock";
const SERVICE: &str = "tally";
/// As `TALLY_PARTITIONS` in `workers/ts/src/services/tally.ts`.
use services::tally::PARTITIONS;
const KEYS: usize = 12;
/// Requests each key sends one after the other before the load (the owners check).
const ROUNDS: u64 = 4;
/// Answers every key must get after each change, so each key is seen served after it.
const AFTER_CHANGE: usize = 4;
/// Fast keyed timings, the same for both workers.
const HEARTBEAT: Duration = Duration::from_millis(100);
const MEMBER_TIMEOUT: Duration = Duration::from_millis(500);
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(1);
/// TypeScript workers started in turn until the two workers split the partitions: with
/// random ids one may win all 8 (1 time in 128), which leaves nothing to check.
const SPLIT_ATTEMPTS: usize = 10;

broker::on_both_buses!(
    rust_and_ts_workers_serve_one_keyed_service,
    a_killed_ts_workers_partitions_go_on_on_its_rust_standby,
    a_lost_rust_workers_partitions_go_on_on_its_ts_standby,
);

/// A Rust worker and a TypeScript worker of tally, settled on owners, both holding
/// some partitions; a gate, and one client per key.
struct Pair {
    heard: Heard,
    rust: RustWorker,
    rust_id: String,
    /// Partitions the Rust worker took fresh.
    rust_fresh: Arc<AtomicUsize>,
    ts: TsWorker,
    ts_id: String,
    names: HashMap<String, &'static str>,
    _gate: TestGate,
    clients: Arc<Vec<Client>>,
    keys: Arc<Vec<String>>,
}

impl Pair {
    /// The Rust worker first (on `rust_url`, the bus or a hop to it): the only member,
    /// so its id is the first one heard. Then a TypeScript worker that wins some
    /// partitions, and not all.
    async fn start(url: &str, rust_url: &str) -> Pair {
        let built = builds::ts();
        let heard = Heard::listen(url).await;
        let rust_fresh = Arc::new(AtomicUsize::new(0));
        let rust = start_rust_worker(rust_url, rust_fresh.clone()).await;
        let rust_id = heard.first_id().await;
        let mut ts = None;
        for _ in 0..SPLIT_ATTEMPTS {
            let worker = TsWorker::start(built, url, "ts").await;
            let won = owned(&[&rust_id, &worker.id], &worker.id).len();
            if (1..PARTITIONS as usize).contains(&won) {
                ts = Some(worker);
                break;
            }
            // It wins all or nothing with this id: a new one, and a new id.
            worker.stop().await;
        }
        let ts = ts.expect("no TypeScript worker split the partitions with the Rust one");
        let ts_id = ts.id.clone();
        let names = HashMap::from([(rust_id.clone(), "rust"), (ts_id.clone(), "ts")]);
        heard.settled(&[&rust_id, &ts_id], &[]).await;

        let gate = TestGate::start(url, PREFIX).await;
        assert!(
            gate.gate.wait_for_schemas(&[SERVICE], DEADLINE).await,
            "the gate learnt that tally is keyed"
        );
        let mut clients = Vec::new();
        for _ in 0..KEYS {
            clients.push(gate.client(false).await);
        }
        Pair {
            heard,
            rust,
            rust_id,
            rust_fresh,
            ts,
            ts_id,
            names,
            _gate: gate,
            clients: Arc::new(clients),
            keys: Arc::new(keys()),
        }
    }

    /// Each key's next `rounds` answers, one request at a time per key, concurrently.
    async fn rounds(&self, rounds: u64) -> Vec<Vec<Result<Answer, String>>> {
        futures::future::join_all((0..KEYS).map(|n| async move {
            let mut answers = Vec::new();
            for _ in 0..rounds {
                answers.push(add(&self.clients[n], &self.keys[n]).await);
            }
            answers
        }))
        .await
    }

    /// (a) Nothing changes: each key is answered by its partition's owner alone,
    /// counting 1 to `ROUNDS`, and both workers own keys.
    async fn owners_answer(&self) {
        let members = [self.rust_id.as_str(), self.ts_id.as_str()];
        let mut used = BTreeSet::new();
        for (n, answers) in self.rounds(ROUNDS).await.iter().enumerate() {
            let owner = owner_name(&self.names, &members, &self.keys[n]);
            let want: Vec<Result<Answer, String>> = (1..=ROUNDS)
                .map(|count| {
                    let worker = owner.to_owned();
                    Ok(Answer { worker, count })
                })
                .collect();
            assert_eq!(*answers, want, "key {}", self.keys[n]);
            used.insert(owner);
        }
        assert_eq!(used, BTreeSet::from(["rust", "ts"]), "both own keys");
    }

    /// After a crash: every key answered by `survivor`, its count going on.
    async fn counts_go_on(&self, survivor: &str) {
        for (n, answers) in self.rounds(1).await.iter().enumerate() {
            let worker = survivor.to_owned();
            let want = vec![Ok(Answer {
                worker,
                count: ROUNDS + 1,
            })];
            assert_eq!(*answers, want, "key {}: the count goes on", self.keys[n]);
        }
    }
}

/// The TypeScript worker SIGKILLed: the Rust one, its partitions' standby, takes them
/// with the counts its replicas carry.
async fn a_killed_ts_workers_partitions_go_on_on_its_rust_standby(bus: Bus) {
    let mut pair = Pair::start(bus.url(), bus.url()).await;
    pair.owners_answer().await;
    let fresh = pair.rust_fresh.load(Ordering::Relaxed);
    pair.ts.kill().await;
    pair.heard.settled(&[&pair.rust_id], &[&pair.ts_id]).await;
    pair.counts_go_on("rust").await;
    assert_eq!(
        pair.rust_fresh.load(Ordering::Relaxed),
        fresh,
        "the Rust worker took the killed worker's partitions with their counts, none fresh"
    );
    pair.rust.stop().await;
}

/// The Rust worker cut off the bus for good (in process it cannot be SIGKILLed; for
/// its peers it is the same: its heartbeats stop, nothing is handed over): the
/// TypeScript one, its partitions' standby, takes them with their counts.
async fn a_lost_rust_workers_partitions_go_on_on_its_ts_standby(bus: Bus) {
    // A hop that refuses every connection once dropped: the Rust worker cannot reconnect.
    let hop = Cut::start(bus.addr()).await.unwrap();
    let pair = Pair::start(bus.url(), &format!("nats://{}", hop.addr)).await;
    pair.owners_answer().await;
    let rust_owned = owned(&[&pair.rust_id, &pair.ts_id], &pair.rust_id).len();
    hop.cut();
    drop(hop);
    pair.heard.settled(&[&pair.ts_id], &[&pair.rust_id]).await;
    pair.counts_go_on("ts").await;
    let last = pair.ts.stop().await;
    // Fresh it took at most its own, at the start (when it and the Rust worker began
    // together): none of the lost worker's.
    assert!(
        last.fresh <= PARTITIONS as usize - rust_owned,
        "{}",
        last.line
    );
    assert_eq!(
        (last.standby, last.rejected),
        (rust_owned, 0),
        "the TypeScript worker took the lost worker's {rust_owned} partitions with their replicas: {}",
        last.line
    );
    // The Rust worker, cut off, is left to the end of the test: it cannot drain.
    drop(pair.rust);
}

async fn rust_and_ts_workers_serve_one_keyed_service(bus: Bus) {
    let url = bus.url();
    let built = builds::ts();
    let Pair {
        heard,
        rust,
        rust_id,
        rust_fresh,
        ts,
        ts_id,
        mut names,
        _gate,
        clients,
        keys,
    } = {
        let pair = Pair::start(url, url).await;
        pair.owners_answer().await;
        pair
    };
    let rust_fresh_settled = rust_fresh.load(Ordering::Relaxed);
    let ts_owned = owned(&[&rust_id, &ts_id], &ts_id);

    // (b), (c) and (d), under one load: the TypeScript worker leaves, another comes, then
    // the Rust worker leaves.
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Arc<Vec<AtomicUsize>> =
        Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let load = tokio::spawn(load(
        clients.clone(),
        keys.clone(),
        stop.clone(),
        progress.clone(),
    ));
    served_more(&progress, AFTER_CHANGE).await;

    let left = ts.stop().await;
    assert_eq!(
        (left.handed_ok, left.rejected),
        (ts_owned.len(), 0),
        "the TypeScript worker handed each of its {} partitions over: {}",
        ts_owned.len(),
        left.line
    );
    heard.settled(&[&rust_id], &[]).await;
    served_more(&progress, AFTER_CHANGE).await;

    // A TypeScript worker that wins some partitions: one that would win none never
    // holds one, and is replaced without a trace.
    let mut ts2 = None;
    for _ in 0..SPLIT_ATTEMPTS {
        let worker = TsWorker::start(built, url, "ts2").await;
        if owned(&[&rust_id, &worker.id], &worker.id).is_empty() {
            worker.stop().await;
        } else {
            ts2 = Some(worker);
            break;
        }
    }
    let ts2 = ts2.expect("no second TypeScript worker won a partition");
    let ts2_id = ts2.id.clone();
    names.insert(ts2_id.clone(), "ts2");
    let ts2_owned = owned(&[&rust_id, &ts2_id], &ts2_id);
    heard.settled(&[&rust_id, &ts2_id], &[]).await;
    served_more(&progress, AFTER_CHANGE).await;

    // (d) The Rust worker leaves in turn: the TypeScript one takes its partitions.
    rust.stop().await;
    heard.settled(&[&ts2_id], &[]).await;
    served_more(&progress, AFTER_CHANGE).await;
    stop.store(true, Ordering::Relaxed);
    let answers = within(load).await.unwrap();

    // Every answer 200, each key counting on from the rounds without a gap or repeat,
    // served by its owner first, by the Rust worker once the TypeScript one left, by its
    // owner once the second TypeScript worker came, and by that one once the Rust worker
    // left: no other moves.
    for (n, answers) in answers.iter().enumerate() {
        let key = &keys[n];
        let mut stretches: Vec<&str> = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            let answer = answer
                .as_ref()
                .unwrap_or_else(|e| panic!("key {key}, request {i} of the load: {e}"));
            assert_eq!(
                answer.count,
                ROUNDS + i as u64 + 1,
                "key {key}, request {i} of the load: {answers:?}"
            );
            if stretches.last() != Some(&answer.worker.as_str()) {
                stretches.push(&answer.worker);
            }
        }
        let mut want = vec![
            owner_name(&names, &[&rust_id, &ts_id], key),
            "rust",
            owner_name(&names, &[&rust_id, &ts2_id], key),
            "ts2",
        ];
        want.dedup();
        assert_eq!(stretches, want, "key {key}: who answered, in turn");
    }
    assert_eq!(
        rust_fresh.load(Ordering::Relaxed),
        rust_fresh_settled,
        "the Rust worker took the TypeScript worker's partitions with their counts"
    );

    // The last worker: its partitions just drain.
    let last = ts2.stop().await;
    assert_eq!(
        (last.fresh, last.handed, last.rejected, last.handed_ok),
        (0, PARTITIONS as usize, 0, 0),
        "the second TypeScript worker took every partition with its counts, its {} from \
         the Rust worker as it came and the rest as the Rust worker left: {}",
        ts2_owned.len(),
        last.line
    );
    let total: usize = answers.iter().map(Vec::len).sum();
    eprintln!(
        "{total} requests under load; partitions of ts {ts_owned:?}, of ts2 {ts2_owned:?}; \
         ts: {}; ts2: {}",
        left.line, last.line
    );
}

/// The test's keys: one for each partition, then more, `KEYS` in all.
fn keys() -> Vec<String> {
    let key = |n: usize| format!("match-{n}");
    let mut covered = BTreeSet::new();
    let mut keys: Vec<String> = (0..)
        .map(key)
        .filter(|k| covered.insert(partition_of(k.as_bytes(), PARTITIONS)))
        .take(PARTITIONS as usize)
        .collect();
    let more: Vec<String> = (0..)
        .map(key)
        .filter(|k| !keys.contains(k))
        .take(KEYS - keys.len())
        .collect();
    keys.extend(more);
    keys
}

/// The owner of `partition` among `members`: the highest score, ties to the greater id.
fn rendezvous_owner<'a>(members: &[&'a str], partition: u32) -> &'a str {
    first_in_order(members.iter().copied(), partition).unwrap()
}

/// The name (in its answers) of the owner of `key`'s partition among `members`.
fn owner_name(names: &HashMap<String, &'static str>, members: &[&str], key: &str) -> &'static str {
    names[rendezvous_owner(members, partition_of(key.as_bytes(), PARTITIONS))]
}

/// The partitions `member` owns among `members`.
fn owned(members: &[&str], member: &str) -> Vec<u32> {
    (0..PARTITIONS)
        .filter(|&p| rendezvous_owner(members, p) == member)
        .collect()
}

/// Polls `condition` every 10 ms until it holds, within the deadline.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let held = tokio::time::timeout(DEADLINE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(held.is_ok(), "timed out waiting until {what}");
}

/// The workers' heartbeats, as the test hears them on the bus: the latest per id.
struct Heard {
    latest: Arc<Mutex<HashMap<String, KeyedMember>>>,
}

impl Heard {
    async fn listen(url: &str) -> Heard {
        let client = within(async_nats::connect(url)).await.unwrap();
        let mut heartbeats = client
            .subscribe(members_subject(PREFIX, SERVICE))
            .await
            .unwrap();
        within(client.flush()).await.unwrap();
        let latest: Arc<Mutex<HashMap<String, KeyedMember>>> = Arc::default();
        let keep = latest.clone();
        tokio::spawn(async move {
            let _client = client;
            while let Some(message) = heartbeats.next().await {
                let member = KeyedMember::decode(message.payload).unwrap();
                keep.lock().unwrap().insert(member.id.clone(), member);
            }
        });
        Heard { latest }
    }

    /// The id of the first member heard (the test starts one worker, then waits here).
    async fn first_id(&self) -> String {
        until("a keyed worker says its heartbeat", || {
            !self.latest.lock().unwrap().is_empty()
        })
        .await;
        let latest = self.latest.lock().unwrap();
        assert_eq!(latest.len(), 1, "one worker so far: {latest:?}");
        latest.keys().next().unwrap().clone()
    }

    /// Waits until `members` (and no one else) hold every partition, each the one its
    /// rendezvous owner among them holds, none leaving: the workers agree on owners.
    /// The last word of the `dead` (crashed: it still says what they held) is ignored.
    async fn settled(&self, members: &[&str], dead: &[&str]) {
        let what = format!("{members:?} hold every partition, each its owner's");
        until(&what, || {
            let latest = self.latest.lock().unwrap();
            let mut holders = HashMap::new();
            for (id, member) in latest.iter() {
                if dead.contains(&id.as_str()) {
                    continue;
                }
                let live = members.contains(&id.as_str());
                if !live && !member.held.is_empty() {
                    return false; // one gone still says it holds some
                }
                if live && member.leaving {
                    return false;
                }
                for &partition in &member.held {
                    if holders.insert(partition, id.as_str()).is_some() {
                        return false; // held twice: a move in progress
                    }
                }
            }
            (0..PARTITIONS).all(|p| holders.get(&p) == Some(&rendezvous_owner(members, p)))
        })
        .await;
    }
}

/// Waits until every key has had `more` answers beyond those it had on entry.
async fn served_more(progress: &[AtomicUsize], more: usize) {
    let from: Vec<usize> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    until("every key is answered again", || {
        progress
            .iter()
            .zip(&from)
            .all(|(p, from)| p.load(Ordering::Relaxed) >= from + more)
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
    let text = std::str::from_utf8(&response.body).map_err(|e| e.to_string())?;
    let (worker, count) = text
        .split_once(' ')
        .ok_or_else(|| format!("answer {text:?}"))?;
    Ok(Answer {
        worker: worker.to_owned(),
        count: count.parse().map_err(|_| format!("answer {text:?}"))?,
    })
}

/// Each key's answers, one request at a time from its own session, until `stop`;
/// `progress` counts them as they come.
async fn load(
    clients: Arc<Vec<Client>>,
    keys: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    progress: Arc<Vec<AtomicUsize>>,
) -> Vec<Vec<Result<Answer, String>>> {
    let tasks: Vec<_> = (0..KEYS)
        .map(|n| {
            let (clients, keys) = (clients.clone(), keys.clone());
            let (stop, progress) = (stop.clone(), progress.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(add(&clients[n], &keys[n]).await);
                    progress[n].fetch_add(1, Ordering::Relaxed);
                    // Pacing: about 150 requests a second per key.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.unwrap());
    }
    all
}

async fn start_rust_worker(url: &str, fresh: Arc<AtomicUsize>) -> RustWorker {
    let config = WorkerConfig {
        prefix: PREFIX.to_owned(),
        keyed: KeyedConfig {
            keyed_heartbeat: HEARTBEAT,
            keyed_member_timeout: MEMBER_TIMEOUT,
            handover_timeout: HANDOVER_TIMEOUT,

            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    };
    let service = services::tally::service("rust", fresh);
    RustWorker::start(url, "mixed-keyed-rust", service, config).await
}

/// A TypeScript tally worker process: killed when dropped, unless stopped.
struct TsWorker {
    process: Process,
    /// Its keyed id among its peers.
    id: String,
}

/// What a TypeScript tally worker says when it stops.
struct Stopped {
    rejected: usize,
    /// Partitions it took with no state, and with counts (handed over, or a replica).
    fresh: usize,
    handed: usize,
    /// Of those, partitions of a dead owner taken with the replica it held.
    standby: usize,
    /// Partitions it handed over.
    handed_ok: usize,
    /// The whole line.
    line: String,
}

impl TsWorker {
    /// Starts the worker answering as `name` and waits for its `Worker is ready` line.
    async fn start(built: &builds::Ts, url: &str, name: &str) -> TsWorker {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut command = Command::new(&built.node);
        command.arg(built.script("tally")).args([
            "--nats",
            url,
            "--prefix",
            PREFIX,
            "--name",
            name,
            "--keyed-heartbeat",
            &ms(HEARTBEAT),
            "--keyed-member-timeout",
            &ms(MEMBER_TIMEOUT),
            "--handover-timeout",
            &ms(HANDOVER_TIMEOUT),
        ]);
        let mut process = Process::spawn(&format!("the TypeScript tally worker {name}"), command);
        let ready = process.line("Worker is ready").await;
        let id = word_after(&ready, "id=").to_owned();
        assert_eq!(id.len(), 16, "a keyed id in {ready:?}");
        TsWorker { process, id }
    }

    /// SIGKILL: the worker dies at once, its partitions with it.
    async fn kill(&mut self) {
        self.process.signal(Signal::SIGKILL);
        self.process.exit().await;
    }

    /// SIGTERM: the worker hands its partitions over, drains and reports.
    async fn stop(mut self) -> Stopped {
        self.process.signal(Signal::SIGTERM);
        let line = self.process.line("Worker stopped:").await;
        let status = self.process.exit().await;
        assert!(status.success(), "{}: {status}", self.process.name());
        let field = |name: &str| -> usize {
            word_after(&line, &format!(" {name}="))
                .parse()
                .unwrap_or_else(|_| panic!("no {name} in {line:?}"))
        };
        Stopped {
            rejected: field("rejected"),
            fresh: field("fresh"),
            handed: field("handed"),
            standby: field("standby"),
            handed_ok: field("handed_ok"),
            line,
        }
    }
}
