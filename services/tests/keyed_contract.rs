//! What docs/workers.md ("Keyed services") promises a worker in any language about the
//! keyed subjects and about leaving, checked against the Rust keyed worker with peers
//! played by hand on the bus:
//!
//! - a plain worker that follows "Serving requests" (`<prefix>.svc.<service>.>` in the
//!   queue group) beside a keyed service's owner never receives a keyed request, so each
//!   is answered once, by its partition's owner;
//! - a drained worker, Rust or any other whose last heartbeat says leaving with nothing
//!   held, is never counted dead by its peers: it left.
//!
//! On our broker and on nats-server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Bus, BusExt, Requester, metric, within};
use futures::{FutureExt, StreamExt};
use proto::Message;
use proto::code;
use proto::keyed::{members_subject, partition_of, partition_subject};
use proto::rpc::{KeyedMember, RpcRequest};
use services::tally::{NAME, PARTITIONS};
use services::{KeyedConfig, WorkerConfig};
use tokio::sync::Mutex;

broker::on_both_buses!(
    a_plain_workers_wildcard_never_receives_a_keyed_request,
    a_drained_worker_is_never_counted_dead,
    a_peer_whose_last_heartbeat_leaves_holding_nothing_is_not_counted_dead,
);

const PREFIX: &str = "shaddock";
const HEARTBEAT: Duration = Duration::from_millis(50);
const MEMBER_TIMEOUT: Duration = Duration::from_millis(300);
const DEAD: &str = "worker_keyed_peers_dead_total";
const LEFT: &str = "worker_keyed_peers_left_total";

/// One test at a time reading the binary's metrics.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// The tally worker `name`, with short heartbeats and member timeout.
async fn tally(bus: &Bus, name: &str) -> common::RunningWorker {
    let config = WorkerConfig {
        keyed: KeyedConfig {
            keyed_heartbeat: HEARTBEAT,
            keyed_member_timeout: MEMBER_TIMEOUT,
            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    };
    bus.worker(services::tally::service(name, Arc::default()), config)
        .await
}

/// A key of each partition.
fn a_key_per_partition() -> Vec<String> {
    (0..PARTITIONS)
        .map(|partition| {
            (0..)
                .map(|n| format!("k{n}"))
                .find(|k| partition_of(k.as_bytes(), PARTITIONS) == partition)
                .unwrap()
        })
        .collect()
}

/// `tally.add` for `key`, as a gate sends it.
fn add(key: &str, seq: u64) -> bytes::Bytes {
    RpcRequest {
        route: "tally.add".into(),
        key: key.into(),
        origin: "test.gw.g1.1".into(),
        seq,
        ..RpcRequest::default()
    }
    .encode_to_vec()
    .into()
}

/// A worker of another language, written from "Serving requests", joins the queue group
/// of a keyed service with the wildcard the checklist gives; the keyed worker holds every
/// partition. Each keyed request, published as a gate publishes it, reaches the owner
/// alone and is answered once: with keyed subjects under `<prefix>.svc.<service>.`, every
/// one also reached the plain worker (and a second, 503 answer went back).
async fn a_plain_workers_wildcard_never_receives_a_keyed_request(bus: Bus) {
    let plain = bus.client().await;
    let wildcard = format!("{PREFIX}.svc.{NAME}.>");
    let mut caught = plain
        .queue_subscribe(wildcard, NAME.to_owned())
        .await
        .unwrap();
    let mut barrier = plain.subscribe("test.barrier").await.unwrap();
    within(plain.flush()).await.unwrap();
    let worker = tally(&bus, "owner").await;
    let mut held = worker.0.held().expect("a keyed worker");
    assert!(within(held.at_least(PARTITIONS as usize)).await);

    let client = bus.client().await;
    let mut requests = Requester::new(client.clone()).await;
    let keys = a_key_per_partition();
    for (n, key) in (1..).zip(&keys) {
        let partition = partition_of(key.as_bytes(), PARTITIONS);
        let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
        requests.send(&subject, n, add(key, n.into())).await;
    }
    let answers = requests.codes(keys.len()).await;
    let expected: Vec<(u32, u32)> = (1..).zip(&keys).map(|(n, _)| (n, code::OK)).collect();
    assert_eq!(answers, expected, "each answered once, 200, by the owner");
    // The plain worker's connection gets one publisher's messages in order: once the
    // barrier, published after every request, is there, a request it caught would be too.
    client.publish("test.barrier", "".into()).await.unwrap();
    within(barrier.next()).await.unwrap();
    if let Some(Some(message)) = caught.next().now_or_never() {
        panic!(
            "a plain worker's wildcard caught a keyed request on {}",
            message.subject
        );
    }
    worker.stop().await;
}

/// Waits until a peer is forgotten, dead or left, beyond the counts before.
async fn a_peer_forgotten(dead_before: f64, left_before: f64) {
    within(async {
        while metric(DEAD) + metric(LEFT) < dead_before + left_before + 1.0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Two workers share the partitions; one is drained (SIGTERM): it hands its partitions
/// over and says it leaves, holding nothing, in its last heartbeat. Its peer forgets it
/// after the member timeout as a worker that left, not one that died.
async fn a_drained_worker_is_never_counted_dead(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (dead_before, left_before) = (metric(DEAD), metric(LEFT));
    let stays = tally(&bus, "stays").await;
    let mut held = stays.0.held().expect("a keyed worker");
    assert!(within(held.at_least(PARTITIONS as usize)).await);
    let drained = tally(&bus, "drained").await;
    let mut share = drained.0.held().expect("a keyed worker");
    assert!(
        within(share.at_least(1)).await,
        "the second worker takes a share"
    );
    drained.stop().await;
    assert!(within(held.at_least(PARTITIONS as usize)).await);
    a_peer_forgotten(dead_before, left_before).await;
    assert_eq!(
        (metric(DEAD), metric(LEFT)),
        (dead_before, left_before + 1.0),
        "the drained worker left; it did not die"
    );
    stays.stop().await;
}

/// A worker of another language joins holding nothing, then drains: it says leaving in
/// every heartbeat from then on, the last one holding nothing, and stops. The Rust
/// worker counts it left, not dead.
async fn a_peer_whose_last_heartbeat_leaves_holding_nothing_is_not_counted_dead(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (dead_before, left_before) = (metric(DEAD), metric(LEFT));
    let worker = tally(&bus, "rust").await;
    let peer = bus.client().await;
    let say = async |leaving: bool| {
        let me = KeyedMember {
            id: "0123456789abcdef".into(),
            held: Vec::new(),
            leaving,
        };
        let subject = members_subject(PREFIX, NAME);
        peer.publish(subject, me.encode_to_vec().into())
            .await
            .unwrap();
        within(peer.flush()).await.unwrap();
    };
    say(false).await;
    say(true).await;
    a_peer_forgotten(dead_before, left_before).await;
    assert_eq!(
        (metric(DEAD), metric(LEFT)),
        (dead_before, left_before + 1.0),
        "a peer that said it left, holding nothing, is not dead"
    );
    worker.stop().await;
}
