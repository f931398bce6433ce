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

mod blips;
mod cache;
mod closing;
mod context;
mod effects;
mod opening;
mod outbox;
mod replay;
mod requests;
mod resume;
#[cfg(test)]
mod tests;
mod timers;

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use proto::client::{self, packet::Kind};
use proto::code;
use rustc_hash::FxHashMap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::codec::{Codec, Decoded};
use crate::forward::SessionWire;
use crate::inbox::{Inbox, ToSession, WorkerReply};
use crate::lean_io::LeanIo;
use crate::limits::TokenBucket;
use cache::Cache;
use closing::{
    Closing, Ending, INVALID_PACKET, LINK_LOST, TOO_SLOW, WRITE_FAILED, close, frame_error,
    invalid, too_slow, unknown_field,
};
use outbox::Outbox;
use resume::Resume;

pub(crate) use context::Context;
pub(crate) use opening::run;
use requests::call_timing;

/// One owner reads and writes: the session never does both at once, so the socket is not
/// split (a split puts a lock in front of every read and write).
type Ws<S> = WebSocketStream<LeanIo<S>>;

/// What a session runs on: a TCP socket, or TLS over one.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Frames handled after the first in one turn, before the answers are flushed; bounds
/// how long replies already queued for the session wait behind a fast reader.
const READ_BATCH: usize = 64;

/// The gate is draining: requests are forwarded until `forward_until` (the first half
/// of the grace), answered 503 `gate draining` after it (never forwarded, so a client
/// may send them elsewhere), and the session closes at `ends`.
#[derive(Clone, Copy)]
struct Drain {
    forward_until: Instant,
    ends: Instant,
}

impl Pending {
    /// The bytes of body it holds (what a held request counts against `--max-held-bytes`).
    fn body_len(&self) -> usize {
        self.body.as_ref().map_or(0, bytes::Bytes::len)
    }

    /// It has been written to the bus. A large body is let go now: kept, it would keep
    /// its whole frame for as long as the request is in flight.
    fn mark_sent(&mut self) {
        self.sent = true;
        if self.body_len() > crate::config::MAX_RESENT_BODY {
            self.body = None;
        }
    }
}

/// A request awaiting its worker.
struct Pending {
    received: Instant,
    route: Arc<str>,
    /// Its publish subject, and its body (shared with the frame it came in), for sending
    /// it again when it reached nobody, or once the bus is back. A body over
    /// [`MAX_RESENT_BODY`](crate::config::MAX_RESENT_BODY) is let go once it is sent
    /// (`None`): such a request is not sent again.
    subject: Arc<str>,
    body: Option<bytes::Bytes>,
    /// A keyed service's key (empty for others), sent with it every time.
    key: String,
    /// Written to the bus at least once: a worker may have it, so after a lost
    /// connection it is never sent again (at most once). False while it is held.
    sent: bool,
    /// How often the bus answered it with "no responders" so far.
    resends: u32,
}

struct Session<S> {
    /// The gate, as a session sees it.
    gate: Arc<Context>,
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
    /// The last `seq` given to a keyed request of this session (see `publish`).
    keyed_seq: Cell<u64>,
    /// Each route seen, as a label, and its publish subject.
    routes: Cache<Arc<str>, (Arc<str>, Arc<str>)>,
    /// While the gate drains: until when requests are still forwarded, and when the
    /// session closes.
    drain: Option<Drain>,
    groups: Vec<String>,
    /// `None` once a resumable session is detached: its socket and buffers are let go
    /// (boxed, so a detached session's task does not keep their room).
    ws: Option<Box<Ws<S>>>,
    /// Frames waiting for the socket.
    outbox: Outbox,
    /// The outbox was full: the session closes as too slow.
    overflow: bool,
    pending: FxHashMap<u64, Pending>,
    /// (deadline, id) in deadline order: every request has the same timeout.
    deadlines: VecDeque<(Instant, u64)>,
    /// Requests waiting for the bus connection to come back, (until when, id) in order.
    held: VecDeque<(Instant, u64)>,
    /// Requests written to a bus connection that was then lost, waiting for their
    /// answer through the next one, (until when, id) in order.
    lost: VecDeque<(Instant, u64)>,
    /// Requests that reached no worker, (when to send again, id).
    resends: Vec<(Instant, u64)>,
    bucket: TokenBucket,
    last_seen: Instant,
    /// `gate_request_duration_seconds` handles by (route, code).
    durations: Cache<(Arc<str>, u32), metrics::Histogram>,
    /// A resumable session's numbered frames, and its resume's state (boxed: most
    /// sessions have none).
    resume: Option<Box<Resume>>,
}

