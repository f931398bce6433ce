//! The frame loop under tokio's paused clock: handlers take no virtual time, so every
//! instant below is exact and a change to the frame rules shows up as a wrong number.
//! Deferred answers and calls are in `calls`.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, stream};
use proto::Message;
use proto::code;
use proto::rpc::{RpcRequest, RpcResponse};
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

use super::*;
use crate::service::Service;

/// Everything a loop sends, for a channel sink.
#[derive(Debug, Clone)]
enum Sent<T> {
    Response(T, RpcResponse),
    Answer(T, Bytes),
    Publish(Outbound),
    Call(Outgoing),
    Replicate(Vec<(u32, Bytes)>),
}

/// A channel as a sink that sees everything, in the order the loop sent it.
impl<T: Send + 'static> ReplySink for mpsc::Sender<Sent<T>> {
    type To = T;

    async fn send(&self, to: T, response: RpcResponse) {
        // The receiver is gone only when its owner stopped listening on purpose.
        let _ = mpsc::Sender::send(self, Sent::Response(to, response)).await;
    }

    async fn answer(&self, to: T, body: Bytes) {
        let _ = mpsc::Sender::send(self, Sent::Answer(to, body)).await;
    }

    async fn publish(&self, outbound: Outbound) {
        let _ = mpsc::Sender::send(self, Sent::Publish(outbound)).await;
    }

    async fn call(&self, call: Outgoing) -> Result<(), CallResult> {
        mpsc::Sender::send(self, Sent::Call(call))
            .await
            .map_err(|_| CallResult::bus_unavailable())
    }

    async fn replicate(&self, states: Vec<(u32, Bytes)>) {
        let _ = mpsc::Sender::send(self, Sent::Replicate(states)).await;
    }

    /// Every partition but 6 has a standby.
    fn stands_by(&self, partition: u32) -> bool {
        partition != 6
    }
}

/// A channel as a sink of answers only: each arrives as `(to, response)`. For running a
/// service without the bus when nothing it does pushes; a push or an event's answer has
/// nowhere to go, and is logged at warn and dropped.
impl<T: Send + 'static> ReplySink for mpsc::Sender<(T, RpcResponse)> {
    type To = T;

    async fn send(&self, to: T, response: RpcResponse) {
        let _ = mpsc::Sender::send(self, (to, response)).await;
    }

    async fn answer(&self, _to: T, _body: Bytes) {
        tracing::warn!("an answers-only sink dropped an event's answer");
    }

    async fn publish(&self, outbound: Outbound) {
        tracing::warn!(?outbound, "an answers-only sink dropped a push");
    }

    async fn call(&self, call: Outgoing) -> Result<(), CallResult> {
        tracing::warn!(?call, "an answers-only sink cannot call");
        Err(CallResult::bus_unavailable())
    }
}

/// Runs `service` over `input` as the worker does: the intake feeding it on a task, the
/// loop on the caller's, until the input ends and everything it yielded is answered.
async fn run<S>(service: Service, config: FrameConfig, input: S, output: Out)
where
    S: Stream<Item = Incoming<u32>> + Send + 'static,
{
    let (intake, queue) = queue(service.name(), config.queue_capacity, output.clone());
    let feeding = tokio::spawn(intake.feed(input));
    FrameLoop::new(service, config, queue, output).run().await;
    // The loop ends only after the intake is dropped, so this is already done.
    feeding.await.unwrap();
}

const MS: Duration = Duration::from_millis(1);

type Out = mpsc::Sender<(u32, RpcResponse)>;
type Log = Arc<Mutex<Vec<(u32, Instant)>>>;

fn config(capacity: usize, max_cost: u32) -> FrameConfig {
    FrameConfig {
        queue_capacity: capacity,
        max_cost,
        overrun_pause: MS,
        tick_interval: 10 * MS,
        ..FrameConfig::default()
    }
}

/// A request whose body is its id, answered to that id.
fn request(method: &str, id: u32) -> Incoming<u32> {
    notify(method, id).with_reply(id)
}

