//! The membership state every chat worker holds a replica of: who (which session, under
//! which name) is in which room, and which sessions closed recently.
//!
//! Changes are operations on single sessions: add session `s` to room `r`, remove it,
//! remove it from everything (closed). Adding and removing *different* sessions commute,
//! and the operations on one session are ordered by that session's own causality (its
//! join is answered before its leave is sent; its close comes after everything it was
//! answered), so replicas that apply the same changes in different interleavings end
//! equal. Each operation is also idempotent, so a change applied twice (once in a
//! snapshot, once from the bus) does no harm.
//!
//! One race is not ordered by causality: a join still in a worker's queue when its
//! session closes. The close event may then be applied before the join's change. So a
//! closed session is remembered (a tombstone) for [`TOMBSTONE_TTL`], and a join for a
//! tombstoned session is ignored, by every replica alike.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use proto::chat::{Member, SessionRef, Snapshot, StateChange, state_change};

/// How long a closed session is remembered. A join for it can only still be waiting if
/// it sat in a worker's queue past the close: the gate gives up on a request after its
/// request timeout (5 s by default), so a worker that far behind is already failing its
/// clients. Three request timeouts is the margin. Longer costs memory under churn: a
/// replica holds a tombstone for every logged-in session closed within the TTL (at 1,000
/// closes a second, 15,000 of them, 0.7 MB).
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(15);
/// Closed sessions remembered at most: bounds the memory a burst of disconnects takes
/// (about 44 bytes a tombstone: 0.7 MB). Past it the oldest are forgotten early, which
/// still leaves a TTL's worth up to about 1,100 closes a second per replica.
pub const MAX_TOMBSTONES: usize = 16_384;

/// A session, as the gates name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    pub gate: String,
    pub sid: u64,
}

impl From<&Member> for SessionKey {
    fn from(m: &Member) -> Self {
        SessionKey {
            gate: m.gate.clone(),
            sid: m.sid,
        }
    }
}

impl From<SessionRef> for SessionKey {
    fn from(s: SessionRef) -> Self {
        SessionKey {
            gate: s.gate,
            sid: s.sid,
        }
    }
}

/// One replica of the chat's membership state.
#[derive(Debug, Default)]
pub struct Rooms {
    /// Room → session → the player's name.
    rooms: HashMap<String, BTreeMap<SessionKey, String>>,
    /// Session → the rooms it is in: what a close removes.
    sessions: HashMap<SessionKey, BTreeSet<String>>,
    closed: Tombstones,
}

impl Rooms {
    /// Applies one change (from the bus, or from a snapshot).
    pub fn apply(&mut self, change: StateChange, now: Instant) {
        match change.kind {
            Some(state_change::Kind::Join(m)) => self.join(m, now),
            Some(state_change::Kind::Leave(m)) => self.leave(&m),
            Some(state_change::Kind::Closed(s)) => self.close(s.into(), now),
            None => {}
        }
    }

    fn join(&mut self, m: Member, now: Instant) {
        let key = SessionKey::from(&m);
        if self.closed.contains(&key, now) {
            return;
        }
        self.sessions
            .entry(key.clone())
            .or_default()
            .insert(m.room.clone());
        self.rooms.entry(m.room).or_default().insert(key, m.name);
    }

    fn leave(&mut self, m: &Member) {
        let key = SessionKey::from(m);
        self.remove(&m.room, &key);
        if let Some(rooms) = self.sessions.get_mut(&key) {
            rooms.remove(&m.room);
            if rooms.is_empty() {
                self.sessions.remove(&key);
            }
        }
    }

    fn close(&mut self, key: SessionKey, now: Instant) {
        for room in self.sessions.remove(&key).unwrap_or_default() {
            self.remove(&room, &key);
        }
        self.closed.insert(key, now);
    }

    fn remove(&mut self, room: &str, key: &SessionKey) {
        if let Some(members) = self.rooms.get_mut(room) {
            members.remove(key);
            if members.is_empty() {
                self.rooms.remove(room);
            }
        }
    }

    /// Whether session `key` is in `room`.
    pub fn is_member(&self, room: &str, key: &SessionKey) -> bool {
        self.rooms.get(room).is_some_and(|m| m.contains_key(key))
    }

