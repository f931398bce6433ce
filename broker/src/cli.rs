//! The broker's command line, shared by the `broker` binary and `shaddock broker`.
//!
//! The flags are nats-server's (`-a -p -m --user --pass --auth -c -l -P
//! --ports_file_dir -D -V ...`) and so is the startup log, because client test suites
//! and harnesses start "a nats-server" by name, read its port from the log and wait for
//! `Server is ready`: with the same flags and lines they can start this broker instead.
//! A nats-server-style config file (`-c`, see [`crate::conf_file`]) supplies settings
//! too; command-line flags (and their `SHADDOCK_BROKER_*` environment fallbacks)
//! override it. SIGUSR2 (or `--signal ldm=PID` from another invocation) puts the broker in
//! lame duck mode ([`Server::lame_duck`]), after which it exits 0.
//!
//! [`run`] is the whole binary. The pieces it is made of ([`Broker`],
//! [`ShutdownSignals`], [`init_logging`]) are public so that `shaddock up` can run the
//! broker next to the other roles in one process.

mod logging;
mod send_signal;
mod signals;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::ArgAction;
use net::duration::parse_nats;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Level, error, info, warn};

use crate::conf_file::{self, FileConfig, TlsBlock, parse_port, parse_server_name, parse_size};
use crate::config::DEFAULT_TLS_TIMEOUT;
use crate::{Auth, Config, Server, Tls, monitor};

pub use logging::init_logging;
pub use signals::{BrokerSignals, ShutdownSignals, Trapped};

