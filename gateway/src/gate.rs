//! The gate: accepts WebSocket connections, runs a task per session, and routes the
//! workers' replies back to sessions.
//!
//! Every gate has ONE wildcard subscription, `<prefix>.gw.<gate>.>`, for all its
//! replies: a request's reply subject is `<prefix>.gw.<gate>.<sid>.<id>`, so a reply is
//! routed by parsing its subject — no per-request subscription and no global pending
//! map; each session keeps its own. The gate's own [bus connection](crate::bus) has one
//! reader for it and for the group and player subscriptions, which hands each message to
//! its sessions in the order the server sent them, so a reply never overtakes a push
//! that reached the gate before it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use dashmap::DashMap;
use metrics::Counter;
use net::{Acceptor, LogLimiter};
use proto::Message as _;
use proto::rpc::RpcResponse;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::MissedTickBehavior;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, Refusal};
use crate::auth::TokenCheck;
use crate::bus::{self, Bus, BusOptions, Dispatch, Incoming, Reply, Target};
use crate::config::{GateConfig, WS_READ_BUFFER, WS_WRITE_BUFFER};
use crate::inbox::{SessionTx, ToSession, WorkerReply};
use crate::labels::RouteLabels;
use crate::presence::{Binding, Group};
use crate::schema::{self, Schemas};
use crate::session;
use crate::tls::Tls;
use crate::upgrade::{Origins, UpgradePolicy};

/// State all sessions of one gate share.
pub(crate) struct GateShared {
    pub config: GateConfig,
    pub id: String,
    pub bus: Arc<Bus>,
    /// Whether the bus connection is up; [`Gate::new`] waits for the first.
    bus_up: tokio::sync::watch::Sender<bool>,
    /// Bind probes awaiting an answer, by the id in their reply subject (sid 0).
    probes: std::sync::Mutex<rustc_hash::FxHashMap<u64, tokio::sync::oneshot::Sender<bool>>>,
    next_probe: AtomicU64,
    pub sessions: DashMap<u64, SessionTx>,
    /// Requests of all sessions awaiting workers, against `max_gate_in_flight`.
    pub in_flight: AtomicUsize,
    /// Groups with members on this gate, by name.
    pub groups: DashMap<String, Group>,
    /// Players bound on this gate, by uid.
    pub users: DashMap<String, Binding>,
    pub token_check: Arc<dyn TokenCheck>,
    /// Message types the workers announced, for JSON sessions' typed bodies.
    pub schemas: Schemas,
    /// The routes the request metrics name (bounded: a client picks the route).
    pub route_labels: RouteLabels,
    pub ws_config: WebSocketConfig,
    /// What a new connection's HTTP request may be and ask for.
    pub upgrade: UpgradePolicy,
    /// Cancelled when the gate starts shutting down: sessions drain and close.
    pub draining: CancellationToken,
    /// The bus connection's task, for [`Gate::run`] to wait for.
    tasks: TaskTracker,
    pub rejected: Rejected,
    /// Connections held, from accept to close, against `max_sessions` and per IP.
    pub admission: Admission,
    next_sid: AtomicU64,
}

/// `gate_rejected_total` for the refusals a request can meet, registered once: a gate
/// shedding load counts one per request, and a registry lookup each time would add to
/// the load it sheds.
pub(crate) struct Rejected {
    pub route: Counter,
    pub duplicate_id: Counter,
    pub in_flight: Counter,
    pub rate: Counter,
    pub gate_in_flight: Counter,
    pub bus: Counter,
    pub bus_backlog: Counter,
    pub body: Counter,
    pub draining: Counter,
}

impl Rejected {
    fn new() -> Self {
        let reason =
            |reason: &'static str| metrics::counter!("gate_rejected_total", "reason" => reason);
        Rejected {
            route: reason("route"),
            duplicate_id: reason("duplicate_id"),
            in_flight: reason("in_flight"),
            rate: reason("rate"),
            gate_in_flight: reason("gate_in_flight"),
            bus: reason("bus"),
            bus_backlog: reason("bus_backlog"),
            body: reason("body"),
            draining: reason("draining"),
        }
    }
}

/// How often `gate_in_flight` is set from the gate's in-flight count. Sampled rather
/// than moved per request: every session updating one shared gauge twice per request
/// cost more than the rest of the gate's bookkeeping.
const IN_FLIGHT_SAMPLE: Duration = Duration::from_millis(500);