impl<S: Io> Session<S> {
    async fn serve(&mut self, inbox: &mut Inbox) -> Closing {
        let mut checks = self.checks();
        // Every deadline of the session, behind one timer (see `timers`).
        let timer = sleep_until(Instant::now());
        tokio::pin!(timer);
        // A child of the gate's token, registered with once: the gate's own token has
        // one waiter list for every session, and a fresh `cancelled()` each turn locked
        // it twice per turn, from both cores (polling a registered waiter still locks
        // its list, so each session waits on a list of its own).
        let draining = self.gate.draining.child_token();
        let drain = draining.cancelled();
        tokio::pin!(drain);
        loop {
            let attached = self.attached();
            self.arm_write(&mut checks);
            let due = self.next_due(&checks);
            if let Some(due) = due
                && due != timer.deadline()
            {
                timer.as_mut().reset(due);
            }
            tokio::select! {
                frame = poll_fn(|cx| self.poll_socket(cx)), if attached => {
                    let Some(frame) = frame else {
                        break Closing::lost(CloseCode::Away, WRITE_FAILED);
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
                () = &mut timer, if due.is_some() => {
                    if let Some(closing) = self.on_due(&mut checks, Instant::now()) {
                        break closing;
                    }
                }
                // Its end is one of the deadlines from now on.
                () = &mut drain, if self.drain.is_none() => self.begin_drain(),
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
            if self.resume.as_ref().is_some_and(|r| r.broken) {
                break Closing::new(CloseCode::Away, "resume buffer full");
            }
            if !self.attached() {
                continue;
            }
            if self.overflow {
                break too_slow();
            }
            // Written now, not on the next turn: polled once with this task's context,
            // so a socket that is full wakes it when it takes more.
            if let Poll::Ready(Err(_)) = poll_fn(|cx| match self.ws.as_mut() {
                Some(ws) => Poll::Ready(self.outbox.poll_write(ws, cx)),
                None => Poll::Ready(Poll::Ready(Ok(()))),
            })
            .await
            {
                break Closing::lost(CloseCode::Away, WRITE_FAILED);
            }
        }
    }

    /// Writes what the socket takes, then reads: the next frame, or `None` when writing
    /// failed. Pending while neither can go on.
    fn poll_socket(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Option<Result<Message, tokio_tungstenite::tungstenite::Error>>>> {
        let Some(ws) = self.ws.as_mut() else {
            return Poll::Pending;
        };
        if let Poll::Ready(Err(_)) = self.outbox.poll_write(ws, cx) {
            return Poll::Ready(None);
        }
        ws.poll_next_unpin(cx).map(Some)
    }

    /// The session ends: what is queued goes out, then the close frame, within the
    /// write deadline; a session closed as too slow gets one try at the close frame and
    /// no more. Pushes it never got are counted as dropped.
    async fn finish(&mut self, closing: &Closing, inbox: &mut Inbox) {
        let wait = if closing.reason == TOO_SLOW {
            Duration::ZERO
        } else {
            self.gate.config.write_timeout
        };
        let flushed = tokio::time::timeout(
            wait,
            poll_fn(|cx| match self.ws.as_mut() {
                Some(ws) => self.outbox.poll_write(ws, cx),
                None => Poll::Ready(Ok(())),
            }),
        )
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
        if let Some(ws) = self.ws.as_mut() {
            close(ws, closing, wait).await;
        }
    }

    /// Handles up to [`READ_BATCH`] more frames that are readable without waiting.
    fn on_ready_frames(&mut self, now: Instant) -> Result<(), Closing> {
        for _ in 0..READ_BATCH {
            let Some(frame) = self.ws.as_mut().and_then(|ws| ws.next().now_or_never()) else {
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
            // The stream ended without a close frame: the link was cut.
            None => return Err(Closing::lost(CloseCode::Away, LINK_LOST)),
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
            Decoded::UnknownField(name) => return Err(unknown_field(&name)),
            Decoded::Many(_) => return Err(invalid(INVALID_PACKET)),
        };
        match packet.kind {
            Some(Kind::Request(req)) => {
                if req.id != 0 && self.resent(req.id) {
                    return Ok(());
                }
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
            Some(Kind::Ack(ack)) => {
                self.acked(ack.seq);
                Ok(())
            }
            Some(Kind::Handshake(_)) => Err(Closing::new(CloseCode::Policy, "handshake repeated")),
            Some(_) => Err(Closing::new(CloseCode::Policy, "packet not for the gate")),
            None => Err(invalid(INVALID_PACKET)),
        }
    }

    /// Handles what the bus sent this session; `Some` when the session must close.
    async fn on_message(&mut self, msg: ToSession) -> Option<Closing> {
        let (id, reply) = match msg {
            ToSession::Push(frame) => {
                let mut msg = self.codec.encode_push(&frame, &self.gate.schemas);
                if self.resume.is_some() {
                    let seq = self.next_seq();
                    msg = Codec::numbered_push(&msg, seq);
                    self.keep(&msg, 0);
                }
                self.put(msg, true);
                return None;
            }
            ToSession::TakeOver { request, reply } => {
                // Boxed: rare, and its state would otherwise sit in every session's task.
                return Box::pin(self.on_take_over(*request, &reply)).await;
            }
            ToSession::Marked => return self.on_marked(),
            // A push was dropped: resuming could not make up for it.
            ToSession::Overflowed => return Some(Closing::new(CloseCode::Policy, TOO_SLOW)),
            // Only a session arriving waits for one (`resume::arrive`).
            ToSession::Handed(_) => return None,
            ToSession::Kick(reason) => {
                self.send(Kind::Kick(client::Kick { reason }));
                return Some(Closing::new(CloseCode::Policy, "kicked"));
            }
            ToSession::BusLost => {
                self.bus_lost();
                return None;
            }
            ToSession::BusBack => {
                self.send_held();
                return None;
            }
            ToSession::Reply { id, reply } => match self.hold_reply(id, reply) {
                Ok(()) => return None,
                Err(reply) => (id, reply),
            },
        };
        if matches!(reply, WorkerReply::NoResponders) && self.resend_later(id) {
            return None;
        }
        let Some(pending) = self.pending.remove(&id) else {
            // Already answered with 408.
            return None;
        };
        let mut resp = client::Response {
            id,
            ..Default::default()
        };
        let mut worker_time = client::Timing::default();
        let mut kick = None;
        match reply {
            WorkerReply::Response(r) => {
                let r = *r;
                resp.code = r.code;
                resp.body = r.body;
                resp.message = r.message;
                worker_time = client::Timing {
                    queue_us: r.queue_us,
                    handler_us: r.handler_us,
                    // Only a request that asked for timing has any.
                    calls: r.calls.into_iter().map(call_timing).collect(),
                    ..client::Timing::default()
                };
                if resp.code == code::OK && !r.effects.is_empty() {
                    // Boxed, like every await a session makes rarely: its state would
                    // otherwise sit in every session's task, idle or not.
                    kick = Box::pin(self.apply(r.effects, &mut resp)).await;
                } else if !r.effects.is_empty() {
                    // Effects go with 200 only (docs/workers.md, "RpcResponse"): a
                    // request either succeeds with its effects or changes nothing.
                    metrics::counter!("gate_effects_ignored_total").increment(1);
                    tracing::debug!(
                        id,
                        code = resp.code,
                        effects = r.effects.len(),
                        "a non-200 answer's effects are ignored"
                    );
                }
            }
            // A service that announced itself here exists: none of its workers is
            // reachable now (they are restarting, or the bus is), which is worth a retry.
            WorkerReply::NoResponders if self.gate.schemas.knows_service_of(&pending.route) => {
                resp.code = code::UNAVAILABLE;
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
                code: code::UNAVAILABLE,
                message: code::GATE_DRAINING.into(),
                ..Default::default()
            };
            self.send(Kind::Response(resp));
        }
        self.answer_pending("gate shutting down", |_| true);
        self.send(Kind::Kick(client::Kick {
            reason: "gate shutting down".into(),
        }));
        Closing::new(CloseCode::Away, "gate shutting down")
    }

    /// Queues a packet towards the client; the caller's loop writes it. A resumable
    /// session numbers and keeps its answers.
    fn send(&mut self, mut kind: Kind) {
        let answers = match &mut kind {
            Kind::Response(resp) if self.resume.is_some() => {
                resp.seq = self.next_seq();
                Some(resp.id)
            }
            _ => None,
        };
        let frame = self.codec.encode(kind);
        if let Some(id) = answers {
            self.keep(&frame, id);
        }
        self.put(frame, false);
    }

    /// Queues a frame towards the client; a full outbox closes the session as too slow
    /// at the end of the turn (nothing is dropped from a session that stays open). A
    /// detached session has no socket: what it numbered waits in its replay, the rest
    /// is for a link that is gone.
    fn put(&mut self, frame: Message, push: bool) {
        if !self.attached() {
            return;
        }
        if self.outbox.put(frame, push).is_err() {
            self.overflow = true;
            if push {
                metrics::counter!("gate_push_dropped_total").increment(1);
            }
        }
    }
}