/// Address clients connect to unless told otherwise (all interfaces, like nats-server).
pub const DEFAULT_HOST: &str = "0.0.0.0";
/// The NATS client port.
pub const DEFAULT_PORT: u16 = 4222;
/// The NATS monitoring port, used by `shaddock up`; `broker` monitors only when asked.
pub const DEFAULT_MONITOR_PORT: u16 = 8222;
/// How long shutdown waits for connections to drain before the tasks are dropped, so a
/// stuck peer cannot keep the process alive after SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// nats-server's command-line flags. Unset options fall back to the config file, then
/// to the defaults in [`crate::config`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BrokerArgs {
    /// Host address to bind for clients (default: 0.0.0.0).
    #[arg(short = 'a', long = "addr", visible_alias = "net", value_name = "HOST")]
    #[arg(env = "SHADDOCK_BROKER_ADDR")]
    pub addr: Option<String>,

    /// Port for clients (default: 4222); -1 or 0 picks a free port, which is logged and
    /// written to the ports file.
    #[arg(short = 'p', long, value_name = "PORT", allow_negative_numbers = true)]
    #[arg(value_parser = parse_port, env = "SHADDOCK_BROKER_PORT")]
    pub port: Option<i32>,

    /// Port for HTTP monitoring (/varz /connz /subsz /healthz /metrics); -1 picks a free
    /// port. Monitoring is off unless this or the config file sets it.
    #[arg(
        short = 'm',
        long = "http_port",
        value_name = "PORT",
        allow_negative_numbers = true
    )]
    #[arg(value_parser = parse_port, env = "SHADDOCK_BROKER_HTTP_PORT")]
    pub http_port: Option<i32>,

    /// User required for connections (with --pass).
    #[arg(long, value_name = "USER", env = "SHADDOCK_BROKER_USER")]
    pub user: Option<String>,

    /// Password required for connections (with --user).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "SHADDOCK_BROKER_PASS",
        hide_env_values = true
    )]
    pub pass: Option<String>,

    /// Authorization token required for connections.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "SHADDOCK_BROKER_TOKEN",
        hide_env_values = true
    )]
    pub auth: Option<String>,

    /// Server name reported to clients in INFO (default: the server id).
    #[arg(short = 'n', long, visible_alias = "server_name", value_name = "NAME")]
    #[arg(value_parser = parse_server_name, env = "SHADDOCK_BROKER_NAME")]
    pub name: Option<String>,

    /// nats-server style configuration file; flags given here override its settings.
    #[arg(short = 'c', long, value_name = "FILE", env = "SHADDOCK_BROKER_CONFIG")]
    pub config: Option<PathBuf>,

    /// Write the log to this file (appending) instead of stderr.
    #[arg(short = 'l', long, visible_alias = "log_file", value_name = "FILE")]
    #[arg(env = "SHADDOCK_BROKER_LOG")]
    pub log: Option<PathBuf>,

    /// Write the process id to this file; it is removed on exit.
    #[arg(short = 'P', long, visible_alias = "pid_file", value_name = "FILE")]
    #[arg(env = "SHADDOCK_BROKER_PID_FILE")]
    pub pid: Option<PathBuf>,

    /// Write `<exe>_<pid>.ports` here: JSON with the client and monitoring URLs, for
    /// harnesses that start the broker on random ports. Removed on exit.
    #[arg(
        long = "ports_file_dir",
        value_name = "DIR",
        env = "SHADDOCK_BROKER_PORTS_FILE_DIR"
    )]
    pub ports_file_dir: Option<PathBuf>,

    /// Enable debug logging (`-DV` is debug and trace).
    #[arg(short = 'D', long)]
    pub debug: bool,

    /// Enable trace logging (`-VV` is accepted and means the same).
    #[arg(short = 'V', long, action = ArgAction::Count)]
    pub trace: u8,

    /// Largest message payload a client may publish, e.g. 1048576 or 1MB (default: 1MB).
    #[arg(long = "max_payload", value_name = "SIZE", value_parser = parse_size)]
    #[arg(env = "SHADDOCK_BROKER_MAX_PAYLOAD")]
    pub max_payload: Option<usize>,

    /// Most client connections at once (default: 65536).
    #[arg(
        long = "max_connections",
        value_name = "N",
        env = "SHADDOCK_BROKER_MAX_CONNECTIONS"
    )]
    pub max_connections: Option<usize>,

    /// Longest protocol control line accepted, e.g. 4096 or 4KB (default: 4KB).
    #[arg(long = "max_control_line", value_name = "SIZE", value_parser = parse_size)]
    #[arg(env = "SHADDOCK_BROKER_MAX_CONTROL_LINE")]
    pub max_control_line: Option<usize>,

    /// Outbound bytes queued for one client before it is cut off as a slow consumer
    /// (default: 64MB).
    #[arg(long = "max_pending", value_name = "SIZE", value_parser = parse_size)]
    #[arg(env = "SHADDOCK_BROKER_MAX_PENDING")]
    pub max_pending: Option<usize>,

    /// Outbound bytes queued for one client past which its publishers pause until it
    /// drains (flow control; default: 128KB, at most half of max_pending).
    #[arg(long = "flow_control_pending", value_name = "SIZE", value_parser = parse_size)]
    #[arg(env = "SHADDOCK_BROKER_FLOW_CONTROL_PENDING")]
    pub flow_control_pending: Option<usize>,

    /// How long publishers wait for a backlogged client that makes no progress before
    /// they go on without it (default: 250ms).
    #[arg(long = "stall_window", value_name = "DURATION", value_parser = parse_nats)]
    #[arg(env = "SHADDOCK_BROKER_STALL_WINDOW")]
    pub stall_window: Option<Duration>,

    /// Subscriptions one client may hold; 0 is unlimited (default: 0).
    #[arg(long = "max_subscriptions", value_name = "N")]
    #[arg(env = "SHADDOCK_BROKER_MAX_SUBSCRIPTIONS")]
    pub max_subscriptions: Option<usize>,

    /// How often idle clients are PINGed: seconds, or a duration like 2m (default: 2m).
    #[arg(long = "ping_interval", value_name = "DURATION", value_parser = parse_nats)]
    #[arg(env = "SHADDOCK_BROKER_PING_INTERVAL")]
    pub ping_interval: Option<Duration>,

    /// Unanswered PINGs after which a client is closed as stale (default: 2).
    #[arg(long = "ping_max", value_name = "N", env = "SHADDOCK_BROKER_PING_MAX")]
    pub ping_max: Option<u32>,

    /// How long a write to a client may block before it counts as a slow consumer:
    /// seconds, or a duration like 10s (default: 10s).
    #[arg(long = "write_deadline", value_name = "DURATION", value_parser = parse_nats)]
    #[arg(env = "SHADDOCK_BROKER_WRITE_DEADLINE")]
    pub write_deadline: Option<Duration>,

    /// How long a client has to authenticate when auth is on: seconds, or a duration
    /// like 500ms (default: 2s).
    #[arg(long = "auth_timeout", value_name = "DURATION", value_parser = parse_nats)]
    #[arg(env = "SHADDOCK_BROKER_AUTH_TIMEOUT")]
    pub auth_timeout: Option<Duration>,

    /// Serve TLS, without verifying clients: INFO says `tls_required` and clients upgrade
    /// before CONNECT (needs --tlscert and --tlskey).
    #[arg(long, env = "SHADDOCK_BROKER_TLS")]
    pub tls: bool,

    /// Server certificate chain (PEM), naming the hosts or IPs clients dial.
    #[arg(long, value_name = "FILE", env = "SHADDOCK_BROKER_TLSCERT")]
    pub tlscert: Option<PathBuf>,

    /// Private key of the server certificate (PEM).
    #[arg(long, value_name = "FILE", env = "SHADDOCK_BROKER_TLSKEY")]
    pub tlskey: Option<PathBuf>,

    /// CA certificate (PEM) that client certificates must be signed by (with --tlsverify).
    #[arg(long, value_name = "FILE", env = "SHADDOCK_BROKER_TLSCACERT")]
    pub tlscacert: Option<PathBuf>,

    /// Serve TLS and require every client to present a certificate signed by
    /// --tlscacert.
    #[arg(long, env = "SHADDOCK_BROKER_TLSVERIFY")]
    pub tlsverify: bool,

    /// How long a client has to complete its TLS handshake after INFO: seconds, or a
    /// duration like 500ms (default: 2s).
    #[arg(long = "tls_timeout", value_name = "DURATION", value_parser = parse_nats)]
    #[arg(env = "SHADDOCK_BROKER_TLS_TIMEOUT")]
    pub tls_timeout: Option<Duration>,

    /// How long lame duck mode (SIGUSR2, or --signal ldm=PID) lasts, from telling clients
    /// to closing the last of them; 0 closes them all after the grace period (default: 2m).
    #[arg(
        long = "lame-duck-duration",
        visible_alias = "lame_duck_duration",
        value_name = "DURATION",
        value_parser = parse_nats
    )]
    #[arg(env = "SHADDOCK_BROKER_LAME_DUCK_DURATION")]
    pub lame_duck_duration: Option<Duration>,

    /// How long lame duck mode waits after telling clients before it closes the first;
    /// shorter than the duration unless that is 0 (default: 10s).
    #[arg(
        long = "lame-duck-grace-period",
        visible_alias = "lame_duck_grace_period",
        value_name = "DURATION",
        value_parser = parse_nats
    )]
    #[arg(env = "SHADDOCK_BROKER_LAME_DUCK_GRACE_PERIOD")]
    pub lame_duck_grace_period: Option<Duration>,

    /// Send a signal to a running broker (or nats-server) and exit: ldm (lame duck
    /// mode), quit (stop), term (stop, unless in lame duck mode) or stop (kill), each
    /// `=PID` or `=PIDFILE`.
    #[arg(long, visible_alias = "sl", value_name = "SIGNAL=PID")]
    pub signal: Option<String>,

    #[command(flatten)]
    pub backlog: net::BacklogArg,
}