impl GateShared {
    pub fn next_sid(&self) -> u64 {
        self.next_sid.fetch_add(1, Ordering::Relaxed)
    }
}

/// A handle to a running gate. Cheap to clone.
#[derive(Clone)]
pub struct Gate(Arc<GateShared>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("id", &self.0.id).finish()
    }
}

impl Gate {
    /// Connects this gate to the bus (`bus`: servers, credentials, TLS), subscribing its
    /// reply subject and the schema announcements; returns once the first connection is
    /// up (retrying with backoff until then: wrap it in a timeout to bound the wait).
    pub async fn new(
        bus: BusOptions,
        mut config: GateConfig,
        token_check: Arc<dyn TokenCheck>,
    ) -> anyhow::Result<Gate> {
        if config.gate_id.is_empty() {
            config.gate_id = format!("g{:08x}", fastrand::u32(..));
        }
        crate::route::check_token(&config.gate_id).context("invalid gate id")?;
        crate::route::check_token(&config.prefix).context("invalid subject prefix")?;
        anyhow::ensure!(
            bus.dialer.is_some() || !bus.urls.is_empty(),
            "no NATS URL given"
        );
        for url in &bus.urls {
            if bus.dialer.is_none() {
                bus::check_url(url).context("invalid NATS URL")?;
            }
        }
        let replies = format!("{}.gw.{}.>", config.prefix, config.gate_id);
        let bus = Bus::new(bus, replies, config.max_bus_pending);
        bus.subscribe(
            proto::schema::announcements(&config.prefix),
            Target::Schemas,
        );
        let admission = Admission::new(config.max_sessions, config.max_connections_per_ip);
        let ws_config = WebSocketConfig::default()
            .read_buffer_size(WS_READ_BUFFER)
            .write_buffer_size(WS_WRITE_BUFFER)
            .max_write_buffer_size(WS_WRITE_BUFFER + 2 * config.max_frame)
            .max_frame_size(Some(config.max_frame))
            .max_message_size(Some(config.max_frame));
        let upgrade = UpgradePolicy {
            timeout: config.upgrade_timeout,
            max_bytes: config.max_upgrade_bytes,
            pages: !config.no_web,
            origins: Origins::from_list(&config.allowed_origins),
        };
        let shared = Arc::new(GateShared {
            id: config.gate_id.clone(),
            config,
            bus,
            bus_up: tokio::sync::watch::Sender::new(false),
            probes: Default::default(),
            next_probe: AtomicU64::new(1),
            sessions: DashMap::new(),
            in_flight: AtomicUsize::new(0),
            groups: DashMap::new(),
            users: DashMap::new(),
            token_check,
            schemas: Schemas::default(),
            route_labels: RouteLabels::default(),
            ws_config,
            upgrade,
            draining: CancellationToken::new(),
            tasks: TaskTracker::new(),
            rejected: Rejected::new(),
            admission,
            next_sid: AtomicU64::new(1),
        });
        let dispatch: Arc<dyn Dispatch> = shared.clone();
        shared.tasks.spawn(bus::run(shared.bus.clone(), dispatch));
        shared.tasks.close();
        let mut up = shared.bus_up.subscribe();
        up.wait_for(|up| *up)
            .await
            .context("the gate stopped before its bus connection was up")?;
        Ok(Gate(shared))
    }

    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Waits until the workers of every service in `services` have announced their
    /// message types to this gate, or `deadline` passes; returns whether they did. Until
    /// then, JSON and pomelo clients of those services get their bodies as strings and
    /// pomelo handshakes a dictionary without their routes.
    pub async fn wait_for_schemas(&self, services: &[&str], deadline: Duration) -> bool {
        tokio::time::timeout(deadline, self.0.schemas.wait_for(services))
            .await
            .is_ok()
    }

    /// Sessions open now.
    pub fn session_count(&self) -> usize {
        self.0.sessions.len()
    }

