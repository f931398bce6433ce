//! A keyed service's partitions on this worker: which it holds, and moving them
//! (docs/workers.md, "Keyed services").
//!
//! A task of its own, beside the worker's other inputs. It hears its peers' heartbeats
//! on `<prefix>.keyed.<service>.members` and says its own (a task of its own too, so a
//! busy queue never delays it), asks [`Members`] what to do, and does it:
//!
//! - **Take fresh**: queue [`InputKind::Fresh`] for the loop, then subscribe the
//!   partition, `<prefix>.part.<service>.<N>.>`, plain. The loop runs the take-over
//!   before any of the partition's requests.
//! - **Hand over** to its owner, in two requests on the owner's hand-over subject: a
//!   prepare (the owner subscribes the partition too and holds what it receives), the
//!   overlap (this worker still serves, while every server learns of the new
//!   subscription), then leaving the partition, the state from the loop after the
//!   partition's last request here ([`InputKind::HandOver`]), and `seen`: per origin,
//!   the highest `seq` this worker took since the prepare. A refusal, or the prepare
//!   unanswered in time: this worker keeps the partition (takes it back, after leaving)
//!   and tries again later. The state unanswered in time: the new owner may have taken
//!   it, so it is sent again, the same, until answered, and taken back only once the new
//!   owner is counted dead.
//! - **Take a hand-over**: on a prepare, subscribe and hold; on the state, queue
//!   [`InputKind::TakeOver`], then the held requests `seen` does not cover, and serve.
//!   A leaving worker refuses a prepare (a non-empty answer), so the sender tries another.
//!   A state taken already (the same sender and hand-over id) is answered taken again,
//!   and changes nothing.
//!
//! - **Move** off a server in lame duck mode: a hand-over to itself on a connection to
//!   another server, its state never leaving the loop.
//!
//! At shutdown the worker says it is leaving, hands every partition over to its owner
//! among the others, and ends once it holds none; with no other worker left, its
//! partitions are left and their state ends with it. The hand-over's steps are in
//! [`handover`], the move in [`lame_duck`].

mod handover;
mod held;
mod lame_duck;
mod replicate;
mod standby;
mod taken;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use futures::stream::SelectAll;
use futures::{FutureExt, Stream, StreamExt, stream};
use proto::Message as _;
use proto::keyed::{handover_subject, members_subject, partition_subject, replica_subject};
use proto::rpc::{HandOver, KeyedMember};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::WorkerError;
use super::hop::{self, Target, until};
use super::subscribe::Boxed;
use crate::bus::method_of;
use crate::bus::{Client, Subscriber};
use crate::config::KeyedConfig;
use crate::frame_loop::{Incoming, InputKind};
use crate::metrics::{
    HANDOVER_OVERFLOW_TOTAL, KEYED_PARTITIONS_UNREPLICATED, KEYED_PEERS_DEAD_TOTAL,
    KEYED_PEERS_LEFT_TOTAL, PARTITION_CONFLICTS_TOTAL, PARTITIONS_HELD, PARTITIONS_TAKEN_TOTAL,
};
use crate::ownership::{Gone, Members, Step};
use handover::{covered, note};
pub use held::HeldPartitions;
use lame_duck::Hop;
pub(crate) use replicate::Replicator;
use replicate::Standbys;
use standby::Replicas;
use taken::TakenBefore;

/// What a refusing worker answers a hand-over with (a leaving one, or one handing that
/// partition away itself).
const REFUSED: &[u8] = b"refused";

/// A keyed service's partitions, subscribed to its peers but not yet running.
pub(super) struct Keyed {
    client: Client,
    prefix: String,
    service: String,
    partitions: u32,
    me: String,
    config: KeyedConfig,
    members: Subscriber,
    handovers: Subscriber,
    /// What this worker says in its heartbeats: whom it is, what it holds.
    heartbeat: watch::Sender<KeyedMember>,
    /// With standbys: the replicas sent to this worker, and what sends this worker's.
    standby: Option<Standby>,
}

/// A keyed service's standbys, on one worker: where its own partitions' standbys are
/// (the frame loop's output sends there), and the replicas others send it.
struct Standby {
    replicas: Subscriber,
    standbys: watch::Sender<Standbys>,
    replicator: Arc<Replicator>,
}

