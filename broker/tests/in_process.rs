//! In-process connections (`Server::connect_in_process`) driven by raw protocol lines,
//! next to TCP clients (async-nats) on the same server: one subject space, one set of
//! queue groups, the same limits.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use broker::testing::pki::Pki;
use broker::testing::{EmbeddedServer, round_trip};
use broker::{Auth, Config, Server};
use bytes::Bytes;
use common::{Conn, Read, get_json};
use futures::StreamExt;
use testkit::within;

/// What async-nats sends, minus the names: headers, no_responders, INFO updates.
const CONNECT: &str =
    r#"{"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1}"#;
/// Requests each side sends: with two members picked at random, the chance that one
/// member answers all of them is 2^-39.
const REQUESTS: usize = 40;

/// An in-process client past CONNECT; also returns the INFO it got first.
async fn in_process(server: &Server, connect_json: &str) -> (Conn, serde_json::Value) {
    let mut conn = Conn::from_io(server.connect_in_process());
    let info = conn.read_info().await;
    conn.send(&format!("CONNECT {connect_json}\r\nPING\r\n"))
        .await;
    conn.expect_line("PONG").await;
    (conn, info)
}

/// Reads one `MSG subject sid [reply] len` and its payload; returns the reply subject
/// (if any) and the payload.
async fn read_msg(conn: &mut Conn) -> (Option<String>, Vec<u8>) {
    let line = conn.line().await;
    let fields: Vec<&str> = line.split(' ').collect();
    let (reply, len) = match fields.as_slice() {
        ["MSG", _, _, len] => (None, len),
        ["MSG", _, _, reply, len] => (Some(reply.to_string()), len),
        _ => panic!("expected MSG, got {line:?}"),
    };
    let payload = conn.read_payload(len.parse().unwrap()).await;
    (reply, payload)
}

