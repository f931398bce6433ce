//! One thread for the frame loops and bus I/O of one or more workers (a host), and a
//! watchdog for the handler that overruns.
//!
//! The host thread drives a current-thread runtime that owns its workers' I/O (their bus
//! connections, subscriptions, heartbeats, intakes, and in `shaddock up` the gate's
//! sessions too) in segments: the I/O runs while the loops wait for work
//! ([`FrameLoop::wait`] inside `block_on`), one loop's handlers run outside the runtime
//! ([`FrameLoop::run_step`]), and what they produced is published after
//! ([`FrameLoop::flush`]). So a request is read, handled and answered on one thread,
//! with no hand-off in between. Loops with work take their steps in turn, so a busy
//! service cannot starve another on the same host.
//!
//! Handlers are synchronous, and one may overrun: while it runs, nothing drives the
//! runtime. The watchdog, a second thread that sleeps while the loops wait, sees a step
//! that has run longer than `stall` and calls `block_on` itself: tokio's current-thread
//! runtime hands its core to whichever thread calls `block_on` while nobody holds it
//! (`CurrentThread::block_on` takes the core, `CoreGuard`'s drop puts it back and
//! notifies a waiting thread; tokio 1.54), and nobody does while the host thread is
//! outside it. So the watchdog drives the I/O (heartbeats, keyed ownership, drains,
//! reading into the queues, a gate's sessions) until the step ends, then hands the core
//! back. The loops themselves never move: per-key order, the frame limit and their
//! determinism are those of [`FrameLoop::run`]. Each takeover is counted
//! (`worker_io_takeovers_total`, labelled with the service whose step overran) and
//! logged at warn, a line a second at most.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use net::LogLimiter;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::{FrameLoop, ReplySink, Step};
use crate::metrics::IO_TAKEOVERS_TOTAL;

