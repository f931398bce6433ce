//! Binding a listener with a backlog we choose: the one way every listener of ours is
//! bound (the gate's plain and TLS ports, the broker's client and monitoring ports, the
//! metrics endpoint).
//!
//! The backlog is the queue of connections the kernel has completed but the process
//! has not accepted yet. tokio's `TcpListener::bind` asks for 128: a burst of clients
//! reconnecting at once after a gate restarts (thousands, within a second) fills that
//! before the accept loop has taken the first hundred, and the kernel then drops the
//! SYNs of the rest, who retry only after a second, then three, then seven. So the
//! backlog is [`DEFAULT_LISTEN_BACKLOG`] unless `--listen-backlog` says otherwise
//! (nginx and nats-server ask for the kernel's maximum; HAProxy for its maxconn). The
//! kernel quietly truncates any backlog to `net.core.somaxconn`, so a larger one is
//! clamped here and the value in force logged.
//!
//! A gate of several shards ([`listen_shared`]) binds one listener per shard on the same
//! address with SO_REUSEPORT: the kernel spreads new connections over them by a hash of
//! each connection's addresses, so no thread accepts for another and hands the socket
//! over (what nginx's and envoy's `reuseport` do).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::str::FromStr;

use tokio::net::{TcpListener, TcpSocket, ToSocketAddrs, lookup_host};
use tracing::info;

/// Connections the kernel may queue for a listener before the process accepts them,
/// unless `--listen-backlog` says otherwise: enough for a reconnect storm of a gate's
/// clients to wait rather than have their SYNs dropped.
pub const DEFAULT_LISTEN_BACKLOG: u32 = 1024;

/// Where Linux keeps the cap on every listen backlog.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// A listen backlog: at least 1 (a backlog of 0 would leave the kernel to pick a
/// handful, never what an operator means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog(NonZeroU32);

impl Backlog {
    /// `None` for 0.
    pub fn new(backlog: u32) -> Option<Backlog> {
        NonZeroU32::new(backlog).map(Backlog)
    }

    /// The backlog asked for.
    pub fn get(self) -> u32 {
        self.0.get()
    }

    /// The backlog in force: the one asked for, at most the kernel's `somaxconn`.
    pub fn effective(self) -> u32 {
        somaxconn().map_or(self.get(), |max| self.get().min(max))
    }
}

impl Default for Backlog {
    fn default() -> Backlog {
        Backlog(NonZeroU32::new(DEFAULT_LISTEN_BACKLOG).unwrap_or(NonZeroU32::MIN))
    }
}

impl FromStr for Backlog {
    type Err = String;

    fn from_str(s: &str) -> Result<Backlog, String> {
        let n: u32 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a connection count"))?;
        Backlog::new(n).ok_or_else(|| {
            "a listen backlog of 0 queues no connections: use at least 1 (default 1024)".into()
        })
    }
}

impl fmt::Display for Backlog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// `--listen-backlog`, flattened into every role that listens; its metrics and
/// monitoring listeners take the same value.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct BacklogArg {
    /// Connections the kernel queues on each listener (clients, TLS, monitoring,
    /// metrics) before they are accepted, so a reconnect storm waits instead of having
    /// its SYNs dropped; at least 1, clamped to net.core.somaxconn (logged when it is).
    #[arg(
        long = "listen-backlog",
        env = "SHADDOCK_LISTEN_BACKLOG",
        value_name = "N"
    )]
    #[arg(default_value_t = Backlog::default())]
    pub listen_backlog: Backlog,
}

/// The kernel's cap on listen backlogs, where it can be read.
pub fn somaxconn() -> Option<u32> {
    std::fs::read_to_string(SOMAXCONN).ok()?.trim().parse().ok()
}

