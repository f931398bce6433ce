//! The byte pipe of an in-process connection, both ways: what
//! [`Server::connect_in_process`](crate::Server::connect_in_process) hands out.
//!
//! `tokio::io::duplex` does the same job but keeps each direction's buffer at the
//! largest size a burst ever grew it to, for the connection's life: after a flood, an
//! embedded gate's bus connection held a megabyte it no longer used (issue #25). Here a
//! direction drained empty lets a buffer grown past [`KEEP_PIPE_BUFFER`] go.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Room a drained direction keeps for the next writes; a buffer a burst grew past it is
/// dropped once emptied.
pub const KEEP_PIPE_BUFFER: usize = 64 * 1024;

/// One end of an in-process connection: reads what the other end writes, and the other
/// way round. Dropping an end closes both directions: the other end reads what was
/// written, then end-of-file, and its writes fail with `BrokenPipe`.
#[derive(Debug)]
pub struct InProcessStream {
    read: Arc<Mutex<Direction>>,
    write: Arc<Mutex<Direction>>,
}

/// Two connected ends, each direction buffering at most `max` bytes (at least 1).
pub fn pair(max: usize) -> (InProcessStream, InProcessStream) {
    let one = Arc::new(Mutex::new(Direction::new(max.max(1))));
    let two = Arc::new(Mutex::new(Direction::new(max.max(1))));
    (
        InProcessStream {
            read: one.clone(),
            write: two.clone(),
        },
        InProcessStream {
            read: two,
            write: one,
        },
    )
}

#[derive(Debug)]
struct Direction {
    /// Bytes written; those before `read` were read already.
    buf: Vec<u8>,
    read: usize,
    max: usize,
    /// No more writes: the writer shut down or an end was dropped.
    closed: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl Direction {
    fn new(max: usize) -> Direction {
        Direction {
            buf: Vec::new(),
            read: 0,
            max,
            closed: false,
            reader: None,
            writer: None,
        }
    }

    fn unread(&self) -> usize {
        self.buf.len() - self.read
    }

    fn close(&mut self) {
        self.closed = true;
        wake(&mut self.reader);
        wake(&mut self.writer);
    }
}

fn wake(waker: &mut Option<Waker>) {
    if let Some(waker) = waker.take() {
        waker.wake();
    }
}

fn lock(direction: &Mutex<Direction>) -> MutexGuard<'_, Direction> {
    // Every change is whole before the lock is let go: a poisoned one is still sound.
    direction
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AsyncRead for InProcessStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut d = lock(&self.read);
        if d.unread() == 0 {
            if d.closed {
                return Poll::Ready(Ok(()));
            }
            d.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let from = d.read;
        let n = d.unread().min(dst.remaining());
        dst.put_slice(&d.buf[from..from + n]);
        d.read += n;
        if d.unread() == 0 {
            d.read = 0;
            if d.buf.capacity() > KEEP_PIPE_BUFFER {
                d.buf = Vec::new();
            } else {
                d.buf.clear();
            }
        }
        wake(&mut d.writer);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for InProcessStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        src: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut d = lock(&self.write);
        if d.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let room = d.max - d.unread();
        if room == 0 {
            d.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(src.len());
        if d.read > 0 && d.buf.len() + n > d.buf.capacity() {
            // What was read makes room before the buffer grows: it never holds more
            // than about twice the bound.
            let read = d.read;
            d.buf.drain(..read);
            d.read = 0;
        }
        d.buf.extend_from_slice(&src[..n]);
        wake(&mut d.reader);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.write).close();
        Poll::Ready(Ok(()))
    }
}

impl Drop for InProcessStream {
    fn drop(&mut self) {
        lock(&self.read).close();
        lock(&self.write).close();
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn bytes_cross_both_ways_in_order() {
        let (mut a, mut b) = pair(16);
        a.write_all(b"ping").await.unwrap();
        b.write_all(b"pong").await.unwrap();
        let mut got = [0; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
    }

    #[tokio::test]
    async fn a_writer_waits_at_the_bound_until_the_reader_takes_some() {
        let (mut a, mut b) = pair(4);
        assert_eq!(a.write(b"123456").await.unwrap(), 4);
        let blocked = tokio::time::timeout(std::time::Duration::from_millis(50), a.write(b"5"));
        assert!(blocked.await.is_err(), "a full direction took another byte");
        let mut got = [0; 3];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(a.write(b"56").await.unwrap(), 2);
        let mut rest = [0; 3];
        b.read_exact(&mut rest).await.unwrap();
        assert_eq!((&got, &rest), (b"123", b"456"));
    }

    #[tokio::test]
    async fn a_dropped_end_gives_what_it_wrote_then_eof_and_refuses_writes() {
        let (mut a, mut b) = pair(16);
        a.write_all(b"last").await.unwrap();
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last");
        let err = b.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn shutdown_ends_one_direction_only() {
        let (mut a, mut b) = pair(16);
        a.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
        b.write_all(b"still").await.unwrap();
        let mut back = [0; 5];
        a.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"still");
    }

    #[tokio::test]
    async fn a_burst_s_room_goes_once_drained_and_small_room_stays() {
        let max = 4 * KEEP_PIPE_BUFFER;
        let (mut a, mut b) = pair(max);
        let capacity = |end: &InProcessStream| lock(&end.write).buf.capacity();
        let mut sink = vec![0; max];

        a.write_all(&vec![7; max]).await.unwrap();
        assert!(capacity(&a) >= max);
        b.read_exact(&mut sink).await.unwrap();
        assert_eq!(capacity(&a), 0, "a drained burst kept its room");

        // At the bound exactly, the room is kept for the next writes.
        a.write_all(&vec![7; KEEP_PIPE_BUFFER]).await.unwrap();
        assert_eq!(capacity(&a), KEEP_PIPE_BUFFER);
        b.read_exact(&mut sink[..KEEP_PIPE_BUFFER]).await.unwrap();
        assert_eq!(capacity(&a), KEEP_PIPE_BUFFER);
    }

    #[tokio::test]
    async fn a_reader_always_behind_never_lets_the_buffer_grow_past_twice_the_bound() {
        let (mut a, mut b) = pair(1000);
        let capacity = |end: &InProcessStream| lock(&end.write).buf.capacity();
        let mut got = [0; 300];
        a.write_all(&[1; 1000]).await.unwrap();
        for round in 0..100u8 {
            b.read_exact(&mut got).await.unwrap();
            a.write_all(&[round; 300]).await.unwrap();
            assert!(capacity(&a) <= 2000, "round {round}: {}", capacity(&a));
        }
    }
}
