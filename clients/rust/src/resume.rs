//! A resumable session's place in its stream of frames (docs/protocol.md, "Resume"):
//! the highest `seq` handled, which decides what is a repeat, and how many frames await
//! an acknowledgement.
//!
//! One [`Sequence`] per gate session, shared by the reader that handles its frames and
//! the connection task that acknowledges them; a resumed session's new link takes the
//! same one, a fresh session (a move, a refused resume) a new one. Atomics rather than a
//! lock, because the reader consults it for every push and response: a frame is handled
//! if its `seq` raises the highest one, which `fetch_max` decides in one step, so not
//! even two readers of the same session (an old link's reader that has not stopped yet,
//! and the resumed one) could both handle a frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Frames handled between two acks, at most (the protocol's "at least every 64").
pub(crate) const ACK_EVERY: u32 = 64;

#[derive(Debug, Default)]
pub(crate) struct Sequence {
    /// The highest `seq` handled.
    last: AtomicU64,
    /// Numbered frames handled since the last ack.
    unacked: AtomicU32,
}

impl Sequence {
    /// Whether a frame numbered `seq` is to be handled: unnumbered (0: the session is
    /// not resumable), or above every `seq` handled so far. Counts it towards the next
    /// ack; `ack_due` says when [`ACK_EVERY`] are waiting.
    pub(crate) fn accept(&self, seq: u64) -> Accepted {
        if seq == 0 {
            return Accepted::Handle { ack_due: false };
        }
        if self.last.fetch_max(seq, Ordering::AcqRel) >= seq {
            return Accepted::Repeat;
        }
        let unacked = self.unacked.fetch_add(1, Ordering::AcqRel) + 1;
        Accepted::Handle {
            ack_due: unacked == ACK_EVERY,
        }
    }

    /// The highest `seq` handled: what a resume asks to continue from.
    pub(crate) fn last(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    /// Whether [`ACK_EVERY`] frames or more wait for an ack.
    pub(crate) fn ack_due(&self) -> bool {
        self.unacked.load(Ordering::Acquire) >= ACK_EVERY
    }

    /// The `seq` to acknowledge now; the count starts again. Frames handled meanwhile
    /// may be counted again towards the next ack, which only makes it come sooner.
    pub(crate) fn take_ack(&self) -> u64 {
        self.unacked.store(0, Ordering::Release);
        self.last()
    }
}

/// What [`Sequence::accept`] decided about a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Accepted {
    /// Handle it; `ack_due` when it completes a batch of [`ACK_EVERY`].
    Handle { ack_due: bool },
    /// Seen already (a replay after a resume, or a repeated answer): drop it.
    Repeat,
}

/// What a dropped link leaves for resuming its session: the latest token the gate gave
/// it and the session's sequence.
#[derive(Debug, Clone)]
pub(crate) struct Resume {
    pub(crate) token: String,
    pub(crate) sequence: Arc<Sequence>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnumbered_frames_are_always_handled_and_never_counted() {
        let s = Sequence::default();
        for _ in 0..2 * ACK_EVERY {
            assert_eq!(s.accept(0), Accepted::Handle { ack_due: false });
        }
        assert!(!s.ack_due());
        assert_eq!(s.last(), 0);
    }

    #[test]
    fn a_seq_not_above_the_last_is_a_repeat() {
        let s = Sequence::default();
        assert_eq!(s.accept(1), Accepted::Handle { ack_due: false });
        assert_eq!(s.accept(1), Accepted::Repeat);
        assert_eq!(s.accept(3), Accepted::Handle { ack_due: false });
        assert_eq!(s.accept(2), Accepted::Repeat);
        assert_eq!(s.last(), 3);
    }

    #[test]
    fn an_ack_is_due_every_64_frames_handled() {
        let s = Sequence::default();
        for seq in 1..u64::from(ACK_EVERY) {
            assert_eq!(s.accept(seq), Accepted::Handle { ack_due: false });
        }
        // Repeats do not count.
        assert_eq!(s.accept(1), Accepted::Repeat);
        assert!(!s.ack_due());
        let seq = u64::from(ACK_EVERY);
        assert_eq!(s.accept(seq), Accepted::Handle { ack_due: true });
        assert!(s.ack_due());
        assert_eq!(s.take_ack(), seq);
        assert!(!s.ack_due());
        assert_eq!(s.accept(seq + 1), Accepted::Handle { ack_due: false });
    }
}
