//! One NATS client connection, spoken with the broker's protocol codec ([`nats_wire`]),
//! built for the gate's request path; generic over what a subscription's messages are
//! for, so workers reach an embedded broker in process through it too.
//!
//! # Why not a general client
//!
//! Through a general client, a request crossed three tasks (session -> the client's
//! connection task -> a router task -> session) and every crossing was a wake-up. Here:
//!
//! - **Out**: a session appends its `PUB` straight into one outbound buffer under a
//!   short lock ([`Bus::publish`]); the connection's writer takes the whole buffer and
//!   writes it with one call, so a burst of requests from many sessions is one syscall.
//!   Woken by a burst's first publish, the writer yields once before it takes the
//!   buffer: the other sessions the same poll of the sockets made ready publish first
//!   (tokio would otherwise run the writer right after the session that woke it, a
//!   write per request), and the broker and the worker downstream wake once per burst.
//!   The buffer has a byte limit (`--max-bus-pending`): beyond it a request is refused
//!   at once (503), never queued without bound.
//! - **In**: one reader task parses what the server sends and hands each message to its
//!   session's queue itself ([`Dispatch`]). Because one reader sees every `MSG` (replies,
//!   group broadcasts, player commands) in the order the server sent them, nothing that
//!   reached the gate before a reply can be overtaken by it: that order is the reading
//!   order, with nothing to reconstruct.
//!
//! # Subscriptions and reconnects
//!
//! Every subscription is recorded with its sid, its queue group and what its messages
//! are for (its target, a `T` of the user's). A connection starts by sending them all,
//! before any publish can reach it; so a reconnect (after a lost connection, or a
//! lame-duck notice from the server) resubscribes everything, and a subscription that
//! ends after a count ([`Bus::unsubscribe_after`]) asks only for what remains of it.
//! Servers are tried in turn with jittered exponential backoff between rounds
//! ([`backoff`]). While no connection is up, publishing fails at once (the session
//! answers 503), and the [`Dispatch`] hears of every loss so that requests in flight on
//! the lost connection are answered at once rather than time out.

mod backoff;
mod connect;
mod direct;
mod options;
mod outbound;
mod pairing;
mod pings;
mod run;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use nats_wire::direct::Link;
use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

pub use connect::ServerInfo;
pub use options::{Attach, BusOptions, BusTimings, Dialer, LocalStream, MS_FLAGS, dial_with};

use outbound::Outbound;

/// One message from the bus, as the reader hands it over. `subject` and `reply` borrow
/// the read buffer; `payload` shares it.
pub struct Incoming<'a> {
    pub subject: &'a [u8],
    pub reply: Option<&'a [u8]>,
    /// The status of a header-only message (`503` for "no responders"), if any.
    pub status: Option<u16>,
    pub payload: Bytes,
}

/// Who the reader hands messages and connection changes to (the gate, a worker).
pub trait Dispatch<T>: Send + Sync + 'static {
    /// A message for `target`, in the order the server sent it.
    fn deliver(&self, target: &T, msg: Incoming<'_>);
    /// A connection is up and every subscription is on it.
    fn connected(&self);
    /// The connection was lost: what was published on it may never be answered.
    fn lost(&self);
}

/// Why a publish was refused, or a flush failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    #[error("bus unavailable")]
    Disconnected,
    #[error("bus backlogged")]
    Backlogged,
}

/// A message's reply subject.
#[derive(Debug, Clone, Copy)]
pub enum Reply<'a> {
    None,
    /// A request's: `prefix` then the decimal `id`, written without a temporary string.
    Request {
        prefix: &'a str,
        id: u64,
    },
    /// Any subject, as it is.
    Subject(&'a str),
}

struct Sub<T> {
    subject: String,
    /// The queue group: the server hands each message to one member of the group.
    queue: Option<String>,
    target: T,
    /// Messages handed over so far, on every connection.
    delivered: u64,
    /// Set by [`Bus::unsubscribe_after`]: the subscription ends once this many were
    /// handed over (so while it lasts, fewer were).
    max: Option<u64>,
}