/// One partition subscription's messages, and its end; `sub` tells subscriptions of one
/// partition apart (a request of one let go is not the partition's any more).
enum Item {
    Request {
        partition: u32,
        sub: u64,
        request: Incoming<Subject>,
    },
    Ended {
        partition: u32,
        sub: u64,
    },
}

/// A partition subscription: which, and how to leave it.
struct Subscription {
    sub: u64,
    /// Cancelled to leave: the subscription ends at once, unsubscribed.
    leave: CancellationToken,
}

/// A partition held here.
struct Held {
    subscription: Subscription,
    /// Set while it is handed away.
    out: Option<Out>,
    /// What its last holder took (nothing when taken fresh): requests of it that come
    /// after the state are dropped.
    taken_before: TakenBefore,
}

/// A partition on its way out.
struct Out {
    to: To,
    /// Names this hand-over in its requests (`HandOver.id`).
    id: u64,
    /// Per origin, the highest `seq` taken since the prepare.
    seen: HashMap<String, u64>,
}

/// Where a partition on its way out goes.
#[derive(Clone, PartialEq, Eq)]
enum To {
    /// A peer, by id.
    Peer(String),
    /// Nowhere: at shutdown, with no other worker left.
    Nobody,
    /// This worker's new connection, off a server in lame duck mode.
    Myself,
}

/// A partition handed to this worker, subscribed, its requests held until the state
/// comes.
struct Preparing {
    subscription: Subscription,
    since: Instant,
    held: VecDeque<Incoming<Subject>>,
    /// Requests dropped, the buffer full.
    dropped: u64,
}

impl Preparing {
    fn new(subscription: Subscription) -> Self {
        Preparing {
            subscription,
            since: Instant::now(),
            held: VecDeque::new(),
            dropped: 0,
        }
    }
}

/// What a hand-over's task reports: `partition` prepared (the overlap over) or not, or
/// what became of its state.
enum Handed {
    Prepared {
        partition: u32,
        ok: bool,
    },
    /// The server in lame duck mode knows this worker's new subscriptions (or the move's
    /// time is up).
    Proven,
    Done {
        partition: u32,
        sent: Sent,
    },
}

/// What became of a partition's state sent to its new owner.
enum Sent {
    /// Taken (answered empty).
    Taken,
    /// Not taken: refused, or not sent (too large, or the loop gone); the state back.
    Kept(Bytes),
    /// Not answered in time: the new owner may have taken it or not, so it is sent again
    /// while the new owner lives.
    Unanswered(HandOver),
}

impl Keyed {
    /// Subscribes the peers' heartbeats and this worker's hand-over subject.
    /// With `replicates` (the service gives snapshots, and `--standby` is on), subscribes
    /// the replicas sent to this worker too.
    pub(super) async fn subscribe(
        client: &Client,
        (prefix, service, partitions): (&str, &str, u32),
        config: KeyedConfig,
        replicates: bool,
    ) -> Result<Keyed, WorkerError> {
        let me = format!("{:016x}", fastrand::u64(..));
        let subscribe = async |subject: String| {
            client
                .subscribe(subject.clone())
                .await
                .map_err(|source| WorkerError::Subscribe { subject, source })
        };
        let members = subscribe(members_subject(prefix, service)).await?;
        let handovers = subscribe(handover_subject(prefix, service, &me)).await?;
        let (heartbeat, _) = watch::channel(KeyedMember {
            id: me.clone(),
            ..KeyedMember::default()
        });
        let standby = if replicates {
            let replicas = subscribe(replica_subject(prefix, service, &me)).await?;
            let (standbys, follows) = watch::channel(Standbys::default());
            let names = (prefix, service, me.as_str());
            let replicator = Replicator::new(client.clone(), names, &config, follows);
            Some(Standby {
                replicas,
                standbys,
                replicator: Arc::new(replicator),
            })
        } else {
            None
        };
        Ok(Keyed {
            client: client.clone(),
            prefix: prefix.to_owned(),
            service: service.to_owned(),
            partitions,
            me,
            config,
            members,
            handovers,
            heartbeat,
            standby,
        })
    }

    /// What sends this worker's partitions to their standbys, when they have any.
    pub(super) fn replicator(&self) -> Option<Arc<Replicator>> {
        self.standby.as_ref().map(|s| s.replicator.clone())
    }

    /// Follows how many partitions this worker holds.
    pub(super) fn held(&self) -> HeldPartitions {
        HeldPartitions::new(self.heartbeat.subscribe())
    }

