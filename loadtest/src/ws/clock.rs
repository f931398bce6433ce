//! Pacing: what wakes a client when its next slot is due.
//!
//! tokio's timer wheel has a 1 ms resolution: a `sleep_until` deadline is rounded up to
//! the next millisecond tick, and the driver's `epoll_wait` timeout is rounded up to a
//! whole millisecond again, so a client paced by tokio timers sends each request up to
//! ~2 ms after its slot. Measured from the schedule, that lag is charged to the server;
//! at 1 req/ms it is about the size of what we measure. Two clocks, chosen with `--clock`:
//!
//! - [`ClockKind::Thread`] (default): one OS thread (the metronome) sleeps with
//!   `std::thread::sleep` (an hrtimer: wakes within the kernel's ~50 µs timer slack)
//!   until the next phase group is due, then wakes one task on the runtime that
//!   publishes that group's count of due slots on a `watch` channel. One wake-up per
//!   group per interval for the whole run, however many clients, and no spinning, which
//!   on a 2-core machine shared with the server would steal exactly the CPU being
//!   measured.
//! - [`ClockKind::Tokio`]: each client `sleep_until`s its own next slot. The baseline:
//!   `tokio::time::interval` with `MissedTickBehavior::Burst` is the same absolute
//!   schedule on the same wheel, so it has the same lag.
//!
//! - [`ClockKind::Auto`] (default): the thread up to [`AUTO_TOKIO_ABOVE_RPS`] offered,
//!   tokio above. Measured on the bare echo server: at 2 clients the thread cuts the
//!   median lag from ~0.8 ms to ~0.14 ms; at 50 clients both show the same p99 but the
//!   thread costs ~25% of a core more (its ticks are not batched with the runtime's own
//!   timer processing), CPU the server under test would otherwise get.
//!
//! Either way the schedule is absolute ([`super::schedule::Schedule`]): a late wake-up
//! makes every missed slot due at once and they are sent in a burst, as an open-loop
//! client must. docs/benchmarks.md records the lag each clock showed.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::time::Sleep;

use super::schedule::Schedule;

/// Shortest time between two metronome wake-ups: at high per-client rates the phase
/// groups are merged so the thread never wakes more than ~10,000 times a second.
pub const MIN_TICK: Duration = Duration::from_micros(100);

/// Offered load above which [`ClockKind::Auto`] picks tokio timers: there the thread's
/// lower lag no longer shows in the p99 (queueing dominates) while its wake-ups cost
/// the load generator ~25% of a core more at 50k req/s (docs/benchmarks.md).
pub const AUTO_TOKIO_ABOVE_RPS: f64 = 20_000.0;

/// Which clock paces the clients (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockKind {
    /// `thread` up to 20,000 req/s offered, `tokio` above.
    #[default]
    Auto,
    /// tokio timers, 1 ms resolution.
    Tokio,
    /// A dedicated thread sleeping on an hrtimer, ~0.1 ms resolution.
    Thread,
}

impl ClockKind {
    /// The clock used for a run offering `offered_rps`.
    pub fn resolve(self, offered_rps: f64) -> ClockKind {
        match self {
            ClockKind::Auto if offered_rps > AUTO_TOKIO_ABOVE_RPS => ClockKind::Tokio,
            ClockKind::Auto => ClockKind::Thread,
            other => other,
        }
    }
}

/// Phase groups to use: `wanted`, fewer if the interval is too short for that many
/// metronome ticks, at least 1.
pub fn phase_groups(interval: Duration, wanted: u32) -> u32 {
    let fit = interval.as_nanos() / MIN_TICK.as_nanos();
    wanted.clamp(1, u32::try_from(fit.max(1)).unwrap_or(u32::MAX))
}

/// The metronome thread; it stops when dropped or after the last slot.
#[derive(Debug)]
pub struct Metronome {
    receivers: Vec<watch::Receiver<u64>>,
    stop: Arc<AtomicBool>,
}

impl Metronome {
    /// Starts ticking group `g`'s slots on `schedules[g]`, slots `0..end`. Must be
    /// called within a tokio runtime: the fan-out to the clients runs there.
    pub fn start(schedules: Vec<Schedule>, end: u64) -> anyhow::Result<Self> {
        let groups = schedules.len().max(1);
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..groups).map(|_| watch::channel(0u64)).unzip();
        let (ticks, ticked) = watch::channel(0u64);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("loadtest-clock".into())
            .spawn(move || tick(&schedules, end, &ticks, &flag))
            .context("starting the pacing thread")?;
        tokio::spawn(fan_out(ticked, senders));
        Ok(Metronome { receivers, stop })
    }

    /// The pacer of a client in phase group `group`.
    pub fn pacer(&self, group: usize) -> Pacer {
        Pacer::Thread(self.receivers[group % self.receivers.len()].clone())
    }
}