/// What the flags and the config file add up to: where to listen, what to write, and
/// the [`Config`] the server enforces.
#[derive(Debug, Clone)]
pub struct Settings {
    pub host: String,
    /// 0 means a free port chosen by the OS.
    pub port: u16,
    /// Monitoring host and port, if monitoring is on.
    pub monitor: Option<(String, u16)>,
    pub log_file: Option<PathBuf>,
    pub pid_file: Option<PathBuf>,
    pub ports_file_dir: Option<PathBuf>,
    /// Set by -D/-V (or `debug`/`trace` in the file); otherwise `RUST_LOG` or info.
    pub log_level: Option<Level>,
    /// The backlog of the client and monitoring listeners.
    pub listen_backlog: net::Backlog,
    pub config: Config,
}

impl BrokerArgs {
    /// Reads the config file, if any, and merges the flags over it.
    pub fn resolve(&self) -> anyhow::Result<Settings> {
        let file = match &self.config {
            None => FileConfig::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                conf_file::parse(&text)
                    .with_context(|| format!("in config file {}", path.display()))?
            }
        };
        self.merge(file)
    }

    fn merge(&self, file: FileConfig) -> anyhow::Result<Settings> {
        let defaults = Config::default();
        let host = self
            .addr
            .clone()
            .or(file.host)
            .unwrap_or_else(|| DEFAULT_HOST.to_owned());
        let port = self.port.or(file.port).map_or(DEFAULT_PORT, bind_port);
        let monitor = self.http_port.or(file.http_port).map(|http_port| {
            // Like nats-server, monitoring listens where clients do unless told otherwise.
            let http_host = file.http_host.clone().unwrap_or_else(|| host.clone());
            (http_host, bind_port(http_port))
        });
        let config = Config {
            server_name: self.name.clone().or(file.server_name),
            max_payload: self
                .max_payload
                .or(file.max_payload)
                .unwrap_or(defaults.max_payload),
            max_control_line: (self.max_control_line.or(file.max_control_line))
                .unwrap_or(defaults.max_control_line),
            max_pending: self
                .max_pending
                .or(file.max_pending)
                .unwrap_or(defaults.max_pending),
            flow_control_pending: self
                .flow_control_pending
                .or(file.flow_control_pending)
                .unwrap_or(defaults.flow_control_pending),
            stall_window: (self.stall_window.or(file.stall_window))
                .unwrap_or(defaults.stall_window),
            max_connections: (self.max_connections.or(file.max_connections))
                .unwrap_or(defaults.max_connections),
            max_subscriptions: (self.max_subscriptions.or(file.max_subscriptions))
                .unwrap_or(defaults.max_subscriptions),
            ping_interval: (self.ping_interval.or(file.ping_interval))
                .unwrap_or(defaults.ping_interval),
            max_pings_out: self
                .ping_max
                .or(file.ping_max)
                .unwrap_or(defaults.max_pings_out),
            write_deadline: (self.write_deadline.or(file.write_deadline))
                .unwrap_or(defaults.write_deadline),
            auth: self.auth_over(&file.authorization)?,
            auth_timeout: (self.auth_timeout.or(file.authorization.timeout))
                .unwrap_or(defaults.auth_timeout),
            tls: self.tls_over(file.tls)?,
            lame_duck_duration: (self.lame_duck_duration.or(file.lame_duck_duration))
                .unwrap_or(defaults.lame_duck_duration),
            lame_duck_grace_period: (self.lame_duck_grace_period)
                .or(file.lame_duck_grace_period)
                .unwrap_or(defaults.lame_duck_grace_period),
            in_process_buffer: defaults.in_process_buffer,
        };
        validate(&config)?;
        let trace = self.trace > 0 || file.trace.unwrap_or(false);
        let debug = self.debug || file.debug.unwrap_or(false);
        let log_level = match (trace, debug) {
            (true, _) => Some(Level::TRACE),
            (false, true) => Some(Level::DEBUG),
            (false, false) => None,
        };
        Ok(Settings {
            host,
            port,
            monitor,
            log_file: self.log.clone().or(file.log_file),
            pid_file: self.pid.clone().or(file.pid_file),
            ports_file_dir: self.ports_file_dir.clone().or(file.ports_file_dir),
            log_level,
            listen_backlog: self.backlog.listen_backlog,
            config,
        })
    }

    /// Credentials from the flags replace the file's as a whole: mixing a user from one
    /// with a token from the other would make a combination nobody wrote.
    fn auth_over(&self, file: &conf_file::Authorization) -> anyhow::Result<Auth> {
        let from_flags = self.user.is_some() || self.pass.is_some() || self.auth.is_some();
        let (user, pass, token) = if from_flags {
            (&self.user, &self.pass, &self.auth)
        } else {
            (&file.user, &file.password, &file.token)
        };
        // An empty value counts as unset, as in nats-server (e.g. an empty env variable).
        let set = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
        match (set(user), set(pass), set(token)) {
            (None, None, None) => Ok(Auth::None),
            (None, None, Some(token)) => Ok(Auth::Token(token)),
            (Some(user), Some(pass), None) => Ok(Auth::UserPass { user, pass }),
            (Some(_), Some(_), Some(_)) => bail!("use either a token or a user and password"),
            (Some(_), None, _) => bail!("a user needs a password (--pass)"),
            (None, Some(_), _) => bail!("a password needs a user (--user)"),
        }
    }

    /// TLS is on when a flag asks for it or the file has a `tls` block; each setting
    /// comes from its flag, else from the block. As in nats-server, a CA without
    /// `verify` is accepted and not used.
    fn tls_over(&self, file: Option<TlsBlock>) -> anyhow::Result<Option<Tls>> {
        let on = self.tls || self.tlsverify || file.is_some();
        let file = file.unwrap_or_default();
        if !on {
            let files = [&self.tlscert, &self.tlskey, &self.tlscacert];
            if files.iter().any(|f| f.is_some()) || self.tls_timeout.is_some() {
                bail!("TLS settings were given without --tls (or --tlsverify)");
            }
            return Ok(None);
        }
        let cert = (self.tlscert.clone().or(file.cert_file))
            .context("TLS needs a server certificate (--tlscert or tls.cert_file)")?;
        let key = (self.tlskey.clone().or(file.key_file))
            .context("TLS needs the certificate's private key (--tlskey or tls.key_file)")?;
        let verify = self.tlsverify || file.verify.unwrap_or(false);
        let client_ca = match (verify, self.tlscacert.clone().or(file.ca_file)) {
            (false, _) => None,
            (true, Some(ca)) => Some(ca),
            (true, None) => bail!(
                "verifying client certificates needs the CA that signs them \
                 (--tlscacert or tls.ca_file)"
            ),
        };
        let timeout = (self.tls_timeout.or(file.timeout)).unwrap_or(DEFAULT_TLS_TIMEOUT);
        if timeout.is_zero() {
            bail!("tls_timeout must be longer than zero");
        }
        let tls = Tls::from_files(&cert, &key, client_ca.as_deref(), timeout)?;
        Ok(Some(tls))
    }
}

