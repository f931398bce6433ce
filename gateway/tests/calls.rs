//! Calls between services end to end, on both buses: a real gate, real workers, clients
//! over WebSockets. `shop.buy` defers its answer, calls `bank.pay` and answers the
//! client from the call's continuation, so what the client sees went client → gate →
//! shop → bank → shop → gate → client.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Bus, Holds, TestGate, TestWorker, echo_worker, gate_config, start_worker, within};
use proto::code;
use sdk::ClientOptions;
use services::{CallResult, FrameConfig, HandlerError, MAX_CALL_DEPTH, Service};
use tokio::sync::mpsc;

broker::on_both_buses!(
    a_deferred_answer_carries_the_callee_s_answer_and_the_callee_sees_the_session,
    a_call_to_a_service_without_workers_gets_503_and_the_client_the_handler_s_answer,
    a_slow_callee_times_the_call_out_while_the_caller_keeps_serving,
    the_built_in_echo_relay_answers_through_a_call_to_its_own_service,
    server_timing_shows_the_calls_made_for_a_request,
    a_cycle_of_calls_ends_at_the_depth_bound_with_500,
);

/// `login` binds the uid in the body; `buy` defers, calls `bank.pay` with its body and
/// answers with the bank's answer, or with its own word for a failure; `stall` does the
/// same through `slow.hold`; `ping` answers at once. Every continuation reports the
/// code its call got on `codes`.
fn shop(codes: mpsc::UnboundedSender<u32>) -> Service {
    let pay = move |route: &'static str| {
        let codes = codes.clone();
        move |ctx: &mut services::Context, body: Bytes| {
            let deferred = ctx.defer();
            let codes = codes.clone();
            ctx.call(route, body, move |ctx, result: CallResult| {
                let _ = codes.send(result.code);
                let answer = if result.is_ok() {
                    Ok(result.body)
                } else {
                    Ok(Bytes::from(format!(
                        "no sale: {} {}",
                        result.code, result.message
                    )))
                };
                ctx.answer(deferred, answer);
            });
            Ok::<_, HandlerError>(Bytes::new())
        }
    };
    Service::new("shop")
        .raw_method("login", |ctx, body| {
            ctx.bind_uid(String::from_utf8_lossy(&body));
            Ok(Bytes::new())
        })
        .raw_method("buy", pay("bank.pay"))
        .raw_method("stall", pay("slow.hold"))
        .raw_method("ping", |_ctx, body| Ok(body))
}

/// `pay` answers who paid (the caller's session's uid) and what.
fn bank() -> Service {
    Service::new("bank").raw_method("pay", |ctx, body| {
        let uid = ctx.uid().unwrap_or("nobody").to_owned();
        Ok(Bytes::from(format!(
            "{uid} paid {}",
            String::from_utf8_lossy(&body)
        )))
    })
}

async fn shop_worker(bus: &Bus) -> (TestWorker, mpsc::UnboundedReceiver<u32>) {
    let (codes, rx) = mpsc::unbounded_channel();
    let worker = start_worker(bus.url(), shop(codes), FrameConfig::default()).await;
    (worker, rx)
}

async fn a_deferred_answer_carries_the_callee_s_answer_and_the_callee_sees_the_session(bus: Bus) {
    let _bank = start_worker(bus.url(), bank(), FrameConfig::default()).await;
    let (_shop, mut codes) = shop_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let client = gate.client().await;
    let login = within(client.request("shop.login", "ann")).await.unwrap();
    assert_eq!(login.code, code::OK, "{login:?}");
    for n in 1..=3 {
        let bought = within(client.request("shop.buy", format!("{n} coins")))
            .await
            .unwrap();
        assert_eq!(bought.code, code::OK, "{bought:?}");
        assert_eq!(bought.body, format!("ann paid {n} coins").as_bytes());
        assert_eq!(codes.recv().await, Some(code::OK));
    }
}

async fn a_call_to_a_service_without_workers_gets_503_and_the_client_the_handler_s_answer(
    bus: Bus,
) {
    let (_shop, mut codes) = shop_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let client = gate.client().await;
    let bought = within(client.request("shop.buy", "1")).await.unwrap();
    assert_eq!(bought.code, code::OK, "{bought:?}");
    assert_eq!(bought.body, &b"no sale: 503 no worker available now"[..]);
    assert_eq!(codes.recv().await, Some(code::UNAVAILABLE));
}

