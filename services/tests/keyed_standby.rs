//! Standbys (docs/workers.md, "Standbys"), the peer played by hand on the bus exactly as
//! the contract says a worker in any language does it. As an owner, the worker's answer
//! leaves only once its standby holds what the answer's frame changed; a standby that
//! does not answer costs one frame `--replica-timeout` and no more, and gets the
//! partition whole once it is back. As a standby, the worker keeps what an owner sends
//! and takes the partition with it when the owner dies; it refuses a replica it cannot
//! keep. On our broker, on nats-server, and in process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Bus, BusExt, metric, within};
use futures::StreamExt;
use proto::Message;
use proto::keyed::{
    first_in_order, members_subject, partition_of, partition_subject, replica_subject,
};
use proto::rpc::{KeyedMember, PartitionState, Replica, RpcRequest, RpcResponse};
use services::tally::{NAME, PARTITIONS};
use services::{KeyedConfig, WorkerConfig};
use tokio::sync::Mutex;
use tokio::time::Instant;

broker::on_every_bus!(
    an_answer_leaves_once_its_standby_holds_the_state,
    a_silent_standby_costs_one_frame_its_timeout_then_gets_the_partition_whole,
    a_dead_owners_partition_is_taken_with_the_replica_its_standby_held,
);

const PREFIX: &str = "shaddock";
const HEARTBEAT: Duration = Duration::from_millis(100);
/// The worker's `--replica-timeout` in these tests.
const REPLICA_TIMEOUT: Duration = Duration::from_millis(300);
/// The made-up peer's id.
const PEER: &str = "peer";
/// Workers started in turn until one splits the partitions with [`PEER`]
/// ([`worker_beside_peer`]); one in 128 does not, so ten in a row means something is
/// wrong.
const STARTS: usize = 10;

