//! A client's requests in flight: a ring of send times indexed by slot. Slots go out in
//! order, so those in flight are a window `first..first + len`; the ring holds each one's
//! send time (nothing once answered) and drops answered ones from its front, so the front
//! is the oldest still waiting, the only one a timeout check looks at. No hashing, and
//! no allocation per request once the ring has grown to the client's usual backlog.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct InFlight {
    /// The slot of the ring's front.
    first: u64,
    sent: VecDeque<Option<Instant>>,
}

impl InFlight {
    /// Slot `slot` was sent at `sent`. Slots come in increasing order; a gap (never
    /// made by the client) is held as answered slots.
    pub fn push(&mut self, slot: u64, sent: Instant) {
        if self.sent.is_empty() {
            self.first = slot;
        }
        let end = self.first + self.sent.len() as u64;
        if slot < end {
            return;
        }
        self.sent.extend((end..slot).map(|_| None));
        self.sent.push_back(Some(sent));
    }

    /// The send time of `slot` if it is still waiting, which it no longer is.
    pub fn take(&mut self, slot: u64) -> Option<Instant> {
        let index = usize::try_from(slot.checked_sub(self.first)?).ok()?;
        let sent = self.sent.get_mut(index)?.take()?;
        while let Some(None) = self.sent.front() {
            self.sent.pop_front();
            self.first += 1;
        }
        Some(sent)
    }

    /// The oldest request still waiting, if it was sent `timeout` or more before `now`.
    pub fn pop_expired(&mut self, now: Instant, timeout: Duration) -> Option<(u64, Instant)> {
        let (slot, sent) = self.oldest()?;
        if sent + timeout > now {
            return None;
        }
        self.take(slot).map(|sent| (slot, sent))
    }

    /// The oldest request still waiting: its slot and send time.
    pub fn oldest(&self) -> Option<(u64, Instant)> {
        (*self.sent.front()?).map(|sent| (self.first, sent))
    }

    /// Every request still waiting, oldest first; the ring is then empty.
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, Instant)> + '_ {
        let first = self.first;
        self.sent
            .drain(..)
            .enumerate()
            .filter_map(move |(i, sent)| Some((first + i as u64, sent?)))
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn answers_in_any_order_leave_the_oldest_waiting_at_the_front() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        for slot in 10..15 {
            f.push(slot, t0 + (slot as u32) * MS);
        }
        assert_eq!(f.take(12), Some(t0 + 12 * MS));
        assert_eq!(f.take(12), None, "answered once");
        assert_eq!(f.oldest(), Some((10, t0 + 10 * MS)));
        assert_eq!(f.take(10), Some(t0 + 10 * MS));
        assert_eq!(f.take(11), Some(t0 + 11 * MS));
        // 12 was answered already: the front moves past it to 13.
        assert_eq!(f.oldest(), Some((13, t0 + 13 * MS)));
        assert_eq!(f.take(9), None, "before the window");
        assert_eq!(f.take(99), None, "after the window");
        assert_eq!(f.take(13), Some(t0 + 13 * MS));
        assert_eq!(f.take(14), Some(t0 + 14 * MS));
        assert!(f.is_empty());
        // An empty ring starts over at the next slot pushed.
        f.push(40, t0);
        assert_eq!(f.oldest(), Some((40, t0)));
    }

    #[test]
    fn only_requests_past_their_timeout_expire_oldest_first() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        for slot in 0..4 {
            f.push(slot, t0 + (slot as u32) * MS);
        }
        f.take(1);
        let now = t0 + 12 * MS;
        let timeout = 10 * MS;
        assert_eq!(f.pop_expired(now, timeout), Some((0, t0)));
        assert_eq!(f.pop_expired(now, timeout), Some((2, t0 + 2 * MS)));
        assert_eq!(f.pop_expired(now, timeout), None, "slot 3 has 1 ms left");
        assert_eq!(f.oldest(), Some((3, t0 + 3 * MS)));
    }
}
