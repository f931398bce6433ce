//! The connection task: keeps one connection up (reconnecting with backoff, moving on
//! lame duck), and per connection one task that writes the outbound buffer to it and
//! reads what the server sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::Poll;

use bytes::{Buf as _, BytesMut};
use nats_wire::{ServerOp, parse_server};
use net::LogLimiter;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::connect::{Conn, Info, LIMITS, open};
use super::options::LocalStream;
use super::outbound::Taken;
use super::pairing::{Pairing, Side, Slot};
use super::{Bus, Dispatch, FIRST_SID, Incoming, backoff};

/// Read buffer room reserved before each read.
const READ_CHUNK: usize = 64 * 1024;
/// Pings a connection may leave unanswered before it is declared dead.
const MAX_PINGS_OUT: u32 = 2;

enum Event {
    Lost { id: u64, error: String },
    LameDuck { id: u64 },
}

/// A connection's task, as the run loop holds it.
struct Current {
    id: u64,
    server: usize,
    /// Set when the connection was moved off: it lingers for what it is owed (the
    /// gate's replies, and what only it received) and answers the server's pings no
    /// more (its writes go to the new connection).
    moved: Arc<AtomicBool>,
    /// Its part in a move's pairing ([`pairing`]).
    slot: Arc<Slot>,
    stop: CancellationToken,
    /// The connection's task: awaited at the end, so what it still had queued is
    /// written before [`run`] returns.
    task: Option<tokio::task::JoinHandle<()>>,
}

static CONNECT_LOG: LogLimiter = LogLimiter::per_second();

/// Keeps `bus` connected over bytes until [`Bus::stop`], handing what it reads to
/// `dispatch`.
pub(crate) async fn run<T: Clone + Send + Sync + 'static>(
    bus: Arc<Bus<T>>,
    dispatch: Arc<dyn Dispatch<T>>,
) {
    let servers = bus.options.servers().max(1);
    // Unbounded, yet bounded by construction: a connection sends at most one `LameDuck`
    // (`lame_duck_told`) and one `Lost`, and there are at most the current connection
    // and those lingering after a lame-duck move.
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut next_server = if bus.options.randomize {
        fastrand::usize(..servers)
    } else {
        0
    };
    let mut next_id = 0u64;
    let mut current: Option<Current> = None;
    let mut failed_rounds = 0u32;
    loop {
        if current.is_none() {
            match open_any(&bus, next_server, None).await {
                Some(conn) => {
                    failed_rounds = 0;
                    next_id += 1;
                    tracing::info!(name = %bus.options.name, server = %server_name(&bus, conn.server), server_id = %conn.info.server.server_id, "connected to the bus");
                    *bus.server_lock() = Some(conn.info.server.clone());
                    let slot = Arc::new(Slot::default());
                    current =
                        Some(start(&bus, &dispatch, conn, next_id, true, slot, &events_tx).await);
                    bus.connected.store(true, Ordering::Release);
                    dispatch.connected();
                }
                None => {
                    failed_rounds += 1;
                    tokio::select! {
                        () = tokio::time::sleep(backoff::delay(failed_rounds)) => continue,
                        () = bus.stop.cancelled() => break,
                    }
                }
            }
        }
        let event = tokio::select! {
            () = bus.stop.cancelled() => break,
            event = events.recv() => event,
        };
        let Some(cur) = current.as_ref() else {
            continue;
        };
        match event {
            Some(Event::Lost { id, error }) if id == cur.id => {
                tracing::warn!(name = %bus.options.name, server = %server_name(&bus, cur.server), %error, "lost the bus connection; reconnecting");
                bus.connected.store(false, Ordering::Release);
                *bus.server_lock() = None;
                bus.out.lost();
                next_server = (cur.server + 1) % servers;
                current = None;
                dispatch.lost();
            }
            Some(Event::LameDuck { id }) if id == cur.id => {
                tracing::info!(name = %bus.options.name, server = %server_name(&bus, cur.server), "bus server entering lame duck mode; moving to another");
                let Some(conn) = open_any(&bus, cur.server + 1, Some(cur.server)).await else {
                    tracing::warn!(name = %bus.options.name, "no other bus server answered; staying until this one closes");
                    continue;
                };
                next_id += 1;
                let old = current.take().expect("checked above");
                // Replies to what was published on the old connection still come there,
                // and so do messages published before every server knew of the new
                // subscriptions: each message is taken once from the two.
                old.moved.store(true, Ordering::Release);
                let pairing = Pairing::new(bus.options.move_unpaired);
                old.slot.pair(pairing.clone(), Side::Old);
                let linger = bus.options.linger;
                tokio::spawn(async move {
                    tokio::time::sleep(linger).await;
                    old.stop.cancel();
                });
                tracing::info!(name = %bus.options.name, server = %server_name(&bus, conn.server), "moved to another bus server");
                *bus.server_lock() = Some(conn.info.server.clone());
                let slot = Arc::new(Slot::default());
                slot.pair(pairing, Side::New);
                current =
                    Some(start(&bus, &dispatch, conn, next_id, false, slot, &events_tx).await);
            }
            // A lingering connection ended, or news of one already replaced.
            Some(_) | None => {}
        }
    }
    bus.connected.store(false, Ordering::Release);
    *bus.server_lock() = None;
    bus.out.lost();
    if let Some(cur) = current {
        cur.stop.cancel();
        if let Some(task) = cur.task {
            let _ = task.await;
        }
    }
}

