//! A fake gate for the SDK's tests: a tokio-tungstenite server on port 0 that speaks
//! just enough of the protocol, with routes that make it misbehave on demand.
//!
//! Fake routes: `echo.echo` echoes; `echo.reverse` holds requests until it has
//! [`REVERSE_BATCH`] and answers them newest first; `echo.slow` never answers;
//! `echo.fail` answers 500; `echo.json` answers in a text frame; `push.me` pushes the
//! body on `chat.msg`, then echoes; `kick.me` kicks with the body as the reason;
//! `drop.me` drops the TCP connection without a word; `garble.me` sends a binary frame
//! that is no packet. Notifies (id 0) are reported as events and answered with a stray
//! response, which the client must ignore.
//!
//! Draining, as a real gate does it: `drain.me` sends a `Drain` packet (the body is its
//! reason) and echoes; from then on the session answers every request with 503
//! `gate draining` at once, except `hold.me`, which is held (as if forwarded) until the
//! test sends [`Control::Release`]: then the session pushes `released` on `chat.msg`
//! and echoes each held request. [`Control::Kick`] kicks and closes every session, as a
//! gate does when its grace ends.
//!
//! Resuming ([`resuming_gate`]), as a real gate does it, with one difference on purpose:
//! a session that asks is numbered (every push and response gets a `seq`, kept until
//! acknowledged), its ack carries a token, and a dropped link keeps it for a handshake
//! with that token, which replays what the client missed and *also the frame at the
//! client's `last_seq`*, a repeat the client must drop. A request id the session has
//! answered is answered again, with the same `seq`; one it holds waits for its answer.
//! `cut.me` numbers N pushes on `chat.msg` (the body is N in decimal, empty for 0; their
//! bodies are 1 to N) and its answer, writes the first half of the pushes only, and drops
//! the link without a word; `push.many` pushes N (as `cut.me`), then answers. `drop.me`
//! ends the session as it drops the link, so a resume finds nothing (404).

mod resume;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use proto::client::{
    Drain, Handshake, HandshakeAck, Heartbeat, Kick, Packet, Push, Request, Response, packet::Kind,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::super::DRAINING_MESSAGE;
use resume::{Kept, Numbered};

pub(super) const REVERSE_BATCH: usize = 16;

#[derive(Debug, PartialEq)]
pub(super) enum Event {
    Notify {
        route: String,
        body: Bytes,
    },
    Heartbeat {
        session: u64,
    },
    /// A `hold.me` request is held.
    Held {
        session: u64,
    },
    /// A draining session answered `route` with 503 `gate draining`.
    Refused {
        session: u64,
        route: String,
    },
    /// A session that drained has ended (the client closed it, or a kick).
    Ended {
        session: u64,
    },
    /// A resumable session's client acknowledged frames up to `seq`.
    Ack {
        session: u64,
        seq: u64,
    },
    /// A resumed session replayed its frames from `first` to `last` (`seq`s).
    Replayed {
        session: u64,
        first: u64,
        last: u64,
    },
    /// A resumed session got request `id` again (answered already, or held).
    Resent {
        session: u64,
        id: u64,
    },
}

/// What the test tells every session of a fake gate.
#[derive(Debug, Clone)]
pub(super) enum Control {
    /// Answer the held `hold.me` requests (after a push).
    Release,
    /// Kick with this reason and close.
    Kick(String),
    /// Go silent: keep the socket open, but answer nothing more (a gate cut off by a
    /// network that lost the link without a reset).
    Silence,
}

pub(super) struct FakeGate {
    pub(super) url: String,
    pub(super) events: mpsc::Receiver<Event>,
    pub(super) connections: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
    control: broadcast::Sender<Control>,
    admit: watch::Sender<bool>,
}

impl FakeGate {
    /// Closes the listening socket: reconnections are refused from now on.
    pub(super) async fn stop_accepting(&mut self) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
    }

    /// While false, new connections get their WebSocket but wait for the handshake ack.
    pub(super) fn admit(&self, admit: bool) {
        self.admit.send_replace(admit);
    }

    pub(super) fn control(&self, control: Control) {
        let _ = self.control.send(control);
    }
}

/// A fake gate whose first session is number 1.
pub(super) async fn fake_gate(heartbeat_ms: u32) -> FakeGate {
    fake_gate_from(heartbeat_ms, 1).await
}

