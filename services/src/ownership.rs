//! Who owns which partition of a keyed service: the members a worker has heard of, and
//! what it should do about each partition. Pure logic over a clock the caller passes
//! in, so it is tested without a bus; [`crate::worker`]'s keyed part acts on the plan.
//!
//! - **Members**: every worker of the service says, each heartbeat, that it lives,
//!   which partitions it holds, and whether it is leaving. One not heard from for the
//!   member timeout is forgotten: what it held is nobody's. It *left* if its last
//!   heartbeat said leaving with nothing held (the last word of a drained worker), and
//!   is counted *dead* otherwise. A left peer stays a member until then, not at once:
//!   a partition's old owner sends its state again while the new owner lives (it may
//!   have taken it), and a leaving worker may still be taking one it prepared.
//! - **Owner**: a partition's owner is the live, non-leaving member (this worker
//!   included) with the highest rendezvous score: FNV-1a 32 of
//!   `"<member id>:<partition>"`, mixed by MurmurHash3's 32-bit finalizer (FNV alone
//!   orders similar ids alike for every partition); ties go to the greater id. Adding a member moves only the partitions it now wins, a
//!   fair share; removing one moves only its own.
//! - **Plan**: a partition this worker holds and another owns is handed over to it; a
//!   partition this worker owns and nobody alive claims is taken fresh, but only once
//!   the worker has listened for a while since it started (two heartbeats: it has heard
//!   everyone who holds something).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use proto::keyed::first_in_order;

/// A peer as its last heartbeat described it.
#[derive(Debug, Clone)]
struct Member {
    seen: Instant,
    /// When this worker first heard it.
    since: Instant,
    held: BTreeSet<u32>,
    leaving: bool,
}

/// What this worker should do about one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Hand the partition it holds over to this member, its owner.
    HandOver { partition: u32, to: String },
    /// Take the partition, which it owns and nobody holds, with fresh state.
    TakeFresh { partition: u32 },
}

/// The peers [`Members::expire`] forgot, by how they went.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Gone {
    /// Silent without having left: crashed, cut off, or stopped before its last word.
    pub dead: Vec<String>,
    /// Silent after saying it was leaving and held nothing: drained.
    pub left: Vec<String>,
}

/// This worker's view of its service's members.
#[derive(Debug)]
pub(crate) struct Members {
    me: String,
    partitions: u32,
    timeout: Duration,
    /// How long after its start the worker takes nothing fresh.
    listen: Duration,
    started: Instant,
    /// With standbys: how long a dead peer's partitions wait for a standby to take them
    /// with their state before their owner takes them fresh (zero without standbys).
    adoption: Duration,
    /// The partitions dead peers held, and when they were counted dead.
    orphaned: HashMap<u32, Instant>,
    peers: HashMap<String, Member>,
}

impl Members {
    pub(crate) fn new(
        me: String,
        partitions: u32,
        (timeout, listen): (Duration, Duration),
        now: Instant,
    ) -> Self {
        Members {
            me,
            partitions,
            timeout,
            listen,
            started: now,
            adoption: Duration::ZERO,
            orphaned: HashMap::new(),
            peers: HashMap::new(),
        }
    }

    /// With standbys: a dead peer's partitions wait `adoption` for their standby, which
    /// holds their state, to take them (it may not be their owner: a worker that came
    /// after the owner's last replica is), before their owner takes them fresh.
    pub(crate) fn with_adoption(mut self, adoption: Duration) -> Self {
        self.adoption = adoption;
        self
    }

    /// Takes a peer's heartbeat (this worker's own, echoed back, is ignored); true when
    /// the peer is new here.
    pub(crate) fn heard(&mut self, id: &str, held: &[u32], leaving: bool, now: Instant) -> bool {
        if id == self.me {
            return false;
        }
        let since = self.peers.get(id).map_or(now, |m| m.since);
        let member = Member {
            seen: now,
            since,
            held: held.iter().copied().collect(),
            leaving,
        };
        self.peers.insert(id.to_owned(), member).is_none()
    }

