//! What every connection of one server shares: the configuration, the subject index,
//! the client table and the totals that monitoring reports. The server (`server`) owns
//! it, connections (`client`) and lame duck mode (`lame_duck`) reach it through an
//! `Arc`; it does no I/O.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use nats_wire::direct::Sink;
use net::AcceptStats;
use rustc_hash::FxHashMap;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::peer::{ClientShared, Subscription, lock};
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
    pub refusing: AtomicBool,
    /// Every connection's task, TCP and in-process, so shutdown can wait for them.
    pub tasks: TaskTracker,
    pub next_cid: AtomicU64,
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

impl Shared {
    /// Registers a new connection (a direct one with its `sink`): `Ok` with its shared side, or `Err(None)` once the
    /// server takes no more clients (lame duck or shutdown: it is refused rather than
    /// missed by the close that follows), or `Err(Some(cid))` past `max_connections`.
    pub fn admit(
        &self,
        addr: SocketAddr,
        in_process: bool,
        sink: Option<Arc<dyn Sink>>,
    ) -> Result<Arc<ClientShared>, Option<u64>> {
        let cid = self.next_cid.fetch_add(1, Ordering::Relaxed);
        let mut clients = lock(&self.clients);
        if self.refusing.load(Ordering::Relaxed) {
            return Err(None);
        }
        if clients.len() >= self.config.max_connections {
            return Err(Some(cid));
        }
        let client = Arc::new(ClientShared::new(
            cid,
            addr,
            in_process,
            sink,
            self.config.max_pending,
            self.config
                .flow_control_pending
                .min(self.config.max_pending / 2),
        ));
        clients.insert(cid, client.clone());
        self.stats.total_connections.fetch_add(1, Ordering::Relaxed);
        Ok(client)
    }

    /// Takes no more clients from now on; returns those connected.
    pub fn stop_accepting(&self) -> Vec<Arc<ClientShared>> {
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

    /// Subscribes `subject` as `client`'s `sid`, in `queue` if given; `Err` with the
    /// `-ERR` text nats-server gives for an invalid subject or one past the limit. A sid
    /// already in use keeps its first subscription, as nats-server's does.
    pub fn subscribe(
        &self,
        client: &Arc<ClientShared>,
        subject: &[u8],
        queue: Option<&[u8]>,
        sid: &[u8],
    ) -> Result<(), &'static str> {
        if !nats_wire::subject::is_valid_subscribe(subject) {
            return Err("Invalid Subject");
        }
        let mut subs = lock(&client.subs);
        if subs.contains_key(sid) {
            return Ok(());
        }
        let max = self.config.max_subscriptions;
        if max > 0 && subs.len() >= max {
            return Err("maximum subscriptions exceeded");
        }
        let sid = Bytes::copy_from_slice(sid);
        let sub = Arc::new(Subscription {
            client: client.clone(),
            subject: Bytes::copy_from_slice(subject),
            queue: queue.map(Bytes::copy_from_slice),
            sid: sid.clone(),
            max: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        });
        self.index.insert(subject, sub.queue.as_ref(), sub.clone());
        subs.insert(sid, sub);
        Ok(())
    }

    /// Ends `client`'s subscription `sid` now, or once `max` messages in all were
    /// delivered on it.
    pub fn unsubscribe(&self, client: &ClientShared, sid: &[u8], max: Option<u64>) {
        let sub = lock(&client.subs).get(sid).cloned();
        let Some(sub) = sub else {
            return;
        };
        match max {
            // Stored before the count is read: see `Subscription::take_one`.
            Some(max) if max > 0 => {
                sub.max.store(max, Ordering::SeqCst);
                if sub.delivered.load(Ordering::SeqCst) >= max {
                    self.remove_sub(&sub);
                }
            }
            _ => self.remove_sub(&sub),
        }
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
pub fn new_server_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..22)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}