/// A fake gate numbering its sessions from `first_session`.
pub(super) async fn fake_gate_from(heartbeat_ms: u32, first_session: u64) -> FakeGate {
    start(heartbeat_ms, first_session, None).await
}

/// A fake gate whose first session is number 1, keeping the sessions that ask for it
/// for resuming.
pub(super) async fn resuming_gate(heartbeat_ms: u32) -> FakeGate {
    start(heartbeat_ms, 1, Some(Kept::default())).await
}

async fn start(heartbeat_ms: u32, first_session: u64, kept: Option<Kept>) -> FakeGate {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let (events, rx) = mpsc::channel(1024);
    let (control, _) = broadcast::channel(16);
    let admit = watch::Sender::new(true);
    let connections = Arc::new(AtomicU64::new(0));
    let session = Session {
        id: 0,
        heartbeat_ms,
        events,
        control: control.clone(),
        admit: admit.clone(),
        kept,
    };
    let count = connections.clone();
    let accept = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let session = Session {
                id: first_session + n,
                ..session.clone()
            };
            tokio::spawn(session.serve(stream));
        }
    });
    FakeGate {
        url,
        events: rx,
        connections,
        accept,
        control,
        admit,
    }
}

pub(super) fn frame(kind: Kind) -> Message {
    crate::frame::encode(&Packet::new(kind), false)
}

pub(super) fn response(id: u64, code: u32, body: Bytes) -> Kind {
    Kind::Response(Response {
        id,
        code,
        body,
        ..Response::default()
    })
}

#[derive(Clone)]
struct Session {
    id: u64,
    heartbeat_ms: u32,
    events: mpsc::Sender<Event>,
    control: broadcast::Sender<Control>,
    admit: watch::Sender<bool>,
    /// `Some` on a resuming gate.
    kept: Option<Kept>,
}

type Ws = WebSocketStream<TcpStream>;

/// What a session does after a request.
enum Flow {
    Go,
    /// Close: the session is over.
    End,
    /// Drop the link without a word; a resumable session is kept for resuming.
    Cut,
}

impl Session {
    async fn serve(self, stream: TcpStream) {
        let mut control = self.control.subscribe();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        let Some(Ok(Message::Binary(hello))) = ws.next().await else {
            return;
        };
        let Some(Kind::Handshake(hello)) = proto::frame::decode_binary(hello).unwrap().kind else {
            panic!("first frame is not a handshake");
        };
        let _ = self.admit.subscribe().wait_for(|admit| *admit).await;
        if hello.token == "bad" {
            let ack = HandshakeAck {
                code: 401,
                message: "bad token".into(),
                ..HandshakeAck::default()
            };
            ws.send(frame(Kind::HandshakeAck(ack))).await.unwrap();
            let _ = ws.close(None).await;
            return;
        }
        let (mut state, resume_code) = self.open(&hello);
        let resume_token = match (&self.kept, &state.numbered) {
            (Some(kept), Some(_)) => kept.token(),
            _ => String::new(),
        };
        let ack = HandshakeAck {
            code: 200,
            session_id: state.session,
            heartbeat_ms: self.heartbeat_ms,
            resume_token: resume_token.clone(),
            resume_code,
            last_seq: state.numbered.as_ref().map_or(0, |n| n.last),
            ..HandshakeAck::default()
        };
        ws.send(frame(Kind::HandshakeAck(ack))).await.unwrap();
        // The gate may heartbeat too; the client ignores it.
        ws.send(frame(Kind::Heartbeat(Heartbeat {}))).await.unwrap();
        if resume_code == proto::code::OK {
            self.replay(&mut ws, &state, hello.last_seq).await;
        }
        let flow = loop {
            let message = tokio::select! {
                message = ws.next() => message,
                Ok(control) = control.recv() => {
                    if self.on_control(&mut ws, &mut state, control).await {
                        break Flow::End;
                    }
                    continue;
                }
            };
            let bytes = match message {
                Some(Ok(Message::Binary(bytes))) => bytes,
                Some(Ok(Message::Close(_))) => break Flow::End,
                Some(Ok(_)) => continue,
                // The client's link dropped: a resumable session waits for it.
                Some(Err(_)) | None => break Flow::Cut,
            };
            let request = match proto::frame::decode_binary(bytes).unwrap().kind {
                Some(Kind::Heartbeat(_)) => {
                    let _ = self.events.try_send(Event::Heartbeat {
                        session: state.session,
                    });
                    // A gate answers every heartbeat (docs/protocol.md, "Heartbeat").
                    if !state.silent {
                        ws.send(frame(Kind::Heartbeat(Heartbeat {}))).await.unwrap();
                    }
                    continue;
                }
                Some(Kind::Ack(ack)) => {
                    // A real gate closes a session that is not resumable (nor knows
                    // resume) on an ack: the client must not send one.
                    let Some(numbered) = &mut state.numbered else {
                        panic!("an ack on a session that is not resumable");
                    };
                    numbered.acked(ack.seq);
                    let _ = self.events.try_send(Event::Ack {
                        session: state.session,
                        seq: ack.seq,
                    });
                    continue;
                }
                // Silent: nothing is answered.
                Some(Kind::Request(_)) if state.silent => continue,
                Some(Kind::Request(request)) => request,
                other => panic!("unexpected packet {other:?}"),
            };
            match self.on_request(&mut ws, &mut state, request).await {
                Flow::Go => {}
                flow => break flow,
            }
        };
        if state.drained {
            let _ = self.events.try_send(Event::Ended {
                session: state.session,
            });
        }
        if let (Flow::Cut, Some(kept), false) = (flow, &self.kept, resume_token.is_empty()) {
            kept.keep(resume_token, state);
        }
    }

