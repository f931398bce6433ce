//! What a session has to write to its client: a bounded queue of frames, written as the
//! socket takes them, never awaited. The session loop goes on (reads, replies, timers)
//! while the client is slow, and learns from [`Outbox::waiting_since`] how long the
//! socket has taken nothing; past the write deadline it closes the session as too slow.

use std::collections::VecDeque;
use std::task::{Context, Poll};

use futures::{Sink, SinkExt as _};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// A frame waiting for the socket; pushes are told apart for the drop counter.
struct Outgoing {
    frame: Message,
    push: bool,
}

/// Frames towards the client, at most `capacity` of them and `max_bytes` of payload
/// waiting (see the module docs).
pub(super) struct Outbox {
    frames: VecDeque<Outgoing>,
    capacity: usize,
    max_bytes: usize,
    /// Payload bytes of `frames`.
    bytes: usize,
    /// Frames handed to the socket's writer and not yet flushed.
    unflushed: bool,
    /// Since when the socket has taken nothing while output waits; `None` when
    /// everything is written.
    waiting_since: Option<Instant>,
}

/// The outbox is full: the client does not keep up.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Full;

impl Outbox {
    pub(super) fn new(capacity: usize, max_bytes: usize) -> Self {
        Outbox {
            frames: VecDeque::new(),
            capacity: capacity.max(1),
            max_bytes,
            bytes: 0,
            unflushed: false,
            waiting_since: None,
        }
    }

    /// Queues `frame` (a push when `push`); `Full` when `capacity` frames already wait,
    /// or it would take the payload waiting past `max_bytes` (a frame is always taken
    /// into an empty outbox: the frame size limit is elsewhere).
    pub(super) fn put(&mut self, frame: Message, push: bool) -> Result<(), Full> {
        let len = frame.len();
        let over = !self.frames.is_empty() && self.bytes + len > self.max_bytes;
        if self.frames.len() >= self.capacity || over {
            return Err(Full);
        }
        self.waiting_since.get_or_insert_with(Instant::now);
        self.bytes += len;
        self.frames.push_back(Outgoing { frame, push });
        Ok(())
    }

    /// Since when output has waited for a socket that takes nothing.
    pub(super) fn waiting_since(&self) -> Option<Instant> {
        self.waiting_since
    }

    /// Frames the queue has room for without growing (0 while nothing waits).
    #[cfg(test)]
    pub(super) fn room(&self) -> usize {
        self.frames.capacity()
    }

    /// Pushes not yet handed to the socket.
    pub(super) fn queued_pushes(&self) -> usize {
        self.frames.iter().filter(|o| o.push).count()
    }

    /// Hands the socket what it takes now and flushes it: `Ready(Ok)` once everything
    /// is written, `Pending` while the socket is full (the task is woken when it takes
    /// more), `Ready(Err)` when writing failed.
    pub(super) fn poll_write<W>(
        &mut self,
        ws: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WsError>>
    where
        W: Sink<Message, Error = WsError> + Unpin,
    {
        let mut progress = false;
        let result = loop {
            if !self.frames.is_empty() {
                match ws.poll_ready_unpin(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                    Poll::Pending => break Poll::Pending,
                }
                let Some(next) = self.frames.pop_front() else {
                    continue;
                };
                self.bytes -= next.frame.len();
                if let Err(e) = ws.start_send_unpin(next.frame) {
                    break Poll::Ready(Err(e));
                }
                self.unflushed = true;
                progress = true;
                continue;
            }
            if !self.unflushed {
                break Poll::Ready(Ok(()));
            }
            match ws.poll_flush_unpin(cx) {
                Poll::Ready(Ok(())) => {
                    self.unflushed = false;
                    progress = true;
                }
                Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                Poll::Pending => break Poll::Pending,
            }
        };
        match result {
            Poll::Ready(Ok(())) => {
                self.waiting_since = None;
                // Everything is written: the queue's room goes back too, so a quiet
                // session holds none (the next frame makes it again).
                self.frames = VecDeque::new();
            }
            Poll::Pending if progress => self.waiting_since = Some(Instant::now()),
            _ => {}
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;

    use futures::task::noop_waker_ref;

    use super::*;

    /// A socket that takes `room` frames before it is full, then nothing until given
    /// more room.
    #[derive(Default)]
    struct Socket {
        room: usize,
        buffered: usize,
        written: Vec<Message>,
    }

    impl Sink<Message> for Socket {
        type Error = WsError;

        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
            if self.buffered < self.room {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }

        fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), WsError> {
            self.buffered += 1;
            self.written.push(item);
            Ok(())
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
            Poll::Ready(Ok(()))
        }

        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
            Poll::Ready(Ok(()))
        }
    }

    fn poll(outbox: &mut Outbox, socket: &mut Socket) -> Poll<Result<(), WsError>> {
        outbox.poll_write(socket, &mut Context::from_waker(noop_waker_ref()))
    }

    #[tokio::test(start_paused = true)]
    async fn frames_wait_in_order_until_the_socket_takes_them_and_the_wait_is_timed() {
        let mut outbox = Outbox::new(3, usize::MAX);
        let mut socket = Socket::default();
        assert!(outbox.waiting_since().is_none());
        let start = Instant::now();
        for (i, push) in [(0, true), (1, false), (2, true)] {
            outbox.put(Message::text(i.to_string()), push).unwrap();
        }
        // A fourth is one too many: the client is too slow.
        assert_eq!(outbox.put(Message::text("3"), true), Err(Full));
        assert_eq!(outbox.queued_pushes(), 2);
        assert!(poll(&mut outbox, &mut socket).is_pending());
        assert_eq!(outbox.waiting_since(), Some(start));
        // The socket takes one, a while later: the wait starts again from then.
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        socket.room = 1;
        assert!(poll(&mut outbox, &mut socket).is_pending());
        assert_eq!(
            outbox.waiting_since(),
            Some(start + std::time::Duration::from_secs(1))
        );
        socket.room = 3;
        assert!(matches!(
            poll(&mut outbox, &mut socket),
            Poll::Ready(Ok(()))
        ));
        assert!(outbox.waiting_since().is_none());
        assert_eq!(outbox.room(), 0, "a drained outbox holds no room");
        let written: Vec<String> = socket
            .written
            .iter()
            .map(|m| m.to_text().unwrap().to_owned())
            .collect();
        assert_eq!(written, ["0", "1", "2"]);
        assert_eq!(outbox.queued_pushes(), 0);
    }

    #[test]
    fn the_payload_waiting_is_bounded_too() {
        let mut outbox = Outbox::new(100, 10);
        // Alone, a frame past the bound is taken: the frame limit is elsewhere.
        outbox.put(Message::binary(vec![0; 12]), false).unwrap();
        assert_eq!(outbox.put(Message::binary(vec![0; 1]), false), Err(Full));
        let mut socket = Socket {
            room: 1,
            ..Socket::default()
        };
        assert!(matches!(
            poll(&mut outbox, &mut socket),
            Poll::Ready(Ok(()))
        ));
        // Written: room again, up to the bound exactly.
        outbox.put(Message::binary(vec![0; 6]), false).unwrap();
        outbox.put(Message::binary(vec![0; 4]), true).unwrap();
        assert_eq!(outbox.put(Message::binary(vec![0; 1]), true), Err(Full));
    }
}
