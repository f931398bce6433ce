//! The worker's input: its subscriptions merged into one stream, drained at shutdown,
//! and moved to another connection when their server enters lame duck mode
//! ([`super::hop`]).
//!
//! All subscriptions share one connection, whose reader hands each message to its
//! subscription's channel in the order the broker sent them. What arrived first is
//! queued first where it matters: before a request, every event already waiting; before
//! a [`Delivery::Queue`] event, every [`Delivery::All`] event. So a change that a peer
//! published before answering a client is applied before that client's next request,
//! whichever worker gets it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::Subject;
use futures::stream::SelectAll;
use futures::{FutureExt, Stream, StreamExt, stream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::hop::{Arrival, Mover};
use super::resync::Resync;
use super::subscribe::{Boxed, EventSubscription, Subjects, subscribe_event, to_events};
use crate::bus::method_of;
use crate::bus::{Client, Subscriber};
use crate::config::DrainConfig;
use crate::drain::{self, Drained, Draining};
use crate::frame_loop::Incoming;
use crate::service::Delivery;

/// The connection the inputs are read from, and what leaving it takes.
struct Inbound {
    client: Client,
    /// The client's count of connections made when the subscriptions were made (see
    /// [`crate::drain`]).
    connects: u64,
    /// Cancelled to drain this connection's queue subscriptions: at shutdown (its
    /// parent), or when the inputs move.
    leave: CancellationToken,
    /// Set when the inputs moved away (rather than the worker shutting down).
    moved: Arc<AtomicBool>,
    /// Held by each of this connection's draining subscriptions until it has ended:
    /// [`Inbound::gone`] returns `None` once all have.
    alive: mpsc::Sender<()>,
    gone: mpsc::Receiver<()>,
}

impl Inbound {
    fn new(client: Client, connects: u64, shutdown: &CancellationToken) -> Self {
        let (alive, gone) = mpsc::channel(1);
        Inbound {
            client,
            connects,
            leave: shutdown.child_token(),
            moved: Arc::default(),
            alive,
            gone,
        }
    }
}

/// The worker's subscriptions merged into one stream, in the order of the module docs.
/// When `shutdown` fires, the request subscription and those of [`Delivery::Queue`]
/// events drain (unsubscribe, so the bus sends new ones to the other workers of the
/// group, and keep what already arrived); the stream ends once that is all delivered.
/// [`Delivery::All`] events are taken along until the requests end, then dropped: the
/// other workers get them anyway.
struct Inputs {
    /// The request subscription, and for a moment after a move the old one, draining.
    requests: SelectAll<Boxed<async_nats::Message>>,
    requests_done: bool,
    method_prefix: String,
    /// Events every worker gets, and events one worker gets.
    all: SelectAll<Boxed<Incoming<Subject>>>,
    queue: SelectAll<Boxed<Incoming<Subject>>>,
    /// The snapshot subject (a queue event), when the service has one.
    resync: Option<Resync>,
    /// A keyed service's partitions: their requests and changes of hands, in order
    /// ([`super::keyed`]); `None` for another service, or once they have all gone.
    keyed: Option<mpsc::Receiver<Incoming<Subject>>>,
    /// Taken from the channels, not yet handed on.
    ready: VecDeque<Incoming<Subject>>,
    subjects: Subjects,
    inbound: Inbound,
    mover: Mover,
    config: DrainConfig,
    shutdown: CancellationToken,
}

impl Inputs {
    async fn next(&mut self) -> Option<Incoming<Subject>> {
        loop {
            if let Some(incoming) = self.ready.pop_front() {
                return Some(incoming);
            }
            if self.requests.is_empty() && !self.mover.moving() {
                self.requests_done = true;
            }
            let serving = !self.requests_done;
            let stopping = self.shutdown.is_cancelled();
            // A keyed service's partitions move off a server in lame duck mode by
            // themselves (`super::keyed`); its other inputs stay on the worker's own
            // connection, and move with its reconnect (docs/workers.md).
            let keyed = self.keyed.is_some();
            let stay = stopping || keyed;
            tokio::select! {
                biased;
                Some(event) = self.all.next(), if serving => self.ready.push_back(event),
                Some(event) = self.queue.next() => {
                    self.take_waiting_all();
                    self.ready.push_back(event);
                }
                Some(event) = Resync::next(&mut self.resync) => {
                    self.take_waiting_all();
                    self.ready.push_back(event);
                }
                partition = next_keyed(&mut self.keyed), if keyed => match partition {
                    Some(incoming) => {
                        self.take_waiting_all();
                        self.ready.push_back(incoming);
                    }
                    None => self.keyed = None,
                },
                // `None` once the last one has ended: the loop then sees it is empty.
                message = self.requests.next(), if serving && !self.requests.is_empty() => {
                    let Some(message) = message else { continue };
                    if let Some(resync) = self.resync.as_mut()
                        && let Some(asked) = resync.after_reconnect().await
                    {
                        self.take_resync(asked);
                    }
                    self.take_request(message);
                }
                arrival = self.mover.next(&self.inbound.client, &self.subjects, stay), if serving => {
                    self.arrive(arrival).await;
                }
                // Requests drained, and every queue event stream drained too.
                else => return None,
            }
        }
    }

    /// Queues a request behind every event that reached the worker before it.
    fn take_request(&mut self, message: async_nats::Message) {
        self.take_waiting_all();
        while let Some(Some(event)) = self.queue.next().now_or_never() {
            self.take_waiting_all();
            self.ready.push_back(event);
        }
        let method = method_of(&message.subject, &self.method_prefix);
        self.ready
            .push_back(Incoming::new(method, message.payload, message.reply));
    }

    /// Takes the `All` events already waiting, without waiting for more.
    fn take_waiting_all(&mut self) {
        while let Some(Some(event)) = self.all.next().now_or_never() {
            self.ready.push_back(event);
        }
    }

    /// Sync requests that reached this worker before it left the subject (answered as
    /// usual, from its loop), then the peer's snapshot.
    fn take_resync(&mut self, (left, snapshot): (Vec<Incoming<Subject>>, Option<bytes::Bytes>)) {
        self.ready.extend(left);
        if let Some(snapshot) = snapshot {
            self.ready.push_back(Incoming::snapshot(snapshot));
        }
    }

    /// Switches the inputs to the connection a move made (see "Lame duck" in
    /// [`super::hop`]): its queue subscriptions join the streams, the `All` events and the
    /// snapshot subject move, the old queue subscriptions drain by count, and once they
    /// have all ended the old connection is let go.
    async fn arrive(&mut self, arrival: Arrival) {
        let Arrival {
            client,
            connects,
            requests,
            queue,
        } = arrival;
        let new = Inbound::new(client, connects, &self.shutdown);
        let old = std::mem::replace(&mut self.inbound, new);
        self.add_requests(requests);
        for (subject, subscriber) in queue {
            self.add_queue_event(subject, subscriber);
        }
        // `All` events are not counted: there is no lossless hand-over for them. Those
        // already here are queued, the old subscriptions dropped (UNSUB), new ones made;
        // what is published meanwhile is missed, as across a reconnect, and the snapshot
        // below makes up for it when the service has one.
        self.take_waiting_all();
        self.all = SelectAll::new();
        for subject in self.subjects.all_events.clone() {
            let subscribed = subscribe_event(
                &self.inbound.client,
                &self.subjects.prefix,
                &self.subjects.group,
                &subject,
                Delivery::All,
            )
            .await;
            match subscribed {
                Ok(event) => self.all.push(to_events(event.subscriber, event.subject)),
                Err(error) => tracing::warn!(%error, "cannot subscribe after moving"),
            }
        }
        let client = self.inbound.client.clone();
        if let Some(resync) = self.resync.as_mut() {
            let asked = resync.moved_to(&client).await;
            self.take_resync(asked);
        }
        // The old subscriptions leave last: the snapshot above may have taken a while,
        // during which they were not read, and their drain window starts now.
        old.moved.store(true, Ordering::Relaxed);
        old.leave.cancel();
        let Inbound {
            client,
            alive,
            gone,
            ..
        } = old;
        drop(alive);
        self.mover.moved(client, gone, &self.inbound.client);
    }

    /// `subscriber`'s messages until it has left its group (see [`crate::drain`]), at
    /// shutdown or when the inputs move; `done` is told how that went.
    fn drain(
        &self,
        subscriber: Subscriber,
        subject: String,
        done: impl FnOnce(Drained, bool) + Send + 'static,
    ) -> Boxed<async_nats::Message> {
        let client = &self.inbound.client;
        let draining = Draining {
            subscriber,
            client: client.clone(),
            subject,
            group: self.subjects.group.clone(),
            stats: client.statistics(),
            connects: self.inbound.connects,
            config: self.config,
        };
        let alive = self.inbound.alive.clone();
        let moved = self.inbound.moved.clone();
        drain::until_drained(draining, self.inbound.leave.clone(), move |drained| {
            done(drained, moved.load(Ordering::Relaxed));
            drop(alive);
        })
        .boxed()
    }

    fn add_requests(&mut self, subscriber: Subscriber) {
        let requests = self.drain(
            subscriber,
            self.subjects.requests.clone(),
            |drained, moved| {
                let Drained {
                    after_drain,
                    allowance,
                    lapses,
                    left,
                } = drained;
                if moved {
                    tracing::info!(after_drain, allowance, lapses, ?left, "left the server in lame duck mode: {after_drain} requests arrived there after leaving started");
                } else {
                    tracing::info!(after_drain, allowance, lapses, ?left, "worker drained: {after_drain} requests arrived after draining started");
                }
            },
        );
        self.requests.push(requests);
    }

    fn add_queue_event(&mut self, subject: String, subscriber: Subscriber) {
        let logged = subject.clone();
        let full = format!("{}.{subject}", self.subjects.prefix);
        let drained = self.drain(subscriber, full, move |drained, moved| {
            tracing::debug!(subject = %logged, after_drain = drained.after_drain, left = ?drained.left, moved, "event subscription drained");
        });
        self.queue.push(to_events(drained, subject));
    }
}

/// The next of a keyed service's inputs; never ready for another service.
async fn next_keyed(
    keyed: &mut Option<mpsc::Receiver<Incoming<Subject>>>,
) -> Option<Incoming<Subject>> {
    match keyed {
        Some(partitions) => partitions.recv().await,
        None => std::future::pending().await,
    }
}

/// The subscriptions the worker starts with, on its own connection.
pub(super) struct Subscribed {
    pub client: Client,
    /// The client's count of connections made before they were made.
    pub connects: u64,
    pub requests: Subscriber,
    pub events: Vec<EventSubscription>,
    pub resync: Option<Resync>,
    pub keyed: Option<mpsc::Receiver<Incoming<Subject>>>,
}

/// The worker's inputs as one stream (see [`Inputs`]).
pub(super) fn inputs(
    subscribed: Subscribed,
    subjects: Subjects,
    mover: Mover,
    config: DrainConfig,
    shutdown: CancellationToken,
) -> impl Stream<Item = Incoming<Subject>> + use<> {
    let Subscribed {
        client,
        connects,
        requests,
        events,
        resync,
        keyed,
    } = subscribed;
    // `>` (or a keyed service's `*`) stands for the method: what follows
    // `<prefix>.svc.<service>.`.
    let method_prefix = subjects.requests.trim_end_matches(['>', '*']).to_owned();
    let mut inputs = Inputs {
        requests: SelectAll::new(),
        requests_done: false,
        method_prefix,
        all: SelectAll::new(),
        queue: SelectAll::new(),
        resync,
        keyed,
        ready: VecDeque::new(),
        subjects,
        inbound: Inbound::new(client, connects, &shutdown),
        mover,
        config,
        shutdown,
    };
    for event in events {
        let EventSubscription {
            subject,
            delivery,
            subscriber,
        } = event;
        match delivery {
            // Kept until dropped.
            Delivery::All => inputs.all.push(to_events(subscriber, subject)),
            Delivery::Queue => inputs.add_queue_event(subject, subscriber),
        }
    }
    inputs.add_requests(requests);
    stream::unfold(inputs, |mut inputs| async move {
        let incoming = inputs.next().await?;
        Some((incoming, inputs))
    })
}
