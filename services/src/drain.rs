//! Leaving a queue group at shutdown without losing what the bus already sent.
//!
//! # Why not `Subscriber::drain`
//!
//! A draining worker unsubscribes so the bus routes new requests to the other members
//! of the group; what the server had already routed to it is still on the wire. nats.go
//! keeps the subscription until a PING after the UNSUB comes back, so those messages
//! are delivered. async-nats 0.51 does not: its `drain` and `unsubscribe` forget the
//! subscription on the connection's next turn, one I/O turn after the UNSUB left, and
//! messages that arrive for it after that are dropped without a trace. Under load that
//! is a request or two per drain, answered 408 by the gate after its timeout.
//!
//! # Leaving by count
//!
//! NATS has a lossless way out, the auto-unsubscribe `UNSUB <sid> <max>`: the server
//! removes the subscription once it has delivered `max` messages to it in all (at once
//! if it already has), and async-nats keeps the subscription until it has received
//! `max`. Both count the same messages, so both stop on the same one, and every message
//! the server sent is taken. At shutdown a subscription therefore asks to leave after
//! `taken + allowance` messages, `taken` being what it has received so far and
//! `allowance` covering what the server routed to it meanwhile (if more than that were
//! already on the way, the surplus would be lost, so the allowance is set far above what
//! one round trip carries). The server goes on routing to it until the allowance is used
//! up, then stops, exactly.
//!
//! A subscription that does not use up its allowance within
//! [`DrainConfig::drain_window`] unsubscribes outright: waiting longer could hold the
//! shutdown for ever, and a message on the wire at that very instant is lost. The
//! allowance is sized so that this happens only when the subscription's rate has fallen
//! to where such a message is improbable.
//!
//! # The allowance
//!
//! A fixed allowance cannot be both far above a round trip's worth and used up within
//! the window at every load: 64 is a few milliseconds of a busy worker, but at 50
//! requests a second it takes over a second, longer than the window, so every drain at
//! a light load left outright, and now and then lost the request on the wire (answered
//! 408 by the gate). So the allowance follows the subscription's own recent arrival
//! rate λ, measured over the last one to two windows (`drain/arrivals.rs` describes the
//! estimator): it is what λ brings in a quarter of the window W
//! (`ALLOWANCES_PER_WINDOW`), `clamp(λ·W / 4, 1, drain_allowance)`.
//! [`DrainConfig::drain_allowance`] is thus the most a subscription takes; configured
//! as 0, it leaves at once (still by count).
//!
//! - **Used up in time, at any load.** At a steady rate the allowance comes in about a
//!   quarter of the window; the rest of the window absorbs a rate that slows down or
//!   fluctuates.
//! - **Far above what is on the wire.** What the server routes to the subscription
//!   between the client's count of `taken` and the server reading the UNSUB is about one
//!   round trip τ of arrivals, λ·τ. The allowance λ·W/4 is W/(4τ) round trips' worth at
//!   any rate below the cap: 125 with the default 500 ms window and a 1 ms round trip.
//!   Above it (λ·W/4 over `drain_allowance`) the allowance is the configured most, as
//!   it always was.
//! - **An allowance of 1** is for rates under 8 messages a window (16 a second with the
//!   default window), and for a subscription that received nothing recently. One
//!   message on the wire is covered; a loss needs two within one round trip, with
//!   Poisson arrivals a chance of about (λ·τ)²/2: about 10⁻⁴ per drain at 16 a second
//!   and a 1 ms round trip, less at lower rates.
//! - **An allowance that does not come** within the window (a quiet subscription, or
//!   one whose load stopped just before the drain) means leaving outright, and a loss
//!   then needs an arrival within one round trip of that instant. At an allowance of 1
//!   that is no arrival for a window, then one: about λ·τ·e^(−λ·W), at most τ/(e·W)
//!   (at λ = 1/W), under 10⁻³ per drain with the default window and a 1 ms round trip.
//!
//! Messages are counted as they are taken from the subscription (those waiting at drain
//! start included): for a consumer that keeps up, as they arrive.
//!
//! nats-server reads a count of at most nine digits: a subscription that has taken
//! close to a billion messages sends one it cannot read, and the server then removes
//! it at once, while the client keeps it until the window has passed, still taking
//! whatever was on the wire; it is reported as having left after the window.
//!
//! # On a cluster
//!
//! Interest crosses routes asynchronously: another server may route a request to this
//! worker's server after the subscription is gone there. nats-server then hands it to
//! a member on another server (a routed queue message whose local member is gone goes
//! back over a route), so nothing is lost in that window either; `tests/worker_drain.rs`
//! checks it on a three-node cluster.
//!
//! # After a reconnect
//!
//! async-nats counts a subscription's messages from its start, the server from the
//! latest SUB, which a reconnect sends again: once the connection has been re-made the
//! two counts no longer match, and leaving by count would stop the client before the
//! server. So the first message after a reconnect renews the subscription: a fresh one
//! (whose counts start together) is subscribed, then the old one unsubscribed outright,
//! its waiting messages still taken. A message on the wire to the old one in that
//! instant is lost, as the reconnect itself lost whatever was on the wire; later drains
//! are lossless again. A subscription that reached shutdown still renewed-less (no
//! message since the reconnect, or the renewal failed) leaves outright, with a warning.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_nats::{Client, Message, Statistics, Subscriber};
use futures::{FutureExt as _, Stream, StreamExt as _, stream};
use tokio_util::sync::CancellationToken;

