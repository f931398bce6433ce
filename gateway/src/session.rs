//! One client session: a task that owns the WebSocket, forwards requests to the bus,
//! answers them when replies (or timeouts) come, and enforces the per-session limits.
//!
//! A request always gets an answer: the worker's, or the gate's own 400, 404, 408, 429
//! or 503. Frames towards the client go through a bounded [`outbox::Outbox`] that the
//! loop writes as the socket takes them and never awaits: a client that stops reading
//! cannot stop the session's timers (heartbeat, request timeouts, token expiry, drain),
//! and one whose socket takes nothing for `--write-timeout-ms`, or whose queue fills,
//! is closed as too slow ("Slow clients" in docs/gateway.md). Everything ready is
//! written together and flushed once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, SinkExt, StreamExt};
use proto::client::{self, packet::Kind};
use proto::code;
use rustc_hash::FxHashMap;
use std::future::poll_fn;
use std::task::Poll;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::bus::{BusError, Reply};
use crate::codec::{Codec, Decoded};
use crate::forward::{Request, SessionWire};
use crate::gate::GateShared;
use crate::limits::TokenBucket;
use crate::route;

mod cache;
mod effects;
mod opening;
mod outbox;

use crate::inbox::{Inbox, ToSession, WorkerReply};
use cache::Cache;
use outbox::Outbox;

use opening::TOKEN_EXPIRED;
pub(crate) use opening::run;

/// One owner reads and writes: the session never does both at once, so the socket is not
/// split (a split puts a lock in front of every read and write).
type Ws<S> = WebSocketStream<S>;

/// What a session runs on: a TCP socket, or TLS over one.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Frames handled after the first in one turn, before the answers are flushed; bounds
/// how long replies already queued for the session wait behind a fast reader.
const READ_BATCH: usize = 64;

/// Why a session ends, sent to the client in the close frame.
struct Closing {
    code: CloseCode,
    reason: &'static str,
}

impl Closing {
    const fn new(code: CloseCode, reason: &'static str) -> Self {
        Closing { code, reason }
    }
}

/// The gate is draining: requests are forwarded until `forward_until` (the first half
/// of the grace), answered 503 `gate draining` after it (never forwarded, so a client
/// may send them elsewhere), and the session closes at `ends`.
#[derive(Clone, Copy)]
struct Drain {
    forward_until: Instant,
    ends: Instant,
}

/// A request awaiting its worker.
struct Pending {
    received: Instant,
    route: Arc<str>,
}

struct Session<S> {
    gate: Arc<GateShared>,
    sid: u64,
    /// The protocol the client spoke in its handshake.
    codec: Codec,
    timing: bool,
    /// Every request is serial (the handshake asked for it).
    serial: bool,
    /// The serial request awaiting its answer, and the serial requests queued behind it.
    serial_pending: Option<u64>,
    serial_queue: VecDeque<client::Request>,
    /// The session as requests carry it: uid and data.
    wire: SessionWire,
    /// When the player's signed token expires (a `Refresh` moves it).
    expires: Option<Instant>,
    /// `<prefix>.gw.<gate>.<sid>.`: a request's reply subject is this and its id.
    reply_prefix: String,
    /// Each route seen, as a label, and its publish subject.
    routes: Cache<Arc<str>, (Arc<str>, Arc<str>)>,
    /// While the gate drains: until when requests are still forwarded, and when the
    /// session closes.
    drain: Option<Drain>,
    groups: Vec<String>,
    ws: Ws<S>,
    /// Frames waiting for the socket.
    outbox: Outbox,
    /// The outbox was full: the session closes as too slow.
    overflow: bool,
    pending: FxHashMap<u64, Pending>,
    /// (deadline, id) in deadline order: every request has the same timeout.
    deadlines: VecDeque<(Instant, u64)>,
    bucket: TokenBucket,
    last_seen: Instant,
    /// `gate_request_duration_seconds` handles by (route, code).
    durations: Cache<(Arc<str>, u32), metrics::Histogram>,
}

/// Sends the close frame saying why, waiting at most `wait` for the socket to take it
/// (and what was queued before it): a client that stops reading must not hold the
/// session's task, or its socket, for longer.
async fn close<S: Io>(ws: &mut Ws<S>, closing: Closing, wait: Duration) {
    let frame = CloseFrame {
        code: closing.code,
        reason: closing.reason.into(),
    };
    let _ = tokio::time::timeout(wait, ws.send(Message::Close(Some(frame)))).await;
}

