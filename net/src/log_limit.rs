//! Rate-limited logging for anything a peer can trigger over and over: a failing accept,
//! a slow consumer, a refused connection. One line per kind per interval, saying how
//! many events it stands for, so an attacker who can open connections cannot fill the
//! disk or burn a core formatting log lines.
//!
//! A [`LogLimiter`] is one kind of line; keep it in a `static` (or beside whatever
//! raises the event) and ask it before logging:
//!
//! ```
//! use net::LogLimiter;
//! static SLOW: LogLimiter = LogLimiter::per_second();
//! if let Some(tally) = SLOW.check() {
//!     tracing::warn!("slow consumer: closed{tally}");
//! }
//! ```
//!
//! The first event after a quiet interval is logged at once and plainly; events within
//! the interval after it are counted, and the next line carries the count
//! (`accept failed ×12,345 in the last 1.0 s: Too many open files`).

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The interval of [`LogLimiter::per_second`]: a flood shows up as one line a second,
/// often enough to follow it live, rare enough that a log keeps no more than
/// 86,400 lines a day per kind however hard it is pushed.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// One kind of log line, written at most once per interval.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    /// Events since the last line written (the one asking now included).
    events: AtomicU64,
    /// When the last line was written; `None` before the first.
    last: Mutex<Option<Instant>>,
}

/// What a line stands for: the events since the previous line and how long ago that was.
/// Its `Display` is empty for a single event and ` ×N in the last T s` otherwise, so it
/// reads well right after the line's subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub events: u64,
    pub since: Duration,
}

impl LogLimiter {
    /// A limiter writing at most one line per `interval`.
    pub const fn new(interval: Duration) -> LogLimiter {
        LogLimiter {
            interval,
            events: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }

    /// A limiter writing at most one line per [`LOG_INTERVAL`].
    pub const fn per_second() -> LogLimiter {
        LogLimiter::new(LOG_INTERVAL)
    }

    /// Counts one event; returns what to say when a line is due now, `None` when the
    /// event is only counted.
    pub fn check(&self) -> Option<Tally> {
        self.check_at(Instant::now())
    }

    /// [`check`](Self::check) at a given time, for tests.
    pub fn check_at(&self, now: Instant) -> Option<Tally> {
        self.events.fetch_add(1, Ordering::Relaxed);
        // Only events nobody else is logging at this instant get here often; the lock
        // is held for two loads and a store.
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let since = match *last {
            Some(at) if now.saturating_duration_since(at) < self.interval => return None,
            Some(at) => now.saturating_duration_since(at),
            None => Duration::ZERO,
        };
        *last = Some(now);
        let events = self.events.swap(0, Ordering::Relaxed);
        Some(Tally { events, since })
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.events <= 1 {
            return Ok(());
        }
        write!(
            f,
            " ×{} in the last {:.1} s",
            Grouped(self.events),
            self.since.as_secs_f64()
        )
    }
}

/// A count with thousands separators: `12,345`.
struct Grouped(u64);

impl fmt::Display for Grouped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                f.write_str(",")?;
            }
            write!(f, "{digit}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_is_logged_plainly() {
        let limiter = LogLimiter::per_second();
        let tally = limiter.check_at(Instant::now()).unwrap();
        assert_eq!(tally.events, 1);
        assert_eq!(tally.to_string(), "");
    }

    #[test]
    fn events_within_the_interval_are_counted_into_the_next_line() {
        let limiter = LogLimiter::per_second();
        let start = Instant::now();
        assert!(limiter.check_at(start).is_some());
        for ms in 1..12_345 {
            let at = start + Duration::from_micros(ms * 80);
            assert_eq!(limiter.check_at(at), None, "event {ms} was logged");
        }
        let tally = limiter.check_at(start + Duration::from_secs(1)).unwrap();
        assert_eq!(tally.events, 12_345);
        assert_eq!(tally.to_string(), " ×12,345 in the last 1.0 s");
        // The count starts again after a line.
        let next = limiter.check_at(start + Duration::from_secs(3)).unwrap();
        assert_eq!(next.events, 1);
    }

    #[test]
    fn counts_read_with_separators() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1,000"),
            (5_300_000, "5,300,000"),
        ] {
            assert_eq!(Grouped(n).to_string(), text);
        }
    }
}
