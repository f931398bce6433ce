//! Draining and leases against a real bus, our broker and nats-server: what is asked is
//! taken, nothing on the wire is lost, across reconnects and bursts.

use std::time::{Duration, Instant};

use broker::testing::Bus;
use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _};
use testkit::within;
use tokio::sync::oneshot;

use super::*;
use crate::bus::round_trip;

#[test]
fn counts_agree_until_a_connection_is_made_again() {
    assert!(counts_agree(1, 1));
    // Subscribed before the first connection: sent with it.
    assert!(counts_agree(0, 1));
    assert!(!counts_agree(0, 2));
    assert!(!counts_agree(1, 2));
}

async fn client(bus: &Bus) -> Client {
    crate::connect(&[bus.url().to_owned()], "drain-test", &Default::default())
        .await
        .unwrap()
}

/// A queue subscription of group `g` on `subject`, drained per `config` when
/// `shutdown` fires; its messages go to a channel, its report to the receiver.
async fn draining(
    client: &Client,
    subject: &str,
    config: DrainConfig,
    shutdown: &CancellationToken,
) -> (
    std::pin::Pin<Box<dyn Stream<Item = Message> + Send>>,
    oneshot::Receiver<Drained>,
) {
    let subscriber = client
        .queue_subscribe(subject.to_owned(), "g".to_owned())
        .await
        .unwrap();
    let draining = Draining {
        subscriber,
        client: client.clone(),
        subject: subject.to_owned(),
        group: "g".to_owned(),
        stats: client.statistics(),
        connects: client.statistics().connects.load(Ordering::Relaxed),
        config,
    };
    let (tx, rx) = oneshot::channel();
    let stream = until_drained(draining, shutdown.clone(), move |d| {
        let _ = tx.send(d);
    });
    (Box::pin(stream), rx)
}

/// A queue group `g` on `subject` of two members: `left`, drained per `config` when
/// `shutdown` fires (its report to `report`), on `leaving`, and `other`, on
/// `staying`; and a `publisher`.
struct Group {
    leaving: Client,
    staying: Client,
    publisher: Client,
    shutdown: CancellationToken,
    left: std::pin::Pin<Box<dyn Stream<Item = Message> + Send>>,
    report: oneshot::Receiver<Drained>,
    other: Subscriber,
}

async fn group(bus: &Bus, subject: &str, config: DrainConfig) -> Group {
    let leaving = client(bus).await;
    let staying = client(bus).await;
    let publisher = client(bus).await;
    let shutdown = CancellationToken::new();
    let (left, report) = draining(&leaving, subject, config, &shutdown).await;
    let other = staying
        .queue_subscribe(subject.to_owned(), "g".to_owned())
        .await
        .unwrap();
    Group {
        leaving,
        staying,
        publisher,
        shutdown,
        left,
        report,
        other,
    }
}

/// Polls `stream` once, outside tokio's cooperative budget (which the test may have
/// spent), and expects nothing: the first lease is granted, or the drain starts.
fn poll_once(stream: &mut (impl Stream<Item = Message> + Unpin)) {
    assert!(
        tokio::task::unconstrained(stream.next())
            .now_or_never()
            .is_none()
    );
}

/// Publishes the index of each of `range` on `subject`, `burst` at a time, each burst
/// through the server before the next: a load the readers keep up with.
async fn publish_in_bursts(
    publisher: &Client,
    subject: &str,
    range: std::ops::Range<usize>,
    burst: usize,
) {
    for start in range.clone().step_by(burst) {
        for i in start..(start + burst).min(range.end) {
            publisher
                .publish(subject.to_owned(), Bytes::from(i.to_string()))
                .await
                .unwrap();
        }
        round_trip(publisher).await;
    }
}

/// Fails unless the indices in `taken` and those `other` (a member of the group on
/// `staying`) takes make up `0..sent`, each exactly once.
async fn each_taken_once(
    bus: &Bus,
    mut taken: Vec<usize>,
    other: &mut Subscriber,
    staying: &Client,
    sent: usize,
) {
    while taken.len() < sent {
        match tokio::time::timeout(Duration::from_secs(2), other.next()).await {
            Ok(Some(message)) => taken.push(index(&message)),
            _ => break,
        }
    }
    round_trip(staying).await;
    while let Some(Some(message)) = other.next().now_or_never() {
        taken.push(index(&message));
    }
    taken.sort_unstable();
    let mut once = taken.clone();
    once.dedup();
    let lost = (0..sent).filter(|i| once.binary_search(i).is_err()).count();
    assert!(
        lost == 0 && once.len() == taken.len(),
        "{}: {lost} lost, {} taken twice",
        bus.name(),
        taken.len() - once.len()
    );
}

