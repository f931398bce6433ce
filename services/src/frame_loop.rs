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
//! What a handler pushes (see [`crate::push`]) is published right after it returns and
//! before its answer, through the same output, so it reaches every gate first.
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

use std::future::Future;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use proto::code;
use proto::rpc::RpcResponse;
use tokio::sync::mpsc;
use tokio::time::{self, Duration, Instant, Interval, MissedTickBehavior};

use crate::config::FrameConfig;
use crate::context::{CallResult, Later};
use crate::metrics::{IntakeMetrics, LoopMetrics};
use crate::push::Outbound;
use crate::service::{DEFAULT_COST, Service, Tick, error_response, resume};
pub use pending::{Outgoing, Returned};
use pending::{Pending, Ready};

mod pending;

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
    /// The same, with no state: the partition starts fresh.
    Fresh,
    /// A keyed service's partition leaving: its state is answered to `reply`.
    HandOver,
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
}

/// The loop's end of the bounded queue, made by [`queue`].
#[derive(Debug)]
pub struct Queue<R>(mpsc::Receiver<Incoming<R>>);

/// Makes the bounded queue between an [`Intake`] and a [`FrameLoop`]: `capacity`
/// requests (at least 1) before the intake rejects.
pub fn queue<O: ReplySink>(service: &str, capacity: usize, output: O) -> (Intake<O>, Queue<O::To>) {
    let capacity = capacity.max(1);
    let (tx, rx) = mpsc::channel(capacity);
    let intake = Intake {
        tx,
        output,
        overloaded: error_response(
            code::UNAVAILABLE,
            format!("service {service:?} is overloaded: its queue of {capacity} is full"),
        ),
        closed: error_response(
            code::UNAVAILABLE,
            format!("service {service:?} is shutting down"),
        ),
        metrics: IntakeMetrics::new(service),
    };
    (intake, Queue(rx))
}

/// What became of an offered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued for a frame.
    Queued,
    /// The queue was full: answered 503 (a notify is dropped and counted).
    Rejected,
    /// The loop has stopped: answered 503; stop offering.
    Closed,
}

/// The receiving half: queues requests for the loop, or rejects them when it is full.
/// Dropping it tells the loop no more requests will come; the loop then finishes the
/// queue and returns.
pub struct Intake<O: ReplySink> {
    tx: mpsc::Sender<Incoming<O::To>>,
    output: O,
    overloaded: RpcResponse,
    closed: RpcResponse,
    metrics: IntakeMetrics,
}

impl<O: ReplySink> Intake<O> {
    /// Queues a request without waiting; if the queue is full, answers 503 at once. An
    /// event or snapshot waits for room instead (see the module docs).
    pub async fn offer(&self, incoming: Incoming<O::To>) -> Offer {
        if incoming.kind != InputKind::Request {
            return match self.tx.send(incoming).await {
                Ok(()) => Offer::Queued,
                Err(_) => Offer::Closed,
            };
        }
        match self.tx.try_send(incoming) {
            Ok(()) => {
                let depth = self.tx.max_capacity() - self.tx.capacity();
                self.metrics.depth.set(depth as f64);
                Offer::Queued
            }
            Err(mpsc::error::TrySendError::Full(incoming)) => {
                self.metrics.rejected.increment(1);
                self.metrics.overloaded.increment(1);
                if let Some(to) = incoming.reply {
                    self.output.send(to, self.overloaded.clone()).await;
                }
                Offer::Rejected
            }
            Err(mpsc::error::TrySendError::Closed(incoming)) => {
                if let Some(to) = incoming.reply {
                    self.output.send(to, self.closed.clone()).await;
                }
                Offer::Closed
            }
        }
    }