    /// Requests of all sessions awaiting their workers now (against
    /// `--max-gate-in-flight`).
    pub fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::Relaxed)
    }

    /// Connections held now: sessions and connections still upgrading or handshaking.
    pub fn connection_count(&self) -> usize {
        self.0.admission.connections()
    }

    /// Groups this gate holds a subscription for (some local session is a member).
    pub fn group_count(&self) -> usize {
        self.0.group_count()
    }

    /// Players bound on this gate (each holds a subscription to its user subject).
    pub fn user_count(&self) -> usize {
        self.0.user_count()
    }

    /// Serves WebSocket clients on `listener` until `shutdown` is cancelled; then stops
    /// accepting, lets sessions answer what is in flight (within the grace period), and
    /// closes them with a reason. Once they are gone the bus connection closes: a gate
    /// serves once.
    pub async fn run(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        self.serve(vec![Listener::plain(listener)], shutdown).await
    }

    /// [`Gate::run`] on several listeners at once (plain `ws://` and TLS `wss://` side
    /// by side): one accept loop each, one shutdown for all.
    pub async fn serve(
        &self,
        listeners: Vec<Listener>,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let sessions = TaskTracker::new();
        let accepting = TaskTracker::new();
        for listener in listeners {
            let (gate, sessions, shutdown) = (self.0.clone(), sessions.clone(), shutdown.clone());
            accepting.spawn(accept_loop(gate, listener, sessions, shutdown));
        }
        accepting.close();
        let in_flight = metrics::gauge!("gate_in_flight");
        let mut sample = tokio::time::interval(IN_FLIGHT_SAMPLE);
        sample.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = sample.tick() => {
                    in_flight.set(self.0.in_flight.load(Ordering::Relaxed) as f64);
                }
                () = shutdown.cancelled() => break,
            }
        }
        accepting.wait().await;
        self.0.draining.cancel();
        sessions.close();
        sessions.wait().await;
        // Only now: draining sessions still wait for their replies.
        self.0.bus.stop();
        self.0.tasks.wait().await;
        Ok(())
    }
}

/// A socket the gate accepts on: plain (`ws://`) or TLS (`wss://`).
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Tls>,
}

impl Listener {
    pub fn plain(tcp: TcpListener) -> Listener {
        Listener { tcp, tls: None }
    }

    /// Every connection does its TLS handshake first, with the certificate `tls`
    /// holds when it is accepted.
    pub fn tls(tcp: TcpListener, tls: Tls) -> Listener {
        Listener {
            tcp,
            tls: Some(tls),
        }
    }
}

