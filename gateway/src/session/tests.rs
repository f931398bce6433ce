//! The session core's rules, without a server or a socket: a session runs over an
//! in-memory stream (`tokio::io::duplex`, the WebSocket upgrade included) on a bus no
//! server is behind ([`Bus::detached`]): what it publishes is read from the bus's
//! buffer, and what workers answer is handed to its queue as the gate's bus reader
//! would. Time is paused where deadlines matter, so they pass at once.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bus::Bus;
use futures::{SinkExt, StreamExt};
use proto::Message as _;
use proto::client::{self, Packet, packet::Kind};
use proto::code;
use proto::rpc::{RpcRequest, RpcResponse, ServerPush};
use testkit::DEADLINE;
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::{Context, run};
use crate::admission::Admission;
use crate::auth::AnyToken;
use crate::bus_target::Target;
use crate::codec::PushFrame;
use crate::config::GateConfig;
use crate::inbox::{ToSession, WorkerReply};
use crate::schema::Schemas;

mod effects;
mod memory;

fn gate(change: impl FnOnce(&mut GateConfig)) -> Arc<Context> {
    let mut config = GateConfig {
        gate_id: "g1".into(),
        ..GateConfig::default()
    };
    change(&mut config);
    let bus = Bus::detached(Target::Replies, 1 << 20);
    let schemas = Arc::new(Schemas::default());
    Arc::new(Context::new(config, bus, schemas, Arc::new(AnyToken)))
}

/// A client of one session, and the session's task.
struct Client {
    ws: WebSocketStream<DuplexStream>,
    sid: u64,
    task: JoinHandle<()>,
}

/// Opens a session on `cx` over an in-memory stream and does the handshake.
async fn connect(cx: &Arc<Context>, handshake: client::Handshake) -> Client {
    let (near, far) = tokio::io::duplex(16 * 1024);
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let ticket = Admission::new(1, 1).admit(ip).expect("a free place");
    let task = tokio::spawn(run(cx.clone(), far, SocketAddr::new(ip, 1), ticket));
    let (mut ws, _) = tokio_tungstenite::client_async("ws://gate/", near)
        .await
        .expect("upgrade");
    send(&mut ws, Kind::Handshake(handshake)).await;
    let Kind::HandshakeAck(ack) = next(&mut ws).await else {
        panic!("no handshake ack");
    };
    assert_eq!(ack.code, code::OK, "{}", ack.message);
    Client {
        ws,
        sid: ack.session_id,
        task,
    }
}

async fn send(ws: &mut WebSocketStream<DuplexStream>, kind: Kind) {
    let frame = Message::binary(Packet::new(kind).encode_to_vec());
    ws.send(frame).await.expect("send");
}

async fn request(client: &mut Client, id: u64, route: &str) {
    let req = client::Request {
        id,
        route: route.into(),
        body: b"hi".to_vec().into(),
        ..Default::default()
    };
    send(&mut client.ws, Kind::Request(req)).await;
}

/// The next packet the gate sent.
async fn next(ws: &mut WebSocketStream<DuplexStream>) -> Kind {
    let frame = tokio::time::timeout(DEADLINE, ws.next())
        .await
        .expect("a frame in time")
        .expect("the session is open")
        .expect("a frame");
    let Message::Binary(bytes) = frame else {
        panic!("not a packet: {frame:?}");
    };
    Packet::decode(bytes)
        .expect("a packet")
        .kind
        .expect("a kind")
}

async fn response(client: &mut Client) -> client::Response {
    match next(&mut client.ws).await {
        Kind::Response(resp) => resp,
        other => panic!("not a response: {other:?}"),
    }
}

