//! The gate and worker roles as the binary runs them: flags, readiness log lines, and
//! start/stop around the libraries' `run` functions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bus::{Attach, BusOptions, BusTimings};
use gateway::tls::Tls;
use gateway::{Gate, GateConfig, ShardListeners, Shards};
use services::chat::ChatConfig;
use services::store::{Store, StoreConfig};
use services::{BusSecurity, Service, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Where a gate listens for WebSocket clients unless told otherwise.
pub const DEFAULT_GATE_LISTEN: &str = "0.0.0.0:3250";
/// Where `shaddock up` serves the gate's and workers' Prometheus metrics.
pub const DEFAULT_METRICS_PORT: u16 = 9100;

/// `shaddock gate`: one gate against any NATS servers.
#[derive(Debug, clap::Args)]
pub struct GateArgs {
    /// Address to accept WebSocket clients on (port 0 picks a free port).
    #[arg(long, env = "SHADDOCK_LISTEN", default_value = DEFAULT_GATE_LISTEN)]
    pub listen: SocketAddr,
    /// NATS server URLs, comma-separated (nats-server cluster or `shaddock broker`).
    #[arg(
        long = "nats",
        env = "SHADDOCK_NATS",
        value_delimiter = ',',
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats: Vec<String>,
    #[command(flatten)]
    pub security: BusSecurity,
    #[command(flatten)]
    pub bus_timings: BusTimings,
    /// Serve Prometheus metrics on this address (off when absent).
    #[arg(long, env = "SHADDOCK_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub backlog: net::BacklogArg,
    #[command(flatten)]
    pub shards: gateway::ShardsArg,
    #[command(flatten)]
    pub gate: GateConfig,
}

/// The services a worker process can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceName {
    Echo,
    Chat,
    /// The reference keyed service (matches that move between workers).
    Arena,
    /// Players' display names and colours (keyed by uid), which chat.login calls.
    Profile,
}

impl ServiceName {
    /// Every built-in service: what `shaddock up` runs unless told otherwise.
    pub const ALL: [ServiceName; 4] = [
        ServiceName::Echo,
        ServiceName::Chat,
        ServiceName::Arena,
        ServiceName::Profile,
    ];

    /// The service's name, its subject token.
    pub fn name(self) -> &'static str {
        match self {
            ServiceName::Echo => services::echo::NAME,
            ServiceName::Chat => services::chat::NAME,
            ServiceName::Arena => services::arena::NAME,
            ServiceName::Profile => services::profile::NAME,
        }
    }

    /// A keyed service's partitions; 0 for the others.
    pub fn partitions(self) -> u32 {
        match self {
            ServiceName::Echo | ServiceName::Chat => 0,
            ServiceName::Arena => services::arena::PARTITIONS,
            ServiceName::Profile => services::profile::PARTITIONS,
        }
    }

    /// Whether the service keeps player data in a store (docs/stores.md).
    fn keeps_data(self) -> bool {
        self == ServiceName::Profile
    }

    /// The service, over `store` for one that keeps data.
    fn build(self, chat: ChatConfig, store: Option<Store>) -> anyhow::Result<Service> {
        Ok(match self {
            ServiceName::Echo => services::echo::service(),
            ServiceName::Chat => services::chat::service_with(chat),
            ServiceName::Arena => services::arena::service(),
            ServiceName::Profile => {
                services::profile::service(store.context("the profile service needs a store")?)
            }
        })
    }
}

/// `shaddock worker`: one service's worker in its queue group.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Which service to run.
    #[arg(long, value_enum)]
    pub service: ServiceName,
    /// Serve Prometheus metrics on this address (off when absent).
    #[arg(long, env = "SHADDOCK_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub backlog: net::BacklogArg,
    #[command(flatten)]
    pub config: WorkerConfig,
    #[command(flatten)]
    pub chat: ChatConfig,
    #[command(flatten)]
    pub store: StoreConfig,
}

