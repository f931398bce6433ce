//! Recently closed sessions (tombstones): a join still queued for one of them is ignored
//! (see `rooms.rs`). Every replica holds one for each logged-in session closed within
//! [`TOMBSTONE_TTL`], at most [`MAX_TOMBSTONES`].
//!
//! Two arrays, each allocated once, at the first close, and never grown: a ring of
//! tombstones in closing order and a hash set of the same for lookup. Not a node per
//! tombstone: under churn, tree nodes that outlive the sessions allocated around them
//! kept the allocator's pages of those sessions resident, up to 1.7 MB more in a
//! `shaddock up` after 200,000 sessions, a different amount each run (issue #34,
//! docs/benchmarks.md "Session churn").

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::session_key::SessionKey;

/// How long a closed session is remembered. A join for it can only still be waiting if
/// it sat in a worker's queue past the close: the gate gives up on a request after its
/// request timeout (5 s by default), so a worker that far behind is already failing its
/// clients. Three request timeouts is the margin. Longer costs memory under churn: a
/// replica holds a tombstone for every logged-in session closed within the TTL.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(15);
/// Closed sessions remembered at most: a TTL's worth up to about 950 closes a second per
/// replica; past it the oldest are forgotten early. The most a set of 32,768 slots holds
/// at half load, where forgetting one and adding the next always reuse its slots instead
/// of moving it to twice the room. At the bound, ring and set take 46 bytes a tombstone,
/// 0.65 MB.
pub const MAX_TOMBSTONES: usize = 14_336;

/// The set's slots: twice the bound, so it stays at most half full.
const SET_CAPACITY: usize = 2 * MAX_TOMBSTONES;

/// A closing instant, in tenths of a second after the first close: a tombstone in 16
/// bytes, and 13 years before it wraps.
type Tenths = u32;

/// A tombstone in the ring.
#[derive(Debug, Clone, Copy)]
struct Closed {
    at: Tenths,
    key: Key,
}

/// A session as the set holds it: its gate by index, 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C, packed)]
struct Key {
    gate: u32,
    sid: u64,
}

/// A gate whose sessions have tombstones (an emptied slot is reused).
#[derive(Debug, Default)]
struct Gate {
    id: String,
    held: usize,
}

/// Recently closed sessions, forgotten after [`TOMBSTONE_TTL`], or the oldest first when
/// another comes while [`MAX_TOMBSTONES`] are held.
#[derive(Debug, Default)]
pub(super) struct Tombstones {
    /// When the first tombstone came: what [`Tenths`] count from.
    epoch: Option<Instant>,
    /// The gates named by the tombstones, by index (a gate's id is stored once).
    gates: Vec<Gate>,
    /// In closing order, with when.
    order: VecDeque<Closed>,
    /// The same, for lookup.
    keys: HashSet<Key>,
}

impl Tombstones {
    pub(super) fn insert(&mut self, key: SessionKey, now: Instant) {
        if self.contains(&key, now) {
            return;
        }
        // Room first, so neither array ever holds more than the bound.
        while self.order.len() >= MAX_TOMBSTONES {
            self.forget_oldest();
        }
        if self.order.capacity() == 0 {
            self.order.reserve_exact(MAX_TOMBSTONES);
            self.keys.reserve(SET_CAPACITY);
        }
        self.epoch.get_or_insert(now);
        let at = self.tenths(now);
        let gate = match self.gate(&key.gate) {
            Some(i) => i,
            None => self.free_gate(key.gate),
        };
        self.gates[gate].held += 1;
        let key = Key {
            gate: gate as u32,
            sid: key.sid,
        };
        self.keys.insert(key);
        self.order.push_back(Closed { at, key });
    }

    pub(super) fn contains(&mut self, key: &SessionKey, now: Instant) -> bool {
        self.expire(now);
        self.gate(&key.gate).is_some_and(|gate| {
            self.keys.contains(&Key {
                gate: gate as u32,
                sid: key.sid,
            })
        })
    }

    /// Those held within the TTL, by gate id, in closing order within a gate: the same
    /// order on every replica, whatever order the gates' closes interleaved in.
    pub(super) fn live(&self, now: Instant) -> Vec<SessionKey> {
        let now = self.tenths(now);
        let mut live: Vec<&Closed> = (self.order.iter())
            .filter(|c| !Self::expired(c.at, now))
            .collect();
        live.sort_by_key(|c| &self.gates[c.key.gate as usize].id);
        (live.into_iter())
            .map(|c| SessionKey {
                gate: self.gates[c.key.gate as usize].id.clone(),
                sid: c.key.sid,
            })
            .collect()
    }

    /// Tombstones held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// Gates with tombstones held.
    #[cfg(test)]
    pub(super) fn gates(&self) -> usize {
        self.gates.iter().filter(|g| g.held > 0).count()
    }

    fn expire(&mut self, now: Instant) {
        let now = self.tenths(now);
        while let Some(&Closed { at, .. }) = self.order.front() {
            if !Self::expired(at, now) {
                break;
            }
            self.forget_oldest();
        }
    }

