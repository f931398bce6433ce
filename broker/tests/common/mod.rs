//! Test harness shared by the integration tests: start our broker in-process on port 0,
//! spawn a server binary (ours or the real `nats-server`) the way client test suites do,
//! find the Go tools, and talk raw protocol over TCP with a deadline on every wait.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::sync::CancellationToken;

/// How long any single wait in a test may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Our broker running on the test's runtime; stopped when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub server: broker::Server,
    shutdown: CancellationToken,
}

impl TestServer {
    /// Serves the monitoring endpoints for this server on a fresh port 0 listener, stopped
    /// together with the server.
    pub async fn start_monitor(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = self.server.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move { broker::monitor::serve(listener, server, shutdown).await });
        addr
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Binds 127.0.0.1:0 and runs `broker::Server` with `config` on the current runtime.
pub async fn start_in_process(config: broker::Config) -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = broker::Server::new(config);
    let shutdown = CancellationToken::new();
    let (run_server, run_shutdown) = (server.clone(), shutdown.clone());
    tokio::spawn(async move { run_server.run(listener, run_shutdown).await });
    TestServer {
        addr,
        url: format!("nats://{addr}"),
        server,
        shutdown,
    }
}

/// A server process started from a binary; killed (by its own pid) and reaped on drop.
pub struct ExternalServer {
    pub addr: SocketAddr,
    pub url: String,
    child: Child,
    /// Files to remove once the server is gone (its config file).
    temp_files: Vec<PathBuf>,
}

impl ExternalServer {
    pub fn remove_on_drop(&mut self, path: PathBuf) {
        self.temp_files.push(path);
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

/// Starts `path -a 127.0.0.1 -p -1 <extra_args>` and waits, up to [`DEADLINE`], for the
/// log lines `Listening for client connections on HOST:PORT` and `Server is ready`, as
/// client test suites do with nats-server. Stderr keeps being drained afterwards so the
/// server never blocks on a full pipe.
pub fn spawn_binary(path: &Path, extra_args: &[&str]) -> ExternalServer {
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
            // Nobody listens once the server is up; keep draining regardless.
            let _ = tx.send(line);
        }
    });

    let mut server = ExternalServer {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        url: String::new(),
        child,
        temp_files: Vec::new(),
    };
    let deadline = Instant::now() + DEADLINE;
    let mut log = Vec::new();
    let mut addr = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
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

/// Writes `contents` to a fresh file in the temp dir and returns its path.
pub fn temp_file(name: &str, contents: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "shaddock-broker-test-{}-{n}-{name}",
        std::process::id()
    ));
    std::fs::write(&path, contents).unwrap();
    path
}

/// Starts the real nats-server with a config file holding `config` (nats-server syntax).
pub fn spawn_nats_server(config: &str) -> ExternalServer {
    let path = temp_file("nats-server.conf", config);
    let mut server = spawn_binary(&nats_server_path(), &["-c", path.to_str().unwrap()]);
    server.remove_on_drop(path);
    server
}

/// The real nats-server: on PATH, else in `$(go env GOPATH)/bin`.
pub fn nats_server_path() -> PathBuf {
    go_tool("nats-server")
}

/// A Go-installed tool (`nats-server`, `nats-bench`, `nats-pub`, ...): on PATH, else in
/// `$(go env GOPATH)/bin`. Panics with a hint when it is not installed.
pub fn go_tool(name: &str) -> PathBuf {
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
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty());
    if let Some(gopath) = gopath {
        // GOPATH may be a list; the first entry is where `go install` puts binaries.
        let first = std::env::split_paths(&gopath).next().unwrap_or_default();
        let candidate = first.join("bin").join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("{name} not found on PATH or in $(go env GOPATH)/bin; install it with `go install`")
}

/// A raw NATS protocol connection: write bytes, read lines, with [`DEADLINE`] on reads.
pub struct Conn {
    reader: TokioBufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// Answer the server's own PINGs and hide them from the test (on by default), so a
    /// check that runs past the server's first PING is not thrown off by it.
    pub auto_pong: bool,
}

