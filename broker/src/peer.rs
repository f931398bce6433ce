//! A connection as the rest of the server sees it: its outbound buffer, which every
//! publisher appends to under a short, never-awaited lock, and its subscriptions. The
//! connection's own task (`client`) reads and writes; the server's state (`state`)
//! lists these; nothing here does I/O.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bytes::{BufMut, Bytes, BytesMut};
use nats_wire::direct::Sink;
use rustc_hash::FxHashMap;
use tokio::sync::Notify;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// The address an in-process connection reports (INFO's `client_ip`, `/connz`): it has
/// no peer address.
pub(crate) const IN_PROCESS_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// A subscription: who gets the messages, and how many are still wanted.
pub(crate) struct Subscription {
    pub client: Arc<ClientShared>,
    pub subject: Bytes,
    pub queue: Option<Bytes>,
    pub sid: Bytes,
    /// Messages after which the subscription ends (UNSUB with max); 0 means never.
    pub max: AtomicU64,
    pub delivered: AtomicU64,
}

/// Per-client figures for `/connz`.
#[derive(Debug, Default, Clone)]
pub(crate) struct ClientMeta {
    pub name: String,
    pub lang: String,
    pub version: String,
}

/// What the outbound lock guards.
#[derive(Default)]
pub(crate) struct Outbound {
    pub buf: BytesMut,
    pub msgs: u64,
    pub bytes: u64,
    pub closed: bool,
}

/// How a delivery went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    Queued,
    /// Queued, and the client's backlog is past the flow-control mark.
    Pressed,
    /// Handed to a direct client's sink: it has it, no writer to wake.
    Handed,
    /// The client is gone or going; try another queue member.
    Closed,
    /// This delivery pushed the client past max_pending: it has just been closed.
    SlowConsumer,
}

/// The part of a client other connections see.
pub(crate) struct ClientShared {
    pub cid: u64,
    /// The peer's address; [`IN_PROCESS_ADDR`] for an in-process connection.
    pub addr: SocketAddr,
    /// Served in process (a pipe, or direct), not a socket: its INFO never asks for TLS.
    pub in_process: bool,
    /// A direct connection's sink ([`nats_wire::direct`]): its messages go there, at
    /// once, instead of into `out`.
    sink: Option<Arc<dyn Sink>>,
    pub started: SystemTime,
    pub close: CancellationToken,
    pub subs: Mutex<FxHashMap<Bytes, Arc<Subscription>>>,
    pub meta: Mutex<ClientMeta>,
    pub in_msgs: AtomicU64,
    pub in_bytes: AtomicU64,
    pub headers: AtomicBool,
    /// CONNECT said protocol 1: the client takes INFO updates (lame duck mode's).
    pub async_info: AtomicBool,
    pub pings_out: AtomicU32,
    pub out: Mutex<Outbound>,
    pub wake: Notify,
    /// Woken after each write, for publishers waiting on this client's backlog.
    pub drained: Notify,
    /// Bytes written to the socket so far: a waiting publisher's sign of progress.
    pub written: AtomicU64,
    /// Bytes the writer has taken from `out` and not yet written: still pending, as
    /// monitoring reports it (a writer blocked on a client that stopped reading holds
    /// its whole backlog here while `out` is empty).
    pub writing: AtomicUsize,
    /// A publisher waited a whole stall window without progress: publishers stop
    /// waiting for this client until its writer makes progress again.
    pub stalled: AtomicBool,
    max_pending: usize,
    flow_control_pending: usize,
}

/// Locks a mutex whose data stays valid even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn put_num(buf: &mut BytesMut, n: usize) {
    buf.put_slice(itoa::Buffer::new().format(n).as_bytes());
}

impl ClientShared {
    pub fn new(
        cid: u64,
        addr: SocketAddr,
        in_process: bool,
        sink: Option<Arc<dyn Sink>>,
        max_pending: usize,
        flow_control_pending: usize,
    ) -> Self {
        ClientShared {
            cid,
            addr,
            in_process,
            headers: AtomicBool::new(sink.is_some()),
            sink,
            started: SystemTime::now(),
            close: CancellationToken::new(),
            subs: Mutex::default(),
            meta: Mutex::default(),
            in_msgs: AtomicU64::new(0),
            in_bytes: AtomicU64::new(0),
            async_info: AtomicBool::new(false),
            pings_out: AtomicU32::new(0),
            out: Mutex::default(),
            wake: Notify::new(),
            drained: Notify::new(),
            written: AtomicU64::new(0),
            writing: AtomicUsize::new(0),
            stalled: AtomicBool::new(false),
            max_pending,
            flow_control_pending,
        }
    }

    /// Whether the client said (in CONNECT) that it takes INFO updates after the first.
    pub fn takes_async_info(&self) -> bool {
        self.async_info.load(Ordering::Relaxed)
    }

    /// Outbound bytes not yet written (queued, or taken by the writer and not yet
    /// written), and messages and bytes delivered so far.
    pub fn out_stats(&self) -> (usize, u64, u64) {
        let out = lock(&self.out);
        let pending = out.buf.len() + self.writing.load(Ordering::Relaxed);
        (pending, out.msgs, out.bytes)
    }

