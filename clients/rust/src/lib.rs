//! The Rust client SDK: what a game client (and the load test) uses to talk to a gate.
//! A crate of its own, so a client links the protocol (`proto`) and not the server.
//!
//! [`Client::connect`] opens the WebSocket, handshakes, and spawns one connection task
//! that owns the socket. Handles are cheap clones; each request registers a waiter under
//! its id and queues its frame, and the task routes the response back by id. Pushes
//! arrive on a bounded queue ([`Client::pushes`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), sdk::SdkError> {
//! use sdk::{Client, ClientOptions};
//! let client = Client::connect("ws://127.0.0.1:3250", ClientOptions::default()).await?;
//! let response = client.request("echo.echo", b"hi").await?;
//! assert_eq!(response.code, 200);
//! client.close().await;
//! # Ok(()) }
//! ```
//!
//! Costs per request, because the load test runs thousands a second per connection: one
//! buffer for the encoded frame (which the pending table shares, to send it again after
//! a resume), one oneshot for the answer, two short critical sections on the pending
//! table, no log line. The writer puts every queued frame into the socket's buffer
//! before one flush, so a burst of requests costs one syscall.
//!
//! `wss://` URLs need [`ClientOptions::tls`], a rustls client configuration;
//! [`tls_client_config`] makes one trusting the CA certificates in a PEM file:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sdk::{Client, ClientOptions, tls_client_config};
//! let options = ClientOptions {
//!     tls: Some(tls_client_config("ca.pem".as_ref())?),
//!     ..ClientOptions::default()
//! };
//! let client = Client::connect("wss://localhost:3443", options).await?;
//! # Ok(()) }
//! ```
//!
//! **Heartbeats.** The connection task sends a heartbeat once per interval the gate
//! asked for, and the gate answers each: a link that hears nothing from its gate for two
//! intervals counts it gone (a link lost without a reset, which TCP would not report for
//! minutes) and ends as a dropped connection, `no frame from the gate in N ms`.
//!
//! **Reconnecting.** With [`ClientOptions::reconnect`], a dropped connection (not a
//! kick, not a close `resumed elsewhere`, which says another connection took the session
//! up, not [`Client::close`]) is re-established with exponential backoff and a new
//! handshake. Requests made while reconnecting wait for the new connection, within their
//! timeout. [`Client::reconnects`] counts reconnections.
//!
//! **Resuming** (docs/protocol.md, "Resume"). With [`ClientOptions::resume`] as well
//! (the default), the handshake asks the gate to keep the session for a while after its
//! connection drops, and the reconnection takes that session up again, on the same gate
//! or another of the list: same player, same rooms. Requests in flight at the drop do
//! not fail: they are sent again with the same id, route, body and key, and the gate
//! answers each once; pushes carry on on the same [`Client::pushes`] stream, none missed,
//! none twice. For that every push and response is numbered: the client drops a number
//! it has handled already (a repeat after a resume), and acknowledges what it handled
//! every 64 frames and with every heartbeat, so the gate can let go of it. Request ids
//! keep counting, so they stay unique in the session. [`Client::resumes`] counts the
//! reconnections that resumed. If the gate refuses (the session expired or ended, or let
//! go of frames the client missed), the reconnection is a fresh session: requests in
//! flight at the drop fail with [`ErrorKind::Closed`], and [`Client::resume_code`] says
//! why. Every reconnection is fresh when resume is off or the gate keeps no sessions
//! for resuming (its ack brings no token), and so is the one after a frame from the
//! gate that does not decode (the replay would bring it again). Notifies are not sent
//! again: one queued as the connection drops may be lost.
//!
//! Resume is on by default because it costs nothing where it is not offered (the client
//! then behaves as without it) and, where it is, spares the application a login and
//! its requests in flight after every network blip. It needs `reconnect`: without it,
//! the handshake does not ask the gate to keep a session nobody will come back for.
//!
//! **Several gates.** [`Client::connect_any`] takes a list of gate URLs: it connects to
//! the first that answers, and each reconnection attempt goes to the next URL in turn.
//!
//! **Drains.** A gate being stopped or replaced sends a `Drain` packet. The client then
//! dials the other URLs in turn, starting after the draining gate's, with the same
//! options and token, and moves to the first that handshakes ([`Client::moves`] counts
//! moves), losing nothing: requests made from then on go to the new gate; requests
//! already sent finish on the old one, whose socket stays open until the last of them
//! is answered; a request the draining gate refused without forwarding it (503
//! `gate draining`, [`DRAINING_MESSAGE`]) is sent again on the new gate within its own
//! timeout and never reaches the caller. Pushes from both gates arrive on the same
//! [`Client::pushes`] stream meanwhile. If no other gate answers, the client stays on
//! the draining one until it closes, then reconnects as after any drop (its closing kick
//! included).
//!
//! A move is not a resume: the new gate starts a new session, as the protocol's drain
//! asks. A drained session can be resumed all the same if its connection drops before
//! the move (elsewhere, like any other); the drain's closing kick ends it, so the
//! reconnection after that kick is fresh. A connection retiring after a move is never
//! resumed: if it drops, the requests left on it fail with [`ErrorKind::Closed`].
//!
//! A move, like a reconnection that did not resume, leaves the gate's session state
//! behind (the player bound by a login, the rooms joined). When [`Client::moves`] grew,
//! or [`Client::reconnects`] more than [`Client::resumes`] (the last
//! [`Client::resume_code`] is not 200), log in and join again. [`Client::session_id`]
//! is no guide: a resumed session may get a new id, as ids are per gate.

