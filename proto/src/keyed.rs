//! Keyed services' routing, shared by the gates (which pick a request's partition) and
//! the workers (which own partitions): the hash, and the subjects. docs/workers.md,
//! "Keyed services", is the contract for other languages.

use crate::rpc::Session;

/// The most partitions a keyed service may announce: a partition is a subscription on
/// every gate's bus and a unit of hand-over, so thousands would cost more than they
/// spread.
pub const MAX_PARTITIONS: u32 = 1024;

/// Longest key a keyed service's request may be routed by (the client's, a session
/// value or a uid): a key travels with every request of it.
pub const MAX_KEY_LEN: usize = 256;

/// Why a keyed request has no key to route by (the caller gets 400 with this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("keyed route: give a key, or log in first")]
    Missing,
    #[error("key too long")]
    TooLong,
}

/// The key a keyed service's request is routed by: the caller's `explicit` one, else
/// the session value the service names (`session_key`, empty for none), else the uid.
/// Gates route clients' requests so, and workers their calls.
pub fn key_of<'a>(
    explicit: &'a str,
    session_key: &str,
    session: Option<&'a Session>,
) -> Result<&'a str, KeyError> {
    let named = session
        .filter(|_| !session_key.is_empty())
        .and_then(|session| session.data.get(session_key));
    let key = match (named, session) {
        _ if !explicit.is_empty() => explicit,
        (Some(value), _) => value,
        (None, Some(session)) => &session.uid,
        (None, None) => "",
    };
    if key.is_empty() {
        Err(KeyError::Missing)
    } else if key.len() > MAX_KEY_LEN {
        Err(KeyError::TooLong)
    } else {
        Ok(key)
    }
}

/// FNV-1a, 32-bit: a few lines in any language; the tests pin values.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// A key's partition: [`fnv1a`] of its bytes, modulo `partitions` (0 counts as 1).
pub fn partition_of(key: &[u8], partitions: u32) -> u32 {
    fnv1a(key) % partitions.max(1)
}

/// The rendezvous score of worker `member` for `partition`: among a keyed service's live
/// workers that are not leaving, the highest owns it (ties to the greater id). FNV-1a 32
/// of `"<member>:<partition>"`, mixed by MurmurHash3's 32-bit finalizer (FNV alone orders
/// similar ids alike for every partition).
pub fn score(member: &str, partition: u32) -> u32 {
    let mut h = fnv1a(format!("{member}:{partition}").as_bytes());
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The first of `members` in `partition`'s rendezvous order: its owner, when `members`
/// are the live workers that are not leaving (the [`score`]'s highest, ties to the
/// greater id); the next one down stands by for it.
pub fn first_in_order<'a>(
    members: impl Iterator<Item = &'a str>,
    partition: u32,
) -> Option<&'a str> {
    members.max_by_key(|id| (score(id, partition), *id))
}

/// What a gate publishes a keyed request of `service.method` on (with `.<method>`),
/// and what its owner subscribes (with `.>`), plain: during a hand-over both owners
/// receive every request, and its `origin` and `seq` tell them which is whose. Its own
/// namespace, `part`, outside `svc`: a plain worker's `<prefix>.svc.<service>.>` in the
/// queue group never catches a keyed request, which would then be answered twice.
pub fn partition_subject(prefix: &str, service: &str, partition: u32) -> String {
    format!("{prefix}.part.{service}.{partition}")
}

/// Where a keyed service's workers tell each other they live and what they hold
/// (`rpc::KeyedMember`).
pub fn members_subject(prefix: &str, service: &str) -> String {
    format!("{prefix}.keyed.{service}.members")
}

/// Where a worker takes partitions handed to it (`rpc::HandOver`).
pub fn handover_subject(prefix: &str, service: &str, member: &str) -> String {
    format!("{prefix}.keyed.{service}.handover.{member}")
}

/// Where a worker keeps replicas of the partitions it stands by for (`rpc::Replica`).
pub fn replica_subject(prefix: &str, service: &str, member: &str) -> String {
    format!("{prefix}.keyed.{service}.replica.{member}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_values_other_languages_can_check() {
        // FNV-1a 32 of "" is its offset basis; of "a" the published test vector.
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a(b"foobar"), 0xbf9c_f968);
        assert_eq!(partition_of(b"match-1", 64), 0x2268_96f0 % 64);
    }

    #[test]
    fn keys_come_from_the_caller_then_the_named_value_then_the_uid() {
        let session = Session {
            uid: "ann".into(),
            data: [("match".to_owned(), "m1".to_owned())].into(),
            ..Session::default()
        };
        let s = Some(&session);
        assert_eq!(key_of("k", "match", s), Ok("k"));
        assert_eq!(key_of("", "match", s), Ok("m1"));
        assert_eq!(key_of("", "other", s), Ok("ann"));
        assert_eq!(key_of("", "", s), Ok("ann"));
        assert_eq!(key_of("", "match", None), Err(KeyError::Missing));
        assert_eq!(
            key_of("", "", Some(&Session::default())),
            Err(KeyError::Missing)
        );
        let long = "k".repeat(MAX_KEY_LEN);
        assert_eq!(key_of(&long, "", None), Ok(long.as_str()));
        let longer = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(key_of(&longer, "", None), Err(KeyError::TooLong));
    }

    #[test]
    fn partition_subjects_are_outside_the_services_namespace() {
        assert_eq!(
            partition_subject("shaddock", "arena", 7),
            "shaddock.part.arena.7"
        );
    }

    #[test]
    fn every_key_lands_in_range() {
        for n in [1, 2, 7, 64, MAX_PARTITIONS] {
            for key in ["", "a", "ann", "match-17", "\u{e9}t\u{e9}"] {
                assert!(partition_of(key.as_bytes(), n) < n);
            }
        }
        assert_eq!(partition_of(b"x", 0), 0, "0 partitions is treated as 1");
    }
}