/// Binds a listener on the first address `addr` resolves to that binds, with
/// SO_REUSEADDR (as tokio's `TcpListener::bind` sets, so a restarted server binds
/// while its old connections linger in TIME_WAIT) and `backlog`, clamped to the
/// kernel's cap (logged at info when it is).
pub async fn listen(addr: impl ToSocketAddrs, backlog: Backlog) -> io::Result<TcpListener> {
    first_bound(addr, backlog, false).await
}

/// Binds `count` listeners (at least one) on the first address `addr` resolves to that
/// binds, as [`listen`] does and, when there are several, with SO_REUSEPORT, so that
/// they share it: with port 0 the first takes a free port and the others bind that one. They come back as std
/// listeners (non-blocking) for each shard's runtime to adopt
/// (`tokio::net::TcpListener::from_std`), so that each is driven by its own shard's
/// reactor.
///
/// SO_REUSEPORT also lets another process of the same user bind the address while
/// these listen (and share its connections): run one gate per address. A single
/// listener is bound without it, so a second gate on its address fails as with
/// [`listen`].
pub async fn listen_shared(
    addr: impl ToSocketAddrs,
    backlog: Backlog,
    count: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    let first = first_bound(addr, backlog, count > 1).await?;
    let at = first.local_addr()?;
    let mut listeners = vec![first.into_std()?];
    for _ in 1..count {
        listeners.push(bind(at, backlog.effective(), true)?.into_std()?);
    }
    Ok(listeners)
}

async fn first_bound(
    addr: impl ToSocketAddrs,
    backlog: Backlog,
    shared: bool,
) -> io::Result<TcpListener> {
    let effective = backlog.effective();
    if effective < backlog.get() {
        info!(
            asked = backlog.get(),
            effective, "listen backlog clamped to the kernel's net.core.somaxconn"
        );
    }
    let mut last_error = None;
    for addr in lookup_host(addr).await? {
        match bind(addr, effective, shared) {
            Ok(listener) => return Ok(listener),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")))
}

fn bind(addr: SocketAddr, backlog: u32, shared: bool) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if shared {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_is_a_positive_count() {
        assert_eq!("1".parse::<Backlog>().map(Backlog::get), Ok(1));
        assert_eq!(" 4096 ".parse::<Backlog>().map(Backlog::get), Ok(4096));
        let zero = "0".parse::<Backlog>().unwrap_err();
        assert!(zero.contains("at least 1"), "{zero}");
        assert!("-1".parse::<Backlog>().is_err());
        assert!("many".parse::<Backlog>().is_err());
        assert_eq!(Backlog::default().get(), DEFAULT_LISTEN_BACKLOG);
        assert_eq!(Backlog::default().to_string(), "1024");
    }

    #[tokio::test]
    async fn shared_listeners_take_one_free_port_a_plain_bind_cannot_take() {
        let listeners = listen_shared("127.0.0.1:0", Backlog::default(), 3)
            .await
            .unwrap();
        let ports: Vec<u16> = (listeners.iter())
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert_eq!(ports.len(), 3);
        assert!(
            ports[0] != 0 && ports.iter().all(|p| *p == ports[0]),
            "{ports:?}"
        );
        // A plain bind of the same port is refused: only the shards share it.
        let taken = listen(("127.0.0.1", ports[0]), Backlog::default()).await;
        assert_eq!(
            taken.unwrap_err().kind(),
            io::ErrorKind::AddrInUse,
            "a listener without SO_REUSEPORT joined the shards"
        );
    }

    #[tokio::test]
    async fn a_single_listener_is_not_shared() {
        let one = listen_shared("127.0.0.1:0", Backlog::default(), 1)
            .await
            .unwrap();
        let port = one[0].local_addr().unwrap().port();
        // Another gate's shards on the same address are refused: a lone listener has
        // no SO_REUSEPORT for them to join.
        let joined = listen_shared(("127.0.0.1", port), Backlog::default(), 2).await;
        assert_eq!(joined.unwrap_err().kind(), io::ErrorKind::AddrInUse);
    }
}
