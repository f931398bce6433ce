//! Deferred answers and calls under the paused clock: the loop runs on a task, the test
//! plays the bus (it reads the calls the loop sends and returns their results), and
//! every instant is exact.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use proto::Message;
use proto::code;
use proto::rpc::{CallSpan, Effect, RpcRequest, RpcResponse, Session, effect};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{self, Duration, Instant};

use super::{MS, Sent, SentRx, config, sent_output};
use crate::config::DEFAULT_CALL_MARGIN;
use crate::context::{CallResult, Deferred, MAX_CALL_DEPTH, MAX_CALL_SPANS};
use crate::frame_loop::{FrameConfig, FrameLoop, Incoming, Intake, Returned, queue};
use crate::service::Service;

type Handles = Arc<Mutex<Vec<Deferred>>>;
type Results = Arc<Mutex<Vec<(u32, String)>>>;
type Out = mpsc::Sender<Sent<u32>>;

/// A request for `method` from player `uid`, answered to `id`, whose caller waits
/// `timeout_ms` (0: did not say).
pub(super) fn request(method: &str, id: u32, uid: &str, timeout_ms: u32) -> Incoming<u32> {
    let payload = payload(method, id, uid, timeout_ms);
    Incoming::new(method, payload.encode_to_vec().into(), Some(id))
}

/// A keyed service's request for `method` by `key` (as a gate routes it), answered to
/// `id`.
pub(super) fn keyed_request(method: &str, id: u32, key: &str) -> Incoming<u32> {
    let payload = RpcRequest {
        key: key.into(),
        ..payload(method, id, "ann", 0)
    };
    Incoming::new(method, payload.encode_to_vec().into(), Some(id))
}

fn payload(method: &str, id: u32, uid: &str, timeout_ms: u32) -> RpcRequest {
    RpcRequest {
        route: format!("t.{method}"),
        body: Bytes::from(format!("body {id}")),
        session: Some(Session {
            gate: "g".into(),
            sid: 1,
            uid: uid.into(),
            ..Session::default()
        }),
        timeout_ms,
        ..RpcRequest::default()
    }
}

/// The loop on a task, its intake, and what it sends.
pub(super) struct Running {
    pub intake: Intake<Out>,
    rx: SentRx,
    returns: mpsc::Sender<Returned>,
    task: JoinHandle<Service>,
}

impl Running {
    /// Ends the queue (the loop starts its drain): what the loop sends, the way to
    /// return call results, and the loop's task.
    fn close_intake(self) -> (SentRx, mpsc::Sender<Returned>, JoinHandle<Service>) {
        let Running {
            intake,
            rx,
            returns,
            task,
        } = self;
        drop(intake);
        (rx, returns, task)
    }
}

pub(super) fn start(service: Service, config: FrameConfig) -> Running {
    let (out, rx) = sent_output();
    let (intake, queue) = queue(service.name(), config.queue_capacity, out.clone());
    let frame_loop = FrameLoop::new(service, config, queue, out);
    let returns = frame_loop.returns();
    Running {
        intake,
        rx,
        returns,
        task: tokio::spawn(frame_loop.run()),
    }
}

impl Running {
    pub async fn next(&mut self) -> Sent<u32> {
        self.rx.recv().await.expect("the loop runs")
    }

    pub async fn response(&mut self) -> (u32, RpcResponse) {
        match self.next().await {
            Sent::Response(id, response) => (id, response),
            other => panic!("not a response: {other:?}"),
        }
    }

    pub async fn call(&mut self) -> (u64, RpcRequest) {
        match self.next().await {
            Sent::Call(call) => (call.id, call.request),
            other => panic!("not a call: {other:?}"),
        }
    }

    /// Returns `result` as call `id`'s.
    async fn give(&self, id: u64, result: CallResult) {
        let returned = Returned { id, result };
        self.returns.send(returned).await.unwrap();
    }

    /// Stops the loop and returns what it sent meanwhile.
    pub async fn stop(mut self) -> Vec<Sent<u32>> {
        drop(self.intake);
        self.task.await.unwrap();
        let mut rest = Vec::new();
        while let Ok(item) = self.rx.try_recv() {
            rest.push(item);
        }
        rest
    }
}

