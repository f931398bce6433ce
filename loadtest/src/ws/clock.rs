//! Pacing: what wakes a client when its next slot is due (`--clock`). tokio's timer
//! wheel ticks in whole milliseconds, so `sleep_until` sends up to ~2 ms late, lag charged
//! to the server; the metronome is one OS thread on an hrtimer (~50 µs slack, no spinning
//! to steal the server's CPU) waking the clients through a `watch` channel
//! (docs/benchmarks.md, "The pacing clock"). The schedule is absolute either way: a late
//! wake-up makes every missed slot due at once, as an open-loop client must.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::time::Sleep;

use super::schedule::Schedule;

/// Above this offered load [`ClockKind::Auto`] picks tokio timers: the thread's lower
/// lag no longer shows in the p99, its wake-ups cost ~25 % of a core more.
pub const AUTO_TOKIO_ABOVE_RPS: f64 = 20_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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

/// The metronome thread; it stops when dropped or after the last slot.
#[derive(Debug)]
pub struct Metronome {
    due: watch::Receiver<u64>,
    stop: Arc<AtomicBool>,
}

impl Metronome {
    /// Ticks slots `0..end` of `schedule`. Must be called within a tokio runtime: the
    /// fan-out to the clients runs there, so that the thread wakes one task per tick
    /// instead of unparking every client across threads (~10 % of a core at 100k req/s).
    pub fn start(schedule: Schedule, end: u64) -> anyhow::Result<Self> {
        let (ticks, mut ticked) = watch::channel(0u64);
        let (due_tx, due) = watch::channel(0u64);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("loadtest-clock".into())
            .spawn(move || {
                for slot in 0..end {
                    if stopped.load(Ordering::Relaxed) || ticks.is_closed() {
                        return;
                    }
                    let wait = schedule.at(slot).saturating_duration_since(Instant::now());
                    std::thread::sleep(wait);
                    ticks.send_replace(slot + 1);
                }
            })
            .context("starting the pacing thread")?;
        tokio::spawn(async move {
            while ticked.changed().await.is_ok() {
                due_tx.send_replace(*ticked.borrow_and_update());
            }
        });
        Ok(Metronome { due, stop })
    }

    pub fn pacer(&self) -> Pacer {
        Pacer::Thread(self.due.clone())
    }
}

impl Drop for Metronome {
    fn drop(&mut self) {
        // Not joined: the thread notices within one tick.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Wakes one client when its next slot is due.
#[derive(Debug)]
pub enum Pacer {
    Tokio(Pin<Box<Sleep>>),
    Thread(watch::Receiver<u64>),
}

impl Pacer {
    pub fn tokio() -> Self {
        Pacer::Tokio(Box::pin(tokio::time::sleep(Duration::ZERO)))
    }

    /// Waits until slot `next` is due; returns how many slots are due then (> `next`).
    /// Cancel-safe: a later call picks up the count.
    pub async fn wait_due(&mut self, schedule: &Schedule, next: u64) -> u64 {
        if let Pacer::Thread(rx) = self {
            loop {
                let due = *rx.borrow_and_update();
                if due > next {
                    return due;
                }
                if rx.changed().await.is_err() {
                    // The metronome stopped (only when the run is over): fall back below.
                    break;
                }
            }
            *self = Pacer::tokio();
        }
        if let Pacer::Tokio(sleep) = self {
            sleep.as_mut().reset(schedule.at(next).into());
            sleep.as_mut().await;
        }
        schedule.due(Instant::now()).max(next + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_the_thread_at_low_load_only() {
        assert_eq!(ClockKind::Auto.resolve(2_000.0), ClockKind::Thread);
        assert_eq!(ClockKind::Auto.resolve(50_000.0), ClockKind::Tokio);
        assert_eq!(ClockKind::Thread.resolve(50_000.0), ClockKind::Thread);
    }

    #[tokio::test]
    async fn both_clocks_wake_on_or_after_the_slot() {
        let ms = Duration::from_millis;
        let schedule = Schedule::new(Instant::now() + ms(5), ms(2));
        let metronome = Metronome::start(schedule, 5).expect("thread starts");
        for mut pacer in [metronome.pacer(), Pacer::tokio()] {
            let mut next = 0;
            while next < 5 {
                let due = pacer.wait_due(&schedule, next).await;
                let on_time = due > next && Instant::now() >= schedule.at(due - 1);
                assert!(on_time, "woke before its slot");
                next = due;
            }
        }
    }
}
