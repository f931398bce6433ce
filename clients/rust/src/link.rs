//! One open connection to a gate: the writing half, which the connection task owns, and
//! a reader task of its own. The reader routes what the gate sends (responses to their
//! waiters, pushes to the push queue) and reports the rest to the connection task: a
//! drain, and how the connection ended. During a move two links are open at once, the
//! new one and the one retiring; both readers feed the same table and push queue.
//!
//! Each link belongs to one gate session's [`Sequence`]: its reader drops the repeats a
//! resume brings and counts the rest towards the next ack, which the connection task
//! writes ([`Link::write_control`]) when the reader says one is due.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use proto::client::{Push, packet::Kind};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tracing::{Instrument, warn};

use super::connection::{Dialed, Ws};
use super::frame::{self, Incoming};
use super::resume::{Accepted, Resume, Sequence};
use super::shared::Shared;

/// How long a closing link waits for its close frame to go out.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The gate's close reason for a socket whose session was resumed on another
/// connection.
pub(crate) const RESUMED_ELSEWHERE: &str = "resumed elsewhere";

/// How one connection ended.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The client closed (or every handle was dropped).
    Closed,
    /// The gate kicked this session; the reason is the kick's.
    Kicked(String),
    /// The socket broke or the gate closed it.
    Lost(String),
    /// The gate sent what the protocol does not allow (a frame that does not decode,
    /// or too large): the connection is over as if lost, but its session is not to be
    /// resumed, as the replay would bring the same frame again.
    Broken(String),
}

/// What a link's reader tells the connection task.
#[derive(Debug)]
pub(crate) enum Event {
    /// The gate is draining: move to another gate.
    Drain { reason: String },
    /// The reader stopped: the connection is over.
    End(Exit),
}

/// An [`Event`] and the epoch of the link it is about.
pub(crate) type LinkEvent = (u64, Event);

/// What every reader shares: where responses and pushes go, where events go.
#[derive(Clone)]
pub(crate) struct Routes {
    pub(crate) shared: Arc<Shared>,
    pub(crate) pushes: mpsc::Sender<Push>,
    pub(crate) events: mpsc::UnboundedSender<LinkEvent>,
    /// Woken when a link's session has [`super::resume::ACK_EVERY`] frames to ack: the
    /// task checks every link. A `Notify` keeps one wake-up however many are due, so
    /// it needs no bound.
    pub(crate) acks: Arc<Notify>,
}

pub(crate) struct Link {
    pub(crate) epoch: u64,
    pub(crate) url_index: usize,
    /// The gate's heartbeat interval (0: none asked).
    pub(crate) heartbeat_ms: u32,
    /// The gate sent a drain on this link.
    pub(crate) drained: bool,
    /// The token to resume this link's session with; empty when it cannot be resumed.
    pub(crate) resume_token: String,
    sequence: Arc<Sequence>,
    /// Frames fed since the last flush.
    dirty: bool,
    sink: SplitSink<Ws, Message>,
    reader: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Link {
    /// Starts the reader of a handshaken connection to the session of `sequence`; the
    /// link writes under `epoch`.
    pub(crate) fn start(
        dialed: Dialed,
        epoch: u64,
        routes: Routes,
        sequence: Arc<Sequence>,
    ) -> Link {
        let (sink, stream) = dialed.ws.split();
        let silence = silence_limit(dialed.ack.heartbeat_ms);
        let reader = tokio::spawn(
            read_loop(stream, epoch, routes, sequence.clone(), silence).in_current_span(),
        );
        Link {
            epoch,
            url_index: dialed.url_index,
            heartbeat_ms: dialed.ack.heartbeat_ms,
            drained: false,
            resume_token: dialed.ack.resume_token,
            sequence,
            dirty: false,
            sink,
            reader,
        }
    }

    /// Puts a frame into the socket's buffer; [`Link::flush`] sends it.
    pub(crate) async fn feed(&mut self, json: bool, frame: Bytes) -> Result<(), String> {
        self.dirty = true;
        self.sink
            .feed(frame::message(json, frame))
            .await
            .map_err(|e| format!("write failed: {e}"))
    }

    /// Flushes what was fed, if anything.
    pub(crate) async fn flush(&mut self) -> Result<(), String> {
        if !std::mem::take(&mut self.dirty) {
            return Ok(());
        }
        self.sink
            .flush()
            .await
            .map_err(|e| format!("write failed: {e}"))
    }

    /// What resuming this link's session takes, if the gate keeps it for resuming.
    pub(crate) fn resume(&self) -> Option<Resume> {
        (!self.resume_token.is_empty()).then(|| Resume {
            token: self.resume_token.clone(),
            sequence: self.sequence.clone(),
        })
    }

    /// Writes a heartbeat when `heartbeat`, then, for a resumable session, an ack: with
    /// every heartbeat, or once enough frames wait for one. Flushes.
    pub(crate) async fn write_control(
        &mut self,
        json: bool,
        heartbeat: bool,
    ) -> Result<(), String> {
        if heartbeat {
            self.feed(json, frame::heartbeat(json)).await?;
        }
        if !self.resume_token.is_empty() && (heartbeat || self.sequence.ack_due()) {
            let seq = self.sequence.take_ack();
            self.feed(json, frame::ack(json, seq)).await?;
        }
        self.flush().await
    }

    /// Writes frames, then flushes: a resumed session's unanswered requests, sent
    /// again before anything queued since.
    pub(crate) async fn write_all(&mut self, json: bool, frames: Vec<Bytes>) -> Result<(), String> {
        for frame in frames {
            self.feed(json, frame).await?;
        }
        self.flush().await
    }

    /// Tells the gate we are going (it may already be gone, which is fine), then stops
    /// the reader.
    pub(crate) async fn close(mut self) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.sink.close()).await;
    }
}

