//! The worker's frame-limited handler loop, independent of the bus.
//!
//! Two halves joined by a bounded queue:
//!
//! - The [`Intake`] takes requests as they arrive and queues them without waiting. When
//!   the queue is full it answers 503 at once: a client gets "overloaded" in microseconds
//!   instead of a timeout after its request sat in a pile it could never leave.
//! - The [`FrameLoop`] runs the service in **frames**. A frame handles queued requests
//!   until the queue is empty or the next request would take the frame past its budget of
//!   `max_cost` units (one request always runs, so a request dearer than the whole budget
//!   gets a frame to itself). A frame that stopped on its budget, leaving work queued, is
//!   an *overrun* and is followed by a fixed pause (`overrun_pause`). Between frames, and
//!   during the pause, the service's tick runs whenever it is due, so a fixed-rate game
//!   loop keeps its rate however long the queue is.
//!
//! Each response carries `queue_us` (arrival to handler start) and `handler_us`.
//!
//! The loop turns in three parts: [`FrameLoop::wait`] (async: waits for work, a tick,
//! a deadline, the pause's end), [`FrameLoop::run_step`] (synchronous: the handlers;
//! what they send is kept, in order), [`FrameLoop::flush`] (async: sends it). The
//! worker runs the middle part outside its runtime, on the thread that runs the bus
//! I/O (a host, which may drive several workers' loops), with a watchdog for a step
//! that overruns ([`driver`]).
//!
//! What a handler pushes (see [`crate::push`]) is published after it returns and before
//! its answer, through the same output, so it reaches every gate first.
//!
//! Events (a service's subscribed subjects) and a starting worker's snapshot share the
//! queue with requests and run in the same frames, in queue order. They are never
//! rejected: an event lost would leave a service's state wrong for good, where a
//! rejected request is retried by its client. When the queue is full, the intake waits
//! for room for an event instead (and meanwhile reads no requests, which wait in the
//! bus client's buffer).
//!
//! A handler may defer its answer and call other services ([`pending`]): the loop keeps
//! deferred requests until answered or expired, sends calls through the output, takes
//! their results from [`FrameLoop::returns`], and runs their continuations in frames,
//! among requests, at [`DEFAULT_COST`] each. A deferred request that asked for timing
//! gets the spans of the calls made for it in its response. Work a handler hands off
//! the loop (`Context::wait_on`: a store's write) is a call that runs as a task of its
//! own instead of going out on the bus; its result comes back the same way.
//!
//! The loop is generic over where requests come from (any [`Stream`] of [`Incoming`]) and
//! where answers go (a [`ReplySink`]), so tests drive it with channels under tokio's paused
//! clock and assert exact instants; [`crate::worker`] plugs in the NATS subscription and
//! client. All time is `tokio::time`, so a paused clock governs frames, pauses and ticks.

use std::collections::BTreeSet;
use std::future::Future;

use bytes::Bytes;
use proto::rpc::RpcResponse;
use tokio::sync::mpsc;
use tokio::time::{self, Duration, Instant};

use crate::config::FrameConfig;
use crate::context::{CallResult, Later};
use crate::metrics::LoopMetrics;
use crate::push::Outbound;
use crate::service::{DEFAULT_COST, Service, Tick, resume};
pub use driver::{Ended, Finish, Guest, Watchdog, host};
#[cfg(test)]
use intake::{Intake, Offer};
pub use intake::{Queue, queue};
pub use pending::{Outgoing, Returned};
use pending::{Pending, Ready};
use ticks::Ticks;

mod driver;
mod intake;
mod pending;
mod ticks;

/// What an [`Incoming`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A request for a method; answered with an `RpcResponse`.
    Request,
    /// A message on an event subject; `method` holds the subject as registered.
    Event,
    /// A peer's snapshot for a starting worker (see `Service::on_start_sync`).
    Snapshot,
    /// A keyed service's partition (`method` holds its number) taken on with the state
    /// in the payload, handed over by its old owner.
    TakeOver,
    /// The same, taken by its standby from an owner counted dead, with the replica it
    /// held: the service's next tick is due at once (its players have waited out the
    /// member timeout already). Not after a hand-over from a live owner, whose last
    /// pushes may still be on their way through another bus server.
    Adopted,
    /// The same, with no state: the partition starts fresh.
    Fresh,
    /// A keyed service's partition leaving: its state is answered to `reply`.
    HandOver,
    /// A keyed service's partition to be snapshotted for its standby after this frame,
    /// though nothing changed it (its standby is new, or missed the last snapshot).
    Replicate,
}

