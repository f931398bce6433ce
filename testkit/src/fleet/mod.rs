//! Launches a Shaddock topology as separate processes on loopback: a broker (or
//! nats-server nodes, `cluster.rs`), G gates and W workers, each its own `shaddock`
//! process, the way a fleet runs them, so the bus hop and the scheduling between roles
//! are real. A running topology can be changed (a worker or gate added, on the bus
//! nodes it names or on all; one process stopped, signalled or taken out; a bus node
//! restarted). The one fleet launcher: the load tester's scenarios run on it, and so do
//! the root fleet tests (`tests/worker_drain.rs`, `tests/worker_lame_duck.rs`).
//!
//! Each child is a [`Process`]: it binds port 0 and is trusted only once it has
//! logged its readiness line within a deadline; the addresses it bound are read from its
//! log, so nothing sleeps and nothing guesses a port. Teardown stops exactly the
//! processes started here, by pid, gates first (they drain while workers still answer),
//! then workers, then the bus: SIGTERM, a deadline, SIGKILL. Dropping the topology kills
//! what is left (each `Process` does on drop), so a scenario that fails leaves nothing.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use crate::process::find_word_after;
use crate::{Cut, Pki, Process};
use anyhow::{Context as _, anyhow, bail};
use nix::sys::signal::Signal;
use tokio::time::Instant;

mod cluster;

/// How long a child has to log its readiness line. Generous: debug builds on a loaded
/// two-core CI machine start slowly, and a healthy child reports far sooner.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stage of [`Topology::shutdown`] waits after SIGTERM before SIGKILL: above
/// the gate's default shutdown grace (5 s), so in-flight requests can still be answered.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(8);

/// The environment variable naming the `shaddock` binary to launch.
pub const SHADDOCK_BIN_ENV: &str = "SHADDOCK_BIN";

/// The flags that put every listener of `shaddock up` on a port the kernel picks (its
/// addresses are then read from its log).
pub const UP_FREE_PORTS: [&str; 4] = [
    "--broker-port=0",
    "--monitor-port=0",
    "--gate-port=0",
    "--metrics-port=0",
];

/// Where the topology's bus comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerSpec {
    /// Start `shaddock broker` (the embedded broker) as a process.
    Embedded,
    /// Use NATS servers that already run; start no broker.
    Urls(Vec<String>),
    /// Start a real `nats-server` (found on `PATH` or in `$(go env GOPATH)/bin`).
    NatsServer,
    /// Start a cluster of this many `nats-server` nodes, routed to each other
    /// (`cluster.rs`); gates and workers get every node's URL.
    NatsCluster(usize),
}

/// What to start. [`Default`] is one gate and one echo worker on the embedded broker.
#[derive(Debug, Clone)]
pub struct TopologySpec {
    pub broker: BrokerSpec,
    /// Gate processes.
    pub gates: usize,
    /// Worker processes per service, e.g. `[("echo", 2), ("chat", 1)]`.
    pub workers: Vec<(String, usize)>,
    /// The `shaddock` binary; see [`default_shaddock_bin`].
    pub shaddock_bin: PathBuf,
    /// Extra flags for every gate (e.g. `--max-in-flight 1024`).
    pub gate_args: Vec<String>,
    /// Extra flags for every worker (e.g. `--queue-depth 4096`).
    pub worker_args: Vec<String>,
    /// Serve Prometheus metrics from gates and workers (`--metrics-listen
    /// 127.0.0.1:0`), and the broker's monitoring port. On by default: a deployment runs
    /// with metrics, so a load test should pay for them too.
    pub metrics: bool,
    /// Gates also serve `wss://` (`--tls-listen 127.0.0.1:0`) with a certificate a
    /// throwaway CA signed: see [`Topology::gate_tls_urls`] and [`Topology::tls_ca`].
    pub tls: bool,
    /// Run everything in one `shaddock up` process instead: the embedded broker, one gate
    /// (reaching the broker in process) and one echo and one chat worker; `broker`,
    /// `gates`, `workers` and `worker_args` are then not used.
    pub one_process: bool,
    /// The lame duck grace period of every nats-server node (from a config file:
    /// nats-server has no flag for it): how long a node in lame duck mode waits before
    /// it starts closing clients. Its default is 10 s; a fleet's is short, so a restart
    /// of a node does not wait for it.
    pub lame_duck_grace: Duration,
    /// Where each process's whole log (its stdout and stderr) is written as it comes, as
    /// `<role>-<pid>.log`, to read after the run (`loadtest --logs`): a run killed before
    /// it could stop its processes leaves their logs too. `None`: kept in memory only,
    /// its last lines in a failure's message.
    pub log_dir: Option<PathBuf>,
    /// Flags for the store of `up` and of every worker (docs/stores.md). Memory by
    /// default: fleets run side by side in tests, and two processes never share the
    /// default data directory (the second would be refused).
    pub store_args: Vec<String>,
    /// Run nats-server nodes with JetStream on (`--jetstream`, a store directory per
    /// node, removed with it: a node started again starts empty, as a replaced machine
    /// would), for workers with `--store nats-kv`.
    pub jetstream: bool,
}