/// `wss://` beside `ws://`: where, and with which certificate.
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// Also accept TLS WebSocket clients (`wss://`) on this address (port 0 picks one).
    #[arg(long, env = "SHADDOCK_TLS_LISTEN", requires_all = ["tls_cert", "tls_key"])]
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chain for `--tls-listen`; read again on SIGHUP.
    #[arg(long, env = "SHADDOCK_TLS_CERT", requires = "tls_listen")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `--tls-listen`; read again on SIGHUP.
    #[arg(long, env = "SHADDOCK_TLS_KEY", requires = "tls_listen")]
    pub tls_key: Option<PathBuf>,
}

/// A started gate: its shards' handles (one, unsharded), its task, its TLS for reloads,
/// and where it listens (as bound: the real ports when 0 was asked for).
pub struct StartedGate {
    pub gates: Vec<Gate>,
    pub task: JoinHandle<anyhow::Result<()>>,
    pub tls: Option<Tls>,
    pub addr: SocketAddr,
    pub tls_addr: Option<SocketAddr>,
}

impl StartedGate {
    /// Waits until every shard has heard the message types of `services`
    /// ([`Gate::wait_for_schemas`]), all within `deadline`; whether they all have.
    pub async fn wait_for_schemas(&self, services: &[&str], deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        for gate in &self.gates {
            let left = until.saturating_duration_since(Instant::now());
            if !gate.wait_for_schemas(services, left).await {
                return false;
            }
        }
        true
    }
}

/// The name a gate's bus connection gives the server (its `/connz` shows it).
pub const GATE_CONNECTION_NAME: &str = "shaddock-gate";

/// The gate's own bus connection settings from the shared bus flags.
pub fn gate_bus(
    nats: &[String],
    security: &BusSecurity,
    timings: BusTimings,
) -> anyhow::Result<BusOptions> {
    let mut bus = BusOptions::new(nats.iter().cloned());
    bus.name = GATE_CONNECTION_NAME.into();
    timings.apply(&mut bus);
    bus.auth = security.credentials()?;
    bus.tls = security.tls_config()?.map(Arc::new);
    Ok(bus)
}

/// Where a gate's shards run: `shards` of them, each on its own thread with a
/// single-threaded runtime ([`Shards`]), but the first on `host` when given (`up`: the
/// host of its in-process workers).
pub struct GateThreads {
    pub shards: u16,
    pub host: Option<tokio::runtime::Handle>,
}

/// Connects to the bus, binds `listen` (and the TLS listener, if asked for) with
/// `backlog`, and serves a gate on `threads` until `shutdown`: one shard is the gate
/// itself on one thread, so a request's read, forward, answer and write never change
/// threads.
pub async fn start_gate(
    listen: SocketAddr,
    bus: BusOptions,
    config: GateConfig,
    threads: GateThreads,
    tls: &TlsArgs,
    backlog: net::Backlog,
    shutdown: CancellationToken,
) -> anyhow::Result<StartedGate> {
    let token_check = gateway::auth::from_config(&config).context("the gate's token check")?;
    let tls = match (&tls.tls_listen, &tls.tls_cert, &tls.tls_key) {
        (Some(listen), Some(cert), Some(key)) => {
            let tls = Tls::load(cert, key).context("the gate's TLS certificate")?;
            Some((*listen, tls))
        }
        _ => None,
    };
    let GateThreads { shards, host } = threads;
    let count = usize::from(shards);
    let bind = |addr: SocketAddr| async move {
        net::listen_shared(addr, backlog, count)
            .await
            .with_context(|| format!("binding the gate on {addr}"))
    };
    let plain = bind(listen).await?;
    let addr = plain[0].local_addr()?;
    let mut tls_addr = None;
    let mut tls_sockets: Vec<_> = (0..count).map(|_| None).collect();
    if let Some((listen, tls)) = &tls {
        let sockets = bind(*listen).await?;
        tls_addr = Some(sockets[0].local_addr()?);
        tls_sockets = sockets
            .into_iter()
            .map(|s| Some((s, tls.clone())))
            .collect();
    }
    let listeners = (plain.into_iter().zip(tls_sockets))
        .map(|(plain, tls)| ShardListeners { plain, tls })
        .collect();
    let shards = Shards::start(bus, &config, token_check, listeners, host, shutdown).await?;
    let gates = shards.gates().to_vec();
    let task = tokio::spawn(async move { shards.join().await.context("gate") });
    let ids: Vec<&str> = gates.iter().map(Gate::id).collect();
    let ids = ids.join(",");
    info!(gate = ids, "Gate listening for WebSocket clients on {addr}");
    if let Some(addr) = tls_addr {
        info!(
            gate = ids,
            "Gate listening for TLS WebSocket clients on {addr}"
        );
    }
    Ok(StartedGate {
        gates,
        task,
        tls: tls.map(|(_, tls)| tls),
        addr,
        tls_addr,
    })
}

