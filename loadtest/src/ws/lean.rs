//! The generator's client: one task that owns its WebSocket and speaks the protocol
//! itself (docs/benchmarks.md, "How the load is generated"). The SDK serves many callers
//! each awaiting an answer, at a cost per request (a oneshot, a hop, a wake-up) taken
//! from the servers on the same cores; a load client has one caller. A close, a kick, a
//! broken socket or a bad frame ends it: its requests in flight fail, then each later
//! slot as it comes due, so a run counts what it offered and ends on time (no
//! reconnect). The run's slots bound the outbox.

use std::collections::VecDeque;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::{SinkExt as _, StreamExt as _};
use gateway::pomelo::wire::{self, MessageKind, PackageType, Route};
use proto::client::packet::Kind;
use proto::code::{HANDLER_ERROR, OK};
use proto::frame;
use sdk::ClientOptions;
use tokio::time::{Interval, MissedTickBehavior, Sleep};
use tokio_tungstenite::tungstenite::Message;

use super::clock::Pacer;
use super::inflight::InFlight;
use super::schedule::{Payload, Plan};
use super::stats::{Answer, Recorder, Tally};

type Ws = sdk::WebSocket;

/// How long closing a client may take at the end.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the connection ended, as the requests it cut are counted.
const CLOSED: &str = "closed";
const KICKED: &str = "kicked";
const PROTOCOL: &str = "protocol";

/// How a client speaks: the gate's protocol in protobuf or JSON (typed bodies the gate
/// transcodes), or pomelo's (to the gate's pomelo codec or a pomelo server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Codec {
    #[default]
    Protobuf,
    Json,
    Pomelo,
}

/// What every client's task of a run is given, besides its pacer and recorder.
#[derive(Clone)]
pub struct ClientRun {
    pub plan: Plan,
    pub route: Arc<str>,
    pub payload: Arc<Payload>,
    /// Client-side request timeout.
    pub timeout: Duration,
    pub hard_deadline: Instant,
}

/// A connection that has handshaken, ready to drive.
pub struct Conn {
    ws: Ws,
    codec: Codec,
    /// How often to send a heartbeat: the gate's interval, as the SDK does.
    heartbeat: Option<Duration>,
}

impl Conn {
    /// Opens a WebSocket to `url` as the SDK does (`wss://` trusting `options.tls`) and
    /// handshakes in `codec`, all within `options.connect_timeout`.
    pub async fn connect(url: &str, options: &ClientOptions, codec: Codec) -> anyhow::Result<Conn> {
        let mut options = options.clone();
        options.json = codec == Codec::Json;
        let (ws, heartbeat) = if codec == Codec::Pomelo {
            let opening =
                async { pomelo_handshake(sdk::open_websocket(url, &options).await?).await };
            let timeout = options.connect_timeout;
            let opened = tokio::time::timeout(timeout, opening).await;
            let opened =
                opened.map_err(|_| anyhow!("{url}: no handshake answer within {timeout:?}"))?;
            (opened.context(url.to_owned())?, None)
        } else {
            let (ws, ack) = sdk::dial(url, &options).await.context(url.to_owned())?;
            let beat = Duration::from_millis(u64::from(ack.heartbeat_ms));
            (ws, (ack.heartbeat_ms > 0).then_some(beat))
        };
        Ok(Conn {
            ws,
            codec,
            heartbeat,
        })
    }
}

/// A pomelo handshake; heartbeats are the server's to send ([`on_pomelo`] answers them).
async fn pomelo_handshake(mut ws: Ws) -> anyhow::Result<Ws> {
    let hello = br#"{"sys":{"type":"shaddock-loadtest","version":"0.0.1"},"user":{}}"#;
    let hello = wire::encode_package(PackageType::Handshake, hello);
    ws.send(Message::Binary(hello)).await?;
    let answer = loop {
        match ws.next().await {
            Some(Ok(Message::Binary(b))) => break b,
            Some(Ok(_)) => {}
            other => bail!("no handshake answer: {other:?}"),
        }
    };
    let Ok(Some((package, _))) = wire::parse_package(&answer, wire::MAX_BODY_LEN) else {
        bail!("the handshake answer is not a pomelo package");
    };
    let json: serde_json::Value = serde_json::from_slice(&package.body)?;
    anyhow::ensure!(json["code"] == 200, "handshake refused: {json}");
    let ack = wire::encode_package(PackageType::HandshakeAck, &[]);
    ws.send(Message::Binary(ack)).await?;
    Ok(ws)
}

