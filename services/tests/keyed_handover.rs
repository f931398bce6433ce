//! A keyed worker taking a partition handed to it, the old owner played by hand on the
//! bus exactly as docs/workers.md ("Hand-over") says a worker in any language does it:
//! its heartbeats, the prepare, requests numbered by origin and seq, the state with
//! `seen`. What the new owner does with what it held is checked answer by answer: the
//! requests `seen` covers are not run again, those past `--handover-buffer` are dropped
//! (and counted), the rest run after the state, in order; a state sent again is taken
//! once. And a keyed worker handing a partition over, the new owner played by hand: a
//! state answered late is sent again, the partition never taken back while its new owner
//! lives. On our broker and on nats-server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Bus, BusExt, Requester, metric, within};
use futures::StreamExt;
use proto::Message;
use proto::code;
use proto::keyed::{handover_subject, members_subject, partition_of, partition_subject, score};
use proto::rpc::{HandOver, KeyedMember, RpcRequest, RpcResponse};
use services::tally::{NAME, PARTITIONS};
use services::{KeyedConfig, WorkerConfig};
use tokio::sync::Mutex;

broker::on_every_bus!(
    a_new_owner_serves_what_it_held_past_seen_within_its_buffer,
    a_request_the_old_owner_took_is_dropped_even_after_the_state,
    a_partition_held_by_both_is_settled_by_the_state_handed_over,
    a_state_sent_again_is_taken_once,
    a_state_answered_late_is_sent_again_and_the_old_owner_never_serves_it_again,
    a_state_never_answered_is_taken_back_once_its_new_owner_is_dead,
    a_worker_busy_past_the_member_timeout_counts_no_live_peer_dead,
);

const PREFIX: &str = "shaddock";
const HEARTBEAT: Duration = Duration::from_millis(100);
/// The new owner's `--handover-buffer`: the third request held is one too many.
const BUFFER: usize = 2;
/// The old owner's `--handover-timeout`, short: the made-up new owner answers later.
const HANDOVER_TIMEOUT: Duration = Duration::from_millis(300);

/// One test at a time reading the binary's metrics ([`metric`]).
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// `worker_handover_overflow_total` so far.
fn overflowed() -> u64 {
    metric("worker_handover_overflow_total") as u64
}

/// A client, its subscription to the heartbeats, and the made-up old owner heartbeating
/// through it ([`old_owner_heartbeats`]).
async fn old_owner_beside(
    bus: &Bus,
) -> (
    async_nats::Client,
    async_nats::Subscriber,
    tokio::task::JoinHandle<()>,
) {
    let client = bus.client().await;
    let members = client
        .subscribe(members_subject(PREFIX, NAME))
        .await
        .unwrap();
    let heartbeats = old_owner_heartbeats(client.clone());
    (client, members, heartbeats)
}

/// Publishes the made-up old owner's heartbeat every [`HEARTBEAT`]: it holds every
/// partition and is leaving, so the worker takes none fresh and owns them all.
fn old_owner_heartbeats(client: async_nats::Client) -> tokio::task::JoinHandle<()> {
    let payload = old_owner_heartbeat();
    tokio::spawn(async move {
        loop {
            let subject = members_subject(PREFIX, NAME);
            let _ = client.publish(subject, payload.clone()).await;
            tokio::time::sleep(HEARTBEAT).await;
        }
    })
}

/// The made-up old owner's heartbeat.
fn old_owner_heartbeat() -> bytes::Bytes {
    let me = KeyedMember {
        id: "old".into(),
        held: (0..PARTITIONS).collect(),
        leaving: true,
    };
    me.encode_to_vec().into()
}

/// Asks the worker `to` on its hand-over subject; its answer's body (empty: done).
async fn ask(client: &async_nats::Client, to: &str, handover: HandOver) -> bytes::Bytes {
    let subject = handover_subject(PREFIX, NAME, to);
    let asked = client.request(subject, handover.encode_to_vec().into());
    within(asked).await.unwrap().payload
}

/// The made-up old owner's prepare of `partition`.
fn prepare(partition: u32) -> HandOver {
    HandOver {
        partition,
        from: "old".into(),
        prepare: true,
        ..HandOver::default()
    }
}

/// The made-up old owner's state of `partition`: key `k` counted 10, and `seen`.
fn state(partition: u32, seen: &[(&str, u64)]) -> HandOver {
    HandOver {
        partition,
        from: "old".into(),
        state: "k=10\n".into(),
        seen: seen.iter().map(|&(o, n)| (o.to_owned(), n)).collect(),
        ..HandOver::default()
    }
}

