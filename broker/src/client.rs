//! One client connection's task: the reader that parses and routes inline, and the
//! writer that flushes the outbound buffer (its shared side is in `peer`) once per batch.
//!
//! Publishers append `MSG` frames straight into each subscriber's outbound buffer under
//! a short, never-awaited lock, and wake that subscriber's writer once per read batch,
//! not once per message. One write syscall then carries everything that piled up.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Buf, BytesMut};
use nats_wire::subject;
use nats_wire::{ClientOp, Limits, ParseError};
use net::LogLimiter;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep_until, timeout};

use crate::config::{Auth, FIRST_PING_INTERVAL};
use crate::peer::{ClientMeta, ClientShared, lock};
use crate::pipe::InProcessStream;
use crate::route::{Cache, Fanout, Publisher};
use crate::state::Shared;

/// Smallest read buffer; an idle connection holds no more than this.
const MIN_READ_BUFFER: usize = 512;
/// Largest read buffer: reads grow up to it while a client keeps filling them.
const MAX_READ_BUFFER: usize = 64 * 1024;
/// A writer's spare buffer larger than this is dropped after a burst, not kept. Large
/// enough that a busy subscriber reuses its buffers: freeing and re-allocating
/// multi-megabyte buffers costs page faults and unmaps on every batch.
const KEEP_WRITE_BUFFER: usize = 1024 * 1024;
/// A batch no larger than this says the burst is over: the buffer that carried it gives
/// back any room beyond this. Otherwise a long-lived connection (a gate's, a worker's)
/// would keep two burst-sized buffers for good once traffic is back to normal.
const CALM_WRITE_BATCH: usize = 64 * 1024;

static WRITE_DEADLINE_LOG: LogLimiter = LogLimiter::per_second();

/// CONNECT options. Absent booleans mean what nats-server assumes.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct ConnectOpts {
    verbose: bool,
    pedantic: bool,
    echo: bool,
    headers: bool,
    no_responders: bool,
    protocol: i64,
    auth_token: Option<String>,
    user: Option<String>,
    pass: Option<String>,
    name: Option<String>,
    lang: Option<String>,
    version: Option<String>,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            verbose: true,
            pedantic: true,
            echo: true,
            headers: false,
            no_responders: false,
            protocol: 0,
            auth_token: None,
            user: None,
            pass: None,
            name: None,
            lang: None,
            version: None,
        }
    }
}

impl ConnectOpts {
    fn authorized(&self, auth: &Auth) -> bool {
        match auth {
            Auth::None => true,
            Auth::Token(token) => self.auth_token.as_deref() == Some(token.as_str()),
            Auth::UserPass { user, pass } => {
                self.user.as_deref() == Some(user.as_str())
                    && self.pass.as_deref() == Some(pass.as_str())
            }
        }
    }
}

/// Why a connection ends after an op.
enum Close {
    /// Send this `-ERR` first.
    WithErr(&'static str),
    Silent,
}

impl From<ParseError> for Close {
    fn from(e: ParseError) -> Self {
        e.err_text().map_or(Close::Silent, Close::WithErr)
    }
}

/// The reader side of a connection: its own options and caches.
struct Conn {
    server: Arc<Shared>,
    me: Arc<ClientShared>,
    opts: ConnectOpts,
    connected: bool,
    cache: Cache,
    fanout: Fanout,
}

/// A byte stream a client is served over: a TCP connection, or an in-process pipe.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// An in-process pipe: never upgraded to TLS, and no peer address.
    const IN_PROCESS: bool;

    /// Serves the connection, INFO already written, until it closes.
    fn serve_after_info(
        self,
        server: Arc<Shared>,
        me: Arc<ClientShared>,
    ) -> impl Future<Output = ()> + Send;
}

impl Transport for TcpStream {
    const IN_PROCESS: bool = false;

    /// Upgrades to TLS when the server requires it. Plaintext keeps tokio's lock-free
    /// halves; TLS needs `split`, which shares the stream between the halves. Each is its
    /// own monomorphised copy of `run`, so the message path has no dynamic dispatch
    /// either way.
    async fn serve_after_info(self, server: Arc<Shared>, me: Arc<ClientShared>) {
        match server.config.tls.clone() {
            None => {
                let (rd, wr) = self.into_split();
                run(server, me, rd, wr).await;
            }
            Some(tls) => match tls.accept(self, me.addr, &server.tls_failures).await {
                Some(stream) => {
                    let (rd, wr) = tokio::io::split(stream);
                    run(server, me, rd, wr).await;
                }
                None => server.remove_client(&me),
            },
        }
    }
}

