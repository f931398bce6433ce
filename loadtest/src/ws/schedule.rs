//! The open-loop send schedule: request `k` of a client is due at `start + k * interval`,
//! never by adding intervals up, so a late wake-up never shifts later slots and a stall
//! shows as lag, not a quietly lower rate. Also each client's plan (warm-up and measured
//! slots) and the request body.

use std::time::{Duration, Instant};

/// Absolute send times of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    start: Instant,
    interval: Duration,
}

impl Schedule {
    /// Slot 0 at `start`, one slot per `interval` (at least 1 ns, so `due` never divides
    /// by zero).
    pub fn new(start: Instant, interval: Duration) -> Self {
        Schedule {
            start,
            interval: interval.max(Duration::from_nanos(1)),
        }
    }

    /// When slot `slot` is due.
    pub fn at(&self, slot: u64) -> Instant {
        self.start + times(self.interval, slot)
    }

    /// How many slots are due at `now`: slots `0..due(now)` have `at(slot) <= now`.
    pub fn due(&self, now: Instant) -> u64 {
        let Some(elapsed) = now.checked_duration_since(self.start) else {
            return 0;
        };
        let slots = elapsed.as_nanos() / self.interval.as_nanos() + 1;
        u64::try_from(slots).unwrap_or(u64::MAX)
    }

    /// The first slot due at or after `t`.
    pub fn first_at_or_after(&self, t: Instant) -> u64 {
        let elapsed = t.saturating_duration_since(self.start);
        let slots = elapsed.as_nanos().div_ceil(self.interval.as_nanos());
        u64::try_from(slots).unwrap_or(u64::MAX)
    }
}

/// `d * n` without `Duration * u32`'s limit, saturating at `u64::MAX` ns (584 years).
pub fn times(d: Duration, n: u64) -> Duration {
    let nanos = d.as_nanos().saturating_mul(u128::from(n));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// When a run's measured part ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Slots due before this instant are sent and measured.
    At(Instant),
    /// This many slots per client after the warm-up.
    Count(u64),
}

/// One client's part of a run: its schedule, first measured slot (those before are
/// warm-up) and end (slots `0..end` are sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub schedule: Schedule,
    pub first_measured: u64,
    pub end: u64,
}

impl Plan {
    pub fn new(schedule: Schedule, window_start: Instant, stop: Stop) -> Self {
        let first_measured = schedule.first_at_or_after(window_start);
        let end = match stop {
            Stop::At(t) => schedule.first_at_or_after(t).max(first_measured),
            Stop::Count(n) => first_measured.saturating_add(n),
        };
        Plan {
            schedule,
            first_measured,
            end,
        }
    }

    /// When the last slot is due (the start if there is none).
    pub fn last_due(&self) -> Instant {
        self.schedule.at(self.end.saturating_sub(1))
    }

    pub fn is_measured(&self, slot: u64) -> bool {
        (self.first_measured..self.end).contains(&slot)
    }

    /// How many of `slots` are measured.
    pub fn measured_in(&self, slots: std::ops::Range<u64>) -> u64 {
        let from = slots.start.max(self.first_measured);
        slots.end.min(self.end).saturating_sub(from)
    }
}

/// What every request of a run carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// `Hello World #0042` with the request's slot number (16 to 32 bytes): what
    /// `echo.raw` echoes.
    Hello,
    /// The same bytes every time: a service that decodes its request (chat's protobuf
    /// messages) needs a valid one. Cloning is a reference count, no copy.
    Fixed(bytes::Bytes),
}

impl Payload {
    pub fn body(&self, seq: u64) -> bytes::Bytes {
        match self {
            Payload::Hello => {
                let mut text = format!("Hello World #{seq:04}");
                text.truncate(32);
                text.into()
            }
            Payload::Fixed(bytes) => bytes.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn slots_are_absolute_not_accumulated() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, Duration::from_nanos(333_333));
        // Adding 333,333 ns a million times by floating point or rounding would drift;
        // the product is exact.
        assert_eq!(s.at(1_000_000), t0 + Duration::from_nanos(333_333_000_000));
        assert_eq!(s.at(0), t0);
    }

    #[test]
    fn due_counts_slots_at_or_before_now() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, MS);
        assert_eq!(s.due(t0), 1, "slot 0 is due at the start");
        assert_eq!(s.due(t0 + Duration::from_micros(999)), 1);
        assert_eq!(s.due(t0 + MS), 2);
        assert_eq!(s.due(t0 + 10 * MS + Duration::from_micros(1)), 11);
        for k in [0, 1, 7, 1000] {
            assert_eq!(s.due(s.at(k)), k + 1);
        }
    }

    #[test]
    fn plan_splits_warm_up_from_measured_slots() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, MS);
        let plan = Plan::new(s, t0 + 100 * MS, Stop::At(t0 + 1100 * MS));
        assert_eq!(plan.first_measured, 100);
        assert_eq!(plan.end, 1100);
        assert!(!plan.is_measured(99));
        assert!(plan.is_measured(100) && plan.is_measured(1099));
        assert!(!plan.is_measured(1100));
        assert_eq!(plan.measured_in(0..100), 0);
        assert_eq!(plan.measured_in(90..110), 10);
        assert_eq!(plan.measured_in(1095..1200), 5);
        assert_eq!(plan.measured_in(0..2000), 1000);
        assert_eq!(plan.measured_in(1200..1300), 0);

        let plan = Plan::new(s, t0 + 100 * MS, Stop::Count(10_000));
        assert_eq!((plan.first_measured, plan.end), (100, 10_100));
        assert_eq!(plan.last_due(), t0 + 10_099 * MS);
    }
}