/// `tally.add` for key `k`, request `seq` of origin `o`.
fn add(seq: u64) -> bytes::Bytes {
    RpcRequest {
        route: "tally.add".into(),
        key: "k".into(),
        origin: "o".into(),
        seq,
        ..RpcRequest::default()
    }
    .encode_to_vec()
    .into()
}

/// The tally worker "new" with a short heartbeat and `--handover-buffer` [`BUFFER`].
async fn new_owner(bus: &Bus) -> common::RunningWorker {
    let config = WorkerConfig {
        keyed: KeyedConfig {
            keyed_heartbeat: HEARTBEAT,
            keyed_member_timeout: HEARTBEAT * 5,
            handover_buffer: BUFFER,
            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    };
    let fresh = Arc::default();
    bus.worker(services::tally::service("new", fresh), config)
        .await
}

/// The id the first heartbeat on `members` other than the made-up old owner's gives.
async fn id_of_worker(members: &mut async_nats::Subscriber) -> String {
    within(async {
        loop {
            let message = members.next().await.unwrap();
            let member = KeyedMember::decode(message.payload).unwrap();
            if member.id != "old" {
                return member.id;
            }
        }
    })
    .await
}

/// Two views disagreed, and both workers took a partition: the one that is not its
/// owner hands it over, and the owner, holding it already, takes the prepare as it is
/// and the state in place of its own, instead of refusing and leaving both acting on it.
async fn a_partition_held_by_both_is_settled_by_the_state_handed_over(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let client = bus.client().await;
    let mut members = client
        .subscribe(members_subject(PREFIX, NAME))
        .await
        .unwrap();
    let worker = new_owner(&bus).await;
    let mut held = worker.0.held().expect("a keyed worker");
    assert!(within(held.at_least(PARTITIONS as usize)).await);
    let new_id = id_of_worker(&mut members).await;
    let partition = partition_of(b"k", PARTITIONS);
    assert_eq!(
        ask(&client, &new_id, prepare(partition)).await,
        "",
        "held: taken as it is"
    );
    assert_eq!(ask(&client, &new_id, state(partition, &[])).await, "");
    let mut requests = Requester::new(client.clone()).await;
    let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
    requests.send(&subject, 1, add(1)).await;
    let (_, response) = requests.next().await;
    assert_eq!(
        &response.body[..],
        b"new 11",
        "the count handed over goes on"
    );
    worker.stop().await;
}

async fn a_new_owner_serves_what_it_held_past_seen_within_its_buffer(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let overflowed_before = overflowed();
    let (client, mut members, heartbeats) = old_owner_beside(&bus).await;
    let worker = new_owner(&bus).await;
    let new_id = id_of_worker(&mut members).await;

    // 1. Prepare: the new owner subscribes the partition and holds what comes.
    let partition = partition_of(b"k", PARTITIONS);
    assert_eq!(ask(&client, &new_id, prepare(partition)).await, "");
    assert_eq!(
        ask(&client, &new_id, prepare(partition)).await,
        "refused",
        "a second prepare of the same partition is refused"
    );
    // Three requests while the state is on its way: two held, the third one too many.
    let mut requests = Requester::new(client.clone()).await;
    let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
    for seq in 1..=3 {
        requests.send(&subject, seq, add(seq.into())).await;
    }
    within(async {
        while overflowed() < overflowed_before + 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    // 2. The state (k counted 10 by the old owner, which took request 1 too).
    let handed = state(partition, &[("o", 1)]);
    assert_eq!(ask(&client, &new_id, handed).await, "");
    requests.send(&subject, 4, add(4)).await;
    let mut answers = Vec::new();
    while answers.last().map(|(n, _)| *n) != Some(4) {
        let (n, response) = requests.next().await;
        assert_eq!(response.code, code::OK, "{response:?}");
        answers.push((n, String::from_utf8_lossy(&response.body).into_owned()));
    }
    assert_eq!(
        answers,
        [(2, "new 11".to_owned()), (4, "new 12".to_owned())],
        "1 was the old owner's (seen), 3 past the buffer: neither runs here"
    );
    assert_eq!(overflowed(), overflowed_before + 1);
    heartbeats.abort();
    worker.stop().await;
}

/// A request the old owner took (`seen` covers it) that the new owner reads only after
/// the state is dropped, not run again: no order holds between a worker's subscriptions
/// (nats-py runs each one's callbacks in a task of its own; the Rust worker's partition
/// and hand-over streams are polled in either order), so the state may overtake it.
async fn a_request_the_old_owner_took_is_dropped_even_after_the_state(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (client, mut members, heartbeats) = old_owner_beside(&bus).await;
    let worker = new_owner(&bus).await;
    let new_id = id_of_worker(&mut members).await;
    let partition = partition_of(b"k", PARTITIONS);
    assert_eq!(ask(&client, &new_id, prepare(partition)).await, "");
    let handed = state(partition, &[("o", 2)]);
    assert_eq!(ask(&client, &new_id, handed).await, "");
    let mut requests = Requester::new(client.clone()).await;
    let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
    for seq in 1..=3 {
        requests.send(&subject, seq, add(seq.into())).await;
    }
    let (n, response) = requests.next().await;
    assert_eq!(
        (n, String::from_utf8_lossy(&response.body).into_owned()),
        (3, "new 11".to_owned()),
        "1 and 2 were the old owner's (seen): neither runs here"
    );
    heartbeats.abort();
    worker.stop().await;
}

/// A hand-over's state sent again (its answer lost or late, docs/workers.md step 5) is
/// answered taken and changes nothing: the count taken the first time goes on, not
/// reset to the state sent again.
async fn a_state_sent_again_is_taken_once(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (client, mut members, heartbeats) = old_owner_beside(&bus).await;
    let worker = new_owner(&bus).await;
    let new_id = id_of_worker(&mut members).await;
    let partition = partition_of(b"k", PARTITIONS);
    let named = |handover: HandOver| HandOver { id: 7, ..handover };
    assert_eq!(ask(&client, &new_id, named(prepare(partition))).await, "");
    let handed = named(state(partition, &[]));
    assert_eq!(ask(&client, &new_id, handed.clone()).await, "");
    let mut requests = Requester::new(client.clone()).await;
    let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
    requests.send(&subject, 1, add(1)).await;
    assert_eq!(&requests.next().await.1.body[..], b"new 11");
    assert_eq!(
        ask(&client, &new_id, handed).await,
        "",
        "the same state again: taken already"
    );
    requests.send(&subject, 2, add(2)).await;
    assert_eq!(
        &requests.next().await.1.body[..],
        b"new 12",
        "the count goes on, not replaced by the state sent again"
    );
    heartbeats.abort();
    worker.stop().await;
}

/// A made-up new owner: says every [`HEARTBEAT`] that it lives and holds nothing, and
/// leaves every hand-over request it gets to the test, to answer (or not) as it pleases.
struct NewOwner {
    handovers: async_nats::Subscriber,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl NewOwner {
    /// Joins as `id`.
    async fn start(client: &async_nats::Client, id: &str) -> NewOwner {
        let handovers = client
            .subscribe(handover_subject(PREFIX, NAME, id))
            .await
            .unwrap();
        within(client.flush()).await.unwrap();
        let me = KeyedMember {
            id: id.into(),
            ..KeyedMember::default()
        };
        let payload: bytes::Bytes = me.encode_to_vec().into();
        let client = client.clone();
        let heartbeats = tokio::spawn(async move {
            loop {
                let _ = (client.publish(members_subject(PREFIX, NAME), payload.clone())).await;
                tokio::time::sleep(HEARTBEAT).await;
            }
        });
        NewOwner {
            handovers,
            heartbeats,
        }
    }

    /// The next hand-over request for `partition`, and where to answer it; those for
    /// other partitions are answered taken meanwhile (they are not under test).
    async fn next_for(
        &mut self,
        client: &async_nats::Client,
        partition: u32,
    ) -> (HandOver, async_nats::Subject) {
        within(async {
            loop {
                let message = self.handovers.next().await.unwrap();
                let reply = message.reply.unwrap();
                let handover = HandOver::decode(message.payload).unwrap();
                if handover.partition == partition {
                    return (handover, reply);
                }
                client.publish(reply, bytes::Bytes::new()).await.unwrap();
            }
        })
        .await
    }
}

/// The tally worker "old", alone at first (it takes every partition fresh), with a short
/// `--handover-timeout`; and its id.
async fn old_owner(
    bus: &Bus,
    members: &mut async_nats::Subscriber,
) -> (common::RunningWorker, String) {
    let config = WorkerConfig {
        keyed: KeyedConfig {
            keyed_heartbeat: HEARTBEAT,
            keyed_member_timeout: HEARTBEAT * 5,
            handover_timeout: HANDOVER_TIMEOUT,
            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = bus
        .worker(services::tally::service("old", Arc::default()), config)
        .await;
    let mut held = worker.0.held().expect("a keyed worker");
    assert!(within(held.at_least(PARTITIONS as usize)).await);
    let id = id_of_worker(members).await;
    (worker, id)
}

/// The answer to `request` on `subject`, sent again while nobody serves it, as a gate
/// does (a worker's subscription may not be at the bus yet, or a partition is between
/// owners).
async fn served(client: &async_nats::Client, subject: &str, request: bytes::Bytes) -> RpcResponse {
    within(async {
        loop {
            match client.request(subject.to_owned(), request.clone()).await {
                Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answer => return RpcResponse::decode(answer.unwrap().payload).unwrap(),
            }
        }
    })
    .await
}

/// The old owner serving key `k` ("old 1"), a made-up new owner whose id wins `k`'s
/// partition, the prepare answered, and the state received there, not answered.
struct Handing {
    client: async_nats::Client,
    worker: common::RunningWorker,
    /// `k`'s partition's `add` subject.
    subject: String,
    partition: u32,
    new: NewOwner,
    /// The state as first sent.
    first: HandOver,
}

async fn handing_to_a_made_up_owner(bus: &Bus) -> Handing {
    let client = bus.client().await;
    let mut members = client
        .subscribe(members_subject(PREFIX, NAME))
        .await
        .unwrap();
    let (worker, old_id) = old_owner(bus, &mut members).await;
    let partition = partition_of(b"k", PARTITIONS);
    let subject = format!("{}.add", partition_subject(PREFIX, NAME, partition));
    assert_eq!(&served(&client, &subject, add(1)).await.body[..], b"old 1");
    let new_id = (0..)
        .map(|n| format!("f{n:015x}"))
        .find(|id| score(id, partition) > score(&old_id, partition))
        .unwrap();
    let mut new = NewOwner::start(&client, &new_id).await;
    let (prepared, reply) = new.next_for(&client, partition).await;
    assert!(prepared.prepare);
    client.publish(reply, bytes::Bytes::new()).await.unwrap();
    let (first, _unanswered) = new.next_for(&client, partition).await;
    assert!(!first.prepare);
    Handing {
        client,
        worker,
        subject,
        partition,
        new,
        first,
    }
}

/// A new owner joins, and takes the state of key `k`'s partition, but its answer comes
/// after the old owner's hand-over timeout (a busy machine). The old owner must not take
/// the partition back and serve it (the new owner serves it now, from the state it
/// took: one request would run on both, and the two counts part); it sends the same
/// state again, and is done once that is answered.
async fn a_state_answered_late_is_sent_again_and_the_old_owner_never_serves_it_again(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Handing {
        client,
        worker,
        subject,
        partition,
        mut new,
        first,
    } = handing_to_a_made_up_owner(&bus).await;
    // The state was taken there (this made-up owner holds it now), but not answered in
    // time.
    assert_eq!(&first.state[..], b"k=1\n");
    // What the old owner does once its hand-over timeout is past, left unanswered while
    // the partition is asked.
    let (second, reply) = new.next_for(&client, partition).await;
    if let Ok(answer) = within(client.request(subject.clone(), add(2))).await {
        let answer = RpcResponse::decode(answer.payload).unwrap();
        panic!(
            "the old owner took back a partition whose state its new owner took, and \
             served it: {:?} (then it sent {second:?})",
            String::from_utf8_lossy(&answer.body)
        );
    }
    assert!(
        !second.prepare,
        "the state again, not a new hand-over: {second:?}"
    );
    assert_eq!(second, first, "the same hand-over, the same state and seen");
    client.publish(reply, bytes::Bytes::new()).await.unwrap();
    // Nobody answers the partition's requests: the old owner left it, and this new owner is
    // made up.
    let asked = within(client.request(subject, add(3))).await;
    assert!(asked.is_err(), "{asked:?}");
    new.heartbeats.abort();
    worker.stop().await;
}

/// A new owner dies with the state unanswered: once the old owner counts it dead, the
/// old owner takes the partition back with its state, and the count goes on there.
async fn a_state_never_answered_is_taken_back_once_its_new_owner_is_dead(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Handing {
        client,
        worker,
        subject,
        new,
        ..
    } = handing_to_a_made_up_owner(&bus).await;
    new.heartbeats.abort();
    assert_eq!(
        &served(&client, &subject, add(2)).await.body[..],
        b"old 2",
        "taken back with its count"
    );
    worker.stop().await;
}

/// A keyed worker busy for longer than the member timeout (its loop held, its queue
/// full, a take-over waiting for room there, and the partition's held requests behind
/// it filling the channel to the loop) hears the heartbeats that came meanwhile before it
/// counts anyone dead: the made-up old owner, heartbeating all along, is never counted
/// dead. (Counting it dead would make the worker take its partitions fresh while it
/// lives.)
async fn a_worker_busy_past_the_member_timeout_counts_no_live_peer_dead(bus: Bus) {
    const MEMBER_TIMEOUT: Duration = Duration::from_millis(250);
    /// More than the channel from the partitions to the loop holds (1,024).
    const HELD: usize = 1_100;
    let _alone = ONE_AT_A_TIME.lock().await;
    let dead_before = metric("worker_keyed_peers_dead_total");
    let (client, mut members, heartbeats) = old_owner_beside(&bus).await;
    let (service, mut blocker) = common::blocking_service(NAME);
    let config = WorkerConfig {
        frames: services::FrameConfig {
            queue_capacity: 1,
            ..services::FrameConfig::default()
        },
        keyed: KeyedConfig {
            // Its own heartbeats, many, come in between the old owner's (every
            // HEARTBEAT): a tick has many chances to come before the first of those.
            keyed_heartbeat: Duration::from_millis(5),
            keyed_member_timeout: MEMBER_TIMEOUT,
            handover_buffer: 2 * HELD,
            ..KeyedConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = bus.worker(service.keyed(PARTITIONS), config).await;
    let id = id_of_worker(&mut members).await;
    let call = |method: &str, key: &str| -> bytes::Bytes {
        let request = RpcRequest {
            route: format!("{NAME}.{method}"),
            key: key.into(),
            ..RpcRequest::default()
        };
        request.encode_to_vec().into()
    };
    let on = |partition: u32, method: &str| {
        format!("{}.{method}", partition_subject(PREFIX, NAME, partition))
    };
    let key_in = |partition: u32| {
        (0..)
            .map(|n| format!("k{n}"))
            .find(|k| partition_of(k.as_bytes(), PARTITIONS) == partition)
            .unwrap()
    };

    // The worker hears the old owner before anything else here: its heartbeat goes
    // first on this connection, the prepare after it.
    let members_subject = members_subject(PREFIX, NAME);
    (client.publish(members_subject, old_owner_heartbeat()))
        .await
        .unwrap();

    // Partition 0 handed over; its loop held by `block`, the queue's one place taken.
    let (a, b) = (0, 1);
    assert_eq!(ask(&client, &id, prepare(a)).await, "");
    assert_eq!(ask(&client, &id, state(a, &[])).await, "");
    // The queue's one place is the take-over's until the loop runs it: a request
    // arriving before that is answered 503, and `block` would never start. A `fast`
    // answered 200 shows the loop past the take-over, the queue empty.
    within(async {
        loop {
            let answer = client.request(on(a, "fast"), call("fast", &key_in(a)));
            let answer = RpcResponse::decode(answer.await.unwrap().payload).unwrap();
            if answer.code == code::OK {
                break;
            }
            assert_eq!(answer.code, code::UNAVAILABLE, "{answer:?}");
        }
    })
    .await;
    (client.publish(on(a, "block"), call("block", &key_in(a))))
        .await
        .unwrap();
    blocker.started().await;
    (client.publish(on(a, "fast"), call("fast", &key_in(a))))
        .await
        .unwrap();
    within(async {
        while metric("worker_queue_depth") < 1.0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Partition 1 prepared, requests held for it, then its state: the take-over waits
    // for room in the queue, and the worker, sending on what it held, for room behind.
    assert_eq!(ask(&client, &id, prepare(b)).await, "");
    for _ in 0..HELD {
        (client.publish(on(b, "fast"), call("fast", &key_in(b))))
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    let (asking, to) = (client.clone(), id.clone());
    let handed = tokio::spawn(async move { ask(&asking, &to, state(b, &[])).await });
    // Busy three member timeouts, heartbeats coming in all along.
    tokio::time::sleep(MEMBER_TIMEOUT * 3).await;
    blocker.release();
    assert_eq!(handed.await.unwrap(), "", "the state was taken");
    // Its ticks come at once now, overdue: a few member timeouts for them to count.
    tokio::time::sleep(MEMBER_TIMEOUT * 2).await;
    assert_eq!(
        metric("worker_keyed_peers_dead_total"),
        dead_before,
        "a peer heartbeating all along was counted dead"
    );
    heartbeats.abort();
    worker.stop().await;
}