impl Default for TopologySpec {
    fn default() -> Self {
        TopologySpec {
            broker: BrokerSpec::Embedded,
            gates: 1,
            workers: vec![("echo".to_owned(), 1)],
            shaddock_bin: default_shaddock_bin(),
            gate_args: Vec::new(),
            worker_args: Vec::new(),
            metrics: true,
            one_process: false,
            tls: false,
            lame_duck_grace: Duration::from_secs(1),
            log_dir: None,
            store_args: vec!["--store=memory".to_owned()],
            jetstream: false,
        }
    }
}

/// The `shaddock` binary to launch when the spec names none, first match wins:
/// `$SHADDOCK_BIN`; the running executable when it is `shaddock` itself; `shaddock` next
/// to the running executable or one folder up (test binaries live in
/// `target/<profile>/deps`); else `target/release/shaddock` under the current directory.
pub fn default_shaddock_bin() -> PathBuf {
    if let Some(path) = std::env::var_os(SHADDOCK_BIN_ENV) {
        return PathBuf::from(path);
    }
    let name = format!("shaddock{}", std::env::consts::EXE_SUFFIX);
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name() == Some(OsStr::new(&name)) {
            return exe;
        }
        let beside = exe
            .ancestors()
            .skip(1)
            .take(2)
            .map(|dir| dir.join(&name))
            .find(|candidate| candidate.is_file());
        if let Some(path) = beside {
            return path;
        }
    }
    Path::new("target").join("release").join(name)
}

/// What one started process is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    Broker,
    /// The n-th node of a nats-server cluster ([`BrokerSpec::NatsCluster`]), from 0.
    Node(usize),
    /// The n-th gate, from 0.
    Gate(usize),
    /// `shaddock up`: broker, gate and workers in one process ([`TopologySpec::one_process`]).
    Up,
    /// The n-th worker of a service, from 0.
    Worker {
        service: String,
        index: usize,
    },
}

impl Role {
    /// Teardown order: the lower stops first.
    fn stage(&self) -> u8 {
        match self {
            Role::Gate(_) | Role::Up => 0,
            Role::Worker { .. } => 1,
            Role::Broker | Role::Node(_) => 2,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Broker => f.write_str("broker"),
            Role::Up => f.write_str("up"),
            Role::Node(n) => write!(f, "nats-{n}"),
            Role::Gate(n) => write!(f, "gate-{n}"),
            Role::Worker { service, index } => write!(f, "worker-{service}-{index}"),
        }
    }
}

/// One started child.
struct Proc {
    role: Role,
    process: Process,
    /// It has logged its readiness line (waiting again would wait for a second one).
    ready: bool,
    /// Where clients connect: the broker's NATS port, a gate's WebSocket port.
    listen: Option<SocketAddr>,
    /// A gate's TLS WebSocket port, when it serves one.
    tls_listen: Option<SocketAddr>,
    /// `http://ADDR/metrics` of a gate, a worker or the embedded broker.
    metrics: Option<String>,
    /// The broker's HTTP monitoring address.
    monitor: Option<SocketAddr>,
    /// A cluster node's route address.
    route: Option<SocketAddr>,
}

