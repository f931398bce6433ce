//! Each message once from two connections subscribed to the same subjects, while the
//! bus moves off a server in lame duck mode ([`super::run`]).
//!
//! The new connection subscribes everything while the old one still does. Until every
//! server has heard of the new subscriptions (a route away, in a cluster), a message
//! published meanwhile reaches the old connection only, or both, in either order. So
//! neither connection alone has them all: taking the new one's only loses what was
//! published just after the move (seen in a cluster: a match's state push), taking both
//! doubles the rest.
//!
//! For each message (subject, reply, headers' status, payload; known by a 128-bit keyed
//! hash of them, so what is kept per message is a few bytes whatever its size, and two
//! messages would be taken for one only by a 2^-128 chance) the pairing counts the
//! copies each connection brought, and a copy is delivered only when it raises the
//! larger of the two counts: a message on both is delivered once, whichever comes
//! first; one on a single connection once; the same message published twice, twice. A
//! message counted as many times on both sides is forgotten, so what is kept is only
//! what is on its way on one side, or was published before the other subscription was
//! known. That is bounded (`--bus-move-unpaired`): past the bound, or once the old
//! connection ends (the linger, or its server closes it), only the new connection is
//! taken, as before pairing; once the new one ends (lost), the old one delivers nothing
//! more, and the connection made next everything.

use std::collections::hash_map::{Entry, RandomState};
use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustc_hash::FxHashMap;

use super::Incoming;

/// Which of the two connections a copy came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Old,
    New,
}

/// A message as the pairing tells messages apart: a 128-bit keyed hash of its subject,
/// reply, status and payload ([`Pairing::key`]).
type Key = u128;

/// Copies of one message seen on each side.
#[derive(Default)]
struct Copies {
    old: u32,
    new: u32,
}

impl Copies {
    /// Counts one more on `side`; whether it raised the larger count (to be delivered).
    fn add(&mut self, side: Side) -> bool {
        let before = self.old.max(self.new);
        match side {
            Side::Old => self.old += 1,
            Side::New => self.new += 1,
        }
        self.old.max(self.new) > before
    }
}

/// One move's pairing of an old connection and its new one.
pub(crate) struct Pairing {
    /// The most messages kept unpaired before pairing ends.
    limit: usize,
    /// The two halves of a message's key, each a SipHash under a random key of its own.
    halves: (RandomState, RandomState),
    /// `None` once pairing has ended.
    unpaired: Mutex<Option<FxHashMap<Key, Copies>>>,
}

