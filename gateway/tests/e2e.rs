//! The gate end to end on real sockets: WebSocket clients (the SDK, and a raw client
//! for bad input), a gate served in-process on port 0, workers on the bus. The checks
//! whose outcome is the bus's doing (queue groups, no responders, what a dead worker's
//! connection held, unsubscribing) run twice, `embedded::<check>` on our broker and
//! `nats_server::<check>` on the real nats-server, since a gate fleet may run on either;
//! those of the gate's own rules (codecs, limits, handshake, shutdown) run once, on our
//! broker.
//!
//! Nothing sleeps: handlers are held and released through channels, and every wait has
//! a deadline.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use bytes::Bytes;
use common::proxy::Proxy;
use common::raw::RawClient;
use common::{
    Bus, Bystander, DEADLINE, FullGate, Holds, TestGate, counting_echo, echo_worker, gate_config,
    queue_of, start_worker, within,
};
use gateway::{GateConfig, StaticToken};
use proto::client::{Handshake, Heartbeat, packet::Kind};
use proto::code;
use sdk::{Client, ClientOptions, ErrorKind};
use services::{FrameConfig, Service};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

broker::on_every_bus!(
    three_echo_workers_answer_every_request_and_share_the_load,
    unknown_route_is_404_at_once,
    full_worker_queue_gives_fast_503s;
    tcp_only:
    killed_worker_costs_only_the_requests_it_held,
    the_only_worker_restarting_gets_what_was_sent_meanwhile,
    a_stopped_gate_unsubscribes_its_replies,
);

/// WebSocket close codes the gate uses.
const CLOSE_INVALID: u16 = 1007;
const CLOSE_POLICY: u16 = 1008;
const CLOSE_SIZE: u16 = 1009;

async fn three_echo_workers_answer_every_request_and_share_the_load(bus: Bus) {
    let handled: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let mut workers = Vec::new();
    for count in &handled {
        let service = counting_echo(count.clone());
        workers.push(start_worker(bus.url(), service, FrameConfig::default()).await);
    }
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(gate.client().await);
    }

    let requests = (0..300).map(|i| {
        let client = clients[i % clients.len()].clone();
        async move {
            let body = format!("request {i}");
            let response = client.request("echo.raw", &body).await.unwrap();
            (body, response)
        }
    });
    let answers = within(futures::future::join_all(requests)).await;

    for (body, response) in &answers {
        assert_eq!(response.code, code::OK, "{response:?}");
        assert_eq!(response.body, body.as_bytes());
    }
    let counts: Vec<usize> = handled.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert_eq!(counts.iter().sum::<usize>(), 300, "{counts:?}");
    assert!(
        counts.iter().all(|&c| c > 0),
        "a worker got no share: {counts:?}"
    );
}

/// Requests that reach no worker while a service's only worker restarts are sent again
/// by the gate until the new one takes them: latency, not errors.
async fn the_only_worker_restarting_gets_what_was_sent_meanwhile(bus: Bus) {
    let (before, after) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // A service of raw methods only: it announces itself all the same (no types), so
    // the gate knows the route exists.
    let announced = counting_echo;
    let first = start_worker(bus.url(), announced(before.clone()), FrameConfig::default()).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    assert!(gate.gate.wait_for_schemas(&["echo"], DEADLINE).await);
    let client = gate.client().await;
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );
    first.stop().await;

    let sent: Vec<_> = (0..10)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.request("echo.raw", format!("{i}")).await })
        })
        .collect();
    // The worker is away for a while (a restart), then back.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _second = start_worker(bus.url(), announced(after.clone()), FrameConfig::default()).await;
    for (i, request) in sent.into_iter().enumerate() {
        let answer = within(request).await.unwrap().unwrap();
        assert_eq!(answer.code, code::OK, "request {i}: {answer:?}");
        assert_eq!(answer.body, format!("{i}").as_bytes());
    }
    assert_eq!(
        (
            before.load(Ordering::Relaxed),
            after.load(Ordering::Relaxed)
        ),
        (1, 10),
        "each request executed once, the ten by the new worker"
    );
}

