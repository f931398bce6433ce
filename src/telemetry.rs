//! Prometheus `/metrics` for the gate and worker roles: the process-wide recorder the
//! `metrics` macros in the gateway and services crates write to, served over HTTP.
//! (The broker serves its own figures on its monitoring port.)

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;
use net::Acceptor;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Bucket bounds, in seconds, of every histogram (all are durations): 50 µs to 10 s,
/// about three per decade, so Prometheus can compute fleet-wide quantiles.
const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

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
    services::metrics::describe();
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
