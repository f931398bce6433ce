//! A handler that runs past `--handler-stall` blocks the worker's thread, never its bus
//! I/O: the watchdog drives the I/O until the handler returns, so the keyed heartbeats
//! (what peers judge a worker alive by) keep their period, requests that arrive
//! meanwhile are queued, and every one is answered in order afterwards. Each overrun
//! counts once in `worker_io_takeovers_total`; handlers within the budget never do.
//!
//! On our broker, on nats-server, and with the worker in process (`shaddock up`).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Bus, BusExt, Requester, metric, within};
use futures::StreamExt;
use proto::Message;
use proto::code;
use proto::keyed::{members_subject, partition_subject};
use proto::rpc::RpcRequest;
use services::{FrameConfig, KeyedConfig, Service, WorkerConfig};
use tokio::sync::Mutex;
use tokio::time::Instant;

broker::on_every_bus!(
    a_handler_past_the_stall_keeps_the_heartbeats_on_time;
    tcp_only:
    handlers_within_the_stall_are_never_taken_over,
);

const PREFIX: &str = "shaddock";
const NAME: &str = "stall";
const HEARTBEAT: Duration = Duration::from_millis(50);
const STALL: Duration = Duration::from_millis(20);
/// How long the slow handler blocks its thread: fifty stalls, twenty heartbeats.
const SLOW: Duration = Duration::from_secs(1);
const TAKEOVERS: &str = "worker_io_takeovers_total";

/// One test at a time reading the binary's metrics.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// A keyed service of one partition: `slow` blocks the thread for [`SLOW`], `fast`
/// answers at once; both answer their body.
fn service() -> Service {
    Service::new(NAME)
        .keyed(1)
        .raw_method("slow", |_ctx, body| {
            std::thread::sleep(SLOW);
            Ok(body)
        })
        .raw_method("fast", |_ctx, body| Ok(body))
}

async fn worker(bus: &Bus) -> common::RunningWorker {
    let config = WorkerConfig {
        keyed: KeyedConfig {
            keyed_heartbeat: HEARTBEAT,
            ..KeyedConfig::default()
        },
        frames: FrameConfig {
            handler_stall: STALL,
            ..FrameConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = bus.worker(service(), config).await;
    let mut held = worker.0.held().expect("a keyed worker");
    assert!(within(held.at_least(1)).await);
    worker
}

/// Request `method` with body `n`, as a gate sends it.
fn request(method: &str, n: u32) -> Bytes {
    RpcRequest {
        route: format!("{NAME}.{method}"),
        key: "k".into(),
        origin: "test.gw.g1.1".into(),
        seq: n.into(),
        body: Bytes::from(n.to_string()),
        ..RpcRequest::default()
    }
    .encode_to_vec()
    .into()
}

fn subject(method: &str) -> String {
    format!("{}.{method}", partition_subject(PREFIX, NAME, 0))
}

/// A slow request, then four fast ones queued behind it: while the slow handler runs,
/// the worker's heartbeats, heard on a connection of the test's own, come at their
/// period (the largest gap stays far below the handler's second); one takeover is
/// counted; all five are answered, in order.
async fn a_handler_past_the_stall_keeps_the_heartbeats_on_time(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let worker = worker(&bus).await;
    let listener = bus.client().await;
    let mut heartbeats = listener
        .subscribe(members_subject(PREFIX, NAME))
        .await
        .unwrap();
    within(listener.flush()).await.unwrap();
    within(heartbeats.next()).await.unwrap();
    let before = metric(TAKEOVERS);

    let mut requests = Requester::new(bus.client().await).await;
    requests.send(&subject("slow"), 1, request("slow", 1)).await;
    for n in 2..=5 {
        requests.send(&subject("fast"), n, request("fast", n)).await;
    }
    // Heartbeats until the slow answer, and the largest gap between two.
    let started = Instant::now();
    let mut last = started;
    let mut largest = Duration::ZERO;
    let answers = async {
        let mut answers = vec![requests.next().await];
        for _ in 2..=5 {
            answers.push(requests.next().await);
        }
        answers
    };
    let mut answers = std::pin::pin!(answers);
    let answers = loop {
        tokio::select! {
            answers = &mut answers => break answers,
            heartbeat = heartbeats.next() => {
                heartbeat.expect("the subscription lives");
                largest = largest.max(last.elapsed());
                last = Instant::now();
            }
        }
    };
    assert!(started.elapsed() >= SLOW / 2, "the slow handler ran");
    assert!(
        largest < 6 * HEARTBEAT,
        "heartbeats every {HEARTBEAT:?}: the largest gap was {largest:?}"
    );
    let order: Vec<(u32, u32)> = answers.iter().map(|(n, r)| (*n, r.code)).collect();
    let expected: Vec<(u32, u32)> = (1..=5).map(|n| (n, code::OK)).collect();
    assert_eq!(order, expected, "answered once each, in order");
    assert_eq!(metric(TAKEOVERS) - before, 1.0, "one frame overran");
    worker.stop().await;
}

/// A hundred requests, one at a time, each handled in microseconds: no takeover.
async fn handlers_within_the_stall_are_never_taken_over(bus: Bus) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let worker = worker(&bus).await;
    let before = metric(TAKEOVERS);
    let mut requests = Requester::new(bus.client().await).await;
    for n in 1..=100 {
        requests.send(&subject("fast"), n, request("fast", n)).await;
        let (answered, response) = requests.next().await;
        assert_eq!((answered, response.code), (n, code::OK));
    }
    assert_eq!(metric(TAKEOVERS), before, "no frame overran");
    worker.stop().await;
}