use crate::config::DrainConfig;

mod arrivals;

use arrivals::{Arrivals, allowance};

/// How a drained subscription ended, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// The server delivered exactly the allowance, and the client took it all.
    ByCount,
    /// The allowance was not used up within the window: unsubscribed outright.
    AfterWindow,
    /// The connection was re-made since the subscription: unsubscribed outright.
    Reconnected,
}

/// What a drained subscription reports when its stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drained {
    /// Messages taken after draining started (those waiting then included).
    pub after_drain: u64,
    /// The allowance asked for (see the module docs); 0 when none was (the subscription
    /// left outright, or ended before draining).
    pub allowance: u64,
    /// `None` when the subscription ended before draining (the client closed).
    pub left: Option<Left>,
}

/// One queue subscription with what draining (and renewing) it needs.
pub(crate) struct Draining {
    pub subscriber: Subscriber,
    pub client: Client,
    pub subject: String,
    pub group: String,
    pub stats: Arc<Statistics>,
    /// The client's count of connections made when the subscription was made.
    pub connects: u64,
    pub config: DrainConfig,
}

/// True when the client's count and the server's count of the subscription's messages
/// still agree: no connection was made since it was subscribed, other than the first
/// one (a subscription made before the first connection is sent with it).
fn counts_agree(connects_then: u64, connects_now: u64) -> bool {
    connects_now == connects_then || (connects_then == 0 && connects_now == 1)
}

struct State {
    draining: Draining,
    /// `None` once draining started.
    stop: Option<std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    taken: u64,
    /// The recent arrival rate, which sets the allowance.
    arrivals: Arrivals,
    /// The allowance asked for at drain start.
    allowance: u64,
    /// The client's count of connections when the renewal was last tried.
    checked: u64,
    /// Messages of a renewed subscription's predecessor, not yet handed on.
    retired: VecDeque<Message>,
    ready: VecDeque<Message>,
    /// When draining: messages since it started, and the deadline of the window.
    after_drain: u64,
    window: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    left: Option<Left>,
    done: Option<Box<dyn FnOnce(Drained) + Send>>,
}

/// The subscription's messages until `shutdown`, then until it has left the group as
/// the module docs say; `done` is told how it went when the stream ends.
pub(crate) fn until_drained(
    draining: Draining,
    shutdown: CancellationToken,
    done: impl FnOnce(Drained) + Send + 'static,
) -> impl Stream<Item = Message> + Send {
    let checked = draining.connects;
    let state = State {
        draining,
        stop: Some(Box::pin(shutdown.cancelled_owned())),
        taken: 0,
        arrivals: Arrivals::new(Instant::now()),
        allowance: 0,
        checked,
        retired: VecDeque::new(),
        ready: VecDeque::new(),
        after_drain: 0,
        window: None,
        left: None,
        done: Some(Box::new(done)),
    };
    stream::unfold(state, |mut state| async move {
        let message = state.next().await;
        match message {
            Some(message) => Some((message, state)),
            None => {
                if let Some(done) = state.done.take() {
                    done(Drained {
                        after_drain: state.after_drain,
                        allowance: state.allowance,
                        left: state.left,
                    });
                }
                None
            }
        }
    })
}

impl State {
    async fn next(&mut self) -> Option<Message> {
        if let Some(message) = self.retired.pop_front() {
            return Some(message);
        }
        if let Some(stop) = self.stop.as_mut() {
            tokio::select! {
                message = self.draining.subscriber.next() => {
                    let message = message?;
                    self.took();
                    self.renew_if_reconnected().await;
                    return Some(message);
                }
                () = stop => {
                    self.stop = None;
                    self.start_draining().await;
                }
            }
        }
        if let Some(message) = self.ready.pop_front() {
            self.after_drain += 1;
            return Some(message);
        }
        loop {
            let Some(window) = self.window.as_mut() else {
                // Left outright: what is still buffered, then the end.
                let message = self.draining.subscriber.next().await?;
                self.after_drain += 1;
                return Some(message);
            };
            tokio::select! {
                message = self.draining.subscriber.next() => {
                    let Some(message) = message else {
                        // The client removed it on the last message of the allowance.
                        self.left.get_or_insert(Left::ByCount);
                        return None;
                    };
                    self.after_drain += 1;
                    return Some(message);
                }
                () = window => {
                    self.window = None;
                    self.left = Some(Left::AfterWindow);
                    tracing::debug!(
                        window = ?self.draining.config.drain_window,
                        allowance = self.allowance,
                        "the drain allowance was not used up in time: unsubscribing outright"
                    );
                    self.unsubscribe().await;
                }
            }
        }
    }

