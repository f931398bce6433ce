//! A worker: one service's frame loop fed by its queue-group subscription on the bus,
//! and by the service's event subscriptions.
//!
//! Two phases, like a server that is handed a bound listener: [`Worker::subscribe`]
//! subscribes and waits until the broker has the subscriptions (so a caller, or a test,
//! knows requests will reach it), then [`Worker::run`] serves until shutdown. [`run`] does
//! both.
//!
//! # Subscribing, and a starting worker's snapshot
//!
//! [`Worker::subscribe`] first subscribes the service's events, then, if the service
//! asks for it ([`Service::on_start_sync`]), requests a snapshot from a running peer,
//! and only then subscribes the snapshot subject and the requests. So the worker never
//! asks itself, every change published after its event subscriptions reached the broker
//! is delivered to it, and the snapshot (the first thing its loop runs) covers the
//! changes before. No peer answering at all (no responders) means none runs: the worker
//! starts empty. A peer that does not answer within [`SYNC_TIMEOUT`], [`SYNC_ATTEMPTS`]
//! times, fails the start: serving without the state would answer wrongly.
//!
//! # Reconnecting
//!
//! A worker whose bus connection dropped missed what was published while it was away
//! (core NATS is at most once), and async-nats, reconnecting, subscribes everything
//! again without a word. So before it queues the first request that arrives after a
//! reconnect (the client's count of connections made has grown), a worker of a service
//! with a snapshot asks a peer again: it drains its own subscription of the snapshot
//! subject (so the request, sent after the UNSUB on the same connection, goes to a
//! peer, never to its own loop, which is waiting behind it), asks, queues the snapshot
//! for its loop, and subscribes again. The snapshot *replaces* the loop's state, which
//! is safe: every change the worker took before asking reached the broker before the
//! request, so the peer took it before the request too (events before queue events)
//! and its snapshot holds it; every change after is taken after the snapshot. No peer
//! (no responders) keeps the worker's own state; a peer that does not answer in time
//! keeps it too, with a warning, until the next reconnect.
//!
//! # Order
//!
//! All subscriptions share one connection, whose reader hands each message to its
//! subscription's channel in the order the broker sent them. The worker takes them from
//! those channels so that what arrived first is queued first where it matters: before it
//! queues a request it first takes every event already waiting, and before a
//! [`Delivery::Queue`] event every [`Delivery::All`] event. So a change that a peer
//! published before answering a client is applied before that client's next request,
//! whichever worker gets it.
//!
//! # Threads
//!
//! The intake (reading the subscription, answering 503 when the queue is full) runs on the
//! caller's tokio runtime. The frame loop runs on a thread of its own with a
//! single-threaded runtime for its timers: handlers are synchronous game logic, and a
//! long frame there delays only this service, never the network I/O of the process, which
//! in `shaddock up` also runs the broker and the gate.
//!
//! # Shutdown
//!
//! When `shutdown` fires the worker leaves its request subscription and those of its
//! [`Delivery::Queue`] events *by count* ([`crate::drain`]): the bus stops routing to it
//! after a fixed allowance of further messages, every one of which it takes, so nothing
//! the bus had already routed to it is lost (async-nats' own `drain` drops what arrives
//! one I/O turn after the UNSUB). A quiet subscription that does not use its allowance
//! within the drain window unsubscribes outright. The worker then finishes everything
//! it took, flushes the answers and pushes, logs `worker drained: N requests arrived
//! after draining started`, and returns. [`Delivery::All`] events are taken until the
//! requests end. Bounding the drain's length is the caller's business: it is at most
//! the drain window plus a full queue of handler time.
//!
//! # Lame duck
//!
//! A worker whose server enters lame duck mode (see [`crate::bus::reconnect`]) moves to
//! another server of its `--nats` list at once, while its own still runs: it asks
//! async-nats to reconnect, which picks another server (the one in lame duck no longer
//! accepts) and subscribes everything there. A request on the wire at that instant is
//! lost, as with any reconnect; the queue subscriptions are then renewed so later
//! drains stay lossless ([`crate::drain`]). With a single URL there is nowhere to go:
//! the worker serves until the server closes the connection, then reconnects.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{Client, Statistics, Subject, Subscriber};
use bytes::Bytes;
use futures::stream::SelectAll;
use futures::{FutureExt, Stream, StreamExt, stream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::announce::Announcer;
use crate::bus::{self, Signals, method_of, service_subject};
use crate::config::{ConfigError, DrainConfig, WorkerConfig};
use crate::drain::{self, Drained, Draining};
use crate::frame_loop::{self, FrameLoop, Incoming};
use crate::push::Pusher;
use crate::service::{Delivery, Service};

/// How long a starting worker waits for a peer's snapshot, per attempt. A peer answers
/// from its loop, behind whatever it has queued, so this allows for a busy one.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts at a snapshot before the start fails.
pub const SYNC_ATTEMPTS: u32 = 3;

/// Why a worker could not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    #[error("cannot flush to the bus: {0}")]
    Flush(#[from] async_nats::client::FlushError),
    #[error("no peer answered a snapshot request on {0} (see Service::on_start_sync)")]
    Sync(String),
    #[error("cannot start the frame loop thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error("the frame loop of service {0:?} stopped unexpectedly")]
    LoopStopped(String),
}

/// A service subscribed to the bus, ready to [`run`](Worker::run).
pub struct Worker {
    pusher: Pusher,
    service: Service,
    config: WorkerConfig,
    subscriber: Subscriber,
    subject: String,
    events: Vec<EventSubscription>,
    /// The snapshot subject's subscription, when the service has one.
    sync: Option<SyncSubscription>,
    snapshot: Option<Bytes>,
    /// The schema announcement, when the service has descriptors.
    announcer: Option<Announcer>,
    /// The client's count of connections made when the worker subscribed (see
    /// [`crate::drain`]).
    connects: u64,
}

/// A service's snapshot subject, subscribed after the start's snapshot was fetched.
struct SyncSubscription {
    events: EventSubscription,
    /// Under the prefix: where to ask again after a reconnect.
    prefixed: String,
    /// The client's count of connections made when the start asked for the snapshot.
    connects: u64,
}

/// One of the service's event subjects, subscribed.
struct EventSubscription {
    /// As the service registered it (without the prefix).
    subject: String,
    delivery: Delivery,
    subscriber: Subscriber,
}

impl Worker {
    /// Subscribes the service's events, fetches a peer's snapshot if the service asks
    /// for one, subscribes `<prefix>.svc.<service>.>` in queue group `<service>`, and
    /// flushes, so the SUB is on the wire when this returns. async-nats' flush does not
    /// wait for the broker's PONG: a request published on another connection in that
    /// same instant may still miss this worker (no responders); one that follows any
    /// round trip through the broker will not. See the module docs for the order and why.
    pub async fn subscribe(
        client: Client,
        service: Service,
        config: WorkerConfig,
    ) -> Result<Worker, WorkerError> {
        config.validate()?;
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let pusher = Pusher::new(client.clone(), config.prefix.clone())?;
        let sync_subject = service.start_sync_subject().map(str::to_owned);
        let mut events = Vec::new();
        for (subject, delivery) in service.events() {
            if Some(subject) != sync_subject.as_deref() {
                events.push(
                    subscribe_event(&client, &config.prefix, service.name(), subject, delivery)
                        .await?,
                );
            }
        }
        client.flush().await?;
        let (sync, snapshot) = match sync_subject {
            Some(subject) => {
                let connects = client.statistics().connects.load(Ordering::Relaxed);
                let prefixed = format!("{}.{subject}", config.prefix);
                let snapshot = fetch_snapshot(&client, &prefixed).await?;
                let events = subscribe_event(
                    &client,
                    &config.prefix,
                    service.name(),
                    &subject,
                    Delivery::Queue,
                )
                .await?;
                let sync = SyncSubscription {
                    events,
                    prefixed,
                    connects,
                };
                (Some(sync), snapshot)
            }
            None => (None, None),
        };
        let subject = service_subject(&config.prefix, service.name());
        let subscriber = client
            .queue_subscribe(subject.clone(), service.name().to_owned())
            .await
            .map_err(|source| WorkerError::Subscribe {
                subject: subject.clone(),
                source,
            })?;
        let announcer = match service.schema() {
            Some(schema) => Some(Announcer::subscribe(&client, &config.prefix, &schema).await?),
            None => None,
        };
        client.flush().await?;
        Ok(Worker {
            pusher,
            service,
            config,
            subscriber,
            subject,
            events,
            sync,
            snapshot,
            announcer,
            connects,
        })
    }

    /// The subject this worker serves.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// A pusher on this worker's connection and prefix, for pushes from outside the
    /// handlers (a task of the service's own, a timer).
    pub fn pusher(&self) -> Pusher {
        self.pusher.clone()
    }

    /// Serves requests until `shutdown` fires, then drains (see the module docs).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let span = tracing::info_span!("worker", service = %self.service.name());
        self.serve(shutdown).instrument(span).await
    }

    async fn serve(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let Worker {
            pusher,
            service,
            config,
            subscriber,
            subject,
            events,
            sync,
            snapshot,
            announcer,
            connects,
        } = self;
        let client = pusher.client().clone();
        let name = service.name().to_owned();
        let frames = config.frames;
        let drain_config = frames.drain;
        let (intake, queue) = frame_loop::queue(&name, frames.queue_capacity, pusher.clone());
        let frame_loop = FrameLoop::new(service, frames, queue, pusher);
        let mut stopped = spawn_loop_thread(&name, frame_loop)?;
        tracing::info!(%subject, "worker serving");
        let signals = bus::signals(&client);
        if let Some(announcer) = announcer {
            tokio::spawn(announcer.run(signals.clone(), shutdown.clone()));
        }
        if let Some(signals) = signals {
            let servers = config.nats.len();
            tokio::spawn(move_on_lame_duck(
                client.clone(),
                signals,
                servers,
                shutdown.clone(),
            ));
        }
        if let Some(snapshot) = snapshot {
            // First in the queue: the loop restores before anything else.
            intake.offer(Incoming::snapshot(snapshot)).await;
        }

        // `>` stands for the method: what follows `<prefix>.svc.<service>.`.
        let method_prefix = subject.trim_end_matches('>').to_owned();
        let resync = sync.map(|sync| Resync::new(&client, &name, &config.prefix, sync, &shutdown));
        let leaving = Leaving {
            client: client.clone(),
            group: name.clone(),
            stats: client.statistics(),
            connects,
            config: drain_config,
            shutdown,
            prefix: config.prefix.clone(),
        };
        let input = inputs(subscriber, subject, events, resync, leaving, method_prefix);
        tokio::select! {
            () = intake.feed(input) => {}
            // The loop ends only after the intake does, unless something broke.
            _ = &mut stopped => return Err(WorkerError::LoopStopped(name)),
        }
        // The intake is gone: the loop finishes the queue, then stops.
        stopped
            .await
            .map_err(|_| WorkerError::LoopStopped(name.clone()))??;
        client.flush().await?;
        tracing::info!("worker stopped");
        Ok(())
    }
}