/// Log lines that carry an address, and where each goes.
const LISTEN_LINES: [&str; 2] = [
    "Listening for client connections on ",
    "Gate listening for WebSocket clients on ",
];
/// Not a prefix of either line above, nor they of it: the three never mix up.
const TLS_LISTEN_LINE: &str = "Gate listening for TLS WebSocket clients on ";
const METRICS_LINE: &str = "Serving Prometheus metrics on ";
const MONITOR_LINE: &str = "Starting http monitor on ";
/// A nats-server cluster node's route port; logged after `Server is ready`.
const ROUTE_LINE: &str = "Listening for route connections on ";

impl Proc {
    /// Starts `program` as `role`; with a `log_dir`, its log is written to
    /// `<log_dir>/<role>-<pid>.log` as it comes ([`TopologySpec::log_dir`]).
    fn spawn(
        role: Role,
        program: &Path,
        args: &[String],
        log_dir: Option<&Path>,
    ) -> anyhow::Result<Proc> {
        let mut command = std::process::Command::new(program);
        // Readiness lines are at info.
        command.args(args).env("RUST_LOG", "info");
        let process = Process::try_spawn(&role.to_string(), command)
            .with_context(|| format!("starting {role}: {}", program.display()))?;
        tracing::debug!(%role, pid = process.pid(), "started {}", program.display());
        if let Some(dir) = log_dir {
            let path = dir.join(format!("{role}-{}.log", process.pid()));
            if let Err(error) = process.tee_to(&path) {
                tracing::warn!(path = %path.display(), %error, "cannot keep a process's log");
            }
        }
        Ok(Proc {
            role,
            process,
            ready: false,
            listen: None,
            tls_listen: None,
            metrics: None,
            monitor: None,
            route: None,
        })
    }

    /// Waits for the child's line that holds `what` (once: a ready child is not waited
    /// for again), then notes the addresses it has logged.
    async fn wait_line(&mut self, what: &str, deadline: Instant) -> anyhow::Result<()> {
        if self.ready {
            return Ok(());
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        self.process
            .wait_line(what, wait)
            .await
            .map_err(|e| anyhow!(e))?;
        self.ready = true;
        // The last line that gives one (`up` logs its broker's client port, then its gate's).
        let log = self.process.log();
        let word = |phrases: &[&str]| {
            (log.lines().rev())
                .find_map(|line| phrases.iter().find_map(|p| find_word_after(line, p)))
        };
        let addr = |phrases: &[&str]| word(phrases).and_then(|w| w.parse::<SocketAddr>().ok());
        self.listen = addr(&LISTEN_LINES);
        self.tls_listen = addr(&[TLS_LISTEN_LINE]);
        self.monitor = addr(&[MONITOR_LINE]);
        self.route = addr(&[ROUTE_LINE]);
        self.metrics = word(&[METRICS_LINE]).map(str::to_owned);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} (pid {})", self.role, self.process.pid())
    }
}

/// A running topology. Stops every process it started on [`Topology::shutdown`] or drop.
pub struct Topology {
    procs: Vec<Proc>,
    nats: Vec<String>,
    /// What it was started with; a process started later (a worker added, a gate or a
    /// bus node replaced) is started the same way.
    spec: TopologySpec,
    /// The bus processes this topology runs, in node order, with the ports they took.
    bus: Vec<cluster::BusNode>,
    /// Gates started so far: the next gate's index.
    gates_started: usize,
    /// Workers started so far per service: the next worker's index.
    workers_started: HashMap<String, usize>,
    /// `--tls-listen` and the certificate flags every gate gets, when serving TLS.
    tls_args: Vec<String>,
    /// The gates' certificate files; a field, so they are removed only after `Drop` has
    /// stopped the gates that read them.
    certs: Option<Pki>,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("nats", &self.nats)
            .field("processes", &self.pids())
            .field("gates", &self.gate_urls())
            .finish()
    }
}

