//! How a bus connection comes back and moves: jittered exponential backoff between
//! reconnect attempts, and the lame-duck signal a server sends before it goes away.
//!
//! # Backoff
//!
//! After an outage every gate and worker of a fleet reconnects at once; without jitter
//! they would all hit the servers in the same instant, again and again. Attempt `n`
//! (from 1) waits a random time in `[c/2, c]`, where `c = min(max, min * 2^(n-1))`: the
//! first attempt comes within [`RECONNECT_DELAY_MIN`], later ones spread out up to
//! [`RECONNECT_DELAY_MAX`]. async-nats counts attempts per server tried and starts again
//! from 1 after a successful connection. On reconnecting, async-nats subscribes every
//! subscription again by itself; what the worker keeps beyond that (its snapshot, its
//! schema announcement) it re-establishes itself (see [`crate::worker`]).
//!
//! # Lame duck
//!
//! A server entering lame duck mode (nats-server `--signal ldm`, before an upgrade)
//! tells its clients with an INFO, stops accepting, and after a grace period closes them
//! one by one. async-nats reports it as an event; [`Signals`] turns that event, and each
//! connection made, into something a worker can wait on ([`signals`]), so it can move to
//! another server of its list while its own still runs, and announce its schema again
//! after a reconnect (see [`crate::worker`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_nats::{Event, Statistics};
use tokio::sync::Notify;

use super::Client;

/// Reconnect attempts made without delay after [`Signals::hurry`]: enough to try every
/// server of a small cluster once, the one going away included.
pub const HURRIED_ATTEMPTS: usize = 4;

/// The most the first reconnect attempt waits (it waits at least half of it).
pub const RECONNECT_DELAY_MIN: Duration = Duration::from_millis(100);
/// The most any reconnect attempt waits.
pub const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(5);

/// Bounds of the reconnect delay (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            min: RECONNECT_DELAY_MIN,
            max: RECONNECT_DELAY_MAX,
        }
    }
}

impl Backoff {
    /// The delay before attempt `attempt` (from 1), `jitter` (in `[0, 1]`) choosing
    /// where in `[c/2, c]` it falls.
    pub fn delay(&self, attempt: usize, jitter: f64) -> Duration {
        let doublings = u32::try_from(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        let ceiling = self
            .min
            .checked_mul(2u32.saturating_pow(doublings.min(31)))
            .unwrap_or(self.max)
            .min(self.max);
        ceiling / 2 + ceiling.mul_f64(jitter.clamp(0.0, 1.0)) / 2
    }

    /// [`Backoff::delay`] with a random jitter: what async-nats is given.
    pub fn random_delay(&self, attempt: usize) -> Duration {
        self.delay(attempt, fastrand::f64())
    }
}

/// What a connection's events raise: its server entering lame duck mode, and a
/// connection made (the first one included). One raised while nobody waited is kept for
/// the next wait.
#[derive(Debug, Default)]
pub struct Signals {
    lame_duck: Notify,
    connected: Notify,
    /// Reconnect attempts still to be made without the backoff's delay.
    hurried: AtomicUsize,
}

impl Signals {
    /// Called from the connection's event callback.
    pub(crate) fn raise(&self, event: &Event) {
        match event {
            Event::LameDuckMode => self.lame_duck.notify_one(),
            Event::Connected => {
                self.hurried.store(0, Ordering::Relaxed);
                self.connected.notify_one();
            }
            _ => {}
        }
    }

    /// Makes the next [`HURRIED_ATTEMPTS`] reconnect attempts, until one connects, without
    /// the backoff's delay: a worker moving a connection off a server in lame duck mode
    /// reconnects it at once, since the answers it carries wait meanwhile. Bounded, so a
    /// fleet whose servers are all down still backs off.
    pub fn hurry(&self) {
        self.hurried.store(HURRIED_ATTEMPTS, Ordering::Relaxed);
    }