/// One test at a time reading the binary's metrics ([`metric`]).
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// The tally worker "w" with a short heartbeat and [`REPLICA_TIMEOUT`]; `rest` is its
/// keyed heartbeat (how long a failed standby is not waited for).
async fn worker(bus: &Bus, rest: Duration) -> common::RunningWorker {
    let config = WorkerConfig {
        keyed: KeyedConfig {
            keyed_heartbeat: rest,
            keyed_member_timeout: rest * 5,
            replica_timeout: REPLICA_TIMEOUT,
            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    };
    bus.worker(services::tally::service("w", Arc::default()), config)
        .await
}

/// Publishes the made-up peer's heartbeat (holding `held`, not leaving) every
/// [`HEARTBEAT`] until aborted.
fn heartbeats(client: async_nats::Client, held: Vec<u32>) -> tokio::task::JoinHandle<()> {
    let payload: bytes::Bytes = KeyedMember {
        id: PEER.into(),
        held,
        leaving: false,
    }
    .encode_to_vec()
    .into();
    tokio::spawn(async move {
        loop {
            let subject = members_subject(PREFIX, NAME);
            let _ = client.publish(subject, payload.clone()).await;
            tokio::time::sleep(HEARTBEAT).await;
        }
    })
}

/// A client, its subscriptions to the heartbeats and to the made-up peer's replicas,
/// and the peer heartbeating through it, live and holding nothing: the standby of the
/// partitions the worker will own.
async fn standby_beside(
    bus: &Bus,
) -> (
    async_nats::Client,
    async_nats::Subscriber,
    async_nats::Subscriber,
    tokio::task::JoinHandle<()>,
) {
    let client = bus.client().await;
    let subscribe = async |subject| client.subscribe(subject).await.unwrap();
    let members = subscribe(members_subject(PREFIX, NAME)).await;
    let replicas = subscribe(replica_subject(PREFIX, NAME, PEER)).await;
    let peer = heartbeats(client.clone(), Vec::new());
    (client, members, replicas, peer)
}

/// The worker "w" (as [`worker`]) and its id, from its first heartbeat on `members`.
/// Ids are random per start, and one worker in 128 would leave the made-up peer no
/// partition, or take none itself (rendezvous over tally's 8): the test would have no
/// key to send. Such a worker is stopped before it holds anything, and another started.
async fn worker_beside_peer(
    bus: &Bus,
    rest: Duration,
    members: &mut async_nats::Subscriber,
) -> (common::RunningWorker, String) {
    let mut stopped = Vec::new();
    for _ in 0..STARTS {
        let worker = worker(bus, rest).await;
        let id = within(async {
            loop {
                let message = members.next().await.unwrap();
                let member = KeyedMember::decode(message.payload).unwrap();
                if member.id != PEER && !stopped.contains(&member.id) {
                    return member.id;
                }
            }
        })
        .await;
        let won = (0..PARTITIONS)
            .filter(|&p| first_in_order([PEER, id.as_str()].into_iter(), p) == Some(&id))
            .count();
        if (1..PARTITIONS as usize).contains(&won) {
            return (worker, id);
        }
        worker.stop().await;
        stopped.push(id);
    }
    panic!("{STARTS} workers in a row left the peer or themselves no partition");
}

/// Waits for the made-up peer's next heartbeat on `members`, after the worker's first:
/// the broker had the worker's subscription then, so the worker hears the peer.
async fn until_peer_heard(members: &mut async_nats::Subscriber) {
    within(async {
        loop {
            let message = members.next().await.unwrap();
            if KeyedMember::decode(message.payload).unwrap().id == PEER {
                return;
            }
        }
    })
    .await;
}

/// A key whose partition `owner` wins over `other`, and that partition.
fn key_owned_by(owner: &str, other: &str) -> (String, u32) {
    (0..)
        .map(|n| format!("k{n}"))
        .map(|key| {
            let partition = partition_of(key.as_bytes(), PARTITIONS);
            (key, partition)
        })
        .find(|(_, p)| first_in_order([owner, other].into_iter(), *p) == Some(owner))
        .unwrap()
}

/// `tally.add` for `key`, as a gate sends it; the answer's body.
async fn add(client: &async_nats::Client, key: &str) -> String {
    let partition = partition_of(key.as_bytes(), PARTITIONS);
    let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
    let request = RpcRequest {
        route: "tally.add".into(),
        key: key.into(),
        ..RpcRequest::default()
    };
    let answer = within(client.request(subject, request.encode_to_vec().into()))
        .await
        .unwrap();
    let response = RpcResponse::decode(answer.payload).unwrap();
    String::from_utf8(response.body.to_vec()).unwrap()
}

/// Waits until the worker holds `partition` (its heartbeats on `members` say so).
async fn until_held(members: &mut async_nats::Subscriber, id: &str, partition: u32) {
    within(async {
        loop {
            let message = members.next().await.unwrap();
            let member = KeyedMember::decode(message.payload).unwrap();
            if member.id == id && member.held.contains(&partition) {
                return;
            }
        }
    })
    .await;
}

/// The made-up peer, live and holding nothing, is the standby of the partitions the
/// worker owns. It answers the first replica late: the request's answer comes after
/// that answer, never before, and the replica held the request's count.
async fn an_answer_leaves_once_its_standby_holds_the_state(bus: Bus) {
    let (client, mut members, mut replicas, peer) = standby_beside(&bus).await;
    let (_worker, id) = worker_beside_peer(&bus, HEARTBEAT, &mut members).await;
    until_peer_heard(&mut members).await;
    let (key, partition) = key_owned_by(&id, PEER);
    until_held(&mut members, &id, partition).await;
    // The take-over sends the partition whole first: held at once.
    let counted = format!("{key}=1\n");
    let standby = tokio::spawn(async move {
        let mut answered_at = None;
        loop {
            let message = replicas.next().await.unwrap();
            let replica = Replica::decode(message.payload.clone()).unwrap();
            assert_eq!(replica.from, id);
            let state = (replica.partitions.iter()).find(|s| s.partition == partition);
            if let Some(state) = state
                && state.state.as_ref() == counted.as_bytes()
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
                answered_at = Some(Instant::now());
            }
            let reply = message.reply.unwrap();
            client.publish(reply, bytes::Bytes::new()).await.unwrap();
            if let Some(at) = answered_at {
                return at;
            }
        }
    });
    let requester = bus.client().await;
    assert_eq!(add(&requester, &key).await, "w 1");
    let answered = Instant::now();
    let held_at = within(standby).await.unwrap();
    assert!(
        held_at <= answered,
        "the answer left {:?} before the standby held its state",
        held_at - answered
    );
    peer.abort();
}