impl Topology {
    /// Starts the broker, then the gates and workers (concurrently), and returns once
    /// every one has logged that it is ready. On any failure, what was started is
    /// stopped again before the error returns.
    pub async fn start(spec: TopologySpec) -> anyhow::Result<Topology> {
        let mut topology = Topology {
            procs: Vec::new(),
            nats: Vec::new(),
            spec,
            bus: Vec::new(),
            gates_started: 0,
            workers_started: HashMap::new(),
            tls_args: Vec::new(),
            certs: None,
        };
        match topology.start_all().await {
            Ok(()) => Ok(topology),
            Err(e) => {
                // Async teardown here, so a failed start does not block in Drop.
                let _ = topology.shutdown().await;
                Err(e)
            }
        }
    }

    async fn start_all(&mut self) -> anyhow::Result<()> {
        let spec = self.spec.clone();
        let needs_shaddock = spec.gates > 0
            || spec.workers.iter().any(|(_, n)| *n > 0)
            || spec.broker == BrokerSpec::Embedded;
        let bin = &spec.shaddock_bin;
        if needs_shaddock && !bin.is_file() {
            bail!(
                "no shaddock binary at {}: build it (cargo build --release) or set {SHADDOCK_BIN_ENV}",
                bin.display()
            );
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        if spec.one_process {
            return self.start_up(deadline).await;
        }
        match &spec.broker {
            BrokerSpec::Urls(urls) => {
                if urls.is_empty() {
                    bail!("BrokerSpec::Urls needs at least one NATS URL");
                }
                self.nats = urls.clone();
            }
            _ => self.start_bus(deadline).await?,
        }
        if spec.tls && spec.gates > 0 {
            self.make_tls_args();
        }
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        for _ in 0..spec.gates {
            self.spawn_gate(any_port, self.nats_url())?;
        }
        for (service, count) in &spec.workers {
            for _ in 0..*count {
                self.spawn_worker(service, self.nats_url())?;
            }
        }
        self.wait_started(deadline).await
    }

    /// Makes the throwaway CA and the gates' `--tls-*` flags.
    fn make_tls_args(&mut self) {
        let server = &self.certs.insert(Pki::new()).server;
        let path = |p: &Path| p.display().to_string();
        self.tls_args = vec![
            "--tls-listen".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--tls-cert".to_owned(),
            path(&server.cert),
            "--tls-key".to_owned(),
            path(&server.key),
        ];
    }

    /// Starts `shaddock up` on free ports and waits until it is ready.
    async fn start_up(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let mut args: Vec<String> = ["up"]
            .into_iter()
            .chain(UP_FREE_PORTS)
            // Every load-test client connects from 127.0.0.1: one address, no per-IP cap.
            .chain(["--max-connections-per-ip=0"])
            .map(String::from)
            .collect();
        if self.spec.tls {
            self.make_tls_args();
            args.extend(self.tls_args.iter().cloned());
        }
        args.extend(self.spec.gate_args.iter().cloned());
        args.extend(self.spec.store_args.iter().cloned());
        self.spawn(Role::Up, &args)?;
        let up = self.procs.last_mut().context("up was just started")?;
        up.wait_line("Server is ready", deadline).await?;
        if self.gate_urls().is_empty() {
            bail!("shaddock up never logged its gate's WebSocket address");
        }
        Ok(())
    }

    /// `--metrics-listen 127.0.0.1:0` when the spec serves metrics.
    fn metrics_args(&self) -> Vec<String> {
        let args = ["--metrics-listen", "127.0.0.1:0"].map(String::from);
        args.into_iter().filter(|_| self.spec.metrics).collect()
    }

    /// Starts the next gate, listening on `listen` and connecting to `nats` (URLs,
    /// comma-separated); [`Topology::wait_started`] waits for it.
    fn spawn_gate(&mut self, listen: SocketAddr, nats: String) -> anyhow::Result<Role> {
        let listen = listen.to_string();
        // Every client of a launched fleet connects from 127.0.0.1: one address, no
        // per-IP cap.
        let mut args: Vec<String> = [
            "gate",
            "--listen",
            &listen,
            "--nats",
            &nats,
            "--max-connections-per-ip",
            "0",
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.metrics_args());
        args.extend(self.tls_args.iter().cloned());
        args.extend(self.spec.gate_args.iter().cloned());
        self.gates_started += 1;
        self.spawn(Role::Gate(self.gates_started - 1), &args)
    }

    /// Starts `shaddock` with `args` as `role`; it is then part of the topology.
    fn spawn(&mut self, role: Role, args: &[String]) -> anyhow::Result<Role> {
        let log_dir = self.spec.log_dir.as_deref();
        let proc = Proc::spawn(role.clone(), &self.spec.shaddock_bin, args, log_dir)?;
        self.procs.push(proc);
        Ok(role)
    }

    /// Starts the next worker of `service`, connecting to `nats` (URLs, comma-separated);
    /// [`Topology::wait_started`] waits for it.
    fn spawn_worker(&mut self, service: &str, nats: String) -> anyhow::Result<Role> {
        let mut args: Vec<String> = ["worker", "--service", service, "--nats", &nats]
            .map(String::from)
            .to_vec();
        args.extend(self.metrics_args());
        args.extend(self.spec.worker_args.iter().cloned());
        args.extend(self.spec.store_args.iter().cloned());
        let started = self.workers_started.entry(service.to_owned()).or_default();
        *started += 1;
        let index = *started - 1;
        let service = service.to_owned();
        self.spawn(Role::Worker { service, index }, &args)
    }

    /// Waits until every gate and worker started so far has logged that it is ready.
    async fn wait_started(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let tls = self.spec.tls;
        let starting = self.procs.iter_mut().filter(|p| p.role.stage() < 2);
        futures::future::try_join_all(starting.map(|p| async move {
            let ready = match p.role {
                Role::Gate(_) => "Gate is ready",
                _ => "Worker is ready",
            };
            p.wait_line(ready, deadline).await?;
            if matches!(p.role, Role::Gate(_)) && p.listen.is_none() {
                return Err(anyhow!(
                    "{} never logged its WebSocket address",
                    p.describe()
                ));
            }
            if matches!(p.role, Role::Gate(_)) && tls && p.tls_listen.is_none() {
                return Err(anyhow!(
                    "{} never logged its TLS WebSocket address",
                    p.describe()
                ));
            }
            Ok(())
        }))
        .await?;
        Ok(())
    }

    /// `ws://127.0.0.1:PORT` of each gate, in gate order.
    pub fn gate_urls(&self) -> Vec<String> {
        self.procs
            .iter()
            .filter(|p| matches!(p.role, Role::Gate(_) | Role::Up))
            .filter_map(|p| p.listen.map(|a| format!("ws://{a}")))
            .collect()
    }

    /// `wss://127.0.0.1:PORT` of each gate, in gate order; empty unless the spec asked
    /// for [`TopologySpec::tls`].
    pub fn gate_tls_urls(&self) -> Vec<String> {
        self.procs
            .iter()
            .filter(|p| matches!(p.role, Role::Gate(_)))
            .filter_map(|p| p.tls_listen.map(|a| format!("wss://{a}")))
            .collect()
    }

    /// The PEM file of the CA that signed the gates' certificate (with
    /// [`TopologySpec::tls`]): what a `wss://` client trusts.
    pub fn tls_ca(&self) -> Option<&Path> {
        self.certs.as_ref().map(|c| c.ca.as_path())
    }

    /// The NATS URLs gates and workers were given, comma-separated.
    pub fn nats_url(&self) -> String {
        self.nats.join(",")
    }

    /// The NATS URL of each bus node (or each URL the spec gave), in node order.
    pub fn nats_urls(&self) -> &[String] {
        &self.nats
    }

    /// Every process this topology started and still holds, with its role.
    pub fn pids(&self) -> Vec<(Role, u32)> {
        (self.procs.iter())
            .map(|p| (p.role.clone(), p.process.pid()))
            .collect()
    }

    /// The gates' pids, in gate order.
    pub fn gate_pids(&self) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|p| matches!(p.role, Role::Gate(_) | Role::Up))
            .map(|p| p.process.pid())
            .collect()
    }

    /// Prometheus endpoints (`http://127.0.0.1:PORT/metrics`): each gate's and worker's,
    /// and the embedded broker's. A real nats-server serves no Prometheus text (that is
    /// prometheus-nats-exporter's job), so it has none.
    pub fn metrics_urls(&self) -> Vec<(Role, String)> {
        self.procs
            .iter()
            .filter_map(|p| Some((p.role.clone(), p.metrics.clone()?)))
            .collect()
    }

    /// Fails when a started process has exited (crashed, or was killed from outside).
    pub fn check(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.process.try_status() {
                bail!(p.process.failure(&format!("exited ({status})")));
            }
        }
        Ok(())
    }

    /// Resolves when the first started process exits, with what it said last.
    async fn first_exit(&mut self) -> anyhow::Error {
        if self.procs.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.procs.iter_mut().map(|p| {
            Box::pin(async move {
                p.process.exited().await;
                let status = p.process.try_status();
                let status =
                    status.map_or_else(|| "closed its output".to_owned(), |s| s.to_string());
                anyhow!(p.process.failure(&format!("exited ({status})")))
            })
        });
        futures::future::select_all(waits).await.0
    }

    /// Runs `work` (a scenario) while the topology serves, then shuts everything down.
    /// Stops early, with an error, on SIGINT or SIGTERM ([`interrupted`]) or when a
    /// started process exits.
    pub async fn run<F: Future>(mut self, work: F) -> anyhow::Result<F::Output> {
        let stop = tokio::select! {
            output = work => Ok(output),
            stop = interrupted() => Err(stop),
            exited = self.first_exit() => Err(exited),
        };
        let stopped = self.shutdown().await;
        let output = stop?;
        stopped?;
        Ok(output)
    }

    /// Stops every started process: gates, then workers, then the broker; each stage
    /// gets SIGTERM, up to [`STOP_TIMEOUT`], then SIGKILL. Afterwards the
    /// topology holds nothing and dropping it does nothing. Fails (after stopping them
    /// all) when some process ignored SIGTERM and had to be killed.
    pub async fn shutdown(&mut self) -> anyhow::Result<()> {
        let mut procs = std::mem::take(&mut self.procs);
        let mut killed = Vec::new();
        for stage in 0..=2 {
            let group = procs.iter_mut().filter(|p| p.role.stage() == stage);
            let stops = group.map(|p| async move {
                let stopped = p.process.stop(Signal::SIGTERM, STOP_TIMEOUT).await;
                (p.describe(), stopped)
            });
            for (name, stopped) in futures::future::join_all(stops).await {
                match stopped {
                    Ok(status) if status.success() => {
                        tracing::debug!(process = %name, "stopped");
                    }
                    Ok(status) => tracing::warn!(process = %name, ?status, "exited uncleanly"),
                    Err(e) => killed.push(e),
                }
            }
        }
        procs.clear();
        if killed.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(killed.join("\n")))
        }
    }
}

