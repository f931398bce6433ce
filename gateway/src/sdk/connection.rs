//! The connection task: the one owner of the socket. It reads frames and routes them
//! (responses to their waiters, pushes to the push queue), writes queued frames in
//! batches with one flush each, sends heartbeats, and reconnects with backoff when the
//! connection drops.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use proto::client::{HandshakeAck, Push, packet::Kind};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::codec::{self, Incoming};
use super::error::{ErrorKind, SdkError};
use super::shared::{FIRST_EPOCH, Shared};
use super::stream::Stream;
use super::{Backoff, ClientOptions};

type Ws = WebSocketStream<Stream>;

/// Ports a URL without one means, as browsers read them.
const WS_PORT: u16 = 80;
const WSS_PORT: u16 = 443;

/// Most frames written before one flush, so a busy queue cannot delay the flush of
/// what is already buffered indefinitely.
const MAX_BATCH: usize = 256;
/// How long a closing client waits for its close frame to go out.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Floor for the reconnect delay, so a zero `Backoff::initial` cannot spin.
const MIN_BACKOFF: Duration = Duration::from_millis(1);

/// The reason given to requests after [`super::Client::close`].
pub(crate) const CLOSED_BY_CLIENT: &str = "closed by client";

/// A frame for the writer, tagged with the epoch its request registered under.
pub(crate) struct Outgoing {
    pub(crate) epoch: u64,
    pub(crate) frame: Bytes,
}

/// Opens the WebSocket and handshakes, within `connect_timeout`.
pub(crate) async fn connect(
    url: &str,
    options: &ClientOptions,
) -> Result<(Ws, HandshakeAck), SdkError> {
    let handshake = async {
        let config = WebSocketConfig::default()
            .read_buffer_size(8 * 1024)
            .max_message_size(Some(options.max_frame_bytes))
            .max_frame_size(Some(options.max_frame_bytes));
        let mut ws = open(url, options, config).await?;
        let hello = codec::handshake(options);
        ws.send(codec::message(options.json, hello))
            .await
            .map_err(|e| SdkError::connect_io("sending the handshake", e))?;
        loop {
            let message = match ws.next().await {
                Some(Ok(message)) => message,
                Some(Err(e)) => return Err(SdkError::connect_io("awaiting the handshake ack", e)),
                None => {
                    return Err(SdkError::connect(
                        "the gate closed before the handshake ack",
                    ));
                }
            };
            let packet = match codec::decode(message).map_err(SdkError::protocol)? {
                Incoming::Packet(packet) => packet,
                Incoming::Close(reason) => {
                    return Err(SdkError::connect(format!(
                        "the gate closed before the handshake ack: {reason}"
                    )));
                }
                Incoming::Control => continue,
            };
            match packet.kind {
                Some(Kind::HandshakeAck(ack)) if ack.code == proto::code::OK => {
                    return Ok((ws, ack));
                }
                Some(Kind::HandshakeAck(ack)) => {
                    return Err(SdkError::handshake(ack.code, ack.message));
                }
                Some(Kind::Heartbeat(_)) => continue,
                other => {
                    return Err(SdkError::protocol(format!(
                        "expected a handshake ack, got {other:?}"
                    )));
                }
            }
        }
    };
    match tokio::time::timeout(options.connect_timeout, handshake).await {
        Ok(result) => result,
        Err(_) => Err(SdkError::connect(format!(
            "no handshake ack within {:?}",
            options.connect_timeout
        ))),
    }
}

