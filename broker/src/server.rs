//! The server: accepts connections, owns the subject index and the client table, and
//! keeps the totals that monitoring reports.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime};

use net::{AcceptStats, Acceptor, LogLimiter};
use rustc_hash::FxHashMap;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{self, ClientShared, Subscription};
use crate::config::Config;
use crate::sublist::SubjectIndex;
use crate::tls::HandshakeFailures;

/// The version reported in INFO; clients require `x.y.z`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Server-wide totals, added to once per read batch rather than per message.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub in_msgs: AtomicU64,
    pub in_bytes: AtomicU64,
    pub out_msgs: AtomicU64,
    pub out_bytes: AtomicU64,
    pub slow_consumers: AtomicU64,
    pub total_connections: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Match results held in all connections' caches.
    pub cache_entries: AtomicU64,
}

impl Stats {
    /// Adds `n` unless it is zero, sparing a shared cache line the write.
    pub fn add(&self, counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Refusals past `max_connections`: a flood of them is one line a second.
static FULL_LOG: LogLimiter = LogLimiter::per_second();

/// State every connection of one server shares.
pub(crate) struct Shared {
    pub config: Config,
    pub id: String,
    pub name: String,
    pub index: SubjectIndex<Subscription>,
    pub clients: Mutex<FxHashMap<u64, Arc<ClientShared>>>,
    pub stats: Stats,
    pub started: SystemTime,
    pub started_at: Instant,
    /// Where clients connect, known once `run` has its listener.
    pub listen: OnceLock<SocketAddr>,
    /// Failed accepts by kind, for `/metrics`.
    pub accept_errors: Arc<AcceptStats>,
    pub tls_failures: HandshakeFailures,
    next_cid: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle to one broker. Cheap to clone.
#[derive(Clone)]
pub struct Server(pub(crate) Arc<Shared>);

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("id", &self.0.id).finish()
    }
}

/// The INFO a client sees first; the client's own id and address are filled per client.
#[derive(Serialize)]
struct Info<'a> {
    server_id: &'a str,
    server_name: &'a str,
    version: &'a str,
    proto: u8,
    go: &'a str,
    host: String,
    port: u16,
    headers: bool,
    max_payload: usize,
    client_id: u64,
    client_ip: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    auth_required: bool,
    /// The client must start TLS right after reading this INFO.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    tls_required: bool,
    /// ... and present a certificate signed by the server's CA.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    tls_verify: bool,
}

impl Server {
    pub fn new(config: Config) -> Server {
        let id = new_server_id();
        let name = config.server_name.clone().unwrap_or_else(|| id.clone());
        Server(Arc::new(Shared {
            config,
            id,
            name,
            index: SubjectIndex::default(),
            clients: Mutex::default(),
            stats: Stats::default(),
            started: SystemTime::now(),
            started_at: Instant::now(),
            listen: OnceLock::new(),
            accept_errors: Arc::default(),
            tls_failures: HandshakeFailures::default(),
            next_cid: AtomicU64::new(1),
        }))
    }

    /// The random id this server reports in INFO and `/varz`.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Serves clients on `listener` until `shutdown` is cancelled, then closes every
    /// connection (flushing what each has queued) and returns.
    pub async fn run(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let local = listener.local_addr()?;
        let _ = self.0.listen.set(local);
        // Out of file descriptors and the like: keep serving those we have, pausing
        // accepts instead of spinning on them.
        let mut listener = Acceptor::with_stats(listener, "broker", self.0.accept_errors.clone());
        let tracker = TaskTracker::new();
        loop {
            let (stream, addr) = tokio::select! {
                a = listener.accept() => a,
                () = shutdown.cancelled() => break,
            };
            let shared = self.0.clone();
            tracker.spawn(async move { shared.accept(stream, addr).await });
        }
        let clients: Vec<_> = lock(&self.0.clients).values().cloned().collect();
        for client in clients {
            client.close.cancel();
        }
        tracker.close();
        tracker.wait().await;
        Ok(())
    }
}

impl Shared {
    async fn accept(self: Arc<Self>, mut stream: TcpStream, addr: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let cid = self.next_cid.fetch_add(1, Ordering::Relaxed);
        let info = self.info_line(cid, addr);
        let client = {
            let mut clients = lock(&self.clients);
            if clients.len() >= self.config.max_connections {
                None
            } else {
                let client = Arc::new(ClientShared::new(
                    cid,
                    addr,
                    self.config.max_pending,
                    self.config
                        .flow_control_pending
                        .min(self.config.max_pending / 2),
                ));
                clients.insert(cid, client.clone());
                Some(client)
            }
        };
        let Some(client) = client else {
            if let Some(tally) = FULL_LOG.check() {
                tracing::warn!(%addr, "maximum connections exceeded{tally}");
            }
            let _ = stream.write_all(&info).await;
            let _ = stream
                .write_all(b"-ERR 'maximum connections exceeded'\r\n")
                .await;
            return;
        };
        self.stats.total_connections.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(cid, %addr, "client connected");
        client::serve(self.clone(), client, stream, info).await;
        tracing::debug!(cid, "client closed");
    }

    fn info_line(&self, client_id: u64, addr: SocketAddr) -> Vec<u8> {
        let listen = self.listen.get().copied();
        let info = Info {
            server_id: &self.id,
            server_name: &self.name,
            version: VERSION,
            proto: 1,
            go: "rust",
            host: listen.map_or_else(|| "0.0.0.0".into(), |a| a.ip().to_string()),
            port: listen.map_or(0, |a| a.port()),
            headers: true,
            max_payload: self.config.max_payload,
            client_id,
            client_ip: addr.ip().to_string(),
            auth_required: self.config.auth.required(),
            tls_required: self.config.tls.is_some(),
            tls_verify: self.config.tls.as_ref().is_some_and(|tls| tls.verify()),
        };
        let mut line = b"INFO ".to_vec();
        // Serialising plain fields cannot fail.
        line.extend_from_slice(&serde_json::to_vec(&info).unwrap_or_default());
        line.extend_from_slice(b"\r\n");
        line
    }

    /// Drops a subscription from the index and from its client.
    pub fn remove_sub(&self, sub: &Arc<Subscription>) {
        self.index.remove(&sub.subject, sub.queue.as_ref(), sub);
        lock(&sub.client.subs).remove(&sub.sid);
    }

    /// Forgets a closed client and everything it subscribed to.
    pub fn remove_client(&self, client: &Arc<ClientShared>) {
        lock(&self.clients).remove(&client.cid);
        let subs: Vec<_> = lock(&client.subs).drain().map(|(_, s)| s).collect();
        for sub in subs {
            self.index.remove(&sub.subject, sub.queue.as_ref(), &sub);
        }
    }

    /// A snapshot of the connected clients, for monitoring.
    pub fn clients(&self) -> Vec<Arc<ClientShared>> {
        lock(&self.clients).values().cloned().collect()
    }
}

/// 22 random alphanumerics, like nats-server's ids.
fn new_server_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..22)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}
