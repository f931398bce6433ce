//! A keyed worker taking a partition handed to it, the old owner played by hand on the
//! bus exactly as docs/workers.md ("Hand-over") says a worker in any language does it:
//! its heartbeats, the prepare, requests numbered by origin and seq, the state with
//! `seen`. What the new owner does with what it held is checked answer by answer: the
//! requests `seen` covers are not run again, those past `--handover-buffer` are dropped
//! (and counted), the rest run after the state, in order. On our broker and on
//! nats-server.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use common::{Bus, BusExt, Requester, within};
use futures::StreamExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use proto::Message;
use proto::code;
use proto::keyed::{handover_subject, members_subject, partition_of, partition_subject};
use proto::rpc::{HandOver, KeyedMember, RpcRequest};
use services::tally::{NAME, PARTITIONS};
use services::{KeyedConfig, WorkerConfig};
use tokio::sync::Mutex;

broker::on_both_buses!(
    a_new_owner_serves_what_it_held_past_seen_within_its_buffer,
    a_partition_held_by_both_is_settled_by_the_state_handed_over,
);

const PREFIX: &str = "shaddock";
const HEARTBEAT: Duration = Duration::from_millis(100);
/// The new owner's `--handover-buffer`: the third request held is one too many.
const BUFFER: usize = 2;

/// The one recorder of this test binary (the worker counts on its own threads), and one
/// test at a time reading it.
static COUNTERS: LazyLock<Snapshotter> = LazyLock::new(|| {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    snapshotter
});
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// `worker_handover_overflow_total` so far (a snapshot takes the counts since the last
/// one, so they add up here).
fn overflowed() -> u64 {
    static TOTAL: AtomicU64 = AtomicU64::new(0);
    let since: u64 = (COUNTERS.snapshot().into_vec().into_iter())
        .filter(|(key, ..)| key.key().name() == "worker_handover_overflow_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    TOTAL.fetch_add(since, Ordering::Relaxed) + since
}

/// Publishes the made-up old owner's heartbeat every [`HEARTBEAT`]: it holds every
/// partition and is leaving, so the worker takes none fresh and owns them all.
fn old_owner_heartbeats(client: async_nats::Client) -> tokio::task::JoinHandle<()> {
    let me = KeyedMember {
        id: "old".into(),
        held: (0..PARTITIONS).collect(),
        leaving: true,
    };
    let payload: bytes::Bytes = me.encode_to_vec().into();
    tokio::spawn(async move {
        loop {
            let subject = members_subject(PREFIX, NAME);
            let _ = client.publish(subject, payload.clone()).await;
            tokio::time::sleep(HEARTBEAT).await;
        }
    })
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
    let client = bus.client().await;
    let mut members = client
        .subscribe(members_subject(PREFIX, NAME))
        .await
        .unwrap();
    let heartbeats = old_owner_heartbeats(client.clone());
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
