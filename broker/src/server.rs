//! The server: accepts connections, owns the subject index and the client table, and
//! keeps the totals that monitoring reports.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime};

use net::{AcceptStats, Acceptor, LogLimiter};
use rustc_hash::FxHashMap;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{self, ClientShared, IN_PROCESS_ADDR, Subscription, Transport};
use crate::config::Config;
use crate::pipe::{self, InProcessStream};
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
    /// Cancelled once lame duck mode is asked for (see [`Server::lame_duck`]).
    pub lame_duck: CancellationToken,
    /// Set, under the `clients` lock, once the server takes no more clients (lame duck
    /// or shutdown): a connection still on its way in is refused rather than missed by
    /// the close that follows.
    refusing: AtomicBool,
    /// Every connection's task, TCP and in-process, so shutdown can wait for them.
    tasks: TaskTracker,
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
    /// Lame duck mode: the server is going away, reconnect elsewhere.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ldm: bool,
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
            lame_duck: CancellationToken::new(),
            refusing: AtomicBool::new(false),
            tasks: TaskTracker::new(),
            next_cid: AtomicU64::new(1),
        }))
    }

    /// The random id this server reports in INFO and `/varz`.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Serves clients on `listener` until `shutdown` is cancelled, then closes every
    /// connection (flushing what each has queued) and returns. Lame duck mode (see
    /// [`Server::lame_duck`]) also ends it, once its last client is closed.
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
        loop {
            let (stream, addr) = tokio::select! {
                a = listener.accept() => a,
                () = shutdown.cancelled() => break,
                () = self.0.lame_duck.cancelled() => break,
            };
            let _ = stream.set_nodelay(true);
            let shared = self.0.clone();
            self.0
                .tasks
                .spawn(async move { shared.accept(stream, addr).await });
        }
        // Closing the listener: new clients are refused from here on.
        drop(listener);
        let clients = self.0.stop_accepting();
        if self.0.lame_duck.is_cancelled() && !shutdown.is_cancelled() {
            tokio::select! {
                () = crate::lame_duck::run(&self.0, clients) => {}
                () = shutdown.cancelled() => {}
            }
        }
        for client in self.0.clients() {
            client.close.cancel();
        }
        self.0.tasks.close();
        self.0.tasks.wait().await;
        Ok(())
    }

    /// Enters lame duck mode, the way nats-server does on SIGUSR2: [`Server::run`] stops
    /// accepting, sends every connected client an INFO with `"ldm":true`, waits the
    /// grace period, closes the clients spread over the rest of the lame duck duration,
    /// and returns. Asking again while it runs changes nothing.
    pub fn lame_duck(&self) {
        self.0.lame_duck.cancel();
    }

    /// Whether lame duck mode was asked for.
    pub fn in_lame_duck(&self) -> bool {
        self.0.lame_duck.is_cancelled()
    }

    /// Connects a client from inside this process, without TCP: the returned stream is
    /// served exactly like an accepted TCP connection (INFO first, then CONNECT, PUB,
    /// HPUB, SUB, UNSUB, PING, queue groups, headers, no_responders, and every limit
    /// of [`Config`]), over an in-memory pipe that buffers
    /// [`Config::in_process_buffer`] bytes each way.
    ///
    /// Authentication applies as for TCP: with [`Config::auth`] set, CONNECT must carry
    /// the credentials. TLS does not: the bytes never leave the process, so the INFO of
    /// an in-process connection never asks for it, whatever [`Config::tls`] says. The
    /// connection counts against `max_connections`, shows in `/connz` with address
    /// `0.0.0.0:0`, and is closed by lame duck mode and shutdown like any other.
    ///
    /// Must be called within a tokio runtime (the connection is served on a task of its
    /// own). Once the server stopped taking clients (lame duck mode or shutdown), the
    /// stream is closed before INFO: reading it gives end-of-file at once.
    pub fn connect_in_process(&self) -> InProcessStream {
        // An empty pipe could never carry a byte: 0 counts as 1.
        let (client_end, server_end) = pipe::pair(self.0.config.in_process_buffer);
        let shared = self.0.clone();
        self.0
            .tasks
            .spawn(async move { shared.accept(server_end, IN_PROCESS_ADDR).await });
        client_end
    }
}

impl Shared {
    async fn accept<S: Transport>(self: Arc<Self>, mut stream: S, addr: SocketAddr) {
        let cid = self.next_cid.fetch_add(1, Ordering::Relaxed);
        let client = {
            let mut clients = lock(&self.clients);
            if self.refusing.load(Ordering::Relaxed) {
                tracing::debug!(%addr, "connection refused: the server takes no more clients");
                return;
            }
            if clients.len() >= self.config.max_connections {
                None
            } else {
                let client = Arc::new(ClientShared::new(
                    cid,
                    addr,
                    S::IN_PROCESS,
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
            let info = self.info_line(cid, addr, S::IN_PROCESS, false);
            let _ = stream.write_all(&info).await;
            let _ = stream
                .write_all(b"-ERR 'maximum connections exceeded'\r\n")
                .await;
            return;
        };
        self.stats.total_connections.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(cid, %addr, in_process = S::IN_PROCESS, "client connected");
        let info = self.info_line(cid, addr, S::IN_PROCESS, false);
        client::serve(self.clone(), client, stream, info).await;
        tracing::debug!(cid, "client closed");
    }

    /// Takes no more clients from now on; returns those connected.
    fn stop_accepting(&self) -> Vec<Arc<ClientShared>> {
        let clients = lock(&self.clients);
        self.refusing.store(true, Ordering::Relaxed);
        clients.values().cloned().collect()
    }

    /// The INFO line a client gets on connect; with `ldm`, the one lame duck mode sends.
    pub fn info_line(&self, cid: u64, addr: SocketAddr, in_process: bool, ldm: bool) -> Vec<u8> {
        let listen = self.listen.get().copied();
        let tls = self.config.tls.as_ref().filter(|_| !in_process);
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
            client_id: cid,
            client_ip: addr.ip().to_string(),
            auth_required: self.config.auth.required(),
            tls_required: tls.is_some(),
            tls_verify: tls.is_some_and(|tls| tls.verify()),
            ldm,
        };
        let mut line = b"INFO ".to_vec();
        // Serialising plain fields cannot fail.
        line.extend_from_slice(&serde_json::to_vec(&info).unwrap_or_default());
        line.extend_from_slice(b"\r\n");
        line
    }

    /// Drops a subscription from the index and from its client.
    /// Removes `sub`, unless it is gone already (a sid the client subscribed again is
    /// another subscription, and stays).
    pub fn remove_sub(&self, sub: &Arc<Subscription>) {
        {
            let mut subs = lock(&sub.client.subs);
            if !subs.get(&sub.sid).is_some_and(|s| Arc::ptr_eq(s, sub)) {
                return;
            }
            subs.remove(&sub.sid);
        }
        self.index.remove(&sub.subject, sub.queue.as_ref(), sub);
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
