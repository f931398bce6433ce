//! The frame loop's tick schedule.

use tokio::time::{self, Duration, Instant, Interval, MissedTickBehavior};

use crate::service::{Service, Tick};

/// The tick schedule: a fixed-rate interval if the service has a tick callback, else a
/// future that never fires.
pub(super) struct Ticks {
    interval: Option<Interval>,
    seq: u64,
    last: Instant,
}

impl Ticks {
    /// The shortest interval the loop accepts (a zero interval cannot be scheduled).
    const MIN_INTERVAL: Duration = Duration::from_micros(100);

    pub(super) fn new(service: &Service, period: Duration) -> Ticks {
        let now = Instant::now();
        let interval = service.has_tick().then(|| {
            let period = period.max(Self::MIN_INTERVAL);
            let mut interval = time::interval_at(now + period, period);
            // After a stall, resume on the original grid rather than firing a burst of
            // catch-up ticks: a game step uses `since_last` as its `dt`.
            interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
            interval
        });
        Ticks {
            interval,
            seq: 0,
            last: now,
        }
    }

    /// Makes the next tick due now, the schedule going on a period apart from it: a
    /// partition adopted from a dead owner shows its state at once, not up to a period
    /// later (its players waited out the owner's death already).
    pub(super) fn due_now(&mut self) {
        if let Some(interval) = self.interval.as_mut() {
            interval.reset_immediately();
        }
    }

    /// Waits for the next tick (forever, if there is no tick callback).
    pub(super) async fn next(&mut self) -> Tick {
        match self.interval.as_mut() {
            Some(interval) => {
                interval.tick().await;
            }
            None => std::future::pending::<()>().await,
        }
        let now = Instant::now();
        self.seq += 1;
        let tick = Tick {
            seq: self.seq,
            now,
            since_last: now - self.last,
        };
        self.last = now;
        tick
    }
}
