//! The bus over a direct link ([`BusOptions::attach`](crate::BusOptions::attach)): an
//! embedded broker in this process, reached by calls instead of protocol text
//! ([`nats_wire::direct`]). A publish is routed before it returns, and each message for
//! this bus comes through [`Deliver`], on the publisher's thread, straight to the
//! [`Dispatch`]: no outbound buffer, writer, reader or parser, and no task woken on the
//! way. The bus's rules hold as over bytes: subscriptions are recorded and sent again on
//! a new link, a publish is refused while none is up, and the dispatch hears of each
//! link made and lost.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};

use bytes::{Bytes, BytesMut};
use nats_wire::direct::{Link, Sink};
use net::LogLimiter;

use super::options::Attach;
use super::run::status;
use super::{Bus, BusError, Dispatch, FIRST_SID, Incoming, Reply, Sub, backoff};

static REFUSED_LOG: LogLimiter = LogLimiter::per_second();

thread_local! {
    /// The buffer a publish writes its reply subject and payload into, kept for the
    /// thread's next publish. A publish made while one is routed (a sink that publishes)
    /// finds it taken and uses a fresh one.
    static SCRATCH: Cell<BytesMut> = Cell::new(BytesMut::new());
}

/// [`Bus::publish`] over the link: routed now, or refused at once when no link is up.
pub(super) fn publish<T: Clone + Send + Sync + 'static>(
    bus: &Bus<T>,
    subject: &str,
    reply: Reply<'_>,
    len: usize,
    write: impl FnOnce(&mut BytesMut),
) -> Result<(), BusError> {
    let Some(link) = bus.link() else {
        return Err(BusError::Disconnected);
    };
    let mut buf = SCRATCH.take();
    buf.clear();
    reply.put(&mut buf);
    let at = buf.len();
    write(&mut buf);
    debug_assert_eq!(buf.len() - at, len, "the payload is the length announced");
    let (reply_subject, payload) = buf.split_at(at);
    let reply_subject = (!matches!(reply, Reply::None)).then_some(reply_subject);
    link.publish(subject.as_bytes(), reply_subject, payload);
    SCRATCH.set(buf);
    Ok(())
}

/// Subscribes `sub` as `sid` on `link`; a refusal (the broker's subscription limit) is
/// logged, as a server's `-ERR` is over bytes.
pub(super) fn subscribe<T>(link: &dyn Link, sid: u64, sub: &Sub<T>) {
    let queue = sub.queue.as_deref().map(str::as_bytes);
    if let Err(reason) = link.subscribe(sid, sub.subject.as_bytes(), queue) {
        if let Some(tally) = REFUSED_LOG.check() {
            tracing::warn!(subject = %sub.subject, reason, "the bus refused a subscription{tally}");
        }
    }
}

/// Keeps `bus` linked until [`Bus::stop`]: attaches, subscribes everything, and waits for
/// the broker to close the link (lame duck, shutdown), then attaches again after a
/// backoff while the broker refuses.
pub(super) async fn run<T: Clone + Send + Sync + 'static>(
    bus: Arc<Bus<T>>,
    dispatch: Arc<dyn Dispatch<T>>,
    attach: Attach,
) {
    let mut failed = 0u32;
    while !bus.stop.is_cancelled() {
        let sink = Arc::new(Deliver {
            bus: Arc::downgrade(&bus),
            dispatch: dispatch.clone(),
        });
        let Some(link) = attach(&bus.options.name, sink) else {
            failed += 1;
            tokio::select! {
                () = tokio::time::sleep(backoff::delay(failed)) => continue,
                () = bus.stop.cancelled() => break,
            }
        };
        failed = 0;
        let link: Arc<dyn Link> = Arc::from(link);
        take_over(&bus, &link);
        tracing::info!(name = %bus.options.name, server_id = %link.server_id(), "linked to the bus in process");
        dispatch.connected();
        let stopped = tokio::select! {
            () = bus.stop.cancelled() => true,
            () = link.closed() => false,
        };
        bus.connected.store(false, Ordering::Release);
        *bus.server_lock() = None;
        *bus.link.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if stopped {
            break;
        }
        tracing::warn!(name = %bus.options.name, "the bus closed the in-process link; linking again");
        dispatch.lost();
    }
}

/// Makes `link` the bus's: every subscription goes on it (what remains of one that ends
/// after a count), under the subscriptions' lock, so one made meanwhile is either among
/// them or made on the link after.
fn take_over<T: Clone + Send + Sync + 'static>(bus: &Bus<T>, link: &Arc<dyn Link>) {
    let subs = bus.subs_lock();
    for (sid, sub) in subs.iter() {
        subscribe(link.as_ref(), *sid, sub);
        if let Some(max) = sub.max {
            link.unsubscribe(*sid, Some(max - sub.delivered));
        }
    }
    *bus.server_lock() = Some(super::ServerInfo {
        server_id: link.server_id(),
        max_payload: link.max_payload(),
    });
    *bus.link.lock().unwrap_or_else(PoisonError::into_inner) = Some(link.clone());
    bus.connected.store(true, Ordering::Release);
}

/// What the broker calls with this bus's messages.
struct Deliver<T> {
    /// Weak: the broker holds this while the bus holds the link.
    bus: Weak<Bus<T>>,
    dispatch: Arc<dyn Dispatch<T>>,
}

impl<T: Clone + Send + Sync + 'static> Sink for Deliver<T> {
    fn deliver(
        &self,
        sid: u64,
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) {
        let Some(bus) = self.bus.upgrade() else {
            return;
        };
        let incoming = Incoming {
            subject,
            reply,
            status: headers.and_then(status),
            payload: Bytes::copy_from_slice(payload),
        };
        if sid == FIRST_SID {
            self.dispatch.deliver(&bus.first, incoming);
        } else if let Some(target) = bus.delivered(sid) {
            self.dispatch.deliver(&target, incoming);
        }
    }
}