/// nats-server's `-1` ("random port") becomes 0, which the OS replaces with a free port.
fn bind_port(port: i32) -> u16 {
    u16::try_from(port).unwrap_or(0)
}

/// Rejects limits the server could not work with, before anything is bound.
fn validate(config: &Config) -> anyhow::Result<()> {
    let positive = [
        ("max_payload", config.max_payload),
        ("max_control_line", config.max_control_line),
        ("max_pending", config.max_pending),
        ("flow_control_pending", config.flow_control_pending),
        ("max_connections", config.max_connections),
    ];
    for (name, value) in positive {
        if value == 0 {
            bail!("{name} must be at least 1");
        }
    }
    let durations = [
        ("ping_interval", config.ping_interval),
        ("write_deadline", config.write_deadline),
        ("auth_timeout", config.auth_timeout),
    ];
    for (name, value) in durations {
        if value.is_zero() {
            bail!("{name} must be longer than zero");
        }
    }
    if !config.lame_duck_duration.is_zero()
        && config.lame_duck_grace_period >= config.lame_duck_duration
    {
        bail!(
            "lame_duck_grace_period ({:?}) must be shorter than lame_duck_duration ({:?})",
            config.lame_duck_grace_period,
            config.lame_duck_duration
        );
    }
    if config.max_payload > config.max_pending {
        bail!(
            "max_payload ({}) cannot be higher than max_pending ({}): \
             a subscriber could never receive such a message",
            config.max_payload,
            config.max_pending
        );
    }
    Ok(())
}