    /// The names in `room`, sorted, each once (a name may briefly have two sessions in
    /// a room while a second login replaces the first).
    pub fn members(&self, room: &str) -> Vec<String> {
        let names: BTreeSet<&String> = self
            .rooms
            .get(room)
            .into_iter()
            .flat_map(|m| m.values())
            .collect();
        names.into_iter().cloned().collect()
    }

    /// The rooms session `key` is in, with its name in each.
    pub fn rooms_of(&self, key: &SessionKey) -> Vec<(String, String)> {
        let Some(rooms) = self.sessions.get(key) else {
            return Vec::new();
        };
        rooms
            .iter()
            .filter_map(|room| {
                let name = self.rooms.get(room)?.get(key)?;
                Some((room.clone(), name.clone()))
            })
            .collect()
    }

    /// How many rooms session `key` is in.
    pub fn room_count(&self, key: &SessionKey) -> usize {
        self.sessions.get(key).map_or(0, BTreeSet::len)
    }

    /// Rooms with members, for metrics and tests.
    pub fn len(&self) -> usize {
        self.rooms.len()
    }

    /// Whether no room has members.
    pub fn is_empty(&self) -> bool {
        self.rooms.is_empty()
    }

    /// The whole state, for a starting peer.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let members = self
            .rooms
            .iter()
            .flat_map(|(room, members)| {
                members.iter().map(move |(key, name)| Member {
                    room: room.clone(),
                    name: name.clone(),
                    gate: key.gate.clone(),
                    sid: key.sid,
                })
            })
            .collect();
        let closed = self
            .closed
            .live(now)
            .map(|key| SessionRef {
                gate: key.gate,
                sid: key.sid,
            })
            .collect();
        Snapshot { members, closed }
    }

    /// Replaces this replica with a peer's snapshot: tombstones first, so a member the
    /// snapshot lists for a session that closed meanwhile stays out. Whatever this
    /// replica held goes, so a worker back from a lost connection also forgets the
    /// leaves and closes it missed; a change it applied before the snapshot reached the
    /// peer first, so the snapshot holds it (see `worker/resync.rs`).
    pub fn restore(&mut self, snapshot: Snapshot, now: Instant) {
        *self = Rooms::default();
        for closed in snapshot.closed {
            self.close(closed.into(), now);
        }
        for member in snapshot.members {
            self.join(member, now);
        }
    }
}

/// Recently closed sessions, forgotten after [`TOMBSTONE_TTL`], or the oldest first when
/// another comes while [`MAX_TOMBSTONES`] are held.
///
/// Every replica holds one for each logged-in session closed in the last minute: at a
/// thousand sessions closed a second, sixty thousand. So they are kept small, by gate
/// (a gate's id is stored once, not in every tombstone): a sid and its closing instant
/// in the gate's queue, and the sid in the gate's set, about 44 bytes a tombstone where
/// a key with its own gate string, in a queue and a hash set, took 140 (issue #34).
#[derive(Debug, Default)]
struct Tombstones {
    /// By gate id; ordered, so snapshots list tombstones in the same order everywhere.
    gates: BTreeMap<String, GateTombstones>,
    /// Tombstones held, over all gates.
    len: usize,
}

/// One gate's closed sessions.
#[derive(Debug, Default)]
struct GateTombstones {
    /// In the order they were closed, with when.
    order: VecDeque<(Instant, u64)>,
    /// A B-tree rather than a hash set: under a steady churn at the bound (one in, one
    /// out), a hash table's deleted slots make it rehash into twice the room, where a
    /// B-tree frees the nodes it empties.
    sids: BTreeSet<u64>,
}

impl Tombstones {
    fn insert(&mut self, key: SessionKey, now: Instant) {
        if self.contains(&key, now) {
            return;
        }
        // Room first, so no queue ever holds more than the bound (nor doubles past it).
        while self.len >= MAX_TOMBSTONES {
            self.forget_oldest();
        }
        let gate = self.gates.entry(key.gate).or_default();
        gate.sids.insert(key.sid);
        gate.order.push_back((now, key.sid));
        self.len += 1;
    }