impl Drop for Metronome {
    fn drop(&mut self) {
        // Not joined: the thread notices within one tick, and joining here would block
        // an async caller for up to an interval.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The metronome's loop: tick `n` (counted from 1) is group `(n - 1) % groups`, slot
/// `(n - 1) / groups`; the groups' offsets are below one interval, so the deadlines
/// are in increasing order. Publishes the number of ticks done.
fn tick(schedules: &[Schedule], end: u64, ticks: &watch::Sender<u64>, stop: &AtomicBool) {
    let groups = schedules.len() as u64;
    if groups == 0 {
        return;
    }
    for n in 0.. {
        let (group, slot) = ((n % groups) as usize, n / groups);
        if slot >= end || stop.load(Ordering::Relaxed) || ticks.is_closed() {
            return;
        }
        let deadline = schedules[group].at(slot);
        let now = Instant::now();
        if deadline > now {
            std::thread::sleep(deadline - now);
        }
        ticks.send_replace(n + 1);
    }
}

/// Turns ticks into each group's count of due slots. It runs on the runtime so the
/// metronome thread wakes one task per tick: waking every client from outside the
/// runtime costs a cross-thread unpark per client, ~10% of a core at 100k req/s,
/// while a wake from inside goes to a worker's local queue.
async fn fan_out(mut ticked: watch::Receiver<u64>, groups: Vec<watch::Sender<u64>>) {
    let n = groups.len() as u64;
    let mut done = 0u64;
    while ticked.changed().await.is_ok() {
        let ticks = *ticked.borrow_and_update();
        // Only the newest tick of each group matters: its count includes the older.
        for t in done.max(ticks.saturating_sub(n))..ticks {
            groups[(t % n) as usize].send_replace(t / n + 1);
        }
        done = ticks;
    }
}

/// Wakes one client when its next slot is due.
#[derive(Debug)]
pub enum Pacer {
    Tokio(Pin<Box<Sleep>>),
    Thread(watch::Receiver<u64>),
}

impl Pacer {
    /// A pacer on tokio timers.
    pub fn tokio() -> Self {
        Pacer::Tokio(Box::pin(tokio::time::sleep(Duration::ZERO)))
    }

    /// Waits until slot `next` is due; returns how many slots are due then (> `next`).
    /// Cancel-safe: dropping the future loses nothing, a later call picks up the count.
    pub async fn wait_due(&mut self, schedule: &Schedule, next: u64) -> u64 {
        match self {
            Pacer::Tokio(sleep) => {
                // Same deadline as last time: tokio only updates the cached expiry,
                // nothing is re-registered in the wheel.
                sleep.as_mut().reset(schedule.at(next).into());
                sleep.as_mut().await;
                schedule.due(Instant::now()).max(next + 1)
            }
            Pacer::Thread(rx) => loop {
                let due = *rx.borrow_and_update();
                if due > next {
                    return due;
                }
                if rx.changed().await.is_err() {
                    // The metronome stopped early (it only does when the run is over):
                    // fall back to the coarse clock rather than stall.
                    tokio::time::sleep_until(schedule.at(next).into()).await;
                    return schedule.due(Instant::now()).max(next + 1);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::schedule::phase_offset;

    #[test]
    fn auto_picks_the_thread_at_low_load_only() {
        assert_eq!(ClockKind::Auto.resolve(2_000.0), ClockKind::Thread);
        assert_eq!(ClockKind::Auto.resolve(50_000.0), ClockKind::Tokio);
        assert_eq!(ClockKind::Thread.resolve(50_000.0), ClockKind::Thread);
        assert_eq!(ClockKind::Tokio.resolve(2.0), ClockKind::Tokio);
    }

    #[test]
    fn phase_groups_fit_the_interval() {
        assert_eq!(phase_groups(Duration::from_millis(1), 4), 4);
        assert_eq!(phase_groups(Duration::from_micros(200), 4), 2);
        assert_eq!(phase_groups(Duration::from_micros(50), 4), 1);
        assert_eq!(phase_groups(Duration::from_millis(1), 0), 1);
    }

    #[tokio::test]
    async fn both_clocks_wake_on_or_after_the_slot() {
        let interval = Duration::from_millis(2);
        let start = Instant::now() + Duration::from_millis(5);
        let schedules: Vec<_> = (0..2)
            .map(|g| Schedule::new(start + phase_offset(interval, g, 2), interval))
            .collect();
        let metronome = Metronome::start(schedules.clone(), 5).expect("thread starts");
        let mut pacers = [
            (metronome.pacer(1), schedules[1]),
            (Pacer::tokio(), schedules[0]),
        ];
        for (pacer, schedule) in &mut pacers {
            let mut next = 0;
            while next < 5 {
                let due = pacer.wait_due(schedule, next).await;
                assert!(due > next);
                assert!(
                    Instant::now() >= schedule.at(due - 1),
                    "woke before its slot"
                );
                next = due;
            }
        }
    }
}
