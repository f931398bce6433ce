//! Work handed off the loop (`Context::wait_on`: a store's write): it is not sent on the
//! bus, the loop serves others meanwhile, and its result comes back to a continuation,
//! within the request's deadline like a call's. Under the paused clock.

use bytes::Bytes;
use futures::FutureExt as _;
use proto::code;
use tokio::time::{self, Duration, Instant};

use super::calls::{request, start};
use super::{MS, config};
use crate::context::CallResult;
use crate::frame_loop::FrameConfig;
use crate::service::Service;

/// `slow` hands off a job that takes 50 ms and answers its result's body; `ping`
/// answers at once.
fn slow() -> Service {
    Service::new("t")
        .raw_method("slow", |ctx, _| {
            let deferred = ctx.defer();
            let job = || {
                async {
                    time::sleep(50 * MS).await;
                    CallResult {
                        body: Bytes::from_static(b"stored"),
                        ..CallResult::error(code::OK, "")
                    }
                }
                .boxed()
            };
            ctx.wait_on("store.put", job, move |ctx, result| {
                ctx.answer(deferred, result.into_result());
            });
            Ok(Bytes::new())
        })
        .raw_method("ping", |_, _| Ok(Bytes::from_static(b"pong")))
}

#[tokio::test(start_paused = true)]
async fn a_job_runs_off_the_loop_and_its_result_answers_through_a_continuation() {
    let mut running = start(slow(), config(16, 100));
    let t0 = Instant::now();
    running.intake.offer(request("slow", 1, "ann", 0)).await;
    running.intake.offer(request("ping", 2, "ann", 0)).await;
    // The ping is answered while the job waits: the loop is not blocked, and nothing
    // went out on the bus for the job.
    let (id, response) = running.response().await;
    assert_eq!(
        (id, &response.body[..], t0.elapsed()),
        (2, &b"pong"[..], Duration::ZERO)
    );
    let (id, response) = running.response().await;
    assert_eq!(
        (id, response.code, &response.body[..], t0.elapsed()),
        (1, code::OK, &b"stored"[..], 50 * MS)
    );
    assert!(running.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_job_past_the_request_s_deadline_gives_its_continuation_a_408() {
    let no_margin = FrameConfig {
        call_margin: Duration::ZERO,
        ..config(16, 100)
    };
    let mut running = start(slow(), no_margin);
    let t0 = Instant::now();
    // The caller waits 30 ms; the job takes 50: its continuation answers 408 at 30.
    running.intake.offer(request("slow", 1, "ann", 30)).await;
    let (id, response) = running.response().await;
    assert_eq!(
        (id, response.code, response.message.as_str(), t0.elapsed()),
        (1, code::TIMEOUT, "call timed out", 30 * MS)
    );
    assert!(running.stop().await.is_empty());
}
