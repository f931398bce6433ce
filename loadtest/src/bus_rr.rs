//! `bus-rr`: request-reply over NATS (BENCHMARKS.md B6). Responders in one queue group
//! echo each payload; requesters loop `client.request()` closed-loop: the round trip a
//! service call pays. One connection each, as `nats-bench`: a shared one would coalesce
//! requests into one write and measure the client's batching. Warm-up requests are not
//! recorded; errors are counted, never fatal; every request has a timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::{Client, RequestErrorKind, Subject};
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::hist::{Hist, Summary};
use crate::report::{Doc, OutputArgs, Report, Section, Table};

/// Upper bound on requesters: each is a socket and a task; past this the client machine,
/// not the server, is what gets measured (and file-descriptor limits bite).
pub const MAX_REQUESTERS: u32 = 10_000;
/// Upper bound on responders, for the same reason.
pub const MAX_RESPONDERS: u32 = 1_000;
/// Largest payload accepted: nats-server's default `max_payload` (1 MiB).
const MAX_PAYLOAD: u32 = 1024 * 1024;
/// Queue group the responders join, so each request is answered exactly once.
const QUEUE_GROUP: &str = "shaddock-loadtest";
/// Longest warm-up, duration or request timeout accepted: bounds the run.
const MAX_PHASE: Duration = Duration::from_secs(3600);
/// How long connecting all clients may take before the run is abandoned.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Extra time allowed past warm-up + duration + request timeout before the run is
/// declared hung; covers scheduling delays on a loaded 2-core machine.
const FINISH_SLACK: Duration = Duration::from_secs(5);

/// Flags of `shaddock loadtest bus-rr`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// NATS server URL.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub url: String,
    /// Concurrent closed-loop requesters, each on its own connection.
    #[arg(long, default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_REQUESTERS)))]
    pub requesters: u32,
    /// Responders in one queue group, each on its own connection.
    #[arg(long, default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_RESPONDERS)))]
    pub responders: u32,
    /// Request (and echoed reply) payload in bytes.
    #[arg(long, default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_PAYLOAD)))]
    pub size: u32,
    /// Measured time, after the warm-up (`5s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = net::duration::parse)]
    pub duration: Duration,
    /// Time to run before recording starts, so connection setup, allocator growth and
    /// the client's lazy inbox subscription are not in the figures.
    #[arg(long, default_value = "1s", value_parser = net::duration::parse)]
    pub warmup: Duration,
    /// Per-request timeout; a request past it counts as a timeout error.
    #[arg(long, default_value = "2s", value_parser = net::duration::parse)]
    pub timeout: Duration,
    /// Subject the responders serve.
    #[arg(long, default_value = "shaddock.loadtest.rr")]
    pub subject: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What one run measured (`--json -`: one line, read by scripts/bench-broker.sh); errors
/// count requests sent inside the measured window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BusRr {
    pub requesters: u32,
    pub responders: u32,
    pub size: u32,
    pub warmup_s: f64,
    /// From the end of the warm-up until the last requester finished.
    pub elapsed_s: f64,
    pub requests: u64,
    pub req_per_s: f64,
    #[serde(flatten)]
    pub latency: Summary,
    pub errors: u64,
    pub errors_timeout: u64,
    pub errors_no_responders: u64,
    pub errors_other: u64,
    /// Replies the responders failed to publish (their connection was failing).
    pub responder_errors: u64,
}

impl Section for BusRr {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        doc.table(Table::latency([("request", &self.latency)]));
    }
}

/// Runs the benchmark and prints its report.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let report = measure(&args).await?;
    Report::new("bus-rr", format!("NATS server {}", args.url), report).write(&args.output)
}

