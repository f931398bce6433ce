//! The gate: accepts WebSocket connections, runs a task per session, and routes the
//! workers' replies back to sessions.
//!
//! Every gate has ONE wildcard subscription, `<prefix>.gw.<gate>.>`, for all its
//! replies: a request's reply subject is `<prefix>.gw.<gate>.<sid>.<id>`, so a reply is
//! routed by parsing its subject — no per-request subscription and no global pending
//! map; each session keeps its own. The gate's own [bus connection](bus) has one
//! reader for it and for the group and player subscriptions, which hands each message to
//! its sessions in the order the server sent them, so a reply never overtakes a push
//! that reached the gate before it.

mod dispatch;
mod shards;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bus::{Bus, BusOptions};
use net::{Acceptor, LogLimiter};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, Refusal};
use crate::auth::TokenCheck;
use crate::bus_target::Target;
use crate::config::GateConfig;
use crate::schema::Schemas;
use crate::session::{self, Context};
use crate::tls::Tls;
use dispatch::Router;

pub use shards::{ShardListeners, Shards};

/// What a gate holds beyond its sessions' context: the connections it admits and the
/// bus connection's task.
struct Inner {
    cx: Arc<Context>,
    /// Connections held, from accept to close, against `max_sessions` and per IP.
    admission: Admission,
    /// The bus connection's task, for [`Gate::run`] to wait for.
    tasks: TaskTracker,
}

/// How often `gate_in_flight` is set from the gate's in-flight count. Sampled rather
/// than moved per request: every session updating one shared gauge twice per request
/// cost more than the rest of the gate's bookkeeping.
const IN_FLIGHT_SAMPLE: Duration = Duration::from_millis(500);

/// A handle to a running gate. Cheap to clone.
#[derive(Clone)]
pub struct Gate(Arc<Inner>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("id", &self.id()).finish()
    }
}

impl Gate {
    /// Connects this gate to the bus (`bus`: servers, credentials, TLS), subscribing its
    /// reply subject and the schema announcements; returns once the first connection is
    /// up (retrying with backoff until then: wrap it in a timeout to bound the wait).
    pub async fn new(
        bus: BusOptions,
        config: GateConfig,
        token_check: Arc<dyn TokenCheck>,
    ) -> anyhow::Result<Gate> {
        let admission = Admission::new(config.max_sessions, config.max_connections_per_ip);
        Gate::admitting(bus, config, token_check, admission).await
    }