/// Accepts on one listener until `shutdown`; sessions go on `sessions`.
async fn accept_loop(
    gate: Arc<GateShared>,
    listener: Listener,
    sessions: TaskTracker,
    shutdown: CancellationToken,
) {
    let name = if listener.tls.is_some() {
        "gate-tls"
    } else {
        "gate"
    };
    let mut acceptor = Acceptor::new(listener.tcp, name);
    loop {
        let (stream, addr) = tokio::select! {
            a = acceptor.accept() => a,
            () = shutdown.cancelled() => return,
        };
        let ticket = match gate.admission.admit(addr.ip()) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                refuse(stream, addr, refusal);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match &listener.tls {
            None => {
                sessions.spawn(session::run(gate.clone(), stream, addr, ticket));
            }
            Some(tls) => {
                let (gate, tls) = (gate.clone(), tls.acceptor());
                sessions.spawn(async move {
                    // The TLS handshake is part of the upgrade: the same deadline holds it.
                    let handshake = tokio::time::timeout(gate.upgrade.timeout, tls.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => session::run(gate, stream, addr, ticket).await,
                        Ok(Err(e)) => {
                            metrics::counter!("gate_upgrade_failed_total", "reason" => "tls")
                                .increment(1);
                            tracing::debug!(%addr, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            metrics::counter!("gate_upgrade_failed_total", "reason" => "timeout")
                                .increment(1);
                        }
                    }
                });
            }
        }
    }
}

/// Refusals at accept, one line a second at most: a flood is what they refuse.
static REFUSED_LOG: LogLimiter = LogLimiter::per_second();

/// Answers a refused connection and closes it, in the accept loop: no task, no wait.
/// On a fresh socket the short answer fits the empty send buffer, so `try_write` takes
/// it whole.
fn refuse(stream: TcpStream, addr: std::net::SocketAddr, refusal: Refusal) {
    metrics::counter!("gate_rejected_total", "reason" => refusal.label()).increment(1);
    if let Some(tally) = REFUSED_LOG.check() {
        tracing::warn!(%addr, reason = refusal.label(), "connection refused{tally}");
    }
    // What the client already sent is read first where it has arrived: closing a socket
    // with unread input resets it, and the client would see a reset, not the status.
    let _ = stream.try_read(&mut [0u8; 1024]);
    let _ = stream.try_write(refusal.response());
}

impl Dispatch for GateShared {
    fn deliver(&self, target: &Target, msg: Incoming<'_>) {
        match target {
            Target::Replies => self.route_reply(msg.subject, msg.status, msg.payload),
            Target::Group(group) => self.deliver_to_group(group, msg.payload),
            Target::User(uid) => self.deliver_to_user(uid, msg.payload, msg.reply),
            Target::Schemas => schema::on_announcement(&self.schemas, msg.payload),
        }
    }

    fn connected(&self) {
        // Workers that started before this gate, or announced while it was away,
        // announce again.
        let ask = proto::schema::ask_subject(&self.config.prefix);
        let _ = self.bus.publish_bytes(&ask, Reply::None, &[]);
        self.bus_up.send_replace(true);
    }

    fn lost(&self) {
        self.bus_up.send_replace(false);
        for session in self.sessions.iter() {
            // A full queue is a session behind on pushes: it closes as too slow.
            session.offer(ToSession::BusLost);
        }
    }
}

/// Bind probes: sid 0 of the reply subject is the gate's own.
const PROBE_SID: u64 = 0;

impl GateShared {
    /// Hands a reply to its session by the `<sid>.<id>` at the end of its subject.
    fn route_reply(&self, subject: &[u8], status: Option<u16>, payload: Bytes) {
        let skip = self.config.prefix.len() + ".gw.".len() + self.id.len() + 1;
        let Some((sid, id)) = subject
            .get(skip..)
            .and_then(|tail| std::str::from_utf8(tail).ok())
            .and_then(parse_sid_id)
        else {
            return;
        };
        let no_responders = status == Some(NO_RESPONDERS);
        if sid == PROBE_SID {
            let waiter = self.probes.lock().ok().and_then(|mut p| p.remove(&id));
            if let Some(waiter) = waiter {
                let _ = waiter.send(!no_responders);
            }
            return;
        }
        let reply = if no_responders {
            WorkerReply::NoResponders
        } else {
            RpcResponse::decode(payload).map_or(WorkerReply::Invalid, WorkerReply::Response)
        };
        // Sent under the map's read guard: no clone of the sender per reply.
        let Some(session) = self.sessions.get(&sid) else {
            // The session closed while its request was out.
            return;
        };
        // The queue has room for max_in_flight answers plus outbound_queue pushes; it is
        // full only when pushes flood a session that does not keep up. The reader must
        // not wait on one session: the reply is dropped and counted, and the session
        // closes as too slow.
        if !session.offer(ToSession::Reply { id, reply }) && !session.is_closed() {
            metrics::counter!("gate_replies_dropped_total").increment(1);
        }
    }

    /// Asks `subject` whether anyone holds it: `true` when an answer comes within
    /// `timeout`; no responders, silence or no bus mean no.
    pub(crate) async fn probe(&self, subject: &str, payload: &[u8], timeout: Duration) -> bool {
        let id = self.next_probe.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Ok(mut probes) = self.probes.lock() {
            probes.insert(id, tx);
        }
        let prefix = format!("{}.gw.{}.{PROBE_SID}.", self.config.prefix, self.id);
        let sent = self.bus.publish_bytes(
            subject,
            Reply::Request {
                prefix: &prefix,
                id,
            },
            payload,
        );
        let held = sent.is_ok() && matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(true)));
        if let Ok(mut probes) = self.probes.lock() {
            probes.remove(&id);
        }
        held
    }
}

/// The status of a "no responders" answer.
const NO_RESPONDERS: u16 = 503;

fn parse_sid_id(tail: &str) -> Option<(u64, u64)> {
    let (sid, id) = tail.split_once('.')?;
    Some((sid.parse().ok()?, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_subject_tail_parses() {
        assert_eq!(parse_sid_id("12.7"), Some((12, 7)));
        assert_eq!(parse_sid_id("12"), None);
        assert_eq!(parse_sid_id("x.7"), None);
        assert_eq!(parse_sid_id("1.2.3"), None);
    }
}
