//! A fake gate for the SDK's tests: a tokio-tungstenite server on port 0 that speaks
//! just enough of the protocol, with routes that make it misbehave on demand.
//!
//! Fake routes: `echo.echo` echoes; `echo.reverse` holds requests until it has
//! [`REVERSE_BATCH`] and answers them newest first; `echo.slow` never answers;
//! `echo.fail` answers 500; `echo.json` answers in a text frame; `push.me` pushes the
//! body on `chat.msg`, then echoes; `kick.me` kicks with the body as the reason;
//! `drop.me` drops the TCP connection without a word. Notifies (id 0) are reported as
//! events and answered with a stray response, which the client must ignore.
//!
//! Draining, as a real gate does it: `drain.me` sends a `Drain` packet (the body is its
//! reason) and echoes; from then on the session answers every request with 503
//! `gate draining` at once, except `hold.me`, which is held (as if forwarded) until the
//! test sends [`Control::Release`]: then the session pushes `released` on `chat.msg`
//! and echoes each held request. [`Control::Kick`] kicks and closes every session, as a
//! gate does when its grace ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use proto::client::{
    Drain, HandshakeAck, Heartbeat, Kick, Packet, Push, Request, Response, packet::Kind,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::super::DRAINING_MESSAGE;

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
}

/// What the test tells every session of a fake gate.
#[derive(Debug, Clone)]
pub(super) enum Control {
    /// Answer the held `hold.me` requests (after a push).
    Release,
    /// Kick with this reason and close.
    Kick(String),
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
}

type Ws = WebSocketStream<TcpStream>;

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
        let refused = hello.token == "bad";
        let ack = HandshakeAck {
            code: if refused { 401 } else { 200 },
            session_id: self.id,
            heartbeat_ms: self.heartbeat_ms,
            message: if refused {
                "bad token".into()
            } else {
                String::new()
            },
            ..HandshakeAck::default()
        };
        ws.send(frame(Kind::HandshakeAck(ack))).await.unwrap();
        if refused {
            let _ = ws.close(None).await;
            return;
        }
        // The gate may heartbeat too; the client ignores it.
        ws.send(frame(Kind::Heartbeat(Heartbeat {}))).await.unwrap();
        let mut state = State::default();
        loop {
            let message = tokio::select! {
                message = ws.next() => message,
                Ok(control) = control.recv() => {
                    if self.on_control(&mut ws, &mut state, control).await {
                        break;
                    }
                    continue;
                }
            };
            let Some(Ok(message)) = message else { break };
            let Message::Binary(bytes) = message else {
                continue;
            };
            let request = match proto::frame::decode_binary(bytes).unwrap().kind {
                Some(Kind::Heartbeat(_)) => {
                    let _ = self.events.try_send(Event::Heartbeat { session: self.id });
                    continue;
                }
                Some(Kind::Request(request)) => request,
                other => panic!("unexpected packet {other:?}"),
            };
            if !self.on_request(&mut ws, &mut state, request).await {
                break;
            }
        }
        if state.drained {
            let _ = self.events.try_send(Event::Ended { session: self.id });
        }
    }

    /// Handles a test's order; true when the session is over.
    async fn on_control(&self, ws: &mut Ws, state: &mut State, control: Control) -> bool {
        match control {
            Control::Release => {
                if !state.held.is_empty() {
                    let push = Push {
                        route: "chat.msg".into(),
                        body: Bytes::from_static(b"released"),
                        seq: 0,
                    };
                    ws.feed(frame(Kind::Push(push))).await.unwrap();
                    for r in state.held.drain(..) {
                        ws.feed(frame(response(r.id, 200, r.body))).await.unwrap();
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
        }
    }

    /// Answers a request; false when the session is over.
    async fn on_request(&self, ws: &mut Ws, state: &mut State, request: Request) -> bool {
        let Request {
            id, route, body, ..
        } = request.clone();
        if id == 0 {
            let _ = self.events.try_send(Event::Notify { route, body });
            ws.send(frame(response(0, 200, Bytes::from_static(b"stray"))))
                .await
                .unwrap();
            return true;
        }
        if route == "hold.me" {
            state.held.push(request);
            let _ = self.events.try_send(Event::Held { session: self.id });
            return true;
        }
        if state.drained {
            let refused = Response {
                id,
                code: proto::code::UNAVAILABLE,
                message: DRAINING_MESSAGE.into(),
                ..Response::default()
            };
            ws.send(frame(Kind::Response(refused))).await.unwrap();
            let _ = self.events.try_send(Event::Refused {
                session: self.id,
                route,
            });
            return true;
        }
        match route.as_str() {
            "echo.echo" => ws.send(frame(response(id, 200, body))).await.unwrap(),
            "echo.reverse" => {
                state.held.push(request);
                if state.held.len() == REVERSE_BATCH {
                    for r in state.held.drain(..).rev() {
                        ws.feed(frame(response(r.id, 200, r.body))).await.unwrap();
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
                ws.send(frame(Kind::Response(failed))).await.unwrap();
            }
            "echo.json" => {
                let packet = Packet::new(response(id, 200, body));
                ws.send(crate::frame::encode(&packet, true)).await.unwrap();
            }
            "push.me" => {
                let push = Push {
                    route: "chat.msg".into(),
                    body: body.clone(),
                    seq: 0,
                };
                ws.send(frame(Kind::Push(push))).await.unwrap();
                ws.send(frame(response(id, 200, body))).await.unwrap();
            }
            "drain.me" => {
                let reason = String::from_utf8(body.to_vec()).unwrap();
                let drain = Drain {
                    reason,
                    grace_ms: 30_000,
                };
                ws.send(frame(Kind::Drain(drain))).await.unwrap();
                state.drained = true;
                ws.send(frame(response(id, 200, body))).await.unwrap();
            }
            "kick.me" => {
                let reason = String::from_utf8(body.to_vec()).unwrap();
                ws.send(frame(Kind::Kick(Kick { reason }))).await.unwrap();
                let _ = ws.close(None).await;
                return false;
            }
            "drop.me" => return false,
            other => panic!("the fake gate has no route {other}"),
        }
        true
    }
}

/// A session's state: what it holds, whether it drained.
#[derive(Default)]
struct State {
    held: Vec<Request>,
    drained: bool,
}