/// The requests a bus buffer holds, by subject and reply subject (messages without a
/// reply subject, a bind's claim, are skipped).
fn published(written: &str) -> Vec<(String, String, RpcRequest)> {
    // The buffer has one char per byte (`written_now`): its bytes back.
    let bytes: Vec<u8> = written
        .chars()
        .map(|c| u8::try_from(c).expect("one byte per char"))
        .collect();
    let find = |haystack: &[u8], needle: &[u8]| {
        haystack
            .windows(needle.len())
            .position(|window| window == needle)
    };
    let mut out = Vec::new();
    let mut rest = &bytes[..];
    while let Some(at) = find(rest, b"PUB ") {
        let rest_of_line = &rest[at + 4..];
        let end = find(rest_of_line, b"\r\n").expect("a whole line");
        let line = std::str::from_utf8(&rest_of_line[..end]).expect("a text line");
        let tail = &rest_of_line[end + 2..];
        let parts: Vec<&str> = line.split(' ').collect();
        let (request, len) = match parts[..] {
            [subject, reply, len] => (Some((subject, reply)), len),
            [_, len] => (None, len),
            _ => panic!("not a message: {line}"),
        };
        let len: usize = len.parse().expect("a length");
        if let Some((subject, reply)) = request {
            let req = RpcRequest::decode(&tail[..len]).expect("an RpcRequest");
            out.push((subject.to_owned(), reply.to_owned(), req));
        }
        rest = &tail[len..];
    }
    out
}

fn answer(cx: &Context, sid: u64, id: u64, code: u32, body: &[u8]) {
    let resp = RpcResponse {
        code,
        body: body.to_vec().into(),
        ..Default::default()
    };
    let reply = WorkerReply::Response(Box::new(resp));
    cx.sessions
        .offer(sid, ToSession::Reply { id, reply })
        .expect("the session's queue takes it");
}

#[tokio::test]
async fn a_request_goes_to_its_route_s_subject_with_the_session_and_its_answer_comes_back() {
    let cx = gate(|_| {});
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 7, "echo.echo").await;
    let sent = published(&cx.bus.written().await);
    let [(subject, reply, req)] = &sent[..] else {
        panic!("one request: {sent:?}");
    };
    assert_eq!(subject, "shaddock.svc.echo.echo");
    assert_eq!(reply, &format!("shaddock.gw.g1.{}.7", client.sid));
    assert_eq!(
        (req.route.as_str(), &req.body[..]),
        ("echo.echo", &b"hi"[..])
    );
    let session = req.session.as_ref().expect("the session rides along");
    assert_eq!((session.gate.as_str(), session.sid), ("g1", client.sid));
    // How long the gate waits for the answer: its request timeout, less the moment that
    // passed before the request went out.
    let timeout = u32::try_from(GateConfig::default().request_timeout.as_millis()).unwrap();
    assert!(
        (timeout - 1_000..=timeout).contains(&req.timeout_ms),
        "{}",
        req.timeout_ms
    );
    assert_eq!(cx.in_flight.taken(), 1);

    answer(&cx, client.sid, 7, code::OK, b"hi back");
    let resp = response(&mut client).await;
    assert_eq!(
        (resp.id, resp.code, &resp.body[..]),
        (7, code::OK, &b"hi back"[..])
    );
    assert_eq!(cx.in_flight.taken(), 0, "the slot is given back");
}

#[tokio::test]
async fn requests_the_gate_refuses_are_answered_at_once_and_never_published() {
    let cx = gate(|c| c.max_in_flight = 1);
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    // The same id again, then one over the session's in-flight limit, then a bad route.
    request(&mut client, 1, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (1, code::BAD_REQUEST));
    assert_eq!(resp.message, "request id already in flight");
    request(&mut client, 2, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (2, code::TOO_MANY_REQUESTS));
    request(&mut client, 3, "no-dot").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (3, code::BAD_REQUEST));
    assert_eq!(
        published(&cx.bus.written_now()).len(),
        1,
        "only the first went out"
    );
}

#[tokio::test]
async fn the_gate_wide_budget_refuses_with_503_when_it_is_spent() {
    let cx = gate(|c| {
        c.max_gate_in_flight = 1;
        c.gate_reserve = 0;
    });
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    request(&mut client, 2, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (2, code::UNAVAILABLE));
    assert_eq!(resp.message, "gate overloaded");
}

#[tokio::test(start_paused = true)]
async fn a_request_no_worker_answers_gets_408_at_its_deadline_and_a_late_answer_is_dropped() {
    let cx = gate(|c| c.request_timeout = Duration::from_secs(2));
    let mut client = connect(&cx, client::Handshake::default()).await;
    let start = tokio::time::Instant::now();
    request(&mut client, 5, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (5, code::TIMEOUT));
    assert_eq!(
        resp.message, "gate: no answer in time",
        "not a worker's 408"
    );
    assert!(start.elapsed() >= Duration::from_secs(2));
    assert_eq!(cx.in_flight.taken(), 0);
    // The worker's answer after the 408 is not a second answer.
    answer(&cx, client.sid, 5, code::OK, b"late");
    send(&mut client.ws, Kind::Heartbeat(client::Heartbeat {})).await;
    assert!(matches!(next(&mut client.ws).await, Kind::Heartbeat(_)));
}