fn effects_of(response: &RpcResponse) -> Vec<Option<effect::Kind>> {
    response
        .effects
        .iter()
        .map(|e: &Effect| e.kind.clone())
        .collect()
}

/// `wait` defers (joining group `w` first) and keeps its handle; the tick answers every
/// kept handle, setting a session value and pushing first; `late` answers them too.
fn deferring(handles: &Handles) -> Service {
    let (kept, ticked, late) = (handles.clone(), handles.clone(), handles.clone());
    Service::new("t")
        .raw_method("wait", move |ctx, _| {
            ctx.join("w");
            kept.lock().unwrap().push(ctx.defer());
            Ok(Bytes::from_static(b"never sent"))
        })
        .raw_method("late", move |ctx, _| {
            for handle in late.lock().unwrap().drain(..) {
                ctx.answer(handle, Ok(Bytes::from_static(b"too late")));
            }
            Ok(Bytes::new())
        })
        .on_tick(move |ctx, _| {
            for handle in ticked.lock().unwrap().drain(..) {
                let _ = ctx.broadcast("ticks", "t.done", "");
                ctx.set_data("done", "yes");
                ctx.answer(handle, Ok(Bytes::from_static(b"answered")));
            }
        })
}

#[tokio::test(start_paused = true)]
async fn a_deferred_request_is_answered_from_a_tick_with_the_effects_of_both() {
    let t0 = Instant::now();
    let handles = Handles::default();
    let mut running = start(deferring(&handles), config(16, 100));
    running.intake.offer(request("wait", 1, "ann", 1_000)).await;

    // Nothing for the request until the first tick, 10 ms on: its push, then the answer.
    match running.next().await {
        Sent::Publish(push) => assert_eq!(push.subject("p"), "p.grp.ticks"),
        other => panic!("not the tick's push: {other:?}"),
    }
    let (id, response) = running.response().await;
    assert_eq!(Instant::now() - t0, 10 * MS);
    assert_eq!((id, response.code), (1, code::OK));
    assert_eq!(&response.body[..], b"answered");
    assert_eq!(
        effects_of(&response),
        [
            Some(effect::Kind::Join("w".into())),
            Some(effect::Kind::SetData(proto::rpc::SetData {
                key: "done".into(),
                value: "yes".into()
            })),
        ],
        "the request's own effects, then those of the context that answered"
    );
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_deferred_request_never_answered_gets_one_408_at_its_deadline_and_a_late_answer_is_dropped()
 {
    let t0 = Instant::now();
    let handles = Handles::default();
    // No tick comes in time: the service's tick is hours away.
    let config = FrameConfig {
        tick_interval: Duration::from_secs(3600),
        answer_timeout: 50 * MS,
        ..config(16, 100)
    };
    let mut running = start(deferring(&handles), config);
    running.intake.offer(request("wait", 1, "ann", 30)).await;
    running.intake.offer(request("wait", 2, "bob", 0)).await;

    // The caller's 30 ms, then the worker's own 50 ms for the caller that did not say.
    let (id, response) = running.response().await;
    assert_eq!(
        (id, response.code, Instant::now() - t0),
        (1, code::TIMEOUT, 30 * MS)
    );
    assert!(response.effects.is_empty(), "a failure carries no effects");
    let (id, response) = running.response().await;
    assert_eq!(
        (id, response.code, Instant::now() - t0),
        (2, code::TIMEOUT, 50 * MS)
    );

    // Answers after the 408 go nowhere; the `late` request itself is answered.
    running.intake.offer(request("late", 3, "cid", 0)).await;
    let (id, response) = running.response().await;
    assert_eq!((id, response.code), (3, code::OK));
    time::sleep(Duration::from_secs(10)).await;
    assert!(running.stop().await.is_empty(), "exactly one answer each");
}

#[tokio::test(start_paused = true)]
async fn at_the_queue_s_end_the_loop_waits_for_a_deferred_request_s_call_to_answer_it() {
    let results = Results::default();
    let mut running = start(shop(&results), config(16, 100));
    running.intake.offer(request("buy", 1, "ann", 1_000)).await;
    let (call, _) = running.call().await;
    let (mut rx, returns, task) = running.close_intake();
    time::sleep(300 * MS).await;
    assert!(!task.is_finished(), "the drain waits for the call");
    let result = CallResult {
        body: Bytes::from_static(b"paid"),
        ..CallResult::error(code::OK, "")
    };
    returns.send(Returned { id: call, result }).await.unwrap();
    let Some(Sent::Response(1, response)) = rx.recv().await else {
        panic!("the deferred request's answer");
    };
    assert_eq!(
        (response.code, &response.body[..]),
        (code::OK, &b"paid"[..])
    );
    task.await.unwrap();
    running_rx_is(rx, |sent| assert!(sent.is_empty(), "{sent:?}"));
}

#[tokio::test(start_paused = true)]
async fn a_drain_waits_no_longer_than_the_deadlines_pending_when_the_queue_ended() {
    let results = Results::default();
    let mut running = start(shop(&results), config(16, 100));
    let begun = Instant::now();
    running.intake.offer(request("buy", 1, "ann", 1_000)).await;
    let _ = running.call().await;
    let (rx, _, task) = running.close_intake();
    // The callee never answers: the margin before the request's deadline the call times
    // out, its continuation answers with the 408, and the loop stops then, not later.
    task.await.unwrap();
    assert_eq!(begun.elapsed(), 1_000 * MS - DEFAULT_CALL_MARGIN);
    running_rx_is(rx, |sent| {
        let [Sent::Response(1, response)] = sent else {
            panic!("one answer: {sent:?}");
        };
        assert_eq!(
            (response.code, response.message.as_str()),
            (code::TIMEOUT, "call timed out")
        );
    });
    assert_eq!(
        *results.lock().unwrap(),
        [(code::TIMEOUT, "ann".to_owned())]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_deferred_at_the_queue_s_end_is_answered_by_a_tick_of_the_drain() {
    let handles = Handles::default();
    let running = start(deferring(&handles), config(16, 100));
    running.intake.offer(request("wait", 1, "ann", 0)).await;
    let (rx, _, task) = running.close_intake();
    task.await.unwrap();
    running_rx_is(rx, |sent| {
        let answers: Vec<_> = sent
            .iter()
            .filter_map(|s| match s {
                Sent::Response(id, response) => Some((*id, response.code)),
                _ => None,
            })
            .collect();
        assert_eq!(answers, [(1, code::OK)], "{sent:?}");
    });
}

fn running_rx_is(mut rx: SentRx, check: impl FnOnce(&[Sent<u32>])) {
    let mut sent = Vec::new();
    while let Ok(item) = rx.try_recv() {
        sent.push(item);
    }
    check(&sent);
}

/// `buy` defers and calls `bank.pay` with its body; the continuation records what it
/// got and answers with the callee's result as it is. `spree` makes three calls that
/// answer nothing.
fn shop(results: &Results) -> Service {
    let (paid, spent) = (results.clone(), results.clone());
    Service::new("t")
        .raw_method("buy", move |ctx, body| {
            let deferred = ctx.defer();
            let results = paid.clone();
            ctx.call("bank.pay", body, move |ctx, result: CallResult| {
                results
                    .lock()
                    .unwrap()
                    .push((result.code, ctx.uid().unwrap_or_default().to_owned()));
                ctx.answer(deferred, result.into_result());
            });
            Ok(Bytes::new())
        })
        .raw_method("spree", move |ctx, _| {
            for _ in 0..3 {
                let results = spent.clone();
                ctx.call("bank.pay", "", move |_ctx, result: CallResult| {
                    results.lock().unwrap().push((result.code, result.message));
                });
            }
            Ok(Bytes::new())
        })
        .raw_method("ping", |_ctx, body| Ok(body))
}

#[tokio::test(start_paused = true)]
async fn a_call_goes_out_with_the_session_and_what_is_left_and_its_result_answers() {
    let results = Results::default();
    let mut running = start(shop(&results), config(16, 100));
    running.intake.offer(request("buy", 1, "ann", 1_000)).await;

    let (call, sent) = running.call().await;
    assert_eq!(sent.route, "bank.pay");
    assert_eq!(&sent.body[..], b"body 1");
    assert_eq!(sent.session.as_ref().map(|s| s.uid.as_str()), Some("ann"));
    let margin = DEFAULT_CALL_MARGIN.as_millis();
    assert_eq!(
        u128::from(sent.timeout_ms),
        1_000 - margin,
        "the caller's time less the margin"
    );

    // The loop goes on meanwhile.
    time::sleep(200 * MS).await;
    running.intake.offer(request("ping", 2, "bob", 0)).await;
    assert_eq!(running.response().await.0, 2);

    let result = CallResult {
        body: Bytes::from_static(b"paid"),
        ..CallResult::error(code::OK, "")
    };
    running
        .returns
        .send(Returned { id: call, result })
        .await
        .unwrap();
    let (id, response) = running.response().await;
    assert_eq!(
        (id, response.code, &response.body[..]),
        (1, code::OK, &b"paid"[..])
    );
    assert_eq!(*results.lock().unwrap(), [(code::OK, "ann".to_owned())]);

    // A second result for the same call goes nowhere.
    let again = CallResult::error(code::OK, "");
    running
        .returns
        .send(Returned {
            id: call,
            result: again,
        })
        .await
        .unwrap();
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_call_times_out_the_margin_before_the_caller_s_deadline_and_its_continuation_answers() {
    let t0 = Instant::now();
    let results = Results::default();
    let config = FrameConfig {
        call_margin: 100 * MS,
        ..config(16, 100)
    };
    let mut running = start(shop(&results), config);
    running.intake.offer(request("buy", 1, "ann", 300)).await;
    let (_call, sent) = running.call().await;
    assert_eq!(sent.timeout_ms, 200);

    // No result: the margin before the request's deadline the continuation gets 408,
    // and its answer (the 408 as it is) is the request's, in time for the caller.
    let (id, response) = running.response().await;
    assert_eq!(
        (id, response.code, Instant::now() - t0),
        (1, code::TIMEOUT, 200 * MS)
    );
    assert_eq!(response.message, "call timed out");
    assert_eq!(
        *results.lock().unwrap(),
        [(code::TIMEOUT, "ann".to_owned())]
    );
    assert!(running.stop().await.is_empty(), "one answer");
}

#[tokio::test(start_paused = true)]
async fn calls_past_max_calls_get_503_at_once_and_room_is_made_by_results() {
    let results = Results::default();
    let config = FrameConfig {
        max_calls: 2,
        ..config(16, 100)
    };
    let mut running = start(shop(&results), config);
    running.intake.offer(request("spree", 1, "ann", 0)).await;
    // The handler's answer, then its calls.
    assert_eq!(running.response().await.0, 1);
    let (first, _) = running.call().await;
    let (_second, _) = running.call().await;
    // The third found the limit: its continuation ran at once, in the same instant.
    assert_eq!(
        *results.lock().unwrap(),
        [(code::UNAVAILABLE, "too many calls in flight".to_owned())]
    );

    // One result frees a place: of the next three, one goes out.
    let result = CallResult::error(code::OK, "");
    running
        .returns
        .send(Returned { id: first, result })
        .await
        .unwrap();
    running.intake.offer(request("spree", 2, "ann", 0)).await;
    assert_eq!(running.response().await.0, 2);
    let (third, _) = running.call().await;
    assert!(third > first);
    let codes: Vec<u32> = results.lock().unwrap().iter().map(|(c, _)| *c).collect();
    assert_eq!(
        codes,
        [
            code::UNAVAILABLE,
            code::OK,
            code::UNAVAILABLE,
            code::UNAVAILABLE
        ]
    );
    assert!(running.stop().await.is_empty());
}

/// A request for `method` (no session, no deadline) made by calls for the routes in
/// `trace`, asking for timing or not.
fn traced(method: &str, id: u32, trace: &[&str], timing: bool) -> Incoming<u32> {
    let payload = RpcRequest {
        route: format!("t.{method}"),
        trace: trace.iter().map(|&route| route.to_owned()).collect(),
        timing,
        ..RpcRequest::default()
    };
    Incoming::new(method, payload.encode_to_vec().into(), Some(id))
}

fn span(route: &str, code: u32, us: u32, hop: u32) -> CallSpan {
    CallSpan {
        route: route.into(),
        code,
        us,
        hop,
    }
}

/// `trip` defers and calls `a.one`; that continuation calls `b.two`, whose continuation
/// answers with what it got. `go` calls `a.one` and answers at once. `fan` defers and
/// makes more calls than a response has spans for, to a route that names no method; the
/// last continuation answers.
fn trips() -> Service {
    let fanned = MAX_CALL_SPANS + 8;
    Service::new("t")
        .raw_method("trip", |ctx, _| {
            let deferred = ctx.defer();
            ctx.call("a.one", "", move |ctx, _| {
                ctx.call("b.two", "", move |ctx, result| {
                    ctx.answer(deferred, result.into_result());
                });
            });
            Ok(Bytes::new())
        })
        .raw_method("go", |ctx, _| {
            ctx.call("a.one", "", |_, _| {});
            Ok(Bytes::new())
        })
        .raw_method("fan", move |ctx, _| {
            let deferred = ctx.defer();
            for i in 1..=fanned {
                ctx.call("nomethod", "", move |ctx, result| {
                    if i == fanned {
                        ctx.answer(deferred, result.into_result());
                    }
                });
            }
            Ok(Bytes::new())
        })
}

#[tokio::test(start_paused = true)]
async fn a_timed_deferred_request_gets_a_span_per_call_and_its_callees_one_hop_deeper() {
    let mut running = start(trips(), config(16, 100));
    running
        .intake
        .offer(traced("trip", 1, &["x.outer"], true))
        .await;

    let (first, sent) = running.call().await;
    assert_eq!(sent.route, "a.one");
    assert_eq!(
        sent.trace,
        ["x.outer", "t.trip"],
        "the request's trace and route"
    );
    assert!(sent.timing);
    time::sleep(5 * MS).await;
    let result = CallResult {
        calls: vec![span("c.deep", code::OK, 7, 1)],
        ..CallResult::error(code::OK, "")
    };
    running.give(first, result).await;

    // The continuation's call carries the same trace and flag.
    let (second, sent) = running.call().await;
    assert_eq!(sent.route, "b.two");
    assert_eq!(sent.trace, ["x.outer", "t.trip"]);
    assert!(sent.timing);
    time::sleep(3 * MS).await;
    let result = CallResult::error(code::NOT_FOUND, "no such method");
    running.give(second, result).await;

    let (id, response) = running.response().await;
    assert_eq!((id, response.code), (1, code::NOT_FOUND));
    assert_eq!(
        response.calls,
        [
            span("a.one", code::OK, 5_000, 1),
            span("c.deep", code::OK, 7, 2),
            span("b.two", code::NOT_FOUND, 3_000, 1),
        ],
        "in the order their results came, each followed by its callee's"
    );
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn calls_carry_the_trace_but_no_spans_come_without_timing_or_deferral() {
    let mut running = start(trips(), config(16, 100));
    running.intake.offer(traced("trip", 1, &[], false)).await;
    let (first, sent) = running.call().await;
    assert_eq!(
        (sent.trace, sent.timing),
        (vec!["t.trip".to_owned()], false)
    );
    let result = CallResult {
        calls: vec![span("c.deep", code::OK, 7, 1)],
        ..CallResult::error(code::OK, "")
    };
    running.give(first, result).await;
    let (second, sent) = running.call().await;
    assert_eq!(
        (sent.trace, sent.timing),
        (vec!["t.trip".to_owned()], false)
    );
    running.give(second, CallResult::error(code::OK, "")).await;
    let (id, response) = running.response().await;
    assert_eq!((id, response.code), (1, code::OK));
    assert!(response.calls.is_empty(), "{:?}", response.calls);

    // Timed but answered at once: its call's result comes after its answer.
    running.intake.offer(traced("go", 2, &[], true)).await;
    let (id, response) = running.response().await;
    assert_eq!(id, 2);
    assert!(response.calls.is_empty(), "{:?}", response.calls);
    let (third, sent) = running.call().await;
    assert!(sent.timing);
    running.give(third, CallResult::error(code::OK, "")).await;
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_call_nested_deeper_than_max_call_depth_is_refused_500_at_once() {
    let t0 = Instant::now();
    let outer = [
        "s1.m", "s2.m", "s3.m", "s4.m", "s5.m", "s6.m", "s7.m", "s8.m",
    ];
    assert_eq!(outer.len(), MAX_CALL_DEPTH);
    let mut running = start(trips(), config(16, 100));

    // Seven routes before the request's own: its call's trace holds eight, and goes out.
    running
        .intake
        .offer(traced("trip", 1, &outer[1..], true))
        .await;
    let (first, sent) = running.call().await;
    assert_eq!(sent.trace.len(), MAX_CALL_DEPTH);

    // Eight before it: refused, and so is the continuation's call, which answers the 500.
    running.intake.offer(traced("trip", 2, &outer, true)).await;
    let (id, response) = running.response().await;
    assert_eq!(Instant::now(), t0, "at once");
    assert_eq!(
        (id, response.code, response.message.as_str()),
        (
            2,
            code::HANDLER_ERROR,
            "calls nested deeper than 8: a cycle of calls?"
        )
    );
    assert_eq!(
        response.calls,
        [
            span("a.one", code::HANDLER_ERROR, 0, 1),
            span("b.two", code::HANDLER_ERROR, 0, 1),
        ]
    );

    running.give(first, CallResult::error(code::OK, "")).await;
    let (second, _) = running.call().await;
    running.give(second, CallResult::error(code::OK, "")).await;
    assert_eq!(running.response().await.0, 1);
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn spans_past_max_call_spans_are_dropped() {
    let mut running = start(trips(), config(16, 100));
    running.intake.offer(traced("fan", 1, &[], true)).await;
    let (id, response) = running.response().await;
    assert_eq!((id, response.code), (1, code::BAD_REQUEST));
    let refused = span("nomethod", code::BAD_REQUEST, 0, 1);
    assert_eq!(response.calls, vec![refused; MAX_CALL_SPANS]);
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_drain_ends_at_its_deadline_though_a_tick_keeps_calling() {
    // `wait` defers and nothing answers it; every tick calls `bank.pay` and nobody
    // answers those either. The drain ends at the deferred request's deadline with its
    // 408, the tick's calls (5 s each) dropped.
    let service = Service::new("t")
        .raw_method("wait", |ctx, _| {
            ctx.defer();
            Ok(Bytes::new())
        })
        .on_tick(|ctx, _| ctx.call("bank.pay", "", |_ctx, _result| {}));
    let running = start(service, config(16, 100));
    let begun = Instant::now();
    running.intake.offer(request("wait", 1, "ann", 100)).await;
    let (mut rx, _, task) = running.close_intake();
    let mut calls = 0;
    loop {
        match rx.recv().await {
            Some(Sent::Call(_)) => calls += 1,
            Some(Sent::Response(1, response)) => {
                assert_eq!(response.code, code::TIMEOUT);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    task.await.unwrap();
    assert_eq!(begun.elapsed(), 100 * MS, "not a tick's call timeout later");
    assert!(
        calls >= 5,
        "the ticks kept calling during the drain: {calls}"
    );
}

#[tokio::test(start_paused = true)]
async fn at_the_drain_s_end_a_call_timing_out_still_answers_its_request() {
    // As above, but `wait` calls too: its call times out with the request, and its
    // continuation's answer (the 408 it got) is the one sent, before the loop stops.
    let service = Service::new("t")
        .raw_method("wait", |ctx, _| {
            let deferred = ctx.defer();
            ctx.call("bank.pay", "", move |ctx, result: CallResult| {
                ctx.answer(deferred, result.into_result());
            });
            Ok(Bytes::new())
        })
        .on_tick(|ctx, _| ctx.call("bank.pay", "", |_ctx, _result| {}));
    let config = FrameConfig {
        call_margin: Duration::ZERO,
        ..config(16, 100)
    };
    let running = start(service, config);
    running.intake.offer(request("wait", 1, "ann", 100)).await;
    let (mut rx, _, task) = running.close_intake();
    let answer = loop {
        match rx.recv().await {
            Some(Sent::Call(_)) => {}
            Some(Sent::Response(1, response)) => break response,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        (answer.code, answer.message.as_str()),
        (code::TIMEOUT, "call timed out")
    );
    task.await.unwrap();
}