/// `work`'s outcome, or an error if this process gets SIGINT or SIGTERM first
/// ([`interrupted`]): the caller then shuts its topology down, as after `work`.
pub async fn or_interrupted<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::select! {
        outcome = work => outcome,
        stop = interrupted() => Err(stop),
    }
}

/// Resolves when this process gets SIGINT (Ctrl-C) or SIGTERM (`timeout`, `kill`), with
/// the error a run stopped by it ends with: a caller then shuts its topology down, so
/// what it started stops (their logs, with a [`TopologySpec::log_dir`], are written as
/// they come).
async fn interrupted() -> anyhow::Error {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = || -> std::io::Result<_> {
        Ok((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    };
    let (mut interrupt, mut terminate) = match listen() {
        Ok(signals) => signals,
        Err(e) => return anyhow!(e).context("listening for signals"),
    };
    tokio::select! {
        _ = interrupt.recv() => anyhow!("interrupted (SIGINT)"),
        _ = terminate.recv() => anyhow!("terminated (SIGTERM)"),
    }
}

/// How [`Topology::stop_one`] ended.
#[derive(Debug, Clone)]
pub struct Stopped {
    pub role: Role,
    pub pid: u32,
    pub signal: Signal,
    /// From the signal to the exit.
    pub took: Duration,
    /// The exit status, when it could be read.
    pub status: Option<ExitStatus>,
    /// It outlived the stop timeout and was killed (SIGKILL) then.
    pub killed_after_timeout: bool,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (signal, role, pid, took) = (self.signal, &self.role, self.pid, self.took);
        write!(f, "{signal} {role} (pid {pid}): exited in {took:.2?} (")?;
        match self.status {
            Some(status) => write!(f, "{status}")?,
            None => f.write_str("status unknown")?,
        }
        if self.killed_after_timeout {
            f.write_str(", killed after the stop timeout")?;
        }
        f.write_str(")")
    }
}

impl Topology {
    /// A TCP hop ([`Cut`]) in front of each gate, and the URLs through them: clients
    /// that dial these lose their links all at once when the hops cut them.
    pub async fn gate_hops(&self) -> anyhow::Result<(Vec<Cut>, Vec<String>)> {
        let mut hops = Vec::new();
        for url in self.gate_urls() {
            let addr = url.trim_start_matches("ws://").parse()?;
            hops.push(Cut::start(addr).await.context("starting a TCP hop")?);
        }
        let urls = hops.iter().map(Cut::ws_url).collect();
        Ok((hops, urls))
    }

    /// Starts one more worker of `service` and waits until it is ready.
    pub async fn add_worker(&mut self, service: &str) -> anyhow::Result<Role> {
        self.add_worker_on(service, &self.nats.clone()).await
    }

    /// Starts one more worker of `service` given only the NATS URLs `nats` (a bus node
    /// of this topology, or any server) and waits until it is ready.
    pub async fn add_worker_on(&mut self, service: &str, nats: &[String]) -> anyhow::Result<Role> {
        let role = self.spawn_worker(service, nats.join(","))?;
        self.wait_started(Instant::now() + READY_TIMEOUT).await?;
        Ok(role)
    }

    /// Starts one more gate listening on `listen` (the port of a gate that was stopped,
    /// so its clients find it again) and waits until it is ready.
    pub async fn add_gate(&mut self, listen: SocketAddr) -> anyhow::Result<Role> {
        let role = self.spawn_gate(listen, self.nats_url())?;
        self.wait_started(Instant::now() + READY_TIMEOUT).await?;
        Ok(role)
    }

    /// Starts one more gate on a free port, given only the NATS URLs `nats`, and waits
    /// until it is ready; returns it with its `ws://` URL.
    pub async fn add_gate_on(&mut self, nats: &[String]) -> anyhow::Result<(Role, String)> {
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let role = self.spawn_gate(any_port, nats.join(","))?;
        self.wait_started(Instant::now() + READY_TIMEOUT).await?;
        let url = self.listen_addr(&role).map(|a| format!("ws://{a}"));
        Ok((role, url.context("a ready gate has a WebSocket address")?))
    }

    /// A running process, to signal, wait on or read: e.g. a bus node to put in lame
    /// duck mode (SIGUSR2), or a worker whose log a test reads.
    pub fn process(&mut self, role: &Role) -> Option<&mut Process> {
        let proc = self.procs.iter_mut().find(|p| &p.role == role)?;
        Some(&mut proc.process)
    }

    /// Takes a running process out of the topology (nor is it part of its teardown): the
    /// caller stops it, or drops it to kill it.
    pub fn take(&mut self, role: &Role) -> Option<Process> {
        let at = self.procs.iter().position(|p| &p.role == role)?;
        Some(self.procs.remove(at).process)
    }

    /// The running processes of a kind, in start order: e.g. every echo worker.
    pub fn running(&self, kind: impl Fn(&Role) -> bool) -> Vec<Role> {
        self.procs
            .iter()
            .filter(|p| kind(&p.role))
            .map(|p| p.role.clone())
            .collect()
    }

    /// Where a running gate listens for WebSocket clients (a bus node: for NATS clients).
    pub fn listen_addr(&self, role: &Role) -> Option<SocketAddr> {
        self.procs.iter().find(|p| &p.role == role)?.listen
    }

    /// The sum over each running gate of each of `counters` (Prometheus counters the
    /// gates serve, summed over their labels), by gate; a gate whose metrics cannot be
    /// read is left out.
    pub async fn gate_counters(&self, counters: &[&str]) -> HashMap<Role, Vec<f64>> {
        let mut sums = HashMap::new();
        for (role, url) in self.metrics_urls() {
            if !matches!(role, Role::Gate(_)) {
                continue;
            }
            if let Some(values) = scrape(&url, counters).await {
                sums.insert(role, values);
            }
        }
        sums
    }

    /// Sends `signal` to one running process and waits for it to exit, up to the spec's
    /// stop timeout, then kills it. The process is no longer part of the topology
    /// afterwards (nor of its teardown).
    pub async fn stop_one(&mut self, role: &Role, signal: Signal) -> anyhow::Result<Stopped> {
        let at = self
            .procs
            .iter()
            .position(|p| &p.role == role)
            .with_context(|| format!("{role} is not running"))?;
        let mut proc = self.procs.remove(at);
        let started = Instant::now();
        let stopped = proc.process.stop(signal, STOP_TIMEOUT).await;
        let took = started.elapsed();
        if let Err(why) = &stopped {
            tracing::warn!("{why}");
        }
        Ok(Stopped {
            role: proc.role.clone(),
            pid: proc.process.pid(),
            signal,
            took,
            status: stopped.as_ref().ok().copied(),
            killed_after_timeout: stopped.is_err(),
        })
    }
}

/// Each of `names` (Prometheus counters or gauges, summed over their labels) as served
/// at `url` (`http://host:port/path`); `None` when it cannot be read.
pub async fn scrape(url: &str, names: &[&str]) -> Option<Vec<f64>> {
    let (addr, path) = url.strip_prefix("http://")?.split_once('/')?;
    let text = cluster::http_get(addr.parse().ok()?, &format!("/{path}"))
        .await
        .ok()?;
    Some(names.iter().map(|n| counter_sum(&text, n)).collect())
}

/// The sum of counter `name`'s samples (every label set) in Prometheus text.
fn counter_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_their_labels() {
        let text = "# TYPE gate_requests_held_total counter\n\
                    gate_requests_held_total 3\n\
                    gate_requests_held_total_other 100\n\
                    gate_requests_resent_total{route=\"a\"} 2\n\
                    gate_requests_resent_total{route=\"b\"} 5\n";
        assert_eq!(counter_sum(text, "gate_requests_held_total"), 3.0);
        assert_eq!(counter_sum(text, "gate_requests_resent_total"), 7.0);
        assert_eq!(counter_sum(text, "absent"), 0.0);
    }

    #[test]
    fn addresses_are_read_from_log_lines() {
        let gate = "[1] 2026/01/01 00:00:00.000000 [INF] Gate listening for WebSocket clients \
                    on 127.0.0.1:34555 \u{1b}[3mgate\u{1b}[0m=\"g1\"";
        assert_eq!(
            find_word_after(gate, LISTEN_LINES[1]),
            Some("127.0.0.1:34555")
        );
        assert_eq!(find_word_after(gate, TLS_LISTEN_LINE), None);
        let tls = "[INF] Gate listening for TLS WebSocket clients on 127.0.0.1:34556 gate=\"g1\"";
        assert_eq!(
            find_word_after(tls, TLS_LISTEN_LINE),
            Some("127.0.0.1:34556")
        );
        assert!(
            LISTEN_LINES
                .iter()
                .all(|p| find_word_after(tls, p).is_none())
        );
        let metrics = "[1] [INF] Serving Prometheus metrics on http://127.0.0.1:4242/metrics";
        assert_eq!(
            find_word_after(metrics, METRICS_LINE),
            Some("http://127.0.0.1:4242/metrics")
        );
        assert_eq!(find_word_after("nothing here", METRICS_LINE), None);
    }

    #[test]
    fn roles_name_themselves_and_stop_gates_first() {
        let worker = Role::Worker {
            service: "echo".into(),
            index: 1,
        };
        assert_eq!(worker.to_string(), "worker-echo-1");
        assert!(Role::Gate(0).stage() < worker.stage());
        assert!(worker.stage() < Role::Broker.stage());
    }
}
