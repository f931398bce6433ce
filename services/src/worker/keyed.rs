//! A keyed service's partitions on this worker: which it holds, and moving them
//! (docs/workers.md, "Keyed services").
//!
//! A task of its own, beside the worker's other inputs. It hears its peers' heartbeats
//! on `<prefix>.keyed.<service>.members` and says its own (a task of its own too, so a
//! busy queue never delays it), asks [`Members`] what to do, and does it:
//!
//! - **Take fresh**: queue [`InputKind::Fresh`] for the loop, then subscribe the
//!   partition, `<prefix>.svc.<service>.p<N>.>` in queue group `<service>.p<N>`. The
//!   loop runs the take-over before any of the partition's requests.
//! - **Hand over** to its owner: leave the partition's group by count (as a draining
//!   worker does, so nothing the bus routed here is lost) and pass on everything it
//!   delivered; then queue [`InputKind::HandOver`], whose answer (the state, from the
//!   loop, after the partition's last request here) is sent as a `HandOver` request to
//!   the new owner. Its answer means it has queued the state and subscribed. No answer
//!   in time: this worker takes the partition back, with that state, and tries again.
//!   Meanwhile the gates' requests for the partition find no responders and are sent
//!   again until it is served (the gate's resend), so none is lost or answered 503.
//! - **Take a hand-over**: queue [`InputKind::TakeOver`] with the state, subscribe, and
//!   answer. A leaving worker refuses (a non-empty answer), so the sender tries another.
//!
//! At shutdown the worker says it is leaving, hands every partition over to its owner
//! among the others, and ends once it holds none; with no other worker left, its
//! partitions just drain and their state ends with it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::{Client, Subject, Subscriber};
use bytes::Bytes;
use futures::stream::SelectAll;
use futures::{StreamExt, stream};
use proto::Message as _;
use proto::keyed::{handover_subject, members_subject, partition_group, partition_subject};
use proto::rpc::{HandOver, KeyedMember};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::WorkerError;
use super::subscribe::Boxed;
use crate::bus::method_of;
use crate::config::{DrainConfig, KeyedConfig};
use crate::drain::{self, Draining};
use crate::frame_loop::{Incoming, InputKind};
use crate::metrics::{
    PARTITION_CONFLICTS_TOTAL, PARTITIONS_HANDED_TOTAL, PARTITIONS_HELD, PARTITIONS_TAKEN_TOTAL,
};
use crate::ownership::{Members, Step};

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
    drain: DrainConfig,
    members: Subscriber,
    handovers: Subscriber,
    /// What this worker says in its heartbeats: whom it is, what it holds.
    heartbeat: watch::Sender<KeyedMember>,
}

/// How many partitions a keyed worker holds, as it changes ([`Worker::held`]).
///
/// [`Worker::held`]: super::Worker::held
#[derive(Debug, Clone)]
pub struct HeldPartitions(watch::Receiver<KeyedMember>);

impl HeldPartitions {
    /// The partitions held now.
    pub fn count(&self) -> usize {
        self.0.borrow().held.len()
    }

    /// Waits until the worker holds at least `n` partitions; false if it stopped first.
    pub async fn at_least(&mut self, n: usize) -> bool {
        self.0
            .wait_for(|member| member.held.len() >= n)
            .await
            .is_ok()
    }
}

/// One partition's messages, and its end.
enum Item {
    /// A request of the partition, as the loop takes it.
    Request(Incoming<Subject>),
    Ended(u32),
}

/// A partition held here.
struct Held {
    /// Cancelled to leave the partition's group.
    leave: CancellationToken,
    /// Set while it is handed over: to whom (`None`: nobody, at shutdown with no other
    /// worker left).
    leaving_to: Option<Option<String>>,
}

/// A hand-over's end: the partition, and the state back if the new owner did not take it.
type Handed = (u32, Result<(), Bytes>);

