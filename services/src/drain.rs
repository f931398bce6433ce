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
//! Counts start again with each subscription of a lease (below), and a lease is at most
//! a million messages: the count an UNSUB carries stays far within the nine digits
//! nats-server reads.
//!
//! # Bursts
//!
//! Games send on the tick: two thousand players' requests can reach a worker within a
//! millisecond, far faster than a successor's SUB can reach the server. The server
//! counts a message as delivered when it routes it, not when the worker reads it, so
//! what matters is what the lease still holds when a burst lands:
//!
//! - **Renewed on what was delivered.** Each time the stream is polled it takes
//!   everything the leases' channels already hold (`take_delivered`), so a lease's count
//!   is what the bus has delivered to the client, not what the handler loop has taken
//!   so far, and the successor is made as soon as half has arrived.
//! - **A lease covers what the worker can queue.** The worker grants at least twice its
//!   queue capacity ([`crate::config::LEASE_PER_QUEUED`],
//!   [`crate::config::FrameConfig::subscription_drain`]): half a lease, the least left
//!   when the successor is due, is then never less than a burst the worker could
//!   accept. A larger burst is more than the worker queues; its surplus is answered 503
//!   `overloaded` by the worker (or, should it outrun the lease, "no responders" by the
//!   bus): either way a refusal the client retries, and the rate-sized lease grows with
//!   a load that stays.
//! - **Visible when it happens anyway.** A lease seen to run out while it was the
//!   current one (its successor not yet made) is a lapse: counted in
//!   `worker_queue_lease_lapses_total{service}`, reported in the drain's log line, and
//!   logged at warn at most every ten seconds. A lapse the reader only sees after the
//!   successor exists (the server ran the lease out while the SUB was on its way) is
//!   not seen; the floor above is what keeps that away.
//!
//! # On a cluster
//!
//! Interest crosses routes asynchronously: another server may route a request to this
//! worker's server after the subscription is gone there. nats-server then hands it to
//! a member on another server (a routed queue message whose local member is gone goes
//! back over a route), so nothing is lost in that window either; `tests/worker_drain.rs`
//! checks it on a three-node cluster.
//!
//! # The lease
//!
//! Leaving by count needs the two counts to agree, and a reconnect breaks them for any
//! count asked afterwards: async-nats counts a subscription's messages from its start,
//! the server from the latest SUB, which a reconnect sends again. What async-nats does
//! carry across a reconnect is a limit already set: right after the SUB it sends `UNSUB
//! <sid> <max - delivered>`, so the server's remaining count is the client's. Every
//! queue subscription therefore holds a limit from the moment it is made, its lease, and
//! is never left without one:
//!
//! - **Granted at once.** The subscription a stream is made with is granted its lease
//!   on the first poll (the worker polls at once); a successor right behind its SUB.
//!   The lease is what the recent rate brings in a quarter of the drain window, at least
//!   [`DrainConfig::queue_lease`] (1024), at most a million.
//! - **Renewed make before break.** Once half its lease is taken, a successor is
//!   subscribed (same subject, same group) and the old one retires: it is never asked
//!   anything again, so it runs out its lease and both sides stop on the same message.
//!   Nothing is ever unsubscribed outright while the worker serves.
//! - **After a reconnect** the first message subscribes a successor the same way: the
//!   old subscription's lease still agrees, so it runs out without a loss. (The
//!   previous design unsubscribed it outright, which under load lost what was on the
//!   wire to it: thousands of messages in a test flood, and the likeliest cause of the
//!   one request a broker restart in `loadtest faults` now and then cost.)
//! - **At the drain** each subscription whose counts agree is asked to stop after the
//!   allowance (unless its lease ends sooner). One made before a reconnect and not yet
//!   run out cannot be asked: it runs out its lease, or leaves outright after the
//!   window. A drain soon after a reconnect, at a light load, is thus the one case left
//!   where a message on the wire at that instant can be lost.
//!
//! What it costs and where it stops:
//!
//! - **One SUB and one UNSUB per lease**: at 20,000 messages a second and the default
//!   window, leases of 2,500, a successor every 1,250 to 2,500 messages, at most 16 a
//!   second.
//! - **A reader far behind.** The successor is made when half the lease has been
//!   delivered (below); a reader that does not read at all lets the lease run out
//!   first. The worker is then out of the group for a moment (the server routes to the
//!   other members; with none, a requester gets "no responders", which the gate answers
//!   503) until the reader, catching up, subscribes the successor. Nothing is lost, and
//!   the lapse is counted (below).
//! - **The grant is an UNSUB right behind the SUB.** Were the server to route more than
//!   the lease to the new subscription between the two, the client would drop the
//!   surplus; hence a floor far above what arrives in that instant, and at least
//!   [`crate::config::MIN_QUEUE_LEASE`] configured.
//! - **Order.** While a successor and its predecessor both deliver, their messages come
//!   through two channels, taken oldest subscription first: two messages close together
//!   may be taken out of order. With more than one worker in a group no order across
//!   messages held anyway.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use async_nats::{Client, Message, Statistics, Subscriber};
use futures::{Stream, StreamExt as _, stream};
use tokio_util::sync::CancellationToken;