/// One request, event or snapshot as it reached the worker, before decoding.
#[derive(Debug, Clone)]
pub struct Incoming<R> {
    pub kind: InputKind,
    /// The method (what follows `<prefix>.svc.<service>.`), or the event's subject.
    pub method: String,
    /// The encoded `RpcRequest`, or the event's payload.
    pub payload: Bytes,
    /// Where the answer goes; `None` for a notify, which is handled but not answered,
    /// and for an event whose sender wants no answer.
    pub reply: Option<R>,
    /// When the worker received it: the start of its queue wait.
    pub received: Instant,
    /// A keyed service's request: the partition it came on (its state changes).
    pub partition: Option<u32>,
}

impl<R> Incoming<R> {
    /// A request received now.
    pub fn new(method: impl Into<String>, payload: Bytes, reply: Option<R>) -> Incoming<R> {
        Incoming {
            kind: InputKind::Request,
            method: method.into(),
            payload,
            reply,
            received: Instant::now(),
            partition: None,
        }
    }

    /// The same request, come on a keyed service's `partition`.
    pub fn in_partition(self, partition: u32) -> Incoming<R> {
        Incoming {
            partition: Some(partition),
            ..self
        }
    }

    /// An event on `subject` (as the service registered it) received now.
    pub fn event(subject: impl Into<String>, payload: Bytes, reply: Option<R>) -> Incoming<R> {
        Incoming {
            kind: InputKind::Event,
            ..Incoming::new(subject, payload, reply)
        }
    }

    /// A peer's snapshot, for the service's restore callback.
    pub fn snapshot(payload: Bytes) -> Incoming<R> {
        Incoming {
            kind: InputKind::Snapshot,
            ..Incoming::new(String::new(), payload, None)
        }
    }

    /// A keyed service's partition changing hands here (see [`InputKind::TakeOver`],
    /// [`InputKind::Fresh`], [`InputKind::HandOver`]).
    pub fn partition(kind: InputKind, partition: u32, state: Bytes, reply: Option<R>) -> Self {
        Incoming {
            kind,
            ..Incoming::new(partition.to_string(), state, reply)
        }
    }

    fn cost(&self, service: &Service) -> u32 {
        match self.kind {
            InputKind::Request => service.cost_of(&self.method),
            _ => DEFAULT_COST,
        }
    }
}

/// Where answers and pushes go: the bus in production ([`crate::Pusher`]), a channel in
/// tests. Shared by the intake (its 503s) and the loop, hence `Clone`. The loop awaits
/// each call before the next, so a sink that keeps order delivers pushes before the
/// answer of the handler that made them.
pub trait ReplySink: Clone + Send + Sync + 'static {
    /// The address of one answer (a reply subject).
    type To: Send + 'static;

    /// Sends `response` to `to`. Failures are the sink's to count and log: the loop has
    /// nothing better to do with them than go on.
    fn send(&self, to: Self::To, response: RpcResponse) -> impl Future<Output = ()> + Send;

    /// Sends an event handler's answer (raw bytes) to `to`.
    fn answer(&self, to: Self::To, body: Bytes) -> impl Future<Output = ()> + Send;

    /// Publishes a push or a service's own message.
    fn publish(&self, outbound: Outbound) -> impl Future<Output = ()> + Send;

    /// Sends a call to another service, whose result is to come back to the loop's
    /// [`FrameLoop::returns`] as `call.id`'s. When it is not sent (the bus is gone, a
    /// keyed callee without a key), the result its continuation gets at once.
    fn call(&self, call: Outgoing) -> impl Future<Output = Result<(), CallResult>> + Send;

    /// Sends keyed partitions' snapshots to their standbys, returning once each standby
    /// holds them or a bound has passed (docs/workers.md, "Standbys"): what this step
    /// produced leaves after it. What did not get there is the sink's to count and send
    /// again. Nothing to do without standbys.
    fn replicate(&self, states: Vec<(u32, Bytes)>) -> impl Future<Output = ()> + Send {
        let _ = states;
        async {}
    }

    /// Whether `partition` has a standby now: a changed partition without one is not
    /// snapshotted (a standby that comes later gets it whole).
    fn stands_by(&self, partition: u32) -> bool {
        let _ = partition;
        false
    }
}

