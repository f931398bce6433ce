//! What a resumable session has sent and its client has not acknowledged: every push and
//! answer, numbered, kept until the client's `ack` covers it, so that a client whose
//! link dropped gets them again when it resumes (docs/protocol.md, "Resume").
//!
//! Bounded by `--resume-buffer` frames and `--resume-buffer-bytes`: past either, the
//! oldest go, and the `floor` (below which a resume cannot start) rises with them.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use tokio_tungstenite::tungstenite::Message;

/// A frame sent and not yet acknowledged.
pub(super) struct Kept {
    pub seq: u64,
    pub frame: Message,
    /// The request it answers; 0 for a push.
    pub answers: u64,
}

pub(super) struct Replay {
    frames: VecDeque<Kept>,
    /// The seq of each answer kept, by request id: a request sent again is looked up
    /// here on every request of the session, so not by a scan.
    answers: FxHashMap<u64, u64>,
    bytes: usize,
    max_frames: usize,
    max_bytes: usize,
    /// The last seq given.
    seq: u64,
    /// Every frame up to this seq is gone (acknowledged, or let go past the bounds): a
    /// resume must start at or after it.
    floor: u64,
}

/// Why frames after a client's `last_seq` cannot be sent again.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Missing {
    /// Let go of (past the bounds) or acknowledged already.
    Gone,
    /// The client claims frames the session never sent.
    Ahead,
}

impl Replay {
    /// An empty buffer whose next frame is `seq + 1`.
    pub(super) fn new(seq: u64, max_frames: usize, max_bytes: usize) -> Self {
        Replay {
            frames: VecDeque::new(),
            answers: FxHashMap::default(),
            bytes: 0,
            max_frames: max_frames.max(1),
            max_bytes,
            seq,
            floor: seq,
        }
    }

    /// The seq of the next frame, now given.
    pub(super) fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The last seq given.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// Keeps the frame just numbered; `false` when the bounds made older frames go.
    pub(super) fn keep(&mut self, frame: Message, answers: u64) -> bool {
        self.bytes += frame.len();
        if answers != 0 {
            self.answers.insert(answers, self.seq);
        }
        self.frames.push_back(Kept {
            seq: self.seq,
            frame,
            answers,
        });
        let mut kept_all = true;
        while self.frames.len() > self.max_frames
            || (self.bytes > self.max_bytes && self.frames.len() > 1)
        {
            self.pop();
            kept_all = false;
        }
        kept_all
    }

    fn pop(&mut self) {
        if let Some(gone) = self.frames.pop_front() {
            self.bytes -= gone.frame.len();
            self.floor = gone.seq;
            if gone.answers != 0 {
                self.answers.remove(&gone.answers);
            }
        }
    }

    /// The client has every frame up to `seq`.
    pub(super) fn ack(&mut self, seq: u64) {
        while self.frames.front().is_some_and(|k| k.seq <= seq) {
            self.pop();
        }
    }

    /// Every frame after `last_seq`, in order.
    pub(super) fn since(&self, last_seq: u64) -> Result<impl Iterator<Item = &Kept>, Missing> {
        if last_seq > self.seq {
            return Err(Missing::Ahead);
        }
        if last_seq < self.floor {
            return Err(Missing::Gone);
        }
        Ok(self.frames.iter().filter(move |k| k.seq > last_seq))
    }

    /// The answer to request `id`, while it is kept.
    pub(super) fn answer(&self, id: u64) -> Option<&Message> {
        let seq = *self.answers.get(&id)?;
        let first = self.frames.front()?.seq;
        let kept = self
            .frames
            .get(usize::try_from(seq.checked_sub(first)?).ok()?)?;
        Some(&kept.frame)
    }

    /// Frames kept now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: usize) -> Message {
        Message::binary(vec![0; n])
    }

    fn seqs(replay: &Replay, last_seq: u64) -> Result<Vec<u64>, Missing> {
        replay.since(last_seq).map(|k| k.map(|k| k.seq).collect())
    }

    #[test]
    fn frames_are_numbered_kept_until_acknowledged_and_found_by_request() {
        let mut replay = Replay::new(0, 8, 1024);
        for answers in [0, 7, 0] {
            replay.next();
            assert!(replay.keep(frame(1), answers));
        }
        assert_eq!(seqs(&replay, 0), Ok(vec![1, 2, 3]));
        assert_eq!(seqs(&replay, 2), Ok(vec![3]));
        assert_eq!(seqs(&replay, 3), Ok(vec![]));
        assert_eq!(seqs(&replay, 4).unwrap_err(), Missing::Ahead);
        assert!(replay.answer(7).is_some());
        assert!(replay.answer(8).is_none());
        replay.ack(2);
        assert_eq!(replay.len(), 1);
        assert!(replay.answer(7).is_none());
        // Acknowledged frames cannot be asked for again.
        assert_eq!(seqs(&replay, 1).unwrap_err(), Missing::Gone);
        assert_eq!(seqs(&replay, 2), Ok(vec![3]));
    }

    #[test]
    fn past_either_bound_the_oldest_go_and_a_resume_before_them_is_refused() {
        let mut replay = Replay::new(10, 2, 1024);
        for _ in 0..2 {
            replay.next();
            assert!(replay.keep(frame(1), 0));
        }
        replay.next();
        assert!(!replay.keep(frame(1), 0), "one frame too many");
        assert_eq!(seqs(&replay, 11), Ok(vec![12, 13]));
        assert_eq!(seqs(&replay, 10).unwrap_err(), Missing::Gone);

        let mut replay = Replay::new(0, 100, 10);
        replay.next();
        // Alone, a frame past the byte bound is kept.
        assert!(replay.keep(frame(12), 0));
        replay.next();
        assert!(!replay.keep(frame(4), 0));
        assert_eq!(seqs(&replay, 1), Ok(vec![2]));
    }
}