    /// Runs until `shutdown` and every partition is handed over; what the partitions
    /// bring (requests, take-overs, hand-overs) goes to `out`, for the loop.
    pub(super) fn run(
        self,
        out: mpsc::Sender<Incoming<Subject>>,
        target: Target,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let Keyed {
            client,
            prefix,
            service,
            partitions,
            me,
            config,
            members,
            handovers,
            heartbeat,
            standby,
        } = self;
        let (replicas_sub, standbys, replicator) = match standby {
            Some(s) => (Some(s.replicas), s.standbys, Some(s.replicator)),
            None => (None, watch::Sender::new(Standbys::default()), None),
        };
        let said = heartbeat.subscribe();
        let (handed_tx, handed_rx) = mpsc::channel(2 * partitions as usize + 1);
        let (clients, heartbeat_client) = watch::channel(client.clone());
        let hop = Hop {
            notice: hop::notice(&client),
            output_notice: None,
            target: Arc::new(target),
            connecting: None,
            left: None,
        };
        let timeouts = (config.keyed_member_timeout, config.keyed_heartbeat * 2);
        // Two heartbeats: a standby's claim is heard before its owner would take fresh.
        let adoption = match replicator {
            Some(_) => config.keyed_heartbeat * 2,
            None => Duration::ZERO,
        };
        let coordinator = Coordinator {
            view: Members::new(me.clone(), partitions, timeouts, Instant::now().into_std())
                .with_adoption(adoption),
            output: client.clone(),
            clients,
            hop,
            members,
            handovers,
            prefix: prefix.clone(),
            service: service.clone(),
            me,
            config,
            held: BTreeMap::new(),
            moving: BTreeSet::new(),
            preparing: BTreeMap::new(),
            taken: BTreeMap::new(),
            next_sub: 0,
            last_handover: 0,
            leaving: false,
            out,
            streams: SelectAll::new(),
            heartbeat,
            handed_tx,
            held_gauge: metrics::gauge!(PARTITIONS_HELD, "service" => service.clone()),
            replicas_sub,
            replicas: Replicas::default(),
            standbys,
            replicator,
            unreplicated_gauge: metrics::gauge!(KEYED_PARTITIONS_UNREPLICATED, "service" => service.clone()),
        };
        let subject = members_subject(&prefix, &service);
        let interval = config.keyed_heartbeat;
        tokio::spawn(say_heartbeats(heartbeat_client, subject, interval, said));
        tokio::spawn(coordinator.run(handed_rx, shutdown))
    }
}

/// Publishes this worker's heartbeat every `interval`, and at once whenever it changes,
/// through the coordinator's connection of the moment; ends after the last one (sent
/// once the coordinator is gone).
async fn say_heartbeats(
    client: watch::Receiver<Client>,
    subject: String,
    interval: Duration,
    mut said: watch::Receiver<KeyedMember>,
) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        let gone = tokio::select! {
            _ = ticks.tick() => false,
            changed = said.changed() => changed.is_err(),
        };
        let payload: Bytes = said.borrow_and_update().encode_to_vec().into();
        let client = client.borrow().clone();
        if let Err(error) = client.publish(subject.clone(), payload).await {
            tracing::debug!(%error, "cannot publish a keyed heartbeat");
        }
        if gone {
            let _ = client.flush().await;
            return;
        }
    }
}

struct Coordinator {
    view: Members,
    /// The worker's own connection: the loop's answers leave through it, a partition's
    /// state handed over included.
    output: Client,
    /// The connection everything goes through (the heartbeats' task too), but for
    /// partitions that have not left the one before it yet (`hop.left`).
    clients: watch::Sender<Client>,
    hop: Hop,
    members: Subscriber,
    handovers: Subscriber,
    prefix: String,
    service: String,
    me: String,
    config: KeyedConfig,
    held: BTreeMap<u32, Held>,
    /// Partitions on their way out (prepared or left, state not yet taken by the new
    /// owner).
    moving: BTreeSet<u32>,
    /// Partitions on their way in.
    preparing: BTreeMap<u32, Preparing>,
    /// Per partition, the last hand-over taken here: its old owner and id. A state sent
    /// again (its answer lost or late) is known by it; one entry per partition at most.
    taken: BTreeMap<u32, (String, u64)>,
    next_sub: u64,
    /// The id of the last hand-over started here: each new one counts one more.
    last_handover: u64,
    leaving: bool,
    out: mpsc::Sender<Incoming<Subject>>,
    streams: SelectAll<Boxed<Item>>,
    heartbeat: watch::Sender<KeyedMember>,
    handed_tx: mpsc::Sender<Handed>,
    held_gauge: metrics::Gauge,
    /// Where replicas come to this worker as a standby (with standbys on).
    replicas_sub: Option<Subscriber>,
    replicas: Replicas,
    /// Each held partition's standby, for the frame loop's output.
    standbys: watch::Sender<Standbys>,
    replicator: Option<Arc<Replicator>>,
    unreplicated_gauge: metrics::Gauge,
}

