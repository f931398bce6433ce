//! `shaddock`: one binary, one subcommand per role.
//!
//! `up` runs every role in one process on the embedded broker; the other subcommands run
//! one role each. Each role's flags and logic live in its crate; this file only wires
//! them to subcommands. `call` and `routes` are tools for people at a terminal (and
//! scripts): a JSON client of a gate, and the routes a bus's services announce.

mod call;
mod roles;
mod routes;
mod telemetry;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;

use broker::cli::{BrokerArgs, BrokerSignals, ShutdownSignals, Trapped, init_logging};
use bus::BusOptions;
use clap::{Parser, Subcommand};
use gateway::GateConfig;
use services::chat::ChatConfig;
use services::store::StoreConfig;
use services::{BusSecurity, FrameConfig, WorkerConfig};
use tokio_util::sync::CancellationToken;
use tracing::info;

use roles::{GateArgs, ServiceName, TlsArgs, WorkerArgs};

/// jemalloc, not glibc's allocator: memory freed after a burst (a flood of slow clients,
/// a backlog) goes back to the OS within a couple of seconds, where glibc's arenas kept
/// tens of MB for good (docs/benchmarks.md, "Slow clients"). Not in the unit tests,
/// which count the system allocator's bytes. Its options (a background thread that
/// purges pages left free for a second) are built in: `.cargo/config.toml`.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Game-server RPC gateway on NATS pub/sub.
#[derive(Debug, Parser)]
#[command(name = "shaddock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything in one process: embedded broker, a gate, and the echo, chat, arena
    /// and profile workers (`--services` picks which).
    Up(Box<UpArgs>),
    /// Run the embedded NATS-protocol broker alone; flags follow nats-server's.
    Broker(Box<BrokerArgs>),
    /// Run one gate (WebSocket front) against any NATS servers.
    Gate(Box<GateArgs>),
    /// Run one worker of a service in its queue group.
    Worker(Box<WorkerArgs>),
    /// Send one request to a gate as a JSON client and print the answer (or a session
    /// of them: --listen, --repl).
    Call(Box<call::CallArgs>),
    /// List the routes, pushes and keyed services the workers on a bus announce.
    #[command(long_about = routes::ABOUT)]
    Routes(Box<routes::RoutesArgs>),
    /// Generate load and run benchmark scenarios.
    Loadtest {
        #[command(subcommand)]
        command: Box<loadtest::Command>,
    },
}

/// How long `up` waits, before it says it is ready, for its gate to learn its own
/// workers' message types (an announcement crosses the local broker in well under a
/// millisecond), and then for each keyed worker to hold its partitions (a lone one
/// takes them after two heartbeats: about a second).
const UP_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// Port of the embedded broker for NATS clients (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = broker::cli::DEFAULT_PORT)]
    #[arg(env = "SHADDOCK_UP_BROKER_PORT")]
    broker_port: u16,

    /// Port of the embedded broker's HTTP monitoring (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = broker::cli::DEFAULT_MONITOR_PORT)]
    #[arg(env = "SHADDOCK_UP_MONITOR_PORT")]
    monitor_port: u16,

    /// Port of the gate for WebSocket clients (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = gateway::config::DEFAULT_PORT)]
    #[arg(env = "SHADDOCK_UP_GATE_PORT")]
    gate_port: u16,

    /// Port of the gate's and workers' Prometheus metrics (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = roles::DEFAULT_METRICS_PORT)]
    #[arg(env = "SHADDOCK_UP_METRICS_PORT")]
    metrics_port: u16,

    /// The built-in services to run a worker of, comma-separated (default: all four).
    /// Leave one out to serve it with a worker of your own, in any language, connected
    /// to this process's broker (the NATS URL it prints). `--services` with no value
    /// runs none.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 0..)]
    #[arg(env = "SHADDOCK_UP_SERVICES", default_values_t = ServiceName::ALL)]
    services: Vec<ServiceName>,

    #[command(flatten)]
    tls: TlsArgs,

    #[command(flatten)]
    backlog: net::BacklogArg,

    #[command(flatten)]
    shards: gateway::ShardsArg,

    #[command(flatten)]
    gate: GateConfig,

    #[command(flatten)]
    frames: FrameConfig,

    #[command(flatten)]
    chat: ChatConfig,

    #[command(flatten)]
    store: StoreConfig,
}