/// The made-up standby never answers: the first request's frame waits its
/// `--replica-timeout` and no more, the partition is counted unreplicated, the next
/// request (within the rest) is answered without waiting; after the rest, the partition
/// is sent to the standby again whole, though nothing changed it.
async fn a_silent_standby_costs_one_frame_its_timeout_then_gets_the_partition_whole(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let rest = Duration::from_secs(1);
    let (_client, mut members, mut replicas, peer) = standby_beside(&bus).await;
    let failures = metric("worker_replica_failures_total");
    let (_worker, id) = worker_beside_peer(&bus, rest, &mut members).await;
    until_peer_heard(&mut members).await;
    let (key, partition) = key_owned_by(&id, PEER);
    until_held(&mut members, &id, partition).await;
    // Whatever the take-over sent has timed out: the standby rests.
    tokio::time::sleep(REPLICA_TIMEOUT * 2).await;
    let requester = bus.client().await;
    let started = Instant::now();
    assert_eq!(add(&requester, &key).await, "w 1");
    assert!(
        started.elapsed() < REPLICA_TIMEOUT,
        "a resting standby is not waited for: {:?}",
        started.elapsed()
    );
    assert!(metric("worker_replica_failures_total") > failures);
    within(async {
        while metric("worker_partitions_unreplicated") < 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // After the rest, the partition whole, with the count, without a request.
    within(async {
        loop {
            let message = replicas.next().await.unwrap();
            let replica = Replica::decode(message.payload).unwrap();
            let whole = (replica.partitions.iter()).any(|s| {
                s.partition == partition && s.state.as_ref() == format!("{key}=1\n").as_bytes()
            });
            if whole {
                return;
            }
        }
    })
    .await;
    // Still silent: one frame waits the timeout, once more.
    let started = Instant::now();
    assert_eq!(add(&requester, &key).await, "w 2");
    let waited = started.elapsed();
    assert!(waited < REPLICA_TIMEOUT * 3, "bounded: {waited:?}");
    peer.abort();
}

/// The made-up peer owns every partition and sends the worker, its standby, a replica of
/// one; a replica naming a partition out of range is refused. Then the peer dies: the
/// worker takes that partition with the replica (the count goes on) and the others fresh.
async fn a_dead_owners_partition_is_taken_with_the_replica_its_standby_held(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let client = bus.client().await;
    let mut members = client
        .subscribe(members_subject(PREFIX, NAME))
        .await
        .unwrap();
    let peer = heartbeats(client.clone(), (0..PARTITIONS).collect());
    let standby_takes = metric("worker_partitions_taken_total");
    let (_worker, id) = worker_beside_peer(&bus, HEARTBEAT, &mut members).await;
    until_peer_heard(&mut members).await;
    let (key, partition) = key_owned_by(PEER, &id);
    let (other, other_partition) = (0..)
        .map(|n| format!("o{n}"))
        .map(|k| {
            let p = partition_of(k.as_bytes(), PARTITIONS);
            (k, p)
        })
        .find(|(_, p)| *p != partition)
        .unwrap();
    let send = async |states: Vec<(u32, &str)>| {
        let replica = Replica {
            from: PEER.into(),
            seq: 1,
            partitions: (states.into_iter())
                .map(|(partition, state)| PartitionState {
                    partition,
                    state: state.as_bytes().to_vec().into(),
                })
                .collect(),
        };
        let subject = replica_subject(PREFIX, NAME, &id);
        let asked = client.request(subject, replica.encode_to_vec().into());
        within(asked).await.unwrap().payload
    };
    let refused = send(vec![(partition, "x=1\n"), (PARTITIONS, "y=1\n")]).await;
    let refused = String::from_utf8_lossy(&refused).into_owned();
    assert!(refused.contains("out of range"), "{refused}");
    let state = format!("{key}=10\n");
    assert!(send(vec![(partition, &state)]).await.is_empty(), "held");
    peer.abort();
    until_held(&mut members, &id, partition).await;
    let requester = bus.client().await;
    assert_eq!(
        add(&requester, &key).await,
        "w 11",
        "taken with the replica"
    );
    // The others after the adoption time (two heartbeats), fresh.
    until_held(&mut members, &id, other_partition).await;
    assert_eq!(add(&requester, &other).await, "w 1", "taken fresh");
    assert_ne!(partition, other_partition);
    assert!(metric("worker_partitions_taken_total") >= standby_takes + f64::from(PARTITIONS));
}