impl Coordinator {
    /// The connection of the moment.
    fn client(&self) -> Client {
        self.clients.borrow().clone()
    }

    async fn run(mut self, mut handed: mpsc::Receiver<Handed>, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.config.keyed_heartbeat);
        loop {
            if self.leaving && self.held.is_empty() && self.preparing.is_empty() {
                break;
            }
            // A dead peer is counted dead the moment its time is up, not at the next
            // tick: its partitions' pause is the member timeout, no more.
            let expiry = self.view.next_expiry().map(Instant::from_std);
            tokio::select! {
                () = shutdown.cancelled(), if !self.leaving => {
                    self.leaving = true;
                    tracing::info!(held = self.held.len(), "leaving: handing the partitions over");
                    self.say();
                    self.act().await;
                }
                _ = ticks.tick() => {
                    self.expire().await;
                    self.check_conflicts();
                    self.let_go_stale();
                    self.act().await;
                    self.prune_replicas();
                }
                () = at(expiry) => {
                    self.expire().await;
                    self.act().await;
                }
                Some(message) = next_of(&mut self.replicas_sub) => self.replica(message).await,
                Some(message) = self.members.next() => self.heard(&message.payload).await,
                Some(message) = self.handovers.next() => self.take_handed(message).await,
                () = until(&mut self.hop.notice), if !self.leaving && self.hop.left.is_none() => {
                    self.hop.notice = None;
                    tracing::warn!("the NATS server is going away: moving the partitions to another server");
                    let (target, old) = (self.hop.target.clone(), self.client());
                    let deadline = Instant::now() + target.timeout;
                    self.hop.connecting = Some(
                        async move { hop::connect_elsewhere(&target, &old, deadline).await }.boxed(),
                    );
                }
                () = until(&mut self.hop.output_notice) => {
                    self.hop.output_notice = hop::reconnect_output(&self.output);
                }
                new = until(&mut self.hop.connecting) => {
                    self.hop.connecting = None;
                    match new {
                        Some(new) => self.arrive(new).await,
                        // It said why; a later notice tries again.
                        None => self.hop.notice = hop::notice(&self.client()),
                    }
                }
                Some(item) = self.streams.next() => match item {
                    Item::Request { partition, sub, request } => {
                        self.request(partition, sub, request).await;
                    }
                    Item::Ended { partition, sub } => self.ended(partition, sub).await,
                },
                Some(handed) = handed.recv() => match handed {
                    Handed::Prepared { partition, ok } => self.prepared(partition, ok),
                    Handed::Proven => self.leave_old(),
                    Handed::Done { partition, sent } => self.handed(partition, sent).await,
                },
            }
        }
        tracing::info!("no partition left: each handed over, or left with nobody to take it");
    }

    /// A peer's heartbeat. A newcomer hears this worker's at once, so it need not wait
    /// a whole heartbeat to learn what is held.
    async fn heard(&mut self, payload: &[u8]) {
        let Ok(member) = KeyedMember::decode(payload) else {
            tracing::warn!("a keyed heartbeat that does not decode: ignored");
            return;
        };
        let now = Instant::now().into_std();
        let new = self
            .view
            .heard(&member.id, &member.held, member.leaving, now);
        if new {
            tracing::info!(peer = %member.id, "a keyed peer joined");
            self.heartbeat.send_modify(|_| {});
        }
        if new || member.leaving {
            self.act().await;
        }
    }

    /// Forgets the peers not heard from for the member timeout: counted dead, or left
    /// when their last heartbeat said leaving with nothing held (a drained worker's last
    /// word). The heartbeats that came while this task was busy (waiting for room in the
    /// loop's queue) are heard first, up to `--keyed-heard-before-expiring` of them (so
    /// a flood on the members subject cannot hold the tick off): a peer is counted dead
    /// for its own silence, never for this worker's.
    async fn expire(&mut self) {
        let limit = self.config.keyed_heard_before_expiring;
        for message in ready(&mut self.members, limit) {
            self.heard(&message.payload).await;
        }
        let Gone { dead, left } = self.view.expire(Instant::now().into_std());
        if !dead.is_empty() {
            metrics::counter!(KEYED_PEERS_DEAD_TOTAL, "service" => self.service.clone())
                .increment(dead.len() as u64);
            tracing::warn!(?dead, "keyed peers not heard from: counted dead");
            self.replicas.bury(&dead);
        }
        if !left.is_empty() {
            metrics::counter!(KEYED_PEERS_LEFT_TOTAL, "service" => self.service.clone())
                .increment(left.len() as u64);
            tracing::info!(?left, "keyed peers left");
        }
    }

    /// Publishes what this worker holds now, and follows its standbys.
    fn say(&mut self) {
        self.follow_standbys();
        let held: Vec<u32> = self.held.keys().copied().collect();
        self.held_gauge.set(held.len() as f64);
        self.heartbeat.send_modify(|m| {
            m.held = held;
            m.leaving = self.leaving;
        });
    }

    fn check_conflicts(&self) {
        // A partition on its way out is its new owner's already in that owner's heartbeat.
        let held: BTreeSet<u32> = (self.held.keys())
            .filter(|p| !self.moving.contains(p))
            .copied()
            .collect();
        let conflicts = self.view.conflicts(&held);
        if !conflicts.is_empty() {
            metrics::counter!(PARTITION_CONFLICTS_TOTAL, "service" => self.service.clone())
                .increment(conflicts.len() as u64);
            tracing::warn!(
                ?conflicts,
                "a peer says it holds partitions held here: their owners settle it by hand-over"
            );
        }
    }

    /// Lets go the partitions prepared here whose state did not come in time: their old
    /// owner kept them (and served what was held here).
    fn let_go_stale(&mut self) {
        let config = &self.config;
        // Longer than a dead old owner takes to be counted dead: then this worker takes
        // the partition fresh, with what it held.
        let wait =
            config.handover_overlap + config.handover_timeout * 2 + config.keyed_member_timeout;
        let now = Instant::now();
        let held = &self.held;
        self.preparing.retain(|partition, preparing| {
            // A partition moving to this worker's new connection ends with the move.
            let own = held.contains_key(partition);
            let fresh = own || now.duration_since(preparing.since) < wait;
            if !fresh {
                tracing::warn!(partition, "a prepared hand-over never came: let go");
                preparing.subscription.leave.cancel();
            }
            fresh
        });
    }

    /// Does what the view says.
    async fn act(&mut self) {
        self.adopt().await;
        let held: BTreeSet<u32> = self.held.keys().copied().collect();
        let now = Instant::now().into_std();
        for step in self.view.plan(&held, &self.moving, self.leaving, now) {
            match step {
                Step::HandOver { partition, to } => self.hand_over(partition, Some(to)),
                Step::TakeFresh { partition } => {
                    let how = (InputKind::Fresh, "fresh");
                    self.take(partition, how, Bytes::new(), None).await;
                }
            }
        }
        if self.leaving {
            // Nobody left to take them: they are left, and their state ends here.
            let orphans: Vec<u32> = self
                .held
                .keys()
                .copied()
                .filter(|p| !self.moving.contains(p) && self.view.owner(*p, true).is_none())
                .collect();
            for partition in orphans {
                self.hand_over(partition, None);
            }
        }
        // Who lives may have changed: so may the standbys.
        self.follow_standbys();
    }

    /// Subscribes `partition`, plain; its messages come as [`Item`]s.
    async fn subscribe(&mut self, partition: u32) -> Option<Subscription> {
        let subject = partition_subject(&self.prefix, &self.service, partition);
        let subscriber = match self.client().subscribe(format!("{subject}.>")).await {
            Ok(subscriber) => subscriber,
            Err(error) => {
                tracing::error!(partition, %error, "cannot subscribe a partition");
                return None;
            }
        };
        let sub = self.next_sub;
        self.next_sub += 1;
        let leave = CancellationToken::new();
        // What precedes the method in the partition's subjects: made once, not per request.
        let method_prefix = format!("{subject}.");
        let messages = subscriber
            .take_until(leave.clone().cancelled_owned())
            .map(move |message| {
                let method = method_of(&message.subject, &method_prefix).to_owned();
                let request =
                    Incoming::new(method, message.payload, message.reply).in_partition(partition);
                Item::Request {
                    partition,
                    sub,
                    request,
                }
            })
            .chain(stream::once(async move { Item::Ended { partition, sub } }));
        self.streams.push(messages.boxed());
        Some(Subscription { sub, leave })
    }

    /// Queues the take-over for the loop, then what was held for `partition` (all of it
    /// but what `seen` covers), and serves it: on the subscription made for a prepare,
    /// or a new one.
    async fn take(
        &mut self,
        partition: u32,
        (kind, how): (InputKind, &'static str),
        state: Bytes,
        seen: Option<&HashMap<String, u64>>,
    ) {
        metrics::counter!(PARTITIONS_TAKEN_TOTAL, "service" => self.service.clone(), "how" => how)
            .increment(1);
        if (self.out)
            .send(Incoming::partition(kind, partition, state, None))
            .await
            .is_err()
        {
            return; // the worker is gone
        }
        let subscription = match self.preparing.remove(&partition) {
            Some(preparing) => {
                if preparing.dropped > 0 {
                    tracing::warn!(
                        partition,
                        dropped = preparing.dropped,
                        "requests dropped while the partition's state was on its way (--handover-buffer)"
                    );
                }
                for request in preparing.held {
                    if seen.is_none_or(|seen| !covered(seen, &request.payload)) {
                        let _ = self.out.send(request).await;
                    }
                }
                preparing.subscription
            }
            None => match self.subscribe(partition).await {
                Some(subscription) => subscription,
                None => return,
            },
        };
        let held = Held {
            subscription,
            out: None,
            taken_before: TakenBefore::new(
                seen.cloned().unwrap_or_default(),
                self.config.keyed_member_timeout,
            ),
        };
        self.held.insert(partition, held);
        self.say();
    }

    /// A request of `partition`'s subscription `sub`: the loop's if held here (noted in
    /// `seen` while handed away; dropped if its last holder took it), held if prepared,
    /// dropped if let go.
    async fn request(&mut self, partition: u32, sub: u64, request: Incoming<Subject>) {
        if let Some(held) = self.held.get_mut(&partition)
            && held.subscription.sub == sub
        {
            if held.taken_before.took(&request.payload) {
                return;
            }
            if let Some(out) = &mut held.out {
                note(&mut out.seen, &request.payload);
            }
            let _ = self.out.send(request).await;
        } else if let Some(preparing) = self.preparing.get_mut(&partition)
            && preparing.subscription.sub == sub
        {
            if preparing.held.len() < self.config.handover_buffer {
                preparing.held.push_back(request);
            } else {
                preparing.dropped += 1;
                metrics::counter!(HANDOVER_OVERFLOW_TOTAL, "service" => self.service.clone())
                    .increment(1);
            }
        }
    }
}

