//! What clients that stop reading cost a running gate, in memory (docs/benchmarks.md,
//! "Slow clients"): the gate process's RSS before, at the peak of, and after an attack
//! of sessions that send and never read, and of a heartbeat flood.
//!
//! ```sh
//! cargo run --release -p shaddock-loadtest --example slow_readers -- ws://127.0.0.1:3250 <gate pid> [sessions]
//! ```
//!
//! Each attacking session opens a socket with the smallest receive buffer the kernel
//! allows, pipelines 256 `echo.raw` requests of 16 KiB and reads nothing; one more
//! session sends 20,000 heartbeats and reads nothing. The gate should close them all as
//! too slow (or they are dropped after 20 s), and its RSS come back near where it was.

use std::time::{Duration, Instant};

use futures::SinkExt as _;
use loadtest::proc::rss_bytes;
use proto::client::{Handshake, Packet, packet::Kind};
use proto::frame;
use tokio::net::TcpSocket;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, client_async};

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// Requests each attacking session pipelines.
const REQUESTS: u64 = 256;
/// Bytes of each request's body (and of its echo).
const BODY: usize = 16 * 1024;
/// Heartbeats of the flooding session.
const HEARTBEATS: usize = 20_000;
/// How long the attackers are kept before they are dropped, closed or not.
const HOLD: Duration = Duration::from_secs(20);

/// The resident set of process `pid` in MiB (0 when it cannot be read).
fn rss_mib(pid: u32) -> f64 {
    rss_bytes(pid).unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

/// A handshaken session over a socket with a small receive window.
async fn session(url: &str) -> anyhow::Result<Ws> {
    let addr: std::net::SocketAddr = url.trim_start_matches("ws://").parse()?;
    let socket = TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let stream = socket.connect(addr).await?;
    let (mut ws, _) = client_async(url, MaybeTlsStream::Plain(stream)).await?;
    let hello = Packet::new(Kind::Handshake(Handshake::default()));
    ws.feed(sdk::frame::encode(&hello, false)).await?;
    Ok(ws)
}

/// An attacking session, its requests pipelined and flushed.
async fn attack(url: &str, body: &[u8]) -> anyhow::Result<Ws> {
    let mut ws = session(url).await?;
    for id in 1..=REQUESTS {
        ws.feed(Message::Binary(frame::request(id, "echo.raw", "", body)))
            .await?;
    }
    ws.flush().await?;
    Ok(ws)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(pid)) = (args.first(), args.get(1)) else {
        anyhow::bail!("usage: slow_readers WS_URL GATE_PID [SESSIONS]");
    };
    let pid: u32 = pid.parse()?;
    let sessions: usize = args.get(2).map_or(Ok(100), |s| s.parse())?;
    let baseline = rss_mib(pid);
    let body = vec![b'x'; BODY];
    let mut attackers = Vec::new();
    // Sessions the gate cut while they were still sending (a busy machine lets the gate
    // find one too slow before its last request is out): they did their part.
    let mut cut_early = 0;
    for _ in 0..sessions {
        match attack(url, &body).await {
            Ok(ws) => attackers.push(ws),
            Err(_) => cut_early += 1,
        }
    }
    let mut flooder = session(url).await?;
    for _ in 0..HEARTBEATS {
        flooder.feed(Message::Binary(frame::HEARTBEAT)).await?;
    }
    flooder.flush().await?;
    attackers.push(flooder);
    let started = Instant::now();
    let mut peak = baseline;
    while started.elapsed() < HOLD {
        peak = peak.max(rss_mib(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(attackers);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_mib(pid);
    let kib = BODY / 1024;
    println!(
        "gate RSS: baseline {baseline:.1} MiB, peak {peak:.1} MiB, after {after:.1} MiB ({sessions} sessions × {REQUESTS} requests of {kib} KiB never read, {HEARTBEATS} heartbeats never read; {cut_early} cut before their last request was out)"
    );
    Ok(())
}