    /// Forgets the peers not heard from for the timeout: those whose last heartbeat
    /// said leaving with nothing held left, the others are dead.
    pub(crate) fn expire(&mut self, now: Instant) -> Gone {
        let timeout = self.timeout;
        let mut gone = Gone::default();
        let orphaned = &mut self.orphaned;
        let adoption = self.adoption;
        orphaned.retain(|_, at| now.saturating_duration_since(*at) < adoption);
        self.peers.retain(|id, m| {
            let silent = now.saturating_duration_since(m.seen) > timeout;
            if silent {
                let left = m.leaving && m.held.is_empty();
                (if left { &mut gone.left } else { &mut gone.dead }).push(id.clone());
                if !left && !adoption.is_zero() {
                    orphaned.extend(m.held.iter().map(|&p| (p, now)));
                }
            }
            !silent
        });
        gone
    }

    /// Whether peer `id` is alive: heard from within the timeout (as of the last
    /// [`Members::expire`]).
    pub(crate) fn lives(&self, id: &str) -> bool {
        self.peers.contains_key(id)
    }

    /// The owner of `partition` among the live members that are not leaving (this
    /// worker among them unless it is); `None` when there is none.
    pub(crate) fn owner(&self, partition: u32, leaving: bool) -> Option<&str> {
        first_in_order(self.candidates(leaving), partition)
    }

    /// Where `member`, holding `partition`, kept its standby `at` a moment
    /// (docs/workers.md, "Standbys"): who would take it if `member` died, the owner among
    /// the others (this worker among them unless it is leaving), of the peers heard for
    /// two heartbeats by then. A newer peer was not one yet: `member` may not have heard
    /// of it, and kept its partitions' states at the standby it had. A standby asks as of
    /// `member`'s last heartbeat: a member that died before a newcomer settled kept its
    /// states there.
    pub(crate) fn successor(
        &self,
        partition: u32,
        member: &str,
        leaving: bool,
        at: Instant,
    ) -> Option<&str> {
        let settled = |id: &str| {
            (self.peers.get(id))
                .is_none_or(|m| at.saturating_duration_since(m.since) >= self.listen)
        };
        let others = (self.candidates(leaving)).filter(|id| *id != member && settled(id));
        first_in_order(others, partition)
    }

    /// The live members that are not leaving, this worker among them unless it is.
    fn candidates(&self, leaving: bool) -> impl Iterator<Item = &str> {
        let me = (!leaving).then_some(self.me.as_str());
        let peers = self
            .peers
            .iter()
            .filter(|(_, m)| !m.leaving)
            .map(|(id, _)| id.as_str());
        me.into_iter().chain(peers)
    }

    /// When live peer `id` was last heard.
    pub(crate) fn last_heard(&self, id: &str) -> Option<Instant> {
        self.peers.get(id).map(|m| m.seen)
    }

    /// This worker's id.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// The service's partition count.
    pub(crate) fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Whether live peer `id` says it holds `partition`.
    pub(crate) fn holds(&self, id: &str, partition: u32) -> bool {
        self.peers
            .get(id)
            .is_some_and(|m| m.held.contains(&partition))
    }

