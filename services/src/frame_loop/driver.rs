//! One thread for a frame loop and the bus I/O of its worker, and a watchdog for the
//! handler that overruns.
//!
//! The loop thread drives a current-thread runtime that owns the worker's I/O (its bus
//! connection, subscriptions, heartbeats, intake) in segments: the I/O runs while the
//! loop waits for work ([`FrameLoop::wait`] inside `block_on`), the handlers run outside
//! the runtime ([`FrameLoop::run_step`]), and what they produced is published after
//! ([`FrameLoop::flush`]). So a request is read, handled and answered on one thread,
//! with no hand-off in between.
//!
//! Handlers are synchronous, and one may overrun: while it runs, nothing drives the
//! runtime. The watchdog, a second thread that sleeps while the loop waits, sees a step
//! that has run longer than `stall` and calls `block_on` itself: tokio's current-thread
//! runtime hands its core to whichever thread calls `block_on` while nobody holds it
//! (`CurrentThread::block_on` takes the core, `CoreGuard`'s drop puts it back and
//! notifies a waiting thread; tokio 1.54), and nobody does while the loop thread is
//! outside it. So the watchdog drives the I/O (heartbeats, keyed ownership, drains,
//! reading into the queue) until the step ends, then hands the core back. The loop
//! itself never moves: per-key order, the frame limit and its determinism are those
//! of [`FrameLoop::run`]. Each takeover is counted (`worker_io_takeovers_total`) and
//! logged at warn, a line a second at most.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use net::LogLimiter;
use tokio::runtime::Runtime;

use super::{FrameLoop, ReplySink};
use crate::metrics::IO_TAKEOVERS_TOTAL;
use crate::service::Service;

/// How [`drive`] ended, and how often the watchdog drove the I/O meanwhile.
pub struct Driven<T> {
    /// The loop's service once it is done, or what `stop` gave when it came first.
    pub ended: Result<Service, T>,
    pub takeovers: u64,
}

/// Runs `frame_loop` on this thread in segments over `rt` (see the module docs) until
/// it is done, or until `stop` resolves first (the worker's I/O ended: the loop is
/// dropped). The watchdog takes the I/O over when a step runs past `stall`. Fails only
/// if the watchdog's thread cannot be started.
pub fn drive<O: ReplySink, F: Future + Unpin>(
    rt: &Arc<Runtime>,
    name: &str,
    stall: Duration,
    mut frame_loop: FrameLoop<O>,
    stop: &mut F,
) -> std::io::Result<Driven<F::Output>> {
    let watch = Arc::new(Watch::new(stall));
    let watchdog = {
        let (rt, watch, service, span) = (
            rt.clone(),
            watch.clone(),
            name.to_owned(),
            tracing::Span::current(),
        );
        std::thread::Builder::new()
            .name(format!("watchdog-{name}"))
            .spawn(move || {
                let _entered = span.enter();
                watch.guard(&rt, &service);
            })?
    };
    let ended = loop {
        let step = rt.block_on(async {
            tokio::select! {
                biased;
                stopped = &mut *stop => Err(stopped),
                step = frame_loop.wait() => Ok(step),
            }
        });
        let step = match step {
            Ok(Some(step)) => step,
            Ok(None) => break Ok(()),
            Err(stopped) => break Err(stopped),
        };
        {
            let _runtime = rt.enter();
            let _step = watch.step();
            frame_loop.run_step(step);
        }
        let flushed = rt.block_on(async {
            tokio::select! {
                biased;
                stopped = &mut *stop => Err(stopped),
                () = frame_loop.flush() => Ok(()),
            }
        });
        if let Err(stopped) = flushed {
            break Err(stopped);
        }
    };
    watch.stop();
    // The watchdog returns at once: it is parked, asleep (woken by `stop`), or driving
    // the I/O for a step that has ended.
    if watchdog.join().is_err() {
        tracing::error!("the watchdog thread panicked");
    }
    Ok(Driven {
        ended: ended.map(|()| frame_loop.finish()),
        takeovers: watch.takeovers.load(Ordering::Relaxed),
    })
}