async fn killed_worker_costs_only_the_requests_it_held(bus: Bus) {
    const BATCH: usize = 30;
    const TAGS: [&str; 3] = ["w0", "w1", "w2"];
    let config = gate_config(|c| c.request_timeout = Duration::from_secs(1));
    let gate = TestGate::start(&bus, config).await;
    let mut holds = Holds::default();
    let mut proxies = Vec::new();
    let mut workers = Vec::new();
    for tag in TAGS {
        let proxy = Proxy::start(bus.addr()).await;
        let service = holds.service("work", tag);
        workers.push(start_worker(proxy.url(), service, FrameConfig::default()).await);
        proxies.push(proxy);
    }
    let client = gate.client().await;
    let (answers_tx, mut answers) = mpsc::channel(BATCH + 1);
    let ask = |route: &'static str| {
        let (client, answers_tx) = (client.clone(), answers_tx.clone());
        tokio::spawn(async move {
            let response = client.request(route, "").await.unwrap();
            answers_tx.send(response).await.unwrap();
        });
    };

    // One request parks inside a handler; which worker took it is the bus's choice.
    ask("work.hold");
    let victim_tag = holds.started().await;
    let victim = TAGS.iter().position(|t| *t == victim_tag).unwrap();
    // More while it is held: the victim queues its share behind the held one.
    for _ in 0..BATCH {
        ask("work.who");
    }
    // Wait until each of them is answered by another worker or sits at the victim.
    let mut early = Vec::new();
    loop {
        let deliveries = proxies[victim].deliveries();
        let at_victim = deliveries.iter().filter(|d| d.subject.ends_with(".who"));
        if early.len() + at_victim.count() == BATCH {
            break;
        }
        tokio::select! {
            answer = answers.recv() => early.push(answer.unwrap()),
            () = proxies[victim].grown() => {}
        }
    }
    for answer in &early {
        assert_eq!(answer.code, code::OK, "{answer:?}");
        assert_ne!(
            answer.body,
            victim_tag.as_bytes(),
            "answered by the held worker"
        );
    }

    // The victim dies. What the broker gave it dies with it...
    proxies[victim].cut().await;
    // (Its deliveries are the requests it took, and the services' schema
    // announcements, which every worker hears to route calls to keyed services.)
    let held: BTreeSet<u64> = proxies[victim]
        .deliveries()
        .iter()
        .filter(|d| d.subject.contains(".svc.work."))
        .map(|d| request_id(d.reply.as_deref().unwrap()))
        .collect();
    assert_eq!(held.len(), BATCH - early.len() + 1, "the held request too");
    // ...and the gate answers exactly that 408.
    let mut timed_out = BTreeSet::new();
    for _ in 0..held.len() {
        let answer = within(answers.recv()).await.unwrap();
        assert_eq!(answer.code, code::TIMEOUT, "{answer:?}");
        timed_out.insert(answer.id);
    }
    assert_eq!(timed_out, held);

    // Everything after goes to the survivors.
    let after = (0..BATCH).map(|_| client.request("work.who", ""));
    for response in within(futures::future::join_all(after)).await {
        let response = response.unwrap();
        assert_eq!(response.code, code::OK, "{response:?}");
        assert_ne!(response.body, victim_tag.as_bytes());
    }
}