    /// When the first peer not heard from since falls past the timeout: the moment
    /// [`Members::expire`] would forget it.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        let first = self.peers.values().map(|m| m.seen).min()?;
        Some(first + self.timeout + Duration::from_millis(1))
    }

    /// Whether a live peer says it holds `partition`.
    pub(crate) fn claimed(&self, partition: u32) -> bool {
        self.peers.values().any(|m| m.held.contains(&partition))
    }

    /// What to do now, given the partitions this worker holds and those being moved to
    /// or from it (left alone until that move ends).
    pub(crate) fn plan(
        &self,
        held: &BTreeSet<u32>,
        moving: &BTreeSet<u32>,
        leaving: bool,
        now: Instant,
    ) -> Vec<Step> {
        let listened = now.saturating_duration_since(self.started) >= self.listening();
        let mut steps = Vec::new();
        for partition in 0..self.partitions {
            if moving.contains(&partition) {
                continue;
            }
            let owner = self.owner(partition, leaving);
            if held.contains(&partition) {
                if let Some(owner) = owner.filter(|o| *o != self.me) {
                    steps.push(Step::HandOver {
                        partition,
                        to: owner.to_owned(),
                    });
                }
            } else if listened
                && owner == Some(self.me.as_str())
                && !self.claimed(partition)
                && !self.awaiting_adoption(partition, now)
            {
                steps.push(Step::TakeFresh { partition });
            }
        }
        steps
    }

    /// How long after its start this worker takes nothing fresh: two heartbeats, to hear
    /// everyone who holds something; with standbys and peers, a member timeout and the
    /// adoption time more, so that a worker that died just before this one came (its
    /// partitions unclaimed, to this worker's ears) is counted dead by its peers and its
    /// partitions taken by their standbys, with their state, first.
    fn listening(&self) -> Duration {
        if self.adoption.is_zero() || self.peers.is_empty() {
            self.listen
        } else {
            self.listen + self.timeout + self.adoption
        }
    }

    /// Whether `partition`, held by a peer counted dead less than `adoption` ago, still
    /// waits for its standby.
    fn awaiting_adoption(&self, partition: u32, now: Instant) -> bool {
        (self.orphaned.get(&partition))
            .is_some_and(|at| now.saturating_duration_since(*at) < self.adoption)
    }

    /// Peers that say they hold a partition this worker holds too.
    pub(crate) fn conflicts(&self, held: &BTreeSet<u32>) -> Vec<u32> {
        held.iter().copied().filter(|&p| self.claimed(p)).collect()
    }
}

#[cfg(test)]
mod tests {
    use proto::keyed::score;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(3);
    const LISTEN: Duration = Duration::from_secs(1);

    fn members(me: &str, partitions: u32, now: Instant) -> Members {
        Members::new(me.to_owned(), partitions, (TIMEOUT, LISTEN), now)
    }

