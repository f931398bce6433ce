//! Test harness shared by the workspace's integration tests (cargo feature `testing`,
//! enabled only by dev-dependencies): a bus to test against — our broker in-process on
//! port 0, or the real `nats-server` as a child process on a random port — plus the Go
//! tools' whereabouts and a deadline on every wait.
//!
//! Servers are started the way NATS client test suites start nats-server: `-a 127.0.0.1
//! -p -1`, then the port is read from the `Listening for client connections on HOST:PORT`
//! log line and the server counts as up once it logs `Server is ready`. Nothing sleeps
//! for a port, and every server is stopped (a child killed by its own pid and reaped)
//! when its handle is dropped, so a failing test leaves nothing behind.
//!
//! Each check is written once over a [`Bus`] and run on both brokers with
//! [`on_both_buses!`](crate::on_both_buses): agreeing with nats-server is what proves the
//! expectation itself right.
//!
//! Everything here panics on failure, with the server's log when it did not start: it is
//! test code, and a panic is how a test fails.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Config, Server};

pub mod damage;
pub mod hostile;
pub mod pki;

/// How long any single wait in a test may take before the test fails: generous for a
/// loaded two-core CI machine running debug builds, short enough that a hang is reported.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A round trip through the server: once `client`'s own message comes back, the server
/// has processed everything the client sent before it (its subscriptions included), and
/// every message queued to the client before it has reached its subscriptions.
/// (async-nats' `flush()` only flushes the socket; it sends no PING.)
pub async fn round_trip(client: &async_nats::Client) {
    let inbox = client.new_inbox();
    let mut echo = within(client.subscribe(inbox.clone())).await.unwrap();
    within(client.publish(inbox, bytes::Bytes::new()))
        .await
        .unwrap();
    within(echo.next()).await.expect("subscription ended");
}

/// A metric series as tests name it, `name{label=value,...}`, from the key a
/// debugging recorder's snapshot gives.
pub fn series(key: &metrics::Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

/// Awaits `future`, failing the test after [`DEADLINE`].
pub async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("timed out waiting")
}

/// A broker to test against; stopped when dropped.
pub enum Bus {
    /// Our broker, on the test's runtime.
    Embedded(EmbeddedServer),
    /// The real nats-server, as a child process.
    NatsServer(ExternalServer),
}

impl Bus {
    /// Our broker with its default configuration, on 127.0.0.1:0.
    pub async fn embedded() -> Bus {
        Bus::Embedded(EmbeddedServer::start(Config::default()).await)
    }

    /// The real nats-server with its default configuration, on a random port.
    pub fn nats_server() -> Bus {
        Bus::NatsServer(spawn_server_binary(&nats_server_path(), &[]))
    }

    /// `nats://HOST:PORT`, for any NATS client.
    pub fn url(&self) -> &str {
        match self {
            Bus::Embedded(server) => &server.url,
            Bus::NatsServer(server) => &server.url,
        }
    }

    /// The client port's address, for raw TCP.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Bus::Embedded(server) => server.addr,
            Bus::NatsServer(server) => server.addr,
        }
    }

    /// Which broker this is, for failure messages.
    pub fn name(&self) -> &'static str {
        match self {
            Bus::Embedded(_) => "embedded broker",
            Bus::NatsServer(_) => "nats-server",
        }
    }
}

/// Runs each named `async fn(Bus)` as two tests, `embedded::<name>` on our broker and
/// `nats_server::<name>` on the real nats-server, on a two-thread runtime.
///
/// ```ignore
/// broker::on_both_buses!(answers_ping, refuses_garbage);
/// async fn answers_ping(bus: broker::testing::Bus) { /* ... */ }
/// ```
#[macro_export]
macro_rules! on_both_buses {
    ($($test:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::testing::Bus::embedded().await).await;
                }
            )*
        }
        mod nats_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::testing::Bus::nats_server()).await;
                }
            )*
        }
    };
}

/// Our broker running on the test's runtime; stopped when dropped.
pub struct EmbeddedServer {
    pub addr: SocketAddr,
    pub url: String,
    pub server: Server,
    shutdown: CancellationToken,
}