/// Opens the socket (TCP, then TLS for `wss://` with [`ClientOptions::tls`]) and
/// upgrades it to a WebSocket.
async fn open(url: &str, options: &ClientOptions, config: WebSocketConfig) -> Result<Ws, SdkError> {
    let request = url
        .into_client_request()
        .map_err(|e| SdkError::connect_io(url, e))?;
    let uri = request.uri();
    let tls = match uri.scheme_str() {
        Some("ws") => None,
        Some("wss") => Some(options.tls.clone().ok_or_else(|| {
            SdkError::connect(format!(
                "{url}: wss:// needs ClientOptions::tls (sdk::tls_client_config makes one \
                 trusting a CA file)"
            ))
        })?),
        _ => {
            return Err(SdkError::connect(format!(
                "{url}: not a ws:// or wss:// URL"
            )));
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| SdkError::connect(format!("{url}: no host")))?;
    // An IPv6 literal comes bracketed; neither the resolver nor the server name wants it so.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri
        .port_u16()
        .unwrap_or(if tls.is_some() { WSS_PORT } else { WS_PORT });
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| SdkError::connect_io(url, e))?;
    // The writer batches frames itself; Nagle would only delay the flush it asked for.
    tcp.set_nodelay(true)
        .map_err(|e| SdkError::connect_io(url, e))?;
    let stream = match tls {
        None => Stream::Plain(tcp),
        Some(tls) => {
            let name = ServerName::try_from(host).map_err(|e| SdkError::connect_io(url, e))?;
            let tls = TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| SdkError::connect_io(&format!("{url}: TLS handshake"), e))?;
            Stream::Tls(Box::new(tls))
        }
    };
    let (ws, _) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|e| SdkError::connect_io(url, e))?;
    Ok(ws)
}

/// How one connection ended.
enum Exit {
    /// The client closed (or every handle was dropped).
    Closed,
    /// The gate kicked this session; the reason is the kick's. No reconnect.
    Kicked(String),
    /// The socket broke or the gate closed it: reconnect if configured.
    Lost(String),
}

pub(crate) struct Task {
    pub(crate) url: String,
    pub(crate) options: ClientOptions,
    pub(crate) shared: Arc<Shared>,
    pub(crate) outgoing: mpsc::Receiver<Outgoing>,
    pub(crate) pushes: mpsc::Sender<Push>,
    pub(crate) cancel: CancellationToken,
}

/// Closes the shared state however the task ends, panics included, so no request
/// waits for a task that is gone.
struct FinishOnDrop(Arc<Shared>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish("connection task ended");
    }
}

impl Task {
    pub(crate) async fn run(mut self, ws: Ws, ack: HandshakeAck) {
        let _finish = FinishOnDrop(self.shared.clone());
        let reason = self.serve_all(ws, ack).await;
        debug!(%reason, "connection closed");
        self.shared.finish(&reason);
    }

    /// Serves connections until one ends for good; returns why.
    async fn serve_all(&mut self, mut ws: Ws, mut ack: HandshakeAck) -> String {
        let mut epoch = FIRST_EPOCH;
        loop {
            match self.serve(ws, epoch, &ack).await {
                Exit::Closed => return CLOSED_BY_CLIENT.to_owned(),
                Exit::Kicked(reason) => return reason,
                Exit::Lost(reason) => {
                    let Some(backoff) = self.options.reconnect else {
                        return reason;
                    };
                    debug!(%reason, "connection lost; reconnecting");
                    epoch = self.shared.lose(&reason);
                    (ws, ack) = match self.reconnect(backoff).await {
                        Ok(connected) => connected,
                        Err(reason) => return reason,
                    };
                    debug!(session_id = ack.session_id, "reconnected");
                    self.shared.up(epoch, ack.session_id);
                }
            }
        }
    }