/// With `--bus-lost-wait 0`, what was written on a lost connection is answered at once.
#[tokio::test(start_paused = true)]
async fn no_responders_is_404_for_an_unknown_service_and_a_lost_bus_answers_everything_503() {
    let cx = gate(|c| c.bus_lost_wait = Duration::ZERO);
    let start = tokio::time::Instant::now();
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "nobody.home").await;
    request(&mut client, 2, "echo.echo").await;
    request(&mut client, 3, "echo.echo").await;
    assert_eq!(published(&cx.bus.written().await).len(), 3);
    let reply = WorkerReply::NoResponders;
    cx.sessions
        .offer(client.sid, ToSession::Reply { id: 1, reply })
        .unwrap();
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (1, code::NOT_FOUND));
    cx.sessions.offer(client.sid, ToSession::BusLost).unwrap();
    let mut ids = vec![];
    for _ in 0..2 {
        let resp = response(&mut client).await;
        assert_eq!(resp.code, code::UNAVAILABLE);
        assert_eq!(resp.message, "bus connection lost");
        ids.push(resp.id);
    }
    ids.sort_unstable();
    assert_eq!(ids, [2, 3]);
    assert_eq!(cx.in_flight.taken(), 0);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn a_serial_session_s_next_request_goes_out_only_once_the_one_before_is_answered() {
    let cx = gate(|_| {});
    let handshake = client::Handshake {
        serial: true,
        ..Default::default()
    };
    let mut client = connect(&cx, handshake).await;
    request(&mut client, 1, "echo.echo").await;
    request(&mut client, 2, "echo.echo").await;
    let first = published(&cx.bus.written().await);
    assert_eq!(first.len(), 1, "the second waits: {first:?}");
    assert!(first[0].1.ends_with(".1"));
    answer(&cx, client.sid, 1, code::OK, b"");
    assert_eq!(response(&mut client).await.id, 1);
    let second = published(&cx.bus.written().await);
    assert_eq!(second.len(), 1);
    assert!(second[0].1.ends_with(".2"));
}

