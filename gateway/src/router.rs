//! The gate's bus router: ONE task owns every subscription the gate holds — the reply
//! wildcard `<prefix>.gw.<gate>.>`, each group subject and each player subject — and
//! hands what arrives to the sessions' queues, so that a session sees a handler's pushes
//! before the handler's answer.
//!
//! # Why one task, and why that is not enough by itself
//!
//! A worker publishes a handler's pushes before its answer, on one connection, and the
//! broker delivers them to the gate's connection in that order. async-nats puts a
//! connection's messages, in arrival order, into one bounded channel per subscription.
//! Read by a task per subscription, those channels were drained in whatever order the
//! tasks happened to run, and a sender could get its answer before its own copy of a
//! room message.
//!
//! One task reading every channel is necessary but not sufficient: it cannot see the
//! order *between* channels. The group and player subscriptions are polled through one
//! [`SelectAll`], which polls them in the order they were woken — the order in which the
//! connection put a first message into an empty channel — but a channel that already
//! holds messages is not woken again, and `SelectAll` takes one message from each ready
//! stream in turn; and a reply may land in its channel just after the router found the
//! push channels empty and just before it looks at the replies. So the router never
//! trusts the interleaving: before dispatching a reply it *catches up*
//! ([`Router::catch_up`]), taking in the subscriptions handed over meanwhile and
//! dispatching every push and player command already buffered. The connection fills the
//! channels one message at a time, in arrival order, from one task, so everything that
//! reached the gate before the reply is in its channel once the reply is in its own:
//! none of it can be overtaken. Dispatching is a `try_send` into the session's FIFO
//! queue, which the session serves in order. (`tests/order.rs` and `gate_order` in
//! `tests/chat.rs` fail with a task per subscription, and with one task that neither
//! catches up nor polls pushes before replies.)
//!
//! # What is guaranteed
//!
//! - **Nothing that reached the gate before a reply is overtaken by it**: a group
//!   broadcast, a push to a player, a kick, received on the gate's bus connection before
//!   a reply, is in every recipient session's queue before that reply is in its own. So a
//!   handler's pushes to the session it answers (to a room the session is in, to its
//!   player) reach the client before the handler's answer, whenever the broker delivered
//!   them to the gate in publish order — which one broker (the embedded one, or a single
//!   nats-server) does for messages published on one connection, as a worker publishes a
//!   handler's pushes and answer.
//! - Messages on one subject are delivered in the broker's order.
//!
//! # What is not
//!
//! - Order between pushes on different subjects (two rooms; a room and a player): they
//!   are dispatched in the order they became ready, which is arrival order while the
//!   router keeps up and may not be once messages queue on several subjects.
//! - A push that arrived just after a reply may be delivered before it: catching up takes
//!   everything buffered, and cannot tell what came after the reply.
//! - Only an order the broker delivers can be kept. Across a nats-server cluster the
//!   guarantee rests on the cluster delivering one publisher's messages to one
//!   subscriber in order (nats-server promises per-publisher order; the route between
//!   the worker's and the gate's servers carries them in order); a reconnect of the
//!   worker or of the gate to another server voids it for what was in flight, and
//!   messages lost around a reconnect stay lost (core NATS is at most once). Pushes
//!   published on another connection than the answer (another worker, a `Pusher` with
//!   a client of its own) are concurrent with the answer and may come either side of it.
//! - A push a session's queue has no room for is dropped and counted
//!   (`gate_push_dropped_total`), as ever.
//! - The price: while pushes arrive faster than the gate dispatches them, a reply waits
//!   behind them (and may time out, 408) rather than overtake them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use async_nats::{Message, Subscriber};
use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::gate::GateShared;

/// Subscriptions handed to the router and not yet taken in. A join or bind waits for
/// room, so a burst of them slows those requests down rather than grow a queue.
pub(crate) const HANDOVER_QUEUE: usize = 256;

/// Messages the router dispatches between yields to the runtime. The router opts out of
/// tokio's cooperative budget (see [`run`]), so it yields on its own; 128 is tokio's own
/// budget per task poll.
const BUDGET: u32 = 128;

/// What a group or player subscription's messages are addressed to.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// `<prefix>.grp.<g>`: broadcasts to the group's local members.
    Group(Arc<str>),
    /// `<prefix>.user.<u>`: commands for the session bound to the player here.
    User(Arc<str>),
}

/// A subscription for the router to own until `stop` is cancelled.
pub(crate) struct Handover {
    target: Target,
    sub: Subscriber,
    stop: CancellationToken,
}

/// The router has stopped: the gate has shut down.
#[derive(Debug, thiserror::Error)]
#[error("the gate has stopped routing")]
pub(crate) struct Stopped;