/// Closes a session whose client does not take what is sent to it.
const fn too_slow() -> Closing {
    Closing::new(CloseCode::Policy, TOO_SLOW)
}

/// The close reason of a session closed as too slow.
const TOO_SLOW: &str = "too slow";

/// Closes a connection whose client sent a frame WebSocket itself refuses.
fn frame_error(e: &tokio_tungstenite::tungstenite::Error) -> Closing {
    use tokio_tungstenite::tungstenite::Error as WsError;
    if let WsError::Capacity(_) = e {
        metrics::counter!("gate_rejected_total", "reason" => "frame_size").increment(1);
        return Closing::new(CloseCode::Size, "frame too large");
    }
    Closing::new(CloseCode::Protocol, "websocket error")
}

/// Closes a session whose client sent what its protocol cannot mean.
fn invalid(reason: &'static str) -> Closing {
    metrics::counter!("gate_rejected_total", "reason" => "invalid_packet").increment(1);
    Closing::new(CloseCode::Invalid, reason)
}

fn micros(d: Duration) -> u32 {
    d.as_micros().try_into().unwrap_or(u32::MAX)
}

impl<S: Io> Session<S> {
    async fn serve(&mut self, inbox: &mut Inbox) -> Closing {
        let heartbeat = self.codec.heartbeat(self.gate.config.heartbeat);
        let write_timeout = self.gate.config.write_timeout;
        let silence = sleep_until(self.last_seen + 2 * heartbeat);
        tokio::pin!(silence);
        let expiry = sleep_until(Instant::now() + self.gate.config.request_timeout);
        tokio::pin!(expiry);
        // A child of the gate's token, registered with once: the gate's own token has
        // one waiter list for every session, and a fresh `cancelled()` each turn locked
        // it twice per turn, from both cores (polling a registered waiter still locks
        // its list, so each session waits on a list of its own).
        let draining = self.gate.draining.child_token();
        let drain = draining.cancelled();
        tokio::pin!(drain);
        let overflowed = inbox.overflowed();
        tokio::pin!(overflowed);
        let token_expiry = sleep_until(self.expires.unwrap_or_else(Instant::now));
        tokio::pin!(token_expiry);
        let drain_end = sleep_until(Instant::now());
        tokio::pin!(drain_end);
        // Armed while output waits; checked lazily, like the heartbeat.
        let write_deadline = sleep_until(Instant::now());
        tokio::pin!(write_deadline);
        let mut write_armed = false;
        loop {
            if let Some(&(deadline, _)) = self.deadlines.front() {
                expiry.as_mut().reset(deadline);
            }
            match self.outbox.waiting_since() {
                Some(since) if !write_armed => {
                    write_deadline.as_mut().reset(since + write_timeout);
                    write_armed = true;
                }
                None => write_armed = false,
                Some(_) => {}
            }
            tokio::select! {
                frame = poll_fn(|cx| self.poll_socket(cx)) => {
                    let Some(frame) = frame else {
                        break Closing::new(CloseCode::Away, "write failed");
                    };
                    // One reading of the clock for the frames read together.
                    let now = Instant::now();
                    if let Err(closing) = self.on_frame(frame, now) {
                        break closing;
                    }
                    // Coalesce: frames the socket already holds are answered with the
                    // same flush, so a client that is ahead of the gate (or a gate
                    // shedding load) costs one write per batch, not one per frame.
                    if let Err(closing) = self.on_ready_frames(now) {
                        break closing;
                    }
                }
                Some(msg) = inbox.rx.recv() => {
                    if let Some(closing) = self.on_message(msg).await {
                        break closing;
                    }
                }
                () = &mut overflowed => break too_slow(),
                () = &mut write_deadline, if write_armed => {
                    match self.outbox.waiting_since() {
                        Some(since) if since + write_timeout <= Instant::now() => {
                            break too_slow();
                        }
                        Some(since) => write_deadline.as_mut().reset(since + write_timeout),
                        None => write_armed = false,
                    }
                }
                () = &mut expiry, if !self.deadlines.is_empty() => self.expire(),
                () = &mut silence => {
                    // Checked lazily so a busy client costs no timer reset per frame.
                    let due = self.last_seen + 2 * heartbeat;
                    if due <= Instant::now() {
                        break Closing::new(CloseCode::Policy, "heartbeat missed");
                    }
                    silence.as_mut().reset(due);
                }
                () = &mut drain, if self.drain.is_none() => {
                    self.begin_drain();
                    let ends = self.drain.map_or_else(Instant::now, |d| d.ends);
                    drain_end.as_mut().reset(ends);
                }
                () = &mut drain_end, if self.drain.is_some() => break self.end_drain(),
                () = &mut token_expiry, if self.expires.is_some() => {
                    // Checked lazily, like the heartbeat: a Refresh only moves `expires`.
                    match self.expires {
                        Some(due) if due > Instant::now() => token_expiry.as_mut().reset(due),
                        _ => {
                            self.send(Kind::Kick(client::Kick { reason: TOKEN_EXPIRED.into() }));
                            break Closing::new(CloseCode::Policy, TOKEN_EXPIRED);
                        }
                    }
                }
            }
            // Coalesce: everything else already waiting goes out with the same flush.
            let mut kicked = None;
            while let Ok(msg) = inbox.rx.try_recv() {
                kicked = self.on_message(msg).await;
                if kicked.is_some() {
                    break;
                }
            }
            if let Some(closing) = kicked {
                break closing;
            }
            if self.overflow {
                break too_slow();
            }
            // Written now, not on the next turn: polled once with this task's context,
            // so a socket that is full wakes it when it takes more.
            if let Poll::Ready(Err(_)) =
                poll_fn(|cx| Poll::Ready(self.outbox.poll_write(&mut self.ws, cx))).await
            {
                break Closing::new(CloseCode::Away, "write failed");
            }
        }
    }

