//! `idle-conns`: resident memory a NATS server spends per idle client connection: its
//! RSS before and after N connections that each completed the handshake (`CONNECT`,
//! `PING`, `PONG`), divided by N. Plain sockets rather than async-nats clients make
//! "idle" exact: no subscription, no inbox, nothing sent after the handshake.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::report::{Doc, OutputArgs, Report, Section};

/// Upper bound on connections: each is a file descriptor in both processes.
pub const MAX_CONNS: u32 = 50_000;
/// Time one connection may take to complete its handshake before the run fails.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes read while waiting for `PONG`; INFO is well under this, so more means the
/// peer is not a NATS server.
const MAX_HANDSHAKE_BYTES: usize = 64 * 1024;
/// What every connection sends: no echo of `+OK`, then a round trip to know the server
/// processed the CONNECT.
const HANDSHAKE: &[u8] =
    b"CONNECT {\"verbose\":false,\"pedantic\":false,\"name\":\"shaddock-loadtest-idle\"}\r\nPING\r\n";

/// Flags of `shaddock loadtest idle-conns`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Server address, `nats://host:port` or `host:port`.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub url: String,
    /// Process id of the server, whose RSS is read from /proc.
    #[arg(long)]
    pub pid: u32,
    /// Idle connections to open.
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONNS)))]
    pub conns: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Result of one run (scripts/bench-broker.sh reads `bytes_per_conn` of `--json -`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdleConns {
    pub conns: u32,
    pub rss_before: u64,
    pub rss_after: u64,
    /// Marginal resident bytes per connection (negative if the server shrank meanwhile).
    pub bytes_per_conn: i64,
}

impl Section for IdleConns {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
    }
}

/// Runs the measurement and prints its report.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let setup = format!("NATS server {} (pid {})", args.url, args.pid);
    Report::new("idle-conns", setup, measure(&args).await?).write(&args.output)
}

/// Runs the measurement and returns its figures; connections close when it returns.
async fn measure(args: &Args) -> anyhow::Result<IdleConns> {
    let addr = host_port(&args.url);
    let why = |pid| format!("reading the RSS of pid {pid} (is it running?)");
    let read_rss = |pid| crate::proc::rss_bytes(pid).with_context(|| why(pid));
    let rss_before = read_rss(args.pid)?;
    let mut conns = Vec::with_capacity(usize::try_from(args.conns).unwrap_or(0));
    // Sequential on purpose: the server sees one new connection at a time, as idle
    // clients trickling in would look.
    for i in 0..args.conns {
        let conn = tokio::time::timeout(NETWORK_TIMEOUT, handshake(addr)).await;
        let conn = conn.with_context(|| format!("connection {i} to {addr}: no PONG in time"))?;
        conns.push(conn.with_context(|| format!("connection {i} to {addr}"))?);
    }
    let rss_after = read_rss(args.pid)?;
    tracing::info!(conns = conns.len(), rss_before, rss_after, "measured");
    drop(conns);
    let delta = i128::from(rss_after) - i128::from(rss_before);
    Ok(IdleConns {
        conns: args.conns,
        rss_before,
        rss_after,
        bytes_per_conn: i64::try_from(delta / i128::from(args.conns.max(1))).unwrap_or(i64::MAX),
    })
}

/// `nats://host:port/` -> `host:port`; anything else is passed through.
fn host_port(url: &str) -> &str {
    let rest = url.strip_prefix("nats://").unwrap_or(url);
    rest.trim_end_matches('/')
}

/// Connects and completes CONNECT + PING/PONG, returning the open socket.
async fn handshake(addr: &str) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.context("connect")?;
    // Legal before INFO arrives: the server reads CONNECT after sending INFO.
    stream.write_all(HANDSHAKE).await.context("send CONNECT")?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.context("read")?;
        if n == 0 {
            bail!("server closed the connection during the handshake");
        }
        buf.extend_from_slice(&chunk[..n]);
        if handshake_done(&buf)? {
            return Ok(stream);
        }
        if buf.len() > MAX_HANDSHAKE_BYTES {
            bail!("no PONG within {MAX_HANDSHAKE_BYTES} bytes: not a NATS server?");
        }
    }
}

/// Scans complete lines received so far: `Ok(true)` once a `PONG` line is seen, an error
/// on `-ERR`, `Ok(false)` while waiting (INFO, `+OK`, or a partial line).
fn handshake_done(received: &[u8]) -> anyhow::Result<bool> {
    let mut rest = received;
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let line = &rest[..end];
        if line == b"PONG" {
            return Ok(true);
        }
        if line.starts_with(b"-ERR") {
            bail!("server refused: {}", String::from_utf8_lossy(line));
        }
        rest = &rest[end + 2..];
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_waits_for_a_whole_pong_line() {
        assert!(!handshake_done(b"INFO {\"a\":1}\r\n").unwrap());
        assert!(!handshake_done(b"INFO {}\r\nPON").unwrap());
        assert!(!handshake_done(b"INFO {}\r\nPONG").unwrap());
        assert!(handshake_done(b"INFO {}\r\nPONG\r\n").unwrap());
        assert!(handshake_done(b"INFO {}\r\n+OK\r\nPONG\r\n").unwrap());
    }
}
