//! The driver on a real runtime and the real clock: handlers here block the thread, as
//! an overrunning handler does, so the watchdog's budget is measured in wall time. The
//! edge cases keep 150 ms either side of the budget: a loaded 2-core machine running
//! the suite wakes a sleeping thread tens of milliseconds late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Runtime;

use bytes::Bytes;
use proto::Message;
use proto::rpc::{RpcRequest, RpcResponse};
use tokio::sync::mpsc;

use super::*;
use crate::config::FrameConfig;
use crate::frame_loop::{Incoming, queue};
use crate::service::Service;

const MS: Duration = Duration::from_millis(1);
/// The period of the stand-in for the worker's I/O: a task counting on the runtime.
const BEAT: Duration = Duration::from_millis(5);

/// What one run saw.
struct Run {
    takeovers: u64,
    /// Per request, in the order handled: the beats counted while its handler slept.
    beats: Vec<u64>,
    /// The ids answered, in order.
    answered: Vec<u32>,
}

/// A loop of service `t` whose queue holds one request per element of `bodies`
/// (ids in order), answering into `out`; it ends once it has handled them.
fn loaded(
    rt: &Runtime,
    service: Service,
    config: FrameConfig,
    bodies: Vec<Vec<u8>>,
    out: mpsc::Sender<(u32, RpcResponse)>,
) -> FrameLoop<mpsc::Sender<(u32, RpcResponse)>> {
    let _runtime = rt.enter();
    let (intake, queue) = queue("t", bodies.len() + 1, out.clone());
    for (id, body) in (0u32..).zip(bodies) {
        let request = RpcRequest {
            route: "t.work".into(),
            body: Bytes::from(body),
            ..RpcRequest::default()
        };
        let incoming = Incoming::new("work", request.encode_to_vec().into(), Some(id));
        rt.block_on(intake.offer(incoming));
    }
    // The loop ends once it has handled what is queued.
    drop(intake);
    FrameLoop::new(service, config, queue, out)
}

/// Hosts `loops` on this thread over `rt` with `stall` as the budget until every one
/// has run to its end; returns the takeovers.
fn host_all(
    rt: &Arc<Runtime>,
    stall: Duration,
    loops: Vec<FrameLoop<mpsc::Sender<(u32, RpcResponse)>>>,
) -> u64 {
    let watchdog = Watchdog::start(rt, "t", stall).unwrap();
    let (arrivals, arriving) = mpsc::unbounded_channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    for frame_loop in loops {
        let done_tx = done_tx.clone();
        let guest = Guest {
            name: "t".into(),
            span: tracing::Span::none(),
            frame_loop,
            stop: std::future::pending::<()>(),
            ended: Box::new(move |ended| {
                done_tx.send(matches!(ended, Ended::Done(..))).unwrap();
                None
            }),
        };
        assert!(arrivals.send(guest).is_ok());
    }
    drop((arrivals, done_tx));
    let takeovers = host(rt, watchdog, arriving);
    assert!(done.iter().all(|ran| ran), "every loop ran to its end");
    takeovers
}

fn current_thread() -> Arc<Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    )
}

