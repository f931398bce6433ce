//! A subscription's recent arrival rate, and the drain allowance it sets (the reasons
//! are in docs/workers.md, "Draining on shutdown").
//!
//! # The estimator
//!
//! Two buckets of count, each one drain window long: `current` counts the messages taken
//! since `current_from`, `previous` those of the window before. A message that finds the
//! current bucket a window old or more starts a new one: the current becomes the
//! previous, or, when a whole window passed without a message, both start again from 0.
//! At drain start the same turn-over is applied, and the two counts are spread over the
//! time they cover, from the start of the previous bucket to now: between one and two
//! windows (or the subscription's age, if it is younger). The messages expected in the
//! next window are therefore those of the last one to two windows, scaled to one: recent,
//! yet not the count of a single burst. Each message costs one clock read, a comparison
//! and an increment; nothing is allocated or locked.

use std::time::{Duration, Instant};

use crate::config::MAX_QUEUE_LEASE;

/// How many allowances the recent rate is expected to bring within one drain window:
/// the allowance is used up, by count, in about a quarter of the window, leaving three
/// quarters for a rate that slowed down (docs/workers.md has the margin this leaves).
pub(crate) const ALLOWANCES_PER_WINDOW: u64 = 4;

/// The allowance a subscription asks for at drain start: what its recent rate brings in
/// a [`ALLOWANCES_PER_WINDOW`]th of the window, at least 1 and at most `most` (the
/// configured [`crate::config::DrainConfig::drain_allowance`]). A `most` of 0 is 0:
/// leave at once.
pub(crate) fn allowance(expected_in_window: u64, most: u64) -> u64 {
    if most == 0 {
        return 0;
    }
    (expected_in_window / ALLOWANCES_PER_WINDOW).clamp(1, most)
}

/// The lease a subscription is granted (see the [parent module](super)):
/// what its recent rate brings in a [`ALLOWANCES_PER_WINDOW`]th of the window, at least
/// `least` (the configured [`crate::config::DrainConfig::queue_lease`]) and at most
/// [`MAX_QUEUE_LEASE`].
pub(crate) fn lease(expected_in_window: u64, least: u64) -> u64 {
    (expected_in_window / ALLOWANCES_PER_WINDOW).clamp(least, MAX_QUEUE_LEASE.max(least))
}

/// The two buckets of the estimator (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrivals {
    /// When counting started: nothing is known of the time before.
    since: Instant,
    current_from: Instant,
    current: u64,
    previous: u64,
}

impl Arrivals {
    pub(crate) fn new(now: Instant) -> Self {
        Arrivals {
            since: now,
            current_from: now,
            current: 0,
            previous: 0,
        }
    }

    /// Counts a message taken at `now`; `window` is the buckets' length.
    pub(crate) fn record(&mut self, now: Instant, window: Duration) {
        self.turn_over(now, window);
        self.current = self.current.saturating_add(1);
    }

    /// The messages expected in the next `window` at the rate of the last one to two.
    pub(crate) fn expected_in_window(&self, now: Instant, window: Duration) -> u64 {
        let mut buckets = *self;
        buckets.turn_over(now, window);
        let count = buckets.previous.saturating_add(buckets.current);
        let span = now
            .saturating_duration_since(buckets.current_from)
            .saturating_add(window)
            .min(now.saturating_duration_since(buckets.since));
        // Messages in no time at all count as taking a nanosecond: a rate over any cap.
        let expected = u128::from(count).saturating_mul(window.as_nanos()) / span.as_nanos().max(1);
        u64::try_from(expected).unwrap_or(u64::MAX)
    }