/// Runs one client until its last request ended or the hard deadline passed.
pub async fn drive(conn: Conn, run: ClientRun, mut pacer: Pacer, mut rec: Recorder) -> Tally {
    let (plan, timeout, hard_deadline) = (run.plan, run.timeout, run.hard_deadline);
    let mut heartbeat = conn.heartbeat.map(|period| {
        let mut interval = tokio::time::interval_at((Instant::now() + period).into(), period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    let mut link = Link::new(Some(conn.ws), conn.codec, run.route);
    // Set to the oldest waiting request's deadline or earlier whenever one waits.
    let expiry = tokio::time::sleep_until(hard_deadline.into());
    tokio::pin!(expiry);
    let mut armed = false;
    let hard = tokio::time::sleep_until(hard_deadline.into());
    tokio::pin!(hard);
    let mut next = 0u64;
    loop {
        // Checked here, not only by the `hard` branch: under overload a frame is always
        // ready and a biased select would never reach that branch.
        if (next >= plan.end && link.in_flight.is_empty()) || Instant::now() >= hard_deadline {
            break;
        }
        tokio::select! {
            // Due slots first: they come once per interval, so they cannot starve the
            // answers, while a stream of answers could starve them.
            biased;
            due = pacer.wait_due(&plan.schedule, next), if next < plan.end => {
                let due = due.min(plan.end);
                link.send(next..due, &run.payload, &mut rec);
                next = due;
                if !armed {
                    armed = arm(expiry.as_mut(), &link.in_flight, timeout);
                }
            }
            why = std::future::poll_fn(|cx| link.poll_io(cx, &mut rec)), if link.is_open() => {
                link.cut(why, &mut rec);
            }
            () = &mut expiry, if armed => {
                link.expire(timeout, &mut rec);
                armed = arm(expiry.as_mut(), &link.in_flight, timeout);
            }
            () = tick(&mut heartbeat), if link.is_open() => link.heartbeat(),
            () = &mut hard => break,
        }
    }
    let tally = rec.finish();
    link.close().await;
    tally
}

/// Sets `expiry` to the oldest waiting request's deadline; false when none waits.
fn arm(expiry: Pin<&mut Sleep>, in_flight: &InFlight, timeout: Duration) -> bool {
    let oldest = in_flight.oldest();
    if let Some((_, sent)) = oldest {
        expiry.reset((sent + timeout).into());
    }
    oldest.is_some()
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => _ = interval.tick().await,
        None => std::future::pending().await,
    }
}

/// One client's side of its connection.
#[derive(Default)]
struct Link {
    /// `None` once the connection ended.
    ws: Option<Ws>,
    /// Why it ended: every later slot fails the same way.
    ended: Option<&'static str>,
    codec: Codec,
    /// Frames not yet in the WebSocket's buffer (it was still writing out older ones).
    outbox: VecDeque<Message>,
    /// Frames in the WebSocket's buffer since the last completed flush.
    unflushed: bool,
    in_flight: InFlight,
    route: Arc<str>,
}

impl Link {
    fn new(ws: Option<Ws>, codec: Codec, route: Arc<str>) -> Self {
        Link {
            ws,
            codec,
            route,
            ..Link::default()
        }
    }

    fn is_open(&self) -> bool {
        self.ws.is_some()
    }

    /// Sends slots `slots`, or fails them at once when the connection is gone.
    fn send(&mut self, slots: Range<u64>, payload: &Payload, rec: &mut Recorder) {
        let now = Instant::now();
        rec.sent(slots.clone());
        for slot in slots {
            if let Some(why) = self.ended {
                rec.end(slot, now, now, Answer::Failed(why));
            } else if let Some(frame) = self.encode(slot + 1, &payload.body(slot)) {
                self.outbox.push_back(frame);
                self.in_flight.push(slot, now);
            } else {
                // Counted as failed, never sent as something else.
                rec.end(slot, now, now, Answer::Failed("the body is not JSON"));
            }
        }
    }

    /// `Packet{request: Request{id, route, body}}` in the session's encoding, by the
    /// protocol's one encoder ([`proto::frame`]). A JSON session's bodies are JSON
    /// values, as the SDK sends typed bodies: `None` for one that is not.
    fn encode(&self, id: u64, body: &[u8]) -> Option<Message> {
        let route = &*self.route;
        Some(match self.codec {
            Codec::Protobuf => Message::Binary(frame::request(id, route, "", body)),
            Codec::Json => Message::text(frame::request_json(id, route, "", body).ok()?),
            Codec::Pomelo => Message::Binary(wire::encode_message(&wire::Message {
                kind: MessageKind::Request(id),
                route: Route::Name(route),
                error: false,
                gzip: false,
                body,
            })),
        })
    }

    fn heartbeat(&mut self) {
        self.outbox.push_back(match self.codec {
            Codec::Json => Message::text(frame::HEARTBEAT_JSON),
            _ => Message::Binary(frame::HEARTBEAT),
        });
    }

    /// Writes the outbox and flushes, then handles every frame the socket holds.
    /// Ready with the reason when the connection ended.
    fn poll_io(&mut self, cx: &mut Context<'_>, rec: &mut Recorder) -> Poll<&'static str> {
        let Some(ws) = self.ws.as_mut() else {
            return Poll::Ready(CLOSED);
        };
        loop {
            while !self.outbox.is_empty() {
                match ws.poll_ready_unpin(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => return Poll::Ready(CLOSED),
                    Poll::Pending => break,
                }
                if let Some(frame) = self.outbox.pop_front()
                    && ws.start_send_unpin(frame).is_err()
                {
                    return Poll::Ready(CLOSED);
                }
                self.unflushed = true;
            }
            if self.unflushed {
                match ws.poll_flush_unpin(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(_)) => return Poll::Ready(CLOSED),
                    Poll::Pending => {}
                }
            }
            loop {
                let frame = match ws.poll_next_unpin(cx) {
                    Poll::Ready(Some(Ok(frame))) => frame,
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(CLOSED),
                    Poll::Pending => return Poll::Pending,
                };
                let handled = match self.codec {
                    Codec::Pomelo => on_pomelo(frame, &mut self.in_flight, rec),
                    _ => on_frame(frame, &mut self.in_flight, rec),
                };
                match handled {
                    Ok(Handled::Done) => {}
                    Ok(Handled::Reply(frame)) => {
                        self.outbox.push_back(frame);
                        break;
                    }
                    // A ping's pong waits in the WebSocket's buffer: flush it.
                    Ok(Handled::Pong) => {
                        self.unflushed = true;
                        break;
                    }
                    Err(why) => return Poll::Ready(why),
                }
            }
        }
    }

    /// The connection ended: the requests in flight fail with `why`.
    fn cut(&mut self, why: &'static str, rec: &mut Recorder) {
        self.ws = None;
        self.ended = Some(why);
        self.outbox.clear();
        let now = Instant::now();
        for (slot, sent) in self.in_flight.drain() {
            rec.end(slot, sent, now, Answer::Failed(why));
        }
    }

    /// Requests waiting `timeout` or longer become timeouts.
    fn expire(&mut self, timeout: Duration, rec: &mut Recorder) {
        let now = Instant::now();
        while let Some((slot, sent)) = self.in_flight.pop_expired(now, timeout) {
            rec.end(slot, sent, now, Answer::Timeout);
        }
    }

    /// Says goodbye to the server, if it is still there.
    async fn close(self) {
        if let Some(mut ws) = self.ws {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, ws.close(None)).await;
        }
    }
}

/// What a frame needed.
enum Handled {
    Done,
    /// A ping: the pong is queued and needs a flush.
    Pong,
    /// This frame is to be sent back (a pomelo heartbeat's).
    Reply(Message),
}

/// A frame handled, or why it ended the connection.
type Handling = Result<Handled, &'static str>;

/// A response ends its request; a kick, a close or a bad frame ends the connection.
fn on_frame(frame: Message, in_flight: &mut InFlight, rec: &mut Recorder) -> Handling {
    match frame {
        Message::Binary(_) | Message::Text(_) => {}
        Message::Close(_) => return Err(CLOSED),
        Message::Ping(_) => return Ok(Handled::Pong),
        Message::Pong(_) | Message::Frame(_) => return Ok(Handled::Done),
    }
    let received = Instant::now();
    match sdk::frame::decode(&frame).and_then(|p| p.kind) {
        Some(Kind::Response(response)) => {
            let answer = Answer::response(response.code, response.timing, response.message);
            answered(in_flight, rec, response.id, received, answer);
        }
        Some(Kind::Kick(_)) => return Err(KICKED),
        None => return Err(PROTOCOL),
        // Pushes, heartbeats, drains: nothing the load waits for.
        Some(_) => {}
    }
    Ok(Handled::Done)
}

/// One pomelo frame: responses end requests (the error flag or an error `code` in the
/// body counts as 500), heartbeats are answered, a kick or bad frame ends the link.
fn on_pomelo(frame: Message, in_flight: &mut InFlight, rec: &mut Recorder) -> Handling {
    let received = Instant::now();
    let Message::Binary(bytes) = frame else {
        return match frame {
            Message::Close(_) => Err(CLOSED),
            Message::Ping(_) => Ok(Handled::Pong),
            _ => Ok(Handled::Done),
        };
    };
    let packages = wire::parse_packages(bytes, wire::MAX_BODY_LEN).map_err(|_| PROTOCOL)?;
    let mut handled = Handled::Done;
    for package in packages {
        match package.kind {
            PackageType::Heartbeat => {
                let beat = wire::encode_package(PackageType::Heartbeat, &[]);
                handled = Handled::Reply(Message::Binary(beat));
            }
            PackageType::Data => {
                let message = wire::parse_message(&package.body).map_err(|_| PROTOCOL)?;
                let MessageKind::Response(id) = message.kind else {
                    continue;
                };
                let failed = message.error || pomelo_error(message.body);
                let code = if failed { HANDLER_ERROR } else { OK };
                let answer = Answer::response(code, None, String::new());
                answered(in_flight, rec, id, received, answer);
            }
            PackageType::Kick => return Err(KICKED),
            _ => {}
        }
    }
    Ok(handled)
}

/// Request `id` (slot + 1, so never 0) got `answer`, unless answered or timed out already.
fn answered(in_flight: &mut InFlight, rec: &mut Recorder, id: u64, at: Instant, answer: Answer) {
    if let Some(slot) = id.checked_sub(1)
        && let Some(sent) = in_flight.take(slot)
    {
        rec.end(slot, sent, at, answer);
    }
}

/// Pomelo answers a failed request with a body `{"code": <not 200>, ...}`.
fn pomelo_error(body: &[u8]) -> bool {
    // Echoed bodies are small; only an object with a `code` can be an error.
    body.windows(6).any(|w| w == b"\"code\"")
        && serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("code")?.as_u64())
            .is_some_and(|code| code != 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::Message as _;

    #[test]
    fn requests_are_the_protocols_frames_in_the_sessions_encoding() {
        let link = |codec| Link::new(None, codec, Arc::from("chat.members"));
        let Some(Message::Binary(frame)) = link(Codec::Protobuf).encode(43, b"Hello World #0042")
        else {
            panic!("not binary")
        };
        let packet = proto::client::Packet::decode(frame).expect("protobuf");
        let Some(Kind::Request(request)) = packet.kind else {
            panic!("not a request")
        };
        let sent = (request.id, request.route.as_str(), &request.body[..]);
        assert_eq!(sent, (43, "chat.members", &b"Hello World #0042"[..]));
        let Some(Message::Text(frame)) = link(Codec::Json).encode(1, br#"{"room":"a"}"#) else {
            panic!("not text")
        };
        let json = r#"{"request":{"id":1,"route":"chat.members","body":{"room":"a"}}}"#;
        assert_eq!(frame.as_str(), json);
        let not_json = link(Codec::Json).encode(2, b"Hello World");
        let why = "a JSON session's body that is not JSON is not sent";
        assert!(not_json.is_none(), "{why}");
    }

    #[test]
    fn only_a_pomelo_code_other_than_200_is_an_error() {
        assert!(pomelo_error(br#"{"code":500,"msg":"x"}"#));
        assert!(!pomelo_error(br#"{"code":200}"#));
        assert!(!pomelo_error(br#"{"msg":"Hello World"}"#));
        assert!(!pomelo_error(b"not json \"code\""));
    }
}