/// The handler loop of one service.
pub struct FrameLoop<O: ReplySink> {
    service: Service,
    config: FrameConfig,
    queue: mpsc::Receiver<Incoming<O::To>>,
    output: O,
    metrics: LoopMetrics,
    /// Deferred requests and calls in flight.
    pending: Pending<O::To>,
    /// Calls' results, and the sender handed out for them.
    returns: mpsc::Receiver<Returned>,
    returns_tx: mpsc::Sender<Returned>,
    ticks: Ticks,
    /// Work taken that did not fit in the last frame.
    carried: Option<Work<O::To>>,
    /// Once the queue has ended: until when the loop waits for what was pending.
    drained_by: Option<Instant>,
    /// After an overrun: when the pause ends.
    paused_until: Option<Instant>,
    /// The last step expired what was pending at the drain's end.
    expired_at_end: bool,
    /// What the last step produced, for [`FrameLoop::flush`], in order.
    out: Vec<Out<O::To>>,
    /// Keyed partitions the step changed, snapshotted at its end for their standbys.
    changed: BTreeSet<u32>,
    /// Their snapshots, sent before `out` ([`ReplySink::replicate`]).
    replica: Vec<(u32, Bytes)>,
    /// Set while frames' output waits for the replica window to end (`--replica-window`):
    /// until then `out` and `changed` gather the frames since it opened, and nothing is
    /// snapshotted or sent.
    held_until: Option<Instant>,
}

/// One turn of a frame: a request, event or snapshot from the queue, or a call's
/// continuation (boxed: it is the larger by far, and requests are the common turn).
enum Work<R> {
    Input(Incoming<R>),
    Resume(Box<Ready>),
}

/// What the loop does next, as [`FrameLoop::wait`] found it.
pub enum Step {
    /// The service's tick is due.
    Tick(Tick),
    /// Deferred requests or calls reached their deadline.
    Expire,
    /// Work is ready: a frame.
    Frame,
    /// The replica window is over: what the frames held since it opened changed goes to
    /// the standbys, then their output.
    Release,
}

/// One thing a step sends, kept until [`FrameLoop::flush`].
enum Out<R> {
    Send(R, RpcResponse),
    Answer(R, Bytes),
    Publish(Outbound),
    Call(Outgoing),
}

impl<O: ReplySink> FrameLoop<O> {
    /// A loop running `service` over `queue`, answering through `output`. Zero limits
    /// in `config` are raised to the smallest that work (see [`FrameConfig::validate`]).
    /// Made inside the runtime that will run it (its tick schedule starts now).
    pub fn new(service: Service, config: FrameConfig, queue: Queue<O::To>, output: O) -> Self {
        let metrics = LoopMetrics::new(service.name());
        let pending = Pending::new(service.name(), &config);
        // A result per call in flight, at most: the channel never holds more.
        let (returns_tx, returns) = mpsc::channel(config.max_calls.max(1));
        let ticks = Ticks::new(&service, config.tick_interval);
        FrameLoop {
            service,
            config,
            queue: queue.0,
            output,
            metrics,
            pending,
            returns,
            returns_tx,
            ticks,
            carried: None,
            drained_by: None,
            paused_until: None,
            expired_at_end: false,
            out: Vec::new(),
            changed: BTreeSet::new(),
            replica: Vec::new(),
            held_until: None,
        }
    }

    /// Where calls' results go: each is handed to its continuation (unless the call
    /// timed out meanwhile). Sending waits while the loop is behind.
    pub fn returns(&self) -> mpsc::Sender<Returned> {
        self.returns_tx.clone()
    }

