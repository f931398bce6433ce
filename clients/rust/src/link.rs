//! One open connection to a gate: the writing half, which the connection task owns, and
//! a reader task of its own. The reader routes what the gate sends (responses to their
//! waiters, pushes to the push queue) and reports the rest to the connection task: a
//! drain, and how the connection ended. During a move two links are open at once, the
//! new one and the one retiring; both readers feed the same table and push queue.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use proto::client::{Push, packet::Kind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tracing::{Instrument, warn};

use super::connection::{Dialed, Ws};
use super::frame::{self, Incoming};
use super::shared::Shared;

/// How long a closing link waits for its close frame to go out.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How one connection ended.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The client closed (or every handle was dropped).
    Closed,
    /// The gate kicked this session; the reason is the kick's.
    Kicked(String),
    /// The socket broke or the gate closed it.
    Lost(String),
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
}

pub(crate) struct Link {
    pub(crate) epoch: u64,
    pub(crate) url_index: usize,
    /// The gate's heartbeat interval (0: none asked).
    pub(crate) heartbeat_ms: u32,
    /// The gate sent a drain on this link.
    pub(crate) drained: bool,
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
    /// Starts the reader of a handshaken connection; the link writes under `epoch`.
    pub(crate) fn start(dialed: Dialed, epoch: u64, routes: Routes) -> Link {
        let (sink, stream) = dialed.ws.split();
        let reader = tokio::spawn(read_loop(stream, epoch, routes).in_current_span());
        Link {
            epoch,
            url_index: dialed.url_index,
            heartbeat_ms: dialed.ack.heartbeat_ms,
            drained: false,
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

    /// Tells the gate we are going (it may already be gone, which is fine), then stops
    /// the reader.
    pub(crate) async fn close(mut self) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.sink.close()).await;
    }
}

/// Reads frames until the connection ends: responses to their waiters, pushes to the
/// push queue, a drain and the end to the connection task. Each link sends at most two
/// events (its gate's first drain, and its end), which is what bounds the task's event
/// channel: a gate repeating its drain is told nothing new.
async fn read_loop(mut stream: SplitStream<Ws>, epoch: u64, routes: Routes) {
    let mut drain_told = false;
    let exit = loop {
        let message = match stream.next().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => break Exit::Lost(format!("read failed: {e}")),
            None => break Exit::Lost("the gate closed the connection".to_owned()),
        };
        let packet = match frame::incoming(message) {
            Ok(Incoming::Packet(packet)) => packet,
            Ok(Incoming::Close(reason)) => {
                break Exit::Lost(format!("the gate closed the connection: {reason}"));
            }
            Ok(Incoming::Control) => continue,
            // A gate that sends garbage cannot be trusted with the rest of the stream.
            Err(e) => break Exit::Lost(format!("protocol error: {e}")),
        };
        match packet.kind {
            Some(Kind::Response(response)) => routes.shared.complete(response),
            Some(Kind::Push(push)) => match routes.pushes.try_send(push) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    if routes.shared.push_dropped() {
                        warn!("push queue full: dropping pushes (see Client::pushes_dropped)");
                    }
                }
            },
            Some(Kind::Kick(kick)) => break Exit::Kicked(kick.reason),
            Some(Kind::Drain(drain)) if !std::mem::replace(&mut drain_told, true) => {
                let _ = routes.events.send((
                    epoch,
                    Event::Drain {
                        reason: drain.reason,
                    },
                ));
            }
            // Heartbeats need no answer; anything else is not for a client: ignore.
            _ => {}
        }
    };
    let _ = routes.events.send((epoch, Event::End(exit)));
}