/// Runs the broker until SIGINT/SIGTERM, or until lame duck mode (SIGUSR2) closed its
/// last client: the whole `broker` binary. With `--signal`, signals another broker
/// instead and returns.
pub async fn run(args: BrokerArgs) -> anyhow::Result<()> {
    if let Some(signal) = &args.signal {
        return send_signal::send(signal);
    }
    let settings = args.resolve()?;
    init_logging(settings.log_file.as_deref(), settings.log_level)?;
    let mut signals = BrokerSignals::install()?;
    let shutdown = CancellationToken::new();
    let broker = Broker::start(&settings, shutdown.clone()).await?;
    info!("Server is ready");
    loop {
        let trapped = tokio::select! {
            trapped = signals.next() => trapped,
            () = shutdown.cancelled() => break,
        };
        match trapped {
            Trapped::LameDuck if broker.server.in_lame_duck() => {
                info!("Already in lame duck mode");
            }
            Trapped::LameDuck => broker.server.lame_duck(),
            // As in nats-server: SIGTERM does not cut lame duck mode short (a supervisor
            // sends it right after `--signal ldm`); SIGINT does.
            Trapped::Terminate if broker.server.in_lame_duck() => {
                info!("Lame duck mode in progress: not stopping (SIGINT stops at once)");
            }
            Trapped::Terminate | Trapped::Interrupt => break,
        }
    }
    info!("Initiating Shutdown...");
    shutdown.cancel();
    let result = broker.stop().await;
    info!("Server Exiting..");
    result
}

