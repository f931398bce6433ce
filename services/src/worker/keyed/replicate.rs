//! The owner's side of standbys (docs/workers.md, "Standbys"): after each frame, the
//! snapshots of the partitions it changed go to each partition's standby, one request
//! per standby, and the frame's answers wait until every standby holds them, or
//! `--replica-timeout` has passed. A standby that did not answer in time is not waited
//! for again for a rest (one keyed heartbeat): its partitions are counted unreplicated
//! and sent again, whole, once it is back ([`Replicator::unreplicated`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use net::LogLimiter;
use proto::Message as _;
use proto::keyed::replica_subject;
use proto::rpc::{PartitionState, Replica};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::bus::Client;
use crate::config::KeyedConfig;
use crate::metrics::KEYED_REPLICA_FAILURES_TOTAL;

/// Each partition held here (and not on its way out) with its standby's worker id.
pub(crate) type Standbys = Arc<BTreeMap<u32, String>>;

/// Sends partitions' snapshots to their standbys: the frame loop's output holds one.
#[derive(Debug)]
pub(crate) struct Replicator {
    client: Client,
    prefix: String,
    service: String,
    me: String,
    timeout: Duration,
    /// How long a standby that failed is not waited for.
    rest: Duration,
    /// The most snapshot bytes one frame sends (`--replica-max-bytes`).
    max_bytes: usize,
    standbys: watch::Receiver<Standbys>,
    sending: Mutex<Sending>,
    warned: LogLimiter,
}

#[derive(Debug, Default)]
struct Sending {
    /// The last `Replica.seq` used.
    seq: u64,
    /// Standbys that failed, and until when they are not waited for.
    resting: HashMap<String, Instant>,
    /// Partitions whose latest snapshot is not at their standby.
    unreplicated: BTreeSet<u32>,
    /// The server's max payload, and the connection (its count of connects) that said
    /// it: asked again only after a reconnect, not every frame (the server's INFO is a
    /// dozen strings to copy).
    max_payload: Option<(u64, usize)>,
}

impl Replicator {
    pub(crate) fn new(
        client: Client,
        (prefix, service, me): (&str, &str, &str),
        config: &KeyedConfig,
        standbys: watch::Receiver<Standbys>,
    ) -> Replicator {
        Replicator {
            client,
            prefix: prefix.to_owned(),
            service: service.to_owned(),
            me: me.to_owned(),
            timeout: config.replica_timeout,
            rest: config.keyed_heartbeat,
            max_bytes: config.replica_max_bytes,
            standbys,
            sending: Mutex::default(),
            warned: LogLimiter::per_second(),
        }
    }

    /// Whether `partition` has a standby now.
    pub(crate) fn stands_by(&self, partition: u32) -> bool {
        self.standbys.borrow().contains_key(&partition)
    }

    /// The server's max payload, as the connection of the moment said it.
    fn max_payload(&self, sending: &mut Sending) -> usize {
        let connects = self.client.statistics().connects.load(Ordering::Relaxed);
        match sending.max_payload {
            Some((said, max)) if said == connects => max,
            _ => {
                let max = self.client.server_info().max_payload;
                sending.max_payload = Some((connects, max));
                max
            }
        }
    }

    fn sending(&self) -> std::sync::MutexGuard<'_, Sending> {
        self.sending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `states` to their partitions' standbys and waits for each to hold them, at
    /// most `--replica-timeout`; a partition without a standby is skipped.
    pub(crate) async fn send(&self, states: Vec<(u32, Bytes)>) {
        let standbys = self.standbys.borrow().clone();
        let (states, over) = within_budget(states, self.max_bytes);
        if !over.is_empty() {
            self.sending().unreplicated.extend(&over);
            tracing::debug!(
                partitions = over.len(),
                "a frame's snapshots past --replica-max-bytes: sent at the next heartbeat"
            );
        }
        let mut by_standby: BTreeMap<&str, Vec<PartitionState>> = BTreeMap::new();
        for (partition, state) in states {
            if let Some(standby) = standbys.get(&partition) {
                let states = by_standby.entry(standby.as_str()).or_default();
                states.push(PartitionState { partition, state });
            }
        }
        let now = Instant::now();
        let mut requests = Vec::new();
        {
            let mut sending = self.sending();
            let max = self.max_payload(&mut sending);
            for (standby, states) in by_standby {
                if sending
                    .resting
                    .get(standby)
                    .is_some_and(|until| now < *until)
                {
                    (sending.unreplicated).extend(states.iter().map(|s| s.partition));
                    continue;
                }
                for batch in batches(states, max) {
                    sending.seq += 1;
                    let replica = Replica {
                        from: self.me.clone(),
                        seq: sending.seq,
                        partitions: batch,
                    };
                    requests.push((standby, replica));
                }
            }
        }
        let sent = join_all(requests.into_iter().map(|(standby, replica)| async move {
            let held = self.ask(standby, &replica).await;
            (standby, replica, held)
        }))
        .await;
        let mut sending = self.sending();
        // A standby whose rest is over is forgotten: one that never answers again (dead,
        // gone) leaves no entry behind.
        sending.resting.retain(|_, until| now < *until);
        for (standby, replica, held) in sent {
            let partitions = replica.partitions.iter().map(|s| s.partition);
            match held {
                Ok(()) => {
                    sending.resting.remove(standby);
                    partitions.for_each(|p| {
                        sending.unreplicated.remove(&p);
                    });
                }
                Err(why) => {
                    sending.resting.insert(standby.to_owned(), now + self.rest);
                    sending.unreplicated.extend(partitions);
                    metrics::counter!(KEYED_REPLICA_FAILURES_TOTAL, "service" => self.service.clone())
                        .increment(1);
                    if let Some(tally) = self.warned.check() {
                        tracing::warn!(
                            %standby,
                            %why,
                            "a standby does not hold what a frame changed: the frame's answers left without it, and its partitions are unreplicated until it answers again{tally}"
                        );
                    }
                }
            }
        }
    }