fn server_name<T>(bus: &Bus<T>, index: usize) -> &str {
    bus.options
        .urls
        .get(index)
        .map_or("in-process", String::as_str)
}

/// One round over the servers from `first`, skipping `avoid`; the first that opens.
async fn open_any<T>(bus: &Bus<T>, first: usize, avoid: Option<usize>) -> Option<Conn> {
    let servers = bus.options.servers().max(1);
    for i in 0..servers {
        let index = (first + i) % servers;
        if Some(index) == avoid {
            continue;
        }
        match open(&bus.options, index).await {
            Ok(conn) => return Some(conn),
            Err(error) => {
                if let Some(tally) = CONNECT_LOG.check() {
                    tracing::warn!(name = %bus.options.name, %error, "cannot connect to the bus{tally}");
                }
            }
        }
    }
    None
}

/// Sends every subscription on `conn`, makes its writer the outbound buffer's owner, and
/// spawns its task. `fresh`: a connection after a loss, whose buffer starts empty.
/// `slot`: its part in a move's pairing (the new side of one, after a lame-duck move).
async fn start<T: Clone + Send + Sync + 'static>(
    bus: &Arc<Bus<T>>,
    dispatch: &Arc<dyn Dispatch<T>>,
    conn: Conn,
    id: u64,
    fresh: bool,
    slot: Arc<Slot>,
    events: &mpsc::UnboundedSender<Event>,
) -> Current {
    let Conn {
        stream,
        leftover,
        server,
        ..
    } = conn;
    let (rd, mut wr) = tokio::io::split(stream);
    let (lines, writer) = bus.take_over(fresh);
    let stop = CancellationToken::new();
    let moved = Arc::new(AtomicBool::new(false));
    let mut current = Current {
        id,
        server,
        moved: moved.clone(),
        slot: slot.clone(),
        stop: stop.clone(),
        task: None,
    };
    if let Err(error) = write(bus, &mut wr, &lines).await {
        // Lost before its task started: its pairing ends here, as the task's would.
        slot.end();
        let _ = events.send(Event::Lost { id, error });
        return current;
    }
    let pings_out = Arc::new(AtomicU32::new(0));
    let reader = Reader {
        bus: bus.clone(),
        dispatch: dispatch.clone(),
        moved,
        slot: slot.clone(),
        pings_out: pings_out.clone(),
        writer,
        id,
        events: events.clone(),
        lame_duck_told: false,
    };
    let (bus, events) = (bus.clone(), events.clone());
    current.task = Some(tokio::spawn(async move {
        // However this task ends, the pairing this connection is a side of ends.
        let _ending = EndsPairing(slot);
        let writing = write_loop(&bus, &mut wr, writer, &pings_out);
        let reading = reader.run(rd, leftover);
        tokio::pin!(reading);
        let outcome = tokio::select! {
            () = stop.cancelled() => None,
            r = &mut reading => Some(r),
            w = writing => match w {
                // Replaced by a new connection: read the replies still owed, until the
                // server closes this one or the linger ends.
                Ok(()) => tokio::select! {
                    () = stop.cancelled() => return,
                    r = reading => Some(r),
                },
                Err(e) => Some(Err(e)),
            },
        };
        let Some(outcome) = outcome else {
            // Stopped: what is still queued (a session's last hand-over) goes out.
            flush_out(&bus, &mut wr, writer).await;
            return;
        };
        let error = outcome
            .err()
            .unwrap_or_else(|| "closed by the server".into());
        let _ = events.send(Event::Lost { id, error });
    }));
    current
}

