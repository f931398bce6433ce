//! The SDK against a fake gate: a tokio-tungstenite server on port 0 that speaks just
//! enough of the protocol, with routes that make it misbehave on demand.
//!
//! Fake routes: `echo.echo` echoes; `echo.reverse` holds requests until it has
//! [`REVERSE_BATCH`] and answers them newest first; `echo.slow` never answers;
//! `echo.fail` answers 500; `echo.json` answers in a text frame; `push.me` pushes the
//! body on `chat.msg`, then echoes; `kick.me` kicks with the body as the reason;
//! `drop.me` drops the TCP connection without a word. Notifies (id 0) are reported as
//! events and answered with a stray response, which the client must ignore.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt, future::join_all};
use proto::Message as _;
use proto::client::{HandshakeAck, Heartbeat, Kick, Packet, Request, packet::Kind};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::*;

const REVERSE_BATCH: usize = 16;
/// A deadline for conditions the tests wait on: generous, never slept.
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq)]
enum Event {
    Notify { route: String, body: Bytes },
    Heartbeat { session: u64 },
}

struct FakeGate {
    url: String,
    events: mpsc::Receiver<Event>,
    connections: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl FakeGate {
    /// Closes the listening socket: reconnections are refused from now on.
    async fn stop_accepting(&mut self) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
    }
}

async fn fake_gate(heartbeat_ms: u32) -> FakeGate {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let (events, rx) = mpsc::channel(1024);
    let connections = Arc::new(AtomicU64::new(0));
    let count = connections.clone();
    let accept = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let session = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(serve(stream, session, heartbeat_ms, events.clone()));
        }
    });
    FakeGate {
        url,
        events: rx,
        connections,
        accept,
    }
}

fn frame(kind: Kind) -> Message {
    Message::Binary(Packet::new(kind).encode_to_vec().into())
}

fn response(id: u64, code: u32, body: Bytes) -> Kind {
    Kind::Response(Response {
        id,
        code,
        body,
        ..Response::default()
    })
}

async fn serve(stream: TcpStream, session: u64, heartbeat_ms: u32, events: mpsc::Sender<Event>) {
    let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
    let Some(Ok(Message::Binary(hello))) = ws.next().await else {
        return;
    };
    let Some(Kind::Handshake(hello)) = Packet::decode(hello).unwrap().kind else {
        panic!("first frame is not a handshake");
    };
    let refused = hello.token == "bad";
    let ack = HandshakeAck {
        code: if refused { 401 } else { 200 },
        session_id: session,
        heartbeat_ms,
        message: if refused {
            "bad token".into()
        } else {
            String::new()
        },
    };
    ws.send(frame(Kind::HandshakeAck(ack))).await.unwrap();
    if refused {
        let _ = ws.close(None).await;
        return;
    }
    // The gate may heartbeat too; the client ignores it.
    ws.send(frame(Kind::Heartbeat(Heartbeat {}))).await.unwrap();
    let mut held: Vec<Request> = Vec::new();
    while let Some(Ok(message)) = ws.next().await {
        let Message::Binary(bytes) = message else {
            continue;
        };
        let request = match Packet::decode(bytes).unwrap().kind {
            Some(Kind::Heartbeat(_)) => {
                let _ = events.try_send(Event::Heartbeat { session });
                continue;
            }
            Some(Kind::Request(request)) => request,
            other => panic!("unexpected packet {other:?}"),
        };
        let Request { id, route, body } = request.clone();
        if id == 0 {
            let _ = events.try_send(Event::Notify { route, body });
            ws.send(frame(response(0, 200, Bytes::from_static(b"stray"))))
                .await
                .unwrap();
            continue;
        }
        match route.as_str() {
            "echo.echo" => ws.send(frame(response(id, 200, body))).await.unwrap(),
            "echo.reverse" => {
                held.push(request);
                if held.len() == REVERSE_BATCH {
                    for r in held.drain(..).rev() {
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
                let text = proto::json::encode(&packet).unwrap();
                ws.send(Message::text(text)).await.unwrap();
            }
            "push.me" => {
                let push = Push {
                    route: "chat.msg".into(),
                    body: body.clone(),
                };
                ws.send(frame(Kind::Push(push))).await.unwrap();
                ws.send(frame(response(id, 200, body))).await.unwrap();
            }
            "kick.me" => {
                let reason = String::from_utf8(body.to_vec()).unwrap();
                ws.send(frame(Kind::Kick(Kick { reason }))).await.unwrap();
                let _ = ws.close(None).await;
                return;
            }
            "drop.me" => return,
            other => panic!("the fake gate has no route {other}"),
        }
    }
}

fn options() -> ClientOptions {
    ClientOptions {
        request_timeout: DEADLINE,
        ..ClientOptions::default()
    }
}

fn reconnecting() -> ClientOptions {
    ClientOptions {
        reconnect: Some(Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
        }),
        ..options()
    }
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(DEADLINE, f)
        .await
        .expect("condition not met before the deadline")
}

fn closed_reason(e: &SdkError) -> &str {
    match e.kind() {
        ErrorKind::Closed { reason } => reason,
        other => panic!("expected Closed, got {other:?} ({e})"),
    }
}

#[tokio::test]
async fn connect_handshakes_and_reports_the_session() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    assert_eq!(client.session_id(), 1);
    let r = client.request("echo.echo", b"hi").await.unwrap();
    assert_eq!((r.id, r.code, &r.body[..]), (1, 200, &b"hi"[..]));
}

