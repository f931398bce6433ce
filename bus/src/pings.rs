//! PINGs sent and PONGs read, so that a [flush](crate::Bus::flush) resolves on the
//! answer to its own PING: a server answers PINGs in order, so the n-th PONG read on a
//! connection answers the n-th PING written to it. Counted under the outbound buffer's
//! lock as each PING is queued, so the count follows the order of the bytes.

use std::collections::VecDeque;

use tokio::sync::oneshot;

#[derive(Default)]
pub(super) struct Pings {
    /// PINGs queued since the bus began, keep-alives included.
    queued: u64,
    /// Of those, still in the buffer (no writer took them yet).
    in_buffer: u64,
    /// The writer of the current connection.
    writer: u64,
    /// PINGs queued before the current connection and not sent on it: its n-th PONG
    /// answers PING `base + n`.
    base: u64,
    /// PONGs read on the current connection.
    answered: u64,
    /// Flushes waiting, by the number of their PING, in that order.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Pings {
    /// A PING was appended to the buffer; `flush` hears when it is answered.
    pub(super) fn queued(&mut self, flush: Option<oneshot::Sender<()>>) {
        self.queued += 1;
        self.in_buffer += 1;
        if let Some(flush) = flush {
            self.waiting.push_back((self.queued, flush));
        }
    }

    /// The buffer left for the current connection, or was dropped.
    pub(super) fn left_buffer(&mut self) {
        self.in_buffer = 0;
    }

    /// `writer`'s connection takes over with what is in the buffer now; a flush whose
    /// PING went out on an earlier one fails (dropped: the connection it asked about is
    /// gone or going).
    pub(super) fn next_writer(&mut self, writer: u64) {
        self.writer = writer;
        self.base = self.queued - self.in_buffer;
        self.answered = 0;
        while self.waiting.front().is_some_and(|(n, _)| *n <= self.base) {
            self.waiting.pop_front();
        }
    }

    /// `writer`'s connection read a PONG; the flushes it answers resolve. A PONG read
    /// on a connection no longer current (lingering after a lame-duck move) answers
    /// nothing of the current one's.
    pub(super) fn pong(&mut self, writer: u64) {
        if writer != self.writer {
            return;
        }
        self.answered += 1;
        let answered = self.base + self.answered;
        while self.waiting.front().is_some_and(|(n, _)| *n <= answered) {
            if let Some((_, flush)) = self.waiting.pop_front() {
                let _ = flush.send(());
            }
        }
    }

    /// The connection was lost: every flush waiting fails.
    pub(super) fn lost(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flush(pings: &mut Pings) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        pings.queued(Some(tx));
        rx
    }

    #[test]
    fn a_flush_resolves_on_the_pong_of_its_own_ping() {
        let mut pings = Pings::default();
        pings.next_writer(1);
        pings.queued(None); // a keep-alive first
        let mut first = flush(&mut pings);
        let mut second = flush(&mut pings);
        pings.left_buffer();
        pings.pong(1);
        assert!(
            first.try_recv().is_err(),
            "the keep-alive's PONG answers no flush"
        );
        pings.pong(1);
        assert_eq!(first.try_recv(), Ok(()));
        assert!(second.try_recv().is_err());
        pings.pong(2); // another connection's
        assert!(second.try_recv().is_err());
        pings.pong(1);
        assert_eq!(second.try_recv(), Ok(()));
    }

    #[test]
    fn a_new_connection_counts_from_what_it_sends() {
        let mut pings = Pings::default();
        pings.next_writer(1);
        let mut sent = flush(&mut pings);
        pings.left_buffer();
        let mut queued = flush(&mut pings);
        // A lame-duck move: the second PING is still in the buffer, the new one sends it.
        pings.next_writer(2);
        assert_eq!(
            sent.try_recv(),
            Err(oneshot::error::TryRecvError::Closed),
            "its connection was replaced"
        );
        pings.pong(1);
        assert!(queued.try_recv().is_err());
        pings.pong(2);
        assert_eq!(queued.try_recv(), Ok(()));
        let mut lost = flush(&mut pings);
        pings.lost();
        assert_eq!(lost.try_recv(), Err(oneshot::error::TryRecvError::Closed));
    }
}
