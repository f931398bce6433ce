//! The driver on a real runtime and the real clock: handlers here block the thread, as
//! an overrunning handler does, so the watchdog's budget is measured in wall time. The
//! edge cases keep 150 ms either side of the budget: a loaded 2-core machine running
//! the suite wakes a sleeping thread tens of milliseconds late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proto::Message;
use proto::rpc::{RpcRequest, RpcResponse};
use tokio::sync::mpsc;

use super::*;
use crate::config::FrameConfig;
use crate::frame_loop::{Incoming, queue};

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

/// Drives a loop over requests whose handler sleeps (blocking the thread) for the
/// given times, with `stall` as the budget, beside a task beating every [`BEAT`].
fn drive_sleeps(stall: Duration, sleeps: &[Duration]) -> Run {
    let rt = Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    );
    let counted = Arc::new(AtomicU64::new(0));
    let beats = Arc::new(Mutex::new(Vec::new()));
    let service = {
        let (counted, beats) = (counted.clone(), beats.clone());
        Service::new("t").raw_method("sleep", move |_ctx, body| {
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
    let frame_loop = {
        let _runtime = rt.enter();
        let (intake, queue) = queue("t", sleeps.len() + 1, out.clone());
        for (id, sleep) in (0u32..).zip(sleeps) {
            let mut body = (sleep.as_millis() as u64).to_be_bytes().to_vec();
            body.extend(id.to_be_bytes());
            let request = RpcRequest {
                route: "t.sleep".into(),
                body: Bytes::from(body),
                ..RpcRequest::default()
            };
            let incoming = Incoming::new("sleep", request.encode_to_vec().into(), Some(id));
            rt.block_on(intake.offer(incoming));
        }
        // The loop ends once it has handled what is queued.
        drop(intake);
        FrameLoop::new(service, config, queue, out)
    };
    rt.spawn(async move {
        let mut beat = tokio::time::interval(BEAT);
        loop {
            beat.tick().await;
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let driven = drive(
        &rt,
        "t",
        stall,
        frame_loop,
        &mut std::future::pending::<()>(),
    )
    .unwrap();
    assert!(driven.ended.is_ok(), "the loop ran to its end");
    let mut answered = Vec::new();
    while let Ok((id, response)) = answers.try_recv() {
        assert_eq!(response.code, proto::code::OK);
        answered.push(id);
    }
    let beats = beats.lock().unwrap().clone();
    Run {
        takeovers: driven.takeovers,
        beats,
        answered,
    }
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