impl Keyed {
    /// Subscribes the peers' heartbeats and this worker's hand-over subject.
    pub(super) async fn subscribe(
        client: &Client,
        prefix: &str,
        service: &str,
        partitions: u32,
        (config, drain): (KeyedConfig, DrainConfig),
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
        Ok(Keyed {
            client: client.clone(),
            prefix: prefix.to_owned(),
            service: service.to_owned(),
            partitions,
            me,
            config,
            drain,
            members,
            handovers,
            heartbeat,
        })
    }

    /// Follows how many partitions this worker holds.
    pub(super) fn held(&self) -> HeldPartitions {
        HeldPartitions(self.heartbeat.subscribe())
    }

    /// Runs until `shutdown` and every partition is handed over; what the partitions
    /// bring (requests, take-overs, hand-overs) goes to `out`, for the loop.
    pub(super) fn run(
        self,
        out: mpsc::Sender<Incoming<Subject>>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let Keyed {
            client,
            prefix,
            service,
            partitions,
            me,
            config,
            drain,
            members,
            handovers,
            heartbeat,
        } = self;
        let said = heartbeat.subscribe();
        let (handed_tx, handed_rx) = mpsc::channel(partitions as usize);
        let timeouts = (config.keyed_member_timeout, config.keyed_heartbeat * 2);
        let coordinator = Coordinator {
            view: Members::new(me.clone(), partitions, timeouts, Instant::now().into_std()),
            client: client.clone(),
            prefix: prefix.clone(),
            service: service.clone(),
            me,
            config,
            drain,
            held: BTreeMap::new(),
            moving: BTreeSet::new(),
            leaving: false,
            out,
            streams: SelectAll::new(),
            heartbeat,
            handed_tx,
            held_gauge: metrics::gauge!(PARTITIONS_HELD, "service" => service.clone()),
        };
        let subject = members_subject(&prefix, &service);
        let interval = config.keyed_heartbeat;
        tokio::spawn(say_heartbeats(client, subject, interval, said));
        tokio::spawn(coordinator.run(members, handovers, handed_rx, shutdown))
    }
}

/// Publishes this worker's heartbeat every `interval`, and at once whenever it changes;
/// ends after the last one (sent once the coordinator is gone).
async fn say_heartbeats(
    client: Client,
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
    client: Client,
    prefix: String,
    service: String,
    me: String,
    config: KeyedConfig,
    drain: DrainConfig,
    held: BTreeMap<u32, Held>,
    /// Partitions on their way out (left, state not yet taken by the new owner).
    moving: BTreeSet<u32>,
    leaving: bool,
    out: mpsc::Sender<Incoming<Subject>>,
    streams: SelectAll<Boxed<Item>>,
    heartbeat: watch::Sender<KeyedMember>,
    handed_tx: mpsc::Sender<Handed>,
    held_gauge: metrics::Gauge,
}

