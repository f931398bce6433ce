//! Signal handling for the binaries: the only place the process reacts to SIGINT and
//! SIGTERM (a cancelled shutdown token) and, in the broker, to SIGUSR2 (lame duck mode).
//! Libraries never see signals.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// A signal the process reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trapped {
    /// SIGINT: stop.
    Interrupt,
    /// SIGTERM: stop (the broker finishes lame duck mode first).
    Terminate,
    /// SIGUSR2: the broker enters lame duck mode.
    LameDuck,
}

impl Trapped {
    /// The name nats-server logs for it.
    pub fn name(self) -> &'static str {
        match self {
            Trapped::Interrupt => "interrupt",
            Trapped::Terminate => "terminated",
            Trapped::LameDuck => "user defined signal 2",
        }
    }
}

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
            trapped = self.next() => log(trapped),
            () = shutdown.cancelled() => {}
        }
    }

    #[cfg(unix)]
    async fn next(&mut self) -> Trapped {
        tokio::select! {
            _ = self.interrupt.recv() => Trapped::Interrupt,
            _ = self.terminate.recv() => Trapped::Terminate,
        }
    }

    #[cfg(not(unix))]
    async fn next(&mut self) -> Trapped {
        if tokio::signal::ctrl_c().await.is_err() {
            // Without a handler there is no signal to wait for; only `shutdown` remains.
            std::future::pending::<()>().await;
        }
        Trapped::Interrupt
    }
}

/// The broker's signals: the shutdown ones and SIGUSR2, all registered up front.
pub struct BrokerSignals {
    shutdown: ShutdownSignals,
    #[cfg(unix)]
    user2: tokio::signal::unix::Signal,
}

impl BrokerSignals {
    pub fn install() -> anyhow::Result<Self> {
        Ok(BrokerSignals {
            shutdown: ShutdownSignals::install()?,
            #[cfg(unix)]
            user2: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
                .context("installing SIGUSR2 handler")?,
        })
    }

    /// The next signal, logged as nats-server logs it.
    pub async fn next(&mut self) -> Trapped {
        #[cfg(unix)]
        let trapped = tokio::select! {
            trapped = self.shutdown.next() => trapped,
            _ = self.user2.recv() => Trapped::LameDuck,
        };
        #[cfg(not(unix))]
        let trapped = self.shutdown.next().await;
        log(trapped);
        trapped
    }
}

fn log(trapped: Trapped) {
    info!("Trapped \"{}\" signal", trapped.name());
}