#[tokio::test]
async fn a_kick_is_sent_and_the_session_closes_giving_back_what_it_held() {
    let cx = gate(|_| {});
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    cx.bus.written().await;
    assert_eq!((cx.sessions.len(), cx.in_flight.taken()), (1, 1));
    cx.sessions
        .offer(client.sid, ToSession::Kick("bye".into()))
        .unwrap();
    let Kind::Kick(kick) = next(&mut client.ws).await else {
        panic!("no kick");
    };
    assert_eq!(kick.reason, "bye");
    let closed = tokio::time::timeout(DEADLINE, client.ws.next())
        .await
        .unwrap();
    let Some(Ok(Message::Close(Some(frame)))) = closed else {
        panic!("no close frame: {closed:?}");
    };
    assert_eq!(frame.code, CloseCode::Policy);
    tokio::time::timeout(DEADLINE, client.task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((cx.sessions.len(), cx.in_flight.taken()), (0, 0));
    // Services hear that the session closed.
    assert!(cx.bus.written_now().contains("shaddock.evt.session.closed"));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_is_closed_as_too_slow_at_the_write_deadline() {
    let cx = gate(|c| {
        c.write_timeout = Duration::from_secs(1);
        c.heartbeat = Duration::from_secs(3600);
    });
    let client = connect(&cx, client::Handshake::default()).await;
    let push = PushFrame::new(ServerPush {
        route: "chat.message".into(),
        body: vec![7; 4096].into(),
    });
    // More than the in-memory stream holds: the session's writes stop being taken.
    let start = tokio::time::Instant::now();
    for _ in 0..16 {
        cx.sessions
            .offer(client.sid, ToSession::Push(push.clone()))
            .unwrap();
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(DEADLINE, client.task)
        .await
        .expect("the session ends")
        .unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "not before the deadline"
    );
    assert_eq!(cx.sessions.len(), 0);
    drop(client.ws);
}

#[tokio::test]
async fn a_full_queue_closes_the_session_rather_than_drop_what_it_sends() {
    let cx = gate(|c| {
        c.max_in_flight = 1;
        c.outbound_queue = 1;
    });
    let client = connect(&cx, client::Handshake::default()).await;
    let push = PushFrame::new(ServerPush {
        route: "chat.message".into(),
        body: vec![1; 8].into(),
    });
    // The queue holds max_in_flight + outbound_queue messages; offered faster than the
    // session takes them, one is refused and the session is told to close.
    let refused = (0..64)
        .map(|_| cx.sessions.offer(client.sid, ToSession::Push(push.clone())))
        .any(|r| r.is_err());
    assert!(refused);
    tokio::time::timeout(DEADLINE, client.task)
        .await
        .expect("the session ends")
        .unwrap();
    assert_eq!(cx.sessions.len(), 0);
}

#[tokio::test]
async fn heartbeats_are_answered_within_the_rate_and_the_rate_refuses_requests_with_429() {
    let cx = gate(|c| {
        c.rate = 1;
        c.burst = 2;
    });
    let mut client = connect(&cx, client::Handshake::default()).await;
    send(&mut client.ws, Kind::Heartbeat(client::Heartbeat {})).await;
    assert!(matches!(next(&mut client.ws).await, Kind::Heartbeat(_)));
    request(&mut client, 1, "echo.echo").await;
    request(&mut client, 2, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (2, code::TOO_MANY_REQUESTS));
    assert_eq!(published(&cx.bus.written_now()).len(), 1);
}

/// Makes `service` one the gate knows has workers (as its announcement would).
fn announce(cx: &Context, service: &str) {
    let schema = proto::rpc::ServiceSchema {
        service: service.into(),
        ..Default::default()
    };
    cx.schemas.learn(schema.encode_to_vec().into()).unwrap();
}

#[tokio::test]
async fn requests_wait_for_a_lost_bus_and_go_out_in_order_once_it_is_back() {
    let cx = gate(|_| {});
    let mut client = connect(&cx, client::Handshake::default()).await;
    cx.bus.set_connected(false);
    request(&mut client, 1, "echo.echo").await;
    request(&mut client, 2, "echo.echo").await;
    // Nothing goes out and nothing is answered while the bus is away; a heartbeat's
    // answer shows the session has handled both requests.
    send(&mut client.ws, Kind::Heartbeat(client::Heartbeat {})).await;
    assert!(matches!(next(&mut client.ws).await, Kind::Heartbeat(_)));
    assert_eq!(cx.bus.written_now(), "");
    assert_eq!(cx.held.count(), 2);

    cx.bus.set_connected(true);
    cx.sessions.offer(client.sid, ToSession::BusBack).unwrap();
    let sent = published(&cx.bus.written().await);
    let ids: Vec<&str> = sent.iter().map(|(_, reply, _)| reply.as_str()).collect();
    let head = format!("shaddock.gw.g1.{}.", client.sid);
    assert_eq!(ids, [format!("{head}1"), format!("{head}2")]);
    assert_eq!(cx.held.count(), 0);
    answer(&cx, client.sid, 1, code::OK, b"one");
    answer(&cx, client.sid, 2, code::OK, b"two");
    assert_eq!(response(&mut client).await.id, 1);
    assert_eq!(response(&mut client).await.id, 2);
}

#[tokio::test(start_paused = true)]
async fn a_bus_away_longer_than_the_hold_gets_a_503_at_the_window_and_never_a_408() {
    let cx = gate(|c| c.bus_hold = Duration::from_secs(1));
    let mut client = connect(&cx, client::Handshake::default()).await;
    cx.bus.set_connected(false);
    let start = tokio::time::Instant::now();
    request(&mut client, 1, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (1, code::UNAVAILABLE));
    assert_eq!(resp.message, "bus unavailable");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(5));
    assert_eq!((cx.held.count(), cx.in_flight.taken()), (0, 0));
    // A timeout shorter than the window ends the wait too, still as a 503: the request
    // was never sent, so the client may send it again anywhere.
    let cx = gate(|c| c.request_timeout = Duration::from_millis(300));
    let mut client = connect(&cx, client::Handshake::default()).await;
    cx.bus.set_connected(false);
    request(&mut client, 1, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!(
        (resp.code, resp.message.as_str()),
        (code::UNAVAILABLE, "bus unavailable")
    );
}

#[tokio::test]
async fn past_the_gate_s_hold_bound_or_with_holding_off_a_request_is_refused_at_once() {
    let cx = gate(|c| c.max_held = 1);
    let mut client = connect(&cx, client::Handshake::default()).await;
    cx.bus.set_connected(false);
    request(&mut client, 1, "echo.echo").await;
    request(&mut client, 2, "echo.echo").await;
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (2, code::UNAVAILABLE));
    assert_eq!(cx.held.count(), 1);

    let cx = gate(|c| c.bus_hold = Duration::ZERO);
    let mut client = connect(&cx, client::Handshake::default()).await;
    cx.bus.set_connected(false);
    request(&mut client, 1, "echo.echo").await;
    assert_eq!(response(&mut client).await.message, "bus unavailable");
}

#[tokio::test]
async fn a_lost_connection_answers_what_was_sent_and_keeps_what_was_held() {
    let cx = gate(|_| {});
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    cx.bus.written().await;
    cx.bus.set_connected(false);
    request(&mut client, 2, "echo.echo").await;
    cx.sessions.offer(client.sid, ToSession::BusLost).unwrap();
    // Request 1 was written: it may have reached a worker, so it is never sent again.
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.message.as_str()), (1, "bus connection lost"));
    cx.bus.set_connected(true);
    cx.sessions.offer(client.sid, ToSession::BusBack).unwrap();
    let sent = published(&cx.bus.written().await);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].1.ends_with(".2"), "only the held one: {sent:?}");
}