async fn a_slow_callee_times_the_call_out_while_the_caller_keeps_serving(bus: Bus) {
    let mut holds = Holds::default();
    let _slow = start_worker(
        bus.url(),
        holds.service("slow", "s"),
        FrameConfig::default(),
    )
    .await;
    let (_shop, mut codes) = shop_worker(&bus).await;
    // The call waits what is left of the gate's request timeout, less the margin.
    let timeout = Duration::from_millis(800);
    let gate = TestGate::start(&bus, gate_config(|c| c.request_timeout = timeout)).await;
    let (buyer, other) = (gate.client().await, gate.client().await);
    let stalled = tokio::spawn(async move { buyer.request("shop.stall", "x").await });
    assert_eq!(
        holds.started().await,
        "s",
        "the call reached the slow service"
    );

    // The shop's loop is not waiting for the call: it serves meanwhile.
    for n in 0..5 {
        let body = format!("ping {n}");
        let pong = within(other.request("shop.ping", &body)).await.unwrap();
        assert_eq!((pong.code, pong.body), (code::OK, body.into_bytes().into()));
    }
    // The margin before the deadline the continuation gets 408, and the client gets
    // the shop's answer to it, not the gate's 408.
    assert_eq!(within(codes.recv()).await, Some(code::TIMEOUT));
    let answer = within(stalled).await.unwrap().unwrap();
    assert_eq!(
        (answer.code, &answer.body[..]),
        (code::OK, &b"no sale: 408 call timed out"[..]),
        "{answer:?}"
    );
    holds.release("s");
}

/// `echo.relay` (the built-in echo service) calls `echo.raw`, served by the same
/// worker's queue group, and answers what it answered: one call hop.
async fn the_built_in_echo_relay_answers_through_a_call_to_its_own_service(bus: Bus) {
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let client = gate.client().await;
    for body in ["one", "two"] {
        let relayed = within(client.request("echo.relay", body)).await.unwrap();
        assert_eq!(
            (relayed.code, &relayed.body[..]),
            (code::OK, body.as_bytes())
        );
    }
}

/// A client that asked for server timing sees the call `echo.relay` made to `echo.raw`
/// in its timing, as the relaying worker measured it; a plain `echo.raw` made none.
async fn server_timing_shows_the_calls_made_for_a_request(bus: Bus) {
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let timed = ClientOptions {
        server_timing: true,
        ..ClientOptions::default()
    };
    let client = gate.client_with(timed).await;
    let relayed = within(client.request("echo.relay", "x")).await.unwrap();
    assert_eq!(relayed.code, code::OK, "{relayed:?}");
    let timing = relayed.timing.expect("the handshake asked for timing");
    let [call] = &timing.calls[..] else {
        panic!("one call: {timing:?}");
    };
    assert_eq!(
        (call.route.as_str(), call.code, call.hop),
        ("echo.raw", code::OK, 1),
        "{timing:?}"
    );
    assert!(call.us > 0 && call.us < timing.total_us, "{timing:?}");

    let raw = within(client.request("echo.raw", "x")).await.unwrap();
    let timing = raw.timing.expect("the handshake asked for timing");
    assert!(timing.calls.is_empty(), "{timing:?}");
}

/// `ring.turn` calls itself and answers what it got: the calls nest until the one whose
/// trace would pass MAX_CALL_DEPTH routes is refused, and the 500 comes back up to the
/// client through every level, each showing in the timing one hop deeper than the last.
async fn a_cycle_of_calls_ends_at_the_depth_bound_with_500(bus: Bus) {
    let ring = Service::new("ring").raw_method("turn", |ctx, body| {
        let deferred = ctx.defer();
        ctx.call("ring.turn", body, move |ctx, result| {
            ctx.answer(deferred, result.into_result());
        });
        Ok(Bytes::new())
    });
    let _ring = start_worker(bus.url(), ring, FrameConfig::default()).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let timed = ClientOptions {
        server_timing: true,
        ..ClientOptions::default()
    };
    let client = gate.client_with(timed).await;
    let answer = within(client.request("ring.turn", "x")).await.unwrap();
    assert_eq!(
        (answer.code, answer.message.as_str()),
        (
            code::HANDLER_ERROR,
            "calls nested deeper than 8: a cycle of calls?"
        )
    );
    // 8 calls were made, the last carrying a trace of 8 routes; the call its request's
    // handler made in turn would have carried 9, and was refused at once (0 µs).
    let timing = answer.timing.expect("the handshake asked for timing");
    let hops: Vec<(u32, u32)> = timing.calls.iter().map(|c| (c.hop, c.code)).collect();
    let want: Vec<(u32, u32)> = (1..=MAX_CALL_DEPTH as u32 + 1)
        .map(|hop| (hop, code::HANDLER_ERROR))
        .collect();
    assert_eq!(hops, want, "{timing:?}");
    let us: Vec<u32> = timing.calls.iter().map(|c| c.us).collect();
    assert!(us[..MAX_CALL_DEPTH].iter().all(|&us| us > 0), "{us:?}");
    assert_eq!(us[MAX_CALL_DEPTH], 0, "{us:?}");
}