/// The same, without a reply subject.
fn notify(method: &str, id: u32) -> Incoming<u32> {
    let payload = RpcRequest {
        route: format!("t.{method}"),
        body: Bytes::from(id.to_be_bytes().to_vec()),
        ..RpcRequest::default()
    };
    Incoming::new(method, payload.encode_to_vec().into(), None)
}

impl Incoming<u32> {
    fn with_reply(mut self, id: u32) -> Self {
        self.reply = Some(id);
        self
    }
}

/// Methods `one`, `three` and `ten` (named for their cost) log `(id, instant)` when run.
fn service(log: &Log) -> Service {
    let mut service = Service::new("t");
    for (name, cost) in [("one", 1), ("three", 3), ("ten", 10)] {
        let log = log.clone();
        service = service
            .raw_method(name, move |_ctx, body| {
                let id = u32::from_be_bytes(body[..].try_into().map_err(|_| "bad id")?);
                log.lock().unwrap().push((id, Instant::now()));
                Ok(body)
            })
            .cost(name, cost);
    }
    service
}

fn output() -> (Out, mpsc::Receiver<(u32, RpcResponse)>) {
    mpsc::channel(1024)
}

/// Each logged id's start, in ms after `t0`.
fn starts_ms(log: &Log, t0: Instant) -> Vec<(u32, u128)> {
    let log = log.lock().unwrap();
    log.iter()
        .map(|(id, at)| (*id, (*at - t0).as_millis()))
        .collect()
}