fn answers(payloads: impl IntoIterator<Item = Vec<u8>>) -> BTreeSet<String> {
    payloads
        .into_iter()
        .map(|p| String::from_utf8(p).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_queue_group_answers_requests_from_both_sides() {
    let bus = EmbeddedServer::start(Config::default()).await;
    // The TCP member.
    let tcp = async_nats::connect(&bus.url).await.unwrap();
    let mut members = tcp.queue_subscribe("svc", "workers".into()).await.unwrap();
    let responder = tcp.clone();
    tokio::spawn(async move {
        while let Some(request) = members.next().await {
            let reply = request.reply.unwrap();
            responder.publish(reply, "tcp".into()).await.unwrap();
        }
    });
    round_trip(&tcp).await;
    // The in-process member.
    let (mut member, info) = in_process(&bus.server, CONNECT).await;
    assert_eq!(info["client_ip"], "0.0.0.0");
    member.send("SUB svc workers 1\r\n").await;
    member.ping_pong().await;
    tokio::spawn(async move {
        loop {
            let (reply, _) = read_msg(&mut member).await;
            let reply = reply.expect("a request without a reply subject");
            member.send(&format!("PUB {reply} 6\r\ninproc\r\n")).await;
        }
    });

    // Requests from TCP.
    let mut from_tcp = Vec::new();
    for _ in 0..REQUESTS {
        let answer = within(tcp.request("svc", Bytes::new())).await.unwrap();
        from_tcp.push(answer.payload.to_vec());
    }
    assert_eq!(
        answers(from_tcp),
        answers([b"inproc".to_vec(), b"tcp".to_vec()])
    );

    // Requests from in-process.
    let (mut requester, _) = in_process(&bus.server, CONNECT).await;
    requester.send("SUB _INBOX.q 9\r\n").await;
    let mut from_in_process = Vec::new();
    for _ in 0..REQUESTS {
        requester.send("PUB svc _INBOX.q 0\r\n\r\n").await;
        from_in_process.push(read_msg(&mut requester).await.1);
    }
    assert_eq!(
        answers(from_in_process),
        answers([b"inproc".to_vec(), b"tcp".to_vec()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_requester_gets_no_responders() {
    let bus = EmbeddedServer::start(Config::default()).await;
    let (mut requester, _) = in_process(&bus.server, CONNECT).await;
    requester.send("SUB _INBOX.nr 7\r\n").await;
    requester.send("PUB nobody.home _INBOX.nr 0\r\n\r\n").await;
    let line = requester.line().await;
    let fields: Vec<&str> = line.split(' ').collect();
    let ["HMSG", "_INBOX.nr", "7", hlen, total] = fields.as_slice() else {
        panic!("expected a no-responders HMSG, got {line:?}");
    };
    assert_eq!(hlen, total, "a status message has no payload");
    let headers = requester.read_payload(total.parse().unwrap()).await;
    let headers = String::from_utf8(headers).unwrap();
    assert!(headers.starts_with("NATS/1.0 503\r\n"), "{headers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_cross_from_in_process_to_tcp() {
    let bus = EmbeddedServer::start(Config::default()).await;
    let tcp = async_nats::connect(&bus.url).await.unwrap();
    let mut sub = tcp.subscribe("hdr").await.unwrap();
    round_trip(&tcp).await;
    let (mut publisher, _) = in_process(&bus.server, CONNECT).await;
    let headers = "NATS/1.0\r\nX-Test: yes\r\n\r\n";
    let total = headers.len() + "hello".len();
    publisher
        .send(&format!(
            "HPUB hdr {} {total}\r\n{headers}hello\r\n",
            headers.len()
        ))
        .await;
    let msg = within(sub.next()).await.unwrap();
    assert_eq!(&msg.payload[..], b"hello");
    let got = msg.headers.unwrap();
    assert_eq!(got.get("X-Test").map(|v| v.as_str()), Some("yes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_byte_pipe_carries_messages_larger_than_itself() {
    // 0 is taken as 1: the smallest pipe that can carry anything.
    for in_process_buffer in [1, 0] {
        let bus = EmbeddedServer::start(Config {
            in_process_buffer,
            ..Config::default()
        })
        .await;
        let tcp = async_nats::connect(&bus.url).await.unwrap();
        let mut sub = tcp.subscribe("to.tcp").await.unwrap();
        round_trip(&tcp).await;
        let (mut conn, _) = in_process(&bus.server, CONNECT).await;
        conn.send("SUB to.inproc 1\r\n").await;
        conn.ping_pong().await;
        let big = "x".repeat(10_000);
        conn.send(&format!("PUB to.tcp {}\r\n{big}\r\n", big.len()))
            .await;
        assert_eq!(within(sub.next()).await.unwrap().payload, big.as_bytes());
        tcp.publish("to.inproc", big.clone().into()).await.unwrap();
        assert_eq!(read_msg(&mut conn).await.1, big.as_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_subscriber_that_stops_reading_is_a_slow_consumer() {
    let bus = EmbeddedServer::start(Config {
        max_payload: 1024,
        max_pending: 16 * 1024,
        in_process_buffer: 1024,
        ..Config::default()
    })
    .await;
    let monitor = bus.start_monitor().await;
    let (mut stuck, _) = in_process(&bus.server, CONNECT).await;
    stuck.send("SUB flood 1\r\n").await;
    stuck.ping_pong().await;
    let tcp = async_nats::connect(&bus.url).await.unwrap();
    for _ in 0..100 {
        tcp.publish("flood", vec![0_u8; 1000].into()).await.unwrap();
    }
    round_trip(&tcp).await;
    assert_eq!(get_json(monitor, "/varz").await["slow_consumers"], 1);
    // What was written before the cut is still there to read, then the end.
    stuck.auto_pong = false;
    loop {
        match stuck.read().await {
            Read::Closed => break,
            Read::Line(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_applies_in_process_and_tls_does_not() {
    let pki = Pki::new();
    let bus = EmbeddedServer::start(Config {
        auth: Auth::Token("s3cret".into()),
        tls: Some(pki.server_tls(false)),
        ..Config::default()
    })
    .await;
    let mut anonymous = Conn::from_io(bus.server.connect_in_process());
    let info = anonymous.read_info().await;
    assert_eq!(info["auth_required"], true);
    assert_eq!(info.get("tls_required"), None, "{info}");
    anonymous.send("CONNECT {}\r\nPING\r\n").await;
    anonymous
        .expect_err_and_close("Authorization Violation")
        .await;
    in_process(&bus.server, r#"{"verbose":false,"auth_token":"s3cret"}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lame_duck_mode_tells_closes_and_refuses_in_process_clients() {
    let bus = EmbeddedServer::start(Config {
        lame_duck_grace_period: Duration::from_millis(100),
        lame_duck_duration: Duration::from_millis(200),
        ..Config::default()
    })
    .await;
    let (mut client, mut connect_info) = in_process(&bus.server, CONNECT).await;
    bus.server.lame_duck();
    let mut ldm_info = client.read_info().await;
    assert_eq!(
        ldm_info.as_object_mut().unwrap().remove("ldm"),
        Some(true.into())
    );
    // An in-process client can connect before the server's run loop has recorded the
    // listener's address: its first INFO may then say 0.0.0.0:0. The rest is the same.
    for info in [&mut ldm_info, &mut connect_info] {
        let info = info.as_object_mut().unwrap();
        info.remove("host");
        info.remove("port");
    }
    assert_eq!(ldm_info, connect_info);
    // Lame duck mode has begun: no new client, in-process either.
    let mut late = Conn::from_io(bus.server.connect_in_process());
    late.expect_closed().await;
    client.expect_closed().await;
}