/// With another member in the group, a busy drained subscription takes exactly its
/// allowance (the configured most) of what is published after draining started, and
/// the other member the rest: nothing is lost, nothing taken twice.
async fn leaves_after_exactly_the_allowance(bus: Bus) {
    const ALLOWANCE: u64 = 5;
    const SENT: usize = 200;
    /// Taken in a few milliseconds before draining: a rate far above the cap.
    const BUSY: usize = 10;
    let leaving = client(&bus).await;
    let staying = client(&bus).await;
    let publisher = client(&bus).await;
    let shutdown = CancellationToken::new();
    let config = DrainConfig {
        drain_allowance: ALLOWANCE,
        drain_window: Duration::from_secs(60),
        ..DrainConfig::default()
    };
    let (mut left, report) = draining(&leaving, "drain.t", config, &shutdown).await;
    round_trip(&leaving).await;
    for i in 0..BUSY {
        publisher
            .publish("drain.t", Bytes::from(i.to_string()))
            .await
            .unwrap();
    }
    for _ in 0..BUSY {
        within(left.next()).await.unwrap();
    }
    let mut other = staying
        .queue_subscribe("drain.t", "g".to_owned())
        .await
        .unwrap();
    round_trip(&leaving).await;
    round_trip(&staying).await;
    shutdown.cancel();
    // Polled once, the stream starts draining; a round trip later the server has the
    // UNSUB.
    poll_once(&mut left);
    round_trip(&leaving).await;
    publish_in_bursts(&publisher, "drain.t", 0..SENT, SENT).await;
    let left: Vec<Message> = within(left.collect()).await;
    let report = within(report).await.unwrap();
    assert_eq!(
        report,
        Drained {
            after_drain: ALLOWANCE,
            allowance: ALLOWANCE,
            lapses: 0,
            left: Some(Left::ByCount)
        },
        "{}",
        bus.name()
    );
    assert_eq!(left.len() as u64, ALLOWANCE);
    let taken = left.iter().map(index).collect();
    each_taken_once(&bus, taken, &mut other, &staying, SENT).await;
}

/// A quiet subscription that never uses its allowance leaves outright once the
/// window has passed, and not before.
async fn a_quiet_subscription_leaves_after_the_window(bus: Bus) {
    const WINDOW: Duration = Duration::from_millis(200);
    let leaving = client(&bus).await;
    let shutdown = CancellationToken::new();
    let config = DrainConfig {
        drain_allowance: 5,
        drain_window: WINDOW,
        ..DrainConfig::default()
    };
    let (left, report) = draining(&leaving, "drain.q", config, &shutdown).await;
    round_trip(&leaving).await;
    let started = Instant::now();
    shutdown.cancel();
    assert!(within(left.collect::<Vec<_>>()).await.is_empty());
    assert!(started.elapsed() >= WINDOW, "{:?}", started.elapsed());
    let report = within(report).await.unwrap();
    assert_eq!(report.left, Some(Left::AfterWindow));
    assert_eq!(report.after_drain, 0);
    // Nothing received recently: one message, which did not come.
    assert_eq!(report.allowance, 1);
}

/// An allowance of 0 leaves at once, by count.
async fn no_allowance_leaves_at_once(bus: Bus) {
    let leaving = client(&bus).await;
    let shutdown = CancellationToken::new();
    let config = DrainConfig {
        drain_allowance: 0,
        drain_window: Duration::from_secs(60),
        ..DrainConfig::default()
    };
    let (left, report) = draining(&leaving, "drain.z", config, &shutdown).await;
    round_trip(&leaving).await;
    shutdown.cancel();
    assert!(within(left.collect::<Vec<_>>()).await.is_empty());
    let report = within(report).await.unwrap();
    assert_eq!(report.left, Some(Left::ByCount));
    assert_eq!(report.allowance, 0);
}

