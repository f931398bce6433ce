//! A worker: one service's frame loop fed by its subscriptions on the bus. This module
//! assembles the parts; nothing in the crate imports it.
//!
//! Two phases, like a server that is handed a bound listener: [`Worker::subscribe`]
//! subscribes and waits until the broker has the subscriptions (so a caller, or a test,
//! knows requests will reach it), then [`Worker::run`] serves until shutdown.
//! [`Worker::start`] connects, does both, and serves on a task.
//!
//! A worker runs on a host (`host.rs`): one thread with a current-thread runtime, of its
//! own unless it was started on a shared one. Its connection (made there by
//! [`Worker::start`]), subscriptions, heartbeats and intake (reading the subscriptions,
//! answering 503 when the queue is full) are tasks of that runtime, and the frame loop
//! runs between them on the same thread ([`crate::frame_loop::host`]), so a request is
//! read, handled and answered without crossing a thread. Handlers are synchronous game
//! logic: a handler that runs past `--handler-stall` gets the watchdog thread to drive
//! the host's I/O until it returns, so heartbeats, keyed ownership and drains go on. A
//! worker on a host of its own delays only its service with a long frame, never the
//! network I/O of the process; in `shaddock up`, whose workers share the gate's host, a
//! frame delays the gate's sessions on that thread too, up to `--handler-stall`.
//!
//! At shutdown the queue subscriptions leave their groups by count (`drain.rs`), the
//! loop finishes what it took, and the answers are flushed; how that loses nothing, and
//! how a worker moves off a server in lame duck mode, is in docs/workers.md.

mod announce;
mod calls;
mod error;
mod hop;
mod host;
mod inputs;
mod keyed;
mod output;
mod resync;
mod running;
mod subscribe;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::bus::{self, service_subject};
use crate::bus::{Client, Subscriber};
use crate::config::WorkerConfig;
use crate::frame_loop::{self, FrameLoop, Incoming};
use crate::push::Pusher;
use crate::service::{Delivery, Service};
use announce::Announcer;
use calls::CallReplies;
pub use error::Undelivered;
pub use error::WorkerError;
use hop::{Mover, Target};
pub use host::Host;
use inputs::{Subscribed, inputs};
pub use keyed::HeldPartitions;
use keyed::Keyed;
use output::{Held, Output};
use resync::Resync;
pub use running::Running;
use subscribe::{EventSubscription, Subjects, SyncSubscription, fetch_snapshot, subscribe_event};

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
    /// The schema announcement.
    announcer: Announcer,
    /// A keyed service's partitions, subscribed to its peers.
    keyed: Option<Keyed>,
    /// Where the answers to the service's calls to others come back.
    calls: CallReplies,
    /// The client's count of connections made when the worker subscribed (see
    /// [`crate::drain`]: a reconnect since then puts the client's and the server's
    /// counts of a subscription's messages apart).
    connects: u64,
}

