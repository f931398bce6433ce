//! The standby's side (docs/workers.md, "Standbys"): a worker keeps the latest state of
//! each partition it stands by for, as its owner sends it after each frame, and takes the
//! partition with it when the owner is counted dead (it is then the partition's owner:
//! the next in rendezvous order). It keeps a replica only while it is its sender's
//! standby and the sender holds the partition, so a replica it kept is never older than
//! the state a live owner would hand over.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::Message;
use bytes::Bytes;
use net::LogLimiter;
use proto::Message as _;
use proto::rpc::Replica;
use tokio::time::Instant;

use super::Coordinator;
use super::replicate::Standbys;
use crate::frame_loop::{Incoming, InputKind};
use crate::ownership::Members;

/// One partition's latest state from its owner.
#[derive(Debug)]
struct Kept {
    from: String,
    seq: u64,
    state: Bytes,
    at: Instant,
    /// Its sender was counted dead here (not merely unheard of yet: a replica can come
    /// before its sender's first heartbeat does).
    dead: bool,
}

/// The replicas this worker holds as a standby: one per partition at most, so at most
/// the partition count times the bus's largest payload.
#[derive(Debug, Default)]
pub(super) struct Replicas {
    kept: BTreeMap<u32, Kept>,
}

impl Replicas {
    /// Keeps `replica`'s states (each unless a later one from the same owner is here);
    /// refuses the whole of it when a partition is out of range.
    fn keep(&mut self, replica: Replica, partitions: u32, now: Instant) -> Result<(), String> {
        if let Some(bad) = (replica.partitions.iter()).find(|s| s.partition >= partitions) {
            return Err(format!(
                "partition {} out of range: the service has {partitions}",
                bad.partition
            ));
        }
        for state in replica.partitions {
            let newer = |k: &Kept| k.from == replica.from && k.seq > replica.seq;
            if self.kept.get(&state.partition).is_some_and(newer) {
                continue;
            }
            let kept = Kept {
                from: replica.from.clone(),
                seq: replica.seq,
                state: state.state,
                at: now,
                dead: false,
            };
            self.kept.insert(state.partition, kept);
        }
        Ok(())
    }

    /// Marks what `dead` sent: its senders were counted dead.
    pub(super) fn bury(&mut self, dead: &[String]) {
        for kept in self.kept.values_mut() {
            kept.dead |= dead.contains(&kept.from);
        }
    }

    /// The partitions kept from owners counted dead that nobody holds (`held`: here),
    /// with their states, taken out.
    fn orphans(&mut self, view: &Members, held: impl Fn(u32) -> bool) -> Vec<(u32, Bytes)> {
        let orphan = |p: u32, k: &Kept| k.dead && !view.claimed(p) && !held(p);
        let partitions: Vec<u32> = (self.kept.iter())
            .filter(|(p, k)| orphan(**p, k))
            .map(|(p, _)| *p)
            .collect();
        (partitions.into_iter())
            .filter_map(|p| Some((p, self.kept.remove(&p)?.state)))
            .collect()
    }

    /// Drops what this worker no longer stands by for: a live sender's partition this
    /// worker would not take if the sender died (or any, once leaving), or that the sender stopped holding (after
    /// `grace`, for a sender whose heartbeat has not said it holds it yet); a dead
    /// sender's partition someone claims or this worker holds; a sender's not heard of
    /// within `grace`.
    fn prune(
        &mut self,
        view: &Members,
        (leaving, held): (bool, impl Fn(u32) -> bool),
        grace: Duration,
        now: Instant,
    ) {
        self.kept.retain(|&partition, k| {
            let recent = now.saturating_duration_since(k.at) < grace;
            if let Some(heard) = view.last_heard(&k.from) {
                // As of the sender's last heartbeat: it sent its states to the standby
                // it had then.
                let mine = view.successor(partition, &k.from, leaving, heard) == Some(view.me());
                mine && (view.holds(&k.from, partition) || recent)
            } else if k.dead {
                !view.claimed(partition) && !held(partition)
            } else {
                recent
            }
        });
    }
}