/// Runs the benchmark and returns its figures.
async fn measure(args: &Args) -> anyhow::Result<BusRr> {
    let longest = args.duration.max(args.warmup).max(args.timeout);
    let why = format!("--duration, --warmup and --timeout may be {MAX_PHASE:?} at most");
    anyhow::ensure!(longest <= MAX_PHASE, why);
    let subject = Subject::from(args.subject.as_str());
    let payload = Bytes::from(vec![b'x'; args.size as usize]);

    let responder_errors = Arc::new(AtomicU64::new(0));
    // Dropping the set aborts the responders, whose loops otherwise never end.
    let mut responders = JoinSet::new();
    let (responder_clients, requester_clients) = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let responders = connect_all(&args.url, "responder", args.responders, args.timeout);
        let requesters = connect_all(&args.url, "requester", args.requesters, args.timeout);
        futures::try_join!(responders, requesters)
    })
    .await
    .with_context(|| format!("connecting to {} took over {CONNECT_TIMEOUT:?}", args.url))??;

    for client in responder_clients {
        let subscribed = client.queue_subscribe(subject.clone(), QUEUE_GROUP.to_owned());
        let mut requests = subscribed.await.context("responder subscribe")?;
        // A flush round-trips a PING, so the server has the SUB before any request is sent
        // and early requests do not fail with "no responders".
        client.flush().await.context("responder flush")?;
        let errors = Arc::clone(&responder_errors);
        responders.spawn(async move {
            while let Some(request) = requests.next().await {
                let Some(reply) = request.reply else { continue };
                if client.publish(reply, request.payload).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }

    tracing::info!(
        requesters = args.requesters,
        responders = args.responders,
        "connected; warming up for {:?}",
        args.warmup
    );
    let start = Instant::now() + args.warmup;
    let end = start + args.duration;
    let mut requesters = JoinSet::new();
    for client in requester_clients {
        let (subject, payload) = (subject.clone(), payload.clone());
        requesters.spawn(request_loop(client, subject, payload, start, end));
    }

    let deadline = end + args.timeout + FINISH_SLACK;
    let joined = tokio::time::timeout_at(deadline.into(), requesters.join_all()).await;
    let joined = joined.context("requesters did not finish in time; the server is hung")?;
    let mut latency = Hist::new();
    let mut errors = [0u64; 3];
    for (recorded, counted) in joined {
        latency.merge(&recorded);
        errors.iter_mut().zip(counted).for_each(|(e, n)| *e += n);
    }
    let elapsed = start.elapsed().as_secs_f64();
    responders.shutdown().await;
    let l = latency.summary();
    let rate = (elapsed > 0.0).then(|| l.count as f64 / elapsed);
    Ok(BusRr {
        requesters: args.requesters,
        responders: args.responders,
        size: args.size,
        warmup_s: args.warmup.as_secs_f64(),
        elapsed_s: elapsed,
        requests: l.count,
        req_per_s: rate.map_or(0.0, f64::round),
        latency: l,
        errors: errors.iter().sum(),
        errors_timeout: errors[0],
        errors_no_responders: errors[1],
        errors_other: errors[2],
        responder_errors: responder_errors.load(Ordering::Relaxed),
    })
}

/// One closed-loop requester: send, await the reply, record, repeat until `end`.
/// Returns its latencies and its errors: timeouts, no responders, other.
async fn request_loop(
    client: Client,
    subject: Subject,
    payload: Bytes,
    start: Instant,
    end: Instant,
) -> (Hist, [u64; 3]) {
    let mut latency = Hist::new();
    let mut errors = [0; 3];
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        let result = client.request(subject.clone(), payload.clone()).await;
        if sent < start {
            continue;
        }
        match result.map_err(|e| e.kind()) {
            Ok(_) => latency.record(sent.elapsed()),
            Err(RequestErrorKind::TimedOut) => errors[0] += 1,
            Err(RequestErrorKind::NoResponders) => errors[1] += 1,
            Err(_) => errors[2] += 1,
        }
    }
    (latency, errors)
}

/// Opens `count` connections concurrently, failing if any fails.
async fn connect_all(
    url: &str,
    role: &str,
    count: u32,
    request_timeout: Duration,
) -> anyhow::Result<Vec<Client>> {
    let connects = (0..count).map(|i| {
        async_nats::ConnectOptions::new()
            .name(format!("shaddock-loadtest-{role}-{i}"))
            .request_timeout(Some(request_timeout))
            .connect(url)
    });
    let connected = futures::future::try_join_all(connects).await;
    connected.with_context(|| format!("connecting {count} {role}s to {url}"))
}
