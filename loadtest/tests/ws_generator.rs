//! The open-loop generator against real WebSocket servers on port 0: the bare echo
//! server (everything answered, latency from the schedule, JSON), a server that
//! handshakes and then never answers (the generator must keep sending on schedule and
//! stop by itself), and scripted servers that close, kick or answer too late.

use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use loadtest::ws::clock::ClockKind;
use loadtest::ws::generator::{self, HARD_MARGIN, Length, LoadSpec, Target};
use loadtest::ws::schedule::Payload;
use loadtest::ws::target::LimitServer;
use proto::Message as _;
use proto::client::{HandshakeAck, Kick, Packet, Push, Response, packet::Kind};
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

/// The handshake ack of the test servers.
fn ack() -> Message {
    let ack = Packet::new(Kind::HandshakeAck(HandshakeAck {
        code: 200,
        session_id: 1,
        heartbeat_ms: 10_000,
        message: String::new(),
    }));
    Message::binary(ack.encode_to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_sending_without_answers_and_stops_by_itself() {
    let url = scripted_server(Script::Silent).await;
    let mut spec = spec(2, 40, ClockKind::Thread);
    spec.timeout = Duration::from_millis(300);
    let began = Instant::now();
    let run = generator::run(&spec, &target(url)).await.expect("run");
    let t = &run.totals;
    assert_eq!(t.sent, 80, "sent on schedule although nothing came back");
    assert_eq!(t.ok, 0);
    assert_eq!(
        (t.timeouts, t.unanswered),
        (80, 0),
        "each timed out when its time came"
    );
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

/// What a scripted server does with the requests of a session.
#[derive(Debug, Clone, Copy)]
enum Script {
    /// Answers the first `n` (each after a push), then closes the WebSocket.
    CloseAfter(u64),
    /// Answers the first `n`, then kicks the session.
    KickAfter(u64),
    /// Answers every request, each `delay` after it arrived.
    Late(Duration),
    /// Answers nothing.
    Silent,
}

fn response(id: u64) -> Message {
    let resp = Packet::new(Kind::Response(Response {
        id,
        code: 200,
        ..Response::default()
    }));
    Message::binary(resp.encode_to_vec())
}

/// A WebSocket server on port 0 that handshakes every client and then follows
/// `script` for its requests.
async fn scripted_server(script: Script) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(scripted_session(stream, script));
        }
    });
    url
}

async fn scripted_session(stream: tokio::net::TcpStream, script: Script) {
    let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let (mut sink, mut stream) = ws.split();
    let _hello = stream.next().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    let _ = tx.send(ack());
    tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if sink.send(frame).await.is_err() {
                return;
            }
        }
    });
    let mut answered = 0;
    while let Some(Ok(frame)) = stream.next().await {
        let Message::Binary(bytes) = frame else {
            continue;
        };
        let Ok(Packet {
            kind: Some(Kind::Request(request)),
        }) = Packet::decode(bytes)
        else {
            continue;
        };
        match script {
            Script::CloseAfter(n) | Script::KickAfter(n) if answered < n => {
                let push = Packet::new(Kind::Push(Push {
                    route: "test.push".into(),
                    body: Default::default(),
                }));
                let _ = tx.send(Message::binary(push.encode_to_vec()));
                let _ = tx.send(response(request.id));
                answered += 1;
            }
            Script::CloseAfter(_) => {
                let _ = tx.send(Message::Close(None));
                return;
            }
            Script::KickAfter(_) => {
                let kick = Packet::new(Kind::Kick(Kick {
                    reason: "test over".into(),
                }));
                let _ = tx.send(Message::binary(kick.encode_to_vec()));
                return;
            }
            Script::Silent => {}
            Script::Late(delay) => {
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.send(response(request.id));
                });
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_or_kick_mid_run_fails_what_is_left_at_once() {
    for (script, kind) in [
        (Script::CloseAfter(10), "closed"),
        (Script::KickAfter(10), "kicked"),
    ] {
        let url = scripted_server(script).await;
        let mut spec = spec(2, 40, ClockKind::Tokio);
        spec.warmup = Duration::ZERO;
        // Far longer than the run: nothing may wait for it.
        spec.timeout = Duration::from_secs(30);
        let began = Instant::now();
        let run = generator::run(&spec, &target(url)).await.expect("run");
        let t = &run.totals;
        assert_eq!(t.sent, 80, "{kind}: every slot still counts as sent");
        assert_eq!(t.ok, 20, "{kind}: 10 answered per client (pushes ignored)");
        assert_eq!(t.failures.get(kind), Some(&60), "{kind}: {:?}", t.failures);
        assert_eq!((t.timeouts, t.unanswered), (0, 0), "{kind}");
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{kind}: took {:?}",
            began.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_after_the_timeout_are_timeouts_not_answers() {
    let url = scripted_server(Script::Late(Duration::from_millis(400))).await;
    let mut spec = spec(2, 30, ClockKind::Tokio);
    spec.timeout = Duration::from_millis(150);
    let run = generator::run(&spec, &target(url)).await.expect("run");
    let t = &run.totals;
    assert_eq!(t.sent, 60);
    assert_eq!(
        t.timeouts, 60,
        "every request timed out: {} unanswered, {} answered",
        t.unanswered, t.answered
    );
    assert_eq!((t.ok, t.answered, t.unanswered), (0, 0, 0));
    assert!(t.latency.from_schedule.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn latency_is_measured_from_the_scheduled_send_time() {
    // The echo server runs on its own threads; this runtime's one thread is blocked
    // for 60 ms inside the measured window (about 60 ms to 360 ms after the start), so
    // the slots due meanwhile, a fifth of them, are sent up to 60 ms late, in a burst.
    let server = LimitServer::start().expect("echo server");
    let mut spec = spec(1, 300, ClockKind::Tokio);
    spec.interval = Duration::from_millis(1);
    let blocker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::thread::sleep(Duration::from_millis(60));
    });
    let run = generator::run(&spec, &target(server.url().to_owned()))
        .await
        .expect("run");
    blocker.await.expect("blocker");
    assert_eq!(run.totals.ok, 300);
    let l = &run.totals.latency;
    let (schedule, send, lag) = (
        l.from_schedule.summary(),
        l.from_send.summary(),
        l.lag.summary(),
    );
    let ms = |us: f64| us / 1000.0;
    assert!(ms(lag.max_us) >= 40.0, "the burst was sent late: {lag:?}");
    assert!(
        ms(schedule.p90_us) >= 20.0,
        "latency from the schedule includes the lateness: {schedule:?}"
    );
    assert!(
        ms(send.p90_us) < 10.0,
        "latency from the send does not: {send:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_clients_are_answered_in_json() {
    let (url, shutdown) = echo_server().await;
    let mut spec = spec(2, 20, ClockKind::Tokio);
    spec.json = true;
    spec.payload = Payload::Fixed(bytes::Bytes::from_static(br#"{"room":"a"}"#));
    let run = generator::run(&spec, &target(url)).await.expect("run");
    assert_eq!((run.totals.sent, run.totals.ok), (40, 40));
    assert_eq!(
        run.totals.server.total.len(),
        40,
        "timing came back in JSON"
    );
    shutdown.cancel();
}