/// Drives a loop over requests whose handler sleeps (blocking the thread) for the
/// given times, with `stall` as the budget, beside a task beating every [`BEAT`].
fn drive_sleeps(stall: Duration, sleeps: &[Duration]) -> Run {
    let rt = current_thread();
    let counted = Arc::new(AtomicU64::new(0));
    let beats = Arc::new(Mutex::new(Vec::new()));
    let service = {
        let (counted, beats) = (counted.clone(), beats.clone());
        Service::new("t").raw_method("work", move |_ctx, body| {
            let millis = u64::from_be_bytes(body[..8].try_into().map_err(|_| "bad time")?);
            let before = counted.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(millis));
            beats
                .lock()
                .unwrap()
                .push(counted.load(Ordering::SeqCst) - before);
            Ok(body)
        })
    };
    let (out, mut answers) = mpsc::channel::<(u32, RpcResponse)>(sleeps.len() + 1);
    let config = FrameConfig {
        handler_stall: stall,
        ..FrameConfig::default()
    };
    let bodies = sleeps
        .iter()
        .map(|sleep| (sleep.as_millis() as u64).to_be_bytes().to_vec())
        .collect();
    let frame_loop = loaded(&rt, service, config, bodies, out);
    rt.spawn(async move {
        let mut beat = tokio::time::interval(BEAT);
        loop {
            beat.tick().await;
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let takeovers = host_all(&rt, stall, vec![frame_loop]);
    let mut answered = Vec::new();
    while let Ok((id, response)) = answers.try_recv() {
        assert_eq!(response.code, proto::code::OK);
        answered.push(id);
    }
    let beats = beats.lock().unwrap().clone();
    Run {
        takeovers,
        beats,
        answered,
    }
}

/// A zero `--overrun-pause` is none: 200 frames of one request each run back to back.
/// A pause, however short, waits for the timer's next millisecond: 200 ms at least.
#[test]
fn a_zero_overrun_pause_is_no_pause() {
    let rt = current_thread();
    let config = FrameConfig {
        max_cost: 1,
        overrun_pause: Duration::ZERO,
        ..FrameConfig::default()
    };
    let (out, _answers) = mpsc::channel(256);
    let service = Service::new("t").raw_method("work", |_ctx, body| Ok(body));
    let frame_loop = loaded(&rt, service, config, vec![vec![]; 200], out);
    let start = std::time::Instant::now();
    host_all(&rt, Duration::from_secs(1), vec![frame_loop]);
    let took = start.elapsed();
    assert!(took < 150 * MS, "200 frames took {took:?}");
}

/// Two loops on one host, the first always ready (a frame of one request, no pause
/// after it): the second's request runs after one of the first's, not after all.
#[test]
fn a_busy_loop_does_not_starve_another_on_its_host() {
    let rt = current_thread();
    let order = Arc::new(Mutex::new(Vec::new()));
    let service = |name: &'static str| {
        let order = order.clone();
        Service::new("t").raw_method("work", move |_ctx, body| {
            order.lock().unwrap().push(name);
            Ok(body)
        })
    };
    let config = FrameConfig {
        max_cost: 1,
        overrun_pause: Duration::ZERO,
        ..FrameConfig::default()
    };
    let (out, _answers) = mpsc::channel(64);
    let busy = loaded(
        &rt,
        service("busy"),
        config.clone(),
        vec![vec![]; 20],
        out.clone(),
    );
    let other = loaded(&rt, service("other"), config, vec![vec![]], out);
    host_all(&rt, Duration::from_secs(1), vec![busy, other]);
    let order = order.lock().unwrap().clone();
    let at = order.iter().position(|name| *name == "other").unwrap();
    assert!(
        at <= 2,
        "the other loop waited for {at} of the busy one's: {order:?}"
    );
    assert_eq!(order.len(), 21);
}

#[test]
fn a_handler_past_the_stall_gets_the_watchdog_to_drive_the_io() {
    let run = drive_sleeps(20 * MS, &[300 * MS, MS, MS]);
    assert_eq!(run.takeovers, 1, "one frame overran");
    // 60 beats fall in 300 ms; without the watchdog none are counted during the sleep.
    assert!(
        run.beats[0] >= 20,
        "the I/O ran during the overrun: {:?}",
        run.beats
    );
    assert_eq!(run.answered, [0, 1, 2], "answered, in order");
}

#[test]
fn handlers_within_the_stall_keep_the_io_on_the_loop_thread() {
    let run = drive_sleeps(200 * MS, &[MS; 50]);
    assert_eq!(run.takeovers, 0);
    assert_eq!(run.answered.len(), 50);
}

#[test]
fn a_frame_just_under_the_stall_is_not_taken_over() {
    let run = drive_sleeps(250 * MS, &[100 * MS]);
    assert_eq!(run.takeovers, 0);
    assert_eq!(run.beats, [0], "nothing drove the I/O during the frame");
}

#[test]
fn a_frame_just_over_the_stall_is_taken_over_once() {
    let run = drive_sleeps(100 * MS, &[250 * MS]);
    assert_eq!(run.takeovers, 1);
    assert!(run.beats[0] >= 1, "the I/O ran from the budget's end");
}