    fn contains(&mut self, key: &SessionKey, now: Instant) -> bool {
        self.expire(now);
        self.gates
            .get(&key.gate)
            .is_some_and(|gate| gate.sids.contains(&key.sid))
    }

    fn live(&self, now: Instant) -> impl Iterator<Item = SessionKey> + '_ {
        self.gates.iter().flat_map(move |(gate, tombstones)| {
            tombstones
                .order
                .iter()
                .filter(move |(at, _)| now.saturating_duration_since(*at) < TOMBSTONE_TTL)
                .map(|&(_, sid)| SessionKey {
                    gate: gate.clone(),
                    sid,
                })
        })
    }

    fn expire(&mut self, now: Instant) {
        let mut expired = 0;
        self.gates.retain(|_, gate| {
            while let Some(&(at, sid)) = gate.order.front() {
                if now.saturating_duration_since(at) < TOMBSTONE_TTL {
                    break;
                }
                gate.order.pop_front();
                gate.sids.remove(&sid);
                expired += 1;
            }
            !gate.order.is_empty()
        });
        self.len -= expired;
    }

    /// Forgets the tombstone held longest, whichever gate's it is.
    fn forget_oldest(&mut self) {
        let oldest = self
            .gates
            .iter()
            .filter_map(|(id, gate)| Some((gate.order.front()?.0, id)))
            .min()
            .map(|(_, id)| id.clone());
        let Some(id) = oldest else {
            return;
        };
        if let Some(gate) = self.gates.get_mut(&id) {
            if let Some((_, sid)) = gate.order.pop_front() {
                gate.sids.remove(&sid);
                self.len -= 1;
            }
            if gate.order.is_empty() {
                self.gates.remove(&id);
            }
        }
    }
}

/// A join of `name`'s session `(gate, sid)` to `room`, as published.
pub fn join_change(room: &str, name: &str, key: &SessionKey) -> StateChange {
    StateChange {
        kind: Some(state_change::Kind::Join(member(room, name, key))),
    }
}

/// A leave, as published.
pub fn leave_change(room: &str, name: &str, key: &SessionKey) -> StateChange {
    StateChange {
        kind: Some(state_change::Kind::Leave(member(room, name, key))),
    }
}

/// A session's close, as published.
pub fn closed_change(key: &SessionKey) -> StateChange {
    StateChange {
        kind: Some(state_change::Kind::Closed(SessionRef {
            gate: key.gate.clone(),
            sid: key.sid,
        })),
    }
}