    fn fresh(steps: &[Step]) -> BTreeSet<u32> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::TakeFresh { partition } => Some(*partition),
                Step::HandOver { .. } => None,
            })
            .collect()
    }

    #[test]
    fn alone_a_worker_takes_everything_once_it_has_listened() {
        let t0 = Instant::now();
        let m = members("a", 8, t0);
        let none = BTreeSet::new();
        let early = t0 + LISTEN - Duration::from_millis(1);
        assert!(m.plan(&none, &none, false, early).is_empty(), "too early");
        let later = t0 + LISTEN;
        assert_eq!(fresh(&m.plan(&none, &none, false, later)), (0..8).collect());
    }

    /// With standbys, a dead peer's partitions wait the adoption time for the standby
    /// that holds their state before their owner takes them fresh (exactly at its end);
    /// without, they are taken at once; a peer that left leaves nothing to wait for.
    #[test]
    fn a_dead_peers_partitions_wait_for_their_standby_before_being_taken_fresh() {
        let t0 = Instant::now();
        let adoption = Duration::from_secs(1);
        let none = BTreeSet::new();
        for wait in [adoption, Duration::ZERO] {
            let mut m = members("a", 8, t0).with_adoption(wait);
            m.heard("b", &(0..8).collect::<Vec<_>>(), false, t0);
            let dead = t0 + TIMEOUT + Duration::from_millis(1);
            assert_eq!(m.expire(dead).dead, ["b"]);
            let waiting = fresh(&m.plan(&none, &none, false, dead));
            assert_eq!(waiting.is_empty(), !wait.is_zero(), "waiting {wait:?}");
            let later = dead + wait;
            m.expire(later);
            assert_eq!(fresh(&m.plan(&none, &none, false, later)), (0..8).collect());
        }
        let mut m = members("a", 8, t0).with_adoption(adoption);
        m.heard("b", &[], true, t0);
        let gone = t0 + TIMEOUT + Duration::from_millis(1);
        assert_eq!(m.expire(gone).left, ["b"]);
        assert_eq!(fresh(&m.plan(&none, &none, false, gone)), (0..8).collect());
    }

    /// A partition's standby is the owner among the others, of the peers heard for two
    /// heartbeats: a newer peer becomes one only then, however it ranks.
    #[test]
    fn a_newcomer_becomes_a_standby_once_heard_for_two_heartbeats() {
        let t0 = Instant::now();
        let mut m = members("a", 64, t0);
        m.heard("b", &[], false, t0);
        let later = t0 + LISTEN;
        m.heard("b", &[], false, later);
        m.heard("c", &[], false, later);
        let outranks = |p: u32| (score("c", p), "c") > (score("b", p), "b");
        let p = (0..64).find(|&p| outranks(p)).unwrap();
        assert_eq!(m.successor(p, "a", false, later), Some("b"), "c is too new");
        let just_before = later + LISTEN - Duration::from_millis(1);
        assert_eq!(m.successor(p, "a", false, just_before), Some("b"), "still");
        let settled = later + LISTEN;
        m.heard("b", &[], false, settled);
        m.heard("c", &[], false, settled);
        assert_eq!(m.successor(p, "a", false, settled), Some("c"));
        let first = if (score("a", p), "a") > (score("b", p), "b") {
            "a"
        } else {
            "b"
        };
        let among_others = m.successor(p, "c", false, settled);
        assert_eq!(among_others, Some(first), "the owner among the others");
    }

    /// With standbys, a newcomer among peers waits a member timeout and the adoption
    /// time beyond its listening before it takes what nobody holds: a worker that died
    /// just before it came held those, unseen by it. Alone, it waits only its listening.
    #[test]
    fn with_standbys_a_newcomer_among_peers_waits_out_a_member_timeout_before_taking_fresh() {
        let t0 = Instant::now();
        let adoption = Duration::from_secs(1);
        let none = BTreeSet::new();
        let mut m = members("a", 8, t0).with_adoption(adoption);
        m.heard("b", &[], false, t0);
        let owned: BTreeSet<u32> = (0..8).filter(|&p| m.owner(p, false) == Some("a")).collect();
        assert!(!owned.is_empty());
        let ready = t0 + LISTEN + TIMEOUT + adoption;
        let early = ready - Duration::from_millis(1);
        m.heard("b", &[], false, early);
        assert!(
            fresh(&m.plan(&none, &none, false, early)).is_empty(),
            "too early"
        );
        assert_eq!(fresh(&m.plan(&none, &none, false, ready)), owned);
        let alone = members("a", 8, t0).with_adoption(adoption);
        assert_eq!(
            fresh(&alone.plan(&none, &none, false, t0 + LISTEN)),
            (0..8).collect()
        );
    }

    #[test]
    fn owners_agree_and_a_newcomer_takes_a_fair_share_only_from_its_peers() {
        let t0 = Instant::now();
        let ids: Vec<String> = (0..4).map(|n| format!("worker-{n}")).collect();
        let owners_of = |alive: &[String]| -> Vec<String> {
            // Every member's own view gives the same owners.
            let views: Vec<Vec<String>> = alive
                .iter()
                .map(|me| {
                    let mut m = members(me, 64, t0);
                    for peer in alive.iter().filter(|p| *p != me) {
                        m.heard(peer, &[], false, t0);
                    }
                    (0..64)
                        .map(|p| m.owner(p, false).unwrap().to_owned())
                        .collect()
                })
                .collect();
            assert!(views.windows(2).all(|w| w[0] == w[1]), "views differ");
            views[0].clone()
        };
        let three = owners_of(&ids[..3]);
        let four = owners_of(&ids);
        let moved: Vec<usize> = (0..64).filter(|&p| three[p] != four[p]).collect();
        assert!(
            moved.iter().all(|&p| four[p] == ids[3]),
            "only the newcomer gains"
        );
        // A fair share: 16 expected of 64; FNV spreads these ids within a few.
        assert!((8..=24).contains(&moved.len()), "moved {}", moved.len());
    }

    #[test]
    fn held_partitions_go_to_their_owner_and_a_leaver_keeps_none() {
        let t0 = Instant::now();
        let mut m = members("a", 16, t0);
        m.heard("b", &[], false, t0);
        let held: BTreeSet<u32> = (0..16).collect();
        let steps = m.plan(&held, &BTreeSet::new(), false, t0);
        let to_b: BTreeSet<u32> = (0..16)
            .filter(|&p| m.owner(p, false) == Some("b"))
            .collect();
        let handed: BTreeSet<u32> = steps
            .iter()
            .map(|s| match s {
                Step::HandOver { partition, to } => {
                    assert_eq!(to, "b");
                    *partition
                }
                Step::TakeFresh { .. } => panic!("{s:?}"),
            })
            .collect();
        assert_eq!(handed, to_b);
        assert!(!to_b.is_empty() && to_b.len() < 16);
        // Leaving: every partition goes to b; one being moved is left alone.
        let moving = BTreeSet::from([3]);
        let leaving = m.plan(&held, &moving, true, t0);
        assert_eq!(leaving.len(), 15);
        assert!(leaving.iter().all(
            |s| matches!(s, Step::HandOver { to, partition } if to == "b" && *partition != 3)
        ));
    }

    #[test]
    fn a_claimed_partition_waits_for_its_hand_over_and_a_dead_claim_frees_it() {
        let t0 = Instant::now();
        let mut m = members("a", 4, t0);
        // "z" holds everything and is leaving: "a" owns all but takes nothing fresh.
        m.heard("z", &[0, 1, 2, 3], true, t0);
        let later = t0 + TIMEOUT;
        let none = BTreeSet::new();
        assert!(m.plan(&none, &none, false, later).is_empty());
        // "z" dies: its partitions are nobody's, and "a" takes them fresh.
        let dead_at = t0 + TIMEOUT + Duration::from_millis(1);
        assert!(m.lives("z"));
        assert_eq!(m.expire(dead_at).dead, ["z"], "it held partitions: dead");
        assert!(!m.lives("z"));
        assert_eq!(
            fresh(&m.plan(&none, &none, false, dead_at)),
            (0..4).collect()
        );
    }

    #[test]
    fn a_peer_silent_after_leaving_with_nothing_held_left_and_is_not_dead() {
        let t0 = Instant::now();
        let mut m = members("a", 4, t0);
        m.heard("drained", &[1], true, t0);
        m.heard("drained", &[], true, t0); // its last word
        m.heard("crashed", &[], false, t0);
        m.heard("crashed-leaving", &[2], true, t0);
        let within = t0 + TIMEOUT;
        assert_eq!(
            m.expire(within),
            Gone::default(),
            "heard within the timeout"
        );
        assert!(
            m.lives("drained"),
            "a member until the timeout, as any other"
        );
        let owners: Vec<_> = (0..4).map(|p| m.owner(p, false)).collect();
        assert!(
            !owners.contains(&Some("drained")),
            "owning nothing: it is leaving"
        );
        let mut gone = m.expire(within + Duration::from_millis(1));
        gone.dead.sort();
        assert_eq!(gone.left, ["drained"]);
        assert_eq!(gone.dead, ["crashed", "crashed-leaving"]);
        // Heard again after being forgotten: a newcomer.
        assert!(m.heard("drained", &[], false, within));
    }

    #[test]
    fn conflicts_are_seen() {
        let t0 = Instant::now();
        let mut m = members("a", 4, t0);
        m.heard("b", &[1, 2], false, t0);
        m.heard("a", &[0, 1, 2, 3], false, t0); // its own echo is ignored
        assert_eq!(m.conflicts(&BTreeSet::from([0, 2])), [2]);
    }
}
