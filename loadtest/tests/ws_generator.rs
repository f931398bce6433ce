//! The open-loop generator against real WebSocket servers on port 0: the bare echo
//! server (everything answered, in protobuf and JSON, latency from the schedule), and
//! scripted servers that never answer, close, kick or answer too late.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use loadtest::ws::clock::ClockKind;
use loadtest::ws::generator::{self, HARD_MARGIN, Length, LoadSpec, Target};
use loadtest::ws::lean::Codec;
use loadtest::ws::schedule::Payload;
use loadtest::ws::target::LimitServer;
use proto::Message as _;
use proto::client::{HandshakeAck, Kick, Packet, Push, Response, packet::Kind};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

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
        codec: Codec::Protobuf,
        clock,
        progress: false,
    }
}

fn target(url: &str) -> Target {
    Target::new("test", "limit", vec![url.to_owned()], Vec::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheduled_request_is_sent_and_answered_in_either_encoding() {
    let server = LimitServer::start().expect("echo server");
    let json = LoadSpec {
        codec: Codec::Json,
        payload: Payload::Fixed(bytes::Bytes::from_static(br#"{"room":"a"}"#)),
        ..spec(3, 50, ClockKind::Tokio)
    };
    let (thread, tokio) = (
        spec(3, 50, ClockKind::Thread),
        spec(3, 50, ClockKind::Tokio),
    );
    for spec in [thread, tokio, json] {
        let run = generator::run(&spec, &target(server.url())).await;
        let run = run.expect("run");
        let what = format!("{:?}, {:?}", spec.clock, spec.codec);
        assert_eq!(run.connected, 3);
        assert_eq!((run.sent, run.ok), (150, 150), "{what}: 3 clients x 50");
        assert_eq!(run.lost(), 0);
        assert!(run.errors_by_code.is_empty());
        assert_eq!(run.latency.lag.count, 150);
        // The echo server reports its own time as total, in either encoding.
        let total = run.server.as_ref().map(|s| s.total.count);
        assert_eq!(total, Some(150), "{what}");
        assert!(run.per_conn.min > 0.0 && !run.timeline.is_empty());
    }
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

fn frame(kind: Kind) -> Message {
    Message::binary(Packet::new(kind).encode_to_vec())
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
    // One writer, so late answers can be sent from tasks of their own.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if sink.send(frame).await.is_err() {
                return;
            }
        }
    });
    let send = |kind| drop(tx.send(frame(kind)));
    let _hello = stream.next().await;
    let (code, heartbeat_ms) = (200, 10_000);
    send(Kind::HandshakeAck(HandshakeAck {
        code,
        heartbeat_ms,
        ..HandshakeAck::default()
    }));
    let mut answered = 0;
    while let Some(Ok(Message::Binary(bytes))) = stream.next().await {
        let Ok(Some(Kind::Request(request))) = Packet::decode(bytes).map(|p| p.kind) else {
            continue;
        };
        let response = Response {
            id: request.id,
            code: 200,
            ..Response::default()
        };
        let response = Kind::Response(response);
        match script {
            Script::CloseAfter(n) | Script::KickAfter(n) if answered < n => {
                send(Kind::Push(Push::default()));
                send(response);
                answered += 1;
            }
            Script::CloseAfter(_) => return drop(tx.send(Message::Close(None))),
            Script::KickAfter(_) => return send(Kind::Kick(Kick::default())),
            Script::Silent => {}
            Script::Late(delay) => {
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.send(frame(response));
                });
            }
        }
    }
}

/// What scripted servers make of 2 clients × 40 slots: answers after the timeout, or
/// none, are timeouts; a close or a kick mid-run fails what is left at once (the timeout
/// is far longer than the run then: nothing may wait for it). Every slot counts as sent,
/// and the run ends by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_is_answered_timed_out_or_failed_and_the_run_ends_by_itself() {
    let (thread, tokio, ms) = (ClockKind::Thread, ClockKind::Tokio, Duration::from_millis);
    for (script, clock, timeout, failed) in [
        (Script::Silent, thread, ms(300), None),
        (Script::Late(ms(400)), tokio, ms(150), None),
        (Script::CloseAfter(10), tokio, ms(30_000), Some("closed")),
        (Script::KickAfter(10), tokio, ms(30_000), Some("kicked")),
    ] {
        let url = scripted_server(script).await;
        let mut spec = spec(2, 40, clock);
        spec.warmup = Duration::ZERO;
        spec.timeout = timeout;
        let began = Instant::now();
        let run = generator::run(&spec, &target(&url)).await.expect("run");
        // A close or kick comes after 10 answers per client (pushes ignored) and fails
        // the other 30 each; without one, all 80 time out.
        let (ok, timeouts, failures) = match failed {
            Some(kind) => (20, 0, BTreeMap::from([(kind, 60)])),
            None => (0, 80, BTreeMap::new()),
        };
        let counts = (run.sent, run.ok, run.timeouts, run.unanswered);
        assert_eq!(counts, (80, ok, timeouts, 0), "{script:?}");
        assert_eq!(run.latency.from_schedule.count, ok, "{script:?}");
        assert_eq!(run.failures, failures, "{script:?}");
        // 40 slots of 2 ms + timeout + margin, with room for a slow machine.
        assert!(began.elapsed() < Duration::from_secs(3) + HARD_MARGIN);
    }
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
    let run = generator::run(&spec, &target(server.url())).await;
    let run = run.expect("run");
    blocker.await.expect("blocker");
    assert_eq!(run.ok, 300);
    let l = &run.latency;
    let ms = |us: f64| us / 1000.0;
    assert!(ms(l.lag.max_us) >= 40.0, "the burst was sent late: {l:?}");
    let (from_schedule, from_send) = (ms(l.from_schedule.p90_us), ms(l.from_send.p90_us));
    assert!(from_schedule >= 20.0, "includes the lateness: {l:?}");
    assert!(from_send < 10.0, "from the send it does not: {l:?}");
}