/// Ends, when dropped, the pairing a connection is a side of.
struct EndsPairing(Arc<Slot>);

impl Drop for EndsPairing {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The connection is stopped: writes what is still queued for it (nothing when another
/// connection's writer took over), each write within the bus's write timeout.
async fn flush_out<T>(bus: &Bus<T>, wr: &mut WriteHalf<LocalStream>, writer: u64) {
    let mut chunk = BytesMut::new();
    while let Taken::Bytes = bus.out.take(writer, &mut chunk) {
        if write(bus, wr, &chunk).await.is_err() {
            return;
        }
    }
    let _ = wr.flush().await;
}

/// Writes the outbound buffer whenever it has bytes, and pings when it has been idle;
/// returns `Ok` when another connection's writer takes over.
async fn write_loop<T>(
    bus: &Bus<T>,
    wr: &mut WriteHalf<LocalStream>,
    writer: u64,
    pings_out: &AtomicU32,
) -> Result<(), String> {
    let mut chunk = BytesMut::with_capacity(READ_CHUNK);
    let mut ping = tokio::time::interval(bus.options.ping_interval);
    ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        match bus.out.take(writer, &mut chunk) {
            Taken::Replaced => return Ok(()),
            Taken::Bytes => {
                write(bus, wr, &chunk).await?;
                continue;
            }
            Taken::Empty => {}
        }
        tokio::select! {
            () = bus.out.ready() => {
                // Woken by the first publish of a batch: let the other sessions made
                // ready in the same turn publish too, so the batch is one write.
                to_the_back().await;
            }
            _ = ping.tick() => {
                if pings_out.fetch_add(1, Ordering::Relaxed) >= MAX_PINGS_OUT {
                    return Err("the server stopped answering pings".into());
                }
                bus.out.push_ping(None);
            }
        }
    }
}

/// Puts the calling task at the back of its runtime's queue of ready tasks, once: a task
/// woken while it runs is put back there (tokio's harness reschedules it as a yield, on
/// either kind of runtime). Not `tokio::task::yield_now`, which waits for the I/O
/// driver's next poll: on a current-thread runtime (a gate's shard, a worker's host,
/// `shaddock up`) whose queue then runs dry, that is one `epoll_wait` syscall per batch
/// the writer takes. The driver is still polled every `event_interval` tasks, so this
/// starves no I/O.
async fn to_the_back() {
    let mut woken = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut woken, true) {
            return Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// Writes all of `bytes` within the bus's write timeout; a server that has not taken
/// them by then has stopped reading, and the connection is dead. The timer is armed only
/// when the first attempt leaves something unwritten: most writes go into the socket
/// buffer at once, and cost no timer.
async fn write<T>(
    bus: &Bus<T>,
    wr: &mut WriteHalf<LocalStream>,
    bytes: &[u8],
) -> Result<(), String> {
    let mut write = std::pin::pin!(wr.write_all(bytes));
    if let Poll::Ready(written) = futures::poll!(write.as_mut()) {
        return written.map_err(|e| e.to_string());
    }
    let timeout = bus.options.write_timeout;
    match tokio::time::timeout(timeout, write).await {
        Ok(written) => written.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the server did not take {} bytes within {timeout:?}: it stopped reading",
            bytes.len()
        )),
    }
}