/// How long a link may hear nothing from its gate before it counts the gate gone: two
/// of the gate's heartbeat intervals (the gate answers the heartbeat the connection task
/// sends every interval, so a live gate is never silent that long; docs/protocol.md,
/// "Heartbeat"). `None` when the gate asked for no heartbeats.
fn silence_limit(heartbeat_ms: u32) -> Option<Duration> {
    (heartbeat_ms > 0).then(|| Duration::from_millis(2 * u64::from(heartbeat_ms)))
}

/// Resolves once nothing was heard for `limit` since `heard` (pending for ever with no
/// limit). One timer for the link, moved on only when it fires, so a frame costs a
/// clock read and no timer.
async fn silent_for(limit: Option<Duration>, heard: &Instant, timer: &mut Pin<Box<Sleep>>) {
    let Some(limit) = limit else {
        return std::future::pending().await;
    };
    loop {
        timer.as_mut().await;
        let due = *heard + limit;
        if Instant::now() >= due {
            return;
        }
        timer.as_mut().reset(due);
    }
}

/// Reads frames until the connection ends: responses to their waiters, pushes to the
/// push queue (each unless it is a repeat), a drain and the end to the connection task.
/// Each link sends at most two events (its gate's first drain, and its end), which is
/// what bounds the task's event channel: a gate repeating its drain is told nothing new.
/// A gate silent for `silence` is gone: the link ends as lost (and its session is
/// resumed elsewhere, if it can be).
async fn read_loop(
    mut stream: SplitStream<Ws>,
    epoch: u64,
    routes: Routes,
    sequence: Arc<Sequence>,
    silence: Option<Duration>,
) {
    let mut drain_told = false;
    let mut heard = Instant::now();
    let mut timer = Box::pin(tokio::time::sleep(silence.unwrap_or_default()));
    let exit = loop {
        let next = tokio::select! {
            next = stream.next() => next,
            () = silent_for(silence, &heard, &mut timer) => {
                let ms = silence.unwrap_or_default().as_millis();
                break Exit::Lost(format!("no frame from the gate in {ms} ms"));
            }
        };
        heard = Instant::now();
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => break read_failed(e),
            None => break Exit::Lost("the gate closed the connection".to_owned()),
        };
        let packet = match frame::incoming(message) {
            Ok(Incoming::Packet(packet)) => packet,
            // The session was taken up on another connection (not this client's: its
            // old link would be gone): it lives there now, and is not this client's to
            // resume or replace (docs/protocol.md, "Kicks and closes").
            Ok(Incoming::Close(reason)) if reason == RESUMED_ELSEWHERE => {
                break Exit::Kicked(reason);
            }
            Ok(Incoming::Close(reason)) => {
                break Exit::Lost(format!("the gate closed the connection: {reason}"));
            }
            Ok(Incoming::Control) => continue,
            // A gate that sends garbage cannot be trusted with the rest of the stream.
            Err(e) => break Exit::Broken(format!("protocol error: {e}")),
        };
        match packet.kind {
            // `fresh` counts what it lets through: a frame that fails it is a repeat.
            Some(Kind::Response(response)) if routes.fresh(&sequence, response.seq) => {
                routes.shared.complete(response);
            }
            Some(Kind::Push(push)) if routes.fresh(&sequence, push.seq) => routes.push(push),
            Some(Kind::Kick(kick)) => break Exit::Kicked(kick.reason),
            Some(Kind::Drain(drain)) if !std::mem::replace(&mut drain_told, true) => {
                let _ = routes.events.send((
                    epoch,
                    Event::Drain {
                        reason: drain.reason,
                    },
                ));
            }
            // Repeats are dropped, heartbeats need no answer; anything else is not for a
            // client: ignore.
            _ => {}
        }
    };
    let _ = routes.events.send((epoch, Event::End(exit)));
}

/// A read error as an exit: a frame the limits or UTF-8 refuse broke the protocol; the
/// rest (a reset, I/O) is the link failing.
fn read_failed(e: WsError) -> Exit {
    let reason = format!("read failed: {e}");
    match e {
        WsError::Capacity(_) | WsError::Utf8(_) => Exit::Broken(reason),
        _ => Exit::Lost(reason),
    }
}

impl Routes {
    /// Whether a push or response numbered `seq` is to be handled (not a repeat);
    /// wakes the task when it completes a batch to acknowledge.
    fn fresh(&self, sequence: &Sequence, seq: u64) -> bool {
        match sequence.accept(seq) {
            Accepted::Repeat => false,
            Accepted::Handle { ack_due } => {
                if ack_due {
                    self.acks.notify_one();
                }
                true
            }
        }
    }

    /// Queues a push for the caller; when the queue is full, drops and counts it
    /// rather than stalling the responses behind it.
    fn push(&self, push: Push) {
        match self.pushes.try_send(push) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                if self.shared.push_dropped() {
                    warn!("push queue full: dropping pushes (see Client::pushes_dropped)");
                }
            }
        }
    }
}