#[tokio::main]
async fn main() -> ExitCode {
    let (args, deprecated) = renamed_flags(std::env::args_os().collect());
    let success = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
    let result = match Cli::parse_from(args).command {
        Command::Up(args) => success(up(*args, &deprecated).await),
        Command::Broker(args) => success(broker::cli::run(*args).await),
        Command::Gate(args) => success(gate(*args, &deprecated).await),
        Command::Worker(args) => success(worker(*args).await),
        Command::Call(args) => tool(call::run(*args)).await,
        Command::Routes(args) => tool(routes::run(*args)).await,
        Command::Loadtest { command } => success(run_loadtest(*command).await),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            // One line with the whole cause chain, e.g. "config file x: line 3: ...".
            eprintln!("shaddock: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The gate's old `--<name>-ms` flags (and `SHADDOCK_<NAME>_MS` variables) in the one
/// duration grammar, for the subcommands that run a gate; and a notice for each used.
fn renamed_flags(args: Vec<std::ffi::OsString>) -> (Vec<std::ffi::OsString>, Vec<String>) {
    let gate_flags = gateway::config::MS_FLAGS;
    let names: Vec<&str> = match args.get(1).and_then(|a| a.to_str()) {
        Some("up") => gate_flags.to_vec(),
        Some("gate") => [gate_flags, bus::MS_FLAGS].concat(),
        _ => return (args, Vec::new()),
    };
    let flags = net::duration::MsFlags {
        names: &names,
        env_prefix: "SHADDOCK_",
    };
    flags.rewrite(args, |var| std::env::var(var).ok())
}

/// Logs each deprecated flag used, once, now that logging is up.
fn warn_deprecated(notices: &[String]) {
    for notice in notices {
        tracing::warn!("{notice}");
    }
}

/// Runs a terminal tool (`call`, `routes`): its output is stdout's, so only warnings
/// and errors are logged (to stderr), unless `RUST_LOG` asks for more.
async fn tool(run: impl Future<Output = anyhow::Result<ExitCode>>) -> anyhow::Result<ExitCode> {
    let level = std::env::var_os("RUST_LOG")
        .is_none()
        .then_some(tracing::Level::WARN);
    init_logging(None, level)?;
    run.await
}

async fn run_loadtest(command: loadtest::Command) -> anyhow::Result<()> {
    init_logging(None, None)?;
    loadtest::run(command).await
}

async fn gate(args: GateArgs, deprecated: &[String]) -> anyhow::Result<()> {
    init_logging(None, None)?;
    warn_deprecated(deprecated);
    net::nofile::raise_and_log();
    let mut signals = ShutdownSignals::install()?;
    let shutdown = CancellationToken::new();
    let backlog = args.backlog.listen_backlog;
    if let Some(addr) = args.metrics_listen {
        telemetry::serve_metrics(addr, backlog, shutdown.clone()).await?;
    }
    let bus = roles::gate_bus(&args.nats, &args.security, args.bus_timings)?;
    let threads = roles::GateThreads {
        shards: args.shards.shards,
        host: None,
    };
    let started = roles::start_gate(
        args.listen,
        bus,
        args.gate,
        threads,
        &args.tls,
        backlog,
        shutdown.clone(),
    )
    .await?;
    if let Some(tls) = started.tls {
        roles::reload_tls_on_sighup(tls, shutdown.clone())?;
    }
    info!("Gate is ready");
    signals.wait(&shutdown).await;
    shutdown.cancel();
    roles::join(started.task, roles::STOP_GRACE).await
}

async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    init_logging(None, None)?;
    net::nofile::raise_and_log();
    let mut signals = ShutdownSignals::install()?;
    let shutdown = CancellationToken::new();
    if let Some(addr) = args.metrics_listen {
        telemetry::serve_metrics(addr, args.backlog.listen_backlog, shutdown.clone()).await?;
    }
    let worker = roles::start_worker(
        args.service,
        args.config,
        args.chat,
        &args.store,
        None,
        &shutdown,
    )
    .await?;
    info!("Worker is ready");
    signals.wait(&shutdown).await;
    shutdown.cancel();
    roles::join(worker.task, worker.stop_within).await
}

/// Starts every role against the embedded broker, all sharing one shutdown token, and
/// stops them together on SIGINT/SIGTERM. Gate and workers stop first, so in-flight
/// requests are answered while the broker still runs.
async fn up(args: UpArgs, deprecated: &[String]) -> anyhow::Result<()> {
    let broker_args = BrokerArgs {
        port: Some(args.broker_port.into()),
        http_port: Some(args.monitor_port.into()),
        backlog: args.backlog,
        ..BrokerArgs::default()
    };
    let settings = broker_args.resolve()?;
    init_logging(None, settings.log_level)?;
    warn_deprecated(deprecated);
    let mut signals = BrokerSignals::install()?;
    let broker_shutdown = CancellationToken::new();
    let shutdown = CancellationToken::new();
    // Starting the broker raises and logs the open-file limit, for every role here.
    let broker = broker::cli::Broker::start(&settings, broker_shutdown.clone()).await?;
    let nats = vec![format!("nats://127.0.0.1:{}", broker.client_addr().port())];
    let any = Ipv4Addr::UNSPECIFIED;
    let backlog = args.backlog.listen_backlog;
    let metrics_addr = SocketAddr::from((any, args.metrics_port));
    let metrics_addr = telemetry::serve_metrics(metrics_addr, backlog, shutdown.clone()).await?;
    // The embedded broker is local and open: nothing to authenticate or encrypt.
    let worker_config = WorkerConfig {
        nats: nats.clone(),
        prefix: args.gate.prefix.clone(),
        security: BusSecurity::default(),
        frames: args.frames,
        // One broker: nowhere to move to.
        ..WorkerConfig::default()
    };
    // Every role here reaches the broker in process, by calls: no loopback TCP, no
    // protocol text, no task woken between them. Workers elsewhere join the same queue
    // groups over TCP.
    let attach = broker.server().attacher();
    let chat_config = args.chat;
    let store = args.store;
    // One thread for the workers and the gate's first shard: a request is read,
    // forwarded, handled, answered and written there (docs/workers.md, "In Rust: threads").
    let host = services::Host::spawn("up", worker_config.frames.handler_stall)?;
    let start = |service| {
        let config = worker_config.clone();
        roles::start_worker(
            service,
            config,
            chat_config,
            &store,
            Some((&attach, &host)),
            &shutdown,
        )
    };
    let mut workers = Vec::new();
    for service in ServiceName::ALL {
        if args.services.contains(&service) {
            workers.push((service, start(service).await?));
        }
    }
    let web = !args.gate.no_web;
    let gate_bus = BusOptions {
        name: roles::GATE_CONNECTION_NAME.into(),
        ..BusOptions::direct(attach)
    };
    let threads = roles::GateThreads {
        shards: args.shards.shards,
        host: Some(host.runtime().clone()),
    };
    let gate = roles::start_gate(
        SocketAddr::from((any, args.gate_port)),
        gate_bus,
        args.gate,
        threads,
        &args.tls,
        backlog,
        shutdown.clone(),
    )
    .await?;
    if let Some(tls) = gate.tls.clone() {
        roles::reload_tls_on_sighup(tls, shutdown.clone())?;
    }
    // Ready means every client can use every route: the gate has the local workers'
    // message types (JSON bodies, the pomelo dictionary) before the first client comes.
    let local: Vec<&str> = workers.iter().map(|(service, _)| service.name()).collect();
    if !gate.wait_for_schemas(&local, UP_READY_WAIT).await {
        tracing::warn!(
            "the gate has not heard the workers' message types yet; JSON and pomelo clients may miss them for a moment"
        );
    }
    // And the keyed services' lone workers hold every partition: a client's request
    // would wait for them, but a call between services is not sent again (chat.login's
    // call to the profile service would get 503 meanwhile).
    for (service, worker) in &workers {
        let Some(mut held) = worker.held.clone() else {
            continue;
        };
        let partitions = service.partitions();
        let all = tokio::time::timeout(UP_READY_WAIT, held.at_least(partitions as usize));
        if !matches!(all.await, Ok(true)) {
            tracing::warn!(
                held = held.count(),
                partitions,
                service = service.name(),
                "a keyed worker does not hold its partitions yet: calls to it may get 503 for a moment"
            );
        }
    }
    info!("Server is ready");
    log_where(&Where {
        gate: gate.addr,
        tls_gate: gate.tls_addr,
        web,
        nats: broker.client_addr(),
        monitor: broker.monitor_addr(),
        metrics: metrics_addr,
    });
    tokio::select! {
        trapped = signals.next() => {
            info!("Trapped \"{}\" signal", trapped.name());
            // Lame duck would move clients to another server, and this process is the
            // only one: SIGUSR2 (`--signal ldm`) stops it gracefully, as SIGTERM does.
            if trapped == Trapped::LameDuck {
                info!("lame duck asked for: no other server to move to here; stopping gracefully");
            }
        }
        () = shutdown.cancelled() => {}
        () = broker_shutdown.cancelled() => {}
    }
    info!("Initiating Shutdown...");
    shutdown.cancel();
    let mut result = roles::join(gate.task, roles::STOP_GRACE).await;
    for (_, worker) in workers {
        result = result.and(roles::join(worker.task, worker.stop_within).await);
    }
    // Its thread ends now that the gate and the workers on it have.
    drop(host);
    broker_shutdown.cancel();
    broker.stop().await?;
    result
}

/// Where the parts of `shaddock up` listen, as bound.
struct Where {
    gate: SocketAddr,
    tls_gate: Option<SocketAddr>,
    web: bool,
    nats: SocketAddr,
    monitor: Option<SocketAddr>,
    metrics: SocketAddr,
}

/// Logs the URLs to reach `up` by, once it is ready: from this machine, so a wildcard
/// address becomes loopback.
fn log_where(at: &Where) {
    let gate = reachable(at.gate);
    let nats = reachable(at.nats);
    info!("WebSocket clients:  ws://{gate}");
    if let Some(tls) = at.tls_gate {
        info!("TLS clients:        wss://{}", reachable(tls));
    }
    if at.web {
        info!("Demo page:          http://{gate}/");
    }
    info!("NATS:               nats://{nats}");
    if let Some(monitor) = at.monitor {
        info!("NATS monitoring:    http://{}/", reachable(monitor));
    }
    info!(
        "Metrics:            http://{}/metrics",
        reachable(at.metrics)
    );
    info!("Try: shaddock call ws://{gate} echo.echo '{{\"body\":\"aGk=\"}}'");
    info!("     shaddock routes --nats nats://{nats}");
}

/// `addr` as a client on this machine dials it: a wildcard address is loopback.
fn reachable(mut addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(Ipv4Addr::LOCALHOST.into()),
        IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(Ipv6Addr::LOCALHOST.into()),
        _ => {}
    }
    addr
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn every_listening_role_takes_a_listen_backlog_and_refuses_0() {
        use clap::Parser as _;
        for role in ["up", "broker", "gate", "worker"] {
            let worker_service = ["--service", "echo"];
            let extra: &[&str] = if role == "worker" {
                &worker_service
            } else {
                &[]
            };
            let parse = |backlog: &str| {
                let argv = ["shaddock", role, "--listen-backlog", backlog];
                super::Cli::try_parse_from(argv.iter().chain(extra))
            };
            assert!(parse("2048").is_ok(), "{role}: {:?}", parse("2048").err());
            let zero = parse("0").expect_err(role).to_string();
            assert!(zero.contains("at least 1"), "{role}: {zero}");
        }
    }
}
