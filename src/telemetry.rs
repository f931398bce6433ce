//! Prometheus `/metrics` for the gate and worker roles: the process-wide recorder the
//! `metrics` macros in the gateway and services crates write to, served over HTTP.
//! (The broker serves its own figures on its monitoring port.)

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Installs the process-wide recorder and serves it on `addr` until `shutdown`.
/// Returns the bound address (the real port when 0 was asked for).
pub async fn serve_metrics(
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    services::metrics::describe();
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding metrics on {addr}"))?;
    let bound = listener.local_addr()?;
    let app =
        axum::Router::new().route("/metrics", get(move || std::future::ready(handle.render())));
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics endpoint failed");
        }
    });
    info!("Serving Prometheus metrics on http://{bound}/metrics");
    Ok(bound)
}