/// One takeover warning a second at most, over every worker of the process.
static TAKEOVER_LOG: LogLimiter = LogLimiter::per_second();

/// What the loop thread and the watchdog share: lock-free on the loop thread's side,
/// but for waking a parked watchdog.
struct Watch {
    stall: Duration,
    /// Odd while the loop thread runs a step outside the runtime; each step adds 2.
    epoch: AtomicU64,
    /// When the current step started, in nanoseconds since `base`.
    since: AtomicU64,
    base: Instant,
    /// The takeover waiting for the step to end.
    ended: AtomicWaker,
    /// The watchdog sleeps on `woken` until a step starts: the loop thread knocks only
    /// then, so an idle worker costs no wake-ups.
    parked: AtomicBool,
    /// Whether the loop has ended.
    stopped: Mutex<bool>,
    woken: Condvar,
    takeovers: AtomicU64,
}

/// A step in progress, from [`Watch::step`]; its drop ends it.
struct InStep<'a>(&'a Watch);

impl Watch {
    fn new(stall: Duration) -> Watch {
        Watch {
            stall,
            epoch: AtomicU64::new(0),
            since: AtomicU64::new(0),
            base: Instant::now(),
            ended: AtomicWaker::new(),
            parked: AtomicBool::new(false),
            stopped: Mutex::new(false),
            woken: Condvar::new(),
            takeovers: AtomicU64::new(0),
        }
    }

    /// Marks a step started (the loop thread is leaving the runtime).
    fn step(&self) -> InStep<'_> {
        self.since
            .store(nanos(self.base.elapsed()), Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            // Taken so the knock cannot fall between the watchdog's check and its wait.
            let _stopped = self.lock();
            self.woken.notify_one();
        }
        InStep(self)
    }

    fn stop(&self) {
        *self.lock() = true;
        self.woken.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.stopped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The watchdog's thread: parks while the loop waits, sleeps until a step's budget
    /// runs out, and drives the I/O from there until the step ends.
    fn guard(&self, rt: &Runtime, service: &str) {
        let mut stopped = self.lock();
        while !*stopped {
            let epoch = self.epoch.load(Ordering::SeqCst);
            if epoch % 2 == 0 {
                self.parked.store(true, Ordering::SeqCst);
                if self.epoch.load(Ordering::SeqCst) == epoch {
                    stopped = self
                        .woken
                        .wait(stopped)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                self.parked.store(false, Ordering::SeqCst);
                continue;
            }
            let since = Duration::from_nanos(self.since.load(Ordering::Relaxed));
            if self.epoch.load(Ordering::SeqCst) != epoch {
                continue; // `since` may be the next step's
            }
            let ran = self.base.elapsed().saturating_sub(since);
            if ran < self.stall {
                let (guard, _) = self
                    .woken
                    .wait_timeout(stopped, self.stall - ran)
                    .unwrap_or_else(PoisonError::into_inner);
                stopped = guard;
                continue;
            }
            drop(stopped);
            self.take_over(rt, service, epoch, ran);
            stopped = self.lock();
        }
    }

    /// Drives `rt` until step `epoch` ends.
    fn take_over(&self, rt: &Runtime, service: &str, epoch: u64, ran: Duration) {
        self.takeovers.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(IO_TAKEOVERS_TOTAL, "service" => service.to_owned()).increment(1);
        if let Some(tally) = TAKEOVER_LOG.check() {
            tracing::warn!(
                service,
                ran_ms = ran.as_millis(),
                budget_ms = self.stall.as_millis(),
                "a handler overran its budget (--handler-stall): the watchdog drives the bus I/O until it returns{tally}"
            );
        }
        rt.block_on(std::future::poll_fn(|cx| {
            self.ended.register(cx.waker());
            if self.epoch.load(Ordering::SeqCst) == epoch {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }));
    }
}

impl Drop for InStep<'_> {
    fn drop(&mut self) {
        self.0.epoch.fetch_add(1, Ordering::SeqCst);
        self.0.ended.wake();
    }
}

/// Nanoseconds, saturating (a u64 holds 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