impl EmbeddedServer {
    /// Binds 127.0.0.1:0 and runs a [`Server`] with `config` on the current runtime.
    pub async fn start(config: Config) -> EmbeddedServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::new(config);
        let shutdown = CancellationToken::new();
        let (run_server, run_shutdown) = (server.clone(), shutdown.clone());
        tokio::spawn(async move { run_server.run(listener, run_shutdown).await });
        EmbeddedServer {
            addr,
            url: format!("nats://{addr}"),
            server,
            shutdown,
        }
    }

    /// Serves the monitoring endpoints for this server on a fresh port 0 listener,
    /// stopped together with the server.
    pub async fn start_monitor(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = self.server.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move { crate::monitor::serve(listener, server, shutdown).await });
        addr
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A server process started from a binary; killed (by its own pid) and reaped on drop.
pub struct ExternalServer {
    pub addr: SocketAddr,
    pub url: String,
    child: Child,
    /// The server's log lines after `Server is ready`, until it closes stderr.
    log: mpsc::Receiver<String>,
    /// Files to remove once the server is gone (its config file).
    temp_files: Vec<PathBuf>,
}

impl ExternalServer {
    /// Removes `path` when the server is dropped (after it is gone).
    pub fn remove_on_drop(&mut self, path: PathBuf) {
        self.temp_files.push(path);
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits, up to [`DEADLINE`], for a log line containing `needle` (skipping those
    /// before it) and returns it.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle:?} ({e:?})"),
            }
        }
    }

    /// Waits, up to [`DEADLINE`], for the server to exit on its own (it closes its log
    /// when it does) and returns how it exited.
    pub fn wait_for_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("the server did not exit"),
            }
        }
        self.child.wait().unwrap()
    }
}

impl Drop for ExternalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for path in &self.temp_files {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Starts `path -a 127.0.0.1 -p -1 <extra_args>` (our `broker` binary takes the same
/// flags as nats-server) and waits, up to [`DEADLINE`], for the log lines `Listening for
/// client connections on HOST:PORT` and `Server is ready`. Stderr keeps being drained
/// afterwards so the server never blocks on a full pipe.
pub fn spawn_server_binary(path: &Path, extra_args: &[&str]) -> ExternalServer {
    let mut child = Command::new(path)
        .args(["-a", "127.0.0.1", "-p", "-1"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            // Kept for `wait_for_log`; a dropped server no longer listens.
            let _ = tx.send(line);
        }
    });
    // From here on the child is killed if startup fails.
    let mut server = ExternalServer {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        url: String::new(),
        child,
        log: rx,
        temp_files: Vec::new(),
    };
    let deadline = Instant::now() + DEADLINE;
    let mut log = Vec::new();
    let mut addr = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match server.log.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => panic!(
                "{} did not become ready ({e:?}); its log:\n{}",
                path.display(),
                log.join("\n")
            ),
        };
        if let Some((_, rest)) = line.split_once("Listening for client connections on ") {
            addr = Some(rest.trim().parse::<SocketAddr>().unwrap());
        }
        let ready = line.contains("Server is ready");
        log.push(line);
        if ready {
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| {
        panic!(
            "{} never logged its client port:\n{}",
            path.display(),
            log.join("\n")
        )
    });
    server.addr = addr;
    server.url = format!("nats://{addr}");
    server
}

/// Starts the real nats-server with a config file holding `config` (nats-server syntax);
/// the file is removed when the server is dropped.
pub fn spawn_nats_server_with_config(config: &str) -> ExternalServer {
    let path = temp_file("nats-server.conf", config);
    let mut server = spawn_server_binary(&nats_server_path(), &["-c", path.to_str().unwrap()]);
    server.remove_on_drop(path);
    server
}

/// Writes `contents` to a fresh file in the temp dir and returns its path.
pub fn temp_file(name: &str, contents: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("shaddock-test-{}-{n}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

/// The real nats-server: on PATH, else in `$(go env GOPATH)/bin`.
pub fn nats_server_path() -> PathBuf {
    find_go_binary("nats-server")
}

/// A Go-installed tool (`nats-server`, `nats-bench`, `nats-pub`, ...): on PATH, else in
/// `$(go env GOPATH)/bin`. Panics with a hint when it is not installed.
pub fn find_go_binary(name: &str) -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    let gopath = Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty());
    if let Some(gopath) = gopath {
        // GOPATH may be a list; the first entry is where `go install` puts binaries.
        let first = std::env::split_paths(&gopath).next().unwrap_or_default();
        let candidate = first.join("bin").join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{name} not found on PATH or in $(go env GOPATH)/bin; install it with `go install` \
         (nats-server: `go install github.com/nats-io/nats-server/v2@latest`)"
    )
}