/// At a light steady load (one request every 20 ms over two members, about 25 a
/// second for the one leaving), a drained subscription still leaves by count within
/// the window, with an allowance scaled down to its rate: every message published
/// before and during the drain is taken by exactly one member.
async fn a_lightly_loaded_subscription_leaves_by_count(bus: Bus) {
    const PERIOD: Duration = Duration::from_millis(20);
    const LOADED_FOR: Duration = Duration::from_secs(1);
    let config = DrainConfig::default();
    let Group {
        leaving,
        staying,
        publisher,
        shutdown,
        left,
        report,
        mut other,
    } = group(&bus, "drain.l", config).await;
    round_trip(&leaving).await;
    round_trip(&staying).await;
    let taker = tokio::spawn(left.collect::<Vec<Message>>());
    let stop_publishing = CancellationToken::new();
    let publishing = tokio::spawn({
        let stop = stop_publishing.clone();
        async move {
            let mut tick = tokio::time::interval(PERIOD);
            let mut sent = 0_usize;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {
                        publisher.publish("drain.l", Bytes::from(sent.to_string())).await.unwrap();
                        sent += 1;
                    }
                }
            }
            round_trip(&publisher).await;
            sent
        }
    });
    // The load runs for a while before the drain (the rate it is measured at), then
    // through it.
    tokio::time::sleep(LOADED_FOR).await;
    shutdown.cancel();
    let report = within(report).await.unwrap();
    stop_publishing.cancel();
    let sent = within(publishing).await.unwrap();
    let left = within(taker).await.unwrap();
    assert_eq!(
        report.left,
        Some(Left::ByCount),
        "{}: {report:?}",
        bus.name()
    );
    assert!(
        (1..config.drain_allowance).contains(&report.allowance)
            && report.after_drain >= report.allowance,
        "{}: {report:?}",
        bus.name()
    );
    let taken = left.iter().map(index).collect();
    each_taken_once(&bus, taken, &mut other, &staying, sent).await;
}

/// A reconnect and then a busy load: the subscription is made anew after the
/// reconnect (see "The lease"), and every message published once the connection is
/// back, during that and through a drain, is taken by exactly one member.
async fn a_reconnect_loses_nothing_after_it(bus: Bus) {
    const SENT: usize = 20_000;
    const BURST: usize = 100;
    const DRAIN_BURST: usize = 10;
    const DURING_DRAIN: usize = 1_000;
    let config = DrainConfig::default();
    let Group {
        leaving,
        staying,
        publisher,
        shutdown,
        mut left,
        report,
        mut other,
    } = group(&bus, "drain.r", config).await;
    // The first lease is granted before the reconnect.
    poll_once(&mut left);
    let taker = tokio::spawn(left.collect::<Vec<Message>>());
    reconnect(&leaving).await;
    round_trip(&staying).await;
    publish_in_bursts(&publisher, "drain.r", 0..SENT, BURST).await;
    shutdown.cancel();
    // Small bursts while it drains: never more on the wire than its allowance.
    publish_in_bursts(
        &publisher,
        "drain.r",
        SENT..SENT + DURING_DRAIN,
        DRAIN_BURST,
    )
    .await;
    let report = within(report).await.unwrap();
    let taken = within(taker).await.unwrap().iter().map(index).collect();
    each_taken_once(&bus, taken, &mut other, &staying, SENT + DURING_DRAIN).await;
    // The old subscription ran out its lease under the load, and the one made after
    // the reconnect left by count.
    assert_eq!(report.left, Some(Left::ByCount), "{}", bus.name());
}

/// How long `reconnect` waits for its probe before sending another.
const PROBE_AGAIN: Duration = Duration::from_millis(250);

