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
//! When `shutdown` fires the worker drains its request subscription and those of its
//! [`Delivery::Queue`] events: it unsubscribes, so the bus sends new requests (and events,
//! such as a session's close) to the other workers of the group, and still takes what the
//! broker had already sent. It then finishes everything it took, flushes the answers and
//! pushes, and returns. (async-nats drops the subscription one I/O turn after sending the UNSUB, so a
//! request still on the wire at that instant is lost and the gate answers it 408; that
//! window is microseconds wide.) Bounding the drain's length is the caller's business:
//! it is at most a full queue of handler time.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{Client, Subject, Subscriber};
use bytes::Bytes;
use futures::stream::SelectAll;
use futures::{FutureExt, Stream, StreamExt, stream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::bus::{method_of, service_subject};
use crate::config::{ConfigError, WorkerConfig};
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
    snapshot: Option<Bytes>,
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
        let pusher = Pusher::new(client.clone(), config.prefix.clone())?;
        let sync = service.start_sync_subject().map(str::to_owned);
        let mut events = Vec::new();
        let (first, last): (Vec<_>, Vec<_>) = service
            .events()
            .map(|(subject, delivery)| (subject.to_owned(), delivery))
            .partition(|(subject, _)| Some(subject) != sync.as_ref());
        for (subject, delivery) in first {
            events.push(
                subscribe_event(&client, &config.prefix, service.name(), subject, delivery).await?,
            );
        }
        client.flush().await?;
        let snapshot = match &sync {
            Some(subject) => {
                fetch_snapshot(&client, format!("{}.{subject}", config.prefix)).await?
            }
            None => None,
        };
        for (subject, delivery) in last {
            events.push(
                subscribe_event(&client, &config.prefix, service.name(), subject, delivery).await?,
            );
        }
        let subject = service_subject(&config.prefix, service.name());
        let subscriber = client
            .queue_subscribe(subject.clone(), service.name().to_owned())
            .await
            .map_err(|source| WorkerError::Subscribe {
                subject: subject.clone(),
                source,
            })?;
        client.flush().await?;
        Ok(Worker {
            pusher,
            service,
            config,
            subscriber,
            subject,
            events,
            snapshot,
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
            snapshot,
        } = self;
        let client = pusher.client().clone();
        let name = service.name().to_owned();
        let frames = config.frames;
        let (intake, queue) = frame_loop::queue(&name, frames.queue_capacity, pusher.clone());
        let frame_loop = FrameLoop::new(service, frames, queue, pusher);
        let mut stopped = spawn_loop_thread(&name, frame_loop)?;
        tracing::info!(%subject, "worker serving");
        if let Some(snapshot) = snapshot {
            // First in the queue: the loop restores before anything else.
            intake.offer(Incoming::snapshot(snapshot)).await;
        }

        // `>` stands for the method: what follows `<prefix>.svc.<service>.`.
        let method_prefix = subject.trim_end_matches('>').to_owned();
        let input = inputs(subscriber, events, shutdown, method_prefix);
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
    subject: String,
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
        subject,
        delivery,
        subscriber,
    })
}

/// Asks a running peer for the service's state (see the module docs).
async fn fetch_snapshot(client: &Client, subject: String) -> Result<Option<Bytes>, WorkerError> {
    for attempt in 1..=SYNC_ATTEMPTS {
        let asked =
            tokio::time::timeout(SYNC_TIMEOUT, client.request(subject.clone(), Bytes::new())).await;
        match asked {
            Ok(Ok(message)) => {
                tracing::info!(%subject, bytes = message.payload.len(), "snapshot from a peer");
                return Ok(Some(message.payload));
            }
            Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders => {
                tracing::info!(%subject, "no peer runs: starting empty");
                return Ok(None);
            }
            Ok(Err(error)) => tracing::warn!(%subject, attempt, %error, "snapshot request failed"),
            Err(_) => tracing::warn!(%subject, attempt, "no snapshot in time"),
        }
    }
    Err(WorkerError::Sync(subject))
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
                message = self.requests.next(), if serving => match message {
                    Some(message) => self.take_request(message),
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
}

fn inputs(
    requests: Subscriber,
    events: Vec<EventSubscription>,
    shutdown: CancellationToken,
    method_prefix: String,
) -> impl Stream<Item = Incoming<Subject>> {
    let mut all = SelectAll::new();
    let mut queue = SelectAll::new();
    for event in events {
        let subject = event.subject;
        let to_incoming =
            move |m: async_nats::Message| Incoming::event(subject.clone(), m.payload, m.reply);
        match event.delivery {
            Delivery::All => all.push(event.subscriber.map(to_incoming).boxed()),
            Delivery::Queue => queue.push(
                until_drained(event.subscriber, shutdown.clone(), None)
                    .map(to_incoming)
                    .boxed(),
            ),
        }
    }
    let inputs = Inputs {
        requests: until_drained(requests, shutdown, Some("worker draining")).boxed(),
        requests_done: false,
        method_prefix,
        all,
        queue,
        ready: VecDeque::new(),
    };
    stream::unfold(inputs, |mut inputs| async move {
        let incoming = inputs.next().await?;
        Some((incoming, inputs))
    })
}

/// A subscription's messages until `shutdown`; then it drains: unsubscribes, yields what
/// had already arrived, and ends. `log` is said at info when draining starts.
fn until_drained(
    subscriber: Subscriber,
    shutdown: CancellationToken,
    log: Option<&'static str>,
) -> impl Stream<Item = async_nats::Message> {
    // Kept across messages, so it registers with the token once instead of per message;
    // `None` once draining.
    let stop = Some(Box::pin(shutdown.cancelled_owned()));
    stream::unfold(
        (subscriber, stop),
        move |(mut subscriber, stop)| async move {
            if let Some(mut stop) = stop {
                tokio::select! {
                    message = subscriber.next() => return Some((message?, (subscriber, Some(stop)))),
                    () = &mut stop => {
                        if let Some(log) = log {
                            tracing::info!("{log}");
                        }
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
