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
//! after an allowance of further messages (sized from the subscription's recent rate, at
//! most `--drain-allowance`), every one of which it takes, so nothing
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
//! A worker whose inputs' server enters lame duck mode (see [`crate::bus::reconnect`])
//! moves them to another server while its own still runs, make before break
//! (`worker/hop.rs`): it connects to another server of its `--nats` list or of those the
//! connection learnt of, makes its queue subscriptions there, waits until the old
//! server knows of them (a probe published through the old server reaches the new
//! connection), and only then leaves the old subscriptions by count, as at shutdown, so
//! nothing on the wire is lost and the group is never without this member. Its `All`
//! events and the snapshot subject move too (those have no lossless hand-over; a
//! service with a snapshot asks a peer again, as after a reconnect). Answers and pushes
//! keep leaving through the worker's own connection (the pusher's); once the old
//! subscriptions have ended, that connection, when it is the one on the server going
//! away, is made again elsewhere (what it holds is written first), and otherwise the
//! old inputs' connection is closed. A lame duck notice on the pusher's connection
//! while the inputs are elsewhere makes it again at once. With no other server known
//! there is nowhere to go: the worker serves until the server closes the connection,
//! then reconnects. A move that cannot be made within `--move-timeout` is given up, with
//! a warning, in the same way.

mod hop;
mod inputs;
mod resync;

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{Client, Subscriber};
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::announce::Announcer;
use crate::bus::{self, service_subject};
use crate::config::{ConfigError, WorkerConfig};
use crate::frame_loop::{self, FrameLoop, Incoming};
use crate::push::Pusher;
use crate::service::{Delivery, Service};
use hop::{Mover, Target};
use inputs::{Subjects, Subscribed, inputs};
use resync::Resync;

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
        let drain_config = frames.subscription_drain();
        let (intake, queue) = frame_loop::queue(&name, frames.queue_capacity, pusher.clone());
        let frame_loop = FrameLoop::new(service, frames, queue, pusher);
        let mut stopped = spawn_loop_thread(&name, frame_loop)?;
        tracing::info!(%subject, "worker serving");
        if let Some(announcer) = announcer {
            tokio::spawn(announcer.run(bus::signals(&client), shutdown.clone()));
        }
        if let Some(snapshot) = snapshot {
            // First in the queue: the loop restores before anything else.
            intake.offer(Incoming::snapshot(snapshot)).await;
        }

        let resync = sync.map(|sync| Resync::new(&client, &name, &config.prefix, sync, &shutdown));
        let subjects_of = |delivery: Delivery| {
            events
                .iter()
                .filter(|event| event.delivery == delivery)
                .map(|event| event.subject.clone())
                .collect()
        };
        let subjects = Subjects {
            requests: subject,
            group: name.clone(),
            prefix: config.prefix.clone(),
            queue_events: subjects_of(Delivery::Queue),
            all_events: subjects_of(Delivery::All),
        };
        let target = Target {
            urls: config.nats.clone(),
            name: bus::worker_connection_name(&name),
            security: config.security.clone(),
            timeout: config.move_timeout,
        };
        let mover = Mover::new(target, client.clone());
        let subscribed = Subscribed {
            client: client.clone(),
            connects,
            requests: subscriber,
            events,
            resync,
        };
        let input = inputs(subscribed, subjects, mover, drain_config, shutdown);
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