/// Resolves at `deadline`; never without one.
async fn at(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The next message of `subscriber`; never without one.
async fn next_of(subscriber: &mut Option<Subscriber>) -> Option<async_nats::Message> {
    match subscriber {
        Some(subscriber) => subscriber.next().await,
        None => std::future::pending().await,
    }
}

/// What `stream` has ready now, `limit` items at most: never waits for more.
fn ready<S: Stream + Unpin>(stream: &mut S, limit: usize) -> Vec<S::Item> {
    let mut items = Vec::new();
    while items.len() < limit {
        match stream.next().now_or_never() {
            Some(Some(item)) => items.push(item),
            _ => break,
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tick hears what is queued up to its limit, and waits for nothing more: at the
    /// limit exactly, all of it; past it, the limit's worth, the rest left in order.
    #[test]
    fn what_is_ready_is_taken_up_to_the_limit_without_waiting() {
        // Three items queued, then nothing more for ever.
        let mut queued = stream::iter(0..3).chain(stream::pending());
        assert_eq!(ready(&mut queued, 3), [0, 1, 2]);
        assert!(ready(&mut queued, 3).is_empty(), "nothing queued: no wait");
        let mut queued = stream::iter(3..7).chain(stream::pending());
        assert_eq!(ready(&mut queued, 3), [3, 4, 5]);
        assert_eq!(ready(&mut queued, 3), [6]);
    }
}