mod connection;
mod error;
pub mod frame;
mod link;
mod resume;
mod shared;
mod stream;
mod task;
#[cfg(test)]
mod tests;
mod tls;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use error::{ErrorKind, SdkError};
pub use proto::client::{Push, Response, Timing};
/// The TLS library [`ClientOptions::tls`] is configured with (ring provider).
pub use tokio_rustls::rustls;

pub use tls::{TlsError, client_config as tls_client_config};

pub use connection::{Ws as WebSocket, open as open_websocket};

/// A handshaken WebSocket with no [`Client`] over it, within
/// [`ClientOptions::connect_timeout`]: for tools that drive the protocol themselves
/// (the load generator) over the SDK's own dialing and handshake.
pub async fn dial(
    url: &str,
    options: &ClientOptions,
) -> Result<(WebSocket, proto::client::HandshakeAck), SdkError> {
    connection::connect(url, options, None).await
}

use shared::{Refused, Shared, State, Waiter};
use task::{Outgoing, Task};

/// Default for [`ClientOptions::request_timeout`]: longer than the gate's own request
/// timeout, so a slow handler normally shows up as a 408 response, not a client timeout.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`ClientOptions::connect_timeout`]: TCP, WebSocket upgrade and handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`ClientOptions::queue_capacity`]: frames waiting for the writer. When
/// full, requests wait for room (within their timeout) instead of piling up in memory.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Default for [`ClientOptions::push_capacity`]: pushes not yet taken by the caller.
pub const DEFAULT_PUSH_CAPACITY: usize = 1024;
/// Default for [`ClientOptions::max_frame_bytes`]: the largest frame accepted from the
/// gate, so a broken or hostile gate cannot make the client buffer without bound.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 << 20;

/// Exponential backoff for reconnecting: the first attempt after about `initial`, each
/// failure doubling the delay up to `max` (each delay jittered to between half and all
/// of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

/// How to connect and behave.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sent in the handshake for the gate's token check; empty when it needs none.
    pub token: String,
    /// Ask for [`Response::timing`] on every response.
    pub server_timing: bool,
    /// Names this client in the handshake (logs and metrics on the gate).
    pub client: String,
    /// How long [`Client::request`] and [`Client::notify`] wait in all: for a
    /// reconnection, for queue room, for the response.
    pub request_timeout: Duration,
    /// How long opening the WebSocket plus the handshake may take.
    pub connect_timeout: Duration,
    /// Reconnect after the connection drops; `None` closes the client instead.
    pub reconnect: Option<Backoff>,
    /// Resume the session after a dropped connection rather than start a fresh one,
    /// when the gate keeps sessions for resuming (see the module docs). Takes effect
    /// with [`ClientOptions::reconnect`] only: without it there is no reconnection to
    /// resume on, so the handshake does not ask the gate to keep the session either.
    pub resume: bool,
    /// Outgoing frames waiting for the writer (at least 1).
    pub queue_capacity: usize,
    /// Pushes waiting for the caller (at least 1). When full, further pushes are
    /// dropped and counted ([`Client::pushes_dropped`]) rather than stalling responses.
    pub push_capacity: usize,
    /// The largest frame accepted from the gate.
    pub max_frame_bytes: usize,
    /// Ask the gate to handle this session's requests strictly one after another.
    pub serial: bool,
    /// Speak JSON text frames instead of protobuf. Request bodies are then the JSON
    /// text of the body's value: an object for a typed route (`{"room":"lobby"}`), a
    /// quoted string for a raw one (`"hello"`); response and push bodies come back as
    /// the gate sent them: a typed body's JSON text, or a string body's contents.
    pub json: bool,
    /// The TLS configuration for `wss://` URLs (unused for `ws://`). There is no
    /// default trust store: a `wss://` connect without it fails with
    /// [`ErrorKind::Connect`]. [`tls_client_config`] makes one trusting a CA file; any
    /// [`rustls::ClientConfig`] does (built with the ring provider, as this crate's
    /// rustls has no other).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The local address every socket of this client is bound to before it connects
    /// (port chosen by the system); `None` lets the system pick the address too. For a
    /// host with several addresses, or a load tester that spreads its sockets over
    /// several so as to open more than one address's ephemeral ports allow.
    pub source_addr: Option<std::net::IpAddr>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: String::new(),
            server_timing: false,
            client: concat!("shaddock-rust-sdk/", env!("CARGO_PKG_VERSION")).to_owned(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect: None,
            resume: true,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            push_capacity: DEFAULT_PUSH_CAPACITY,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            serial: false,
            json: false,
            tls: None,
            source_addr: None,
        }
    }
}