/// Until `shutdown`: each time the server enters lame duck mode, moves to another of the
/// `servers` URLs (see "Lame duck" in the module docs).
async fn move_on_lame_duck(
    client: Client,
    signals: Arc<Signals>,
    servers: usize,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = signals.lame_duck() => {}
        }
        if servers < 2 {
            tracing::warn!(
                "the NATS server is going away and it is the only one given: serving until it closes the connection, then reconnecting"
            );
            continue;
        }
        tracing::warn!("the NATS server is going away: moving to another server");
        if let Err(error) = client.force_reconnect().await {
            tracing::warn!(%error, "cannot reconnect");
        }
    }
}

/// Subscribes `service` as a worker and serves until `shutdown`, then drains: stops taking
/// requests, answers those it took, and returns.
pub async fn run(
    client: Client,
    service: Service,
    config: WorkerConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let worker = tokio::select! {
        worker = Worker::subscribe(client, service, config) => worker?,
        // The broker may be unreachable for now; shutting down must not wait for it.
        () = shutdown.cancelled() => return Ok(()),
    };
    worker.run(shutdown).await?;
    Ok(())
}

async fn subscribe_event(
    client: &Client,
    prefix: &str,
    service: &str,
    subject: &str,
    delivery: Delivery,
) -> Result<EventSubscription, WorkerError> {
    let full = format!("{prefix}.{subject}");
    let subscribed = match delivery {
        Delivery::Queue => {
            client
                .queue_subscribe(full.clone(), service.to_owned())
                .await
        }
        Delivery::All => client.subscribe(full.clone()).await,
    };
    let subscriber = subscribed.map_err(|source| WorkerError::Subscribe {
        subject: full,
        source,
    })?;
    Ok(EventSubscription {
        subject: subject.to_owned(),
        delivery,
        subscriber,
    })
}

