//! Rate and in-flight limits: a session's token bucket, and the gate-wide budget of
//! requests awaiting workers that every session draws from.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

/// A token bucket: `rate` requests per second on average, up to `burst` at once.
/// A rate of 0 means unlimited.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The gate-wide budget of requests awaiting workers (`--max-gate-in-flight`). The last
/// `reserve` slots (`--gate-reserve`) go only to light sessions, those with fewer than
/// `light` requests in flight (`--light-in-flight`): a few sessions flooding requests
/// cannot take the whole budget from everyone else.
#[derive(Debug)]
pub(crate) struct InFlight {
    taken: AtomicUsize,
    max: usize,
    reserve: usize,
    light: usize,
}

impl InFlight {
    pub(crate) fn new(max: usize, reserve: usize, light: usize) -> Self {
        InFlight {
            taken: AtomicUsize::new(0),
            max,
            reserve,
            light,
        }
    }

    /// Takes a slot for a session that has `own` requests in flight already, if one is
    /// free to it.
    pub(crate) fn take(&self, own: usize) -> bool {
        let limit = if own < self.light {
            self.max
        } else {
            self.max.saturating_sub(self.reserve)
        };
        let taken = self.taken.fetch_add(1, Ordering::Relaxed);
        if taken < limit {
            return true;
        }
        self.taken.fetch_sub(1, Ordering::Relaxed);
        false
    }

    /// Takes `n` slots whatever the limit: requests already in flight that a resumed
    /// session brings from its old gate.
    pub(crate) fn take_anyway(&self, n: usize) {
        self.taken.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back `n` slots.
    pub(crate) fn give_back(&self, n: usize) {
        if n > 0 {
            self.taken.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Slots taken now.
    pub(crate) fn taken(&self) -> usize {
        self.taken.load(Ordering::Relaxed)
    }
}

/// What the gate holds while its bus connection is down (`--max-held` requests and
/// `--max-held-bytes` of their bodies, over all sessions).
#[derive(Debug)]
pub(crate) struct Held {
    count: AtomicUsize,
    bytes: AtomicUsize,
    max_count: usize,
    max_bytes: usize,
}

impl Held {
    pub(crate) fn new(max_count: usize, max_bytes: usize) -> Self {
        Held {
            count: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            max_count,
            max_bytes,
        }
    }

    /// Takes room for one request of `bytes`, if both bounds allow it.
    pub(crate) fn take(&self, bytes: usize) -> bool {
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.max_count {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        if self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > self.max_bytes {
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.count.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Gives back the room of one request of `bytes`.
    pub(crate) fn give_back(&self, bytes: usize) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Requests held now.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate() {
        let start = Instant::now();
        let mut b = TokenBucket::new(100, 5);
        assert_eq!((0..10).filter(|_| b.take(start)).count(), 5);
        // 100/s refills one token every 10 ms.
        assert!(!b.take(start + Duration::from_millis(5)));
        assert!(b.take(start + Duration::from_millis(16)));
        assert!(!b.take(start + Duration::from_millis(16)));
        // Idle time never banks more than the burst.
        assert_eq!(
            (0..10)
                .filter(|_| b.take(start + Duration::from_secs(10)))
                .count(),
            5
        );
    }

    #[test]
    fn zero_rate_is_unlimited() {
        let mut b = TokenBucket::new(0, 1);
        assert!((0..1000).all(|_| b.take(Instant::now())));
    }

    #[test]
    fn the_reserve_is_kept_for_light_sessions() {
        let budget = InFlight::new(4, 2, 1);
        // A heavy session (1 in flight already) gets the first max - reserve slots.
        assert!(budget.take(1) && budget.take(1));
        assert!(!budget.take(1));
        // A light one (none in flight) still gets the reserve, and no more.
        assert!(budget.take(0) && budget.take(0));
        assert!(!budget.take(0));
        assert_eq!(budget.taken(), 4);
        budget.give_back(3);
        assert_eq!(budget.taken(), 1);
        assert!(budget.take(1));
        assert!(!budget.take(1));
    }

    #[test]
    fn held_requests_are_bounded_by_count_and_by_bytes() {
        let held = Held::new(2, 100);
        assert!(held.take(60));
        assert!(!held.take(41), "over the bytes");
        assert!(held.take(40));
        assert!(!held.take(0), "over the count");
        held.give_back(60);
        assert_eq!(held.count(), 1);
        assert!(held.take(60));
        assert!(!held.take(1));
    }
}