/// The shared side of the bus connection: what sessions publish through and what the
/// connection task reads from. Cheap to share behind an `Arc`.
pub struct Bus<T> {
    options: BusOptions,
    /// The first subscription's target ([`FIRST_SID`]).
    first: T,
    out: Outbound,
    connected: AtomicBool,
    /// The current connection's server; `None` while none is up.
    server: Mutex<Option<ServerInfo>>,
    subs: Mutex<FxHashMap<u64, Sub<T>>>,
    next_sid: AtomicU64,
    /// Fires the connection task's shutdown: the bus's user has stopped.
    stop: CancellationToken,
    /// A direct connection's link ([`BusOptions::attach`]), while one is up: publishes
    /// and subscriptions are calls on it instead of lines in `out`.
    link: Mutex<Option<Arc<dyn Link>>>,
}

/// The sid of the first subscription, made with the bus (the gate's reply wildcard):
/// its messages, the bulk of what a gate reads, are told apart without a map lookup, and
/// they are the only ones a connection lingering after a lame-duck move still delivers.
/// It lasts as long as the bus.
const FIRST_SID: u64 = 1;

impl<T: Clone + Send + Sync + 'static> Bus<T> {
    /// A bus for `options`, subscribed to `first_subject` for `first_target` (sid
    /// [`FIRST_SID`]), holding at most `max_pending` bytes for its writer; nothing is
    /// connected until [`run`].
    pub fn new(
        options: BusOptions,
        first_subject: String,
        first_target: T,
        max_pending: usize,
    ) -> Arc<Bus<T>> {
        let mut subs = FxHashMap::default();
        subs.insert(
            FIRST_SID,
            Sub {
                subject: first_subject,
                queue: None,
                target: first_target.clone(),
                delivered: 0,
                max: None,
            },
        );
        Arc::new(Bus {
            out: Outbound::new(max_pending),
            options,
            first: first_target,
            connected: AtomicBool::new(false),
            server: Mutex::new(None),
            subs: Mutex::new(subs),
            next_sid: AtomicU64::new(FIRST_SID + 1),
            stop: CancellationToken::new(),
            link: Mutex::new(None),
        })
    }

    /// Whether a connection is up now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// What the current connection's server says of itself; `None` while no connection
    /// is up.
    pub fn server_info(&self) -> Option<ServerInfo> {
        self.server_lock().clone()
    }

    fn server_lock(&self) -> std::sync::MutexGuard<'_, Option<ServerInfo>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `PUB subject [reply] len` and the payload `write` puts (exactly `len`
    /// bytes) to the outbound buffer. Never waits: refused at once when no connection
    /// is up or the buffer is over its limit.
    pub fn publish(
        &self,
        subject: &str,
        reply: Reply<'_>,
        len: usize,
        write: impl FnOnce(&mut BytesMut),
    ) -> Result<(), BusError> {
        if self.options.attach.is_some() {
            return direct::publish(self, subject, reply, len, write);
        }
        if !self.is_connected() {
            return Err(BusError::Disconnected);
        }
        self.out.push(|buf| {
            buf.extend_from_slice(b"PUB ");
            buf.extend_from_slice(subject.as_bytes());
            if !matches!(reply, Reply::None) {
                buf.extend_from_slice(b" ");
                reply.put(buf);
            }
            buf.extend_from_slice(b" ");
            buf.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
            buf.extend_from_slice(b"\r\n");
            let before = buf.len();
            write(buf);
            debug_assert_eq!(
                buf.len() - before,
                len,
                "the payload is the length announced"
            );
            buf.extend_from_slice(b"\r\n");
        })
    }

    /// [`Bus::publish`] of a payload at hand.
    pub fn publish_bytes(
        &self,
        subject: &str,
        reply: Reply<'_>,
        payload: &[u8],
    ) -> Result<(), BusError> {
        self.publish(subject, reply, payload.len(), |b| {
            b.extend_from_slice(payload)
        })
    }

    /// Subscribes `subject` for `target`, as a member of `queue` if given; returns the
    /// sid to unsubscribe with. Recorded first, so a connection made meanwhile
    /// subscribes it too; a `SUB` sent twice for one sid is harmless (the server keeps
    /// one).
    pub fn subscribe(&self, subject: String, queue: Option<String>, target: T) -> u64 {
        let sid = self.next_sid.fetch_add(1, Ordering::Relaxed);
        let sub = Sub {
            subject,
            queue,
            target,
            delivered: 0,
            max: None,
        };
        // Under the lock: a connection starting takes its snapshot of the subscriptions
        // and empties the buffer under it too, so the line is in exactly one of them.
        let mut subs = self.subs_lock();
        if self.options.attach.is_none() {
            self.out.push_control(&sub.line(sid));
        } else if let Some(link) = self.link() {
            direct::subscribe(link.as_ref(), sid, &sub);
        }
        subs.insert(sid, sub);
        sid
    }

    /// Unsubscribes `sid` (one [`Bus::subscribe`] returned): its messages are dropped
    /// from now on, here and at the server.
    pub fn unsubscribe(&self, sid: u64) {
        let mut subs = self.subs_lock();
        if subs.remove(&sid).is_some() {
            self.send_unsub(sid, None);
        }
    }

    /// Tells the server to end subscription `sid` now, or after `max` messages in all
    /// (with no link up, a new one is told what remains when it is made).
    fn send_unsub(&self, sid: u64, max: Option<u64>) {
        if self.options.attach.is_none() {
            self.out.push_control(&unsub_line(sid, max));
        } else if let Some(link) = self.link() {
            link.unsubscribe(sid, max);
        }
    }

    /// Ends subscription `sid` once `max` messages in all were handed over on it (NATS
    /// auto-unsubscribe: `UNSUB <sid> <max>`); at once if that many already were. The
    /// bus counts them itself, so a reconnect asks the new server for what remains.
    pub fn unsubscribe_after(&self, sid: u64, max: u64) {
        let mut subs = self.subs_lock();
        let Some(sub) = subs.get_mut(&sid) else {
            return;
        };
        if sub.delivered >= max {
            subs.remove(&sid);
            self.send_unsub(sid, None);
        } else {
            sub.max = Some(max);
            self.send_unsub(sid, Some(max));
        }
    }

    /// Counts a message for `sid` (not the first) and returns its target, if it is
    /// still subscribed; the message that reaches its [`Bus::unsubscribe_after`] count
    /// ends the subscription.
    fn delivered(&self, sid: u64) -> Option<T> {
        let mut subs = self.subs_lock();
        let sub = subs.get_mut(&sid)?;
        sub.delivered += 1;
        let target = sub.target.clone();
        if sub.max.is_some_and(|max| sub.delivered >= max) {
            subs.remove(&sid);
        }
        Some(target)
    }

    /// Resolves once the server has answered a PING sent after everything published
    /// before: it has processed all of that. Fails with [`BusError::Disconnected`] when
    /// no connection is up, or the one the PING went out on is lost (or left after a
    /// lame-duck notice) first.
    pub async fn flush(&self) -> Result<(), BusError> {
        if !self.is_connected() {
            return Err(BusError::Disconnected);
        }
        if self.options.attach.is_some() {
            // A direct publish was routed before it returned.
            return Ok(());
        }
        let (answered, answer) = tokio::sync::oneshot::channel();
        self.out.push_ping(Some(answered));
        // A loss after the check above has failed the flushes waiting then, maybe
        // before this one was queued.
        if !self.is_connected() {
            return Err(BusError::Disconnected);
        }
        answer.await.map_err(|_| BusError::Disconnected)
    }

    /// Resolves at once when the outbound buffer has room, else once the writer has
    /// taken it (or a lost connection dropped it): a publish refused as
    /// [`BusError::Backlogged`] is worth retrying then.
    pub async fn writable(&self) {
        self.out.writable().await;
    }

    /// Hands the outbound buffer to a new connection's writer; returns every
    /// subscription's `SUB` line, to be written on the new connection before that
    /// writer starts, and the writer's number. Under the subscriptions' lock, so a
    /// subscription is either in the lines or queued in the buffer after this, never
    /// lost in between. With `fresh` (a connection after a loss) the buffer is emptied
    /// first: what was queued for the lost connection is void.
    fn take_over(&self, fresh: bool) -> (BytesMut, u64) {
        let subs = self.subs_lock();
        if fresh {
            self.out.clear();
        }
        let mut lines = BytesMut::new();
        for (sid, sub) in subs.iter() {
            lines.extend_from_slice(&sub.line(*sid));
            // Fewer than `max` were handed over, or the subscription would be gone.
            if let Some(max) = sub.max {
                lines.extend_from_slice(&unsub_line(*sid, Some(max - sub.delivered)));
            }
        }
        (lines, self.out.next_writer())
    }

    fn subs_lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, Sub<T>>> {
        self.subs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The direct connection's link, while one is up (taken out of its lock: a call on
    /// it may come back into this bus).
    fn link(&self) -> Option<Arc<dyn Link>> {
        self.link
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the connection task: its user has shut down.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Reply<'_> {
    /// Writes the reply subject.
    fn put(self, buf: &mut BytesMut) {
        match self {
            Reply::None => {}
            Reply::Request { prefix, id } => {
                buf.extend_from_slice(prefix.as_bytes());
                buf.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
            }
            Reply::Subject(subject) => buf.extend_from_slice(subject.as_bytes()),
        }
    }
}

/// `UNSUB <sid> [max]`.
fn unsub_line(sid: u64, max: Option<u64>) -> Vec<u8> {
    let mut line = Vec::with_capacity(48);
    line.extend_from_slice(b"UNSUB ");
    line.extend_from_slice(itoa::Buffer::new().format(sid).as_bytes());
    if let Some(max) = max {
        line.extend_from_slice(b" ");
        line.extend_from_slice(itoa::Buffer::new().format(max).as_bytes());
    }
    line.extend_from_slice(b"\r\n");
    line
}

impl<T> Sub<T> {
    /// `SUB <subject> [queue] <sid>`.
    fn line(&self, sid: u64) -> Vec<u8> {
        let queue = self.queue.as_deref();
        let mut line = Vec::with_capacity(self.subject.len() + queue.map_or(0, str::len) + 32);
        line.extend_from_slice(b"SUB ");
        line.extend_from_slice(self.subject.as_bytes());
        if let Some(queue) = queue {
            line.extend_from_slice(b" ");
            line.extend_from_slice(queue.as_bytes());
        }
        line.extend_from_slice(b" ");
        line.extend_from_slice(itoa::Buffer::new().format(sid).as_bytes());
        line.extend_from_slice(b"\r\n");
        line
    }
}

/// Keeps `bus` connected until [`Bus::stop`], handing what it reads to `dispatch`: over
/// the network or a [`Dialer`]'s stream, or a direct link ([`BusOptions::attach`]).
pub async fn run<T: Clone + Send + Sync + 'static>(
    bus: Arc<Bus<T>>,
    dispatch: Arc<dyn Dispatch<T>>,
) {
    match bus.options.attach.clone() {
        Some(attach) => direct::run(bus, dispatch, attach).await,
        None => run::run(bus, dispatch).await,
    }
}

