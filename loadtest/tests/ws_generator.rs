//! The open-loop generator against real WebSocket servers on port 0: the bare echo
//! server (everything answered), and a server that handshakes and then never answers
//! (the generator must keep sending on schedule and stop by itself).

use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use loadtest::ws::clock::ClockKind;
use loadtest::ws::generator::{self, DriverKind, HARD_MARGIN, Length, LoadSpec, Target};
use loadtest::ws::schedule::Payload;
use proto::Message as _;
use proto::client::{HandshakeAck, Packet, packet::Kind};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

fn spec(clients: usize, count: u64, clock: ClockKind) -> LoadSpec {
    LoadSpec {
        clients,
        interval: Duration::from_millis(2),
        length: Length::Count(count),
        warmup: Duration::from_millis(20),
        ramp: Duration::from_millis(10),
        timeout: Duration::from_secs(2),
        route: "echo.raw".into(),
        payload: Payload::Hello,
        json: false,
        server_timing: true,
        clock,
        phases: 2,
        driver: DriverKind::Lean,
        progress: false,
    }
}

fn target(url: String) -> Target {
    Target {
        label: "test".into(),
        kind: "limit",
        urls: vec![url],
        tls: None,
        watched: Vec::new(),
    }
}

async fn echo_server() -> (String, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    tokio::spawn(loadtest::limit::serve(listener, shutdown.clone()));
    (url, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheduled_request_is_sent_and_answered() {
    let (url, shutdown) = echo_server().await;
    for clock in [ClockKind::Thread, ClockKind::Tokio] {
        let run = generator::run(&spec(3, 50, clock), &target(url.clone()))
            .await
            .expect("run");
        let t = &run.totals;
        assert_eq!(run.connected, 3);
        assert_eq!(t.sent, 150, "{clock:?}: 3 clients x 50 measured");
        assert_eq!(t.ok, 150, "{clock:?}");
        assert_eq!(t.lost(), 0);
        assert!(t.codes.is_empty());
        assert_eq!(t.latency.from_schedule.len(), 150);
        assert_eq!(t.latency.lag.len(), 150);
        // The echo server reports its own time as total; no queue or handler.
        assert_eq!(t.server.total.len(), 150);
        assert_eq!(run.per_conn.len(), 3);
        assert!(run.per_conn.iter().all(|r| *r > 0.0));
        assert!(!run.timeline.is_empty());
    }
    shutdown.cancel();
}

/// Handshakes, then reads and drops every frame: no request is ever answered.
async fn silent_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                let _hello = ws.next().await;
                let ack = Packet::new(Kind::HandshakeAck(HandshakeAck {
                    code: 200,
                    session_id: 1,
                    heartbeat_ms: 10_000,
                    message: String::new(),
                }));
                if ws.send(Message::binary(ack.encode_to_vec())).await.is_err() {
                    return;
                }
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_sending_without_answers_and_stops_by_itself() {
    let url = silent_server().await;
    let mut spec = spec(2, 40, ClockKind::Thread);
    spec.timeout = Duration::from_millis(300);
    let began = Instant::now();
    let run = generator::run(&spec, &target(url)).await.expect("run");
    let t = &run.totals;
    assert_eq!(t.sent, 80, "sent on schedule although nothing came back");
    assert_eq!(t.ok, 0);
    assert_eq!(t.timeouts + t.unanswered, 80);
    assert!(t.latency.from_schedule.is_empty());
    // 40 slots of 2 ms + warm-up + timeout + margin, with room for a slow machine.
    assert!(began.elapsed() < Duration::from_secs(3) + HARD_MARGIN);
}

#[tokio::test]
async fn a_server_nobody_can_reach_is_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let error = generator::run(&spec(2, 5, ClockKind::Tokio), &target(url))
        .await
        .expect_err("nothing listens");
    assert!(
        error.to_string().contains("no client could connect"),
        "{error}"
    );
}
