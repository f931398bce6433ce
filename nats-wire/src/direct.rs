//! The protocol's operations as calls, for a client and a server in one process.
//!
//! An embedded broker and the connections of its own process (`shaddock up`'s gate and
//! workers) need no text between them: a publish is a call that routes the message at
//! once, and a delivery is a call into the subscriber's [`Sink`], on the publisher's
//! thread. No bytes are written, parsed, buffered or woken for; the semantics are
//! the protocol's (subjects, queue groups, sids, auto-unsubscribe, "no responders").
//!
//! The server hands a client a [`Link`]; the client gives the server its [`Sink`].
//! Calls go both ways and may nest (a sink that publishes while it is delivered to), so
//! neither side may hold a lock of its own across a call into the other.

use std::future::Future;
use std::pin::Pin;

/// A client's side of a direct connection, as its server hands it out.
pub trait Link: Send + Sync + 'static {
    /// Routes one message now: every matching subscription's [`Sink`] is called before
    /// this returns, including this client's own (echo is on).
    fn publish(&self, subject: &[u8], reply: Option<&[u8]>, payload: &[u8]);
    /// Subscribes `subject` as `sid`, in `queue` if given; `Err` with the server's
    /// reason (an invalid subject, the subscription limit).
    fn subscribe(&self, sid: u64, subject: &[u8], queue: Option<&[u8]>)
    -> Result<(), &'static str>;
    /// Ends subscription `sid` now, or once `max` messages in all were delivered on it.
    fn unsubscribe(&self, sid: u64, max: Option<u64>);
    /// Resolves once the server closed this connection (shutdown, lame duck).
    fn closed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// The server's id.
    fn server_id(&self) -> String;
    /// The largest payload the server takes.
    fn max_payload(&self) -> usize;
}

/// Where a direct connection's messages go: called by the publishing thread.
pub trait Sink: Send + Sync + 'static {
    /// One message for subscription `sid`; `headers` are a status message's (`NATS/1.0
    /// 503` for "no responders"), as `HMSG` would carry them.
    fn deliver(
        &self,
        sid: u64,
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    );
}