/// Work a guest leaves for its host to finish before the host's thread ends (a worker's
/// drain: its last flush).
pub type Finish = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A frame loop for a host to drive: `stop` ends it early (the worker's I/O ended: the
/// loop is dropped), and `ended` hears how it ended, on the host's thread with its
/// runtime entered.
pub struct Guest<O: ReplySink, F: Future> {
    pub name: String,
    /// Entered while its steps run.
    pub span: tracing::Span,
    pub frame_loop: FrameLoop<O>,
    pub stop: F,
    pub ended: Box<dyn FnOnce(Ended<F>) -> Option<Finish> + Send>,
}

/// How a guest ended.
pub enum Ended<F: Future> {
    /// Its loop is done (its service dropped); its `stop`, not yet resolved.
    Done(F),
    /// `stop` resolved first, with this.
    Stopped(F::Output),
}

/// A guest being driven, with its id for the watchdog's log.
struct Driven<O: ReplySink, F: Future> {
    id: u64,
    guest: Guest<O, F>,
}

/// What a wait on the host brought.
enum Event<O: ReplySink, F: Future> {
    Arrived(Box<Guest<O, F>>),
    Step(usize, Step),
    Done(usize),
    Stopped(usize, F::Output),
    Closed,
}

/// The watchdog of one host: a thread parked until a step starts.
pub struct Watchdog {
    watch: Arc<Watch>,
    thread: std::thread::JoinHandle<()>,
}

impl Watchdog {
    /// Starts the watchdog of host `name` (its thread is `watchdog-<name>`), which takes
    /// `rt`'s I/O over when a step runs past `stall`.
    pub fn start(rt: &Arc<Runtime>, name: &str, stall: Duration) -> std::io::Result<Watchdog> {
        let watch = Arc::new(Watch::new(stall));
        let thread = {
            let (rt, watch, span) = (rt.clone(), watch.clone(), tracing::Span::current());
            std::thread::Builder::new()
                .name(format!("watchdog-{name}"))
                .spawn(move || {
                    let _entered = span.enter();
                    watch.guard(&rt);
                })?
        };
        Ok(Watchdog { watch, thread })
    }
}

/// Drives the guests arriving on `arrivals` on this thread over `rt` (see the module
/// docs) until the channel is closed and every guest has ended, then waits for what
/// they left to finish. `watchdog` takes the I/O over when a step overruns; returns how
/// often it did.
pub fn host<O: ReplySink, F: Future + Unpin>(
    rt: &Arc<Runtime>,
    watchdog: Watchdog,
    mut arrivals: mpsc::UnboundedReceiver<Guest<O, F>>,
) -> u64 {
    let Watchdog {
        watch,
        thread: watchdog,
    } = watchdog;
    let mut guests: Vec<Driven<O, F>> = Vec::new();
    let mut open = true;
    let mut next_id = 0;
    // Where the next wait starts looking: just past the loop that stepped last.
    let mut turn = 0;
    let mut finishing = tokio::task::JoinSet::new();
    loop {
        if !open && guests.is_empty() {
            break;
        }
        let event = rt.block_on(next_event(&mut guests, &mut arrivals, open, turn));
        let ended = match event {
            Event::Closed => {
                open = false;
                continue;
            }
            Event::Arrived(guest) => {
                next_id += 1;
                watch.named(next_id, &guest.name);
                guests.push(Driven {
                    id: next_id,
                    guest: *guest,
                });
                continue;
            }
            Event::Step(index, step) => {
                turn = index + 1;
                let driven = &mut guests[index];
                {
                    let _runtime = rt.enter();
                    let _span = driven.guest.span.enter();
                    let _step = watch.step(driven.id);
                    driven.guest.frame_loop.run_step(step);
                }
                let guest = &mut driven.guest;
                let flushed = rt.block_on(async {
                    tokio::select! {
                        biased;
                        stopped = &mut guest.stop => Some(stopped),
                        () = guest.frame_loop.flush() => None,
                    }
                });
                match flushed {
                    None => continue,
                    Some(stopped) => (index, Err(stopped)),
                }
            }
            Event::Done(index) => (index, Ok(())),
            Event::Stopped(index, stopped) => (index, Err(stopped)),
        };
        let (index, how) = ended;
        let Driven { id, guest } = guests.swap_remove(index);
        watch.forget(id);
        let ended = match how {
            Ok(()) => {
                drop(guest.frame_loop.finish());
                Ended::Done(guest.stop)
            }
            Err(stopped) => Ended::Stopped(stopped),
        };
        let _runtime = rt.enter();
        if let Some(finish) = (guest.ended)(ended) {
            finishing.spawn(finish);
        }
    }
    rt.block_on(finishing.join_all());
    watch.stop();
    // The watchdog returns at once: it is parked, asleep (woken by `stop`), or driving
    // the I/O for a step that has ended.
    if watchdog.join().is_err() {
        tracing::error!("the watchdog thread panicked");
    }
    watch.takeovers.load(Ordering::Relaxed)
}

/// Waits for the next thing the host must act on: a guest arriving (or the arrivals
/// closing), then each loop's step or end, looked at in turn from `turn`.
async fn next_event<O: ReplySink, F: Future + Unpin>(
    guests: &mut [Driven<O, F>],
    arrivals: &mut mpsc::UnboundedReceiver<Guest<O, F>>,
    open: bool,
    turn: usize,
) -> Event<O, F> {
    let count = guests.len();
    let mut waits: Vec<_> = guests
        .iter_mut()
        .map(|driven| {
            let guest = &mut driven.guest;
            Box::pin(async move {
                tokio::select! {
                    biased;
                    stopped = &mut guest.stop => Err(stopped),
                    step = guest.frame_loop.wait() => Ok(step),
                }
            })
        })
        .collect();
    std::future::poll_fn(|cx| {
        if open && let Poll::Ready(arrival) = arrivals.poll_recv(cx) {
            return Poll::Ready(
                arrival.map_or(Event::Closed, |guest| Event::Arrived(Box::new(guest))),
            );
        }
        for k in 0..count {
            let index = (turn + k) % count;
            if let Poll::Ready(waited) = waits[index].as_mut().poll(cx) {
                return Poll::Ready(match waited {
                    Ok(Some(step)) => Event::Step(index, step),
                    Ok(None) => Event::Done(index),
                    Err(stopped) => Event::Stopped(index, stopped),
                });
            }
        }
        Poll::Pending
    })
    .await
}

/// One takeover warning a second at most, over every worker of the process.
static TAKEOVER_LOG: LogLimiter = LogLimiter::per_second();

/// What the host thread and the watchdog share: lock-free on the host thread's side per
/// step, but for waking a parked watchdog.
struct Watch {
    stall: Duration,
    /// Odd while the host thread runs a step outside the runtime; each step adds 2.
    epoch: AtomicU64,
    /// When the current step started, in nanoseconds since `base`.
    since: AtomicU64,
    base: Instant,
    /// The takeover waiting for the step to end.
    ended: AtomicWaker,
    /// The watchdog sleeps on `woken` until a step starts: the loop thread knocks only
    /// then, so an idle worker costs no wake-ups.
    parked: AtomicBool,
    /// Whether the host has ended.
    stopped: Mutex<bool>,
    woken: Condvar,
    takeovers: AtomicU64,
    /// The guest whose step runs (its id), and every guest's service by id: written as
    /// guests come and go, read at a takeover.
    stepping: AtomicU64,
    names: Mutex<HashMap<u64, String>>,
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
            stepping: AtomicU64::new(0),
            names: Mutex::new(HashMap::new()),
        }
    }

    /// Guest `id` serves `service`.
    fn named(&self, id: u64, service: &str) {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.insert(id, service.to_owned());
    }

    /// Guest `id` has ended.
    fn forget(&self, id: u64) {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.remove(&id);
    }

    /// Marks a step of guest `id` started (the host thread is leaving the runtime).
    fn step(&self, id: u64) -> InStep<'_> {
        self.stepping.store(id, Ordering::Relaxed);
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
    fn guard(&self, rt: &Runtime) {
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
            self.take_over(rt, epoch, ran);
            stopped = self.lock();
        }
    }

    /// Drives `rt` until step `epoch` ends.
    fn take_over(&self, rt: &Runtime, epoch: u64, ran: Duration) {
        self.takeovers.fetch_add(1, Ordering::Relaxed);
        let id = self.stepping.load(Ordering::Relaxed);
        let service = {
            let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
            names.get(&id).cloned().unwrap_or_default()
        };
        metrics::counter!(IO_TAKEOVERS_TOTAL, "service" => service.clone()).increment(1);
        if let Some(tally) = TAKEOVER_LOG.check() {
            tracing::warn!(
                %service,
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
