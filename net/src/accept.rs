//! Accepting connections without spinning: the one accept loop every listener of ours
//! goes through (the gate, the broker, the broker's monitoring, the metrics endpoint).
//!
//! When the process is out of descriptors (or the kernel out of memory or buffers) an
//! accept fails at once, and keeps failing at once while the pending connection waits in
//! the backlog: a loop that retries straight away burns a core and writes a log line
//! per turn. So a failure that is not the peer's fault pauses accepting, doubling the
//! pause from [`MIN_BACKOFF`] to [`MAX_BACKOFF`] (as nats-server does) until an accept
//! succeeds; a failure that is the peer's (it gave up or reset before we took it) is
//! skipped at once. Every failure is counted in `accept_errors_total{listener, kind}`
//! and logged through a [`LogLimiter`], one line a second per kind at most.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::LogLimiter;

/// First pause after a failed accept: short enough that a burst of closes is used at
/// once, long enough that a process out of descriptors stops spinning (nats-server's
/// `ACCEPT_MIN_SLEEP` is 10 ms; a little less keeps recovery quick).
pub const MIN_BACKOFF: Duration = Duration::from_millis(5);
/// Longest pause: a process out of descriptors notices within a second that some were
/// freed (nats-server's `ACCEPT_MAX_SLEEP`).
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Why an accept failed, as counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptErrorKind {
    /// EMFILE: this process is out of descriptors.
    Emfile,
    /// ENFILE: the whole system is out of descriptors.
    Enfile,
    /// ENOBUFS: the kernel is out of socket buffers.
    Enobufs,
    /// ENOMEM: the kernel is out of memory.
    Enomem,
    /// ECONNABORTED: the peer gave up before we took its connection.
    Aborted,
    /// The peer reset its connection before we took it.
    Reset,
    /// Anything else; treated as the process's trouble, so it backs off too.
    Other,
}

impl AcceptErrorKind {
    /// Every kind, in the order [`AcceptStats`] keeps them.
    pub const ALL: [AcceptErrorKind; 7] = [
        AcceptErrorKind::Emfile,
        AcceptErrorKind::Enfile,
        AcceptErrorKind::Enobufs,
        AcceptErrorKind::Enomem,
        AcceptErrorKind::Aborted,
        AcceptErrorKind::Reset,
        AcceptErrorKind::Other,
    ];

    pub fn classify(error: &io::Error) -> AcceptErrorKind {
        use nix::errno::Errno;
        match error.raw_os_error().map(Errno::from_raw) {
            Some(Errno::EMFILE) => return AcceptErrorKind::Emfile,
            Some(Errno::ENFILE) => return AcceptErrorKind::Enfile,
            Some(Errno::ENOBUFS) => return AcceptErrorKind::Enobufs,
            Some(Errno::ENOMEM) => return AcceptErrorKind::Enomem,
            _ => {}
        }
        match error.kind() {
            io::ErrorKind::ConnectionAborted => AcceptErrorKind::Aborted,
            io::ErrorKind::ConnectionReset => AcceptErrorKind::Reset,
            _ => AcceptErrorKind::Other,
        }
    }

