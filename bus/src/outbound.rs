//! The outbound buffer: sessions append, the connection's writer takes it whole.

use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::BytesMut;
use tokio::sync::{Notify, oneshot};

use super::BusError;
use super::pings::Pings;

/// The buffer's starting room: a batch of a few hundred requests without growing.
const START_CAPACITY: usize = 64 * 1024;

/// A spare buffer with more room than this, handed back while the batch being taken is
/// no bigger than [`START_CAPACITY`], is replaced by a fresh one: the two buffers would
/// otherwise keep a burst's room (up to `--max-bus-pending` each) for the process's life.
const SHRINK_ABOVE: usize = 4 * START_CAPACITY;

pub(super) struct Outbound {
    state: Mutex<State>,
    /// Woken when the buffer goes from empty to not empty (a permit is kept when the
    /// writer is busy, so no wake-up is lost).
    ready: Notify,
    /// Woken when the buffer is taken or dropped, if a publisher refused as backlogged
    /// waits for it ([`Outbound::writable`]).
    taken: Notify,
    max_pending: usize,
}

struct State {
    buf: BytesMut,
    /// The writer allowed to take the buffer; a lame-duck switch moves it to the new
    /// connection's writer and the old one stops.
    writer: u64,
    /// The PINGs in the buffer and on the connection, under the buffer's lock.
    pings: Pings,
    /// A publisher waits on [`Outbound::taken`]: the writer's taking wakes it (and only
    /// then, so the writer pays nothing when nobody waits).
    wanted: bool,
}

/// What a writer finds when it comes for the buffer.
pub(super) enum Taken {
    /// The caller's buffer now holds the bytes to write (its emptied self took their
    /// place, so both keep their capacity).
    Bytes,
    /// Nothing queued: wait for [`Outbound::ready`].
    Empty,
    /// Another connection's writer owns the buffer now.
    Replaced,
}

