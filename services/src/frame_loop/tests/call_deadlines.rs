//! A call's own timeout (`CallOptions::timeout`) and the margin it keeps before its
//! caller's deadline (`--call-margin`), under the paused clock.

use bytes::Bytes;
use proto::code;
use tokio::time::{Duration, Instant};

use super::calls::{Running, request, start};
use super::{MS, Sent, config};
use crate::context::{CallOptions, CallResult};
use crate::frame_loop::FrameConfig;
use crate::service::Service;

/// `ask` calls `bank.pay` waiting at most the milliseconds its body says (none when
/// empty), and answers the call's result as it is.
fn asking() -> Service {
    Service::new("t").raw_method("ask", |ctx, body| {
        let deferred = ctx.defer();
        let wait = String::from_utf8_lossy(&body)
            .trim_start_matches("body ")
            .to_owned();
        let mut options = CallOptions::default();
        if let Ok(ms) = wait.parse() {
            options = options.timeout(Duration::from_millis(ms));
        }
        ctx.call_with_options("bank.pay", "", options, move |ctx, result: CallResult| {
            ctx.answer(deferred, result.into_result());
        });
        Ok(Bytes::new())
    })
}

fn with_margin(margin: Duration) -> FrameConfig {
    FrameConfig {
        call_margin: margin,
        call_timeout: Duration::from_secs(5),
        ..config(16, 100)
    }
}

/// Sends `ask` as request `id` (its body: `body <id>`, so `id` is the call's timeout in
/// ms) from a caller waiting `caller_ms` (0: did not say); returns the call's
/// `timeout_ms` (`None`: not sent) and when, after sending, the request's answer came.
async fn ask(running: &mut Running, id: u32, caller_ms: u32) -> (Option<u32>, Duration) {
    let t0 = Instant::now();
    running
        .intake
        .offer(request("ask", id, "ann", caller_ms))
        .await;
    let sent = match running.next().await {
        Sent::Call(call) => Some(call.request.timeout_ms),
        Sent::Response(got, response) => {
            assert_eq!((got, response.code), (id, code::TIMEOUT), "{response:?}");
            return (None, t0.elapsed());
        }
        other => panic!("{other:?}"),
    };
    let (got, response) = running.response().await;
    assert_eq!(
        (got, response.code, response.message.as_str()),
        (id, code::TIMEOUT, "call timed out"),
        "the continuation's answer, not the worker's 408"
    );
    (sent, t0.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_call_s_own_timeout_holds_within_its_caller_s_deadline_less_the_margin() {
    let mut running = start(asking(), with_margin(100 * MS));
    // Well within the caller's 1 s: its own 300 ms.
    assert_eq!(ask(&mut running, 300, 1_000).await, (Some(300), 300 * MS));
    // Beyond it: capped at the caller's deadline less the margin.
    assert_eq!(ask(&mut running, 5_000, 1_000).await, (Some(900), 900 * MS));
    // A caller without a deadline: the call's own, not --call-timeout.
    assert_eq!(ask(&mut running, 300, 0).await, (Some(300), 300 * MS));
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_caller_with_no_more_than_the_margin_left_gets_408_at_once() {
    let mut running = start(asking(), with_margin(100 * MS));
    // The edge: 101 ms left is 1 ms for the call; 100 ms left is none.
    assert_eq!(ask(&mut running, 5_000, 101).await, (Some(1), MS));
    assert_eq!(ask(&mut running, 5_000, 100).await, (None, Duration::ZERO));
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn with_no_margin_a_call_shares_its_caller_s_deadline() {
    let mut running = start(asking(), with_margin(Duration::ZERO));
    assert_eq!(ask(&mut running, 5_000, 300).await, (Some(300), 300 * MS));
    assert!(running.stop().await.is_empty());
}