/// What a read produced: a line, or the end of the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    Line(String),
    Closed,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Conn {
        Conn::from_stream(TcpStream::connect(addr).await.unwrap())
    }

    pub fn from_stream(stream: TcpStream) -> Conn {
        stream.set_nodelay(true).unwrap();
        let (read, writer) = stream.into_split();
        Conn {
            reader: TokioBufReader::new(read),
            writer,
            auto_pong: true,
        }
    }

    /// Connects and consumes the INFO line, returning its JSON.
    pub async fn connect_info(addr: SocketAddr) -> (Conn, serde_json::Value) {
        let mut conn = Conn::connect(addr).await;
        let info = conn.read_info().await;
        (conn, info)
    }

    /// Connects, reads INFO, sends `CONNECT <json>` and a PING, and waits for the PONG.
    pub async fn connect_with(addr: SocketAddr, connect_json: &str) -> Conn {
        let (mut conn, _) = Conn::connect_info(addr).await;
        conn.send(&format!("CONNECT {connect_json}\r\nPING\r\n"))
            .await;
        conn.expect_line("PONG").await;
        conn
    }

    /// A connected client with verbose off, ready for ops.
    pub async fn quiet(addr: SocketAddr) -> Conn {
        Conn::connect_with(addr, r#"{"verbose":false,"pedantic":false}"#).await
    }

    pub async fn read_info(&mut self) -> serde_json::Value {
        let line = self.line().await;
        let json = line
            .strip_prefix("INFO ")
            .unwrap_or_else(|| panic!("expected INFO first, got {line:?}"));
        serde_json::from_str(json.trim()).unwrap()
    }

    /// Writes `data`; errors are ignored since several tests write to a connection the
    /// server may already have closed, and then check what was read.
    pub async fn send(&mut self, data: &str) {
        self.send_bytes(data.as_bytes()).await;
    }

    pub async fn send_bytes(&mut self, data: &[u8]) {
        let _ = self.writer.write_all(data).await;
        let _ = self.writer.flush().await;
    }

    /// Next line without its line ending, or `Closed` at EOF or on a reset.
    pub async fn read(&mut self) -> Read {
        self.read_within(DEADLINE).await.expect("timed out reading")
    }

    /// Like [`Conn::read`], but `None` when nothing arrives within `wait`.
    pub async fn read_within(&mut self, wait: Duration) -> Option<Read> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut buf = Vec::new();
            let read = self.reader.read_until(b'\n', &mut buf);
            let line = match tokio::time::timeout_at(deadline, read).await {
                Err(_) => return None,
                Ok(Err(_)) | Ok(Ok(0)) => return Some(Read::Closed),
                Ok(Ok(_)) => String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            };
            if self.auto_pong && line == "PING" {
                self.send("PONG\r\n").await;
                continue;
            }
            return Some(Read::Line(line));
        }
    }

    /// Next line; panics if the connection closed.
    pub async fn line(&mut self) -> String {
        match self.read().await {
            Read::Line(line) => line,
            Read::Closed => panic!("connection closed while a line was expected"),
        }
    }

    pub async fn expect_line(&mut self, expected: &str) {
        let line = self.line().await;
        assert_eq!(line, expected);
    }

    /// Reads exactly `n` payload bytes plus the trailing CRLF.
    pub async fn read_payload(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n + 2];
        tokio::time::timeout(DEADLINE, self.reader.read_exact(&mut buf))
            .await
            .expect("timed out reading a payload")
            .unwrap();
        assert_eq!(&buf[n..], b"\r\n", "payload not followed by CRLF");
        buf.truncate(n);
        buf
    }

    /// Expects `MSG`/`HMSG` control line `expected` followed by `payload`.
    pub async fn expect_msg(&mut self, expected: &str, payload: &[u8]) {
        self.expect_line(expected).await;
        let got = self.read_payload(payload.len()).await;
        assert_eq!(got, payload, "payload of {expected}");
    }

    /// Expects the server to close the connection without sending anything more.
    pub async fn expect_closed(&mut self) {
        let read = self.read().await;
        assert_eq!(read, Read::Closed, "expected the server to close");
    }

    /// Expects `-ERR '<text>'` and then the server closing the connection.
    pub async fn expect_err_and_close(&mut self, text: &str) {
        self.expect_line(&format!("-ERR '{text}'")).await;
        self.expect_closed().await;
    }

    /// Sends PING and expects PONG next: proves the connection is open and that nothing
    /// else (no MSG, no -ERR) was queued before it.
    pub async fn ping_pong(&mut self) {
        self.send("PING\r\n").await;
        self.expect_line("PONG").await;
    }
}