    /// Writes what the socket takes, then reads: the next frame, or `None` when writing
    /// failed. Pending while neither can go on.
    fn poll_socket(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Option<Result<Message, tokio_tungstenite::tungstenite::Error>>>> {
        if let Poll::Ready(Err(_)) = self.outbox.poll_write(&mut self.ws, cx) {
            return Poll::Ready(None);
        }
        self.ws.poll_next_unpin(cx).map(Some)
    }

    /// The session ends: what is queued goes out, then the close frame, within the
    /// write deadline; a session closed as too slow gets one try at the close frame and
    /// no more. Pushes it never got are counted as dropped.
    async fn finish(&mut self, closing: Closing, inbox: &mut Inbox) {
        let wait = if closing.reason == TOO_SLOW {
            Duration::ZERO
        } else {
            self.gate.config.write_timeout
        };
        let flushed =
            tokio::time::timeout(wait, poll_fn(|cx| self.outbox.poll_write(&mut self.ws, cx)))
                .await;
        let dropped = self.outbox.queued_pushes() + inbox.queued_pushes();
        if dropped > 0 {
            metrics::counter!("gate_push_dropped_total").increment(dropped as u64);
        }
        let wait = if matches!(flushed, Ok(Ok(()))) {
            wait
        } else {
            Duration::ZERO
        };
        close(&mut self.ws, closing, wait).await;
    }

    /// Handles up to [`READ_BATCH`] more frames that are readable without waiting.
    fn on_ready_frames(&mut self, now: Instant) -> Result<(), Closing> {
        for _ in 0..READ_BATCH {
            let Some(frame) = self.ws.next().now_or_never() else {
                break;
            };
            self.on_frame(frame, now)?;
        }
        Ok(())
    }

    /// Handles one frame read at `now`.
    fn on_frame(
        &mut self,
        frame: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
        now: Instant,
    ) -> Result<(), Closing> {
        let frame = match frame {
            None => return Err(Closing::new(CloseCode::Normal, "client closed")),
            Some(Err(e)) => return Err(frame_error(&e)),
            Some(Ok(frame)) => frame,
        };
        self.last_seen = now;
        match frame {
            Message::Close(_) => return Err(Closing::new(CloseCode::Normal, "client closed")),
            Message::Ping(_) => {
                // WebSocket answers a ping itself; a flood still counts against the
                // session's rate, like heartbeats and requests.
                if !self.bucket.take(now) {
                    self.gate.rejected.rate.increment(1);
                }
                return Ok(());
            }
            Message::Pong(_) | Message::Frame(_) => return Ok(()),
            Message::Binary(_) | Message::Text(_) => {}
        }
        match self.codec.decode(&frame, &self.gate.schemas) {
            Decoded::Many(all) => {
                for decoded in all {
                    self.on_decoded(decoded, now)?;
                }
                Ok(())
            }
            decoded => self.on_decoded(decoded, now),
        }
    }

    /// Handles what one packet of a frame held.
    fn on_decoded(&mut self, decoded: Decoded, now: Instant) -> Result<(), Closing> {
        let packet = match decoded {
            Decoded::Packet(packet) => packet,
            Decoded::BadBody(resp) => {
                self.gate.rejected.body.increment(1);
                if resp.id != 0 {
                    self.send(Kind::Response(resp));
                }
                return Ok(());
            }
            Decoded::Invalid(reason) => return Err(invalid(reason)),
            Decoded::Many(_) => return Err(invalid("invalid packet")),
        };
        match packet.kind {
            Some(Kind::Request(req)) => {
                if req.id != 0 && self.is_serial(&req) {
                    if self.serial_pending.is_some() {
                        return self.queue_serial(req);
                    }
                    self.serial_pending = Some(req.id);
                }
                self.forward(req, now);
                Ok(())
            }
            Some(Kind::Heartbeat(_)) => {
                // Over the session's rate a heartbeat is not answered (the session is
                // alive all the same: it just sent a frame).
                if self.bucket.take(now) {
                    self.send(Kind::Heartbeat(client::Heartbeat {}));
                } else {
                    self.gate.rejected.rate.increment(1);
                }
                Ok(())
            }
            Some(Kind::Refresh(refresh)) => {
                let (code, message) = match self.refresh(&refresh.token) {
                    Ok(()) => (code::OK, String::new()),
                    Err(message) => (code::UNAUTHORIZED, message),
                };
                self.send(Kind::RefreshAck(client::RefreshAck { code, message }));
                Ok(())
            }
            Some(Kind::Handshake(_)) => Err(Closing::new(CloseCode::Policy, "handshake repeated")),
            Some(_) => Err(Closing::new(CloseCode::Policy, "packet not for the gate")),
            None => Err(invalid("invalid packet")),
        }
    }

    /// Takes a slot of the gate-wide in-flight budget, if one is free to this session:
    /// the last `--gate-reserve` slots are kept for light sessions (fewer than
    /// `--light-in-flight` requests in flight), so a few sessions flooding requests
    /// cannot take the whole budget from everyone else.
    fn admit(&self) -> bool {
        let config = &self.gate.config;
        let limit = if self.pending.len() < config.light_in_flight {
            config.max_gate_in_flight
        } else {
            config
                .max_gate_in_flight
                .saturating_sub(config.gate_reserve)
        };
        let taken = self.gate.in_flight.fetch_add(1, Ordering::Relaxed);
        if taken < limit {
            return true;
        }
        self.gate.in_flight.fetch_sub(1, Ordering::Relaxed);
        false
    }

    /// Returns `n` slots of the gate-wide in-flight budget.
    fn release(&self, n: usize) {
        if n > 0 {
            self.gate.in_flight.fetch_sub(n, Ordering::Relaxed);
        }
    }

    fn is_serial(&self, req: &client::Request) -> bool {
        self.serial || self.gate.config.serial_routes.contains(&req.route)
    }

    /// Holds a serial request until the one before it is answered.
    fn queue_serial(&mut self, req: client::Request) -> Result<(), Closing> {
        if self.pending.len() + self.serial_queue.len() >= self.gate.config.max_in_flight {
            self.gate.rejected.in_flight.increment(1);
            let resp = client::Response {
                id: req.id,
                code: code::RATE_LIMITED,
                message: "too many requests in flight".into(),
                ..Default::default()
            };
            self.send(Kind::Response(resp));
        } else {
            self.serial_queue.push_back(req);
        }
        Ok(())
    }

    /// Forwards a request, or answers it at once when the gate refuses it.
    fn forward(&mut self, req: client::Request, received: Instant) {
        let id = req.id;
        if let Some(resp) = self.on_request(req, received) {
            self.send(Kind::Response(resp));
            self.answered(id);
        }
    }

    /// Called once request `id` has its answer: lets the next serial request go.
    fn answered(&mut self, id: u64) {
        if self.serial_pending != Some(id) {
            return;
        }
        self.serial_pending = None;
        // A queued request the gate refuses at once is answered here, and the next goes.
        while self.serial_pending.is_none() {
            let Some(next) = self.serial_queue.pop_front() else {
                break;
            };
            let next_id = next.id;
            self.serial_pending = Some(next_id);
            if let Some(resp) = self.on_request(next, Instant::now()) {
                self.send(Kind::Response(resp));
                self.serial_pending = None;
            }
        }
    }

    /// Forwards a request; returns the answer when the gate answers it itself.
    fn on_request(&mut self, req: client::Request, received: Instant) -> Option<client::Response> {
        let notify = req.id == 0;
        let reject = |code: u32, message: &str, reason: &metrics::Counter| {
            reason.increment(1);
            (!notify).then(|| client::Response {
                id: req.id,
                code,
                message: message.into(),
                ..Default::default()
            })
        };
        if let Err(e) = route::parse(&req.route) {
            return reject(code::BAD_REQUEST, &e.to_string(), &self.gate.rejected.route);
        }
        if !notify && self.pending.contains_key(&req.id) {
            return reject(
                code::BAD_REQUEST,
                "request id already in flight",
                &self.gate.rejected.duplicate_id,
            );
        }
        if !notify && self.pending.len() >= self.gate.config.max_in_flight {
            return reject(
                code::RATE_LIMITED,
                "too many requests in flight",
                &self.gate.rejected.in_flight,
            );
        }
        if self.drain.is_some_and(|d| received >= d.forward_until) {
            return reject(
                code::OVERLOADED,
                code::GATE_DRAINING,
                &self.gate.rejected.draining,
            );
        }
        if !self.bucket.take(received) {
            return reject(code::RATE_LIMITED, "rate limited", &self.gate.rejected.rate);
        }
        if !notify && !self.admit() {
            return reject(
                code::OVERLOADED,
                "gate overloaded",
                &self.gate.rejected.gate_in_flight,
            );
        }
        let prefix = &self.gate.config.prefix;
        let (route, subject) = self.routes.get(
            |r| **r == *req.route,
            || {
                let route: Arc<str> = req.route.as_str().into();
                let subject: Arc<str> = format!("{prefix}.svc.{route}").into();
                (route.clone(), (route, subject))
            },
        );
        let request = Request {
            route: &req.route,
            body: &req.body,
            session: &self.wire,
            timing: self.timing,
        };
        let reply = if notify {
            Reply::None
        } else {
            Reply::Request {
                prefix: &self.reply_prefix,
                id: req.id,
            }
        };
        let sent = self
            .gate
            .bus
            .publish(&subject, reply, request.len(), |buf| request.put(buf));
        if let Err(e) = sent {
            if !notify {
                self.release(1);
            }
            let (message, reason) = match e {
                BusError::Disconnected => ("bus unavailable", &self.gate.rejected.bus),
                BusError::Backlogged => ("gate overloaded", &self.gate.rejected.bus_backlog),
            };
            return reject(code::OVERLOADED, message, reason);
        }
        if !notify {
            self.pending.insert(req.id, Pending { received, route });
            self.deadlines
                .push_back((received + self.gate.config.request_timeout, req.id));
        }
        None
    }

    /// Handles what the bus sent this session; `Some` when the session must close.
    async fn on_message(&mut self, msg: ToSession) -> Option<Closing> {
        let (id, reply) = match msg {
            ToSession::Push(frame) => {
                let msg = self.codec.encode_push(&frame, &self.gate.schemas);
                self.put(msg, true);
                return None;
            }
            ToSession::Kick(reason) => {
                self.send(Kind::Kick(client::Kick { reason }));
                return Some(Closing::new(CloseCode::Policy, "kicked"));
            }
            ToSession::BusLost => {
                self.answer_all_pending("bus connection lost");
                return None;
            }
            ToSession::Reply { id, reply } => (id, reply),
        };
        let Some(pending) = self.pending.remove(&id) else {
            // Already answered with 408.
            return None;
        };
        let mut resp = client::Response {
            id,
            ..Default::default()
        };
        let mut worker_time = (0, 0);
        let mut kick = None;
        match reply {
            WorkerReply::Response(r) => {
                resp.code = r.code;
                resp.body = r.body;
                resp.message = r.message;
                worker_time = (r.queue_us, r.handler_us);
                kick = self.apply(r.effects, &mut resp).await;
            }
            // A service that announced itself here exists: none of its workers is
            // reachable now (they are restarting, or the bus is), which is worth a retry.
            WorkerReply::NoResponders if self.gate.schemas.knows_service_of(&pending.route) => {
                resp.code = code::OVERLOADED;
                resp.message = "no worker available now".into();
            }
            WorkerReply::NoResponders => {
                resp.code = code::NOT_FOUND;
                resp.message = "no worker serves this route".into();
            }
            WorkerReply::Invalid => {
                resp.code = code::HANDLER_ERROR;
                resp.message = "worker sent an invalid response".into();
            }
        }
        self.answer(resp, &pending, worker_time);
        self.answered(id);
        let reason = kick?;
        self.send(Kind::Kick(client::Kick { reason }));
        Some(Closing::new(CloseCode::Policy, "kicked"))
    }

    /// Answers a forwarded request and records its round trip.
    fn answer(
        &mut self,
        mut resp: client::Response,
        pending: &Pending,
        (queue_us, handler_us): (u32, u32),
    ) {
        let elapsed = pending.received.elapsed();
        self.release(1);
        // A client cannot mint series: a route nobody serves is `unknown`, and past
        // MAX_ROUTE_LABELS distinct routes the rest are `other` (see `labels`).
        let route: &str = if resp.code == code::NOT_FOUND {
            "unknown"
        } else {
            &pending.route
        };
        let code = resp.code;
        let labels = &self.gate.route_labels;
        self.durations
            .get(
                |(r, c)| **r == *route && *c == code,
                || {
                    let label = labels.label(route);
                    let h = metrics::histogram!("gate_request_duration_seconds", "route" => label, "code" => code.to_string());
                    ((route.into(), code), h)
                },
            )
            .record(elapsed.as_secs_f64());
        if self.timing {
            resp.timing = Some(client::Timing {
                total_us: micros(elapsed),
                queue_us,
                handler_us,
            });
        }
        let frame = self
            .codec
            .encode_response(resp, &pending.route, &self.gate.schemas);
        self.put(frame, false);
    }

    /// Answers 408 for every request whose deadline passed.
    fn expire(&mut self) {
        let now = Instant::now();
        while let Some(&(deadline, id)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(pending) = self.pending.remove(&id) {
                metrics::counter!("gate_timeouts_total").increment(1);
                let resp = client::Response {
                    id,
                    code: code::TIMEOUT,
                    message: "no answer in time".into(),
                    ..Default::default()
                };
                self.answer(resp, &pending, (0, 0));
                self.answered(id);
            }
        }
    }

    /// The gate started draining: tell the client to move (before anything else goes
    /// out), and keep serving it for the grace period.
    fn begin_drain(&mut self) {
        let now = Instant::now();
        let grace = self.gate.config.shutdown_grace;
        self.drain = Some(Drain {
            forward_until: now + grace / 2,
            ends: now + grace,
        });
        let drain = client::Drain {
            reason: "gate shutting down".into(),
            grace_ms: grace.as_millis().try_into().unwrap_or(u32::MAX),
        };
        // Flushed with the rest of this turn, before anything else is read.
        self.send(Kind::Drain(drain));
    }

    /// The grace is over: whatever is still held is answered 503 and the session closes
    /// with a kick saying why.
    fn end_drain(&mut self) -> Closing {
        for req in std::mem::take(&mut self.serial_queue) {
            let resp = client::Response {
                id: req.id,
                code: code::OVERLOADED,
                message: code::GATE_DRAINING.into(),
                ..Default::default()
            };
            self.send(Kind::Response(resp));
        }
        self.answer_all_pending("gate shutting down");
        self.send(Kind::Kick(client::Kick {
            reason: "gate shutting down".into(),
        }));
        Closing::new(CloseCode::Away, "gate shutting down")
    }

    /// Answers every forwarded request still awaiting its worker 503 with `message`:
    /// no reply will come for it (the bus connection is gone, or the gate is).
    fn answer_all_pending(&mut self, message: &str) {
        let left: Vec<(u64, Pending)> = self.pending.drain().collect();
        for (id, pending) in left {
            let resp = client::Response {
                id,
                code: code::OVERLOADED,
                message: message.into(),
                ..Default::default()
            };
            self.answer(resp, &pending, (0, 0));
            self.answered(id);
        }
    }

    /// Queues a packet towards the client; the caller's loop writes it.
    fn send(&mut self, kind: Kind) {
        let frame = self.codec.encode(kind);
        self.put(frame, false);
    }

    /// Queues a frame towards the client; a full outbox closes the session as too slow
    /// at the end of the turn (nothing is dropped from a session that stays open).
    fn put(&mut self, frame: Message, push: bool) {
        if self.outbox.put(frame, push).is_err() {
            self.overflow = true;
            if push {
                metrics::counter!("gate_push_dropped_total").increment(1);
            }
        }
    }
}