    fn turn_over(&mut self, now: Instant, window: Duration) {
        let age = now.saturating_duration_since(self.current_from);
        if age < window {
            return;
        }
        if age < window.saturating_mul(2) {
            self.previous = self.current;
            // At most `now`: no overflow.
            self.current_from += window;
        } else {
            self.previous = 0;
            self.current_from = now;
        }
        self.current = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_DRAIN_ALLOWANCE;

    const WINDOW: Duration = Duration::from_millis(500);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn allowance_at_its_edges() {
        // Nothing recent: one message, then the window.
        assert_eq!(allowance(0, 64), 1);
        assert_eq!(allowance(ALLOWANCES_PER_WINDOW - 1, 64), 1);
        assert_eq!(allowance(2 * ALLOWANCES_PER_WINDOW, 64), 2);
        assert_eq!(allowance(64 * ALLOWANCES_PER_WINDOW, 64), 64);
        assert_eq!(allowance(64 * ALLOWANCES_PER_WINDOW + 4, 64), 64);
        assert_eq!(allowance(u64::MAX, 64), 64);
        // An allowance of 0 configured: leave at once, whatever the rate.
        assert_eq!(allowance(0, 0), 0);
        assert_eq!(allowance(u64::MAX, 0), 0);
    }

    #[test]
    fn lease_at_its_edges() {
        assert_eq!(lease(0, 1024), 1024);
        assert_eq!(lease(1024 * ALLOWANCES_PER_WINDOW, 1024), 1024);
        assert_eq!(lease(1025 * ALLOWANCES_PER_WINDOW, 1024), 1025);
        assert_eq!(lease(u64::MAX, 1024), MAX_QUEUE_LEASE);
        assert_eq!(lease(0, MAX_QUEUE_LEASE), MAX_QUEUE_LEASE);
    }

    /// `count` messages `gap` apart, the first `gap` after `start`; and the last one's time.
    fn steady(start: Instant, gap: Duration, count: u32) -> (Arrivals, Instant) {
        let mut arrivals = Arrivals::new(start);
        let mut now = start;
        for _ in 0..count {
            now += gap;
            arrivals.record(now, WINDOW);
        }
        (arrivals, now)
    }

    #[test]
    fn a_steady_rate_is_measured_at_any_point_of_the_bucket() {
        let start = Instant::now();
        // 25 a window, drained half-way between two messages, the last one anywhere in
        // its bucket.
        for count in 50..=75 {
            let (arrivals, last) = steady(start, 20 * MS, count);
            let expected = arrivals.expected_in_window(last + 10 * MS, WINDOW);
            assert!((24..=26).contains(&expected), "{count}: {expected}");
        }
    }

    #[test]
    fn a_young_subscription_is_measured_over_its_age() {
        let start = Instant::now();
        let (arrivals, last) = steady(start, 5 * MS, 100);
        assert_eq!(last, start + WINDOW);
        // 100 messages in one window, over one window and a turn-over just made.
        assert_eq!(arrivals.expected_in_window(last, WINDOW), 100);
        let mut arrivals = Arrivals::new(start);
        arrivals.record(start + 50 * MS, WINDOW);
        assert_eq!(arrivals.expected_in_window(start + 100 * MS, WINDOW), 5);
    }

    #[test]
    fn the_rate_fades_with_silence() {
        let start = Instant::now();
        let (arrivals, last) = steady(start, 5 * MS, 300);
        // Half a window of silence: the last window's 100 messages (and the one that
        // began the bucket) spread over one and a half windows.
        assert_eq!(arrivals.expected_in_window(last + WINDOW / 2, WINDOW), 67);
        // Two windows of silence: nothing recent.
        assert_eq!(arrivals.expected_in_window(last + 2 * WINDOW, WINDOW), 0);
        // A message after a long silence starts afresh.
        let mut arrivals = arrivals;
        arrivals.record(last + 10 * WINDOW, WINDOW);
        assert_eq!(
            arrivals.expected_in_window(last + 10 * WINDOW + WINDOW / 2, WINDOW),
            0
        );
    }

    #[test]
    fn edges_of_the_clock_and_the_window() {
        let start = Instant::now();
        let mut arrivals = Arrivals::new(start);
        assert_eq!(arrivals.expected_in_window(start, WINDOW), 0);
        // A message in no time: a rate over any cap.
        arrivals.record(start, WINDOW);
        assert!(
            arrivals.expected_in_window(start, WINDOW)
                > MAX_DRAIN_ALLOWANCE * ALLOWANCES_PER_WINDOW
        );
        // A window of zero expects nothing.
        arrivals.record(start + MS, Duration::ZERO);
        assert_eq!(arrivals.expected_in_window(start + MS, Duration::ZERO), 0);
        // The longest window does not overflow.
        let mut arrivals = Arrivals::new(start);
        arrivals.record(start + MS, Duration::MAX);
        assert_eq!(
            arrivals.expected_in_window(start + MS, Duration::MAX),
            u64::MAX
        );
    }
}
