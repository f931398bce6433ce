//! The intake half of the frame loop: the bounded queue, and what becomes of a request
//! offered to it (queued, or answered 503 at once).

use futures::{Stream, StreamExt};
use proto::code;
use proto::rpc::RpcResponse;
use tokio::sync::mpsc;

use super::{Incoming, InputKind, ReplySink};
use crate::metrics::IntakeMetrics;
use crate::service::error_response;

/// The loop's end of the bounded queue, made by [`queue`].
#[derive(Debug)]
pub struct Queue<R>(pub(super) mpsc::Receiver<Incoming<R>>);

/// Makes the bounded queue between an [`Intake`] and a [`FrameLoop`]: `capacity`
/// requests (at least 1) before the intake rejects.
pub fn queue<O: ReplySink>(service: &str, capacity: usize, output: O) -> (Intake<O>, Queue<O::To>) {
    let capacity = capacity.max(1);
    let (tx, rx) = mpsc::channel(capacity);
    let intake = Intake {
        tx,
        output,
        overloaded: error_response(
            code::UNAVAILABLE,
            format!("service {service:?} is overloaded: its queue of {capacity} is full"),
        ),
        closed: error_response(
            code::UNAVAILABLE,
            format!("service {service:?} is shutting down"),
        ),
        metrics: IntakeMetrics::new(service),
    };
    (intake, Queue(rx))
}

/// What became of an offered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued for a frame.
    Queued,
    /// The queue was full: answered 503 (a notify is dropped and counted).
    Rejected,
    /// The loop has stopped: answered 503; stop offering.
    Closed,
}

/// The receiving half: queues requests for the loop, or rejects them when it is full.
/// Dropping it tells the loop no more requests will come; the loop then finishes the
/// queue and returns.
pub struct Intake<O: ReplySink> {
    tx: mpsc::Sender<Incoming<O::To>>,
    output: O,
    overloaded: RpcResponse,
    closed: RpcResponse,
    metrics: IntakeMetrics,
}

impl<O: ReplySink> Intake<O> {
    /// Queues a request without waiting; if the queue is full, answers 503 at once. An
    /// event or snapshot waits for room instead (see the module docs).
    pub async fn offer(&self, incoming: Incoming<O::To>) -> Offer {
        if incoming.kind != InputKind::Request {
            return match self.tx.send(incoming).await {
                Ok(()) => Offer::Queued,
                Err(_) => Offer::Closed,
            };
        }
        match self.tx.try_send(incoming) {
            Ok(()) => {
                let depth = self.tx.max_capacity() - self.tx.capacity();
                self.metrics.depth.set(depth as f64);
                if depth >= self.tx.max_capacity().div_ceil(2) {
                    // The loop runs on this thread between the intake's turns: a burst
                    // read at once lets it take a frame at half a queue, rather than
                    // answering the rest 503 while it never had a turn.
                    tokio::task::yield_now().await;
                }
                Offer::Queued
            }
            Err(mpsc::error::TrySendError::Full(incoming)) => {
                self.metrics.rejected.increment(1);
                self.metrics.overloaded.increment(1);
                if let Some(to) = incoming.reply {
                    self.output.send(to, self.overloaded.clone()).await;
                }
                Offer::Rejected
            }
            Err(mpsc::error::TrySendError::Closed(incoming)) => {
                if let Some(to) = incoming.reply {
                    self.output.send(to, self.closed.clone()).await;
                }
                Offer::Closed
            }
        }
    }

    /// Offers everything `input` yields until it ends (or the loop stops), then drops the
    /// intake, which lets the loop finish.
    pub async fn feed<S>(self, input: S)
    where
        S: Stream<Item = Incoming<O::To>>,
    {
        let mut input = std::pin::pin!(input);
        while let Some(incoming) = input.next().await {
            if self.offer(incoming).await == Offer::Closed {
                break;
            }
        }
    }
}
