//! The bare WebSocket echo server: the gate's client protocol with nothing behind it
//! (acks a `Handshake`, answers a `Heartbeat`, echoes every `Request`'s body at once), so
//! a run against it measures what this machine's WebSocket stack, generator and kernel
//! can do at all: the limit the gateway's numbers are read against. To be fair it does
//! the gate's per-frame work: the same WebSocket settings, protobuf or JSON as the
//! handshake chose, answers to every frame received fed then flushed once; it skips
//! heartbeat deadlines, rate and in-flight limits, and metrics.
//! Its one room is `broadcast`'s twin: a `chat.say` is echoed, and pushed to every
//! session as a `chat.message` (encoded once); one [`ROOM_BACKLOG`] behind is closed.

use std::sync::Arc;

use futures::{FutureExt as _, SinkExt as _, StreamExt as _};
use gateway::config::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEARTBEAT, DEFAULT_MAX_FRAME, DEFAULT_MAX_SESSIONS,
    WS_READ_BUFFER, WS_WRITE_BUFFER,
};
use net::accept::Acceptor;
use proto::Message as _;
use proto::chat::{ChatMessage, SayRequest};
use proto::client::{self, Packet, packet::Kind};
use proto::code;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::sync::broadcast;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Connections served at once; the next waits to be accepted. The gate's session cap.
const MAX_CONNECTIONS: usize = DEFAULT_MAX_SESSIONS;
/// Frames answered between two flushes: bounded batches keep the write buffer in its cap.
const MAX_BATCH: usize = 64;
/// Room messages a session may fall behind by before it is closed.
pub const ROOM_BACKLOG: usize = 1024;

/// The room: a message's push in both encodings (binary, text), for every session.
type Room = broadcast::Sender<(Message, Message)>;

/// The WebSocket settings of a gate with its default limits.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(WS_READ_BUFFER)
        .write_buffer_size(WS_WRITE_BUFFER)
        .max_write_buffer_size(WS_WRITE_BUFFER + 2 * DEFAULT_MAX_FRAME)
        .max_frame_size(Some(DEFAULT_MAX_FRAME))
        .max_message_size(Some(DEFAULT_MAX_FRAME))
}

/// Serves `listener` (through the gate's accept loop) until `shutdown`; then closes each
/// session with `1001 server shutting down` and returns once they are all gone.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (room, _) = broadcast::channel(ROOM_BACKLOG);
    let mut acceptor = Acceptor::new(listener, "limit-echo");
    for sid in 1u64.. {
        let next = async {
            (
                permits.clone().acquire_owned().await,
                acceptor.accept().await,
            )
        };
        let (permit, (stream, _)) = tokio::select! {
            next = next => next,
            () = shutdown.cancelled() => break,
        };
        // Only a closed semaphore fails, and this one is never closed.
        let Ok(permit) = permit else { break };
        let _ = stream.set_nodelay(true);
        let (shutdown, room) = (shutdown.clone(), room.clone());
        tracker.spawn(async move {
            session(stream, sid, room, shutdown).await;
            drop(permit);
        });
    }
    drop(acceptor);
    tracker.close();
    tracker.wait().await;
}

