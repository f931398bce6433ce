//! A worker: one service's frame loop fed by its queue-group subscription on the bus.
//!
//! Two phases, like a server that is handed a bound listener: [`Worker::subscribe`]
//! subscribes and waits until the broker has the subscription (so a caller, or a test,
//! knows requests will reach it), then [`Worker::run`] serves until shutdown. [`run`] does
//! both.
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
//! When `shutdown` fires the worker drains its subscription: it unsubscribes, so the bus
//! sends new requests to the other workers of the group, and still takes what the broker
//! had already sent. It then finishes everything it took, flushes the answers and
//! returns. (async-nats drops the subscription one I/O turn after sending the UNSUB, so a
//! request still on the wire at that instant is lost and the gate answers it 408; that
//! window is microseconds wide.) Bounding the drain's length is the caller's business:
//! it is at most a full queue of handler time.

use async_nats::{Client, Subject, Subscriber};
use futures::{Stream, StreamExt, stream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::bus::{method_of, service_subject};
use crate::config::{ConfigError, WorkerConfig};
use crate::frame_loop::{self, FrameLoop, Incoming};
use crate::service::Service;

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
    #[error("cannot start the frame loop thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error("the frame loop of service {0:?} stopped unexpectedly")]
    LoopStopped(String),
}

/// A service subscribed to the bus, ready to [`run`](Worker::run).
pub struct Worker {
    client: Client,
    service: Service,
    config: WorkerConfig,
    subscriber: Subscriber,
    subject: String,
}

impl Worker {
    /// Subscribes `<prefix>.svc.<service>.>` in queue group `<service>` and waits for the
    /// broker to confirm (a flush round trip), so requests published after this returns
    /// can reach this worker.
    pub async fn subscribe(
        client: Client,
        service: Service,
        config: WorkerConfig,
    ) -> Result<Worker, WorkerError> {
        config.validate()?;
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
            client,
            service,
            config,
            subscriber,
            subject,
        })
    }

    /// The subject this worker serves.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Serves requests until `shutdown` fires, then drains (see the module docs).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let span = tracing::info_span!("worker", service = %self.service.name());
        self.serve(shutdown).instrument(span).await
    }

    async fn serve(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let Worker {
            client,
            service,
            config,
            subscriber,
            subject,
        } = self;
        let name = service.name().to_owned();
        let frames = config.frames;
        let (intake, queue) = frame_loop::queue(&name, frames.queue_capacity, client.clone());
        let frame_loop = FrameLoop::new(service, frames, queue, client.clone());
        let mut stopped = spawn_loop_thread(&name, frame_loop)?;
        tracing::info!(%subject, "worker serving");

        // `>` stands for the method: what follows `<prefix>.svc.<service>.`.
        let method_prefix = subject.trim_end_matches('>').to_owned();
        let input = requests(subscriber, shutdown, method_prefix);
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

/// Runs `frame_loop` on a thread of its own; the receiver fires when it returns.
fn spawn_loop_thread(
    name: &str,
    frame_loop: FrameLoop<Client>,
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

/// The subscription as a stream of requests. When `shutdown` fires it drains the
/// subscription (unsubscribe, keep what already arrived), and ends once that is delivered.
fn requests(
    subscriber: Subscriber,
    shutdown: CancellationToken,
    method_prefix: String,
) -> impl Stream<Item = Incoming<Subject>> {
    struct State {
        subscriber: Subscriber,
        shutdown: CancellationToken,
        draining: bool,
    }
    let state = State {
        subscriber,
        shutdown,
        draining: false,
    };
    let messages = stream::unfold(state, |mut state| async move {
        loop {
            if state.draining {
                let message = state.subscriber.next().await?;
                return Some((message, state));
            }
            tokio::select! {
                message = state.subscriber.next() => return Some((message?, state)),
                () = state.shutdown.cancelled() => {
                    tracing::info!("worker draining");
                    state.draining = true;
                    if let Err(error) = state.subscriber.drain().await {
                        // The client is closed: nothing more will arrive, nor leave.
                        tracing::warn!(%error, "cannot drain the subscription");
                        return None;
                    }
                }
            }
        }
    });
    messages.map(move |message| {
        let method = method_of(&message.subject, &method_prefix);
        Incoming::new(method, message.payload, message.reply)
    })
}