struct Reader<T> {
    bus: Arc<Bus<T>>,
    dispatch: Arc<dyn Dispatch<T>>,
    moved: Arc<AtomicBool>,
    slot: Arc<Slot>,
    pings_out: Arc<AtomicU32>,
    /// This connection's writer, whose PINGs this reader reads the PONGs of.
    writer: u64,
    id: u64,
    events: mpsc::UnboundedSender<Event>,
    lame_duck_told: bool,
}

/// Where a message's parts sit in the read buffer.
struct MsgAt {
    sid: u64,
    subject: (usize, usize),
    reply: Option<(usize, usize)>,
    status: Option<u16>,
    payload: (usize, usize),
}

impl<T: Clone + Send + Sync + 'static> Reader<T> {
    /// Reads until the connection ends; `Ok` when the server closed it.
    async fn run(mut self, mut rd: ReadHalf<LocalStream>, mut buf: BytesMut) -> Result<(), String> {
        loop {
            self.drain(&mut buf)?;
            if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                buf.reserve(READ_CHUNK);
            }
            if rd.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                return Ok(());
            }
        }
    }

    /// Handles every whole op at the front of `buf`.
    fn drain(&mut self, buf: &mut BytesMut) -> Result<(), String> {
        loop {
            let base = buf.as_ptr() as usize;
            let at = |s: &[u8]| {
                let start = s.as_ptr() as usize - base;
                (start, start + s.len())
            };
            let (msg, used) = match parse_server(buf, &LIMITS) {
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("unreadable op from the server: {e}")),
                Ok(Some((op, used))) => match op {
                    ServerOp::Msg {
                        subject,
                        sid,
                        reply,
                        headers,
                        payload,
                    } => {
                        let msg = MsgAt {
                            sid,
                            subject: at(subject),
                            reply: reply.map(at),
                            status: headers.and_then(status),
                            payload: at(payload),
                        };
                        (Some(msg), used)
                    }
                    other => {
                        self.control(other);
                        (None, used)
                    }
                },
            };
            match msg {
                None => buf.advance(used),
                Some(msg) => {
                    let frame = buf.split_to(used).freeze();
                    self.deliver(&frame, msg);
                }
            }
        }
    }

    fn control(&mut self, op: ServerOp<'_>) {
        match op {
            ServerOp::Ping => {
                if !self.moved.load(Ordering::Acquire) {
                    self.bus.out.push_control(b"PONG\r\n");
                }
            }
            ServerOp::Pong => {
                self.pings_out.store(0, Ordering::Relaxed);
                self.bus.out.pong(self.writer);
            }
            ServerOp::Info(json) => {
                let ldm = Info::parse(json).is_ok_and(|info| info.ldm);
                if ldm && !self.lame_duck_told {
                    self.lame_duck_told = true;
                    let _ = self.events.send(Event::LameDuck { id: self.id });
                }
            }
            ServerOp::Err(text) => {
                static ERR_LOG: LogLimiter = LogLimiter::per_second();
                if let Some(tally) = ERR_LOG.check() {
                    tracing::warn!(error = %String::from_utf8_lossy(text), "bus server error{tally}");
                }
            }
            ServerOp::Ok | ServerOp::Msg { .. } => {}
        }
    }

    fn deliver(&self, frame: &bytes::Bytes, msg: MsgAt) {
        let incoming = Incoming {
            subject: &frame[msg.subject.0..msg.subject.1],
            reply: msg.reply.map(|(a, b)| &frame[a..b]),
            status: msg.status,
            payload: frame.slice(msg.payload.0..msg.payload.1),
        };
        if msg.sid == FIRST_SID {
            self.dispatch.deliver(&self.bus.first, incoming);
            return;
        }
        if !self.slot.take(&incoming) {
            // The other connection of a move delivered it.
            return;
        }
        let Some(target) = self.bus.delivered(msg.sid) else {
            // Unsubscribed meanwhile.
            return;
        };
        self.dispatch.deliver(&target, incoming);
    }
}