/// What one frame from the client asks of the session.
enum Step {
    Continue,
    Close(CloseCode, &'static str),
    /// The connection is gone (or closed by the client): nothing more to send.
    End,
}

/// One client, from WebSocket upgrade to close.
async fn session(stream: TcpStream, sid: u64, room: Room, shutdown: CancellationToken) {
    let deadline = Instant::now() + DEFAULT_HANDSHAKE_TIMEOUT;
    let upgrade = tokio_tungstenite::accept_async_with_config(stream, Some(ws_config()));
    let Ok(Ok(ws)) = timeout(DEFAULT_HANDSHAKE_TIMEOUT, upgrade).await else {
        return;
    };
    let (mut sink, mut stream) = ws.split();
    let hello = match timeout_at(deadline, stream.next()).await {
        Ok(Some(Ok(frame))) => frame,
        Ok(_) => return,
        Err(_) => {
            close(&mut sink, CloseCode::Policy, "handshake timeout").await;
            return;
        }
    };
    let text = matches!(hello, Message::Text(_));
    let Some(Kind::Handshake(handshake)) = sdk::frame::decode(&hello).and_then(|p| p.kind) else {
        close(&mut sink, CloseCode::Policy, "handshake required").await;
        return;
    };
    let ack = client::HandshakeAck {
        code: code::OK,
        session_id: sid,
        heartbeat_ms: u32::try_from(DEFAULT_HEARTBEAT.as_millis()).unwrap_or(u32::MAX),
        ..client::HandshakeAck::default()
    };
    let ack = encode(Kind::HandshakeAck(ack), text);
    if sink.send(ack).await.is_err() {
        return;
    }
    let mut said = room.subscribe();
    let session = Session {
        text,
        timing: handshake.server_timing,
        room,
    };
    let stop = shutdown.cancelled();
    tokio::pin!(stop);
    loop {
        let frame = tokio::select! {
            frame = stream.next() => frame,
            pushed = said.recv() => {
                // Behind by more than the backlog (the sender never closes while we run).
                let Ok((binary, text)) = pushed else {
                    return close(&mut sink, CloseCode::Again, "room backlog full").await;
                };
                if sink.send(if session.text { text } else { binary }).await.is_err() {
                    return;
                }
                continue;
            }
            () = &mut stop => {
                close(&mut sink, CloseCode::Away, "server shutting down").await;
                return;
            }
        };
        // Answer this frame and every one already received, then flush once.
        let mut next = frame;
        let mut batch = 0;
        let step = loop {
            let step = session.on_frame(next, &mut sink).await;
            batch += 1;
            if !matches!(step, Step::Continue) || batch == MAX_BATCH {
                break step;
            }
            match stream.next().now_or_never() {
                Some(frame) => next = frame,
                None => break Step::Continue,
            }
        };
        // At the end, this sends tungstenite's queued reply to a client's close frame.
        let flushed = sink.flush().await.is_ok();
        match step {
            Step::Continue if flushed => {}
            Step::Close(code, reason) => return close(&mut sink, code, reason).await,
            Step::Continue | Step::End => return,
        }
    }
}

type Sink = futures::stream::SplitSink<WebSocketStream<TcpStream>, Message>;

struct Session {
    text: bool,
    timing: bool,
    room: Room,
}

impl Session {
    /// Pushes a `chat.say`'s text to the room as a `chat.message`.
    fn say(&self, body: &[u8]) {
        let Ok(SayRequest { room, text }) = SayRequest::decode(body) else {
            return;
        };
        let message = ChatMessage {
            room,
            text,
            ..Default::default()
        };
        let push = client::Push {
            route: "chat.message".into(),
            body: message.encode_to_vec().into(),
            ..Default::default()
        };
        let [binary, text] = [false, true].map(|text| encode(Kind::Push(push.clone()), text));
        // No session is no error: nobody hears it.
        let _ = self.room.send((binary, text));
    }

    async fn on_frame(
        &self,
        frame: Option<Result<Message, tungstenite::Error>>,
        sink: &mut Sink,
    ) -> Step {
        let received = Instant::now();
        let frame = match frame {
            None | Some(Ok(Message::Close(_))) => return Step::End,
            Some(Err(tungstenite::Error::Capacity(_))) => {
                return Step::Close(CloseCode::Size, "frame too large");
            }
            Some(Err(_)) => return Step::End,
            // Pings are answered by tungstenite itself, on the next flush.
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {
                return Step::Continue;
            }
            Some(Ok(frame)) => frame,
        };
        let packet = sdk::frame::decode(&frame).and_then(|p| p.kind);
        if let Some(Kind::Request(req)) = &packet
            && req.route == "chat.say"
        {
            self.say(&req.body);
        }
        let reply = match packet {
            Some(Kind::Request(req)) if req.id == 0 => return Step::Continue,
            Some(Kind::Request(req)) => Kind::Response(client::Response {
                id: req.id,
                code: code::OK,
                body: req.body,
                timing: self.timing.then(|| client::Timing {
                    total_us: u32::try_from(received.elapsed().as_micros()).unwrap_or(u32::MAX),
                    ..client::Timing::default()
                }),
                ..client::Response::default()
            }),
            Some(Kind::Heartbeat(_)) => Kind::Heartbeat(client::Heartbeat {}),
            Some(Kind::Handshake(_)) => {
                return Step::Close(CloseCode::Policy, "handshake repeated");
            }
            Some(_) => return Step::Close(CloseCode::Policy, "packet not for the gate"),
            None => return Step::Close(CloseCode::Invalid, "invalid packet"),
        };
        match sink.feed(encode(reply, self.text)).await {
            Ok(()) => Step::Continue,
            Err(_) => Step::End,
        }
    }
}

async fn close(sink: &mut Sink, code: CloseCode, reason: &'static str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = sink.send(Message::Close(Some(frame))).await;
}

fn encode(kind: Kind, text: bool) -> Message {
    sdk::frame::encode(&Packet::new(kind), text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Answering in either encoding is pinned by tests/ws_generator.rs; this pins the end.
    #[tokio::test]
    async fn shutdown_closes_every_session_as_going_away() {
        let wait = Duration::from_secs(10);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(listener, shutdown.clone()));
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        ws.send(Message::text(r#"{"handshake":{}}"#)).await.unwrap();
        let mut recv = async || timeout(wait, ws.next()).await.unwrap().unwrap().unwrap();
        let Message::Text(ack) = recv().await else {
            panic!("ack not in a text frame")
        };
        assert!(ack.as_str().contains(r#""code":200"#), "{ack}");
        shutdown.cancel();
        let Message::Close(Some(frame)) = recv().await else {
            panic!("not closed")
        };
        assert_eq!(frame.code, CloseCode::Away);
        timeout(wait, task).await.unwrap().unwrap();
    }
}