impl Worker {
    /// Subscribes the service's events, fetches a peer's snapshot if the service asks
    /// for one, subscribes `<prefix>.svc.<service>.>` in queue group `<service>`, and
    /// flushes, so the SUB is on the wire when this returns. async-nats' flush does not
    /// wait for the broker's PONG: a request published on another connection in that
    /// same instant may still miss this worker (no responders); one that follows any
    /// round trip through the broker will not. The order, and why, are in this module's
    /// `subscribe` part.
    pub async fn subscribe(
        client: impl Into<Client>,
        service: Service,
        config: WorkerConfig,
    ) -> Result<Worker, WorkerError> {
        let client = client.into();
        config.validate()?;
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let pusher = Pusher::new(client.clone(), config.prefix.clone())?;
        let sync_subject = service.start_sync_subject().map(str::to_owned);
        // Owned: the service (its handlers are not `Sync`) is not borrowed across an
        // await, so subscribing can run as a task on the worker's host.
        let wanted: Vec<(String, Delivery)> = service
            .events()
            .filter(|(subject, _)| Some(*subject) != sync_subject.as_deref())
            .map(|(subject, delivery)| (subject.to_owned(), delivery))
            .collect();
        let mut events = Vec::new();
        for (subject, delivery) in wanted {
            events.push(
                subscribe_event(&client, &config.prefix, service.name(), &subject, delivery)
                    .await?,
            );
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
        // A keyed service's requests arrive on partition subjects (`super::keyed`); on
        // the service's own subject, only those of a gate that has not learnt yet that
        // it is keyed, answered 503 (retried, and routed by key then).
        let subject = match service.partitions() {
            Some(_) => format!("{}.svc.{}.*", config.prefix, service.name()),
            None => service_subject(&config.prefix, service.name()),
        };
        let keyed = match service.partitions() {
            Some(partitions) => {
                let settings = config.keyed;
                let replicates = settings.standby && service.replicates();
                let names = (config.prefix.as_str(), service.name(), partitions);
                Some(Keyed::subscribe(&client, names, settings, replicates).await?)
            }
            None => None,
        };
        let subscriber = client
            .queue_subscribe(subject.clone(), service.name().to_owned())
            .await
            .map_err(|source| WorkerError::Subscribe {
                subject: subject.clone(),
                source,
            })?;
        let announcer = Announcer::subscribe(&client, &config.prefix, &service.schema()).await?;
        let calls = CallReplies::subscribe(&client, &config.prefix).await?;
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
            keyed,
            calls,
            connects,
        })
    }

    /// The subject this worker serves.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// For a keyed service, how many of its partitions this worker holds, as it changes
    /// (a lone worker takes them all a couple of heartbeats after it starts); `None`
    /// for other services.
    pub fn held(&self) -> Option<HeldPartitions> {
        self.keyed.as_ref().map(Keyed::held)
    }

    /// A pusher on this worker's connection and prefix, for pushes from outside the
    /// handlers (a task of the service's own, a timer).
    pub fn pusher(&self) -> Pusher {
        self.pusher.clone()
    }

    /// Serves requests until `shutdown` fires, then drains: leaves its groups without
    /// losing what the bus already routed to it, and answers everything it took
    /// (docs/workers.md, "Draining on shutdown"). A drain that has not ended within
    /// `--drain-grace` (the bus is down) ends with [`WorkerError::DrainGrace`], saying
    /// what could not be delivered. Serves on a host of its own (see the module
    /// docs); the connection stays where it was made ([`Worker::start`] makes it there).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let name = self.service.name().to_owned();
        let host = Host::spawn(&name, self.config.frames.handler_stall)?;
        let done = host.serve(self, shutdown);
        drop(host);
        done.await.unwrap_or_else(|_| Err(host::vanished(&name)))
    }

    /// The worker's I/O, on its host's runtime: hands the frame loop it made to `frames`
    /// (the host drives it), and learns from `stopped` that it is done.
    async fn serve(
        self,
        shutdown: CancellationToken,
        frames: oneshot::Sender<FrameLoop<Output>>,
        mut stopped: oneshot::Receiver<Result<(), WorkerError>>,
    ) -> Result<(), WorkerError> {
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
            keyed,
            calls,
            connects,
        } = self;
        let client = pusher.client().clone();
        let name = service.name().to_owned();
        let limits = config.frames;
        let grace = limits.drain_grace;
        let drain_config = limits.subscription_drain();
        let held = Held::default();
        let output = Output {
            pusher,
            reply_prefix: calls.reply_prefix.clone(),
            callees: calls.callees.clone(),
            held: held.clone(),
            replicator: keyed.as_ref().and_then(Keyed::replicator),
        };
        let (intake, queue) = frame_loop::queue(&name, limits.queue_capacity, output.clone());
        let frame_loop = FrameLoop::new(service, limits, queue, output);
        tokio::spawn(calls::forward(calls, frame_loop.returns()));
        if frames.send(frame_loop).is_err() {
            return Err(WorkerError::LoopStopped(name));
        }
        tracing::info!(%subject, "worker serving");
        tokio::spawn(announcer.run(bus::signals(&client), shutdown.clone()));
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
        let keyed = keyed.map(|keyed| {
            let (out, partitions) = mpsc::channel(KEYED_INPUTS);
            (keyed.run(out, target.clone(), shutdown.clone()), partitions)
        });
        let mover = Mover::new(target, client.clone());
        let (coordinator, keyed) = keyed.unzip();
        let subscribed = Subscribed {
            client: client.clone(),
            connects,
            requests: subscriber,
            events,
            resync,
            keyed,
        };
        let given_up = give_up_after(shutdown.clone(), grace);
        let input = inputs(subscribed, subjects, mover, drain_config, shutdown);
        let drained = async {
            tokio::select! {
                () = intake.feed(input) => {}
                // The loop ends only after the intake does, unless something broke.
                _ = &mut stopped => return Err(WorkerError::LoopStopped(name)),
            }
            // The intake is gone: the loop finishes the queue, then stops.
            stopped
                .await
                .map_err(|_| WorkerError::LoopStopped(name.clone()))??;
            if let Some(coordinator) = coordinator {
                // Ended with the inputs; a panic in it is the only thing left to report.
                if let Err(error) = coordinator.await {
                    tracing::error!(%error, "the keyed partitions' task failed");
                }
            }
            client.flush().await?;
            Ok(())
        };
        tokio::select! {
            drained = drained => drained?,
            () = given_up => {
                // What the connection holds leaves only if it comes back: lost, and said.
                let undelivered = held.undelivered(&client);
                tracing::error!(
                    ?grace,
                    answers = undelivered.answers,
                    pushes = undelivered.pushes,
                    "the drain did not end within its grace (is the bus down?): stopping with {undelivered}"
                );
                return Err(WorkerError::DrainGrace { grace, undelivered });
            }
        }
        tracing::info!("worker stopped");
        Ok(())
    }
}

/// Resolves `grace` after `shutdown` fires: the drain's end at the latest.
async fn give_up_after(shutdown: CancellationToken, grace: std::time::Duration) {
    shutdown.cancelled().await;
    tokio::time::sleep(grace).await;
}

/// A keyed service's partition inputs waiting for the intake: the coordinator waits
/// (never the bus reader) when the intake is behind.
const KEYED_INPUTS: usize = 1024;