impl Transport for InProcessStream {
    const IN_PROCESS: bool = true;

    async fn serve_after_info(self, server: Arc<Shared>, me: Arc<ClientShared>) {
        let (rd, wr) = tokio::io::split(self);
        run(server, me, rd, wr).await;
    }
}

/// Serves one accepted connection until it closes: sends INFO, then hands the stream to
/// its transport, which runs the reader and the writer.
pub(crate) async fn serve<S: Transport>(
    server: Arc<Shared>,
    me: Arc<ClientShared>,
    mut stream: S,
    info: Vec<u8>,
) {
    // INFO goes out at once, not after the writer task's first turn: under a heavy
    // fan-out that turn can come late, and clients time their connect out.
    if stream.write_all(&info).await.is_err() {
        server.remove_client(&me);
        return;
    }
    stream.serve_after_info(server, me).await;
}

/// The reader's loop, on the calling task, with the writer on a task of its own.
async fn run<R, W>(server: Arc<Shared>, me: Arc<ClientShared>, mut rd: R, wr: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let writer = tokio::spawn(write_loop(me.clone(), wr, server.clone()));
    let mut conn = Conn {
        server: server.clone(),
        me: me.clone(),
        opts: ConnectOpts::default(),
        connected: false,
        cache: Cache::new(),
        fanout: Fanout::default(),
    };
    let limits = Limits {
        max_control_line: server.config.max_control_line,
        max_payload: server.config.max_payload,
    };
    let auth_deadline = server
        .config
        .auth
        .required()
        .then(|| Instant::now() + server.config.auth_timeout);
    let mut rbuf = BytesMut::with_capacity(MIN_READ_BUFFER);
    let mut read_size = MIN_READ_BUFFER;
    // Registered with the token once, not once per read.
    let closed = me.close.cancelled();
    tokio::pin!(closed);
    loop {
        if rbuf.capacity() - rbuf.len() < read_size / 2 {
            rbuf.reserve(read_size);
        }
        let read = tokio::select! {
            r = rd.read_buf(&mut rbuf) => r,
            () = &mut closed => break,
            () = sleep_until(auth_deadline.unwrap_or_else(Instant::now)), if auth_deadline.is_some() && !conn.connected => {
                me.send_err("Authentication Timeout");
                break;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Grow the buffer while the client keeps filling it, shrink it once it idles.
        if n >= read_size && read_size < MAX_READ_BUFFER {
            read_size *= 2;
        } else if n < read_size / 4 && read_size > MIN_READ_BUFFER {
            read_size /= 2;
        }
        let mut used = 0;
        let outcome = loop {
            match nats_wire::parse(&rbuf[used..], &limits) {
                Ok(Some((op, len))) => {
                    used += len;
                    if let Err(close) = conn.handle(op) {
                        break Err(close);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(Close::from(e)),
            }
        };
        // Advancing keeps the buffer unshared, so `reserve` can reuse its space.
        rbuf.advance(used);
        if rbuf.is_empty() && rbuf.capacity() > 2 * read_size {
            rbuf = BytesMut::with_capacity(read_size);
        }
        conn.end_batch();
        conn.relieve_pressure().await;
        if let Err(close) = outcome {
            if let Close::WithErr(text) = close {
                me.send_err(text);
            }
            break;
        }
    }
    conn.end_batch();
    conn.cache.forget(&server.stats);
    me.close.cancel();
    server.remove_client(&me);
    let _ = writer.await;
}

impl Conn {
    fn handle(&mut self, op: ClientOp<'_>) -> Result<(), Close> {
        if !self.connected
            && self.server.config.auth.required()
            && !matches!(op, ClientOp::Connect(_))
        {
            return Err(Close::WithErr("Authorization Violation"));
        }
        match op {
            ClientOp::Connect(json) => return self.connect(json),
            ClientOp::Pub {
                subject,
                reply,
                headers,
                payload,
            } => {
                if headers.is_some() && !self.opts.headers {
                    return Err(Close::Silent);
                }
                let batch = &mut self.fanout.batch;
                batch.in_msgs += 1;
                batch.in_bytes += (payload.len() + headers.map_or(0, <[u8]>::len)) as u64;
                // nats-server's pedantic check only warns: the message is still routed.
                if self.opts.pedantic && !subject::is_valid_publish(subject) {
                    self.me.send_err("Invalid Publish Subject");
                }
                // +OK first: a verbose client sees it before its own message comes back.
                if self.opts.verbose {
                    self.me.send(b"+OK\r\n");
                }
                self.route(subject, reply, headers, payload);
                return Ok(());
            }
            ClientOp::Sub {
                subject,
                queue,
                sid,
            } => {
                if let Err(refused) = self.server.subscribe(&self.me, subject, queue, sid) {
                    self.me.send_err(refused);
                    return Ok(());
                }
            }
            ClientOp::Unsub { sid, max } => self.server.unsubscribe(&self.me, sid, max),
            ClientOp::Ping => {
                self.me.send(b"PONG\r\n");
                return Ok(());
            }
            ClientOp::Pong => {
                self.me.pings_out.store(0, Ordering::Relaxed);
                return Ok(());
            }
            ClientOp::Ok | ClientOp::Info => return Ok(()),
        }
        if self.opts.verbose {
            self.me.send(b"+OK\r\n");
        }
        Ok(())
    }

    fn connect(&mut self, json: &[u8]) -> Result<(), Close> {
        let opts: ConnectOpts = serde_json::from_slice(json).map_err(|_| Close::Silent)?;
        if !(0..=1).contains(&opts.protocol) {
            return Err(Close::WithErr("invalid client protocol"));
        }
        if !opts.authorized(&self.server.config.auth) {
            return Err(Close::WithErr("Authorization Violation"));
        }
        self.me.headers.store(opts.headers, Ordering::Relaxed);
        self.me
            .async_info
            .store(opts.protocol >= 1, Ordering::Relaxed);
        *lock(&self.me.meta) = ClientMeta {
            name: opts.name.clone().unwrap_or_default(),
            lang: opts.lang.clone().unwrap_or_default(),
            version: opts.version.clone().unwrap_or_default(),
        };
        self.opts = opts;
        self.connected = true;
        if self.opts.verbose {
            self.me.send(b"+OK\r\n");
        }
        Ok(())
    }

    /// Routes one message (see [`Fanout::route`]).
    fn route(
        &mut self,
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) {
        let from = Publisher {
            server: &self.server,
            me: &self.me,
            echo: self.opts.echo,
            no_responders: self.opts.no_responders && self.opts.headers,
        };
        let (cache, index) = (&mut self.cache, &self.server.index);
        let mut lookup = |subject: &[u8]| cache.get(index, subject);
        (self.fanout).route(&from, &mut lookup, subject, reply, headers, payload);
    }

    /// Flow control: before reading more from this publisher, lets the subscribers it
    /// pushed past the mark drain. Publishing pauses only while they make progress.
    async fn relieve_pressure(&mut self) {
        let window = self.server.config.stall_window;
        for client in self.fanout.take_pressed() {
            if client.cid != self.me.cid {
                client.drain_below_mark(window).await;
            }
        }
    }

    /// Wakes every writer this batch fed, and adds the batch's counts (and the match
    /// cache's) to the totals.
    fn end_batch(&mut self) {
        self.fanout.end(&self.server, &self.me);
        self.cache.report(&self.server.stats);
    }
}

/// Bytes one writer hands the kernel before it lets other tasks run. A fan-out can queue
/// megabytes for each of hundreds of subscribers; written in one go, a round of them
/// would keep new connections waiting for their INFO for seconds.
const WRITE_TURN: usize = 256 * 1024;

/// Writes `data` in turns of [`WRITE_TURN`], yielding between them. The deadline applies
/// to each turn: a write blocked that long means the client stopped reading. Each turn
/// counts as progress for publishers waiting on this client's backlog.
async fn write_in_turns<W: AsyncWrite + Unpin>(
    me: &ClientShared,
    wr: &mut W,
    data: &[u8],
    deadline: std::time::Duration,
) -> Result<std::io::Result<()>, tokio::time::error::Elapsed> {
    for (i, turn) in data.chunks(WRITE_TURN).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        if let Err(e) = timeout(deadline, wr.write_all(turn)).await? {
            return Ok(Err(e));
        }
        me.written.fetch_add(turn.len() as u64, Ordering::Relaxed);
        me.writing.fetch_sub(turn.len(), Ordering::Relaxed);
        me.stalled.store(false, Ordering::Relaxed);
        me.drained.notify_waiters();
    }
    Ok(Ok(()))
}

/// Empties a buffer whose bytes were written, for the next batch: a burst's room is
/// dropped past [`KEEP_WRITE_BUFFER`], and past [`CALM_WRITE_BATCH`] once a batch fits
/// in that again.
fn reuse_written(buf: &mut BytesMut) {
    let room = buf.capacity();
    if room > KEEP_WRITE_BUFFER || (room > CALM_WRITE_BATCH && buf.len() <= CALM_WRITE_BATCH) {
        *buf = BytesMut::new();
    } else {
        buf.clear();
    }
}

/// Flushes the client's outbound buffer whenever woken, and PINGs it on schedule.
async fn write_loop<W: AsyncWrite + Unpin>(me: Arc<ClientShared>, mut wr: W, server: Arc<Shared>) {
    let config = &server.config;
    let mut spare = BytesMut::new();
    let ping = tokio::time::sleep(FIRST_PING_INTERVAL.min(config.ping_interval));
    tokio::pin!(ping);
    // Registered with the token once, not once per flush; never polled once it fired.
    let closed = me.close.cancelled();
    tokio::pin!(closed);
    let mut closing = false;
    while !closing {
        tokio::select! {
            biased;
            () = &mut closed => closing = true,
            () = me.wake.notified() => {}
            () = &mut ping => {
                ping.as_mut().reset(Instant::now() + config.ping_interval);
                if me.pings_out.fetch_add(1, Ordering::Relaxed) >= config.max_pings_out {
                    tracing::debug!(cid = me.cid, "stale connection");
                    me.send_err("Stale Connection");
                    me.close.cancel();
                    closing = true;
                } else {
                    me.send(b"PING\r\n");
                }
            }
        }
        {
            let mut out = lock(&me.out);
            std::mem::swap(&mut out.buf, &mut spare);
            // Under the lock, so a reader of both never sees the bytes in neither.
            me.writing.store(spare.len(), Ordering::Relaxed);
            if closing {
                out.closed = true;
            }
        }
        if spare.is_empty() {
            continue;
        }
        // A close (slow consumer elsewhere, shutdown) must not wait for a blocked write.
        // Biased: what is queued (a final -ERR) is still written when the socket takes it.
        let written = tokio::select! {
            biased;
            r = write_in_turns(&me, &mut wr, &spare, config.write_deadline) => r,
            () = &mut closed, if !closing => break,
        };
        match written {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break,
            Err(_) => {
                server.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
                if let Some(tally) = WRITE_DEADLINE_LOG.check() {
                    tracing::warn!(
                        cid = me.cid,
                        "slow consumer: write deadline exceeded{tally}"
                    );
                }
                break;
            }
        }
        reuse_written(&mut spare);
    }
    me.close.cancel();
    {
        let mut out = lock(&me.out);
        out.closed = true;
        out.buf = BytesMut::new();
        me.writing.store(0, Ordering::Relaxed);
    }
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::*;

    /// Writes `len` bytes through `buf` as the writer does: fill, write, reuse.
    fn batch(buf: &mut BytesMut, len: usize) {
        buf.put_bytes(b'x', len);
        reuse_written(buf);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_burst_s_room_goes_once_batches_are_calm_again() {
        let mut buf = BytesMut::new();
        // A busy subscriber keeps its room from batch to batch.
        batch(&mut buf, 512 * 1024);
        let room = buf.capacity();
        assert!(room >= 512 * 1024);
        batch(&mut buf, 300 * 1024);
        assert_eq!(buf.capacity(), room);
        // A calm batch after the burst gives it back.
        batch(&mut buf, 100);
        assert!(buf.capacity() <= CALM_WRITE_BATCH, "{}", buf.capacity());
        // Calm batches keep their small room.
        batch(&mut buf, CALM_WRITE_BATCH / 2);
        let calm = buf.capacity();
        assert!(calm > 0 && calm <= CALM_WRITE_BATCH);
        batch(&mut buf, 100);
        assert_eq!(buf.capacity(), calm);
        // Past the keep bound even a busy one lets it go.
        batch(&mut buf, 2 * KEEP_WRITE_BUFFER);
        assert_eq!(buf.capacity(), 0);
    }
}
