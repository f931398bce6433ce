//! What a scenario loads: gates given by URL, a topology it launches itself (broker, gates
//! and workers as separate `shaddock` processes on loopback, via [`testkit::fleet`]), or
//! the bare WebSocket echo server ([`crate::limit`]), the machine's physical limit.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use proto::Message as _;
use sdk::{rustls, tls_client_config};
use testkit::fleet::{Topology, TopologySpec};
use tokio_util::sync::CancellationToken;

use super::generator::Target;
use super::schedule::Payload;
use crate::proc::{LOADTEST, Threads, Watched};
use crate::topology::LaunchArgs;

/// Services a launched topology can run; also what a churned session does (`--mix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, clap::ValueEnum)]
pub enum ServiceKind {
    /// The echo service (a churned session sends one `echo.raw`).
    #[default]
    Echo,
    /// The chat service (a churned session logs in under its own name, then joins a room).
    Chat,
}

/// The service `chat.login` calls for the player's profile: launched beside chat.
pub const PROFILE: &str = "profile";

/// The room `chat.members` asks about: nobody is in it, so the answer stays small.
const CHAT_ROOM: &str = "hello-world";

impl ServiceKind {
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Echo => "echo",
            ServiceKind::Chat => "chat",
        }
    }

    /// The route a load test sends unless told otherwise: it needs no login or room joined.
    pub fn default_route(self) -> &'static str {
        match self {
            ServiceKind::Echo => "echo.raw",
            ServiceKind::Chat => "chat.members",
        }
    }

    /// The default route's body from a JSON client: proto3 JSON, or echo's raw body as a string.
    pub fn default_json_payload(self) -> Payload {
        let json = match self {
            ServiceKind::Echo => "\"Hello World\"".to_owned(),
            ServiceKind::Chat => format!("{{\"room\":\"{CHAT_ROOM}\"}}"),
        };
        Payload::Fixed(json.into())
    }

    pub fn default_payload(self) -> Payload {
        match self {
            ServiceKind::Echo => Payload::Hello,
            ServiceKind::Chat => {
                let room = CHAT_ROOM.to_owned();
                Payload::Fixed(proto::chat::MembersRequest { room }.encode_to_vec().into())
            }
        }
    }
}

/// How a launched topology runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyKind {
    /// A broker, gates and workers, each a process.
    #[default]
    Separate,
    /// One `shaddock up` process.
    OneProcess,
}

/// Flags saying where the load goes.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// Existing gate(s) to load, `ws://host:port` (or `wss://` with --tls-ca),
    /// comma-separated or repeated; clients are spread over them round-robin. Without it
    /// the command launches its own topology (broker, --gates gates, --workers workers)
    /// on loopback.
    #[arg(long, value_delimiter = ',')]
    pub url: Vec<String>,
    /// PEM file of the CA that signed the --url gates' certificate: what `wss://` clients
    /// trust (there are no system roots).
    #[arg(long, value_name = "FILE", requires = "url")]
    pub tls_ca: Option<PathBuf>,
    /// How the launched topology runs: each role its own process, or everything in one
    /// `shaddock up` (the gate reaches the embedded broker in process; one echo and one
    /// chat worker; --gates, --workers and --worker-arg do not apply).
    #[arg(long, value_enum, default_value_t, conflicts_with_all = ["url", "gates", "workers", "worker_arg"])]
    pub topology: TopologyKind,
    /// Service the launched workers run.
    #[arg(long, value_enum, default_value_t)]
    pub service: ServiceKind,
    #[command(flatten)]
    pub launch: LaunchArgs,
}

/// The gates, and the topology serving them when this command launched one.
pub type Launched = (Gates, Option<Topology>);

/// Where the load of a scenario goes.
#[derive(Debug, Clone)]
pub struct Gates {
    pub urls: Vec<String>,
    /// Gate pids (when launched).
    pub gate_pids: Vec<u32>,
    /// Every process whose CPU a run reports, this one included.
    pub watched: Vec<Watched>,
    /// "1 gate + 2 echo workers + broker, launched on loopback" or the URLs.
    pub setup: String,
    /// What `wss://` clients trust: from --tls-ca, or the launched gates' throwaway CA.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `wss://` of each launched gate, when launched to serve TLS too.
    pub tls_urls: Vec<String>,
}

/// The load generator, always reported: this process but the bare echo server's threads.
pub fn this_process(name: &str) -> Watched {
    Watched::new(name, std::process::id(), Threads::Others(ECHO_THREADS))
}

/// This process and every process of `topology`: whose CPU a run reports.
pub fn watched(topology: &Topology) -> Vec<Watched> {
    let fleet = topology.pids().into_iter();
    let fleet = fleet.map(|(role, pid)| Watched::new(role.to_string(), pid, Threads::All));
    let this = std::iter::once(this_process(LOADTEST));
    this.chain(fleet).collect()
}

/// The bare echo server's threads' name: how its CPU is told apart from the generator's.
const ECHO_THREADS: &str = "limit-echo";

impl TargetArgs {
    /// The scenario's gates: the given URLs, or a launched topology with `gates` and
    /// `workers` unless the flags override them. A launched topology comes back too:
    /// run the scenario inside [`with_topology`].
    pub async fn gates(&self, gates: u32, workers: u32) -> anyhow::Result<Launched> {
        self.launch(gates, workers, &[self.service], false).await
    }

