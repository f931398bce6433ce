//! What the gate's bus reader hands a session, and the bounded queue it goes through.
//! The reader never waits on a session: a queue that is full closes its session as too
//! slow (the player then knows to resynchronise) instead of thinning what it receives.
//!
//! The queue is a locked `VecDeque` with one sender and one receiver, not a tokio
//! `mpsc` channel: that one allocates, with each queue, a block of 32 slots and
//! cache-padded ends (about 1.7 KB), which an idle session paid for all its life. This
//! one holds room only while messages wait, and gives it back once they are taken
//! (docs/gateway.md, "Memory per session"). The lock is held to push or pop one
//! message, by the bus reader and the session only.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use proto::resume::{Handed, TakeOver};
use proto::rpc::RpcResponse;

use crate::codec::PushFrame;

/// What the bus reader hands a session. Small (the large messages are boxed): a
/// session's queue allocates its first block of 32 slots when it is made, so an idle
/// session pays for 32 of these whether they come or not.
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
    TakeOver {
        request: Box<TakeOver>,
        reply: Box<str>,
    },
    /// One of this session's subjects brought the hand-over mark of the gate taking it.
    Marked,
    /// This (resumed) session's old gate handed over what it held.
    Handed(Box<Handed>),
    /// The queue was found full and a message dropped: the session closes as too slow.
    /// Made by the queue itself, and taken before anything still waiting.
    Overflowed,
}

#[derive(Debug)]
pub(crate) enum WorkerReply {
    Response(Box<RpcResponse>),
    /// The bus found no worker for the route.
    NoResponders,
    /// The worker's answer did not decode.
    Invalid,
}

/// The gate's end of one session's queue (there is one: it is not `Clone`).
#[derive(Debug)]
pub(crate) struct SessionTx {
    queue: Arc<Shared>,
}

/// The session's end of its queue.
pub(crate) struct Inbox {
    pub rx: Receiver,
}

/// Takes what the session's queue holds.
pub(crate) struct Receiver(Arc<Shared>);

/// Nothing waits in the queue now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Empty;