impl GateShared {
    /// Hands a subscription the caller made to the router, which delivers its messages
    /// until `stop` is cancelled and then drops (unsubscribes) it. Returns once the
    /// router has it queued: anything causally after this call — a join's answer, the
    /// client's next request, a worker's reply to that — finds it taken in.
    pub(crate) async fn hand_over(
        &self,
        target: Target,
        sub: Subscriber,
        stop: CancellationToken,
    ) -> Result<(), Stopped> {
        let handover = Handover { target, sub, stop };
        self.handovers.send(handover).await.map_err(|_| Stopped)
    }
}

/// The router's task: routes until the gate has shut down (`gate.stopped`), then drops
/// every subscription.
///
/// It runs outside tokio's cooperative budget: with the budget spent, a channel answers
/// "not now" exactly as an empty one does, and catching up must tell the two apart. It
/// yields every [`BUDGET`] messages instead.
pub(crate) fn run(
    gate: Arc<GateShared>,
    replies: Subscriber,
    handovers: mpsc::Receiver<Handover>,
) -> impl Future<Output = ()> + Send + 'static {
    let woken = Arc::new(Woken::default());
    let router = Router {
        gate,
        replies,
        handovers,
        subs: SelectAll::new(),
        members: Vec::new(),
        waker: Waker::from(woken.clone()),
        woken,
        budget: BUDGET,
    };
    tokio::task::unconstrained(router.serve())
}

struct Router {
    gate: Arc<GateShared>,
    replies: Subscriber,
    handovers: mpsc::Receiver<Handover>,
    /// Every group and player subscription, each ending when its `stop` is cancelled.
    subs: SelectAll<BoxStream<'static, (Target, Message)>>,
    /// Scratch space for a group's members, reused for every broadcast.
    members: Vec<u64>,
    /// Polls `subs` while catching up, recording whether `subs` asked to be polled again.
    waker: Waker,
    woken: Arc<Woken>,
    budget: u32,
}

/// A waker that only records that it was woken.
#[derive(Default)]
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Router {
    async fn serve(mut self) {
        let stopped = self.gate.stopped.clone();
        // Registered once, not once per turn (see the session's loop).
        let stop = stopped.cancelled();
        tokio::pin!(stop);
        loop {
            // Biased: a handover, then pushes, before a reply: the reply would wait for
            // them in `catch_up` anyway, and this way they cost no extra poll.
            tokio::select! {
                biased;
                () = &mut stop => break,
                Some(handover) = self.handovers.recv() => self.adopt(handover),
                Some((target, msg)) = self.subs.next() => self.dispatch(target, msg),
                reply = self.replies.next() => {
                    let Some(reply) = reply else {
                        tracing::warn!(gate = %self.gate.id, "reply subscription ended: the gate answers nothing more");
                        break;
                    };
                    self.catch_up().await;
                    self.gate.route_reply(reply);
                }
            }
            self.spend().await;
        }
        // Dropping the router drops every subscriber, and each unsubscribes.
    }

    /// Delivers `sub` until its `stop` is cancelled (the group emptied here, the player
    /// unbound); the stream then ends and `SelectAll` drops it. A handover whose `stop`
    /// is already cancelled ends at once.
    fn adopt(&mut self, Handover { target, sub, stop }: Handover) {
        let stream = sub
            .take_until(stop.cancelled_owned())
            .map(move |msg| (target.clone(), msg))
            .boxed();
        self.subs.push(stream);
    }

    fn dispatch(&mut self, target: Target, msg: Message) {
        match target {
            Target::Group(group) => self.gate.deliver_to_group(&group, msg, &mut self.members),
            Target::User(uid) => self.gate.deliver_to_user(&uid, msg),
        }
    }

    /// Dispatches every push already buffered, so that none that reached the gate before
    /// the reply in hand is overtaken by it.
    async fn catch_up(&mut self) {
        // A subscription handed over before the reply was published (a join answered
        // before the request this reply answers) is queued by now: its messages count.
        while let Ok(handover) = self.handovers.try_recv() {
            self.adopt(handover);
        }
        loop {
            self.woken.0.store(false, Ordering::Relaxed);
            let polled = self
                .subs
                .poll_next_unpin(&mut Context::from_waker(&self.waker));
            match polled {
                Poll::Ready(Some((target, msg))) => self.dispatch(target, msg),
                // Pending with a wake-up: `SelectAll` stopped early (it had polled each
                // stream once, or caught its queue mid-update) or a stream woke while
                // being polled; either way there may be more.
                Poll::Pending if self.woken.0.load(Ordering::Relaxed) => {}
                // Every stream was found empty. (The next `select!` polls `subs` with the
                // task's own waker again before the task sleeps.)
                Poll::Pending | Poll::Ready(None) => return,
            }
            self.spend().await;
        }
    }

    /// Yields to the runtime every [`BUDGET`] steps. A yield loses no order: `SelectAll`
    /// keeps its streams' wake-ups.
    async fn spend(&mut self) {
        self.budget -= 1;
        if self.budget == 0 {
            self.budget = BUDGET;
            tokio::task::yield_now().await;
        }
    }
}