impl ClientOptions {
    /// Whether handshakes ask for a resumable session.
    pub(crate) fn resumable(&self) -> bool {
        self.resume && self.reconnect.is_some()
    }
}

/// A connection to a gate. Clones share the connection; it closes when
/// [`Client::close`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    outgoing: mpsc::Sender<Outgoing>,
    cancel: CancellationToken,
    next_id: AtomicU64,
    request_timeout: Duration,
    /// The session speaks JSON ([`ClientOptions::json`]).
    json: bool,
    pushes: Mutex<Option<Pushes>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("session_id", &self.session_id())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to `url` (`ws://host:port/`, or `wss://` with [`ClientOptions::tls`]), handshakes, and starts the connection
    /// task. Fails with [`ErrorKind::Connect`], or [`ErrorKind::Handshake`] carrying the
    /// gate's code and message. The client has this one gate: reconnections go back to
    /// it, and a drain cannot move it ([`Client::connect_any`] can).
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Client, SdkError> {
        Client::connect_any(&[url], options).await
    }

    /// Connects to the first of `urls` that handshakes, trying them in order, each once.
    /// All of them are the client's gates: a reconnection tries the next one after the
    /// gate it lost, and a gate's drain moves the client to the next one that answers
    /// (see the module docs). Fails with the last gate's error, or [`ErrorKind::Connect`]
    /// for an empty list.
    pub async fn connect_any<S: AsRef<str>>(
        urls: &[S],
        options: ClientOptions,
    ) -> Result<Client, SdkError> {
        let urls: Arc<[String]> = urls.iter().map(|u| u.as_ref().to_owned()).collect();
        let dialed = connection::connect_in_turn(&urls, 0, urls.len(), &options).await?;
        let shared = Arc::new(Shared::new(dialed.ack.session_id));
        let (outgoing_tx, outgoing_rx) = mpsc::channel(options.queue_capacity.max(1));
        let (push_tx, push_rx) = mpsc::channel(options.push_capacity.max(1));
        let cancel = CancellationToken::new();
        let request_timeout = options.request_timeout;
        let json = options.json;
        let span = tracing::debug_span!(
            "sdk",
            url = urls[dialed.url_index],
            session_id = dialed.ack.session_id
        );
        let task = Task {
            urls,
            options: Arc::new(options),
            shared: shared.clone(),
            outgoing: outgoing_rx,
            pushes: push_tx,
            cancel: cancel.clone(),
        };
        tokio::spawn(task.run(dialed).instrument(span));
        Ok(Client {
            inner: Arc::new(Inner {
                shared,
                outgoing: outgoing_tx,
                cancel,
                next_id: AtomicU64::new(1),
                request_timeout,
                json,
                pushes: Mutex::new(Some(Pushes(push_rx))),
            }),
        })
    }

    /// Sends a request and waits for its response, within the client's request
    /// timeout. Any code comes back as a [`Response`] (check `code`); errors are for
    /// when there is no response: [`ErrorKind::Timeout`], [`ErrorKind::Closed`].
    pub async fn request(&self, route: &str, body: impl AsRef<[u8]>) -> Result<Response, SdkError> {
        self.request_with_timeout(route, body, self.inner.request_timeout)
            .await
    }

    /// [`Client::request`] with its own timeout.
    pub async fn request_with_timeout(
        &self,
        route: &str,
        body: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<Response, SdkError> {
        self.keyed_request(route, "", body.as_ref(), timeout).await
    }

    /// [`Client::request`] to a keyed service's route, routed by `key` (e.g. a match
    /// id) rather than by the session value the service names or the player's uid
    /// (docs/protocol.md, "Keyed services").
    pub async fn request_keyed(
        &self,
        route: &str,
        key: &str,
        body: impl AsRef<[u8]>,
    ) -> Result<Response, SdkError> {
        self.keyed_request(route, key, body.as_ref(), self.inner.request_timeout)
            .await
    }

    async fn keyed_request(
        &self,
        route: &str,
        key: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, SdkError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = frame::encode_request(self.inner.json, id, (route, key), body)?;
        tokio::time::timeout(timeout, self.exchange(id, frame))
            .await
            .unwrap_or_else(|_| Err(SdkError::timeout()))
    }

    /// Registers, sends and awaits one request. A draining gate's refusal (never
    /// forwarded) is sent again on the connection the client moves to; a resumed
    /// session's connection gets it again from the connection task.
    async fn exchange(&self, id: u64, frame: bytes::Bytes) -> Result<Response, SdkError> {
        // The first connection the request may go on: after a refusal, a later one.
        let mut from_epoch = 0;
        loop {
            let (waiter, answer) = oneshot::channel();
            let epoch = self.register(id, waiter, &frame, from_epoch).await?;
            // From here until the answer, a timeout or a dropped future forgets the
            // waiter.
            let mut guard = Forget {
                shared: &self.inner.shared,
                id,
                armed: true,
            };
            self.send(epoch, frame.clone()).await?;
            let result = answer.await;
            // Answered (or failed by the task): the waiter is already out of the table.
            guard.armed = false;
            match result {
                Ok(Ok(response)) if refused_by_draining_gate(&response) => {
                    from_epoch = epoch + 1;
                }
                Ok(result) => return result,
                // The waiter was dropped unanswered: only when the task is gone.
                Err(_) => return Err(self.inner.shared.closed_error()),
            }
        }
    }

    /// Sends a notify: a request with id 0, forwarded to the service but never
    /// answered. Returns once it is queued (after waiting for a reconnection if one is
    /// under way, within the request timeout).
    pub async fn notify(&self, route: &str, body: impl AsRef<[u8]>) -> Result<(), SdkError> {
        let frame = frame::encode_request(self.inner.json, 0, (route, ""), body.as_ref())?;
        let queued = async {
            let epoch = self.wait_up().await?;
            self.send(epoch, frame).await
        };
        tokio::time::timeout(self.inner.request_timeout, queued)
            .await
            .unwrap_or_else(|_| Err(SdkError::timeout()))
    }

    /// The pushes from the gate. The first call takes the stream; later calls get
    /// `None`. The stream ends when the client closes.
    pub fn pushes(&self) -> Option<Pushes> {
        self.inner
            .pushes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The gate's id for the current session: a reconnection or a move gets a new one
    /// (a resumed session's may be new too: the id is per gate).
    pub fn session_id(&self) -> u64 {
        self.inner.shared.session_id()
    }

    /// Pushes dropped because the push queue was full.
    pub fn pushes_dropped(&self) -> u64 {
        self.inner.shared.pushes_dropped()
    }

    /// Successful reconnections so far, resumed or not.
    pub fn reconnects(&self) -> u64 {
        self.inner.shared.reconnects()
    }

    /// Reconnections that resumed the session so far (part of [`Client::reconnects`]).
    pub fn resumes(&self) -> u64 {
        self.inner.shared.resumes()
    }

    /// What became of the last reconnection's resume: 0 none was asked (no
    /// reconnection yet, a session the gate keeps no resume for, or a gate that does
    /// not know resume), 200 resumed, else the gate's `resume_code` saying why the
    /// session is a fresh one (404: expired, ended or resumed already; 409: it let go of
    /// frames the client missed; docs/protocol.md, "Resume"). Read after
    /// [`Client::reconnects`], it is the code of that reconnection or a later one.
    pub fn resume_code(&self) -> u32 {
        self.inner.shared.resume_code()
    }

    /// Moves so far: a gate drained and the client went to another one.
    pub fn moves(&self) -> u64 {
        self.inner.shared.moves()
    }

    /// Whether the client is closed for good (closed, kicked, or lost without
    /// reconnect).
    pub fn is_closed(&self) -> bool {
        matches!(*self.inner.shared.state().borrow(), State::Closed { .. })
    }

    /// Waits until the client is closed for good; returns the reason (a kick's reason,
    /// "closed by client", or why the connection was lost).
    pub async fn closed(&self) -> String {
        let mut state = self.inner.shared.state().subscribe();
        let closed = state
            .wait_for(|s| matches!(s, State::Closed { .. }))
            .await
            .ok()
            .and_then(|s| match &*s {
                State::Closed { reason } => Some(reason.clone()),
                _ => None,
            });
        // The state's sender lives as long as `self`, so `wait_for` cannot fail.
        closed.unwrap_or_else(|| task::CLOSED_BY_CLIENT.to_owned())
    }

    /// Closes the connection: pending and later requests fail with
    /// [`ErrorKind::Closed`], the push stream ends. Returns once the connection task has
    /// finished.
    pub async fn close(&self) {
        self.inner.cancel.cancel();
        self.closed().await;
    }

    /// Registers a waiter, and the frame to resend if the session is resumed, under
    /// the current connection's epoch, once that is at least `from_epoch`, waiting for
    /// a reconnection or a move if one is under way.
    async fn register(
        &self,
        id: u64,
        mut waiter: Waiter,
        frame: &bytes::Bytes,
        from_epoch: u64,
    ) -> Result<u64, SdkError> {
        let shared = &self.inner.shared;
        // Fast path: connected, no subscription needed.
        let current = current_epoch(&shared.state().borrow(), from_epoch)?;
        if let Some(epoch) = current {
            match shared.insert(epoch, id, waiter, frame) {
                Ok(()) => return Ok(epoch),
                Err(Refused::Stale(w)) => waiter = w,
                Err(Refused::Closed(reason)) => return Err(SdkError::closed(reason)),
            }
        }
        let mut state = shared.state().subscribe();
        loop {
            let current = current_epoch(&state.borrow_and_update(), from_epoch)?;
            if let Some(epoch) = current {
                match shared.insert(epoch, id, waiter, frame) {
                    Ok(()) => return Ok(epoch),
                    Err(Refused::Stale(w)) => waiter = w,
                    Err(Refused::Closed(reason)) => return Err(SdkError::closed(reason)),
                }
            }
            if state.changed().await.is_err() {
                return Err(shared.closed_error());
            }
        }
    }

    /// The current epoch, after waiting for a reconnection if one is under way.
    async fn wait_up(&self) -> Result<u64, SdkError> {
        let shared = &self.inner.shared;
        if let Some(epoch) = current_epoch(&shared.state().borrow(), 0)? {
            return Ok(epoch);
        }
        let mut state = shared.state().subscribe();
        loop {
            if let Some(epoch) = current_epoch(&state.borrow_and_update(), 0)? {
                return Ok(epoch);
            }
            if state.changed().await.is_err() {
                return Err(shared.closed_error());
            }
        }
    }

    /// Queues a frame for the writer, waiting for room.
    async fn send(&self, epoch: u64, frame: bytes::Bytes) -> Result<(), SdkError> {
        self.inner
            .outgoing
            .send(Outgoing { epoch, frame })
            .await
            .map_err(|_| self.inner.shared.closed_error())
    }

    #[cfg(test)]
    fn pending(&self) -> usize {
        self.inner.shared.pending()
    }
}

/// `Some(epoch)` when up at `from_epoch` or later, `None` while reconnecting (or not yet
/// moved on), the close reason when closed.
fn current_epoch(state: &State, from_epoch: u64) -> Result<Option<u64>, SdkError> {
    match state {
        State::Up { epoch } if *epoch >= from_epoch => Ok(Some(*epoch)),
        State::Up { .. } | State::Reconnecting => Ok(None),
        State::Closed { reason } => Err(SdkError::closed(reason.clone())),
    }
}

/// The code and message of a draining gate's answer to a request it did not forward:
/// safe to send again on another gate.
pub const DRAINING_CODE: u32 = proto::code::UNAVAILABLE;
/// See [`DRAINING_CODE`].
pub const DRAINING_MESSAGE: &str = proto::code::GATE_DRAINING;

fn refused_by_draining_gate(response: &Response) -> bool {
    response.code == DRAINING_CODE && response.message == DRAINING_MESSAGE
}

/// Removes a request's waiter if the request is abandoned (timeout, dropped future)
/// before its answer arrives; disarmed once the answer is in.
struct Forget<'a> {
    shared: &'a Shared,
    id: u64,
    armed: bool,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.remove(self.id);
        }
    }
}

/// The stream of pushes from the gate; see [`Client::pushes`].
#[derive(Debug)]
pub struct Pushes(mpsc::Receiver<Push>);

impl Pushes {
    /// The next push; `None` once the client is closed.
    pub async fn recv(&mut self) -> Option<Push> {
        self.0.recv().await
    }

    /// A push if one is waiting, without waiting.
    pub fn try_recv(&mut self) -> Option<Push> {
        self.0.try_recv().ok()
    }
}

impl Stream for Pushes {
    type Item = Push;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Push>> {
        self.0.poll_recv(cx)
    }
}
