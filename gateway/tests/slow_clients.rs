//! Clients that stop reading (docs/gateway.md, "Slow clients"): a session whose socket
//! takes nothing for `--write-timeout-ms`, or whose queue fills, is closed as too slow;
//! until then it receives everything, in order; what it holds is given back on time;
//! and no handful of such sessions costs anyone else an answer. Real gate, real bus (our
//! broker: this is the gate's socket side), real WebSockets; the slow clients' sockets have the smallest receive buffer the
//! kernel allows, so they fill after kilobytes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::raw::{Frame, RawClient};
use common::{
    Bus, Bystander, DEADLINE, Holds, TestGate, echo_worker, gate_config, queue_of, start_worker,
    within,
};
use futures::future::join_all;
use proto::client::{Heartbeat, packet::Kind};
use proto::code;
use services::{FrameConfig, Service};
use tokio::time::Instant;

/// Pushes of this many bytes fill a slow client's window after a handful.
const PUSH_BYTES: usize = 512;

/// A room service: `join` puts the session in group `r`; `flood` with body `from,count`
/// broadcasts pushes `from..from + count` to it on route `room.msg`, each body its
/// number padded to [`PUSH_BYTES`].
fn room() -> Service {
    Service::new("room")
        .raw_method("join", |ctx, _| {
            ctx.join("r");
            Ok(Bytes::new())
        })
        .raw_method("flood", |ctx, body| {
            let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
            let (from, count) = text.split_once(',').ok_or("from,count")?;
            let from: usize = from.parse().map_err(|_| "from")?;
            let count: usize = count.parse().map_err(|_| "count")?;
            for n in from..from + count {
                ctx.broadcast("r", "room.msg", format!("{n:0PUSH_BYTES$}"))?;
            }
            Ok(Bytes::new())
        })
}

/// The numbers of the room pushes `client` reads until its connection ends, and how it
/// ended (a close frame's reason, or `None`).
async fn pushes_until_the_end(client: &mut RawClient) -> (Vec<usize>, Option<String>) {
    let mut numbers = Vec::new();
    loop {
        match client.next_frame().await {
            Frame::Packet(packet) => match packet.kind {
                Some(Kind::Push(push)) if push.route == "room.msg" => {
                    numbers.push(std::str::from_utf8(&push.body).unwrap().parse().unwrap());
                }
                _ => {}
            },
            Frame::Close(_, reason) => return (numbers, Some(reason)),
            Frame::Ended => return (numbers, None),
            Frame::Text(_) => {}
        }
    }
}

