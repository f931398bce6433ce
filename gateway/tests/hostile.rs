//! Connections that never become sessions: a slowloris upgrade is closed at its
//! deadline, one address flooding the gate is held to `--max-connections-per-ip` while
//! another connects, connections still upgrading count against `--max-sessions`, and
//! upgrade requests that are too large, malformed or plain HTTP get their status; the
//! demo page is served to plain GETs unless turned off; browsers' upgrades from origins
//! the gate does not allow are refused with 403.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::raw::RawClient;
use common::{Bus, TestGate, gate_config, within};
use futures::StreamExt;
use proto::Message as _;
use proto::client::{Handshake, Packet, packet::Kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

const UPGRADE: &str = "GET / HTTP/1.1\r\nHost: gate\r\nUpgrade: websocket\r\n\
    Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    Sec-WebSocket-Version: 13\r\n\r\n";

const SECOND_LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// Waits, up to the deadline, until the gate holds `n` connections.
async fn connections(gate: &TestGate, n: usize) {
    within(async {
        let mut poll = tokio::time::interval(Duration::from_millis(10));
        while gate.gate.connection_count() != n {
            poll.tick().await;
        }
    })
    .await;
}

/// Everything the gate sends until it closes, as text.
async fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    // A reset after the answer still leaves the answer read.
    let _ = within(stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Opens `n` TCP connections that send nothing: each sits in its upgrade.
async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(within(TcpStream::connect(addr)).await.unwrap());
    }
    held
}

/// A WebSocket connect that the gate must refuse, with `status` if the refusal was read
/// before the close (a refused client may see only the reset).
async fn refused(url: &str, status: u16) {
    match within(tokio_tungstenite::connect_async(url)).await {
        Ok(_) => panic!("the gate took a connection past its limit"),
        Err(WsError::Http(response)) => assert_eq!(response.status(), status),
        Err(_) => {}
    }
}

#[tokio::test]
async fn a_slowloris_upgrade_is_closed_at_its_deadline() {
    let bus = Bus::embedded().await;
    let deadline = Duration::from_millis(400);
    // The handshake timeout is the old deadline of the upgrade: far enough that the
    // test fails if the upgrade had none of its own.
    let gate = TestGate::start(
        &bus,
        gate_config(|c| {
            c.upgrade_timeout = deadline;
            c.handshake_timeout = Duration::from_secs(30);
        }),
    )
    .await;
    let stream = within(TcpStream::connect(gate.addr)).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for byte in UPGRADE.as_bytes() {
            tick.tick().await;
            if wr.write_all(&[*byte]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = [0u8; 64];
    let read = within(rd.read(&mut buf)).await;
    let closed_after = started.elapsed();
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(closed_after >= deadline, "closed early: {closed_after:?}");
    assert!(
        closed_after < Duration::from_secs(3),
        "closed late: {closed_after:?}"
    );
    trickle.abort();
    connections(&gate, 0).await;
    RawClient::handshaken(&gate.url).await;
}

#[tokio::test]
async fn one_address_over_its_limit_is_refused_while_another_connects() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_connections_per_ip = 4)).await;
    let mut flood = idle_connections(gate.addr, 4).await;
    connections(&gate, 4).await;
    refused(&gate.url, 429).await;
    // Another address connects and opens a session.
    let other = RawClient::connect_from(&gate.url, SECOND_LOOPBACK).await;
    let _other = other.handshaken_now().await;
    // One flood connection gone, its address may connect again.
    flood.pop();
    connections(&gate, 4).await;
    RawClient::handshaken(&gate.url).await;
}

#[tokio::test]
async fn connections_still_upgrading_count_against_max_sessions() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| {
            c.max_sessions = 3;
            c.max_connections_per_ip = 0;
        }),
    )
    .await;
    let mut pending = idle_connections(gate.addr, 3).await;
    connections(&gate, 3).await;
    refused(&gate.url, 503).await;
    pending.pop();
    connections(&gate, 2).await;
    RawClient::handshaken(&gate.url).await;
}