    /// Sends one `replica` to `standby`; `Ok` once it holds it.
    async fn ask(&self, standby: &str, replica: &Replica) -> Result<(), String> {
        let subject = replica_subject(&self.prefix, &self.service, standby);
        let payload = replica.encode_to_vec().into();
        match tokio::time::timeout(self.timeout, self.client.request(subject, payload)).await {
            Ok(Ok(answer)) if answer.payload.is_empty() => Ok(()),
            Ok(Ok(answer)) => Err(String::from_utf8_lossy(&answer.payload).into_owned()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!(
                "no answer within --replica-timeout {:?}",
                self.timeout
            )),
        }
    }

    /// The partitions held here whose latest snapshot is not at their standby (those
    /// not held any more are forgotten), once their standby is no longer resting.
    pub(crate) fn unreplicated(&self, held: &BTreeSet<u32>) -> (usize, Vec<u32>) {
        let standbys = self.standbys.borrow().clone();
        let now = Instant::now();
        let mut sending = self.sending();
        sending.unreplicated.retain(|p| held.contains(p));
        let Sending {
            resting,
            unreplicated,
            ..
        } = &*sending;
        let due = (unreplicated.iter().copied())
            .filter(|p| {
                let standby = standbys.get(p);
                standby.is_some_and(|s| resting.get(s).is_none_or(|until| now >= *until))
            })
            .collect();
        (unreplicated.len(), due)
    }
}

impl Replicator {
    /// `partition`'s standby lacks its latest state (nothing was sent).
    pub(crate) fn missed(&self, partition: u32) {
        self.sending().unreplicated.insert(partition);
    }
}

/// The first of `states` whose sizes add up to at most `budget` bytes (always the first
/// one, whatever its size: a frame sends something), and the partitions of the rest.
fn within_budget(mut states: Vec<(u32, Bytes)>, budget: usize) -> (Vec<(u32, Bytes)>, Vec<u32>) {
    let mut total = 0;
    let fit = (states.iter())
        .take_while(|(_, state)| {
            total += state.len();
            total <= budget
        })
        .count()
        .max(1)
        .min(states.len());
    let over = states.split_off(fit).into_iter().map(|(p, _)| p).collect();
    (states, over)
}

/// `states` in requests the bus takes (`max` bytes of payload each); a state too large
/// for one alone goes alone, and the bus refuses it (counted, said, unreplicated).
fn batches(states: Vec<PartitionState>, max: usize) -> Vec<Vec<PartitionState>> {
    // What a Replica's own fields take beside its states, generously.
    const ENVELOPE: usize = 64;
    let mut batches: Vec<Vec<PartitionState>> = Vec::new();
    let mut size = 0;
    for state in states {
        // Its field's tag and length prefix take at most 6 bytes more.
        let len = state.encoded_len() + 8;
        match batches.last_mut() {
            Some(batch) if size + len + ENVELOPE <= max => batch.push(state),
            _ => {
                size = 0;
                batches.push(vec![state]);
            }
        }
        size += len;
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(partition: u32, len: usize) -> PartitionState {
        PartitionState {
            partition,
            state: vec![7; len].into(),
        }
    }

    /// A frame sends its snapshots up to `--replica-max-bytes` exactly, in order; one
    /// byte more and the last waits; the first always goes.
    #[test]
    fn a_frame_sends_snapshots_up_to_its_byte_budget() {
        let states = || {
            (0..4)
                .map(|p| (p, Bytes::from(vec![0; 100])))
                .collect::<Vec<_>>()
        };
        let sent = |(sent, over): (Vec<(u32, Bytes)>, Vec<u32>)| {
            (sent.into_iter().map(|(p, _)| p).collect::<Vec<_>>(), over)
        };
        assert_eq!(
            sent(within_budget(states(), 400)),
            (vec![0, 1, 2, 3], vec![])
        );
        assert_eq!(sent(within_budget(states(), 399)), (vec![0, 1, 2], vec![3]));
        assert_eq!(sent(within_budget(states(), 10)), (vec![0], vec![1, 2, 3]));
        assert_eq!(sent(within_budget(Vec::new(), 10)), (vec![], vec![]));
    }

    /// States share a request up to the bus's payload limit; one too large goes alone.
    #[test]
    fn states_share_requests_up_to_the_payload_limit() {
        let sizes = |batches: Vec<Vec<PartitionState>>| -> Vec<Vec<u32>> {
            (batches.into_iter())
                .map(|b| b.into_iter().map(|s| s.partition).collect())
                .collect()
        };
        let small = vec![state(0, 10), state(1, 10), state(2, 10)];
        assert_eq!(sizes(batches(small, 1024)), [vec![0, 1, 2]]);
        // 400 bytes each: two fit under 1,024 with the envelope, the third does not.
        let mid = vec![state(0, 400), state(1, 400), state(2, 400)];
        assert_eq!(sizes(batches(mid, 1024)), [vec![0, 1], vec![2]]);
        let huge = vec![state(0, 10), state(1, 5000), state(2, 10)];
        assert_eq!(sizes(batches(huge, 1024)), [vec![0], vec![1], vec![2]]);
    }
}
