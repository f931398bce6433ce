//! The sessions open on this gate, by sid: where the bus reader hands each session its
//! replies, pushes and kicks. A session registers its queue once its handshake is
//! accepted and is removed before it gives back what it holds.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::time::Instant;

use crate::inbox::{Refused, SessionTx, ToSession};

/// The sid a session never has: sid 0 of a reply subject is the gate's own (bind
/// probes), so sessions count from above it.
pub(crate) const GATE_SID: u64 = 0;

/// Bits of a gate's first sid below its start time in milliseconds: sessions a gate
/// may open per millisecond it has run (1,024, a million a second) before its sids
/// could reach those of a later start under the same `--gate-id`. Kept small so sids
/// stay below 2^53 (exact as a JavaScript number) for two centuries.
const SID_TIME_SHIFT: u32 = 10;

/// The first sid of a gate started now: its start time, in milliseconds since the
/// Unix epoch, shifted by [`SID_TIME_SHIFT`]. A session's reply prefix
/// (`<prefix>.gw.<gate>.<sid>`) is the origin keyed workers remember requests by
/// (docs/workers.md, "Order across subscriptions"), so a gate restarted under the
/// same id must not hand out the sids of its previous run: their requests would look
/// like ones already taken.
fn first_sid(now: std::time::SystemTime) -> u64 {
    let millis = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    (millis << SID_TIME_SHIFT).max(GATE_SID + 1)
}

#[derive(Debug)]
pub(crate) struct Sessions {
    queues: DashMap<u64, SessionTx>,
    next_sid: AtomicU64,
    /// Sessions handed over to another gate, by sid: the reply subject prefix their
    /// requests still in flight are answered on there.
    moved: DashMap<u64, String>,
    /// When each entry of `moved` may go, in that order.
    moved_until: Mutex<VecDeque<(Instant, u64)>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            queues: DashMap::new(),
            next_sid: AtomicU64::new(first_sid(std::time::SystemTime::now())),
            moved: DashMap::new(),
            moved_until: Mutex::default(),
        }
    }
}

impl Sessions {
    /// A sid no session of this gate has had.
    pub(crate) fn next_sid(&self) -> u64 {
        self.next_sid.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn insert(&self, sid: u64, tx: SessionTx) {
        self.queues.insert(sid, tx);
    }

    pub(crate) fn remove(&self, sid: u64) {
        self.queues.remove(&sid);
    }

    /// Session `sid` moved to another gate, whose replies to its requests still in
    /// flight are relayed to `reply_prefix` until `until` (their timeout).
    pub(crate) fn moved(&self, sid: u64, reply_prefix: String, until: Instant) {
        let mut expiries = self
            .moved_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        while let Some(&(at, old)) = expiries.front() {
            if at > now {
                break;
            }
            expiries.pop_front();
            self.moved.remove(&old);
        }
        expiries.push_back((until, sid));
        self.moved.insert(sid, reply_prefix);
    }

    /// Where replies for session `sid` go now, if it moved to another gate.
    pub(crate) fn moved_to(&self, sid: u64) -> Option<String> {
        self.moved.get(&sid).map(|p| p.clone())
    }

    /// Sessions open now.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Queues `msg` for session `sid` without waiting (under the map's read guard: no
    /// clone of the sender per message). See [`SessionTx::offer`].
    pub(crate) fn offer(&self, sid: u64, msg: ToSession) -> Result<(), Refused> {
        match self.queues.get(&sid) {
            Some(tx) => tx.offer(msg),
            None => Err(Refused::Gone),
        }
    }

    /// Queues `msg` for session `sid` if its queue has room, without telling a full one
    /// to close (see [`SessionTx::offer_if_room`]).
    pub(crate) fn offer_if_room(&self, sid: u64, msg: ToSession) -> Result<(), Refused> {
        match self.queues.get(&sid) {
            Some(tx) => tx.offer_if_room(msg),
            None => Err(Refused::Gone),
        }
    }

    /// Offers every open session the message `make` builds for it.
    pub(crate) fn offer_all(&self, make: impl Fn() -> ToSession) {
        for tx in self.queues.iter() {
            // A full queue is a session behind on pushes: it closes as too slow.
            let _ = tx.offer(make());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox;

    #[test]
    fn offers_reach_registered_sessions_only() {
        let sessions = Sessions::default();
        let sid = sessions.next_sid();
        assert_ne!(sid, GATE_SID);
        assert_eq!(sessions.offer(sid, ToSession::BusLost), Err(Refused::Gone));
        let (tx, mut rx) = inbox::channel(1);
        sessions.insert(sid, tx);
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions.offer(sid, ToSession::BusLost), Ok(()));
        assert_eq!(sessions.offer(sid, ToSession::BusLost), Err(Refused::Full));
        assert!(matches!(rx.rx.try_recv(), Ok(ToSession::Overflowed)));
        assert!(matches!(rx.rx.try_recv(), Ok(ToSession::BusLost)));
        sessions.offer_all(|| ToSession::Kick("bye".into()));
        assert!(matches!(rx.rx.try_recv(), Ok(ToSession::Kick(r)) if r == "bye"));
        sessions.remove(sid);
        assert_eq!(sessions.len(), 0);
        assert_eq!(sessions.offer(sid, ToSession::BusLost), Err(Refused::Gone));
    }

    #[test]
    fn a_gate_started_later_never_reuses_the_sids_of_an_earlier_start() {
        use std::time::{Duration, UNIX_EPOCH};
        let start = UNIX_EPOCH + Duration::from_millis(1_765_000_000_000);
        let first = first_sid(start);
        // A run that opened a session for every millisecond's whole share, then a
        // restart one millisecond later: the ranges meet and do not overlap.
        let earlier_last = first + (1 << SID_TIME_SHIFT) - 1;
        assert_eq!(
            first_sid(start + Duration::from_millis(1)),
            earlier_last + 1
        );
        // A clock before 1970 still gives a sid that is not the gate's own.
        assert_eq!(first_sid(UNIX_EPOCH - Duration::from_secs(1)), GATE_SID + 1);
        assert!(Sessions::default().next_sid() > first);
    }
}