#[tokio::test]
async fn refused_handshake_returns_its_code_and_message() {
    let gate = fake_gate(0).await;
    let options = ClientOptions {
        token: "bad".into(),
        ..options()
    };
    let e = Client::connect(&gate.url, options).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Handshake { code: 401 });
    assert_eq!(e.detail(), "bad token");
}

#[tokio::test]
async fn connect_to_nothing_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    drop(listener);
    let e = Client::connect(&url, options()).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Connect);
}

#[tokio::test]
async fn concurrent_requests_get_their_own_responses() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    // Reversed answers prove matching is by id, not by order.
    let reversed = (0..REVERSE_BATCH * 4).map(|i| {
        let client = client.clone();
        async move {
            let body = format!("rev-{i}");
            let r = client.request("echo.reverse", &body).await.unwrap();
            assert_eq!((r.code, &r.body[..]), (200, body.as_bytes()));
        }
    });
    let echoed = (0..200).map(|i| {
        let client = client.clone();
        async move {
            let body = format!("echo-{i}");
            let r = client.request("echo.echo", &body).await.unwrap();
            assert_eq!(&r.body[..], body.as_bytes());
        }
    });
    let tasks = reversed.map(tokio::spawn).chain(echoed.map(tokio::spawn));
    for task in within(join_all(tasks)).await {
        task.unwrap();
    }
    assert_eq!(client.pending(), 0);
}

#[tokio::test]
async fn non_200_responses_are_responses_not_errors() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let r = client.request("echo.fail", b"").await.unwrap();
    assert_eq!((r.code, r.message.as_str()), (500, "boom"));
}

#[tokio::test]
async fn text_frame_responses_are_decoded_as_json() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let r = client.request("echo.json", b"json body").await.unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"json body"[..]));
}

#[tokio::test]
async fn notify_is_sent_with_id_zero_and_gets_no_response() {
    let mut gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    client.notify("chat.say", b"hello").await.unwrap();
    let event = within(gate.events.recv()).await.unwrap();
    assert_eq!(
        event,
        Event::Notify {
            route: "chat.say".into(),
            body: Bytes::from_static(b"hello")
        }
    );
    // The fake answered the notify with a stray id-0 response; the next request still
    // gets its own.
    let r = client.request("echo.echo", b"after").await.unwrap();
    assert_eq!((r.id, &r.body[..]), (1, &b"after"[..]));
}

#[tokio::test]
async fn unanswered_request_times_out_and_is_forgotten() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let e = client
        .request_with_timeout("echo.slow", b"", Duration::from_millis(20))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout);
    assert_eq!(client.pending(), 0);
    let r = client.request("echo.echo", b"still up").await.unwrap();
    assert_eq!(&r.body[..], b"still up");
}

#[tokio::test]
async fn pushes_are_delivered() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let mut pushes = client.pushes().unwrap();
    assert!(client.pushes().is_none(), "the push stream is taken once");
    client.request("push.me", b"news").await.unwrap();
    let push = within(pushes.recv()).await.unwrap();
    assert_eq!(
        (push.route.as_str(), &push.body[..]),
        ("chat.msg", &b"news"[..])
    );
}