    /// The session a handshake opens, and its `resume_code`: the one its token names if
    /// this gate keeps it, else a fresh one.
    fn open(&self, hello: &Handshake) -> (State, u32) {
        let fresh = || State {
            session: self.id,
            numbered: (hello.resumable && self.kept.is_some()).then(Numbered::default),
            ..State::default()
        };
        if hello.resume_token.is_empty() {
            return (fresh(), 0);
        }
        match self.kept.as_ref().and_then(|k| k.take(&hello.resume_token)) {
            Some(state) => (state, proto::code::OK),
            None => (fresh(), proto::code::NOT_FOUND),
        }
    }

    /// Sends the kept frames from the client's `last_seq` on: the one at `last_seq` is a
    /// repeat, on purpose.
    async fn replay(&self, ws: &mut Ws, state: &State, last_seq: u64) {
        let Some(numbered) = &state.numbered else {
            return;
        };
        let frames: Vec<_> = numbered.from(last_seq).collect();
        for (_, message) in &frames {
            ws.feed(message.clone()).await.unwrap();
        }
        ws.flush().await.unwrap();
        if let (Some((first, _)), Some((last, _))) = (frames.first(), frames.last()) {
            let _ = self.events.try_send(Event::Replayed {
                session: state.session,
                first: *first,
                last: *last,
            });
        }
    }

    /// Handles a test's order; true when the session is over.
    async fn on_control(&self, ws: &mut Ws, state: &mut State, control: Control) -> bool {
        match control {
            Control::Release => {
                if !state.held.is_empty() {
                    let released = push(Bytes::from_static(b"released"));
                    ws.feed(state.out(released)).await.unwrap();
                    for r in std::mem::take(&mut state.held) {
                        ws.feed(state.out(response(r.id, 200, r.body)))
                            .await
                            .unwrap();
                    }
                    ws.flush().await.unwrap();
                }
                false
            }
            Control::Kick(reason) => {
                let _ = ws.send(frame(Kind::Kick(Kick { reason }))).await;
                let _ = ws.close(None).await;
                true
            }
            Control::Silence => {
                state.silent = true;
                false
            }
        }
    }