/// The request id at the end of a gate reply subject `<prefix>.gw.<gate>.<sid>.<id>`.
fn request_id(reply: &str) -> u64 {
    reply.rsplit('.').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_binary_frame_closes_with_invalid_packet() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = gate.raw().await;

    raw.send(Message::binary(vec![0xff; 8])).await;
    bystander.still_served().await;
    raw.expect_close(CLOSE_INVALID, "invalid packet").await;
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_text_frame_closes_with_invalid_packet() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = RawClient::connect(&gate.url).await;
    raw.send(Message::text(r#"{"handshake":{}}"#)).await;
    assert!(raw.next_text().await.contains(r#""code":200"#));

    raw.send(Message::text(r#"{"request":{"id":1,"route":"#))
        .await;
    bystander.still_served().await;
    raw.expect_close(CLOSE_INVALID, "invalid packet").await;
    bystander.still_served().await;
}

async fn unknown_route_is_404_at_once(bus: Bus) {
    let _echo = echo_worker(&bus).await;
    // The gate's own timeout (5 s) would answer 408: a 404 well before it is the bus
    // saying "no responders".
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut bystander = Bystander::join(&gate).await;
    let client = gate.client().await;

    let fast = Duration::from_secs(2);
    let response = client.request_with_timeout("nobody.home", "", fast).await;
    let response = response.expect("no 404 well before the gate's timeout");
    assert_eq!(response.code, code::NOT_FOUND, "{response:?}");
    // A known service without the method: the worker's own 404.
    let response = client.request("echo.nope", "").await.unwrap();
    assert_eq!(response.code, code::NOT_FOUND, "{response:?}");

    let response = client.request("echo.raw", "still here").await.unwrap();
    assert_eq!(response.code, code::OK, "{response:?}");
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_that_would_change_the_subject_are_400() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut bystander = Bystander::join(&gate).await;
    let client = gate.client().await;

    for route in [
        "echo.*",
        "*.raw",
        "echo.>",
        ">",
        "echo.a b",
        " echo.raw",
        "echo.raw.x",
        "echo..raw",
        "Echo.raw",
        "echo",
        "",
    ] {
        let response = client.request(route, "x").await.unwrap();
        assert_eq!(response.code, code::BAD_REQUEST, "{route:?}: {response:?}");
        assert!(!response.message.is_empty(), "{route:?}: no reason given");
        bystander.still_served().await;
    }
    let response = client.request("echo.raw", "still here").await.unwrap();
    assert_eq!(response.code, code::OK, "{response:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_closes_with_frame_too_large() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_frame = 1024)).await;
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = gate.raw().await;

    raw.request(1, "echo.raw", &"x".repeat(4096)).await;
    bystander.still_served().await;
    raw.expect_close(CLOSE_SIZE, "frame too large").await;
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_before_handshake_closes_with_handshake_required() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = RawClient::connect(&gate.url).await;

    raw.request(1, "echo.raw", "too soon").await;
    bystander.still_served().await;
    raw.expect_close(CLOSE_POLICY, "handshake required").await;
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_in_flight_is_429() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_in_flight = 2)).await;
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = gate.raw().await;

    raw.request(1, "park.hold", "").await;
    holds.started().await;
    raw.request(2, "park.who", "").await; // queued behind it: two in flight
    raw.request(3, "park.who", "").await; // one too many
    let response = raw.response().await;
    assert_eq!((response.id, response.code), (3, code::TOO_MANY_REQUESTS));
    // The limit is per session.
    bystander.still_served().await;

    holds.release("p");
    let mut done = [raw.response().await, raw.response().await].map(|r| (r.id, r.code));
    done.sort();
    assert_eq!(done, [(1, code::OK), (2, code::OK)]);
    raw.request(4, "park.who", "").await;
    let response = raw.response().await;
    assert_eq!((response.id, response.code), (4, code::OK));
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_gate_answers_503_at_once() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_gate_in_flight = 2)).await;
    let mut first = gate.raw().await;
    let mut second = gate.raw().await;

    first.request(1, "park.hold", "").await;
    holds.started().await;
    second.request(1, "park.who", "").await; // the gate's second and last slot
    first.request(2, "park.who", "").await; // the gate is full, whoever asks
    let response = first.response().await;
    assert_eq!((response.id, response.code), (2, code::UNAVAILABLE));
    assert_eq!(response.message, "gate overloaded");

    holds.release("p");
    let mut done = [first.response().await, second.response().await].map(|r| (r.id, r.code));
    done.sort();
    assert_eq!(done, [(1, code::OK), (1, code::OK)]);
    // The answered requests gave their slots back.
    for id in 3..=4 {
        first.request(id, "park.who", "").await;
        let response = first.response().await;
        assert_eq!((response.id, response.code), (id, code::OK));
    }
}

/// The gate handles up to `READ_BATCH` (64) frames its socket holds before it flushes;
/// more than two batches in one write must all be answered, refused ones too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_read_together_are_all_answered() {
    let bus = Bus::embedded().await;
    const FRAMES: u64 = 2 * 64 + 1;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|_| {})).await;
    let mut raw = gate.raw().await;
    raw.pipeline(1..=FRAMES, "echo.raw").await;
    let mut ids: Vec<u64> = Vec::new();
    for _ in 1..=FRAMES {
        let response = raw.response().await;
        assert_eq!(response.code, code::OK, "{response:?}");
        ids.push(response.id);
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=FRAMES).collect::<Vec<_>>());

    // The same with a full gate: every one is answered 503 at once.
    let mut full = FullGate::start(&bus).await;
    full.raw.pipeline(2..=FRAMES + 1, "park.who").await;
    for id in 2..=FRAMES + 1 {
        let response = full.raw.response().await;
        assert_eq!((response.id, response.code), (id, code::UNAVAILABLE));
    }
    full.release();
    assert_eq!(full.raw.response().await.code, code::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_fast_is_429() {
    let bus = Bus::embedded().await;
    const BURST: u64 = 4;
    let _echo = echo_worker(&bus).await;
    let config = gate_config(|c| {
        c.rate = 1;
        c.burst = BURST as u32;
    });
    let gate = TestGate::start(&bus, config).await;
    // Each session has its own bucket; the bystander spends three of its four tokens.
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = gate.raw().await;

    for id in 1..=3 * BURST {
        raw.request(id, "echo.raw", "quick").await;
    }
    let mut codes = BTreeMap::new();
    for _ in 1..=3 * BURST {
        let response = raw.response().await;
        codes.insert(response.id, response.code);
    }
    bystander.still_served().await;

    for id in 1..=BURST {
        assert_eq!(codes[&id], code::OK, "the burst is allowed: {codes:?}");
    }
    let limited = codes
        .values()
        .filter(|&&c| c == code::TOO_MANY_REQUESTS)
        .count();
    assert!(limited as u64 >= 2 * BURST - 1, "{codes:?}");
    assert!(
        codes
            .values()
            .all(|&c| c == code::OK || c == code::TOO_MANY_REQUESTS)
    );
    bystander.still_served().await;
}

async fn full_worker_queue_gives_fast_503s(bus: Bus) {
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(1)).await;
    // The gate would answer 408 only after 5 s: 503s while the handler is still held
    // are the worker refusing at once.
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut raw = gate.raw().await;

    raw.request(1, "park.hold", "").await;
    holds.started().await;
    for id in 2..=5 {
        raw.request(id, "park.who", "").await;
    }
    // Request 2 fills the queue of one; 3, 4 and 5 find it full.
    let mut refused = BTreeMap::new();
    for _ in 3..=5 {
        let response = raw.response().await;
        refused.insert(response.id, response.code);
    }
    assert_eq!(refused, BTreeMap::from([(3, 503), (4, 503), (5, 503)]));

    holds.release("p");
    let mut done = [raw.response().await, raw.response().await].map(|r| (r.id, r.code));
    done.sort();
    assert_eq!(done, [(1, code::OK), (2, code::OK)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_gives_408() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let config = gate_config(|c| c.request_timeout = Duration::from_millis(300));
    let gate = TestGate::start(&bus, config).await;
    let client = gate.client().await;

    let slow = tokio::spawn({
        let client = client.clone();
        async move { client.request("park.hold", "").await }
    });
    holds.started().await;
    // Answered while the handler still holds it.
    let response = within(slow).await.unwrap().unwrap();
    assert_eq!(response.code, code::TIMEOUT, "{response:?}");

    // The late answer is dropped, and the session goes on.
    holds.release("p");
    let response = client.request("park.who", "").await.unwrap();
    assert_eq!((response.code, &response.body[..]), (code::OK, &b"p"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_reaches_the_worker_and_gets_no_response() {
    let bus = Bus::embedded().await;
    let (notes_tx, mut notes) = mpsc::channel::<Bytes>(8);
    let service = Service::new("rec").raw_method("note", move |_ctx, body| {
        let _ = notes_tx.try_send(body);
        Ok(Bytes::from_static(b"noted"))
    });
    let _rec = start_worker(bus.url(), service, FrameConfig::default()).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;

    let client = gate.client().await;
    client.notify("rec.note", "from the sdk").await.unwrap();
    assert_eq!(within(notes.recv()).await.unwrap(), "from the sdk");

    let mut raw = gate.raw().await;
    raw.request(0, "rec.note", "n1").await;
    // Not even an error is answered to a notify.
    raw.request(0, "rec.*", "bad route").await;
    raw.request(0, "rec", "no method").await;
    raw.request(0, "nobody.note", "no worker").await;
    assert_eq!(within(notes.recv()).await.unwrap(), "n1");
    raw.request(7, "rec.note", "n2").await;
    assert_eq!(within(notes.recv()).await.unwrap(), "n2");
    // So the first frame back answers request 7.
    let response = raw.response().await;
    assert_eq!(
        (response.id, response.code, &response.body[..]),
        (7, code::OK, &b"noted"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_token_gets_401() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let tokens = Arc::new(StaticToken("s3cret".into()));
    let gate = TestGate::start_with_tokens(&bus, GateConfig::default(), tokens).await;
    let with_token = |token: &str| ClientOptions {
        token: token.into(),
        ..ClientOptions::default()
    };

    let refused = Client::connect(&gate.url, with_token("guess")).await;
    let error = refused.expect_err("a wrong token must be refused");
    assert_eq!(error.kind(), &ErrorKind::Handshake { code: 401 });
    let mut raw = RawClient::connect(&gate.url).await;
    let ack = raw
        .handshake(Handshake {
            token: "guess".into(),
            ..Handshake::default()
        })
        .await;
    assert_eq!(ack.code, code::UNAUTHORIZED);
    raw.expect_close(CLOSE_POLICY, "unauthorized").await;

    let client = gate.client_with(with_token("s3cret")).await;
    let response = client.request("echo.raw", "let in").await.unwrap();
    assert_eq!(response.code, code::OK, "{response:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_is_closed_with_heartbeat_missed() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    // The SDK beats once an interval and the gate closes after two: 500 ms leaves the
    // bystander's timer 500 ms to be late on a loaded machine.
    let config = gate_config(|c| c.heartbeat = Duration::from_millis(500));
    let gate = TestGate::start(&bus, config).await;
    // Idle as long as the raw client below, but the SDK sends heartbeats.
    let mut bystander = Bystander::join(&gate).await;
    let mut raw = RawClient::connect(&gate.url).await;
    let ack = raw.handshake(Handshake::default()).await;
    assert_eq!(ack.heartbeat_ms, 500);

    raw.send_packet(Kind::Heartbeat(Heartbeat {})).await;
    let answer = raw.next_packet().await;
    assert!(
        matches!(answer.kind, Some(Kind::Heartbeat(_))),
        "{answer:?}"
    );
    // Then silence.
    raw.expect_close(CLOSE_POLICY, "heartbeat missed").await;
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_timing_covers_the_handler_time() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let timed = gate
        .client_with(ClientOptions {
            server_timing: true,
            ..ClientOptions::default()
        })
        .await;
    let mut untimed = Bystander::join(&gate).await;

    let held = tokio::spawn({
        let timed = timed.clone();
        async move { timed.request("park.hold", "").await }
    });
    holds.started().await;
    // The handler is held for at least a whole round trip through the gate.
    untimed.still_served().await;
    holds.release("p");
    let response = within(held).await.unwrap().unwrap();

    assert_eq!(response.code, code::OK, "{response:?}");
    let timing = response.timing.expect("the handshake asked for timing");
    assert!(timing.handler_us > 0, "{timing:?}");
    assert!(
        timing.total_us >= timing.handler_us + timing.queue_us,
        "{timing:?}"
    );
    let plain = gate.client().await;
    let response = plain.request("echo.raw", "x").await.unwrap();
    assert_eq!(response.timing, None, "timing nobody asked for");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_clients_to_move_and_keeps_serving_them() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let _echo = echo_worker(&bus).await;
    // A grace longer than the test's deadline: the gate must stop because its clients
    // left, not because the grace ran out.
    let grace = Duration::from_secs(60);
    let mut gate = TestGate::start(&bus, gate_config(|c| c.shutdown_grace = grace)).await;
    let client = gate.client().await;
    let mut idle = gate.raw().await;
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.request("park.hold", "").await }
    });
    holds.started().await;

    gate.begin_shutdown();
    // Every session is told at once to move, with the reason and the grace it has.
    let drain = idle.next_packet().await;
    assert!(
        matches!(&drain.kind, Some(Kind::Drain(d)) if d.reason == "gate shutting down" && d.grace_ms == 60_000),
        "{drain:?}"
    );
    // The session goes on: a request sent now is forwarded and answered.
    idle.request(7, "echo.raw", "still here").await;
    let answer = idle.next_packet().await;
    assert!(
        matches!(&answer.kind, Some(Kind::Response(r)) if r.id == 7 && r.code == code::OK),
        "{answer:?}"
    );
    // The request in flight gets its worker's answer.
    holds.release("p");
    let response = within(held).await.unwrap().unwrap();
    assert_eq!(response.code, code::OK, "{response:?}");
    // New connections are refused; once the clients have left, the gate stops.
    let late = Client::connect(&gate.url, ClientOptions::default()).await;
    assert_eq!(late.unwrap_err().kind(), &ErrorKind::Connect);
    client.close().await;
    drop(idle);
    gate.stopped().await;
}

async fn a_stopped_gate_unsubscribes_its_replies(bus: Bus) {
    let _echo = echo_worker(&bus).await;
    let mut gate = TestGate::start(&bus, gate_config(|c| c.gate_id = "g-stop".into())).await;
    let client = gate.client().await;
    assert_eq!(
        client.request("echo.raw", "x").await.unwrap().code,
        code::OK
    );

    gate.begin_shutdown();
    gate.stopped().await;
    // Nothing holds the gate's reply subject any more: a request to it has no
    // responders (once the gate's UNSUB has reached the broker).
    let nats = within(async_nats::connect(bus.url())).await.unwrap();
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    loop {
        let asked = tokio::time::timeout(
            Duration::from_millis(500),
            nats.request("shaddock.gw.g-stop.1.1", "".into()),
        )
        .await;
        if matches!(&asked, Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reply subject is still subscribed: {asked:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_503_after_the_grace_period() {
    let bus = Bus::embedded().await;
    let mut holds = Holds::default();
    let _park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
    let config = gate_config(|c| c.shutdown_grace = Duration::from_millis(200));
    let mut gate = TestGate::start(&bus, config).await;
    let client = gate.client().await;
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.request("park.hold", "").await }
    });
    holds.started().await;

    gate.begin_shutdown();
    let response = within(held).await.unwrap().unwrap();
    assert_eq!(response.code, code::UNAVAILABLE, "{response:?}");
    assert_eq!(response.message, "gate shutting down");
    assert_eq!(within(client.closed()).await, "gate shutting down");
    gate.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_frames_speak_json() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut raw = RawClient::connect(&gate.url).await;
    let json = |text: String| serde_json::from_str::<serde_json::Value>(&text).unwrap();

    raw.send(Message::text(r#"{"handshake":{}}"#)).await;
    let ack = json(raw.next_text().await);
    assert_eq!(ack["handshake_ack"]["code"], 200, "{ack}");

    raw.send(Message::text(
        r#"{"request":{"id":1,"route":"echo.raw","body":"hi"}}"#,
    ))
    .await;
    let response = json(raw.next_text().await);
    assert_eq!(response["response"]["id"], 1, "{response}");
    assert_eq!(response["response"]["code"], 200, "{response}");
    assert_eq!(response["response"]["body"], "hi", "{response}");

    raw.send(Message::text(r#"{"request":{"id":2,"route":"echo.*"}}"#))
        .await;
    let response = json(raw.next_text().await);
    assert_eq!(response["response"]["id"], 2, "{response}");
    assert_eq!(response["response"]["code"], 400, "{response}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_in_the_grace_requests_are_not_forwarded() {
    let bus = Bus::embedded().await;
    let handled = Arc::new(AtomicUsize::new(0));
    let _echo = start_worker(bus.url(), counting_echo(handled.clone()), queue_of(8)).await;
    let grace = Duration::from_millis(400);
    let mut gate = TestGate::start(&bus, gate_config(|c| c.shutdown_grace = grace)).await;
    let mut raw = gate.raw().await;
    raw.request(1, "echo.raw", "before").await;
    assert_eq!(raw.response().await.code, code::OK);
    assert_eq!(handled.load(Ordering::SeqCst), 1);

    gate.begin_shutdown();
    let drain = raw.next_packet().await;
    assert!(matches!(drain.kind, Some(Kind::Drain(_))), "{drain:?}");
    // Past the first half of the grace the gate forwards nothing more: a request is
    // answered at once, with the message that says it is safe to send elsewhere.
    tokio::time::sleep(grace / 2 + Duration::from_millis(50)).await;
    raw.request(2, "echo.raw", "late").await;
    let late = raw.response().await;
    assert_eq!((late.id, late.code), (2, code::UNAVAILABLE), "{late:?}");
    assert_eq!(late.message, "gate draining");
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "the late request was not forwarded"
    );
    // At the end of the grace the session is closed, with the reason.
    let kick = raw.next_packet().await;
    assert!(
        matches!(&kick.kind, Some(Kind::Kick(k)) if k.reason == "gate shutting down"),
        "{kick:?}"
    );
    gate.stopped().await;
}