    /// Lets the writer run: it flushes whatever the buffer holds.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Queues a protocol line (INFO, PONG, +OK, -ERR, PING) and wakes the writer. A
    /// direct connection reads no lines: it is told nothing this way.
    pub fn send(&self, line: &[u8]) {
        if self.sink.is_some() {
            return;
        }
        {
            let mut out = lock(&self.out);
            if out.closed {
                return;
            }
            out.buf.put_slice(line);
        }
        self.wake();
    }

    /// Queues `-ERR '<text>'`.
    pub fn send_err(&self, text: &str) {
        self.send(format!("-ERR '{text}'\r\n").as_bytes());
    }

    /// Appends one message for subscription `sid`, without waking the writer: the
    /// publisher wakes every writer it touched once its read batch is routed.
    pub fn deliver(
        &self,
        sid: &[u8],
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) -> Delivery {
        // A subscriber that did not announce headers gets the payload alone.
        let headers = headers.filter(|_| self.headers.load(Ordering::Relaxed));
        let hlen = headers.map_or(0, <[u8]>::len);
        let total = hlen + payload.len();
        if let Some(sink) = &self.sink {
            return self.hand(sink.as_ref(), sid, subject, reply, headers, payload);
        }
        let frame_len = 32 + subject.len() + sid.len() + reply.map_or(0, |r| r.len() + 1) + total;
        let mut out = lock(&self.out);
        if out.closed {
            return Delivery::Closed;
        }
        if out.buf.len() + frame_len > self.max_pending {
            out.closed = true;
            // The backlog will never be written: free it now.
            out.buf = BytesMut::new();
            drop(out);
            self.close.cancel();
            return Delivery::SlowConsumer;
        }
        let buf = &mut out.buf;
        buf.reserve(frame_len);
        buf.put_slice(if headers.is_some() { b"HMSG " } else { b"MSG " });
        buf.put_slice(subject);
        buf.put_u8(b' ');
        buf.put_slice(sid);
        buf.put_u8(b' ');
        if let Some(reply) = reply {
            buf.put_slice(reply);
            buf.put_u8(b' ');
        }
        if let Some(headers) = headers {
            put_num(buf, hlen);
            buf.put_u8(b' ');
            put_num(buf, total);
            buf.put_slice(b"\r\n");
            buf.put_slice(headers);
        } else {
            put_num(buf, total);
            buf.put_slice(b"\r\n");
        }
        buf.put_slice(payload);
        buf.put_slice(b"\r\n");
        out.msgs += 1;
        out.bytes += total as u64;
        if out.buf.len() > self.flow_control_pending {
            Delivery::Pressed
        } else {
            Delivery::Queued
        }
    }

    /// [`ClientShared::deliver`] to a direct connection: its sink is called now, on the
    /// publisher's thread, with no lock of the server's held.
    fn hand(
        &self,
        sink: &dyn Sink,
        sid: &[u8],
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) -> Delivery {
        if self.close.is_cancelled() {
            return Delivery::Closed;
        }
        // Its sids are the numbers it subscribed with (`direct`).
        let Some(sid) = std::str::from_utf8(sid).ok().and_then(|s| s.parse().ok()) else {
            return Delivery::Closed;
        };
        {
            let mut out = lock(&self.out);
            out.msgs += 1;
            out.bytes += (headers.map_or(0, <[u8]>::len) + payload.len()) as u64;
        }
        sink.deliver(sid, subject, reply, headers, payload);
        Delivery::Handed
    }

    /// Waits while this client's backlog is past the flow-control mark and its writer
    /// keeps making progress; gives up after a window without progress, leaving a
    /// client that stopped reading to the `max_pending` limit.
    pub async fn drain_below_mark(&self, window: std::time::Duration) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            // Registered before the check, so a write finishing in between still wakes us.
            notified.as_mut().enable();
            if self.stalled.load(Ordering::Relaxed)
                || self.close.is_cancelled()
                || lock(&self.out).buf.len() <= self.flow_control_pending
            {
                return;
            }
            let before = self.written.load(Ordering::Relaxed);
            let woke = timeout(window, notified).await.is_ok();
            if !woke && self.written.load(Ordering::Relaxed) == before {
                self.stalled.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}

impl Subscription {
    /// Counts a delivery against UNSUB's max. Returns whether this message may be sent
    /// and whether it is the last one (so the subscription must be removed).
    ///
    /// An UNSUB with a max can come while other connections deliver (see
    /// [`Client::unsubscribe`]): the count only moves by compare-and-swap below a max it
    /// has seen, and the UNSUB stores its max before it reads the count (all SeqCst), so
    /// the subscription never gets more than its max, which is what the client counts
    /// on: a message beyond it would be dropped by the client. A delivery that read no
    /// max yet may take the last one without knowing it is the last; the next delivery
    /// finds the max reached and removes the subscription then.
    pub fn take_one(&self) -> (bool, bool) {
        let mut n = self.delivered.load(Ordering::SeqCst);
        loop {
            let max = self.max.load(Ordering::SeqCst);
            if max != 0 && n >= max {
                return (false, false);
            }
            match self
                .delivered
                .compare_exchange_weak(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return (true, max != 0 && n + 1 == max),
                Err(now) => n = now,
            }
        }
    }
}