/// The status of `NATS/1.0 503 ...` headers.
pub(crate) fn status(headers: &[u8]) -> Option<u16> {
    let rest = headers.strip_prefix(b"NATS/1.0 ")?;
    let digits = rest.get(..3)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::sync::Notify;

    use super::status;
    use crate::{Bus, BusOptions, Dispatch, Incoming, Reply};

    /// A connection that counts the writes made to it, and the bytes.
    struct Counted {
        inner: broker::InProcessStream,
        writes: Arc<AtomicUsize>,
        bytes: Arc<AtomicUsize>,
    }

    impl AsyncRead for Counted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = written {
                self.writes.fetch_add(1, Ordering::Relaxed);
                self.bytes.fetch_add(n, Ordering::Relaxed);
            }
            written
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// Hears only that the connection is up.
    struct Up(Notify);

    impl Dispatch<()> for Up {
        fn deliver(&self, _: &(), _: Incoming<'_>) {}
        fn connected(&self) {
            self.0.notify_one();
        }
        fn lost(&self) {}
    }

    /// Waits until `bytes` counts `at_least`.
    async fn until_written(bytes: &AtomicUsize, at_least: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while bytes.load(Ordering::Relaxed) < at_least {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the writer writes what was published");
    }

    /// Sessions made ready in one turn of the runtime (a burst of requests read in one
    /// poll of the sockets) publish before the writer takes the buffer, so the burst
    /// leaves in one write, not one per request. On one worker thread, where a task woken
    /// by another would otherwise run right after it (tokio's LIFO slot): without the
    /// writer's yield, this test sees a write per publish.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn publishes_of_one_turn_leave_in_one_write() {
        let server = broker::Server::new(broker::Config::default());
        let (writes, bytes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut options = BusOptions::new(Vec::<String>::new());
        let (dial_writes, dial_bytes) = (writes.clone(), bytes.clone());
        options.dialer = Some(crate::dial_with(move || Counted {
            inner: server.connect_in_process(),
            writes: dial_writes.clone(),
            bytes: dial_bytes.clone(),
        }));
        let bus = Bus::new(options, "t.gw.>".into(), (), 1 << 20);
        let up = Arc::new(Up(Notify::new()));
        let connection = tokio::spawn(super::run(bus.clone(), up.clone()));
        up.0.notified().await;
        // One publish first, so the writer is waiting on an empty buffer, as it is
        // between bursts.
        let line = b"PUB t.x 2\r\nhi\r\n".len();
        bus.publish_bytes("t.x", Reply::None, b"hi").unwrap();
        until_written(&bytes, bytes.load(Ordering::Relaxed) + line).await;
        const BURST: usize = 8;
        // The test's body runs on its own thread, so on a busy machine the runtime may
        // take its spawns one by one, each alone in its turn: of a few bursts, one in one
        // or two writes is enough (without the yield every burst takes one write per
        // publish).
        let mut per_burst = Vec::new();
        for _ in 0..5 {
            let (writes_before, bytes_before) = (
                writes.load(Ordering::Relaxed),
                bytes.load(Ordering::Relaxed),
            );
            let sessions: Vec<_> = (0..BURST)
                .map(|_| {
                    let bus = bus.clone();
                    tokio::spawn(async move { bus.publish_bytes("t.x", Reply::None, b"hi") })
                })
                .collect();
            for session in sessions {
                session.await.unwrap().unwrap();
            }
            until_written(&bytes, bytes_before + BURST * line).await;
            per_burst.push(writes.load(Ordering::Relaxed) - writes_before);
        }
        // Quiet, one write a burst; loaded, mostly two or three.
        assert!(
            per_burst.iter().any(|&writes| writes <= 2),
            "writes per burst of {BURST}: {per_burst:?}"
        );
        bus.stop();
        connection.await.unwrap();
    }

    #[test]
    fn status_of_headers() {
        assert_eq!(status(b"NATS/1.0 503\r\n\r\n"), Some(503));
        assert_eq!(status(b"NATS/1.0 408 Request Timeout\r\n\r\n"), Some(408));
        assert_eq!(status(b"NATS/1.0\r\nX: y\r\n\r\n"), None);
        assert_eq!(status(b"junk"), None);
    }
}