    /// Offers everything `input` yields until it ends (or the loop stops), then drops the
    /// intake, which lets the loop finish.
    pub async fn feed<S>(self, input: S)
    where
        S: Stream<Item = Incoming<O::To>>,
    {
        let mut input = std::pin::pin!(input);
        while let Some(incoming) = input.next().await {
            if self.offer(incoming).await == Offer::Closed {
                break;
            }
        }
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
}

/// One turn of a frame: a request, event or snapshot from the queue, or a call's
/// continuation (boxed: it is the larger by far, and requests are the common turn).
enum Work<R> {
    Input(Incoming<R>),
    Resume(Box<Ready>),
}

impl<O: ReplySink> FrameLoop<O> {
    /// A loop running `service` over `queue`, answering through `output`. Zero limits
    /// in `config` are raised to the smallest that work (see [`FrameConfig::validate`]).
    pub fn new(service: Service, config: FrameConfig, queue: Queue<O::To>, output: O) -> Self {
        let metrics = LoopMetrics::new(service.name());
        let pending = Pending::new(service.name(), &config);
        // A result per call in flight, at most: the channel never holds more.
        let (returns_tx, returns) = mpsc::channel(config.max_calls.max(1));
        FrameLoop {
            service,
            config,
            queue: queue.0,
            output,
            metrics,
            pending,
            returns,
            returns_tx,
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
    pub async fn run(mut self) -> Service {
        let mut ticks = Ticks::new(&self.service, self.config.tick_interval);
        // Work taken that did not fit in the last frame.
        let mut carried: Option<Work<O::To>> = None;
        // Once the queue has ended: until when the loop waits for what was pending.
        let mut drained_by: Option<Instant> = None;
        loop {
            if carried.is_none() && !self.pending.has_ready() {
                if let Some(end) = drained_by {
                    if self.pending.is_idle() {
                        break;
                    }
                    if Instant::now() >= end {
                        // Every deferred request's deadline is by `end`: they get their
                        // 408 now (a tick may have come first at this instant), once the
                        // continuations of calls timing out with them have run.
                        self.expire().await;
                        if self.pending.has_ready() {
                            continue;
                        }
                        break;
                    }
                }
                // Taken out of `pending`: the loop's future must not hold a borrow of
                // it (its continuations are not `Sync`) across an await.
                let expiry = match (self.pending.next_deadline(), drained_by) {
                    (Some(at), Some(end)) => Some(at.min(end)),
                    (at, end) => at.or(end),
                };
                tokio::select! {
                    biased;
                    tick = ticks.next() => {
                        self.tick(&tick).await;
                        continue;
                    }
                    () = until(expiry) => {
                        self.expire().await;
                        continue;
                    }
                    Some(returned) = self.returns.recv() => {
                        self.pending.returned(returned);
                        continue;
                    }
                    next = self.queue.recv(), if drained_by.is_none() => match next {
                        Some(incoming) => carried = Some(Work::Input(incoming)),
                        None => {
                            drained_by = Some(self.pending.drained_by());
                            continue;
                        }
                    },
                }
            }
            if self.frame(&mut carried).await {
                self.pause(&mut ticks).await;
            }
        }
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
    async fn frame(&mut self, carried: &mut Option<Work<O::To>>) -> bool {
        let start = Instant::now();
        let budget = self.config.max_cost.max(1);
        let mut spent: u32 = 0;
        let overran = loop {
            let Some(next) = carried.take().or_else(|| self.next_work()) else {
                break false;
            };
            let cost = match &next {
                Work::Input(incoming) => incoming.cost(&self.service),
                Work::Resume(_) => DEFAULT_COST,
            };
            if spent > 0 && spent.saturating_add(cost) > budget {
                *carried = Some(next);
                break true;
            }
            spent = spent.saturating_add(cost);
            match next {
                Work::Input(incoming) => self.handle(incoming).await,
                Work::Resume(ready) => self.resume(*ready).await,
            }
        };
        self.metrics.frame.record(start.elapsed());
        let depth = self.queue.len() + usize::from(matches!(carried, Some(Work::Input(_))));
        self.metrics.depth.set(depth as f64);
        overran
    }

    /// Calls the handler, publishes what it pushed, and answers, stamping the response
    /// with its timings.
    async fn handle(&mut self, incoming: Incoming<O::To>) {
        let started = Instant::now();
        let waited = started.saturating_duration_since(incoming.received);
        if incoming.kind != InputKind::Request {
            return self.handle_event(incoming, started, waited).await;
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
        publish(&self.output, handled.outbound).await;
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
                self.output.send(to, response).await;
            }
        }
        self.settle(later).await;
    }

    /// Runs a call's continuation, publishes what it pushed, and settles what it asked.
    async fn resume(&mut self, ready: Ready) {
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
        publish(&self.output, handled.outbound).await;
        self.settle(handled.later).await;
    }

    /// Sends the answers to deferred requests a handler gave, then the calls it made.
    async fn settle(&mut self, later: Later) {
        if later.deferred.is_some() {
            tracing::warn!("defer() outside a request defers nothing");
        }
        for answer in later.answers {
            if let Some((to, response)) = self.pending.answer(answer) {
                self.metrics.requests.count(response.code);
                self.output.send(to, response).await;
            }
        }
        for mut call in later.calls {
            let job = call.job.take();
            let Some(outgoing) = self.pending.start(call) else {
                continue;
            };
            let id = outgoing.id;
            match job {
                // Work in process: its result comes back as a call's answer would. A
                // task of its own, so the loop never waits on a disk or the network.
                Some(job) => {
                    let (work, returns) = (job(), self.returns_tx.clone());
                    tokio::spawn(async move {
                        let result = work.await;
                        // The loop gone (stopped) has no use for the result.
                        let _ = returns.send(Returned { id, result }).await;
                    });
                }
                None => {
                    if let Err(result) = self.output.call(outgoing).await {
                        self.pending.unsent(id, result);
                    }
                }
            }
        }
    }

    /// Answers 408 the deferred requests whose deadline has passed, and readies the
    /// continuations of calls whose deadline has.
    async fn expire(&mut self) {
        for (to, response) in self.pending.expire() {
            self.metrics.requests.count(response.code);
            self.output.send(to, response).await;
        }
    }

    /// Runs an event's handler (or the restore callback), publishes what it pushed,
    /// then sends its answer if it has one and its sender asked.
    async fn handle_event(
        &mut self,
        incoming: Incoming<O::To>,
        started: Instant,
        waited: Duration,
    ) {
        let partition = || incoming.method.parse().unwrap_or_default();
        let handled = match incoming.kind {
            InputKind::Snapshot => self.service.restore(incoming.payload),
            InputKind::TakeOver => self.service.take_over(partition(), Some(incoming.payload)),
            InputKind::Fresh => self.service.take_over(partition(), None),
            InputKind::HandOver => self.service.hand_over(partition()),
            InputKind::Request | InputKind::Event => {
                self.service.event(&incoming.method, incoming.payload)
            }
        };
        self.metrics.queue_wait.record(waited);
        self.metrics.handler.record(started.elapsed());
        self.metrics.count_event(handled.ok);
        publish(&self.output, handled.outbound).await;
        if let (Some(to), Some(body)) = (incoming.reply, handled.reply) {
            self.output.answer(to, body).await;
        }
        self.settle(handled.later).await;
    }

    /// Runs the tick callback, publishes what it pushed, and settles what it asked.
    async fn tick(&mut self, tick: &Tick) {
        let handled = self.service.run_tick(tick);
        publish(&self.output, handled.outbound).await;
        self.settle(handled.later).await;
    }

    /// The pause after an overrun, running the tick if it falls due meanwhile.
    async fn pause(&mut self, ticks: &mut Ticks) {
        let pause = time::sleep(self.config.overrun_pause);
        let mut pause = std::pin::pin!(pause);
        loop {
            tokio::select! {
                biased;
                tick = ticks.next() => self.tick(&tick).await,
                () = &mut pause => return,
            }
        }
    }
}

/// Publishes a handler's pushes, in order. A free function over the output alone: the
/// loop's future must not hold a borrow of the service (its closures are not `Sync`)
/// across an await.
async fn publish<O: ReplySink>(output: &O, outbound: Vec<Outbound>) {
    for message in outbound {
        output.publish(message).await;
    }
}

/// Waits until `deadline`; for ever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The tick schedule: a fixed-rate interval if the service has a tick callback, else a
/// future that never fires.
struct Ticks {
    interval: Option<Interval>,
    seq: u64,
    last: Instant,
}

impl Ticks {
    /// The shortest interval the loop accepts (a zero interval cannot be scheduled).
    const MIN_INTERVAL: Duration = Duration::from_micros(100);

    fn new(service: &Service, period: Duration) -> Ticks {
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

    /// Waits for the next tick (forever, if there is no tick callback).
    async fn next(&mut self) -> Tick {
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

/// Microseconds, saturating (a u32 holds 71 minutes).
fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
