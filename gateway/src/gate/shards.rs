//! A gate process of N shards (`--shards`, docs/gateway.md "Shards"): each shard a
//! [`Gate`] of its own on its own OS thread and single-threaded runtime, with its own
//! sessions, timers, bus connection and gate id, so a request is read, forwarded,
//! answered and written on the thread that holds its session (issue 47).
//!
//! Shards are N gates that happen to share a process: what spans them (one session per
//! uid, pushes to a player or group on another shard, resume from another shard, schema
//! learning) goes over the bus exactly as between gates, with no lock between shards on
//! a request's path. What the shards share is touched per connection, never per
//! request: the listening addresses (one socket per shard with SO_REUSEPORT,
//! [`net::listen_shared`]), the shutdown token, the token check and the TLS certificate
//! (read at each handshake), and the connection counts of `--max-sessions` and
//! `--max-connections-per-ip` (one [`Admission`], taken at accept and at close), so
//! those limits hold for the process as they did for one gate. A request touches one
//! thing another shard does too: the process's metrics recorder (atomics, no lock).

use std::sync::Arc;

use anyhow::Context as _;
use bus::BusOptions;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{Gate, Listener};
use crate::admission::Admission;
use crate::auth::TokenCheck;
use crate::config::GateConfig;
use crate::tls::Tls;

/// One shard's sockets, bound by the caller ([`net::listen_shared`]) and adopted by the
/// shard's runtime: the plain one and, when asked for, the TLS one with its certificate.
#[derive(Debug)]
pub struct ShardListeners {
    pub plain: std::net::TcpListener,
    pub tls: Option<(std::net::TcpListener, Tls)>,
}

/// Running shards: their gates, and for each the end of its serving.
pub struct Shards {
    gates: Vec<Gate>,
    served: Vec<oneshot::Receiver<std::io::Result<()>>>,
}

impl Shards {
    /// Starts one shard per element of `listeners`, each on its own thread: it connects
    /// its own bus connection (`bus`), then serves its listeners until `shutdown`, when
    /// it drains as a gate does. The first shard runs on `host` instead when given: a
    /// current-thread runtime another thread drives (in `shaddock up`, the host of its
    /// in-process workers, so a request never leaves that thread). Returns once every
    /// shard's bus connection is up (as [`Gate::new`] does), or the first shard's error.
    pub async fn start(
        bus: BusOptions,
        config: &GateConfig,
        token_check: Arc<dyn TokenCheck>,
        listeners: Vec<ShardListeners>,
        mut host: Option<Handle>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Shards> {
        let admission = Admission::new(config.max_sessions, config.max_connections_per_ip);
        let configs = config.shards(listeners.len());
        // Shards that started are stopped again if another fails to.
        let stop = shutdown.child_token();
        let mut starting = Vec::new();
        let mut served = Vec::new();
        for (index, (config, listeners)) in configs.into_iter().zip(listeners).enumerate() {
            let (ready_tx, ready) = oneshot::channel();
            let (served_tx, serving) = oneshot::channel();
            let shard = Shard {
                bus: bus.clone(),
                config,
                token_check: token_check.clone(),
                admission: admission.clone(),
                listeners,
                shutdown: stop.clone(),
            };
            match host.take() {
                Some(host) => drop(host.spawn(shard.serve(ready_tx, served_tx))),
                None => {
                    std::thread::Builder::new()
                        .name(format!("gate-shard-{index}"))
                        .spawn(move || shard.run(ready_tx, served_tx))
                        .context("starting a gate shard's thread")?;
                }
            }
            starting.push(ready);
            served.push(serving);
        }
        let mut gates = Vec::new();
        for (index, ready) in starting.into_iter().enumerate() {
            let started = match ready.await {
                Ok(started) => started,
                Err(_) => Err(anyhow::anyhow!("the shard's thread panicked")),
            };
            match started {
                Ok(gate) => gates.push(gate),
                Err(error) => {
                    stop.cancel();
                    return Err(error.context(format!("gate shard {index}")));
                }
            }
        }
        Ok(Shards { gates, served })
    }

    /// Every shard's gate, in shard order.
    pub fn gates(&self) -> &[Gate] {
        &self.gates
    }

    /// Waits until every shard has drained and stopped (after the `shutdown` given to
    /// [`Shards::start`]); the first failure among them, if any.
    pub async fn join(self) -> anyhow::Result<()> {
        let mut result = Ok(());
        for (index, served) in self.served.into_iter().enumerate() {
            let ended = match served.await {
                Ok(served) => served.with_context(|| format!("gate shard {index}")),
                Err(_) => Err(anyhow::anyhow!("gate shard {index} panicked")),
            };
            result = result.and(ended);
        }
        result
    }
}

/// What one shard's thread needs, moved onto it.
struct Shard {
    bus: BusOptions,
    config: GateConfig,
    token_check: Arc<dyn TokenCheck>,
    admission: Admission,
    listeners: ShardListeners,
    shutdown: CancellationToken,
}

impl Shard {
    /// The shard's thread: its runtime, its gate, and serving until shutdown.
    fn run(
        self,
        ready: oneshot::Sender<anyhow::Result<Gate>>,
        served: oneshot::Sender<std::io::Result<()>>,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let runtime = match runtime {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = ready.send(Err(anyhow::Error::new(error).context("the shard's runtime")));
                return;
            }
        };
        runtime.block_on(self.serve(ready, served));
    }

    /// Starts the shard's gate, says so on `ready`, and serves until shutdown.
    async fn serve(
        self,
        ready: oneshot::Sender<anyhow::Result<Gate>>,
        served: oneshot::Sender<std::io::Result<()>>,
    ) {
        let (gate, listeners, shutdown) = match self.start().await {
            Ok(started) => started,
            Err(error) => {
                let _ = ready.send(Err(error));
                return;
            }
        };
        let _ = ready.send(Ok(gate.clone()));
        let _ = served.send(gate.serve(listeners, shutdown).await);
    }

    /// Adopts the shard's sockets into this thread's runtime (moved, not duplicated: a
    /// socket must close when its accept loop ends, or the kernel would go on queueing
    /// connections on it that nobody takes) and connects the shard's gate.
    async fn start(self) -> anyhow::Result<(Gate, Vec<Listener>, CancellationToken)> {
        let adopt = tokio::net::TcpListener::from_std;
        let mut listeners = vec![Listener::plain(adopt(self.listeners.plain)?)];
        if let Some((socket, tls)) = self.listeners.tls {
            listeners.push(Listener::tls(adopt(socket)?, tls));
        }
        let gate = Gate::admitting(self.bus, self.config, self.token_check, self.admission).await?;
        Ok((gate, listeners, self.shutdown))
    }
}