/// Makes `client`'s connection again, and waits until it is back.
async fn reconnect(client: &Client) {
    let connects = client.statistics().connects.load(Ordering::Relaxed);
    client.force_reconnect().await.unwrap();
    within(async {
        while client.statistics().connects.load(Ordering::Relaxed) == connects {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // A message sent while the connection is swapped may be dropped (NATS is at most
    // once across a reconnect): the probe is sent again until one comes back.
    let inbox = client.new_inbox();
    let mut echo = within(client.subscribe(inbox.clone())).await.unwrap();
    within(async {
        loop {
            client.publish(inbox.clone(), Bytes::new()).await.unwrap();
            let back = tokio::time::timeout(PROBE_AGAIN, echo.next());
            if back.await.is_ok() {
                break;
            }
        }
    })
    .await;
}

/// A subscription whose stream is first polled after a reconnect cannot be granted a
/// lease (the counts may differ): a fresh one takes over at once, the old one keeps
/// taking what reaches it, and at the drain it leaves outright after the window. At a
/// load that stopped before then, nothing is lost.
async fn subscribed_before_a_reconnect_polled_after_it(bus: Bus) {
    const SENT: usize = 2_000;
    const WINDOW: Duration = Duration::from_millis(300);
    let config = DrainConfig {
        drain_window: WINDOW,
        ..DrainConfig::default()
    };
    let Group {
        leaving,
        staying,
        publisher,
        shutdown,
        mut left,
        report,
        mut other,
    } = group(&bus, "drain.b", config).await;
    reconnect(&leaving).await;
    poll_once(&mut left);
    round_trip(&leaving).await;
    round_trip(&staying).await;
    let taker = tokio::spawn(left.collect::<Vec<Message>>());
    publish_in_bursts(&publisher, "drain.b", 0..SENT, 50).await;
    round_trip(&leaving).await;
    shutdown.cancel();
    let report = within(report).await.unwrap();
    let taken: Vec<usize> = within(taker).await.unwrap().iter().map(index).collect();
    assert!(!taken.is_empty(), "{}", bus.name());
    each_taken_once(&bus, taken, &mut other, &staying, SENT).await;
    assert_eq!(report.left, Some(Left::AfterWindow), "{}", bus.name());
}

/// A reader that falls behind lets its lease run out on the server before it makes
/// the successor: the group's other member takes the rest meanwhile; once the
/// reader catches up it subscribes the successor and is a member again. Nothing is
/// lost or taken twice.
async fn a_reader_behind_its_lease_catches_up(bus: Bus) {
    const LEASE: u64 = crate::config::MIN_QUEUE_LEASE;
    const BEHIND: usize = 400;
    const AFTER: usize = 400;
    let config = DrainConfig {
        queue_lease: LEASE,
        ..DrainConfig::default()
    };
    let Group {
        leaving,
        staying,
        publisher,
        shutdown,
        mut left,
        report,
        mut other,
    } = group(&bus, "drain.c", config).await;
    poll_once(&mut left);
    round_trip(&leaving).await;
    round_trip(&staying).await;
    // Not read meanwhile: the server stops routing to it after its lease.
    publish_in_bursts(&publisher, "drain.c", 0..BEHIND, 10).await;
    round_trip(&leaving).await;
    let mut taken = Vec::new();
    for _ in 0..LEASE {
        taken.push(index(&within(left.next()).await.unwrap()));
    }
    poll_once(&mut left);
    round_trip(&leaving).await;
    let taker = tokio::spawn(left.collect::<Vec<Message>>());
    publish_in_bursts(&publisher, "drain.c", BEHIND..BEHIND + AFTER, 10).await;
    shutdown.cancel();
    let report = within(report).await.unwrap();
    // Seen and counted: the lease ran out before its successor was made.
    assert!(report.lapses >= 1, "{}: {report:?}", bus.name());
    let rest: Vec<usize> = within(taker).await.unwrap().iter().map(index).collect();
    assert!(
        rest.iter().any(|&i| i >= BEHIND),
        "{}: not a member again",
        bus.name()
    );
    taken.extend(rest);
    each_taken_once(&bus, taken, &mut other, &staying, BEHIND + AFTER).await;
}

/// At the smallest lease, under bursts of a quarter of it, a subscription is
/// renewed again and again (a successor every half lease), stays a member of its
/// group, and nothing is lost or taken twice.
async fn renewed_at_the_smallest_lease(bus: Bus) {
    const BURST: usize = (crate::config::MIN_QUEUE_LEASE / 4) as usize;
    const SENT: usize = 4_000;
    let config = DrainConfig {
        queue_lease: crate::config::MIN_QUEUE_LEASE,
        ..DrainConfig::default()
    };
    let Group {
        leaving: _leaving,
        staying,
        publisher,
        shutdown,
        left,
        report,
        mut other,
    } = group(&bus, "drain.s", config).await;
    round_trip(&staying).await;
    let taker = tokio::spawn(left.collect::<Vec<Message>>());
    publish_in_bursts(&publisher, "drain.s", 0..SENT, BURST).await;
    shutdown.cancel();
    let report = within(report).await.unwrap();
    let by_leaving: Vec<usize> = within(taker).await.unwrap().iter().map(index).collect();
    each_taken_once(&bus, by_leaving.clone(), &mut other, &staying, SENT).await;
    // Far more than one lease taken, and still taking in the second half.
    let late = by_leaving.iter().filter(|&&i| i >= SENT / 2).count();
    assert!(
        by_leaving.len() as u64 > 4 * crate::config::MIN_QUEUE_LEASE && late > 0,
        "{}: {} taken, {late} in the second half, {report:?}",
        bus.name(),
        by_leaving.len()
    );
}

fn index(message: &Message) -> usize {
    std::str::from_utf8(&message.payload)
        .unwrap()
        .parse()
        .unwrap()
}

broker::on_both_buses!(
    leaves_after_exactly_the_allowance,
    a_lightly_loaded_subscription_leaves_by_count,
    a_reconnect_loses_nothing_after_it,
    renewed_at_the_smallest_lease,
    subscribed_before_a_reconnect_polled_after_it,
    a_reader_behind_its_lease_catches_up,
    a_quiet_subscription_leaves_after_the_window,
    no_allowance_leaves_at_once,
);