    /// [`Gate::new`] counting its connections in `admission`, which the shards of one
    /// process share.
    async fn admitting(
        bus: BusOptions,
        mut config: GateConfig,
        token_check: Arc<dyn TokenCheck>,
        admission: Admission,
    ) -> anyhow::Result<Gate> {
        if config.gate_id.is_empty() {
            config.gate_id = crate::config::random_gate_id();
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
        let bus = Bus::new(bus, replies, Target::Replies, config.max_bus_pending);
        bus.subscribe(
            proto::schema::announcements(&config.prefix),
            None,
            Target::Schemas,
        );
        bus.subscribe(
            crate::handover::subject(&config.prefix, &config.gate_id),
            None,
            Target::Resume,
        );
        let schemas = Arc::new(Schemas::default());
        let cx = Arc::new(Context::new(config, bus.clone(), schemas, token_check));
        let router = Router::new(&cx);
        let mut up = router.watch_bus();
        let tasks = TaskTracker::new();
        tasks.spawn(bus::run(bus, Arc::new(router)));
        tasks.close();
        up.wait_for(|up| *up)
            .await
            .context("the gate stopped before its bus connection was up")?;
        Ok(Gate(Arc::new(Inner {
            cx,
            admission,
            tasks,
        })))
    }

    pub fn id(&self) -> &str {
        &self.0.cx.config.gate_id
    }

    /// Waits until the workers of every service in `services` have announced their
    /// message types to this gate, or `deadline` passes; returns whether they did. Until
    /// then, JSON and pomelo clients of those services get their bodies as strings and
    /// pomelo handshakes a dictionary without their routes.
    pub async fn wait_for_schemas(&self, services: &[&str], deadline: Duration) -> bool {
        tokio::time::timeout(deadline, self.0.cx.schemas.wait_for(services))
            .await
            .is_ok()
    }

    /// Whether the gate's bus connection is up now (requests that arrive while it is
    /// not wait for it, up to `--bus-hold`).
    pub fn bus_connected(&self) -> bool {
        self.0.cx.bus.is_connected()
    }

    /// Sessions open now.
    pub fn session_count(&self) -> usize {
        self.0.cx.sessions.len()
    }

    /// Requests of all sessions awaiting their workers now (against
    /// `--max-gate-in-flight`).
    pub fn in_flight(&self) -> usize {
        self.0.cx.in_flight.taken()
    }

    /// Connections held now: sessions and connections still upgrading or handshaking.
    pub fn connection_count(&self) -> usize {
        self.0.admission.connections()
    }

    /// Groups this gate holds a subscription for (some local session is a member).
    pub fn group_count(&self) -> usize {
        self.0.cx.presence.group_count()
    }

    /// Players bound on this gate (each holds a subscription to its user subject).
    pub fn user_count(&self) -> usize {
        self.0.cx.presence.user_count()
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
        let mut in_flight = Share::of(metrics::gauge!("gate_in_flight"));
        let mut held = Share::of(metrics::gauge!("gate_requests_held"));
        let mut sample = tokio::time::interval(IN_FLIGHT_SAMPLE);
        sample.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = sample.tick() => {
                    in_flight.set(self.0.cx.in_flight.taken() as f64);
                    held.set(self.0.cx.held.count() as f64);
                }
                () = shutdown.cancelled() => break,
            }
        }
        accepting.wait().await;
        self.0.cx.draining.cancel();
        sessions.close();
        sessions.wait().await;
        // Only now: draining sessions still wait for their replies.
        self.0.cx.bus.stop();
        self.0.tasks.wait().await;
        Ok(())
    }
}

/// This gate's share of a process-wide gauge that the shards of a process sum into
/// (the `metrics` recorder is one per process): each moves the gauge by how much its
/// own value changed, so no shard overwrites another's. Alone, the gauge reads as set.
struct Share {
    gauge: metrics::Gauge,
    mine: f64,
}

impl Share {
    fn of(gauge: metrics::Gauge) -> Share {
        Share { gauge, mine: 0.0 }
    }

    fn set(&mut self, value: f64) {
        self.gauge.increment(value - self.mine);
        self.mine = value;
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
    gate: Arc<Inner>,
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
                sessions.spawn(session::run(gate.cx.clone(), stream, addr, ticket));
            }
            Some(tls) => {
                let (cx, tls) = (gate.cx.clone(), tls.acceptor());
                sessions.spawn(async move {
                    // The TLS handshake is part of the upgrade: the same deadline holds it.
                    let handshake = tokio::time::timeout(cx.upgrade.timeout, tls.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => session::run(cx, stream, addr, ticket).await,
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

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::Share;

    #[test]
    fn shards_sum_their_shares_of_a_gauge_instead_of_overwriting_it() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);
        let read = || {
            let values = snapshotter.snapshot().into_vec();
            match values.as_slice() {
                [(_, _, _, DebugValue::Gauge(v))] => v.into_inner(),
                other => panic!("one gauge expected: {other:?}"),
            }
        };
        let mut one = Share::of(metrics::gauge!("gate_in_flight"));
        let mut two = Share::of(metrics::gauge!("gate_in_flight"));
        one.set(3.0);
        two.set(5.0);
        one.set(1.0);
        // (A snapshot of this recorder resets what it read: one read, at the end.)
        assert_eq!(read(), 6.0);
    }
}