impl Coordinator {
    /// Takes, with the state it holds, every partition of a dead owner this worker
    /// stood by for and nobody holds: whether or not it owns it now (a worker that came
    /// after the owner's last replica may), so no partition answered 200 starts fresh.
    /// One it does not own is handed over to its owner next, state and all.
    pub(super) async fn adopt(&mut self) {
        let here = |p| self.held.contains_key(&p) || self.preparing.contains_key(&p);
        for (partition, state) in self.replicas.orphans(&self.view, here) {
            tracing::info!(
                partition,
                "a dead owner's partition taken with the replica held here"
            );
            let how = (InputKind::Adopted, "standby");
            self.take(partition, how, state, None).await;
        }
    }

    /// A replica from a partition's owner: kept, then answered (empty: held).
    pub(super) async fn replica(&mut self, message: Message) {
        let kept = match Replica::decode(message.payload) {
            Ok(replica) => (self.replicas).keep(replica, self.view.partitions(), Instant::now()),
            Err(error) => Err(format!("a replica that does not decode: {error}")),
        };
        let answer = match kept {
            Ok(()) => Bytes::new(),
            Err(why) => {
                // A peer that sends nothing but bad replicas writes a line a second.
                static REFUSED: LogLimiter = LogLimiter::per_second();
                if let Some(tally) = REFUSED.check() {
                    tracing::warn!(%why, "a replica refused{tally}");
                }
                why.into()
            }
        };
        if let Some(reply) = message.reply
            && let Err(error) = self.client().publish(reply, answer).await
        {
            tracing::debug!(%error, "cannot answer a replica");
        }
    }

    /// Forgets replicas this worker no longer stands by for.
    pub(super) fn prune_replicas(&mut self) {
        let grace = self.config.keyed_member_timeout;
        let held = |p| self.held.contains_key(&p);
        (self.replicas).prune(&self.view, (self.leaving, held), grace, Instant::now());
    }