    /// Whether a tombstone of `at` is past the TTL at `now`: more than the TTL's tenths
    /// apart, both rounded down, so never before the TTL and at most a tenth after.
    fn expired(at: Tenths, now: Tenths) -> bool {
        u128::from(now.saturating_sub(at)) * 100 > TOMBSTONE_TTL.as_millis()
    }

    /// Forgets the tombstone held longest, whichever gate's it is.
    fn forget_oldest(&mut self) {
        let Some(Closed { key, .. }) = self.order.pop_front() else {
            return;
        };
        self.keys.remove(&key);
        let gate = &mut self.gates[key.gate as usize];
        gate.held -= 1;
        if gate.held == 0 {
            gate.id = String::new();
        }
    }

    /// The slot of gate `id`, while it has tombstones.
    fn gate(&self, id: &str) -> Option<usize> {
        self.gates.iter().position(|g| g.held > 0 && g.id == id)
    }

    /// A slot for gate `id`: an emptied one, or a new one.
    fn free_gate(&mut self, id: String) -> usize {
        let free = self.gates.iter().position(|g| g.held == 0);
        let slot = free.unwrap_or_else(|| {
            self.gates.push(Gate::default());
            self.gates.len() - 1
        });
        self.gates[slot].id = id;
        slot
    }

    /// `now` in tenths of a second after the first tombstone, rounded down.
    fn tenths(&self, now: Instant) -> Tenths {
        let Some(epoch) = self.epoch else {
            return 0;
        };
        let tenths = now.saturating_duration_since(epoch).as_millis() / 100;
        Tenths::try_from(tenths).unwrap_or(Tenths::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::super::session_key::key;
    use super::*;

    #[test]
    fn tombstones_are_bounded_and_expire() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        for sid in 0..(MAX_TOMBSTONES as u64 + 10) {
            t.insert(key("g", sid), now);
        }
        assert_eq!(t.len(), MAX_TOMBSTONES);
        assert_eq!(t.keys.len(), MAX_TOMBSTONES);
        assert!(!t.contains(&key("g", 0), now));
        assert!(t.contains(&key("g", 20), now));
        assert!(
            !t.contains(&key("h", 20), now),
            "the same sid of another gate"
        );
        assert!(t.contains(&key("g", 20), now + TOMBSTONE_TTL));
        let past = now + TOMBSTONE_TTL + Duration::from_millis(100);
        assert!(
            !t.contains(&key("g", 20), past),
            "forgotten a tenth after the TTL"
        );
        assert_eq!((t.len(), t.keys.len(), t.gates()), (0, 0, 0));
    }

    #[test]
    fn past_the_bound_the_oldest_tombstone_goes_whichever_its_gate() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        t.insert(key("g2", 1), now);
        for sid in 0..MAX_TOMBSTONES as u64 {
            t.insert(key("g1", sid), now + Duration::from_millis(100));
        }
        assert_eq!(t.len(), MAX_TOMBSTONES);
        assert!(!t.contains(&key("g2", 1), now));
        assert!(t.contains(&key("g1", 0), now));
        assert_eq!(t.gates(), 1, "an emptied gate is dropped");
        t.insert(key("g3", 1), now + Duration::from_millis(200));
        assert_eq!(t.gates.len(), 2, "and its slot reused");
        assert!(t.contains(&key("g3", 1), now + Duration::from_millis(200)));
    }

    #[test]
    fn a_churn_at_the_bound_never_moves_the_arrays() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        t.insert(key("g", 0), now);
        let (order, keys) = (t.order.capacity(), t.keys.capacity());
        assert!(order >= MAX_TOMBSTONES && keys >= SET_CAPACITY);
        for sid in 1..20 * MAX_TOMBSTONES as u64 {
            let gate = if sid % 3 == 0 { "a" } else { "b" };
            t.insert(key(gate, sid), now);
        }
        assert_eq!(t.len(), MAX_TOMBSTONES);
        // The set's capacity counts free slots only: a slot deleted rather than emptied
        // is not, until rehashed in place. Moved to twice the room, it would be above.
        assert_eq!(t.order.capacity(), order);
        assert!((MAX_TOMBSTONES..=keys).contains(&t.keys.capacity()));
    }

    #[test]
    fn live_lists_by_gate_then_closing_order() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        for (gate, sid) in [("b", 9), ("a", 5), ("b", 2), ("a", 1)] {
            t.insert(key(gate, sid), now);
        }
        let later = now + Duration::from_secs(1);
        t.insert(key("c", 3), later);
        let listed: Vec<(String, u64)> = (t.live(now + TOMBSTONE_TTL).into_iter())
            .map(|k| (k.gate, k.sid))
            .collect();
        assert_eq!(listed.len(), 5, "at the TTL, all are held");
        let past = now + TOMBSTONE_TTL + Duration::from_millis(100);
        let listed: Vec<(String, u64)> = (t.live(past).into_iter())
            .map(|k| (k.gate, k.sid))
            .collect();
        assert_eq!(listed, [("c".to_owned(), 3)], "expired ones are left out");
        let listed: Vec<(String, u64)> = (t.live(later).into_iter())
            .map(|k| (k.gate, k.sid))
            .collect();
        let want = [("a", 5), ("a", 1), ("b", 9), ("b", 2), ("c", 3)];
        assert_eq!(listed, want.map(|(g, s)| (g.to_owned(), s)));
    }
}