    /// Runs frames until the intake is gone and the queue is empty, then on until what
    /// was pending then is settled: deferred requests answered (by a continuation, a
    /// tick, or the worker's 408 at their deadline), calls' continuations run (with
    /// their results, or 408 at their deadline). So a drain waits no longer than the
    /// latest of those deadlines; calls made during the wait and still in flight then
    /// are dropped (see [`pending`]). Returns the service.
    ///
    /// The worker drives the same three parts itself, the middle one outside the
    /// runtime ([`driver`]); this is them on one future, for the paused-clock tests.
    #[cfg(test)]
    pub async fn run(mut self) -> Service {
        while let Some(step) = self.wait().await {
            self.run_step(step);
            self.flush().await;
        }
        self.finish()
    }

    /// Waits for the next step: a tick, a deadline, work (the pause after an overrun
    /// first). `None` once the loop is done (see [`FrameLoop::run`]). Runs no handler.
    pub async fn wait(&mut self) -> Option<Step> {
        loop {
            if let Some(end) = self.paused_until {
                tokio::select! {
                    biased;
                    tick = self.ticks.next() => return Some(Step::Tick(tick)),
                    () = until(self.held_until) => return Some(Step::Release),
                    () = time::sleep_until(end) => self.paused_until = None,
                }
                continue;
            }
            if self.carried.is_some() || self.pending.has_ready() {
                self.expired_at_end = false;
                return Some(Step::Frame);
            }
            if self.drained_by.is_some() && self.held_until.is_some() {
                // The intake is gone: what is held goes now, not at the window's end.
                return Some(Step::Release);
            }
            if let Some(end) = self.drained_by {
                // Once the deadlines are past, every deferred request got its 408 in
                // the last step (a tick may have come first at this instant), and the
                // continuations of calls timing out with them have run.
                if self.pending.is_idle() || std::mem::take(&mut self.expired_at_end) {
                    return None;
                }
                if Instant::now() >= end {
                    self.expired_at_end = true;
                    return Some(Step::Expire);
                }
            }
            // Taken out of `pending`: the loop's future must not hold a borrow of it
            // (its continuations are not `Sync`) across an await.
            let expiry = match (self.pending.next_deadline(), self.drained_by) {
                (Some(at), Some(end)) => Some(at.min(end)),
                (at, end) => at.or(end),
            };
            tokio::select! {
                biased;
                tick = self.ticks.next() => return Some(Step::Tick(tick)),
                () = until(self.held_until) => return Some(Step::Release),
                () = until(expiry) => return Some(Step::Expire),
                Some(returned) = self.returns.recv() => self.pending.returned(returned),
                next = self.queue.recv(), if self.drained_by.is_none() => match next {
                    Some(incoming) => self.carried = Some(Work::Input(incoming)),
                    None => self.drained_by = Some(self.pending.drained_by()),
                },
            }
        }
    }

    /// Runs `step`'s handlers, synchronously: what they send is kept, in order, for
    /// [`FrameLoop::flush`], with the snapshots of the keyed partitions they changed. A
    /// frame that overran starts the pause. A frame that changed a partition with a
    /// standby opens the replica window (or falls in the open one): its output is held
    /// until the window ends, a tick comes, or the intake is gone.
    pub fn run_step(&mut self, step: Step) {
        let framed = matches!(step, Step::Frame);
        match step {
            Step::Tick(tick) => self.tick(&tick),
            Step::Expire => self.expire(),
            Step::Frame => {
                // A zero pause is none: the next frame may start at once.
                if self.frame() && !self.config.overrun_pause.is_zero() {
                    self.paused_until = Some(Instant::now() + self.config.overrun_pause);
                }
            }
            Step::Release => {}
        }
        if framed && self.holds() {
            return;
        }
        self.held_until = None;
        for partition in std::mem::take(&mut self.changed) {
            if !self.output.stands_by(partition) {
                continue;
            }
            if let Some(state) = self.service.snapshot(partition) {
                self.replica.push((partition, state));
            }
        }
    }

    /// Whether a frame's output waits in the replica window: it opens at a frame that
    /// changed a partition with a standby, and whatever follows waits with it (order)
    /// until it ends. A frame run past its end releases it.
    fn holds(&mut self) -> bool {
        let window = self.config.replica_window;
        if window.is_zero() || self.drained_by.is_some() {
            return false;
        }
        if let Some(end) = self.held_until {
            return Instant::now() < end;
        }
        let output = &self.output;
        if !self.changed.iter().any(|&p| output.stands_by(p)) {
            return false;
        }
        self.held_until = Some(Instant::now() + window);
        true
    }