    /// Runs one connection until it ends.
    async fn serve(&mut self, ws: Ws, epoch: u64, ack: &HandshakeAck) -> Exit {
        // Half the gate's interval: the gate closes after two missed intervals, so this
        // leaves room for a busy scheduler.
        let heartbeat = (ack.heartbeat_ms > 0)
            .then(|| Duration::from_millis(u64::from(ack.heartbeat_ms)) / 2)
            .map(|period| {
                let mut interval = tokio::time::interval_at(Instant::now() + period, period);
                interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
                interval
            });
        let (mut sink, mut stream) = ws.split();
        let exit = tokio::select! {
            biased;
            () = self.cancel.cancelled() => Exit::Closed,
            exit = read_loop(&mut stream, &self.shared, &self.pushes) => exit,
            exit = write_loop(&mut sink, &mut self.outgoing, epoch, heartbeat, self.options.json) => exit,
        };
        if !matches!(exit, Exit::Lost(_)) {
            // Tell the gate we are going; it may already be gone, which is fine.
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.close()).await;
        }
        exit
    }

    /// Reconnects with exponential backoff and equal jitter, until it succeeds, the
    /// client closes, or the gate refuses the handshake with a 4xx (a refused token will
    /// not be accepted on the next try).
    async fn reconnect(&self, backoff: Backoff) -> Result<(Ws, HandshakeAck), String> {
        let max = backoff.max.max(MIN_BACKOFF);
        let mut delay = backoff.initial.clamp(MIN_BACKOFF, max);
        loop {
            // Equal jitter: half fixed, half random, so a fleet of clients dropped at
            // once does not come back in lockstep.
            let half = delay / 2;
            let pause = half + half.mul_f64(fastrand::f64());
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(CLOSED_BY_CLIENT.to_owned()),
                () = tokio::time::sleep(pause) => {}
            }
            let attempt = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(CLOSED_BY_CLIENT.to_owned()),
                attempt = connect(&self.url, &self.options) => attempt,
            };
            match attempt {
                Ok(connected) => return Ok(connected),
                Err(e) => {
                    if let ErrorKind::Handshake { code: 400..=499 } = e.kind() {
                        return Err(e.to_string());
                    }
                    debug!(error = %e, "reconnect failed");
                }
            }
            delay = delay.saturating_mul(2).min(max);
        }
    }
}

/// Reads frames until the connection ends: responses to their waiters, pushes to the
/// push queue, a kick ends it.
async fn read_loop(
    stream: &mut SplitStream<Ws>,
    shared: &Shared,
    pushes: &mpsc::Sender<Push>,
) -> Exit {
    loop {
        let message = match stream.next().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Exit::Lost(format!("read failed: {e}")),
            None => return Exit::Lost("the gate closed the connection".to_owned()),
        };
        let packet = match codec::decode(message) {
            Ok(Incoming::Packet(packet)) => packet,
            Ok(Incoming::Close(reason)) => {
                return Exit::Lost(format!("the gate closed the connection: {reason}"));
            }
            Ok(Incoming::Control) => continue,
            // A gate that sends garbage cannot be trusted with the rest of the stream.
            Err(e) => return Exit::Lost(format!("protocol error: {e}")),
        };
        match packet.kind {
            Some(Kind::Response(response)) => shared.complete(response),
            Some(Kind::Push(push)) => match pushes.try_send(push) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    if shared.push_dropped() {
                        warn!("push queue full: dropping pushes (see Client::pushes_dropped)");
                    }
                }
            },
            Some(Kind::Kick(kick)) => return Exit::Kicked(kick.reason),
            // Heartbeats need no answer; anything else is not for a client: ignore.
            _ => {}
        }
    }
}

/// Writes queued frames: everything already queued (up to [`MAX_BATCH`]) goes into the
/// socket's buffer, then one flush. Frames from an older epoch are dropped: their
/// callers were already failed when that connection was lost.
async fn write_loop(
    sink: &mut SplitSink<Ws, Message>,
    outgoing: &mut mpsc::Receiver<Outgoing>,
    epoch: u64,
    mut heartbeat: Option<Interval>,
    json: bool,
) -> Exit {
    loop {
        let first = tokio::select! {
            out = outgoing.recv() => match out {
                Some(out) => out,
                // Every handle is gone.
                None => return Exit::Closed,
            },
            () = tick(&mut heartbeat) => Outgoing { epoch, frame: codec::heartbeat(json) },
        };
        let mut next = Some(first);
        let mut written = 0;
        while let Some(out) = next {
            if out.epoch == epoch {
                if let Err(e) = sink.feed(codec::message(json, out.frame)).await {
                    return Exit::Lost(format!("write failed: {e}"));
                }
                written += 1;
            }
            next = if written < MAX_BATCH {
                outgoing.try_recv().ok()
            } else {
                None
            };
        }
        if written == 0 {
            continue;
        }
        if let Err(e) = sink.flush().await {
            return Exit::Lost(format!("write failed: {e}"));
        }
    }
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}
