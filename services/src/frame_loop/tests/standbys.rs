//! What the loop gives standbys: after each step, the snapshots of the keyed partitions
//! it changed, sent before anything the step produced; none for a service without
//! snapshots. Under the paused clock.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use proto::code;
use tokio::time::{Duration, Instant};

use super::Sent;
use super::calls::{keyed_request, start};
use super::{MS, config};
use crate::frame_loop::{Incoming, InputKind};
use crate::service::Service;

/// Keyed over 8 partitions: `set` answers its body and keeps it as its partition's state;
/// the tick marks partition 7 changed; snapshots are `p<N>`, or empty once handed over.
fn keyed(snapshots: bool) -> Service {
    keyed_where_set_takes(snapshots, std::time::Duration::ZERO)
}

/// [`keyed`] whose `set` takes `took` of real time (the thread sleeps).
fn keyed_where_set_takes(snapshots: bool, took: std::time::Duration) -> Service {
    let service = Service::new("t")
        .keyed(8)
        .raw_method("set", move |_, body| {
            std::thread::sleep(took);
            Ok(body)
        })
        .on_tick(|ctx, _| ctx.changed(7))
        .on_hand_over(|_, _| Bytes::new());
    if snapshots {
        service.on_snapshot(|p| Bytes::from(format!("p{p}")))
    } else {
        service
    }
}

fn set(partition: u32, id: u32) -> Incoming<u32> {
    keyed_request("set", id, &format!("k{partition}")).in_partition(partition)
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

/// A partition adopted from a dead owner ticks at once, the schedule going on a period
/// from there: its players already waited out the owner's death (the longest push gap
/// of docs/workers.md, "Standbys"). One taken fresh, or handed over by a live owner,
/// waits for the next tick as before.
#[tokio::test(start_paused = true)]
async fn a_partition_adopted_from_a_dead_owner_ticks_at_once() {
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
    let state = Bytes::from_static(b"state");
    let fresh = Incoming::partition(InputKind::Fresh, 1, Bytes::new(), None);
    running.intake.offer(fresh).await;
    let handed = Incoming::partition(InputKind::TakeOver, 3, state.clone(), None);
    running.intake.offer(handed).await;
    tokio::time::sleep(10 * MS).await;
    let adopted = Incoming::partition(InputKind::Adopted, 2, state, None);
    running.intake.offer(adopted).await;
    tokio::time::sleep(110 * MS).await;
    assert_eq!(*ticks.lock().unwrap(), [30, 80, 130]);
}

/// One output of the loop, told briefly: a replica's partitions, an answer's id (and its
/// code unless 200).
fn describe(sent: &Sent<u32>) -> String {
    match sent {
        Sent::Replicate(states) => {
            let partitions: Vec<_> = states.iter().map(|(p, _)| p.to_string()).collect();
            format!("replica {}", partitions.join(","))
        }
        Sent::Response(id, response) if response.code == code::OK => format!("answer {id}"),
        Sent::Response(id, response) => format!("answer {id}: {}", response.code),
        other => format!("{other:?}"),
    }
}

/// The loop's next output, told briefly, with when it came (tenths of a ms from `t0`).
async fn next_at(running: &mut super::calls::Running, t0: Instant) -> (u128, String) {
    let sent = running.next().await;
    ((Instant::now() - t0).as_micros() / 100, describe(&sent))
}

/// Frames in one replica window (`--replica-window`) share one replica, sent at the
/// window's end, and their answers follow it in order; with no window, a replica per
/// frame, each before its frame's answers.
#[tokio::test(start_paused = true)]
async fn the_frames_of_one_window_share_one_replica() {
    let configured = |window| {
        let mut config = config(64, 100);
        config.tick_interval = 1000 * MS;
        config.replica_window = window;
        config
    };
    let t0 = Instant::now();
    let mut running = start(keyed(true), configured(10 * MS));
    running.intake.offer(set(3, 1)).await;
    let early = tokio::time::timeout(3 * MS, running.next()).await;
    assert!(early.is_err(), "sent inside the window: {early:?}");
    running.intake.offer(set(5, 2)).await;
    for want in [(100, "replica 3,5"), (100, "answer 1"), (100, "answer 2")] {
        assert_eq!(next_at(&mut running, t0).await, (want.0, want.1.into()));
    }

    let t0 = Instant::now();
    let mut running = start(keyed(true), configured(Duration::ZERO));
    running.intake.offer(set(3, 1)).await;
    assert_eq!(next_at(&mut running, t0).await, (0, "replica 3".into()));
    assert_eq!(next_at(&mut running, t0).await, (0, "answer 1".into()));
    tokio::time::sleep(3 * MS).await;
    running.intake.offer(set(5, 2)).await;
    assert_eq!(next_at(&mut running, t0).await, (30, "replica 5".into()));
    assert_eq!(next_at(&mut running, t0).await, (30, "answer 2".into()));
}

/// A tick does not wait for the window: what is held goes with the tick's own changes at
/// once. And a loop whose intake is gone sends what it holds at once, before it ends.
#[tokio::test(start_paused = true)]
async fn a_tick_or_the_end_sends_what_the_window_holds_at_once() {
    let t0 = Instant::now();
    let mut config = config(64, 100);
    config.tick_interval = 10 * MS;
    config.replica_window = 50 * MS;
    let mut running = start(keyed(true), config);
    tokio::time::sleep(8 * MS).await;
    running.intake.offer(set(3, 1)).await;
    assert_eq!(next_at(&mut running, t0).await, (100, "replica 3,7".into()));
    assert_eq!(next_at(&mut running, t0).await, (100, "answer 1".into()));
    assert_eq!(next_at(&mut running, t0).await, (200, "replica 7".into()));
    tokio::time::sleep(3 * MS).await;
    running.intake.offer(set(5, 2)).await;
    let rest: Vec<_> = running.stop().await.iter().map(describe).collect();
    assert_eq!(rest, ["replica 5", "answer 2"]);
    assert!(
        Instant::now() - t0 < 30 * MS,
        "sent at once, not at the window's end"
    );
}

/// A window cannot be kept open by a loop that never waits: a frame that ends past the
/// window's end releases it (here each frame takes one request of 2 ms, the window is
/// 1 ms, and frames follow one another with no pause), so the third request's partition
/// goes in a replica of its own. Real time: the handlers sleep. No timer races it: the
/// three are queued before the loop runs, and each frame carries the next request over
/// to the following frame, which runs without a wait.
#[tokio::test]
async fn a_frame_past_the_windows_end_releases_it() {
    let service = keyed_where_set_takes(true, std::time::Duration::from_millis(2));
    let mut config = config(64, 1);
    config.tick_interval = 1000 * MS;
    config.overrun_pause = Duration::ZERO;
    config.replica_window = MS;
    let running = start(service, config);
    for (partition, id) in [(3, 1), (4, 2), (5, 3)] {
        running.intake.offer(set(partition, id)).await;
    }
    // The intake ends after the third: what the third's window holds goes then.
    let got: Vec<_> = running.stop().await.iter().map(describe).collect();
    let want = [
        "replica 3,4",
        "answer 1",
        "answer 2",
        "replica 5",
        "answer 3",
    ];
    assert_eq!(got, want);
}