    /// Like [`TargetArgs::gates`] for a launched topology running a worker of each of
    /// `services`, whose gates also serve `wss://` when `tls`.
    pub async fn launch(
        &self,
        gates: u32,
        workers: u32,
        services: &[ServiceKind],
        tls: bool,
    ) -> anyhow::Result<Launched> {
        let why = "serving wss:// beside ws:// needs gates this command launches (it makes \
                   their certificate); to load running gates over TLS, give their wss:// URLs \
                   to --url with --tls-ca";
        anyhow::ensure!(!tls || self.url.is_empty(), why);
        if !self.url.is_empty() {
            let wss = self.url.iter().any(|u| u.starts_with("wss://"));
            let why = "wss:// URLs need --tls-ca FILE: the CA certificate (PEM) that signed \
                       the gates' certificate";
            anyhow::ensure!(self.tls_ca.is_some() || !wss, why);
            let tls = self.tls_ca.as_deref().map(tls_client_config);
            let tls = tls.transpose().context("--tls-ca")?;
            let gates = Gates {
                urls: self.url.clone(),
                gate_pids: Vec::new(),
                watched: vec![this_process(LOADTEST)],
                setup: format!("existing gate(s) {}", self.url.join(", ")),
                tls,
                tls_urls: Vec::new(),
            };
            return Ok((gates, None));
        }
        let names: Vec<&str> = services.iter().map(|s| s.name()).collect();
        let mut spec = TopologySpec {
            tls,
            one_process: self.topology == TopologyKind::OneProcess,
            ..self.launch.spec(gates, workers, &names)
        };
        if services.contains(&ServiceKind::Chat) {
            // chat.login calls the profile service (as in `shaddock up`).
            spec.workers.push((PROFILE.to_owned(), 1));
        }
        let gates = spec.gates as u32;
        let fleet = (spec.workers.iter())
            .map(|(name, n)| format!("{n} {name} worker{}", plural(*n as u32)))
            .collect::<Vec<_>>()
            .join(" + ");
        let topology = Topology::start(spec).await;
        let topology =
            topology.with_context(|| format!("launching {gates} gate(s) and {fleet}"))?;
        let mut setup = if self.topology == TopologyKind::OneProcess {
            "one process (shaddock up: broker, gate in process, echo, chat, arena and profile workers), launched on loopback".to_owned()
        } else {
            let (s, bus) = (plural(gates), self.launch.bus.describe());
            format!("{gates} gate{s} + {fleet} + {bus}, launched on loopback")
        };
        if tls {
            setup.push_str(", serving ws:// and wss://");
        }
        let extra = self.launch.gate_arg.iter().chain(&self.launch.worker_arg);
        setup.extend(extra.map(|arg| format!(" {arg}")));
        let tls = topology.tls_ca().map(tls_client_config).transpose();
        let tls = tls.context("trusting the launched gates' CA")?;
        let g = Gates {
            urls: topology.gate_urls(),
            gate_pids: topology.gate_pids(),
            watched: watched(&topology),
            setup,
            tls,
            tls_urls: topology.gate_tls_urls(),
        };
        Ok((g, Some(topology)))
    }
}

impl Gates {
    /// The gates as the target of a run named `label`.
    pub fn target(&self, label: &str) -> Target {
        Target {
            tls: self.tls.clone(),
            ..Target::new(label, "gateway", self.urls.clone(), self.watched.clone())
        }
    }
}

/// Runs `work` while a launched topology serves, then stops it; Ctrl-C or a process
/// exiting ends `work` early with an error.
pub async fn with_topology<T>(
    topology: Option<Topology>,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match topology {
        Some(topology) => topology.run(work).await?,
        None => work.await,
    }
}

/// The plural `s` of a count's noun.
pub fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The bare echo server on a runtime and threads of its own, as a separate process
/// would be, so the generator's runtime does not schedule its tasks. Stops when dropped.
#[derive(Debug)]
pub struct LimitServer {
    url: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl LimitServer {
    pub fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            // The machine's cores, as a separate process's default runtime would use.
            .worker_threads(std::thread::available_parallelism().map_or(2, usize::from))
            .thread_name(ECHO_THREADS)
            .enable_all()
            .build()
            .context("starting the echo server's runtime")?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("binding the bare echo server on loopback")?;
        listener.set_nonblocking(true)?;
        let url = format!("ws://{}", listener.local_addr()?);
        let listener = {
            let _runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        runtime.spawn(crate::limit::serve(listener, CancellationToken::new()));
        Ok(LimitServer {
            url,
            runtime: Some(runtime),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bare echo server as the target of a run named `label`.
    pub fn target(&self, label: &str) -> Target {
        // The echo server's threads are in this process: told apart by their name.
        let echo = Threads::Named(ECHO_THREADS);
        let echo = Watched::new("echo server", std::process::id(), echo);
        let watched = vec![this_process(LOADTEST), echo];
        Target::new(label, "limit", vec![self.url.clone()], watched)
    }
}

impl Drop for LimitServer {
    fn drop(&mut self) {
        // Not waited for: its sessions' sockets close with its tasks.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
