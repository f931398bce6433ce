//! Signal handling for the binaries: the only place the process reacts to SIGINT and
//! SIGTERM, turning them into a cancelled shutdown token (libraries never see signals).

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// SIGINT and SIGTERM, registered up front: a harness may send SIGTERM right after
/// `Server is ready`, and the default action would skip the cleanup.
pub struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    pub fn install() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(ShutdownSignals {
                interrupt: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
                terminate: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            })
        }
        #[cfg(not(unix))]
        Ok(ShutdownSignals {})
    }

    /// Returns on a signal, or when `shutdown` is cancelled because part of the process
    /// failed.
    pub async fn wait(&mut self, shutdown: &CancellationToken) {
        tokio::select! {
            name = self.next() => info!("Trapped \"{name}\" signal"),
            () = shutdown.cancelled() => {}
        }
    }

    #[cfg(unix)]
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "interrupt",
            _ = self.terminate.recv() => "terminated",
        }
    }

    #[cfg(not(unix))]
    async fn next(&mut self) -> &'static str {
        if tokio::signal::ctrl_c().await.is_err() {
            // Without a handler there is no signal to wait for; only `shutdown` remains.
            std::future::pending::<()>().await;
        }
        "interrupt"
    }
}