#[tokio::test]
async fn full_push_queue_drops_and_counts_instead_of_stalling() {
    let gate = fake_gate(0).await;
    let options = ClientOptions {
        push_capacity: 1,
        ..options()
    };
    let client = Client::connect(&gate.url, options).await.unwrap();
    for _ in 0..3 {
        // Each response follows its push, so the pushes have been routed by now.
        client.request("push.me", b"x").await.unwrap();
    }
    assert_eq!(client.pushes_dropped(), 2);
    let mut pushes = client.pushes().unwrap();
    assert!(pushes.try_recv().is_some());
    assert!(pushes.try_recv().is_none());
}

#[tokio::test]
async fn kick_closes_with_its_reason_and_does_not_reconnect() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    let mut pushes = client.pushes().unwrap();
    let e = client.request("kick.me", b"bye").await.unwrap_err();
    assert_eq!(closed_reason(&e), "bye");
    assert_eq!(within(client.closed()).await, "bye");
    assert!(client.is_closed());
    let e = client.request("echo.echo", b"").await.unwrap_err();
    assert_eq!(closed_reason(&e), "bye");
    assert!(within(pushes.recv()).await.is_none(), "pushes end at close");
    assert_eq!(gate.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn close_fails_later_requests() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    within(client.close()).await;
    let e = client.notify("echo.echo", b"").await.unwrap_err();
    assert_eq!(closed_reason(&e), "closed by client");
    let e = client.request("echo.echo", b"").await.unwrap_err();
    assert_eq!(closed_reason(&e), "closed by client");
}

#[tokio::test]
async fn dropped_connection_without_reconnect_closes() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let e = client.request("drop.me", b"").await.unwrap_err();
    assert!(e.is_closed(), "{e}");
    within(client.closed()).await;
    assert!(
        client
            .request("echo.echo", b"")
            .await
            .unwrap_err()
            .is_closed()
    );
}

#[tokio::test]
async fn reconnects_after_the_gate_drops_the_connection() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    assert_eq!(client.session_id(), 1);
    // In flight at the drop: fails with Closed.
    let e = client.request("drop.me", b"").await.unwrap_err();
    assert!(e.is_closed(), "{e}");
    // Made during or after the reconnection: waits for it and succeeds.
    let r = client.request("echo.echo", b"again").await.unwrap();
    assert_eq!(&r.body[..], b"again");
    assert_eq!(client.session_id(), 2);
    assert_eq!(client.reconnects(), 1);
    assert!(!client.is_closed());
    // And again: the backoff restarts from `initial` after a success.
    client.request("drop.me", b"").await.unwrap_err();
    client
        .notify("chat.say", b"queued while down")
        .await
        .unwrap();
    let r = client.request("echo.echo", b"third").await.unwrap();
    assert_eq!(&r.body[..], b"third");
    assert_eq!(client.session_id(), 3);
}

#[tokio::test]
async fn requests_wait_for_the_reconnection_then_time_out() {
    let mut gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    gate.stop_accepting().await;
    client.request("drop.me", b"").await.unwrap_err();
    let e = client
        .request_with_timeout("echo.echo", b"", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout);
    assert_eq!(client.pending(), 0);
    assert!(!client.is_closed(), "still trying to reconnect");
    // Closing stops the reconnection; waiting requests learn why.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.request("echo.echo", b"").await })
    };
    within(client.close()).await;
    let e = within(waiting).await.unwrap().unwrap_err();
    assert_eq!(closed_reason(&e), "closed by client");
}

#[tokio::test]
async fn sends_heartbeats_at_the_interval_the_gate_asked() {
    let mut gate = fake_gate(20).await;
    let _client = Client::connect(&gate.url, options()).await.unwrap();
    for _ in 0..3 {
        let event = within(gate.events.recv()).await.unwrap();
        assert_eq!(event, Event::Heartbeat { session: 1 });
    }
}

#[tokio::test]
async fn dropping_every_handle_closes_the_connection() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let mut pushes = client.pushes().unwrap();
    drop(client);
    assert!(within(pushes.recv()).await.is_none());
}