/// A started broker: its listeners are bound, its tasks run until the shutdown token is
/// cancelled, and its pid/ports files exist until it is dropped.
pub struct Broker {
    server: Server,
    client_addr: SocketAddr,
    monitor_addr: Option<SocketAddr>,
    tasks: JoinSet<anyhow::Result<()>>,
    _files: RuntimeFiles,
}

impl Broker {
    /// Binds, writes the pid and ports files, starts serving, and logs the lines
    /// harnesses look for. The caller logs `Server is ready` once everything it runs
    /// is up. If a task fails it cancels `shutdown`, so the process stops as a whole
    /// instead of running half of itself.
    pub async fn start(settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<Broker> {
        let backlog = settings.listen_backlog;
        let listener = bind(&settings.host, settings.port, backlog).await?;
        let client_addr = listener
            .local_addr()
            .context("reading the client address")?;
        let monitor_listener = match &settings.monitor {
            Some((host, port)) => Some(bind(host, *port, backlog).await?),
            None => None,
        };
        let monitor_addr = match &monitor_listener {
            Some(listener) => Some(
                listener
                    .local_addr()
                    .context("reading the monitor address")?,
            ),
            None => None,
        };

        let mut files = RuntimeFiles::default();
        if let Some(path) = &settings.pid_file {
            files.write(path, &std::process::id().to_string())?;
        }
        if let Some(dir) = &settings.ports_file_dir {
            files.write(
                &dir.join(ports_file_name()),
                &ports_json(client_addr, monitor_addr)?,
            )?;
        }

        let server = Server::new(settings.config.clone());
        info!("Starting shaddock broker (NATS protocol)");
        info!("  Version:  {}", env!("CARGO_PKG_VERSION"));
        info!(
            "  Name:     {}",
            settings
                .config
                .server_name
                .as_deref()
                .unwrap_or(server.id())
        );
        info!("  ID:       {}", server.id());
        net::nofile::raise_and_log();
        let mut tasks = JoinSet::new();
        if let (Some(listener), Some(addr)) = (monitor_listener, monitor_addr) {
            info!("Starting http monitor on {addr}");
            let serve = monitor::serve(listener, server.clone(), shutdown.clone());
            tasks.spawn(supervise("monitoring", serve, shutdown.clone()));
        }
        info!("Listening for client connections on {client_addr}");
        if let Some(tls) = &settings.config.tls {
            info!("TLS required for client connections");
            if tls.verify() {
                info!("Client certificates are verified against the CA");
            }
        }
        let (run_server, token) = (server.clone(), shutdown.clone());
        let serve = async move {
            let result = run_server.run(listener, token.clone()).await;
            // The server also ends on its own, after lame duck mode: the process with it.
            token.cancel();
            result
        };
        tasks.spawn(supervise("broker", serve, shutdown));
        Ok(Broker {
            server,
            client_addr,
            monitor_addr,
            tasks,
            _files: files,
        })
    }

    /// The running server: for in-process connections and lame duck mode.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Where clients connect (the real port when 0 was asked for).
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// Where monitoring listens, if it is on.
    pub fn monitor_addr(&self) -> Option<SocketAddr> {
        self.monitor_addr
    }

    /// Waits, at most [`SHUTDOWN_GRACE`], for the tasks to finish after the shutdown
    /// token was cancelled; returns the first error any of them had.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let drain = async {
            let mut first_error = None;
            while let Some(joined) = self.tasks.join_next().await {
                let result = joined
                    .context("a broker task panicked")
                    .and_then(|done| done);
                if let Err(error) = result {
                    error!("{error:#}");
                    first_error.get_or_insert(error);
                }
            }
            first_error.map_or(Ok(()), Err)
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, drain).await {
            Ok(result) => result,
            Err(_) => {
                // Dropping `self` aborts whatever is still running.
                warn!("Shutdown took longer than {SHUTDOWN_GRACE:?}; dropping open connections");
                Ok(())
            }
        }
    }
}