#[tokio::test]
async fn an_upgrade_head_past_the_cap_is_answered_431() {
    let bus = Bus::embedded().await;
    let cap = 1024;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_upgrade_bytes = cap)).await;
    let mut stream = within(TcpStream::connect(gate.addr)).await.unwrap();
    // One byte past the cap and no end of head: all of it is read, so the close is a
    // clean one after the answer.
    let mut head = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
    head.resize(cap + 1, b'a');
    stream.write_all(&head).await.unwrap();
    let answer = read_all(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "answered {answer:?}");
}

#[tokio::test]
async fn plain_http_gets_404_and_malformed_upgrades_400() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    for (request, status) in [
        ("GET /nothing HTTP/1.1\r\nHost: gate\r\n\r\n", "404"),
        (
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "400",
        ),
        ("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "400"),
    ] {
        let mut stream = within(TcpStream::connect(gate.addr)).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_all(&mut stream).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{request:?} answered {answer:?}"
        );
    }
    connections(&gate, 0).await;
}

#[tokio::test]
async fn bytes_sent_right_after_the_upgrade_head_reach_the_session() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let mut stream = within(TcpStream::connect(gate.addr)).await.unwrap();
    // The upgrade and the handshake in one write: a masked binary frame (mask 0).
    let hello = Packet::new(Kind::Handshake(Handshake::default())).encode_to_vec();
    assert!(hello.len() < 126);
    let mut bytes = UPGRADE.as_bytes().to_vec();
    bytes.extend_from_slice(&[0x82, 0x80 | hello.len() as u8, 0, 0, 0, 0]);
    bytes.extend_from_slice(&hello);
    stream.write_all(&bytes).await.unwrap();
    // The 101 head, then the WebSocket with whatever followed it.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(within(stream.read_u8()).await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "), "{head:?}");
    let mut ws = WebSocketStream::from_partially_read(stream, Vec::new(), Role::Client, None).await;
    let Some(Ok(Message::Binary(ack))) = within(ws.next()).await else {
        panic!("no handshake ack")
    };
    let Some(Kind::HandshakeAck(ack)) = Packet::decode(ack).unwrap().kind else {
        panic!("not a handshake ack")
    };
    assert_eq!(ack.code, proto::code::OK);
}

#[tokio::test]
async fn the_demo_page_is_served_unless_turned_off() {
    let bus = Bus::embedded().await;
    let get = |addr: SocketAddr, path: &'static str| async move {
        let mut stream = within(TcpStream::connect(addr)).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: gate\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        read_all(&mut stream).await
    };
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let index = get(gate.addr, "/?gate=ws://elsewhere").await;
    assert!(
        index.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/html"),
        "{index}"
    );
    assert!(index.contains("app.js"), "{index}");
    let script = get(gate.addr, "/app.js").await;
    assert!(script.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/javascript"));
    let style = get(gate.addr, "/app.css").await;
    assert!(style.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/css"));

    let dark = TestGate::start(&bus, gate_config(|c| c.no_web = true)).await;
    let index = get(dark.addr, "/").await;
    assert!(index.starts_with("HTTP/1.1 404 "), "{index}");
}

#[tokio::test]
async fn browsers_from_other_origins_are_refused_403() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let bus = Bus::embedded().await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| c.allowed_origins = vec!["https://game.example".into()]),
    )
    .await;
    let from = |origin: Option<&'static str>| {
        let mut request = gate.url.as_str().into_client_request().unwrap();
        if let Some(origin) = origin {
            request
                .headers_mut()
                .insert("Origin", origin.parse().unwrap());
        }
        within(tokio_tungstenite::connect_async(request))
    };
    assert!(from(Some("https://game.example")).await.is_ok());
    assert!(from(None).await.is_ok(), "a client that is not a browser");
    match from(Some("https://evil.example")).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 403),
        other => panic!("an upgrade from another origin was not refused 403: {other:?}"),
    }
}
