//! What an idle session costs the gate (issue #50: at most 6 KB live, 4 KB detached):
//! the bytes its gate-side tasks asked of the allocator and still hold, counted on the
//! thread the sessions run on, clients on another. A debug build's futures are larger
//! than a release build's, so these bounds are met with room in production; the RSS
//! figures measured with `loadtest idle` are in docs/benchmarks.md. (Before the cuts of
//! docs/gateway.md, "Memory per session", this counted 16.4 KB live and 16.3 KB
//! detached.)

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::io::AsyncWriteExt as _;
use tokio::sync::oneshot;

use super::*;

/// Sessions opened for one count: enough that what the gate allocates once (its
/// registry growing, the runtime's first timer) is small per session.
const SESSIONS: usize = 200;

/// What one idle session holds in the gate, in bytes: `(live, detached)`, the second
/// for resumable sessions whose link was cut.
fn held_per_session(resumable: bool) -> (f64, f64) {
    let cx = gate(|_| {});
    let (nears, fars): (Vec<_>, Vec<_>) =
        (0..SESSIONS).map(|_| tokio::io::duplex(16 * 1024)).unzip();
    let (opened, all_open) = oneshot::channel::<()>();
    let (cut, all_cut) = oneshot::channel::<()>();
    let gate_cx = cx.clone();
    let gate_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let admission = Admission::new(SESSIONS, SESSIONS);
        let live = allocation_counter::measure(|| {
            rt.block_on(async {
                for far in fars {
                    let ticket = admission.admit(ip).expect("a free place");
                    tokio::spawn(run(gate_cx.clone(), far, SocketAddr::new(ip, 1), ticket));
                }
                all_open.await.expect("the clients say when");
            });
        });
        let after_cut = allocation_counter::measure(|| {
            rt.block_on(async { all_cut.await.expect("the clients say when") });
        });
        let per_session = |bytes: i64| bytes as f64 / SESSIONS as f64;
        (
            per_session(live.bytes_current),
            per_session(live.bytes_current + after_cut.bytes_current),
        )
    });
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    clients.block_on(async {
        let mut open = Vec::new();
        for near in nears {
            let (mut ws, _) = tokio_tungstenite::client_async("ws://gate/", near)
                .await
                .expect("upgrade");
            let handshake = client::Handshake {
                resumable,
                ..Default::default()
            };
            send(&mut ws, Kind::Handshake(handshake)).await;
            assert!(matches!(next(&mut ws).await, Kind::HandshakeAck(ack) if ack.code == code::OK));
            // Idle, as a client that heartbeats is: one exchanged.
            send(&mut ws, Kind::Heartbeat(client::Heartbeat {})).await;
            assert!(matches!(next(&mut ws).await, Kind::Heartbeat(_)));
            open.push(ws);
        }
        opened.send(()).expect("the gate waits");
        // Each link cut (the client stops writing); the gate lets the socket go, which
        // its end closing tells this one.
        for ws in &mut open {
            ws.get_mut().shutdown().await.expect("shut down");
            let closed = async { while let Some(Ok(_)) = ws.next().await {} };
            tokio::time::timeout(DEADLINE, closed)
                .await
                .expect("the gate lets the link go");
        }
        cut.send(()).expect("the gate waits");
    });
    gate_thread.join().expect("the gate's thread")
}

#[test]
fn an_idle_session_holds_at_most_6_kb_in_the_gate() {
    let (live, _) = held_per_session(false);
    assert!(live <= 6.0 * 1024.0, "{live} bytes per idle session");
}

#[test]
fn a_detached_session_holds_at_most_4_kb_in_the_gate() {
    let (live, detached) = held_per_session(true);
    assert!(
        live <= 6.0 * 1024.0,
        "{live} bytes per idle resumable session"
    );
    assert!(
        detached <= 4.0 * 1024.0,
        "{detached} bytes per detached session"
    );
}

/// `--ws-buffer` at its edge (0: the WebSocket keeps no buffer of its own to start
/// with): frames sent in one burst, one of them far larger than a socket read, all
/// come whole and in order.
#[tokio::test]
async fn frames_far_larger_than_the_websocket_buffer_come_whole_and_in_order() {
    let cx = gate(|c| c.ws_buffer = 0);
    let mut client = connect(&cx, client::Handshake::default()).await;
    let bodies = [vec![1u8; 10], vec![2u8; 20_000], vec![3u8; 300]];
    for (id, body) in (1..).zip(&bodies) {
        let req = client::Request {
            id,
            route: "echo.echo".into(),
            body: body.clone().into(),
            ..Default::default()
        };
        let frame = Message::binary(Packet::new(Kind::Request(req)).encode_to_vec());
        client.ws.feed(frame).await.expect("feed");
    }
    client.ws.flush().await.expect("flush");
    let mut sent = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while sent.len() < bodies.len() {
            sent.extend(published(&cx.bus.written().await));
        }
    })
    .await
    .expect("every request published");
    let got: Vec<Vec<u8>> = sent.iter().map(|(_, _, req)| req.body.to_vec()).collect();
    assert_eq!(got, bodies);
}
