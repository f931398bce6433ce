//! What the gate's bus reader hands a session, and the bounded queue it goes through.
//! The reader never waits on a session: a queue that is full closes its session as too
//! slow (the player then knows to resynchronise) instead of thinning what it receives.

use std::sync::Arc;

use proto::resume::{Handed, TakeOver};
use proto::rpc::RpcResponse;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::codec::PushFrame;

/// What the bus reader hands a session.
#[derive(Debug)]
pub(crate) enum ToSession {
    /// The gate's bus connection was lost: requests in flight will get no reply.
    BusLost,
    /// The gate's bus connection is up again: held requests can go out.
    BusBack,
    /// A worker answered request `id`.
    Reply { id: u64, reply: WorkerReply },
    /// A push to the player or to a group it joined.
    Push(Arc<PushFrame>),
    /// Close the session with this reason.
    Kick(String),
    /// A gate asks for this session, its client having resumed there: answer on `reply`.
    TakeOver { request: TakeOver, reply: String },
    /// One of this session's subjects brought the hand-over mark of the gate taking it.
    Marked,
    /// This (resumed) session's old gate handed over what it held.
    Handed(Box<Handed>),
}

#[derive(Debug)]
pub(crate) enum WorkerReply {
    Response(RpcResponse),
    /// The bus found no worker for the route.
    NoResponders,
    /// The worker's answer did not decode.
    Invalid,
}

/// The gate's end of one session's queue.
#[derive(Debug)]
pub(crate) struct SessionTx {
    tx: mpsc::Sender<ToSession>,
    /// Cancelled when the queue was found full: the session closes as too slow.
    overflowed: CancellationToken,
}

/// The session's end of its queue.
pub(crate) struct Inbox {
    pub rx: mpsc::Receiver<ToSession>,
    overflowed: CancellationToken,
}

/// A session's queue of `capacity` messages (at least 1).
pub(crate) fn channel(capacity: usize) -> (SessionTx, Inbox) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let overflowed = CancellationToken::new();
    (
        SessionTx {
            tx,
            overflowed: overflowed.clone(),
        },
        Inbox { rx, overflowed },
    )
}

/// Why a message did not reach its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The session has ended (or never was).
    Gone,
    /// Its queue was full: the message is dropped and the session closes as too slow.
    Full,
}

impl SessionTx {
    /// Queues `msg` if there is room, and nothing else: what a peer asks of a session
    /// (another gate's hand-over request) must not close it by filling its queue.
    pub(crate) fn offer_if_room(&self, msg: ToSession) -> Result<(), Refused> {
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(Refused::Full),
            Err(TrySendError::Closed(_)) => Err(Refused::Gone),
        }
    }

    /// Queues `msg` without waiting. A full queue drops it (the caller counts it) and
    /// tells the session to close as too slow, so nothing is ever dropped from a
    /// session that stays open.
    pub(crate) fn offer(&self, msg: ToSession) -> Result<(), Refused> {
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.overflowed.cancel();
                Err(Refused::Full)
            }
            Err(TrySendError::Closed(_)) => Err(Refused::Gone),
        }
    }
}

impl Inbox {
    /// Completes once the queue overflowed; made once per session (a fresh future each
    /// turn would lock the token's waiter list each time).
    pub(crate) fn overflowed(&self) -> WaitForCancellationFutureOwned {
        self.overflowed.clone().cancelled_owned()
    }

    /// Pushes still queued, for the drop counter when the session closes.
    pub(crate) fn queued_pushes(&mut self) -> usize {
        let mut pushes = 0;
        while let Ok(msg) = self.rx.try_recv() {
            pushes += usize::from(matches!(msg, ToSession::Push(_)));
        }
        pushes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    #[test]
    fn a_full_queue_tells_its_session_to_close() {
        let (tx, mut inbox) = channel(2);
        let overflowed = inbox.overflowed();
        tokio::pin!(overflowed);
        assert_eq!(tx.offer(ToSession::BusLost), Ok(()));
        assert_eq!(tx.offer(ToSession::Kick("a".into())), Ok(()));
        assert!(overflowed.as_mut().now_or_never().is_none());
        // The third does not fit: dropped, and the session is told.
        assert_eq!(tx.offer(ToSession::BusLost), Err(Refused::Full));
        assert!(overflowed.now_or_never().is_some());
        assert_eq!(inbox.queued_pushes(), 0);
        drop(inbox);
        assert_eq!(tx.offer(ToSession::BusLost), Err(Refused::Gone));
    }

    #[test]
    fn an_offer_if_room_never_tells_a_full_queue_to_close() {
        let (tx, inbox) = channel(1);
        let overflowed = inbox.overflowed();
        tokio::pin!(overflowed);
        assert_eq!(tx.offer_if_room(ToSession::Marked), Ok(()));
        assert_eq!(tx.offer_if_room(ToSession::Marked), Err(Refused::Full));
        assert!(overflowed.now_or_never().is_none());
        drop(inbox);
        assert_eq!(tx.offer_if_room(ToSession::Marked), Err(Refused::Gone));
    }
}