async fn supervise(
    name: &'static str,
    task: impl Future<Output = std::io::Result<()>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let result = task.await.with_context(|| format!("{name} stopped"));
    if result.is_err() {
        shutdown.cancel();
    }
    result
}

async fn bind(
    host: &str,
    port: u16,
    backlog: net::Backlog,
) -> anyhow::Result<tokio::net::TcpListener> {
    // Accept `[::1]` as written in URLs as well as the bare `::1` the socket API wants.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    net::listen((host, port), backlog)
        .await
        .with_context(|| format!("binding {host} port {port}"))
}

/// `<exe-name>_<pid>.ports`, the name nats-server gives it, so harnesses find it.
fn ports_file_name() -> String {
    let exe = std::env::args_os()
        .next()
        .and_then(|arg0| {
            Path::new(&arg0)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "broker".to_owned());
    format!("{exe}_{}.ports", std::process::id())
}

/// The ports file's JSON, as nats-server writes it (only the loopback URL for a
/// wildcard bind: that is the one a local harness can dial).
fn ports_json(client: SocketAddr, monitor: Option<SocketAddr>) -> anyhow::Result<String> {
    #[derive(serde::Serialize)]
    struct Ports {
        nats: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        monitoring: Vec<String>,
    }
    let dialable = |addr: SocketAddr| match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    };
    let ports = Ports {
        nats: vec![format!("nats://{}", dialable(client))],
        monitoring: monitor
            .map(|addr| format!("http://{}", dialable(addr)))
            .into_iter()
            .collect(),
    };
    serde_json::to_string(&ports).context("encoding the ports file")
}

/// Files that exist while the broker runs, removed when it is dropped, on every exit
/// path that unwinds.
#[derive(Default)]
struct RuntimeFiles(Vec<PathBuf>);

impl RuntimeFiles {
    fn write(&mut self, path: &Path, contents: &str) -> anyhow::Result<()> {
        // Written under another name and renamed, so a harness polling for the file
        // never reads half of it.
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, contents)
            .and_then(|()| std::fs::rename(&partial, path))
            .with_context(|| format!("writing {}", path.display()))?;
        self.0.push(path.to_owned());
        Ok(())
    }
}

impl Drop for RuntimeFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            match std::fs::remove_file(path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    warn!("removing {}: {error}", path.display());
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