    /// Sends what the last step produced, in order: each handler's pushes before its
    /// answer, and one request's before the next's. Nothing while the replica window
    /// holds it.
    pub async fn flush(&mut self) {
        if self.held_until.is_some() {
            return;
        }
        if !self.replica.is_empty() {
            // A standby holds what the step changed before any of its answers leave.
            self.output
                .replicate(std::mem::take(&mut self.replica))
                .await;
        }
        let mut out = std::mem::take(&mut self.out);
        for next in out.drain(..) {
            match next {
                Out::Send(to, response) => self.output.send(to, response).await,
                Out::Answer(to, body) => self.output.answer(to, body).await,
                Out::Publish(outbound) => self.output.publish(outbound).await,
                Out::Call(call) => {
                    let id = call.id;
                    if let Err(result) = self.output.call(call).await {
                        self.pending.unsent(id, result);
                    }
                }
            }
        }
        // Kept for the next step: its capacity is the frame's usual output.
        self.out = out;
    }

    /// The loop is done ([`FrameLoop::wait`] said so): drops what is left, returns the
    /// service.
    pub fn finish(mut self) -> Service {
        self.pending.shut();
        self.metrics.depth.set(0.0);
        self.service
    }

    /// The next turn, without waiting: a ready continuation first, then a call's result
    /// that came back, then the queue.
    fn next_work(&mut self) -> Option<Work<O::To>> {
        loop {
            if let Some(ready) = self.pending.next_ready() {
                return Some(Work::Resume(Box::new(ready)));
            }
            match self.returns.try_recv() {
                Ok(returned) => self.pending.returned(returned),
                Err(_) => return self.queue.try_recv().ok().map(Work::Input),
            }
        }
    }

    /// One frame: handles requests until the queue is empty or the budget is spent.
    /// Returns whether it overran, i.e. left work in `carried`.
    fn frame(&mut self) -> bool {
        let start = Instant::now();
        let budget = self.config.max_cost.max(1);
        let mut spent: u32 = 0;
        let overran = loop {
            let Some(next) = self.carried.take().or_else(|| self.next_work()) else {
                break false;
            };
            let cost = match &next {
                Work::Input(incoming) => incoming.cost(&self.service),
                Work::Resume(_) => DEFAULT_COST,
            };
            if spent > 0 && spent.saturating_add(cost) > budget {
                self.carried = Some(next);
                break true;
            }
            spent = spent.saturating_add(cost);
            match next {
                Work::Input(incoming) => self.handle(incoming),
                Work::Resume(ready) => self.resume(*ready),
            }
        };
        self.metrics.frame.record(start.elapsed());
        let carried = usize::from(matches!(self.carried, Some(Work::Input(_))));
        self.metrics.depth.set((self.queue.len() + carried) as f64);
        overran
    }

    /// Calls the handler, keeps what it pushed, then its answer, stamping the response
    /// with its timings.
    fn handle(&mut self, incoming: Incoming<O::To>) {
        let started = Instant::now();
        let waited = started.saturating_duration_since(incoming.received);
        if incoming.kind != InputKind::Request {
            return self.handle_event(incoming, started, waited);
        }
        if let Some(partition) = incoming.partition
            && self.service.replicates()
        {
            self.changed.insert(partition);
        }
        let handled =
            self.service
                .call_encoded(&incoming.method, incoming.payload, incoming.received);
        let took = started.elapsed();
        let mut response = handled.response;
        response.queue_us = micros(waited);
        response.handler_us = micros(took);
        self.metrics.queue_wait.record(waited);
        self.metrics.handler.record(took);
        self.publish(handled.outbound);
        let mut later = handled.later;
        match (later.deferred.take(), incoming.reply) {
            (Some(deferred), Some(to)) => {
                later.time_calls_for(deferred);
                let deadline = later.deadline;
                self.pending
                    .defer(deferred, to, response, incoming.received, deadline);
            }
            // A notify: nobody waits for an answer, deferred or not.
            (_, None) => self.metrics.requests.count(response.code),
            (None, Some(to)) => {
                self.metrics.requests.count(response.code);
                self.out.push(Out::Send(to, response));
            }
        }
        self.settle(later);
    }