#[derive(Debug)]
struct Shared {
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    messages: VecDeque<ToSession>,
    /// The session waiting for a message.
    waker: Option<Waker>,
    /// The session's end is gone: nothing more is taken.
    receiver_gone: bool,
    /// The gate's end is gone: nothing more comes.
    sender_gone: bool,
    /// A message was dropped, the queue being full; told once ([`ToSession::Overflowed`]).
    overflowed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held left a queue that is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A session's queue of `capacity` messages (at least 1).
pub(crate) fn channel(capacity: usize) -> (SessionTx, Inbox) {
    let queue = Arc::new(Shared {
        capacity: capacity.max(1),
        state: Mutex::default(),
    });
    (
        SessionTx {
            queue: queue.clone(),
        },
        Inbox {
            rx: Receiver(queue),
        },
    )
}

impl Receiver {
    /// The next message, once there is one; `None` once the queue is empty and its
    /// sender gone.
    pub(crate) async fn recv(&mut self) -> Option<ToSession> {
        poll_fn(|cx| {
            let mut state = self.0.lock();
            if let Some(msg) = take(&mut state) {
                return Poll::Ready(Some(msg));
            }
            if state.sender_gone {
                return Poll::Ready(None);
            }
            if !state
                .waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                state.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// The next message if one waits.
    pub(crate) fn try_recv(&mut self) -> Result<ToSession, Empty> {
        take(&mut self.0.lock()).ok_or(Empty)
    }
}

/// The oldest message (after an overflow, first of all that); the queue's room is given
/// back once it is empty, so a quiet session holds none.
fn take(state: &mut State) -> Option<ToSession> {
    if std::mem::take(&mut state.overflowed) {
        return Some(ToSession::Overflowed);
    }
    let msg = state.messages.pop_front()?;
    if state.messages.is_empty() {
        state.messages = VecDeque::new();
    }
    Some(msg)
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.receiver_gone = true;
        state.messages = VecDeque::new();
    }
}

impl Drop for SessionTx {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.queue.lock();
            state.sender_gone = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
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
        self.push(msg, false)
    }

    /// Queues `msg` without waiting. A full queue drops it (the caller counts it) and
    /// tells the session to close as too slow, so nothing is ever dropped from a
    /// session that stays open.
    pub(crate) fn offer(&self, msg: ToSession) -> Result<(), Refused> {
        self.push(msg, true)
    }

    /// Queues `msg` if there is room; when there is none and `tell`, the session is
    /// told it overflowed.
    fn push(&self, msg: ToSession, tell: bool) -> Result<(), Refused> {
        let (pushed, waker) = {
            let mut state = self.queue.lock();
            if state.receiver_gone {
                return Err(Refused::Gone);
            }
            let pushed = if state.messages.len() < self.queue.capacity {
                state.messages.push_back(msg);
                Ok(())
            } else if tell {
                state.overflowed = true;
                Err(Refused::Full)
            } else {
                return Err(Refused::Full);
            };
            (pushed, state.waker.take())
        };
        // Woken outside the lock: the session takes it as soon as it runs.
        if let Some(waker) = waker {
            waker.wake();
        }
        pushed
    }
}

impl Inbox {
    /// Room the queue holds now (0 while nothing waits).
    #[cfg(test)]
    pub(crate) fn room(&self) -> usize {
        self.rx.0.lock().messages.capacity()
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

    #[tokio::test]
    async fn a_full_queue_tells_its_session_to_close_before_anything_else() {
        let (tx, mut inbox) = channel(2);
        assert_eq!(tx.offer(ToSession::BusLost), Ok(()));
        assert_eq!(tx.offer(ToSession::Kick("a".into())), Ok(()));
        // The third does not fit: dropped, and the session is told, first, once.
        assert_eq!(tx.offer(ToSession::BusLost), Err(Refused::Full));
        assert!(matches!(inbox.rx.recv().await, Some(ToSession::Overflowed)));
        assert!(matches!(inbox.rx.try_recv(), Ok(ToSession::BusLost)));
        assert_eq!(inbox.queued_pushes(), 0);
        drop(inbox);
        assert_eq!(tx.offer(ToSession::BusLost), Err(Refused::Gone));
    }

    #[test]
    fn an_offer_if_room_never_tells_a_full_queue_to_close() {
        let (tx, mut inbox) = channel(1);
        assert_eq!(tx.offer_if_room(ToSession::Marked), Ok(()));
        assert_eq!(tx.offer_if_room(ToSession::Marked), Err(Refused::Full));
        assert!(matches!(inbox.rx.try_recv(), Ok(ToSession::Marked)));
        assert!(inbox.rx.try_recv().is_err(), "no overflow told");
        drop(inbox);
        assert_eq!(tx.offer_if_room(ToSession::Marked), Err(Refused::Gone));
    }

    #[tokio::test]
    async fn messages_come_in_order_and_a_drained_queue_holds_no_room() {
        let (tx, mut inbox) = channel(8);
        assert_eq!(inbox.room(), 0, "a new queue holds nothing");
        let waiting = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(msg) = inbox.rx.recv().await {
                let ToSession::Kick(reason) = msg else {
                    panic!("not a kick: {msg:?}");
                };
                got.push(reason);
                if got.len() == 3 {
                    assert_eq!(inbox.room(), 0, "taken: the room is given back");
                }
            }
            got
        });
        for reason in ["a", "b", "c"] {
            assert_eq!(tx.offer(ToSession::Kick(reason.into())), Ok(()));
        }
        // The gate's end gone: what was queued is still taken, then the end.
        drop(tx);
        assert_eq!(waiting.await.unwrap(), ["a", "b", "c"]);
    }
}