impl Pairing {
    pub(crate) fn new(limit: usize) -> Arc<Pairing> {
        Arc::new(Pairing {
            limit,
            halves: (RandomState::new(), RandomState::new()),
            unpaired: Mutex::new(Some(FxHashMap::default())),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<FxHashMap<Key, Copies>>> {
        self.unpaired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `msg`'s key: computed outside the lock, and nothing of the message kept.
    fn key(&self, msg: &Incoming<'_>) -> Key {
        let half = |state: &RandomState| {
            let mut hasher = state.build_hasher();
            msg.subject.hash(&mut hasher);
            msg.reply.hash(&mut hasher);
            msg.status.hash(&mut hasher);
            msg.payload[..].hash(&mut hasher);
            hasher.finish()
        };
        (u128::from(half(&self.halves.0)) << 64) | u128::from(half(&self.halves.1))
    }

    /// Whether the copy of `msg` that came on `side` is to be delivered; `None` once
    /// pairing has ended.
    fn take(&self, side: Side, msg: &Incoming<'_>) -> Option<bool> {
        let key = self.key(msg);
        let mut unpaired = self.lock();
        let map = unpaired.as_mut()?;
        let deliver = match map.entry(key) {
            Entry::Occupied(mut entry) => {
                let copies = entry.get_mut();
                let deliver = copies.add(side);
                if copies.old == copies.new {
                    entry.remove();
                }
                deliver
            }
            Entry::Vacant(entry) => entry.insert(Copies::default()).add(side),
        };
        if map.len() > self.limit {
            tracing::warn!(
                limit = self.limit,
                "moving off a server in lame duck mode: more messages than --bus-move-unpaired \
                 came on one connection only; from now on only the new one's are taken, and \
                 some published during the move may be lost"
            );
            *unpaired = None;
        }
        Some(deliver)
    }

    /// One of the two connections has ended: the old one (its linger over, or closed by
    /// its server), and only the new one is taken from now on; or the new one (lost),
    /// and the connection made after it takes everything, the old one nothing.
    pub(crate) fn end(&self) {
        *self.lock() = None;
    }
}

/// A connection's part in a pairing, if any: checked per message without a lock.
#[derive(Default)]
pub(crate) struct Slot {
    paired: AtomicBool,
    pairing: Mutex<Option<(Arc<Pairing>, Side)>>,
}

impl Slot {
    /// Puts this connection on `side` of `pairing`, leaving any earlier one (a second
    /// move before the first pairing ended ends it).
    pub(crate) fn pair(&self, pairing: Arc<Pairing>, side: Side) {
        let mut slot = self.pairing.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((earlier, _)) = slot.replace((pairing, side)) {
            earlier.end();
        }
        self.paired.store(true, Ordering::Release);
    }

    /// Whether `msg`, which came on this connection, is to be delivered. Once its
    /// pairing has ended, the new side takes everything (and leaves the pairing), the old
    /// side nothing.
    pub(crate) fn take(&self, msg: &Incoming<'_>) -> bool {
        if !self.paired.load(Ordering::Acquire) {
            return true;
        }
        let mut slot = self.pairing.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((pairing, side)) = slot.as_ref() else {
            return true;
        };
        if let Some(deliver) = pairing.take(*side, msg) {
            return deliver;
        }
        if *side == Side::Old {
            return false;
        }
        *slot = None;
        self.paired.store(false, Ordering::Release);
        true
    }

    /// This connection's pairing, if any, ends with it.
    pub(crate) fn end(&self) {
        let slot = self.pairing.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((pairing, _)) = slot.as_ref() {
            pairing.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn msg(subject: &'static str, payload: &'static str) -> Incoming<'static> {
        Incoming {
            subject: subject.as_bytes(),
            reply: None,
            status: None,
            payload: Bytes::from_static(payload.as_bytes()),
        }
    }

    /// A new connection's slot and an old one's, paired with room for `limit`.
    fn paired(limit: usize) -> (Slot, Slot) {
        let (old, new) = (Slot::default(), Slot::default());
        let pairing = Pairing::new(limit);
        old.pair(pairing.clone(), Side::Old);
        new.pair(pairing, Side::New);
        (old, new)
    }

    /// Once, whichever side brings it first; on one side only, once.
    #[test]
    fn a_message_on_both_connections_is_delivered_once() {
        let (old, new) = paired(16);
        assert!(old.take(&msg("a", "1")));
        assert!(!new.take(&msg("a", "1")));
        assert!(new.take(&msg("a", "2")));
        assert!(!old.take(&msg("a", "2")));
        // Published before the new subscription was known: on the old one only.
        assert!(old.take(&msg("a", "3")));
        // On the new one only (the old server closed meanwhile).
        assert!(new.take(&msg("a", "4")));
        // Another subject, the same payload: another message.
        assert!(old.take(&msg("b", "1")));
        assert!(!new.take(&msg("b", "1")));
    }

    /// The same message published twice is delivered twice, in any interleaving, and
    /// once more when it reached one connection only the first time.
    #[test]
    fn the_same_message_published_twice_is_delivered_twice() {
        let (old, new) = paired(16);
        let taken = [
            old.take(&msg("a", "x")),
            old.take(&msg("a", "x")),
            new.take(&msg("a", "x")),
            new.take(&msg("a", "x")),
        ];
        assert_eq!(taken, [true, true, false, false]);
        let taken = [
            new.take(&msg("a", "y")),
            old.take(&msg("a", "y")),
            old.take(&msg("a", "y")),
            new.take(&msg("a", "y")),
        ];
        assert_eq!(taken, [true, false, true, false]);
        // The first copy on the old connection only, the second on both.
        let taken = [
            old.take(&msg("a", "z")),
            new.take(&msg("a", "z")),
            old.take(&msg("a", "z")),
        ];
        assert_eq!(taken, [true, false, true]);
    }

    /// Once the old connection ends, the new one is taken whole and leaves the pairing,
    /// and the old one delivers nothing more; so too once the new one ends (lost).
    #[test]
    fn once_the_old_connection_ends_only_the_new_one_is_taken() {
        let (old, new) = paired(16);
        assert!(old.take(&msg("a", "1")));
        old.end();
        assert!(new.take(&msg("a", "1")), "no longer paired: doubled");
        assert!(!new.paired.load(Ordering::Acquire));
        assert!(!old.take(&msg("a", "2")));
        // The new one lost: the old one delivers nothing more either.
        let (old, new) = paired(16);
        new.end();
        assert!(!old.take(&msg("a", "1")));
    }

    /// Up to `--bus-move-unpaired` messages on one side only, pairing goes on; one more
    /// ends it.
    #[test]
    fn past_the_unpaired_limit_only_the_new_connection_is_taken() {
        let (old, new) = paired(2);
        assert!(old.take(&msg("a", "1")));
        assert!(old.take(&msg("a", "2")));
        // Two kept, the limit: still paired.
        assert!(!new.take(&msg("a", "1")));
        assert!(old.take(&msg("a", "3")));
        assert!(old.take(&msg("a", "4")));
        // Three kept, one past the limit: ended.
        assert!(new.take(&msg("a", "2")));
        assert!(!old.take(&msg("a", "5")));
    }

    /// A second move while the first pairing lasts ends the first.
    #[test]
    fn a_second_move_ends_the_first_pairing() {
        let (old, middle) = paired(16);
        let newest = Slot::default();
        let second = Pairing::new(16);
        middle.pair(second.clone(), Side::Old);
        newest.pair(second, Side::New);
        assert!(!old.take(&msg("a", "1")), "the first pairing ended");
        assert!(middle.take(&msg("a", "1")));
        assert!(!newest.take(&msg("a", "1")));
    }
}