impl Outbound {
    pub(super) fn new(max_pending: usize) -> Outbound {
        Outbound {
            state: Mutex::new(State {
                buf: BytesMut::with_capacity(START_CAPACITY),
                writer: 0,
                pings: Pings::default(),
                wanted: false,
            }),
            ready: Notify::new(),
            taken: Notify::new(),
            max_pending,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends what `put` writes, unless `max_pending` bytes already wait: then the
    /// caller is refused at once (the writer is behind; queueing more only adds delay).
    pub(super) fn push(&self, put: impl FnOnce(&mut BytesMut)) -> Result<(), BusError> {
        let mut state = self.lock();
        if state.buf.len() >= self.max_pending {
            return Err(BusError::Backlogged);
        }
        let was_empty = state.buf.is_empty();
        put(&mut state.buf);
        drop(state);
        if was_empty {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Appends a protocol line (SUB, UNSUB, PING, PONG) whatever the backlog: they are
    /// small and the connection depends on them.
    pub(super) fn push_control(&self, line: &[u8]) {
        let mut state = self.lock();
        let was_empty = state.buf.is_empty();
        state.buf.extend_from_slice(line);
        drop(state);
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// Appends a PING, counted: `flush` hears when the server has answered it.
    pub(super) fn push_ping(&self, flush: Option<oneshot::Sender<()>>) {
        let mut state = self.lock();
        let was_empty = state.buf.is_empty();
        state.buf.extend_from_slice(b"PING\r\n");
        state.pings.queued(flush);
        drop(state);
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// `writer`'s connection read a PONG.
    pub(super) fn pong(&self, writer: u64) {
        self.lock().pings.pong(writer);
    }

    /// The current writer's connection read a PONG (a test playing the server).
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn pong_current(&self) {
        let mut state = self.lock();
        let writer = state.writer;
        state.pings.pong(writer);
    }

    /// The connection was lost: flushes fail, and publishers waiting for room retry
    /// (and hear that no connection is up).
    pub(super) fn lost(&self) {
        let mut state = self.lock();
        state.pings.lost();
        self.wake_writable(state);
    }

    /// Drops everything queued (the connection it was for is gone).
    pub(super) fn clear(&self) {
        let mut state = self.lock();
        state.buf.clear();
        state.pings.left_buffer();
        self.wake_writable(state);
    }

    /// Resolves at once if the buffer has room, else once the writer has taken it (or
    /// it was dropped with its connection): a publisher refused as backlogged retries
    /// then.
    pub(super) async fn writable(&self) {
        let taken = self.taken.notified();
        let mut taken = std::pin::pin!(taken);
        // Registered before looking, so a taking in between is not missed.
        taken.as_mut().enable();
        {
            let mut state = self.lock();
            if state.buf.len() < self.max_pending {
                return;
            }
            state.wanted = true;
        }
        taken.await;
    }

    fn wake_writable(&self, mut state: MutexGuard<'_, State>) {
        let wanted = std::mem::take(&mut state.wanted);
        drop(state);
        if wanted {
            self.taken.notify_waiters();
        }
    }

    /// Takes the buffer for `writer` into `into`, leaving `into`'s emptied buffer in
    /// its place.
    pub(super) fn take(&self, writer: u64, into: &mut BytesMut) -> Taken {
        let mut state = self.lock();
        if state.writer != writer {
            return Taken::Replaced;
        }
        if state.buf.is_empty() {
            return Taken::Empty;
        }
        into.clear();
        if into.capacity() > SHRINK_ABOVE && state.buf.len() <= START_CAPACITY {
            *into = BytesMut::with_capacity(START_CAPACITY);
        }
        std::mem::swap(&mut state.buf, into);
        state.pings.left_buffer();
        self.wake_writable(state);
        Taken::Bytes
    }

    /// Makes the next writer the buffer's owner; returns its number.
    pub(super) fn next_writer(&self) -> u64 {
        let mut state = self.lock();
        state.writer += 1;
        let writer = state.writer;
        state.pings.next_writer(writer);
        drop(state);
        // The old writer may be waiting: it must see that it was replaced.
        self.ready.notify_waiters();
        writer
    }

    pub(super) async fn ready(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_refuses_until_taken() {
        let out = Outbound::new(8);
        assert!(out.push(|b| b.extend_from_slice(b"0123456789")).is_ok());
        assert_eq!(
            out.push(|b| b.extend_from_slice(b"x")),
            Err(BusError::Backlogged)
        );
        // Control lines still go.
        out.push_control(b"PONG\r\n");
        let mut taken = BytesMut::new();
        assert!(matches!(out.take(0, &mut taken), Taken::Bytes));
        assert_eq!(&taken[..], b"0123456789PONG\r\n");
        assert!(out.push(|b| b.extend_from_slice(b"x")).is_ok());
    }

    #[test]
    fn a_burst_s_room_is_given_back_once_batches_are_small_again() {
        let out = Outbound::new(8 * 1024 * 1024);
        let mut taken = BytesMut::new();
        let burst = vec![b'x'; 2 * 1024 * 1024];
        for _ in 0..2 {
            out.push(|b| b.extend_from_slice(&burst)).unwrap();
            assert!(matches!(out.take(0, &mut taken), Taken::Bytes));
        }
        // Both buffers carried the burst.
        assert!(taken.capacity() >= burst.len());
        for _ in 0..2 {
            out.push(|b| b.extend_from_slice(b"PING\r\n")).unwrap();
            assert!(matches!(out.take(0, &mut taken), Taken::Bytes));
            assert_eq!(&taken[..], b"PING\r\n");
        }
        assert!(taken.capacity() <= SHRINK_ABOVE, "{}", taken.capacity());
        assert!(out.lock().buf.capacity() <= SHRINK_ABOVE);
    }

    #[test]
    fn a_replaced_writer_takes_nothing() {
        let out = Outbound::new(1024);
        out.push_control(b"SUB a 1\r\n");
        let new = out.next_writer();
        let mut taken = BytesMut::new();
        assert!(matches!(out.take(0, &mut taken), Taken::Replaced));
        assert!(matches!(out.take(new, &mut taken), Taken::Bytes));
        assert!(matches!(out.take(new, &mut taken), Taken::Empty));
    }
}