/// Waits until `gate` holds `sessions` sessions, for at most `limit`.
async fn sessions_come_down_to(gate: &TestGate, sessions: usize, limit: Duration) {
    let started = Instant::now();
    while gate.gate.session_count() != sessions {
        assert!(
            started.elapsed() < limit,
            "{} sessions after {limit:?}, not {sessions}",
            gate.gate.session_count()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A room member stops reading while another floods the room: it is closed as too slow
/// within the write timeout of the flood's end, and what it received until then is
/// every push from the first, in order, none missing. The sender and a third member,
/// which reads, notice nothing: every flood is answered and the third gets every push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_reading_misses_nothing_until_it_is_closed_as_too_slow() {
    let bus = Bus::embedded().await;
    const FLOODS: usize = 20;
    const PER_FLOOD: usize = 1_000;
    const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
    let _room = start_worker(bus.url(), room(), FrameConfig::default()).await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| {
            c.write_timeout = WRITE_TIMEOUT;
            // Room for the whole flood: the reading member, however late its task runs,
            // is never too slow, and the slow one is cut by the write timeout.
            c.outbound_queue = FLOODS * PER_FLOOD;
            c.outbound_bytes = 1 << 30;
        }),
    )
    .await;
    let mut slow = RawClient::handshaken_small_window(&gate.url).await;
    slow.request(1, "room.join", "").await;
    assert_eq!(slow.response().await.code, code::OK);
    let mut third = gate.raw().await;
    third.request(1, "room.join", "").await;
    assert_eq!(third.response().await.code, code::OK);
    let sender = gate.client().await;
    let reader = tokio::spawn(async move { pushes_until_the_end(&mut third).await });
    for flood in 0..FLOODS {
        let body = format!("{},{PER_FLOOD}", flood * PER_FLOOD);
        let answer = within(sender.request("room.flood", body)).await.unwrap();
        assert_eq!(answer.code, code::OK, "flood {flood}: {answer:?}");
    }
    // The third member and the sender stay; the slow one goes.
    sessions_come_down_to(&gate, 2, WRITE_TIMEOUT + Duration::from_secs(2)).await;
    let (received, ended) = pushes_until_the_end(&mut slow).await;
    assert!(
        received.iter().copied().eq(0..received.len()),
        "a gap or a reordering in the {} pushes the slow member received",
        received.len()
    );
    assert!(received.len() < FLOODS * PER_FLOOD, "it was never too slow");
    // One try at the close frame: it says why when it fits.
    assert!(ended.is_none_or(|reason| reason == "too slow"));
    drop(sender);
    let (all, _) = {
        // The third member read everything; closing the gate ends its stream.
        let all_in = Instant::now();
        while gate.gate.session_count() > 1 && all_in.elapsed() < DEADLINE {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(gate);
        within(reader).await.unwrap()
    };
    assert!(
        all.iter().copied().eq(0..FLOODS * PER_FLOOD),
        "the reading member got {} pushes, not every one in order",
        all.len()
    );
}

/// A session that sends and never reads: once its socket is full, requests it sent are
/// still answered 408 at the request timeout (its slots of the gate's budget freed,
/// though the answers cannot be written), and the session is cut at the write timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_never_reads_frees_its_slots_on_time_and_is_cut_at_its_write_timeout() {
    let bus = Bus::embedded().await;
    const HELD: u64 = 10;
    const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
    const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
    let _echo = echo_worker(&bus).await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(64)).await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| {
            c.request_timeout = REQUEST_TIMEOUT;
            c.write_timeout = WRITE_TIMEOUT;
            // The write deadline, not the queue's bounds, is what this test cuts at.
            c.outbound_queue = 100_000;
            c.outbound_bytes = 1 << 30;
        }),
    )
    .await;
    let mut client = RawClient::handshaken_small_window(&gate.url).await;
    // The earliest the socket can have stopped taking: before the first answer.
    let stalled = Instant::now();
    // Answers of 32 KiB fill its window and the gate's socket buffer.
    let body = "x".repeat(32 * 1024);
    for id in 1..=200 {
        client.request(id, "echo.raw", &body).await;
    }
    for id in 1_000..1_000 + HELD {
        client.request(id, "park.hold", "").await;
    }
    holds.started().await;
    within(async {
        while gate.gate.in_flight() != HELD as usize {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Freed at the request timeout, long before the write timeout.
    within(async {
        while gate.gate.in_flight() != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(stalled.elapsed() < WRITE_TIMEOUT, "{:?}", stalled.elapsed());
    assert_eq!(gate.gate.session_count(), 1, "cut before its write timeout");
    sessions_come_down_to(&gate, 0, WRITE_TIMEOUT + Duration::from_secs(2)).await;
    assert!(
        stalled.elapsed() >= WRITE_TIMEOUT,
        "{:?}",
        stalled.elapsed()
    );
    holds.release("p");
}

/// A hundred sessions each send 256 requests and never read a byte: a session that
/// reads, on the same gate, gets every one of its 200 requests answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sessions_that_never_read_cost_a_reader_no_503() {
    let bus = Bus::embedded().await;
    const ATTACKERS: usize = 100;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let mut reader = Bystander::join(&gate).await;
    let attackers = join_all((0..ATTACKERS).map(|_| async {
        let mut client = RawClient::handshaken_small_window(&gate.url).await;
        client.pipeline(1..=256, "echo.raw").await;
        client
    }))
    .await;
    for _ in 0..200 {
        reader.still_served().await;
    }
    drop(attackers);
}

/// Heartbeats and WebSocket pings count against the session's rate like requests:
/// past the burst a heartbeat is not answered, and a request after pings that used the
/// burst up is answered 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_and_pings_are_refused_past_the_rate() {
    const BURST: u32 = 10;
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| {
            c.rate = 1;
            c.burst = BURST;
        }),
    )
    .await;
    let mut client = gate.raw().await;
    for _ in 0..5 * BURST {
        client.send_packet(Kind::Heartbeat(Heartbeat {})).await;
    }
    client.request(1, "echo.raw", "after").await;
    let mut heartbeats = 0;
    let response = loop {
        match client.next_packet().await.kind {
            Some(Kind::Heartbeat(_)) => heartbeats += 1,
            Some(Kind::Response(response)) => break response,
            other => panic!("{other:?}"),
        }
    };
    // The burst, and the few tokens refilled meanwhile (one a second): far from all.
    assert!((BURST..2 * BURST).contains(&heartbeats), "{heartbeats}");
    assert_eq!(response.code, code::TOO_MANY_REQUESTS);

    let mut client = gate.raw().await;
    // Five past the burst: the request after them is refused unless five seconds pass.
    for _ in 0..BURST + 5 {
        client
            .send(tokio_tungstenite::tungstenite::Message::Ping(Bytes::new()))
            .await;
    }
    client.request(1, "echo.raw", "after").await;
    assert_eq!(client.response().await.code, code::TOO_MANY_REQUESTS);
}

/// The gate's last `--gate-reserve` slots are for light sessions: a session with
/// `--light-in-flight` requests out is refused 503 there, one with fewer is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_reserve_is_for_light_sessions() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| {
            c.max_gate_in_flight = 4;
            c.gate_reserve = 2;
            c.light_in_flight = 2;
        }),
    )
    .await;
    let mut heavy = gate.raw().await;
    heavy.request(1, "park.hold", "").await;
    holds.started().await;
    heavy.request(2, "park.hold", "").await;
    // Two out: heavy now, and the budget's free slots are the reserve.
    heavy.request(3, "park.hold", "").await;
    let refused = heavy.response().await;
    assert_eq!(
        (refused.id, refused.code),
        (3, code::UNAVAILABLE),
        "{refused:?}"
    );
    let mut light = gate.raw().await;
    light.request(1, "park.hold", "").await;
    light.request(2, "park.hold", "").await;
    within(async {
        while gate.gate.in_flight() != 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // The whole budget is taken now: even a light session is refused.
    let mut third = gate.raw().await;
    third.request(1, "park.hold", "").await;
    assert_eq!(third.response().await.code, code::UNAVAILABLE);
    for _ in 0..4 {
        holds.release("p");
    }
}

/// A bad frame before the handshake is answered with a close frame saying why, not a
/// bare end of the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_first_frame_gets_a_close_frame_with_a_reason() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_frame = 1024)).await;
    let mut client = RawClient::connect(&gate.url).await;
    client
        .send(tokio_tungstenite::tungstenite::Message::binary(vec![
            0;
            4096
        ]))
        .await;
    client.expect_close(1009, "frame too large").await;
}