/// Its worker may live on (another server of a cluster): its answer, through the next
/// connection, is taken within `--bus-lost-wait`; after it, what did not come is 503.
#[tokio::test(start_paused = true)]
async fn a_request_in_flight_on_a_lost_connection_takes_its_answer_from_the_next_one() {
    let wait = Duration::from_millis(500);
    let cx = gate(|c| c.bus_lost_wait = wait);
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    request(&mut client, 2, "echo.echo").await;
    assert_eq!(published(&cx.bus.written().await).len(), 2);
    let lost = tokio::time::Instant::now();
    cx.sessions.offer(client.sid, ToSession::BusLost).unwrap();
    cx.sessions.offer(client.sid, ToSession::BusBack).unwrap();
    answer(&cx, client.sid, 1, code::OK, b"late");
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (1, code::OK), "{resp:?}");
    let resp = response(&mut client).await;
    assert_eq!(
        (resp.id, resp.code, resp.message.as_str()),
        (2, code::UNAVAILABLE, "bus connection lost")
    );
    assert!(lost.elapsed() >= wait);
    assert_eq!(cx.bus.written_now(), "", "never sent again");
}

/// One that the bus answered "no responders" reached no worker: a lost connection
/// leaves it to be sent again.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_to_be_sent_again_outlives_a_lost_connection() {
    let cx = gate(|c| c.resend_backoff = Duration::from_millis(100));
    announce(&cx, "echo");
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    cx.bus.written().await;
    let reply = WorkerReply::NoResponders;
    cx.sessions
        .offer(client.sid, ToSession::Reply { id: 1, reply })
        .unwrap();
    cx.sessions.offer(client.sid, ToSession::BusLost).unwrap();
    let again = tokio::time::timeout(Duration::from_secs(1), cx.bus.written())
        .await
        .expect("sent again, not answered");
    assert!(published(&again)[0].1.ends_with(".1"));
    answer(&cx, client.sid, 1, code::OK, b"at last");
    assert_eq!(response(&mut client).await.code, code::OK);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_reached_no_worker_is_sent_again_until_one_takes_it() {
    let cx = gate(|c| c.resend_backoff = Duration::from_millis(100));
    announce(&cx, "echo");
    let mut client = connect(&cx, client::Handshake::default()).await;
    request(&mut client, 1, "echo.echo").await;
    assert_eq!(published(&cx.bus.written().await).len(), 1);
    let start = tokio::time::Instant::now();
    for attempt in 1..=3 {
        let reply = WorkerReply::NoResponders;
        cx.sessions
            .offer(client.sid, ToSession::Reply { id: 1, reply })
            .unwrap();
        let again = published(&cx.bus.written().await);
        assert_eq!(again.len(), 1, "attempt {attempt}");
        assert!(again[0].1.ends_with(".1"));
    }
    // Waits of 100, 200 and 400 ms.
    assert!(start.elapsed() >= Duration::from_millis(700));
    answer(&cx, client.sid, 1, code::OK, b"at last");
    let resp = response(&mut client).await;
    assert_eq!((resp.id, resp.code), (1, code::OK));
}