fn drain(rx: &mut mpsc::Receiver<(u32, RpcResponse)>) -> Vec<(u32, RpcResponse)> {
    let mut out = Vec::new();
    while let Ok(item) = rx.try_recv() {
        out.push(item);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_frame_never_spends_more_than_max_cost_and_an_overrun_pauses() {
    let t0 = Instant::now();
    let log = Log::default();
    let (out, mut rx) = output();
    let (intake, queue) = queue("t", 100, out.clone());
    for id in 0..10 {
        assert_eq!(intake.offer(request("one", id)).await, Offer::Queued);
    }
    drop(intake);
    FrameLoop::new(service(&log), config(100, 4), queue, out)
        .run()
        .await;

    // Four per frame, 1 ms apart: the pause after each overrun.
    let expected: Vec<(u32, u128)> = (0..10).map(|id| (id, u128::from(id / 4))).collect();
    assert_eq!(starts_ms(&log, t0), expected);
    let queue_us: Vec<u32> = drain(&mut rx).iter().map(|(_, r)| r.queue_us).collect();
    assert_eq!(queue_us, [0, 0, 0, 0, 1000, 1000, 1000, 1000, 2000, 2000]);
}

#[tokio::test(start_paused = true)]
async fn costs_fill_the_budget_and_an_oversized_request_runs_alone() {
    let t0 = Instant::now();
    let log = Log::default();
    let (out, _rx) = output();
    let (intake, queue) = queue("t", 100, out.clone());
    let methods = ["three", "one", "three", "three", "ten", "one"];
    for (id, method) in (0..).zip(methods) {
        intake.offer(request(method, id)).await;
    }
    drop(intake);
    FrameLoop::new(service(&log), config(100, 4), queue, out)
        .run()
        .await;

    // Frames: [3+1] | [3] (3+3 > 4) | [3] | [10] alone | [1].
    assert_eq!(
        starts_ms(&log, t0),
        [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_frame_that_empties_the_queue_does_not_pause() {
    let t0 = Instant::now();
    let log = Log::default();
    let (out, mut rx) = output();
    let (intake, queue) = queue("t", 100, out.clone());
    let running = tokio::spawn(FrameLoop::new(service(&log), config(100, 4), queue, out).run());
    // Exactly the budget: the frame ends with an empty queue, which is not an overrun.
    for id in 0..4 {
        intake.offer(request("one", id)).await;
    }
    for _ in 0..4 {
        rx.recv().await.unwrap();
    }
    // Had the loop paused, the paused clock would have jumped to its end by now.
    intake.offer(request("one", 4)).await;
    let (id, response) = rx.recv().await.unwrap();
    assert_eq!((id, response.queue_us), (4, 0));
    drop(intake);
    running.await.unwrap();
    assert!(starts_ms(&log, t0).iter().all(|(_, ms)| *ms == 0));
    assert_eq!(Instant::now(), t0);
}

#[tokio::test(start_paused = true)]
async fn full_queue_answers_503_at_once() {
    let log = Log::default();
    let (out, mut rx) = output();
    let (intake, queue) = queue("t", 3, out.clone());
    let offers = [
        intake.offer(request("one", 0)).await,
        intake.offer(request("one", 1)).await,
        intake.offer(request("one", 2)).await,
        intake.offer(request("one", 3)).await,
        intake.offer(notify("one", 4)).await,
        intake.offer(request("one", 5)).await,
    ];
    use Offer::{Queued, Rejected};
    assert_eq!(
        offers,
        [Queued, Queued, Queued, Rejected, Rejected, Rejected]
    );
    // Answered before the loop ever ran; the notify had nobody to tell.
    let rejected: Vec<(u32, u32)> = drain(&mut rx).iter().map(|(id, r)| (*id, r.code)).collect();
    assert_eq!(rejected, [(3, code::UNAVAILABLE), (5, code::UNAVAILABLE)]);

    drop(intake);
    FrameLoop::new(service(&log), config(3, 100), queue, out)
        .run()
        .await;
    let answered: Vec<(u32, u32)> = drain(&mut rx).iter().map(|(id, r)| (*id, r.code)).collect();
    assert_eq!(answered, [(0, code::OK), (1, code::OK), (2, code::OK)]);
}

/// The worker runs its intake and its loop on one thread: a burst read at once must
/// leave the loop a turn before the queue is full, or the rest of it is answered 503
/// with the loop never having run.
#[tokio::test(start_paused = true)]
async fn a_burst_read_at_once_lets_the_loop_take_frames_before_the_queue_fills() {
    let log = Log::default();
    let (out, mut rx) = output();
    let burst = stream::iter((0..8).map(|id| request("one", id)));
    run(service(&log), config(4, 100), burst, out).await;
    let answered: Vec<(u32, u32)> = drain(&mut rx).iter().map(|(id, r)| (*id, r.code)).collect();
    assert_eq!(
        answered,
        (0..8).map(|id| (id, code::OK)).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn tick_keeps_its_rate_under_load() {
    let t0 = Instant::now();
    let handled = Log::default();
    let ticks = Arc::new(Mutex::new(Vec::<(Tick, usize)>::new()));
    let seen = (handled.clone(), ticks.clone());
    let service = service(&handled).on_tick(move |_ctx, tick| {
        let done = seen.0.lock().unwrap().len();
        seen.1.lock().unwrap().push((*tick, done));
    });
    let (out, _rx) = output();
    let (intake, queue) = queue("t", 400, out.clone());
    for id in 0..400 {
        intake.offer(request("one", id)).await;
    }
    drop(intake);
    // 100 overrunning frames of 4, one per ms, with a 10 ms tick.
    FrameLoop::new(service, config(400, 4), queue, out)
        .run()
        .await;

    let ticks = ticks.lock().unwrap();
    let got: Vec<(u64, u128, Duration, usize)> = ticks
        .iter()
        .map(|(t, done)| (t.seq, (t.now - t0).as_millis(), t.since_last, *done))
        .collect();
    let want: Vec<(u64, u128, Duration, usize)> = (1..=9u64)
        .map(|i| (i, u128::from(i) * 10, 10 * MS, 40 * i as usize))
        .collect();
    assert_eq!(got, want);
    assert_eq!(handled.lock().unwrap().len(), 400);
}

#[tokio::test(start_paused = true)]
async fn tick_runs_while_idle() {
    let t0 = Instant::now();
    let (tick_tx, mut tick_rx) = mpsc::channel(16);
    let service = Service::new("t").on_tick(move |_ctx, tick| {
        let _ = tick_tx.try_send(tick.now);
    });
    let (out, _rx) = output();
    let (intake, queue) = queue("t", 4, out.clone());
    let running = tokio::spawn(FrameLoop::new(service, config(4, 4), queue, out).run());
    for i in 1..=3u32 {
        assert_eq!(tick_rx.recv().await.unwrap() - t0, i * 10 * MS);
    }
    drop(intake);
    running.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn responses_carry_the_queue_wait() {
    let log = Log::default();
    let (out, mut rx) = output();
    let (intake, queue) = queue("t", 4, out.clone());
    intake.offer(request("one", 0)).await;
    tokio::time::advance(3 * MS).await;
    drop(intake);
    FrameLoop::new(service(&log), config(4, 4), queue, out)
        .run()
        .await;
    let (_, response) = rx.recv().await.unwrap();
    assert_eq!(
        (response.code, response.queue_us, response.handler_us),
        (200, 3000, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn notifies_are_handled_but_not_answered() {
    let log = Log::default();
    let (out, mut rx) = output();
    let (intake, queue) = queue("t", 4, out.clone());
    intake.offer(notify("one", 9)).await;
    drop(intake);
    FrameLoop::new(service(&log), config(4, 4), queue, out)
        .run()
        .await;
    assert_eq!(log.lock().unwrap().len(), 1);
    assert!(drain(&mut rx).is_empty());
}

#[tokio::test(start_paused = true)]
async fn offers_after_the_loop_stopped_get_503() {
    let (out, mut rx) = output();
    let (intake, queue) = queue("t", 4, out);
    drop(queue);
    assert_eq!(intake.offer(request("one", 1)).await, Offer::Closed);
    let (id, response) = rx.recv().await.unwrap();
    assert_eq!((id, response.code), (1, code::UNAVAILABLE));
}

#[tokio::test(start_paused = true)]
async fn run_answers_everything_its_input_yields() {
    let log = Log::default();
    let (out, mut rx) = output();
    let input = stream::iter((0..10).map(|id| request("one", id)));
    run(service(&log), config(100, 4), input, out).await;
    let ids: Vec<u32> = drain(&mut rx).iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn metrics_count_requests_rejections_and_frames() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let log = Log::default();
    let (out, _rx) = output();
    let (intake, queue) = queue("t", 2, out.clone());
    for id in 0..5 {
        intake.offer(request("one", id)).await;
    }
    drop(intake);
    FrameLoop::new(service(&log), config(2, 1), queue, out)
        .run()
        .await;

    let mut counters = Vec::new();
    let mut samples = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = broker::testing::series(key.key());
        match value {
            DebugValue::Counter(n) => counters.push((name, n)),
            DebugValue::Histogram(v) => samples.push((name, v.len())),
            DebugValue::Gauge(_) => {}
        }
    }
    counters.sort();
    samples.sort();
    assert_eq!(
        counters,
        [
            ("worker_rejected_total{service=t}".to_string(), 3),
            ("worker_requests_total{service=t,code=200}".to_string(), 2),
            ("worker_requests_total{service=t,code=503}".to_string(), 3),
        ]
    );
    // Two requests, one per frame (max_cost 1).
    assert_eq!(
        samples,
        [
            ("worker_frame_seconds{service=t}".to_string(), 2),
            ("worker_handler_seconds{service=t}".to_string(), 2),
            ("worker_queue_wait_seconds{service=t}".to_string(), 2),
        ]
    );
}

type SentRx = mpsc::Receiver<Sent<u32>>;

fn sent_output() -> (mpsc::Sender<Sent<u32>>, SentRx) {
    mpsc::channel(1024)
}

/// What went out, as short labels in order: `push:<subject>`, `answer:<id>`,
/// `response:<id>:<code>`.
fn sent(rx: &mut SentRx) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(item) = rx.try_recv() {
        out.push(match item {
            Sent::Publish(o) => format!("push:{}", o.subject("p")),
            Sent::Answer(id, body) => format!("answer:{id}:{}", String::from_utf8_lossy(&body)),
            Sent::Response(id, r) => format!("response:{id}:{}", r.code),
            Sent::Call(call) => format!("call:{}:{}", call.id, call.request.route),
            Sent::Replicate(states) => format!("replicate:{}", states.len()),
        });
    }
    out
}

/// `say` broadcasts to `room` and answers; `fail` pushes, then fails; a `ping` event
/// pushes and answers "pong"; the tick pushes.
fn pushing_service() -> Service {
    Service::new("t")
        .raw_method("say", |ctx, body| {
            ctx.broadcast("room", "t.said", body.clone())?;
            ctx.push_to_user("bob", "t.said", body)?;
            Ok(Bytes::new())
        })
        .raw_method("fail", |ctx, _| {
            ctx.broadcast("room", "t.said", "lost")?;
            Err(HandlerError::new("no"))
        })
        .raw_method("bad", |ctx, _| {
            ctx.broadcast("a.b", "t.said", "x")?;
            Ok(Bytes::new())
        })
        .on_event("evt.ping", crate::Delivery::All, |ctx, _| {
            ctx.publish("t.seen", "x")?;
            ctx.reply("pong");
            Ok(())
        })
        .on_tick(|ctx, _tick| {
            let _ = ctx.broadcast("ticks", "t.tick", "");
        })
}

use crate::handler_error::HandlerError;

#[tokio::test(start_paused = true)]
async fn pushes_go_out_before_the_answer_and_not_at_all_on_failure() {
    let (out, mut rx) = sent_output();
    let (intake, queue) = queue("t", 16, out.clone());
    intake.offer(request("say", 1)).await;
    intake.offer(request("fail", 2)).await;
    intake.offer(request("bad", 3)).await;
    intake
        .offer(Incoming::event("evt.ping", Bytes::new(), Some(4)))
        .await;
    intake
        .offer(Incoming::event("evt.ping", Bytes::new(), None))
        .await;
    drop(intake);
    let mut config = config(16, 100);
    config.tick_interval = Duration::from_secs(3600);
    FrameLoop::new(pushing_service(), config, queue, out)
        .run()
        .await;
    assert_eq!(
        sent(&mut rx),
        [
            "push:p.grp.room",
            "push:p.user.bob",
            "response:1:200",
            "response:2:500",
            "response:3:400",
            "push:p.t.seen",
            "answer:4:pong",
            "push:p.t.seen",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_tick_publishes_what_it_pushed() {
    let (out, mut rx) = sent_output();
    let (intake, queue) = queue("t", 4, out.clone());
    let running = tokio::spawn(FrameLoop::new(pushing_service(), config(4, 4), queue, out).run());
    tokio::time::sleep(25 * MS).await;
    drop(intake);
    running.await.unwrap();
    assert_eq!(sent(&mut rx), ["push:p.grp.ticks", "push:p.grp.ticks"]);
}

#[tokio::test(start_paused = true)]
async fn events_wait_for_room_instead_of_being_rejected() {
    let (out, mut rx) = sent_output();
    let (intake, queue) = queue("t", 1, out.clone());
    assert_eq!(intake.offer(request("say", 1)).await, Offer::Queued);
    // The queue is full: a request is refused at once, an event waits for the loop.
    assert_eq!(intake.offer(request("say", 2)).await, Offer::Rejected);
    let event = Incoming::event("evt.ping", Bytes::new(), Some(3));
    let offered = tokio::spawn(async move {
        let offer = intake.offer(event).await;
        drop(intake);
        offer
    });
    FrameLoop::new(pushing_service(), config(1, 100), queue, out)
        .run()
        .await;
    assert_eq!(offered.await.unwrap(), Offer::Queued);
    assert_eq!(
        sent(&mut rx),
        [
            "response:2:503",
            "push:p.grp.room",
            "push:p.user.bob",
            "response:1:200",
            "push:p.t.seen",
            "answer:3:pong",
        ]
    );
}

mod call_deadlines;
mod calls;
mod jobs;
mod standbys;