    /// True (and one fewer left) when the next attempt is a hurried one.
    pub(crate) fn take_hurried_attempt(&self) -> bool {
        self.hurried
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    /// Waits for the next lame-duck notice.
    pub async fn lame_duck(&self) {
        self.lame_duck.notified().await;
    }

    /// Waits for the next connection made.
    pub async fn connected(&self) {
        self.connected.notified().await;
    }
}

/// The signals of every connection [`super::connect`] made, by the client's
/// statistics (shared by all clones of one client, and by nothing else). The callback
/// that raises it holds only the signal, never the client: a client kept by its own
/// callback would never close.
type Registry = Vec<(Weak<Statistics>, Arc<Signals>)>;
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// Remembers `signal` as `client`'s, forgetting the entries of clients that are gone.
pub(crate) fn register(client: &async_nats::Client, signal: Arc<Signals>) {
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    registry.retain(|(stats, _)| stats.strong_count() > 0);
    registry.push((Arc::downgrade(&client.statistics()), signal));
}

/// The signals of `client`, when [`super::connect`] made it.
pub fn signals(client: &Client) -> Option<Arc<Signals>> {
    let stats = client.statistics();
    let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    registry
        .iter()
        .find(|(known, _)| std::ptr::eq(known.as_ptr(), Arc::as_ptr(&stats)))
        .map(|(_, signal)| signal.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_attempt_waits_between_half_the_minimum_and_the_minimum() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(1, 0.0), RECONNECT_DELAY_MIN / 2);
        assert_eq!(backoff.delay(1, 1.0), RECONNECT_DELAY_MIN);
        // async-nats never asks for attempt 0; it is treated as the first.
        assert_eq!(backoff.delay(0, 1.0), RECONNECT_DELAY_MIN);
    }

    #[test]
    fn delays_double_up_to_the_maximum_and_stay_there() {
        let backoff = Backoff {
            min: 100 * MS,
            max: 1000 * MS,
        };
        let ceilings: Vec<Duration> = (1..=6).map(|n| backoff.delay(n, 1.0)).collect();
        assert_eq!(
            ceilings,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
        // No overflow however many attempts.
        assert_eq!(backoff.delay(usize::MAX, 1.0), 1000 * MS);
        assert_eq!(backoff.delay(usize::MAX, 0.0), 500 * MS);
        // Out-of-range jitter is clamped.
        assert_eq!(backoff.delay(1, 7.0), 100 * MS);
        assert_eq!(backoff.delay(1, -1.0), 50 * MS);
    }

    #[test]
    fn random_delays_stay_in_bounds_and_spread() {
        let backoff = Backoff::default();
        for attempt in 1..=12 {
            let ceiling = backoff.delay(attempt, 1.0);
            let delays: Vec<Duration> = (0..200).map(|_| backoff.random_delay(attempt)).collect();
            assert!(
                delays.iter().all(|d| *d >= ceiling / 2 && *d <= ceiling),
                "attempt {attempt}: {delays:?}"
            );
            let distinct: std::collections::HashSet<_> = delays.iter().collect();
            assert!(distinct.len() > 100, "attempt {attempt}: too little jitter");
        }
    }

    #[test]
    fn a_hurry_skips_the_delay_of_a_bounded_number_of_attempts_until_connected() {
        let signals = Signals::default();
        assert!(!signals.take_hurried_attempt());
        signals.hurry();
        for _ in 0..HURRIED_ATTEMPTS {
            assert!(signals.take_hurried_attempt());
        }
        assert!(
            !signals.take_hurried_attempt(),
            "more than {HURRIED_ATTEMPTS}"
        );
        signals.hurry();
        assert!(signals.take_hurried_attempt());
        signals.raise(&Event::Connected);
        assert!(
            !signals.take_hurried_attempt(),
            "still hurried once connected"
        );
    }

    #[tokio::test]
    async fn a_raised_notice_is_kept_until_waited_for() {
        let signals = Signals::default();
        signals.raise(&Event::LameDuckMode);
        signals.raise(&Event::Connected);
        let wait = Duration::from_secs(1);
        tokio::time::timeout(wait, signals.lame_duck())
            .await
            .expect("the lame-duck notice raised before waiting was lost");
        tokio::time::timeout(wait, signals.connected())
            .await
            .expect("the connection raised before waiting was lost");
    }
}