/// Asks a running peer for the service's state (see the module docs).
async fn fetch_snapshot(client: &Client, subject: &str) -> Result<Option<Bytes>, WorkerError> {
    for attempt in 1..=SYNC_ATTEMPTS {
        let asked = tokio::time::timeout(
            SYNC_TIMEOUT,
            client.request(subject.to_owned(), Bytes::new()),
        )
        .await;
        match asked {
            Ok(Ok(message)) => {
                tracing::info!(%subject, bytes = message.payload.len(), "snapshot from a peer");
                return Ok(Some(message.payload));
            }
            Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders => {
                tracing::info!(%subject, "no peer runs to ask: this worker's state stands");
                return Ok(None);
            }
            Ok(Err(error)) => tracing::warn!(%subject, attempt, %error, "snapshot request failed"),
            Err(_) => tracing::warn!(%subject, attempt, "no snapshot in time"),
        }
    }
    Err(WorkerError::Sync(subject.to_owned()))
}

/// Runs `frame_loop` on a thread of its own; the receiver fires when it returns.
fn spawn_loop_thread(
    name: &str,
    frame_loop: FrameLoop<Pusher>,
) -> Result<oneshot::Receiver<Result<(), WorkerError>>, WorkerError> {
    let (done_tx, done_rx) = oneshot::channel();
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name(format!("frames-{name}"))
        .spawn(move || {
            let _entered = span.enter();
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map(|runtime| {
                    runtime.block_on(frame_loop.run());
                })
                .map_err(WorkerError::Thread);
            let _ = done_tx.send(result);
        })?;
    Ok(done_rx)
}