    /// Takes what is waiting, then asks the server to stop after the allowance, or,
    /// when the counts no longer agree, unsubscribes outright.
    async fn start_draining(&mut self) {
        while let Some(Some(message)) = self.draining.subscriber.next().now_or_never() {
            self.took();
            self.ready.push_back(message);
        }
        let connects = self.draining.stats.connects.load(Ordering::Relaxed);
        if !counts_agree(self.draining.connects, connects) {
            tracing::warn!(
                "reconnected since subscribing: unsubscribing outright (a message on the wire now would be lost)"
            );
            self.left = Some(Left::Reconnected);
            self.unsubscribe().await;
            return;
        }
        let config = self.draining.config;
        let expected = self
            .arrivals
            .expected_in_window(Instant::now(), config.drain_window);
        let allowance = allowance(expected, config.drain_allowance);
        let max = self.taken.saturating_add(allowance);
        if let Err(error) = self.draining.subscriber.unsubscribe_after(max).await {
            // The client is closed: nothing more will arrive.
            tracing::warn!(%error, "cannot unsubscribe");
            self.left = Some(Left::AfterWindow);
            self.draining.subscriber.unsubscribe().await.ok();
            return;
        }
        self.allowance = allowance;
        self.window = Some(Box::pin(tokio::time::sleep(config.drain_window)));
    }

    /// Counts a message taken from the subscription before draining.
    fn took(&mut self) {
        self.taken += 1;
        self.arrivals
            .record(Instant::now(), self.draining.config.drain_window);
    }

    /// After a reconnect, swaps the subscription for a fresh one (see the module docs).
    async fn renew_if_reconnected(&mut self) {
        let connects = self.draining.stats.connects.load(Ordering::Relaxed);
        if connects == self.checked || counts_agree(self.draining.connects, connects) {
            return;
        }
        self.checked = connects;
        let fresh = self
            .draining
            .client
            .queue_subscribe(self.draining.subject.clone(), self.draining.group.clone())
            .await;
        let fresh = match fresh {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::warn!(subject = %self.draining.subject, %error, "cannot renew the subscription after a reconnect: its drain will not be lossless");
                return;
            }
        };
        let mut old = std::mem::replace(&mut self.draining.subscriber, fresh);
        self.draining.connects = connects;
        self.taken = 0;
        if let Err(error) = old.unsubscribe().await {
            tracing::warn!(%error, "cannot unsubscribe");
        }
        // Closed: what it holds, then the end, without waiting.
        while let Some(Some(message)) = old.next().now_or_never() {
            self.retired.push_back(message);
        }
        tracing::info!(subject = %self.draining.subject, "reconnected: subscription renewed");
    }

    async fn unsubscribe(&mut self) {
        if let Err(error) = self.draining.subscriber.unsubscribe().await {
            tracing::warn!(%error, "cannot unsubscribe");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use broker::testing::{Bus, round_trip, within};
    use bytes::Bytes;
    use futures::StreamExt as _;
    use tokio::sync::oneshot;

    use super::*;

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
        // Polled once (outside tokio's cooperative budget, which the test may have
        // spent), the stream starts draining; nothing has arrived, so it does not
        // return. A round trip later the server has the UNSUB.
        assert!(
            tokio::task::unconstrained(left.next())
                .now_or_never()
                .is_none()
        );
        round_trip(&leaving).await;
        for i in 0..SENT {
            publisher
                .publish("drain.t", Bytes::from(i.to_string()))
                .await
                .unwrap();
        }
        round_trip(&publisher).await;
        let left: Vec<Message> = within(left.collect()).await;
        let report = within(report).await.unwrap();
        assert_eq!(
            report,
            Drained {
                after_drain: ALLOWANCE,
                allowance: ALLOWANCE,
                left: Some(Left::ByCount)
            },
            "{}",
            bus.name()
        );
        assert_eq!(left.len() as u64, ALLOWANCE);
        let mut rest = 0;
        while rest + left.len() < SENT {
            within(other.next()).await.unwrap();
            rest += 1;
        }
        round_trip(&staying).await;
        assert!(
            other.next().now_or_never().is_none(),
            "a message was delivered twice"
        );
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
        let leaving = client(&bus).await;
        let staying = client(&bus).await;
        let publisher = client(&bus).await;
        let shutdown = CancellationToken::new();
        let config = DrainConfig::default();
        let (left, report) = draining(&leaving, "drain.l", config, &shutdown).await;
        let mut other = staying
            .queue_subscribe("drain.l", "g".to_owned())
            .await
            .unwrap();
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
        let mut taken: Vec<usize> = left.iter().map(index).collect();
        while taken.len() < sent {
            taken.push(index(&within(other.next()).await.unwrap()));
        }
        round_trip(&staying).await;
        assert!(
            other.next().now_or_never().is_none(),
            "a message was delivered twice"
        );
        taken.sort_unstable();
        assert_eq!(taken, (0..sent).collect::<Vec<_>>(), "{}", bus.name());
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
        a_quiet_subscription_leaves_after_the_window,
        no_allowance_leaves_at_once,
    );
}
