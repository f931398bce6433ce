//! What the loop gives standbys: after each step, the snapshots of the keyed partitions
//! it changed, sent before anything the step produced; none for a service without
//! snapshots. Under the paused clock.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::time::Instant;

use super::Sent;
use super::calls::{request, start};
use super::{MS, config};
use crate::frame_loop::{Incoming, InputKind};
use crate::service::Service;

/// Keyed over 8 partitions: `set` answers its body and keeps it as its partition's state;
/// the tick marks partition 7 changed; snapshots are `p<N>`, or empty once handed over.
fn keyed(snapshots: bool) -> Service {
    let service = Service::new("t")
        .keyed(8)
        .raw_method("set", |_, body| Ok(body))
        .on_tick(|ctx, _| ctx.changed(7))
        .on_hand_over(|_, _| Bytes::new());
    if snapshots {
        service.on_snapshot(|p| Bytes::from(format!("p{p}")))
    } else {
        service
    }
}

fn set(partition: u32, id: u32) -> Incoming<u32> {
    request("set", id, "ann", 0).in_partition(partition)
}

fn states(sent: Sent<u32>) -> Vec<(u32, Bytes)> {
    match sent {
        Sent::Replicate(states) => states,
        other => panic!("not a replica: {other:?}"),
    }
}

fn p(partition: u32) -> (u32, Bytes) {
    (partition, Bytes::from(format!("p{partition}")))
}

/// A frame's changed partitions (each once, however many requests) reach the sink
/// before the frame's answers, with a take-over's and a Replicate's; a partition handed
/// over in the frame is not sent, nor one without a standby (6); a tick sends what it
/// marked.
#[tokio::test(start_paused = true)]
async fn a_steps_snapshots_go_before_its_answers() {
    let mut config = config(64, 100);
    config.tick_interval = 1000 * MS;
    let mut running = start(keyed(true), config);
    for (partition, id) in [(3, 1), (3, 2), (5, 3), (6, 4)] {
        running.intake.offer(set(partition, id)).await;
    }
    let take = Incoming::partition(InputKind::Fresh, 1, Bytes::new(), None);
    running.intake.offer(take).await;
    let again = Incoming::partition(InputKind::Replicate, 2, Bytes::new(), None);
    running.intake.offer(again).await;
    let leave = Incoming::partition(InputKind::HandOver, 5, Bytes::new(), Some(9));
    running.intake.offer(leave).await;
    assert_eq!(states(running.next().await), [p(1), p(2), p(3)]);
    for id in [1, 2, 3, 4] {
        assert_eq!(running.response().await.0, id);
    }
    assert!(
        matches!(running.next().await, Sent::Answer(9, _)),
        "the hand-over's state"
    );
    // The tick's step: the partition it marked, alone.
    assert_eq!(states(running.next().await), [p(7)]);
}

/// Without snapshots, nothing goes to standbys: the answers alone.
#[tokio::test(start_paused = true)]
async fn a_service_without_snapshots_sends_nothing_to_standbys() {
    let mut config = config(64, 100);
    config.tick_interval = 1000 * MS;
    let mut running = start(keyed(false), config);
    running.intake.offer(set(3, 1)).await;
    assert_eq!(running.response().await.0, 1);
}

/// A partition taken with its state ticks at once, the schedule going on a period from
/// there: its players already waited out its last owner's death (the longest push gap
/// of docs/workers.md, "Standbys"). One taken fresh waits for the next tick as before.
#[tokio::test(start_paused = true)]
async fn a_partition_taken_with_its_state_ticks_at_once() {
    let t0 = Instant::now();
    let ticks = Arc::new(Mutex::new(Vec::new()));
    let seen = ticks.clone();
    let service = Service::new("t")
        .keyed(8)
        .on_take_over(|_, _, _| {})
        .on_tick(move |_, tick| seen.lock().unwrap().push((tick.now - t0).as_millis()));
    let mut config = config(64, 100);
    config.tick_interval = 50 * MS;
    let running = start(service, config);
    tokio::time::sleep(20 * MS).await;
    let fresh = Incoming::partition(InputKind::Fresh, 1, Bytes::new(), None);
    running.intake.offer(fresh).await;
    tokio::time::sleep(10 * MS).await;
    let state = Bytes::from_static(b"state");
    let taken = Incoming::partition(InputKind::TakeOver, 2, state, None);
    running.intake.offer(taken).await;
    tokio::time::sleep(110 * MS).await;
    assert_eq!(*ticks.lock().unwrap(), [30, 80, 130]);
}