/// A bus with no server behind it, for unit tests of what publishes and subscribes.
#[cfg(any(test, feature = "testing"))]
impl<T: Clone + Send + Sync + 'static> Bus<T> {
    /// Up as if connected, its first subscription `test.gw.>` for `first_target`; what
    /// is published stays queued for [`Bus::written`].
    pub fn detached(first_target: T, max_pending: usize) -> Arc<Bus<T>> {
        let options = BusOptions::new(Vec::<String>::new());
        let bus = Bus::new(options, "test.gw.>".into(), first_target, max_pending);
        bus.connected.store(true, Ordering::Release);
        bus
    }

    /// Up or down, as a connection task would set it (the session hears of it from the
    /// gate's dispatch, which a test plays itself).
    pub fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Release);
    }

    /// Waits until something is queued, then takes all of it: the protocol lines a
    /// server would read, in order.
    pub async fn written(&self) -> String {
        loop {
            let now = self.written_now();
            if !now.is_empty() {
                return now;
            }
            self.out.ready().await;
        }
    }

    /// Answers the oldest PING taken by [`Bus::written`] and not answered yet, as a
    /// server's PONG would: the flush waiting on it resolves.
    pub fn answer_ping(&self) {
        self.out.pong_current();
    }

    /// Takes whatever is queued now (maybe nothing).
    pub fn written_now(&self) -> String {
        let mut buf = BytesMut::new();
        let _ = self.out.take(self.out.next_writer(), &mut buf);
        // One char per byte, so a payload's binary bytes survive for tests that decode it.
        buf.iter().map(|&b| char::from(b)).collect()
    }
}

/// Checks a server URL the way a connection will read it.
pub fn check_url(url: &str) -> anyhow::Result<()> {
    options::parse_url(url)
        .map(drop)
        .map_err(anyhow::Error::msg)
}