    /// Works out each held partition's standby (who would take it if this worker died)
    /// and, when it changed, tells the loop to send the partition whole to its new
    /// standby; asks again for those a standby missed once it is back. Counts the
    /// partitions no standby holds. Called whenever what is held or who lives changes.
    pub(super) fn follow_standbys(&mut self) {
        let Some(replicator) = self.replicator.clone() else {
            return;
        };
        let now = Instant::now().into_std();
        let standbys: BTreeMap<u32, String> = (self.held.keys())
            .filter_map(|&p| Some((p, self.view.successor(p, &self.me, false, now)?.to_owned())))
            .collect();
        let before = self.standbys.borrow().clone();
        let mut send: BTreeSet<u32> = (standbys.iter())
            .filter(|(p, standby)| before.get(p) != Some(standby))
            .map(|(p, _)| *p)
            .collect();
        if *before != standbys {
            self.standbys.send_replace(Standbys::new(standbys.clone()));
        }
        let held = self.held.keys().copied().collect();
        let (unreplicated, due) = replicator.unreplicated(&held);
        send.extend(due);
        let without = held.len() - standbys.len();
        (self.unreplicated_gauge).set((unreplicated + without) as f64);
        for partition in send {
            let replicate =
                Incoming::partition(InputKind::Replicate, partition, Bytes::new(), None);
            // The loop's queue full: asked again at the next tick.
            if self.out.try_send(replicate).is_err() {
                replicator.missed(partition);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant as StdInstant;

    use proto::rpc::PartitionState;

    use super::*;

    fn replica(from: &str, seq: u64, states: &[(u32, &str)]) -> Replica {
        Replica {
            from: from.into(),
            seq,
            partitions: (states.iter())
                .map(|(p, s)| PartitionState {
                    partition: *p,
                    state: Bytes::copy_from_slice(s.as_bytes()),
                })
                .collect(),
        }
    }

    fn state(replicas: &Replicas, partition: u32) -> Option<&[u8]> {
        replicas.kept.get(&partition).map(|k| k.state.as_ref())
    }

    /// A late copy from the same owner never replaces a newer state; another owner's
    /// replaces it (the partition moved); a partition out of range refuses the replica.
    #[test]
    fn the_newest_state_per_partition_is_kept() {
        let now = Instant::now();
        let mut replicas = Replicas::default();
        replicas
            .keep(replica("a", 2, &[(0, "two")]), 4, now)
            .unwrap();
        replicas
            .keep(replica("a", 1, &[(0, "one"), (1, "x")]), 4, now)
            .unwrap();
        assert_eq!(state(&replicas, 0), Some(&b"two"[..]));
        assert_eq!(state(&replicas, 1), Some(&b"x"[..]));
        replicas
            .keep(replica("b", 1, &[(0, "b1")]), 4, now)
            .unwrap();
        assert_eq!(state(&replicas, 0), Some(&b"b1"[..]));
        let refused = replicas.keep(replica("a", 3, &[(2, "y"), (4, "z")]), 4, now);
        assert!(refused.unwrap_err().contains("partition 4 out of range"));
        assert_eq!(
            state(&replicas, 2),
            None,
            "nothing of a refused replica is kept"
        );
    }

    /// Only a replica of an owner counted dead is taken; a live owner's stays, and is
    /// dropped once this worker is no longer its standby or it stopped holding the
    /// partition; one from a sender never heard of is kept for the grace only, never
    /// taken.
    #[test]
    fn a_replica_is_taken_from_a_dead_owner_and_dropped_when_not_stood_by_for() {
        let timeout = Duration::from_secs(2);
        let t0 = StdInstant::now();
        let now = Instant::now();
        let mut view = Members::new("me".into(), 8, (timeout, Duration::ZERO), t0);
        view.heard("owner", &[0, 1, 2, 3, 4, 5, 6, 7], false, t0);
        let mut replicas = Replicas::default();
        let all: Vec<(u32, &str)> = (0..8).map(|p| (p, "s")).collect();
        replicas.keep(replica("owner", 1, &all), 8, now).unwrap();
        assert!(
            replicas.orphans(&view, |_| false).is_empty(),
            "its owner lives"
        );
        // With two workers, this one follows the owner in every partition's order.
        replicas.prune(&view, (false, |_| false), timeout, now);
        assert_eq!(replicas.kept.len(), 8);
        // The owner no longer says it holds 0..4: dropped once the grace is over.
        view.heard("owner", &[4, 5, 6, 7], false, t0);
        replicas.prune(&view, (false, |_| false), timeout, now);
        assert_eq!(replicas.kept.len(), 8, "within the grace");
        replicas.prune(&view, (false, |_| false), timeout, now + timeout);
        assert_eq!(
            replicas.kept.keys().copied().collect::<Vec<_>>(),
            [4, 5, 6, 7]
        );
        // The owner dies: its replicas nobody holds are taken (not one held here or
        // claimed elsewhere); the others are dropped once claimed elsewhere.
        let gone = view.expire(t0 + timeout * 2);
        assert!(
            replicas.orphans(&view, |_| false).is_empty(),
            "not yet counted dead here"
        );
        replicas.bury(&gone.dead);
        view.heard("other", &[5], false, t0 + timeout * 2);
        let taken = replicas.orphans(&view, |p| p == 6);
        let taken: Vec<u32> = taken.into_iter().map(|(p, _)| p).collect();
        assert_eq!(taken, [4, 7]);
        replicas.prune(&view, (false, |p| p == 6), timeout, now + timeout);
        assert!(replicas.kept.is_empty());
        // A sender not heard of yet (its replica came before its heartbeat).
        replicas
            .keep(replica("newcomer", 1, &[(1, "n")]), 8, now)
            .unwrap();
        assert!(replicas.orphans(&view, |_| false).is_empty(), "never taken");
        replicas.prune(&view, (false, |_| false), timeout, now);
        assert_eq!(replicas.kept.len(), 1, "within the grace");
        replicas.prune(&view, (false, |_| false), timeout, now + timeout);
        assert!(replicas.kept.is_empty(), "never heard of within the grace");
    }
}