    /// Runs a call's continuation, keeps what it pushed, and settles what it asked.
    fn resume(&mut self, ready: Ready) {
        let started = Instant::now();
        let Ready {
            then,
            session,
            deadline,
            stem,
            result,
        } = ready;
        let handled = resume(self.service.name(), then, session, deadline, stem, result);
        self.metrics.handler.record(started.elapsed());
        self.publish(handled.outbound);
        self.settle(handled.later);
    }

    /// Keeps the answers to deferred requests a handler gave, then the calls it made.
    fn settle(&mut self, later: Later) {
        if later.deferred.is_some() {
            tracing::warn!("defer() outside a request defers nothing");
        }
        if self.service.replicates() {
            self.changed.extend(later.changed);
        }
        for answer in later.answers {
            if let Some((to, response)) = self.pending.answer(answer) {
                self.metrics.requests.count(response.code);
                self.out.push(Out::Send(to, response));
            }
        }
        for mut call in later.calls {
            let job = call.job.take();
            let Some(outgoing) = self.pending.start(call) else {
                continue;
            };
            match job {
                // Work in process: its result comes back as a call's answer would. A
                // task of its own, so the loop never waits on a disk or the network.
                Some(job) => {
                    let (id, work, returns) = (outgoing.id, job(), self.returns_tx.clone());
                    tokio::spawn(async move {
                        let result = work.await;
                        // The loop gone (stopped) has no use for the result.
                        let _ = returns.send(Returned { id, result }).await;
                    });
                }
                None => self.out.push(Out::Call(outgoing)),
            }
        }
    }

    /// Answers 408 the deferred requests whose deadline has passed, and readies the
    /// continuations of calls whose deadline has.
    fn expire(&mut self) {
        for (to, response) in self.pending.expire() {
            self.metrics.requests.count(response.code);
            self.out.push(Out::Send(to, response));
        }
    }

    /// Runs an event's handler (or the restore callback), keeps what it pushed, then
    /// its answer if it has one and its sender asked.
    fn handle_event(&mut self, incoming: Incoming<O::To>, started: Instant, waited: Duration) {
        let partition = || incoming.method.parse().unwrap_or_default();
        let replicates = self.service.replicates();
        let handled = match incoming.kind {
            InputKind::Snapshot => self.service.restore(incoming.payload),
            InputKind::TakeOver | InputKind::Adopted | InputKind::Fresh => {
                // Its standby gets it whole, after the take-over.
                let partition = partition();
                if replicates {
                    self.changed.insert(partition);
                }
                if incoming.kind == InputKind::Adopted {
                    self.ticks.due_now();
                }
                let state = (incoming.kind != InputKind::Fresh).then_some(incoming.payload);
                self.service.take_over(partition, state)
            }
            InputKind::HandOver => {
                // Its new owner's standby gets it from the new owner.
                let partition = partition();
                self.changed.remove(&partition);
                self.service.hand_over(partition)
            }
            InputKind::Replicate => {
                if replicates {
                    self.changed.insert(partition());
                }
                return;
            }
            InputKind::Request | InputKind::Event => {
                self.service.event(&incoming.method, incoming.payload)
            }
        };
        self.metrics.queue_wait.record(waited);
        self.metrics.handler.record(started.elapsed());
        self.metrics.count_event(handled.ok);
        self.publish(handled.outbound);
        if let (Some(to), Some(body)) = (incoming.reply, handled.reply) {
            self.out.push(Out::Answer(to, body));
        }
        self.settle(handled.later);
    }

    /// Runs the tick callback, keeps what it pushed, and settles what it asked.
    fn tick(&mut self, tick: &Tick) {
        let handled = self.service.run_tick(tick);
        self.publish(handled.outbound);
        self.settle(handled.later);
    }

    /// Keeps a handler's pushes, in order.
    fn publish(&mut self, outbound: Vec<Outbound>) {
        self.out.extend(outbound.into_iter().map(Out::Publish));
    }
}

/// Waits until `deadline`; for ever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Microseconds, saturating (a u32 holds 71 minutes).
fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