fn member(room: &str, name: &str, key: &SessionKey) -> Member {
    Member {
        room: room.to_owned(),
        name: name.to_owned(),
        gate: key.gate.clone(),
        sid: key.sid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(gate: &str, sid: u64) -> SessionKey {
        SessionKey {
            gate: gate.into(),
            sid,
        }
    }

    fn state(changes: &[StateChange], now: Instant) -> Rooms {
        let mut rooms = Rooms::default();
        for c in changes {
            rooms.apply(c.clone(), now);
        }
        rooms
    }

    #[test]
    fn join_leave_and_close_change_membership() {
        let now = Instant::now();
        let (a, b) = (key("g1", 1), key("g2", 1));
        let mut rooms = state(
            &[
                join_change("lobby", "alice", &a),
                join_change("lobby", "bob", &b),
                join_change("den", "alice", &a),
            ],
            now,
        );
        assert_eq!(rooms.members("lobby"), ["alice", "bob"]);
        assert_eq!(rooms.room_count(&a), 2);
        rooms.apply(leave_change("lobby", "bob", &b), now);
        assert_eq!(rooms.members("lobby"), ["alice"]);
        rooms.apply(closed_change(&a), now);
        assert!(rooms.is_empty());
        assert_eq!(rooms.room_count(&a), 0);
        assert!(rooms.sessions.is_empty());
    }

    #[test]
    fn concurrent_changes_of_different_sessions_commute() {
        let now = Instant::now();
        let (old, new) = (key("g1", 1), key("g2", 7));
        // alice logs in again on g2 and joins while her old session's close is applied.
        let one = [
            join_change("lobby", "alice", &old),
            join_change("lobby", "alice", &new),
            closed_change(&old),
        ];
        let two = [
            join_change("lobby", "alice", &old),
            closed_change(&old),
            join_change("lobby", "alice", &new),
        ];
        for rooms in [state(&one, now), state(&two, now)] {
            assert_eq!(rooms.members("lobby"), ["alice"]);
            assert!(rooms.is_member("lobby", &new));
            assert!(!rooms.is_member("lobby", &old));
        }
    }

    #[test]
    fn a_join_applied_after_its_sessions_close_is_ignored() {
        let now = Instant::now();
        let a = key("g1", 1);
        let rooms = state(&[closed_change(&a), join_change("lobby", "alice", &a)], now);
        assert!(rooms.is_empty());
        // Once forgotten, the session key could only be a new session's.
        let mut rooms = state(&[closed_change(&a)], now);
        rooms.apply(join_change("lobby", "alice", &a), now + TOMBSTONE_TTL);
        assert_eq!(rooms.members("lobby"), ["alice"]);
    }

    #[test]
    fn a_snapshot_plus_overlapping_changes_equals_the_source() {
        let now = Instant::now();
        let (a, b, c) = (key("g1", 1), key("g1", 2), key("g2", 3));
        let changes = [
            join_change("lobby", "alice", &a),
            join_change("lobby", "bob", &b),
            leave_change("lobby", "bob", &b),
            join_change("den", "carol", &c),
            closed_change(&a),
            join_change("lobby", "bob", &b),
        ];
        let source = state(&changes, now);
        // The snapshot was taken after change 4; the new replica also got changes 2.. .
        let snapshot = state(&changes[..4], now).snapshot(now);
        let mut replica = Rooms::default();
        replica.restore(snapshot, now);
        for c in &changes[2..] {
            replica.apply(c.clone(), now);
        }
        for room in ["lobby", "den"] {
            assert_eq!(replica.members(room), source.members(room), "{room}");
        }
        assert_eq!(
            replica.snapshot(now).members.len(),
            source.snapshot(now).members.len()
        );
        assert_eq!(replica.snapshot(now).closed, source.snapshot(now).closed);
    }

    #[test]
    fn a_snapshot_replaces_what_the_replica_held() {
        let now = Instant::now();
        let (a, b, c) = (key("g1", 1), key("g1", 2), key("g2", 3));
        // A replica that missed b's leave and a's close, and c's join.
        let mut replica = state(
            &[
                join_change("lobby", "alice", &a),
                join_change("lobby", "bob", &b),
            ],
            now,
        );
        let peer = state(
            &[
                join_change("lobby", "alice", &a),
                join_change("lobby", "bob", &b),
                leave_change("lobby", "bob", &b),
                closed_change(&a),
                join_change("den", "carol", &c),
            ],
            now,
        );
        replica.restore(peer.snapshot(now), now);
        assert!(replica.members("lobby").is_empty());
        assert_eq!(replica.members("den"), ["carol"]);
        // The peer's tombstone came along: a's join, if still queued, stays out.
        replica.apply(join_change("lobby", "alice", &a), now);
        assert!(replica.members("lobby").is_empty());
    }

    #[test]
    fn tombstones_are_bounded() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        for sid in 0..(MAX_TOMBSTONES as u64 + 10) {
            t.insert(key("g", sid), now);
        }
        assert_eq!(t.len, MAX_TOMBSTONES);
        assert_eq!(t.gates["g"].sids.len(), MAX_TOMBSTONES);
        assert!(!t.contains(&key("g", 0), now));
        assert!(t.contains(&key("g", 20), now));
        assert!(!t.contains(&key("g", 20), now + TOMBSTONE_TTL));
        assert!(t.gates.is_empty());
        assert_eq!(t.len, 0);
    }

    #[test]
    fn past_the_bound_the_oldest_tombstone_goes_whichever_its_gate() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        t.insert(key("g2", 1), now);
        for sid in 0..MAX_TOMBSTONES as u64 {
            t.insert(key("g1", sid), now + Duration::from_millis(1));
        }
        assert_eq!(t.len, MAX_TOMBSTONES);
        assert!(!t.contains(&key("g2", 1), now));
        assert!(t.contains(&key("g1", 0), now));
        assert!(!t.gates.contains_key("g2"), "an emptied gate is dropped");
    }
}
