//! Leaving a queue group without losing what the bus already routed to the worker.
//!
//! async-nats' `Subscriber::drain` forgets a subscription one I/O turn after its UNSUB
//! and drops what arrives for it after that: under load, a request or two per drain,
//! answered 408 by the gate. NATS's auto-unsubscribe, `UNSUB <sid> <max>`, is lossless
//! when the client's count of the subscription's messages and the server's agree: both
//! stop on the same message. So a draining subscription asks to leave after what it took
//! plus an allowance sized from its recent rate ([`arrivals`]), far above what one round
//! trip carries; one that does not use it up within the drain window unsubscribes
//! outright.
//!
//! A reconnect breaks the two counts for anything asked after it, while a limit set
//! before it survives. So every queue subscription holds a limit from the moment it is
//! made, its *lease*, and once half of it has been delivered a successor is subscribed
//! and the old one runs out: the worker never unsubscribes outright while it serves. The
//! reasoning and figures (what is left to chance, bursts, costs) are in docs/workers.md,
//! "Draining on shutdown".

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use async_nats::{Message, Statistics};

use crate::bus::{Client, Subscriber};
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
    /// docs/workers.md, "Bursts"): moments the worker was out of its group.
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
    /// far (docs/workers.md, "Bursts"). Polled outside tokio's cooperative budget,
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
    /// one retires (see the module docs).
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
    /// out their leases.
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
mod tests;