use crate::config::DrainConfig;

mod arrivals;

use arrivals::{Arrivals, allowance, lease};

/// How a drained subscription ended, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// The server delivered exactly what was asked, and the client took it all.
    ByCount,
    /// Something asked was not used up within the window: unsubscribed outright.
    AfterWindow,
}

/// What a drained subscription reports when its stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drained {
    /// Messages taken after draining started (those waiting then included).
    pub after_drain: u64,
    /// The allowance asked for (see the module docs); 0 when none was (the subscription
    /// could not be asked, or ended before draining).
    pub allowance: u64,
    /// Leases that ran out while current, before their successor was made (see
    /// "Bursts" in the module docs): moments the worker was out of its group.
    pub lapses: u64,
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

/// One subscription of the group, and the count it ends at.
struct Lease {
    subscriber: Subscriber,
    /// The client's count of connections when it was subscribed.
    connects: u64,
    /// Messages taken from it.
    taken: u64,
    /// The count it ends at, as both sides know it: its lease (granted before anything
    /// was taken from it), or less once draining. `None` before it was granted one (or
    /// when it could not be: see [`State::grant_first`]).
    ends_at: Option<u64>,
    /// Left to run out (or to end at the drain): no longer extended.
    retiring: bool,
}

impl Lease {
    fn new(subscriber: Subscriber, connects: u64) -> Self {
        Lease {
            subscriber,
            connects,
            taken: 0,
            ends_at: None,
            retiring: false,
        }
    }
}

/// How often, at most, lapses are logged (each is counted).
const LAPSE_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Leases that ran out while current: counted, and logged at most every
/// [`LAPSE_LOG_INTERVAL`].
struct Lapses {
    counter: metrics::Counter,
    logged: Option<Instant>,
    /// Lapses since the last log line.
    unlogged: u64,
    total: u64,
}

struct State {
    client: Client,
    subject: String,
    group: String,
    stats: Arc<Statistics>,
    config: DrainConfig,
    /// The subscriptions still delivering, the oldest first; at most one not retiring
    /// (the current one, last).
    leases: Vec<Lease>,
    /// False until the first lease was granted.
    first_granted: bool,
    /// `None` once draining started.
    stop: Option<std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    /// The recent arrival rate, which sets the allowance and the lease.
    arrivals: Arrivals,
    /// Set when the current lease ran out before its successor was made.
    lapsed: bool,
    lapses: Lapses,
    /// The allowance asked for at drain start.
    allowance: u64,
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
    let Draining {
        subscriber,
        client,
        subject,
        group,
        stats,
        connects,
        config,
    } = draining;
    let lapses = Lapses {
        counter: metrics::counter!(crate::metrics::LEASE_LAPSES_TOTAL, "service" => group.clone()),
        logged: None,
        unlogged: 0,
        total: 0,
    };
    let state = State {
        client,
        subject,
        group,
        stats,
        config,
        leases: vec![Lease::new(subscriber, connects)],
        first_granted: false,
        stop: Some(Box::pin(shutdown.cancelled_owned())),
        arrivals: Arrivals::new(Instant::now()),
        lapsed: false,
        lapses,
        allowance: 0,
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
                        lapses: state.lapses.total,
                        left: state.left,
                    });
                }
                None
            }
        }
    })
}