#[tokio::test(start_paused = true)]
async fn no_responders_until_the_timeout_nears_is_503_before_the_timeout() {
    let cx = gate(|c| {
        c.resend_backoff = Duration::from_millis(100);
        c.request_timeout = Duration::from_millis(1000);
    });
    announce(&cx, "echo");
    let mut client = connect(&cx, client::Handshake::default()).await;
    let start = tokio::time::Instant::now();
    request(&mut client, 1, "echo.echo").await;
    cx.bus.written().await;
    // Waits of 100 and 200 ms fit (each with as long again for an answer); 400 does not.
    for _ in 0..2 {
        let reply = WorkerReply::NoResponders;
        cx.sessions
            .offer(client.sid, ToSession::Reply { id: 1, reply })
            .unwrap();
        cx.bus.written().await;
    }
    let reply = WorkerReply::NoResponders;
    cx.sessions
        .offer(client.sid, ToSession::Reply { id: 1, reply })
        .unwrap();
    let resp = response(&mut client).await;
    assert_eq!(
        (resp.code, resp.message.as_str()),
        (code::UNAVAILABLE, "no worker available now")
    );
    assert!(
        start.elapsed() < Duration::from_millis(1000),
        "before its timeout"
    );
}

#[tokio::test]
async fn a_body_too_large_to_keep_is_not_sent_again_and_is_answered_at_once() {
    let cx = gate(|_| {});
    announce(&cx, "echo");
    let mut client = connect(&cx, client::Handshake::default()).await;
    let req = client::Request {
        id: 1,
        route: "echo.echo".into(),
        body: vec![7; crate::config::MAX_RESENT_BODY + 1].into(),
        ..Default::default()
    };
    send(&mut client.ws, Kind::Request(req)).await;
    cx.bus.written().await;
    let reply = WorkerReply::NoResponders;
    cx.sessions
        .offer(client.sid, ToSession::Reply { id: 1, reply })
        .unwrap();
    let resp = response(&mut client).await;
    assert_eq!(
        (resp.code, resp.message.as_str()),
        (code::UNAVAILABLE, "no worker available now")
    );
    assert_eq!(cx.bus.written_now(), "", "not sent again");
}

async fn keyed_request(client: &mut Client, id: u64, key: &str) {
    let req = client::Request {
        id,
        route: "arena.input".into(),
        key: key.into(),
        ..Default::default()
    };
    send(&mut client.ws, Kind::Request(req)).await;
}