type Boxed<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

/// The worker's subscriptions merged into one stream, in the order of the module docs.
/// When `shutdown` fires, the request subscription and those of [`Delivery::Queue`]
/// events drain (unsubscribe, so the bus sends new ones to the other workers of the
/// group, and keep what already arrived); the stream ends once that is all delivered.
/// [`Delivery::All`] events are taken along until the requests end, then dropped: the
/// other workers get them anyway.
struct Inputs {
    requests: Boxed<async_nats::Message>,
    requests_done: bool,
    method_prefix: String,
    /// Events every worker gets, and events one worker gets.
    all: SelectAll<Boxed<Incoming<Subject>>>,
    queue: SelectAll<Boxed<Incoming<Subject>>>,
    /// The snapshot subject (a queue event), when the service has one.
    resync: Option<Resync>,
    /// Taken from the channels, not yet handed on.
    ready: VecDeque<Incoming<Subject>>,
}

impl Inputs {
    async fn next(&mut self) -> Option<Incoming<Subject>> {
        loop {
            if let Some(incoming) = self.ready.pop_front() {
                return Some(incoming);
            }
            let serving = !self.requests_done;
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
                message = self.requests.next(), if serving => match message {
                    Some(message) => {
                        self.resync_if_reconnected().await;
                        self.take_request(message);
                    }
                    None => self.requests_done = true,
                },
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

    /// After a reconnect, queues a peer's snapshot ahead of the next request (see
    /// "Reconnecting" in the module docs).
    async fn resync_if_reconnected(&mut self) {
        let Some(resync) = self.resync.as_mut() else {
            return;
        };
        let connects = resync.stats.connects.load(Ordering::Relaxed);
        if connects == resync.connects {
            return;
        }
        resync.connects = connects;
        tracing::info!(subject = %resync.prefixed, "reconnected to the bus: asking a peer for the state");
        // Sync requests that reached this worker before it left the subject are answered
        // as usual, from its loop.
        let (left, snapshot) = resync.ask_again().await;
        self.ready.extend(left);
        if let Some(snapshot) = snapshot {
            self.ready.push_back(Incoming::snapshot(snapshot));
        }
    }
}

/// The snapshot subject's subscription, and what asking again after a reconnect takes.
struct Resync {
    client: Client,
    stats: Arc<Statistics>,
    /// The client's count of connections made (the first one included) when the worker
    /// last asked for a snapshot: a higher count means it reconnected since.
    connects: u64,
    /// As the service registered it, the prefix, and the two together.
    subject: String,
    prefix: String,
    prefixed: String,
    /// The service's queue group.
    group: String,
    /// The subscription's messages; `None` after it could not be made again. `stop` drains
    /// it, at shutdown (a child of `shutdown`) or to leave the subject.
    stream: Option<Boxed<Incoming<Subject>>>,
    stop: CancellationToken,
    shutdown: CancellationToken,
}

impl Resync {
    fn new(
        client: &Client,
        group: &str,
        prefix: &str,
        sync: SyncSubscription,
        shutdown: &CancellationToken,
    ) -> Self {
        let mut resync = Resync {
            client: client.clone(),
            stats: client.statistics(),
            connects: sync.connects,
            subject: sync.events.subject,
            prefix: prefix.to_owned(),
            prefixed: sync.prefixed,
            group: group.to_owned(),
            stream: None,
            stop: shutdown.child_token(),
            shutdown: shutdown.clone(),
        };
        resync.listen(sync.events.subscriber);
        resync
    }

    fn listen(&mut self, subscriber: Subscriber) {
        self.stop = self.shutdown.child_token();
        self.stream = Some(to_events(
            until_left(subscriber, self.stop.clone()),
            self.subject.clone(),
        ));
    }

    /// The next sync request, or `None` when there is no subscription (or none any more:
    /// a drained one is dropped, never polled again).
    async fn next(resync: &mut Option<Resync>) -> Option<Incoming<Subject>> {
        let resync = resync.as_mut()?;
        let request = resync.stream.as_mut()?.next().await;
        if request.is_none() {
            resync.stream = None;
        }
        request
    }

    /// Leaves the subject (returning the requests that had already arrived), asks a peer,
    /// and subscribes again.
    async fn ask_again(&mut self) -> (Vec<Incoming<Subject>>, Option<Bytes>) {
        let mut left = Vec::new();
        if let Some(mut stream) = self.stream.take() {
            self.stop.cancel();
            let drained = async {
                while let Some(request) = stream.next().await {
                    left.push(request);
                }
            };
            if tokio::time::timeout(SYNC_TIMEOUT, drained).await.is_err() {
                tracing::warn!(subject = %self.prefixed, "the old subscription did not drain in time; dropping it");
            }
        }
        let snapshot = match fetch_snapshot(&self.client, &self.prefixed).await {
            Ok(snapshot) => snapshot,
            Err(error) => {
                tracing::warn!(%error, "keeping this worker's state, which may miss changes made while it was away");
                None
            }
        };
        let subscribed = subscribe_event(
            &self.client,
            &self.prefix,
            &self.group,
            &self.subject,
            Delivery::Queue,
        )
        .await;
        match subscribed {
            Ok(events) => self.listen(events.subscriber),
            Err(error) => {
                tracing::warn!(subject = %self.prefixed, %error, "cannot subscribe again: peers starting later ask the others");
            }
        }
        (left, snapshot)
    }
}

/// What the worker's subscriptions need to leave their queue groups at shutdown.
struct Leaving {
    client: Client,
    /// The service's queue group.
    group: String,
    stats: Arc<Statistics>,
    connects: u64,
    config: DrainConfig,
    shutdown: CancellationToken,
    prefix: String,
}

impl Leaving {
    /// `subscriber`'s messages until it has left its group after shutdown (see
    /// [`crate::drain`]); `done` is told how that went.
    fn drain(
        &self,
        subscriber: Subscriber,
        subject: String,
        done: impl FnOnce(Drained) + Send + 'static,
    ) -> Boxed<async_nats::Message> {
        let draining = Draining {
            subscriber,
            client: self.client.clone(),
            subject,
            group: self.group.clone(),
            stats: self.stats.clone(),
            connects: self.connects,
            config: self.config,
        };
        drain::until_drained(draining, self.shutdown.clone(), done).boxed()
    }
}

fn inputs(
    requests: Subscriber,
    subject: String,
    events: Vec<EventSubscription>,
    resync: Option<Resync>,
    leaving: Leaving,
    method_prefix: String,
) -> impl Stream<Item = Incoming<Subject>> {
    let mut all = SelectAll::new();
    let mut queue = SelectAll::new();
    for event in events {
        let EventSubscription {
            subject,
            delivery,
            subscriber,
        } = event;
        match delivery {
            // Kept until dropped.
            Delivery::All => all.push(to_events(subscriber, subject)),
            Delivery::Queue => {
                let logged = subject.clone();
                let full = format!("{}.{subject}", leaving.prefix);
                let drained = leaving.drain(subscriber, full, move |drained| {
                    tracing::debug!(subject = %logged, after_drain = drained.after_drain, left = ?drained.left, "event subscription drained");
                });
                queue.push(to_events(drained, subject));
            }
        }
    }
    let requests = leaving.drain(requests, subject, |drained| {
        tracing::info!(
            after_drain = drained.after_drain,
            allowance = drained.allowance,
            left = ?drained.left,
            "worker drained: {} requests arrived after draining started",
            drained.after_drain
        );
    });
    let inputs = Inputs {
        requests,
        requests_done: false,
        method_prefix,
        all,
        queue,
        resync,
        ready: VecDeque::new(),
    };
    stream::unfold(inputs, |mut inputs| async move {
        let incoming = inputs.next().await?;
        Some((incoming, inputs))
    })
}

/// Messages on an event subject as the loop's input.
fn to_events(
    messages: impl Stream<Item = async_nats::Message> + Send + 'static,
    subject: String,
) -> Boxed<Incoming<Subject>> {
    messages
        .map(move |m| Incoming::event(subject.clone(), m.payload, m.reply))
        .boxed()
}

/// The snapshot subject's messages until `stop`; then it leaves the subject outright
/// (`Subscriber::drain`: async-nats forgets it one I/O turn after the UNSUB), yields
/// what had already arrived, and ends. Used to step aside while asking a peer for a
/// snapshot, so the request, sent after the UNSUB on the same connection, never comes
/// back to this worker; a sync request lost in that instant is asked again by its peer.
fn until_left(
    subscriber: Subscriber,
    stop: CancellationToken,
) -> impl Stream<Item = async_nats::Message> {
    // Kept across messages, so it registers with the token once instead of per message;
    // `None` once draining.
    let stop = Some(Box::pin(stop.cancelled_owned()));
    stream::unfold(
        (subscriber, stop),
        move |(mut subscriber, stop)| async move {
            if let Some(mut stop) = stop {
                tokio::select! {
                    message = subscriber.next() => return Some((message?, (subscriber, Some(stop)))),
                    () = &mut stop => {
                        if let Err(error) = subscriber.drain().await {
                            // The client is closed: nothing more will arrive, nor leave.
                            tracing::warn!(%error, "cannot drain a subscription");
                            return None;
                        }
                    }
                }
            }
            let message = subscriber.next().await?;
            Some((message, (subscriber, None)))
        },
    )
}