/// The next message of any lease, the oldest polled first, with the lease's index;
/// leases that have ended are removed, and `lapsed` is set when one of them was the
/// current one (no successor was made before it ran out). `None` once there are none.
fn poll_leases(
    leases: &mut Vec<Lease>,
    lapsed: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<Option<(usize, Message)>> {
    let mut i = 0;
    while i < leases.len() {
        match leases[i].subscriber.poll_next_unpin(cx) {
            Poll::Ready(Some(message)) => return Poll::Ready(Some((i, message))),
            Poll::Ready(None) => {
                *lapsed |= !leases.remove(i).retiring;
            }
            Poll::Pending => i += 1,
        }
    }
    if leases.is_empty() {
        Poll::Ready(None)
    } else {
        Poll::Pending
    }
}

impl State {
    async fn next(&mut self) -> Option<Message> {
        if !self.first_granted {
            self.first_granted = true;
            self.grant_first().await;
        }
        while self.stop.is_some() {
            // A successor is made before a lease can end (at half of it), unless a burst
            // delivered the rest first (a lapse, counted): no current subscription then
            // means the last one could not be made, and the client is closing.
            if !self.leases.iter().any(|l| !l.retiring) && !self.renew().await {
                // What the old ones hold, then the end.
                break;
            }
            if let Some(message) = self.ready.pop_front() {
                return Some(message);
            }
            let Some(stop) = self.stop.as_mut() else {
                break;
            };
            tokio::select! {
                taken = poll_fn(|cx| poll_leases(&mut self.leases, &mut self.lapsed, cx)) => {
                    // `None`: every lease ended; the loop subscribes again.
                    if let Some((i, message)) = taken {
                        self.took(i);
                        self.ready.push_back(message);
                        self.take_delivered().await;
                        self.tend().await;
                    }
                    self.note_lapse();
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
        // Leases end by count from here on: not a lapse.
        let mut ended = false;
        loop {
            let Some(window) = self.window.as_mut() else {
                // Left outright (or never asked): what is still buffered, then the end.
                let (_, message) =
                    poll_fn(|cx| poll_leases(&mut self.leases, &mut ended, cx)).await?;
                self.after_drain += 1;
                return Some(message);
            };
            tokio::select! {
                taken = poll_fn(|cx| poll_leases(&mut self.leases, &mut ended, cx)) => {
                    let Some((_, message)) = taken else {
                        // The client removed each on the last message asked of it.
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
                        window = ?self.config.drain_window,
                        allowance = self.allowance,
                        "what was asked was not used up in time: unsubscribing outright"
                    );
                    for lease in &mut self.leases {
                        unsubscribe(&mut lease.subscriber).await;
                    }
                }
            }
        }
    }

    /// Takes everything the leases already hold, without waiting: the count a lease is
    /// renewed on is then what the bus has delivered, not what the reader has taken so
    /// far (see "Bursts" in the module docs). Polled outside tokio's cooperative budget,
    /// which would hide some.
    async fn take_delivered(&mut self) {
        while let Poll::Ready(Some((i, message))) = tokio::task::unconstrained(poll_fn(|cx| {
            Poll::Ready(poll_leases(&mut self.leases, &mut self.lapsed, cx))
        }))
        .await
        {
            self.took(i);
            self.ready.push_back(message);
        }
    }

    /// Counts (and now and then logs) a lease that ran out while it was the current one:
    /// the worker was out of its group from then until its successor was subscribed.
    fn note_lapse(&mut self) {
        if !std::mem::take(&mut self.lapsed) {
            return;
        }
        self.lapses.counter.increment(1);
        self.lapses.unlogged += 1;
        self.lapses.total += 1;
        let now = Instant::now();
        if self
            .lapses
            .logged
            .is_some_and(|at| now.duration_since(at) < LAPSE_LOG_INTERVAL)
        {
            return;
        }
        tracing::warn!(
            subject = %self.subject,
            lapses = self.lapses.unlogged,
            "a queue subscription's lease ran out before its successor was subscribed: the worker was out of its group for a moment (a burst larger than half the lease, or a reader that stopped; see --queue-lease and --queue-capacity)"
        );
        self.lapses.logged = Some(now);
        self.lapses.unlogged = 0;
    }

    /// Grants the subscription it was made with its first lease; when a connection was
    /// made since it was subscribed, the counts may differ and it cannot be granted one:
    /// it retires unleased (it is unsubscribed outright at the drain) and a fresh one
    /// takes over.
    async fn grant_first(&mut self) {
        let connects = self.stats.connects.load(Ordering::Relaxed);
        let Some(first) = self.leases.first_mut() else {
            return;
        };
        if !counts_agree(first.connects, connects) {
            first.retiring = true;
            self.renew().await;
            return;
        }
        grant(first, lease_now(&self.arrivals, &self.config)).await;
    }

    /// Counts a message taken from lease `i` before draining.
    fn took(&mut self, i: usize) {
        self.leases[i].taken += 1;
        self.arrivals
            .record(Instant::now(), self.config.drain_window);
    }

    /// After a message: once half of the current lease is used, or when a connection
    /// was made since it was subscribed, a fresh subscription takes over and the current
    /// one retires (see "The lease").
    async fn tend(&mut self) {
        let connects = self.stats.connects.load(Ordering::Relaxed);
        let Some(current) = self.leases.iter_mut().find(|l| !l.retiring) else {
            return;
        };
        if counts_agree(current.connects, connects) {
            let Some(ends_at) = current.ends_at else {
                return;
            };
            if current.taken.saturating_mul(2) < ends_at {
                return;
            }
        } else {
            tracing::info!(subject = %self.subject, "reconnected: subscribing anew, the old subscription runs out its lease");
        }
        current.retiring = true;
        self.renew().await;
    }

    /// Subscribes a fresh member of the group (the current one), granted a lease at
    /// once; false when the client is closed.
    async fn renew(&mut self) -> bool {
        let connects = self.stats.connects.load(Ordering::Relaxed);
        let fresh = self
            .client
            .queue_subscribe(self.subject.clone(), self.group.clone())
            .await;
        let fresh = match fresh {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::warn!(subject = %self.subject, %error, "cannot subscribe anew");
                return false;
            }
        };
        let mut lease = Lease::new(fresh, connects);
        grant(&mut lease, lease_now(&self.arrivals, &self.config)).await;
        self.leases.push(lease);
        true
    }

    /// Takes what is waiting, then asks the server to stop each subscription whose
    /// counts agree after the allowance (unless its lease ends sooner); the others run
    /// out their leases (see "The lease").
    async fn start_draining(&mut self) {
        self.take_delivered().await;
        self.note_lapse();
        let config = self.config;
        let expected = self
            .arrivals
            .expected_in_window(Instant::now(), config.drain_window);
        let allowance = allowance(expected, config.drain_allowance);
        let connects = self.stats.connects.load(Ordering::Relaxed);
        for lease in &mut self.leases {
            if !counts_agree(lease.connects, connects) {
                tracing::debug!(subject = %self.subject, "reconnected since subscribing: the subscription runs out its lease");
                continue;
            }
            let max = lease.taken.saturating_add(allowance);
            if lease.ends_at.is_some_and(|ends_at| ends_at <= max) {
                continue;
            }
            if let Err(error) = lease.subscriber.unsubscribe_after(max).await {
                // The client is closed: nothing more will arrive.
                tracing::warn!(%error, "cannot unsubscribe");
                continue;
            }
            lease.ends_at = Some(max);
            self.allowance = allowance;
        }

        self.window = Some(Box::pin(tokio::time::sleep(config.drain_window)));
    }
}

/// The lease a subscription is granted now.
fn lease_now(arrivals: &Arrivals, config: &DrainConfig) -> u64 {
    lease(
        arrivals.expected_in_window(Instant::now(), config.drain_window),
        config.queue_lease,
    )
}

/// Grants `lease`, from which nothing was taken yet, its lease: both sides end it after
/// `length` messages.
async fn grant(lease: &mut Lease, length: u64) {
    match lease.subscriber.unsubscribe_after(length).await {
        Ok(()) => lease.ends_at = Some(length),
        // The client is closed: nothing more will arrive.
        Err(error) => tracing::warn!(%error, "cannot grant the subscription its lease"),
    }
}

async fn unsubscribe(subscriber: &mut Subscriber) {
    if let Err(error) = subscriber.unsubscribe().await {
        tracing::warn!(%error, "cannot unsubscribe");
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use broker::testing::{Bus, round_trip};
    use bytes::Bytes;
    use futures::{FutureExt as _, StreamExt as _};
    use testkit::within;
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
        round_trip(client).await;
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
}
