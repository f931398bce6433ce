//! Per-session rate limiting.

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
}