    /// The `kind` label of `accept_errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            AcceptErrorKind::Emfile => "emfile",
            AcceptErrorKind::Enfile => "enfile",
            AcceptErrorKind::Enobufs => "enobufs",
            AcceptErrorKind::Enomem => "enomem",
            AcceptErrorKind::Aborted => "aborted",
            AcceptErrorKind::Reset => "reset",
            AcceptErrorKind::Other => "other",
        }
    }

    /// The peer's doing: retrying at once cannot spin, since its connection is gone.
    pub fn is_peer_fault(self) -> bool {
        matches!(self, AcceptErrorKind::Aborted | AcceptErrorKind::Reset)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The pause before the next accept: doubles from [`MIN_BACKOFF`] to [`MAX_BACKOFF`]
/// while accepts fail, and is gone after one succeeds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Backoff(Option<Duration>);

impl Backoff {
    /// An accept failed for a reason of our own: the pause to take now.
    pub fn fail(&mut self) -> Duration {
        let next = self.0.map_or(MIN_BACKOFF, |d| (d * 2).min(MAX_BACKOFF));
        self.0 = Some(next);
        next
    }

    pub fn reset(&mut self) {
        self.0 = None;
    }
}

/// Failed accepts of one listener by kind, for servers that report them themselves
/// (the broker's `/metrics` uses its own recorder).
#[derive(Debug, Default)]
pub struct AcceptStats([AtomicU64; AcceptErrorKind::ALL.len()]);

impl AcceptStats {
    pub fn get(&self, kind: AcceptErrorKind) -> u64 {
        self.0[kind.index()].load(Ordering::Relaxed)
    }

    fn add(&self, kind: AcceptErrorKind) {
        self.0[kind.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// A listener whose [`accept`](Acceptor::accept) never fails and never spins.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    /// The `listener` label and the log lines' subject: `gate`, `broker`, `metrics`.
    name: &'static str,
    backoff: Backoff,
    /// No accept before this. Kept here rather than in a sleep inside `accept`, so that
    /// a caller which drops `accept` in a `select!` does not cut the pause short.
    resume_at: Option<Instant>,
    stats: Arc<AcceptStats>,
    logs: [LogLimiter; AcceptErrorKind::ALL.len()],
}

impl Acceptor {
    pub fn new(listener: TcpListener, name: &'static str) -> Acceptor {
        Acceptor::with_stats(listener, name, Arc::default())
    }

    /// An acceptor that counts its failures into `stats` too.
    pub fn with_stats(
        listener: TcpListener,
        name: &'static str,
        stats: Arc<AcceptStats>,
    ) -> Acceptor {
        Acceptor {
            listener,
            name,
            backoff: Backoff::default(),
            resume_at: None,
            stats,
            logs: std::array::from_fn(|_| LogLimiter::per_second()),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection. Cancel-safe: a pause under way is kept for the next call.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if let Some(at) = self.resume_at {
                tokio::time::sleep_until(at).await;
                self.resume_at = None;
            }
            match self.listener.accept().await {
                Ok(accepted) => {
                    self.backoff.reset();
                    return accepted;
                }
                Err(error) => self.failed(&error),
            }
        }
    }

    fn failed(&mut self, error: &io::Error) {
        let kind = AcceptErrorKind::classify(error);
        self.stats.add(kind);
        metrics::counter!("accept_errors_total", "listener" => self.name, "kind" => kind.label())
            .increment(1);
        if let Some(tally) = self.logs[kind.index()].check() {
            tracing::warn!(
                listener = self.name,
                kind = kind.label(),
                "accept failed{tally}: {error}"
            );
        }
        if !kind.is_peer_fault() {
            self.resume_at = Some(Instant::now() + self.backoff.fail());
        }
    }
}

/// So axum's `serve` accepts through the same loop as everything else (its own sleeps a
/// second on any failure and logs each one).
impl axum::serve::Listener for Acceptor {
    type Io = TcpStream;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl Future<Output = (TcpStream, SocketAddr)> + Send {
        Acceptor::accept(self)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Acceptor::local_addr(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut backoff = Backoff::default();
        let pauses: Vec<_> = (0..10).map(|_| backoff.fail().as_millis()).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.fail(), MIN_BACKOFF);
    }

    #[test]
    fn errors_are_classified_by_whose_fault_they_are() {
        use nix::errno::Errno;
        let os = |e: Errno| io::Error::from_raw_os_error(e as i32);
        let cases = [
            (os(Errno::EMFILE), AcceptErrorKind::Emfile, false),
            (os(Errno::ENFILE), AcceptErrorKind::Enfile, false),
            (os(Errno::ENOBUFS), AcceptErrorKind::Enobufs, false),
            (os(Errno::ENOMEM), AcceptErrorKind::Enomem, false),
            (os(Errno::ECONNABORTED), AcceptErrorKind::Aborted, true),
            (os(Errno::ECONNRESET), AcceptErrorKind::Reset, true),
            (os(Errno::EPERM), AcceptErrorKind::Other, false),
        ];
        for (error, kind, peer) in cases {
            assert_eq!(AcceptErrorKind::classify(&error), kind, "{error}");
            assert_eq!(kind.is_peer_fault(), peer, "{error}");
        }
    }

    #[test]
    fn stats_count_by_kind() {
        let stats = AcceptStats::default();
        stats.add(AcceptErrorKind::Emfile);
        stats.add(AcceptErrorKind::Emfile);
        stats.add(AcceptErrorKind::Reset);
        assert_eq!(stats.get(AcceptErrorKind::Emfile), 2);
        assert_eq!(stats.get(AcceptErrorKind::Reset), 1);
        assert_eq!(stats.get(AcceptErrorKind::Enfile), 0);
    }
}