impl Coordinator {
    async fn run(
        mut self,
        mut members: Subscriber,
        mut handovers: Subscriber,
        mut handed: mpsc::Receiver<Handed>,
        shutdown: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval(self.config.keyed_heartbeat);
        loop {
            if self.leaving && self.held.is_empty() {
                break;
            }
            tokio::select! {
                () = shutdown.cancelled(), if !self.leaving => {
                    self.leaving = true;
                    tracing::info!(held = self.held.len(), "leaving: handing the partitions over");
                    self.say();
                    self.act().await;
                }
                _ = ticks.tick() => {
                    let dead = self.view.expire(Instant::now().into_std());
                    if !dead.is_empty() {
                        tracing::warn!(?dead, "keyed peers not heard from: counted dead");
                    }
                    self.check_conflicts();
                    self.act().await;
                }
                Some(message) = members.next() => self.heard(&message.payload).await,
                Some(message) = handovers.next() => self.take_handed(message).await,
                Some(item) = self.streams.next() => match item {
                    Item::Request(request) => {
                        let _ = self.out.send(request).await;
                    }
                    Item::Ended(partition) => self.ended(partition).await,
                },
                Some((partition, result)) = handed.recv() => self.handed(partition, result).await,
            }
        }
        tracing::info!(
            "no partition left: each handed over, or drained with nobody left to take it"
        );
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

    /// Publishes what this worker holds now.
    fn say(&self) {
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

    /// Does what the view says.
    async fn act(&mut self) {
        let held: BTreeSet<u32> = self.held.keys().copied().collect();
        let now = Instant::now().into_std();
        for step in self.view.plan(&held, &self.moving, self.leaving, now) {
            match step {
                Step::HandOver { partition, to } => self.hand_over(partition, Some(to)),
                Step::TakeFresh { partition } => {
                    self.take(partition, InputKind::Fresh, Bytes::new()).await;
                }
            }
        }
        if self.leaving {
            // Nobody left to take them: they drain, and their state ends here.
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
    }

    /// Starts handing `partition` over to `to`: leaves its group; the rest follows its
    /// last message ([`Coordinator::ended`]).
    fn hand_over(&mut self, partition: u32, to: Option<String>) {
        let Some(held) = self.held.get_mut(&partition) else {
            return;
        };
        tracing::debug!(partition, ?to, "handing over");
        held.leaving_to = Some(to);
        held.leave.cancel();
        self.moving.insert(partition);
    }

    /// Queues the take-over for the loop, then subscribes `partition`.
    async fn take(&mut self, partition: u32, kind: InputKind, state: Bytes) {
        let how = if kind == InputKind::Fresh {
            "fresh"
        } else {
            "handed"
        };
        metrics::counter!(PARTITIONS_TAKEN_TOTAL, "service" => self.service.clone(), "how" => how)
            .increment(1);
        if self
            .out
            .send(Incoming::partition(kind, partition, state, None))
            .await
            .is_err()
        {
            return; // the worker is gone
        }
        let subject = partition_subject(&self.prefix, &self.service, partition);
        let group = partition_group(&self.service, partition);
        let connects = self
            .client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed);
        // What precedes the method in the partition's subjects: made once, not per request.
        let method_prefix = format!("{subject}.");
        let subscriber = match self
            .client
            .queue_subscribe(format!("{subject}.>"), group.clone())
            .await
        {
            Ok(subscriber) => subscriber,
            Err(error) => {
                tracing::error!(partition, %error, "cannot subscribe a partition");
                return;
            }
        };
        let leave = CancellationToken::new();
        let draining = Draining {
            subscriber,
            client: self.client.clone(),
            subject: format!("{subject}.>"),
            group,
            stats: self.client.statistics(),
            connects,
            config: self.drain,
        };
        let messages = drain::until_drained(draining, leave.clone(), |_| {})
            .map(move |message| {
                let method = method_of(&message.subject, &method_prefix).to_owned();
                Item::Request(Incoming::new(method, message.payload, message.reply))
            })
            .chain(stream::once(async move { Item::Ended(partition) }));
        self.streams.push(messages.boxed());
        self.held.insert(
            partition,
            Held {
                leave,
                leaving_to: None,
            },
        );
        self.say();
    }

    /// `partition`'s subscription has ended: everything the bus routed here is queued
    /// for the loop. When it is being handed over, its state follows.
    async fn ended(&mut self, partition: u32) {
        let Some(held) = self.held.get(&partition) else {
            return;
        };
        let Some(Some(to)) = held.leaving_to.clone() else {
            // Dropped (nobody to hand it to), or the connection closed under it.
            self.held.remove(&partition);
            self.moving.remove(&partition);
            self.say();
            return;
        };
        // The loop answers the state here, after the partition's last request.
        let inbox = self.client.new_inbox();
        let state = match self.client.subscribe(inbox.clone()).await {
            Ok(subscriber) => subscriber,
            Err(error) => {
                tracing::error!(partition, %error, "cannot subscribe for a partition's state");
                return;
            }
        };
        let marker = Incoming::partition(
            InputKind::HandOver,
            partition,
            Bytes::new(),
            Some(Subject::from(inbox)),
        );
        if self.out.send(marker).await.is_err() {
            return;
        }
        let send = SendState {
            client: self.client.clone(),
            subject: handover_subject(&self.prefix, &self.service, &to),
            from: self.me.clone(),
            timeout: self.config.handover_timeout,
        };
        let handed = self.handed_tx.clone();
        tokio::spawn(async move {
            let result = send.run(partition, state).await;
            let _ = handed.send((partition, result)).await;
        });
    }

    /// A hand-over ended: the partition is the new owner's, or it stays here.
    async fn handed(&mut self, partition: u32, result: Result<(), Bytes>) {
        self.moving.remove(&partition);
        let outcome = match result {
            Ok(()) => {
                self.held.remove(&partition);
                self.say();
                "ok"
            }
            Err(state) => {
                tracing::warn!(
                    partition,
                    "the new owner did not take the partition: kept here"
                );
                self.held.remove(&partition);
                self.take(partition, InputKind::TakeOver, state).await;
                "kept"
            }
        };
        metrics::counter!(PARTITIONS_HANDED_TOTAL, "service" => self.service.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// A peer hands a partition over to this worker.
    async fn take_handed(&mut self, message: async_nats::Message) {
        let Some(reply) = message.reply else {
            return;
        };
        let Ok(handover) = HandOver::decode(message.payload) else {
            tracing::warn!("a hand-over that does not decode: refused");
            return answer(self.client.clone(), reply, REFUSED).await;
        };
        let partition = handover.partition;
        if self.leaving || self.moving.contains(&partition) {
            return answer(self.client.clone(), reply, REFUSED).await;
        }
        if self.held.contains_key(&partition) {
            // Two views disagreed for a moment: the state handed over replaces this one.
            tracing::warn!(partition, from = %handover.from, "handed a partition held here already");
            metrics::counter!(PARTITION_CONFLICTS_TOTAL, "service" => self.service.clone())
                .increment(1);
            let _ = self
                .out
                .send(Incoming::partition(
                    InputKind::TakeOver,
                    partition,
                    handover.state,
                    None,
                ))
                .await;
        } else {
            tracing::debug!(partition, from = %handover.from, "taking a partition handed over");
            self.take(partition, InputKind::TakeOver, handover.state)
                .await;
        }
        answer(self.client.clone(), reply, b"").await;
    }
}

/// Answers a hand-over: empty when taken.
async fn answer(client: Client, reply: Subject, body: &'static [u8]) {
    if let Err(error) = client.publish(reply, Bytes::from_static(body)).await {
        tracing::debug!(%error, "cannot answer a hand-over");
    }
}

/// Sending a partition's state to its new owner.
struct SendState {
    client: Client,
    subject: String,
    from: String,
    timeout: Duration,
}

impl SendState {
    /// Waits for the state from the loop, and sends it; `Err` gives it back when the new
    /// owner did not take it in time (or refused).
    async fn run(self, partition: u32, mut state: Subscriber) -> Result<(), Bytes> {
        // The loop answers after the partition's last request; a stuck loop would leave
        // the partition nowhere, so this waits as long as a request may.
        let Some(state) = state.next().await else {
            return Err(Bytes::new());
        };
        let handover = HandOver {
            partition,
            state: state.payload.clone(),
            from: self.from,
        };
        let asked = tokio::time::timeout(
            self.timeout,
            self.client
                .request(self.subject, handover.encode_to_vec().into()),
        )
        .await;
        match asked {
            Ok(Ok(answer)) if answer.payload.is_empty() => Ok(()),
            Ok(Ok(_)) => Err(state.payload),
            Ok(Err(error)) => {
                tracing::debug!(partition, %error, "hand-over not taken");
                Err(state.payload)
            }
            Err(_) => Err(state.payload),
        }
    }
}