    /// Answers a request.
    async fn on_request(&self, ws: &mut Ws, state: &mut State, request: Request) -> Flow {
        let Request {
            id, route, body, ..
        } = request.clone();
        if id == 0 {
            let _ = self.events.try_send(Event::Notify { route, body });
            let stray = state.out(response(0, 200, Bytes::from_static(b"stray")));
            ws.send(stray).await.unwrap();
            return Flow::Go;
        }
        if let Some(answer) = state.resent(id) {
            let _ = self.events.try_send(Event::Resent {
                session: state.session,
                id,
            });
            if let Some(answer) = answer {
                ws.send(answer).await.unwrap();
            }
            return Flow::Go;
        }
        if route == "hold.me" {
            state.held.push(request);
            let _ = self.events.try_send(Event::Held {
                session: state.session,
            });
            return Flow::Go;
        }
        if state.drained {
            let refused = Response {
                id,
                code: proto::code::UNAVAILABLE,
                message: DRAINING_MESSAGE.into(),
                ..Response::default()
            };
            ws.send(state.out(Kind::Response(refused))).await.unwrap();
            let _ = self.events.try_send(Event::Refused {
                session: state.session,
                route,
            });
            return Flow::Go;
        }
        match route.as_str() {
            "echo.echo" => ws.send(state.out(response(id, 200, body))).await.unwrap(),
            "echo.reverse" => {
                state.held.push(request);
                if state.held.len() == REVERSE_BATCH {
                    for r in std::mem::take(&mut state.held).into_iter().rev() {
                        ws.feed(state.out(response(r.id, 200, r.body)))
                            .await
                            .unwrap();
                    }
                    ws.flush().await.unwrap();
                }
            }
            "echo.slow" => {}
            "echo.fail" => {
                let failed = Response {
                    id,
                    code: 500,
                    message: "boom".into(),
                    ..Response::default()
                };
                ws.send(state.out(Kind::Response(failed))).await.unwrap();
            }
            "echo.json" => {
                let json = state.number(response(id, 200, body), true);
                ws.send(json).await.unwrap();
            }
            "push.me" => {
                ws.send(state.out(push(body.clone()))).await.unwrap();
                ws.send(state.out(response(id, 200, body))).await.unwrap();
            }
            "push.many" => {
                for n in 1..=count(&body) {
                    ws.feed(state.out(push(n.to_string().into())))
                        .await
                        .unwrap();
                }
                ws.send(state.out(response(id, 200, body))).await.unwrap();
            }
            "cut.me" => {
                let n = count(&body);
                for i in 1..=n {
                    let message = state.out(push(i.to_string().into()));
                    if i <= n / 2 {
                        ws.feed(message).await.unwrap();
                    }
                }
                state.out(response(id, 200, body));
                ws.flush().await.unwrap();
                return Flow::Cut;
            }
            "drain.me" => {
                let reason = String::from_utf8(body.to_vec()).unwrap();
                let drain = Drain {
                    reason,
                    grace_ms: 30_000,
                };
                ws.send(frame(Kind::Drain(drain))).await.unwrap();
                state.drained = true;
                ws.send(state.out(response(id, 200, body))).await.unwrap();
            }
            "kick.me" => {
                let reason = String::from_utf8(body.to_vec()).unwrap();
                ws.send(frame(Kind::Kick(Kick { reason }))).await.unwrap();
                let _ = ws.close(None).await;
                return Flow::End;
            }
            "close.me" => {
                let reason = String::from_utf8(body.to_vec()).unwrap();
                let close = CloseFrame {
                    code: CloseCode::Away,
                    reason: reason.into(),
                };
                let _ = ws.close(Some(close)).await;
                return Flow::End;
            }
            "drop.me" => return Flow::End,
            "garble.me" => ws.send(Message::binary(vec![0xff, 0xff])).await.unwrap(),
            other => panic!("the fake gate has no route {other}"),
        }
        Flow::Go
    }
}

fn push(body: Bytes) -> Kind {
    Kind::Push(Push {
        route: "chat.msg".into(),
        body,
        seq: 0,
    })
}

/// The count a `push.many` or `cut.me` body names.
fn count(body: &[u8]) -> u64 {
    std::str::from_utf8(body).unwrap().parse().unwrap_or(0)
}

/// A session's state: what it holds, whether it drained, its numbering if resumable.
#[derive(Default)]
struct State {
    session: u64,
    held: Vec<Request>,
    drained: bool,
    numbered: Option<Numbered>,
    /// Told to go silent ([`Control::Silence`]).
    silent: bool,
}

impl State {
    /// A push or response as a binary frame, numbered and kept if the session is
    /// resumable.
    fn out(&mut self, kind: Kind) -> Message {
        self.number(kind, false)
    }

    /// [`State::out`] in either encoding.
    fn number(&mut self, kind: Kind, text: bool) -> Message {
        match &mut self.numbered {
            Some(numbered) => numbered.number(kind, text),
            None => crate::frame::encode(&Packet::new(kind), text),
        }
    }

    /// For a request id the session has seen: `Some(Some(answer))` if it answered it
    /// (the same frame again), `Some(None)` if it holds it; `None` for a new id.
    fn resent(&self, id: u64) -> Option<Option<Message>> {
        let numbered = self.numbered.as_ref()?;
        if let Some(answer) = numbered.answer(id) {
            return Some(Some(answer));
        }
        self.held.iter().any(|r| r.id == id).then_some(None)
    }
}
