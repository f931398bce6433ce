//! Prometheus `/metrics` for the gate and worker roles: the process-wide recorder the
//! `metrics` macros in the gateway and services crates write to, served over HTTP.
//! (The broker serves its own figures on its monitoring port.)
//!
//! The recorder keeps every histogram sample recorded since it last drained them into
//! their buckets: about 16 bytes a sample on the heap, two per request in a worker (plus
//! one per frame) and one in a gate. It drains them when `/metrics` is scraped and on upkeep, which `install_recorder`
//! leaves to the caller; without it, a process nobody scrapes grew by every request it
//! ever served (issue #34). So upkeep runs every [`UPKEEP_INTERVAL`], scraped or not,
//! and the samples held are at most that interval's worth.

use std::time::Duration;

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use net::Acceptor;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Bucket bounds, in seconds, of every histogram (all are durations): 50 µs to 10 s,
/// about three per decade, so Prometheus can compute fleet-wide quantiles.
const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// How often the recorder drains histogram samples into their buckets: what it holds
/// between two drains is what the process records in this time (at 100,000 requests a
/// second, about 5 MB in a worker). A drain costs a bucket search per sample, paid anyway.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Installs the process-wide recorder and serves it on `addr` (with `backlog`) until
/// `shutdown`.
/// Returns the bound address (the real port when 0 was asked for).
pub async fn serve_metrics(
    addr: SocketAddr,
    backlog: net::Backlog,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS)
        .context("setting histogram buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    services::describe_metrics();
    tokio::spawn(upkeep(handle.clone()));
    let listener = net::listen(addr, backlog)
        .await
        .with_context(|| format!("binding metrics on {addr}"))?;
    let bound = listener.local_addr()?;
    let app =
        axum::Router::new().route("/metrics", get(move || std::future::ready(handle.render())));
    tokio::spawn(async move {
        let served = axum::serve(Acceptor::new(listener, "metrics"), app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics endpoint failed");
        }
    });
    info!("Serving Prometheus metrics on http://{bound}/metrics");
    Ok(bound)
}

/// Drains the recorder's histogram samples every [`UPKEEP_INTERVAL`] for as long as the
/// runtime runs: a draining worker still records after shutdown is asked for.
async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::System;
    use std::time::Instant;

    use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

    use super::*;

    /// The system allocator, counting: what the recorder holds shows in the bytes live.
    #[global_allocator]
    static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

    fn live_bytes() -> isize {
        // A reallocation's difference is in these two already (and again in
        // `bytes_reallocated`).
        let s = ALLOCATOR.stats();
        s.bytes_allocated as isize - s.bytes_deallocated as isize
    }

    /// Samples recorded: 1.6 MB held while nothing drains them.
    const SAMPLES: usize = 200_000;

    #[tokio::test]
    async fn histogram_samples_are_freed_without_a_scrape() {
        let shutdown = CancellationToken::new();
        serve_metrics(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            net::Backlog::default(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        let histogram = metrics::histogram!("test_seconds");
        histogram.record(0.001);
        let before = live_bytes();
        for _ in 0..SAMPLES {
            histogram.record(0.001);
        }
        let held = live_bytes() - before;
        assert!(
            held > 4 * SAMPLES as isize,
            "recording {SAMPLES} samples held only {held} bytes"
        );
        // Nobody scrapes: the samples must still go, within a few upkeep intervals.
        let patience = UPKEEP_INTERVAL * 5;
        let deadline = Instant::now() + patience;
        loop {
            // A process keeps recording, which also runs the recorder's deferred frees.
            histogram.record(0.001);
            let left = live_bytes() - before;
            if left < SAMPLES as isize {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{left} bytes still held {patience:?} after recording {SAMPLES} samples"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
    }
}