#[tokio::test]
async fn a_keyed_request_goes_to_its_key_s_partition_by_explicit_key_then_session_value_then_uid() {
    use proto::keyed::partition_of;
    use proto::rpc::{Effect, SetData, effect};
    let cx = gate(|_| {});
    let schema = proto::rpc::ServiceSchema {
        service: "arena".into(),
        keyed: Some(proto::rpc::Keyed {
            partitions: 8,
            session_key: "match".into(),
        }),
        ..Default::default()
    };
    cx.schemas.learn(schema.encode_to_vec().into()).unwrap();
    let mut client = connect(&cx, client::Handshake::default()).await;
    // No key, no session value, no uid: refused before it costs anything.
    keyed_request(&mut client, 1, "").await;
    let refused = response(&mut client).await;
    assert_eq!(
        (refused.code, refused.message.as_str()),
        (
            code::BAD_REQUEST,
            "keyed route: give a key, or log in first"
        )
    );
    keyed_request(&mut client, 2, &"k".repeat(proto::keyed::MAX_KEY_LEN + 1)).await;
    assert_eq!(response(&mut client).await.message, "key too long");
    let subject = |key: &str| {
        format!(
            "shaddock.part.arena.{}.input",
            partition_of(key.as_bytes(), 8)
        )
    };
    let expect_sent = async |client: &mut Client, id: u64, key: &str| {
        // A bind's claim may come first, on its own.
        let mut sent = Vec::new();
        while sent.is_empty() {
            sent = published(&cx.bus.written().await);
        }
        let [(sent_subject, _, req)] = &sent[..] else {
            panic!("one request: {sent:?}");
        };
        assert_eq!(
            (sent_subject.as_str(), req.key.as_str()),
            (subject(key).as_str(), key)
        );
        let effects = match id {
            // The first answer binds a uid and the session's match.
            3 => vec![
                Effect {
                    kind: Some(effect::Kind::BindUid("ann".into())),
                },
                Effect {
                    kind: Some(effect::Kind::SetData(SetData {
                        key: "match".into(),
                        value: "m2".into(),
                    })),
                },
            ],
            4 => vec![Effect {
                kind: Some(effect::Kind::ClearData("match".into())),
            }],
            _ => Vec::new(),
        };
        let resp = RpcResponse {
            code: code::OK,
            effects,
            ..Default::default()
        };
        let reply = WorkerReply::Response(Box::new(resp));
        cx.sessions
            .offer(client.sid, ToSession::Reply { id, reply })
            .expect("queued");
        if id == 3 {
            // The bind subscribed the player's subject: the answer waits for the
            // server to have it (a PING's answer), which the test plays.
            let written = cx.bus.written().await;
            assert!(written.ends_with("PING\r\n"), "{written:?}");
            cx.bus.answer_ping();
        }
        assert_eq!(response(client).await.code, code::OK);
    };
    keyed_request(&mut client, 3, "m1").await;
    expect_sent(&mut client, 3, "m1").await;
    // Now the session value names the match; an explicit key still wins.
    keyed_request(&mut client, 4, "").await;
    expect_sent(&mut client, 4, "m2").await;
    keyed_request(&mut client, 5, "").await;
    expect_sent(&mut client, 5, "ann").await;
    keyed_request(&mut client, 6, "other").await;
    expect_sent(&mut client, 6, "other").await;
}

#[tokio::test(start_paused = true)]
async fn keyed_requests_behind_one_that_found_no_worker_wait_and_keep_their_order() {
    use proto::keyed::partition_of;
    let cx = gate(|c| c.resend_backoff = Duration::from_millis(100));
    let schema = proto::rpc::ServiceSchema {
        service: "arena".into(),
        keyed: Some(proto::rpc::Keyed {
            partitions: 8,
            session_key: String::new(),
        }),
        ..Default::default()
    };
    cx.schemas.learn(schema.encode_to_vec().into()).unwrap();
    let other = (0..)
        .map(|n| format!("k{n}"))
        .find(|k| partition_of(k.as_bytes(), 8) != partition_of(b"m", 8))
        .unwrap();
    let mut client = connect(&cx, client::Handshake::default()).await;
    keyed_request(&mut client, 1, "m").await;
    let sent = published(&cx.bus.written().await);
    assert_eq!(sent.len(), 1);
    let origin = sent[0].1.rsplit_once('.').unwrap().0.to_owned();
    assert_eq!(origin, format!("shaddock.gw.g1.{}", client.sid));
    // The partition is moving: no worker for request 1.
    let reply = WorkerReply::NoResponders;
    cx.sessions
        .offer(client.sid, ToSession::Reply { id: 1, reply })
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let start = tokio::time::Instant::now();
    keyed_request(&mut client, 2, "m").await;
    keyed_request(&mut client, 3, "m").await;
    keyed_request(&mut client, 4, &other).await;
    // Another partition's request goes at once; 2 and 3 wait behind 1...
    let first = published(&cx.bus.written().await);
    let ids = |sent: &[(String, String, RpcRequest)]| -> Vec<String> {
        sent.iter()
            .map(|(_, reply, _)| reply.rsplit('.').next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&first), ["4"]);
    // ... and go with it, in order, once its wait is over.
    let again = published(&cx.bus.written().await);
    assert_eq!(ids(&again), ["1", "2", "3"]);
    assert!(start.elapsed() >= Duration::from_millis(90));
    // Every publish of a keyed request is numbered, rising in publish order, the session's
    // reply prefix its origin (docs/workers.md, "Hand-over").
    let order: Vec<(&str, u64)> = (sent.iter().chain(&first).chain(&again))
        .map(|(_, _, req)| (req.origin.as_str(), req.seq))
        .collect();
    let o = origin.as_str();
    assert_eq!(order, [(o, 1), (o, 2), (o, 3), (o, 4), (o, 5)]);
}
