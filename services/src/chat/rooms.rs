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
//! closed session is remembered (a tombstone) for [`super::TOMBSTONE_TTL`], and a join for a
//! tombstoned session is ignored, by every replica alike.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use proto::chat::{Member, SessionRef, Snapshot, StateChange, state_change};

use super::session_key::SessionKey;
use super::tombstones::Tombstones;

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

    /// How many sessions `room` holds with session `key` in it, whether or not it is
    /// yet (or still): the size a join makes it, or a leave finds it. Sessions, not
    /// names: O(1), and a name has two sessions in a room only while a second login
    /// replaces the first.
    pub fn size_with(&self, room: &str, key: &SessionKey) -> usize {
        let members = self.rooms.get(room);
        let others = members.map_or(0, |m| m.len() - usize::from(m.contains_key(key)));
        others + 1
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
            .into_iter()
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
    use std::time::Duration;

    use super::super::TOMBSTONE_TTL;
    use super::super::session_key::key;
    use super::*;

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
        rooms.apply(
            join_change("lobby", "alice", &a),
            now + TOMBSTONE_TTL + Duration::from_millis(100),
        );
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
}