/// Reads the gate's certificate and key again at every SIGHUP, until `shutdown`: new
/// connections get the new pair, open sessions keep theirs.
pub fn reload_tls_on_sighup(tls: Tls, shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(()) = hangups.recv() => match tls.reload() {
                    Ok(()) => info!("TLS certificate reloaded"),
                    Err(error) => tracing::warn!(%error, "TLS certificate not reloaded; the old one stays"),
                },
                () = shutdown.cancelled() => return,
            }
        }
    });
    Ok(())
}

/// Connects to the bus (`config.nats`, or in process to the embedded broker a dialer
/// reaches, on the host given with it) and
/// serves one worker of `service` (with `chat`'s settings, for the chat service; over
/// the store `store` names, for one that keeps player data) until `shutdown`.
pub async fn start_worker(
    service: ServiceName,
    config: WorkerConfig,
    chat: ChatConfig,
    store: &StoreConfig,
    in_process: Option<(&Attach, &services::Host)>,
    shutdown: &CancellationToken,
) -> anyhow::Result<StartedWorker> {
    chat.validate()?;
    let stop_within = config.frames.drain_grace + STOP_SLACK;
    let store = match service.keeps_data() {
        true => Some(Store::open(store, &config.nats, &config.security).await?),
        false => None,
    };
    let service = service.build(chat, store)?;
    let name = services::worker_connection_name(service.name());
    let mut running = match in_process {
        Some((attach, host)) => {
            let attach = attach.clone();
            services::Worker::start_in_process(attach, Some(host), service, config, &name, shutdown)
                .await?
        }
        None => services::Worker::start(service, config, &name, shutdown).await?,
    };
    let held = running.held();
    let task = tokio::spawn(async move { running.join().await.context("worker") });
    Ok(StartedWorker {
        task,
        held,
        stop_within,
    })
}

/// A worker serving, as [`start_worker`] left it.
pub struct StartedWorker {
    pub task: JoinHandle<anyhow::Result<()>>,
    /// A keyed service's partitions held by this worker.
    pub held: Option<services::HeldPartitions>,
    /// How long to wait for it after shutdown ([`join`]): its drain grace, and some.
    pub stop_within: std::time::Duration,
}

/// How long a gate has to stop after shutdown, at most.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long past its drain grace a worker is waited for: it ends by itself within its
/// grace (`--drain-grace`), so this is only a backstop against a bug.
pub const STOP_SLACK: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits, at most `within`, for a role's task after shutdown was signalled, and turns a
/// panic, an error or a hang into one error.
pub async fn join(
    task: JoinHandle<anyhow::Result<()>>,
    within: std::time::Duration,
) -> anyhow::Result<()> {
    let abort = task.abort_handle();
    match tokio::time::timeout(within, task).await {
        Ok(joined) => joined.context("task panicked")?,
        Err(_) => {
            abort.abort();
            anyhow::bail!("did not stop within {within:?}")
        }
    }
}
