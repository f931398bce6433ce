//! `--max-bus-pending` at the session level, against a bus server that takes the gate's
//! connection and then stops reading it: what does not fit in the kernel's buffers waits
//! in the gate's outbound buffer, and once `max_bus_pending` bytes wait a request is
//! answered `503 gate overloaded` at once. With a limit the traffic never reaches, the
//! same stalled bus gives only 408s: the limit causes the 503s, not the kernel.
//!
//! When the first refusal comes depends on the kernel (how far the gate's send buffer
//! has grown) and on scheduling (a writer that has not yet run leaves the buffer full
//! for a moment, which is refused too, and then drains it): the tests hold it to an
//! upper bound computed from the buffers, never to an exact count.
//!
//! `write_timeout` bounds how long the gate waits on such a server: past it the
//! connection is declared dead and the gate moves to the next server of its list.
//!
//! The stalled server is written here (a real socket, a real NATS handshake); the gate
//! and its client are the real ones. The test binary installs a metrics recorder, hence
//! a file of its own.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use broker::testing::Bus;
use bus::BusOptions;
use common::{DEADLINE, TestGate, echo_worker, gate_config, within};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use gateway::AnyToken;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use proto::code;
use sdk::Client;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The stalled server's receive buffer, asked of the kernel (which doubles it): the
/// bus's side of the connection takes in as little as it can before it stops reading.
const STALLED_RECV_BUFFER: u32 = 4096;
/// A request body: large, yet below the gate's largest frame (64 KiB) with its route.
const BODY: usize = 60 * 1024;
/// What a request adds to its body on the bus: the PUB line (subject, reply subject,
/// length) and the session's header (route, session id, uid). Well under this.
const REQUEST_HEADROOM: usize = 4 * 1024;
/// The largest TCP segment on loopback (its MTU is 64 KiB).
const LOOPBACK_SEGMENT: usize = 64 * 1024;
/// The gate's outbound buffer limit in the test that reaches it: a few requests.
const SMALL_BACKLOG: usize = 64 * 1024;
/// The gate's request timeout: the 408 of every request that went into the buffer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A route the session itself refuses (400), without the bus: its answer comes after
/// the answers to every request sent before it.
const BARRIER_ROUTE: &str = "not a route";

/// Held by each test throughout: the metrics recorder is global, and two gates count
/// under the same names, so the tests run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A NATS server that completes the handshake, answers the PING with a PONG, and then
/// never reads again, holding the connection open. Stopped (its connections closed)
/// when dropped.
struct StalledBus {
    url: String,
    /// The receive buffer its connections have, as the kernel set it.
    recv_buffer: usize,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl StalledBus {
    fn start() -> StalledBus {
        let socket = TcpSocket::new_v4().unwrap();
        // Before listen: accepted connections inherit it, and it sets the window the
        // server offers in the handshake.
        socket.set_recv_buffer_size(STALLED_RECV_BUFFER).unwrap();
        let recv_buffer = socket.recv_buffer_size().unwrap() as usize;
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(16).unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            // Dropped with this task when it is aborted, which aborts every connection's.
            let mut stalled = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                stalled.spawn(stall(stream));
            }
        });
        StalledBus {
            url,
            recv_buffer,
            accepted,
            task,
        }
    }

    /// A gate on this server, holding at most `max_bus_pending` bytes for its writer.
    async fn gate(&self, max_bus_pending: usize) -> TestGate {
        let mut options = BusOptions::new([self.url.clone()]);
        // The server never answers a ping, nor takes a write; pinged less often, and
        // writes bounded longer, than the test lasts, the connection stays up (and its
        // buffer full) throughout.
        options.ping_interval = DEADLINE * 6;
        options.write_timeout = DEADLINE * 6;
        let config = gate_config(|c| {
            c.max_bus_pending = max_bus_pending;
            c.request_timeout = REQUEST_TIMEOUT;
        });
        TestGate::start_on(options, config, Arc::new(AnyToken)).await
    }

    /// How many connections it took: one for a gate that never lost its connection.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for StalledBus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: INFO, then read up to the client's `CONNECT ...\r\nPING\r\n` (the gate
/// counts itself connected at the PONG), PONG, and never read again.
async fn stall(mut stream: TcpStream) {
    let info = br#"INFO {"server_id":"stalled","server_name":"stalled","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}"#;
    if stream.write_all(info).await.is_err() || stream.write_all(b"\r\n").await.is_err() {
        return;
    }
    let mut seen = Vec::new();
    while !seen.ends_with(b"\r\nPING\r\n") {
        match stream.read_buf(&mut seen).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    if stream.write_all(b"PONG\r\n").await.is_err() {
        return;
    }
    // Open and unread until the test ends.
    std::future::pending::<()>().await;
}

/// The most request bytes the gate can ever take in on a connection whose server stops
/// reading, with `max_bus_pending`: the kernel's send buffer on the gate's side
/// (autotuned, at most `tcp_wmem`'s maximum, and a write may queue one segment past it)
/// and the stalled server's receive buffer; then the chunk the gate's writer holds while
/// it blocks and the outbound buffer behind it, each at most `max_bus_pending` plus the
/// one request that crossed it. Past these every request is refused.
fn backlog_bound(bus: &StalledBus, max_bus_pending: usize) -> usize {
    let most_per_request = BODY + REQUEST_HEADROOM;
    kernel_send_buffer_max()
        + LOOPBACK_SEGMENT
        + bus.recv_buffer
        + 2 * (max_bus_pending + most_per_request)
}

/// The most requests of [`BODY`] bytes the gate can take in (each puts at least its
/// body into the buffers).
fn most_taken_in(bus: &StalledBus, max_bus_pending: usize) -> usize {
    backlog_bound(bus, max_bus_pending) / BODY
}

/// The requests the tests send: twice what the gate can take in with [`SMALL_BACKLOG`],
/// so that with it most are refused.
fn flood_size(bus: &StalledBus) -> usize {
    2 * (most_taken_in(bus, SMALL_BACKLOG) + 1)
}

/// The largest send buffer a TCP socket grows to on this machine (Linux: the third
/// figure of `tcp_wmem`); 4 MiB, Linux's usual figure, where it cannot be read.
fn kernel_send_buffer_max() -> usize {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20)
}

/// One request's answer (code 0 when the SDK got none), and how long it took.
#[derive(Debug)]
struct Answer {
    index: usize,
    code: u32,
    message: String,
    elapsed: Duration,
}

impl Answer {
    fn refused(&self) -> bool {
        self.code == code::UNAVAILABLE && self.message == "gate overloaded"
    }
}

/// Big requests to `echo.raw`: answers in hand, and the requests still awaiting theirs.
struct Flood {
    answered: Vec<Answer>,
    waiting: FuturesUnordered<BoxFuture<'static, Answer>>,
    /// The first request refused.
    refused: Option<usize>,
}

impl Flood {
    /// Sends requests of [`BODY`] bytes one at a time, each followed by a request to
    /// [`BARRIER_ROUTE`] whose 400 says the gate has handled it (and sent its answer if
    /// it refused it): `requests` of them, or fewer with `until_refused`, which stops at
    /// the first refusal.
    async fn send(client: &Client, requests: usize, until_refused: bool) -> Flood {
        let mut flood = Flood {
            answered: Vec::new(),
            waiting: FuturesUnordered::new(),
            refused: None,
        };
        let body = bytes::Bytes::from(vec![b'x'; BODY]);
        for index in 0..requests {
            let (sender, body) = (client.clone(), body.clone());
            flood.waiting.push(
                async move {
                    let started = Instant::now();
                    let answer = sender.request("echo.raw", &body).await;
                    let (code, message) =
                        answer.map_or_else(|e| (0, e.to_string()), |r| (r.code, r.message));
                    Answer {
                        index,
                        code,
                        message,
                        elapsed: started.elapsed(),
                    }
                }
                .boxed(),
            );
            // Polled first, the request is sent before the barrier.
            let barrier = client.request(BARRIER_ROUTE, "");
            tokio::pin!(barrier);
            let barrier = within(async {
                loop {
                    tokio::select! {
                        biased;
                        Some(answer) = flood.waiting.next() => flood.answered.push(answer),
                        barrier = &mut barrier => return barrier,
                    }
                }
            })
            .await;
            assert_eq!(barrier.unwrap().code, code::BAD_REQUEST);
            // Answered before the barrier: ready now.
            while let Some(Some(answer)) = flood.waiting.next().now_or_never() {
                flood.answered.push(answer);
            }
            if flood.refused.is_none()
                && flood
                    .answered
                    .iter()
                    .any(|a| a.index == index && a.refused())
            {
                flood.refused = Some(index);
                if until_refused {
                    break;
                }
            }
        }
        flood
    }

    /// Waits for every answer; all of them, by request.
    async fn finish(mut self) -> Vec<Answer> {
        within(async {
            while let Some(answer) = self.waiting.next().await {
                self.answered.push(answer);
            }
        })
        .await;
        self.answered.sort_by_key(|a| a.index);
        self.answered
    }
}

/// Checks that every answer is a refusal at once or the gate's 408 after its timeout.
fn assert_refused_or_timed_out(answers: &[Answer]) {
    for answer in answers {
        if answer.refused() {
            assert!(
                answer.elapsed < REQUEST_TIMEOUT,
                "a refusal comes at once, not after the request timeout: {answer:?}"
            );
        } else {
            assert_eq!(answer.code, code::TIMEOUT, "only 503 or 408: {answer:?}");
            assert!(
                answer.elapsed >= REQUEST_TIMEOUT,
                "a 408 comes after the request timeout: {answer:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_stops_reading_gets_requests_refused_at_once_past_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let bus = StalledBus::start();
    let gate = bus.gate(SMALL_BACKLOG).await;
    let client = gate.client().await;
    let bound = backlog_bound(&bus, SMALL_BACKLOG);
    let most = most_taken_in(&bus, SMALL_BACKLOG);
    let flood = Flood::send(&client, flood_size(&bus), false).await;
    let Some(first) = flood.refused else {
        panic!("no 503 in {} requests of {BODY} bytes", flood_size(&bus));
    };
    let answers = flood.finish().await;
    assert_eq!(answers.len(), flood_size(&bus));
    let taken_in = answers.iter().filter(|a| !a.refused()).count();
    eprintln!(
        "first refusal at request {first}; {taken_in} of {} requests of {BODY} bytes taken in \
         (~{} KiB); bound {most} requests, {} KiB",
        answers.len(),
        taken_in * BODY / 1024,
        bound / 1024
    );
    assert!(
        taken_in <= most,
        "{taken_in} requests taken in, past the bound of {most}"
    );
    assert_refused_or_timed_out(&answers);

    // Nothing is stuck: a second client is answered too, refused at once within the
    // same bound (it holds for what the gate takes in from both clients); mostly its
    // first request is.
    let other = gate.client().await;
    let second = Flood::send(&other, most + 1, true).await;
    assert!(
        second.refused.is_some(),
        "the second client was not refused"
    );
    let second = second.finish().await;
    assert_refused_or_timed_out(&second);

    let refusals = answers
        .iter()
        .chain(&second)
        .filter(|a| a.refused())
        .count();
    let mut counted = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if broker::testing::series(key.key()) == "gate_rejected_total{reason=bus_backlog}"
            && let DebugValue::Counter(n) = value
        {
            counted += n as usize;
        }
    }
    assert_eq!(counted, refusals, "bus_backlog refusals counted");
    assert_eq!(bus.accepted(), 1, "the gate kept its one connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_limit_the_same_stalled_bus_gives_only_timeouts() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let bus = StalledBus::start();
    // The other test's traffic, under a limit it never reaches (each request puts at
    // most its body and headroom in the buffer).
    let requests = flood_size(&bus);
    let gate = bus.gate(requests * (BODY + REQUEST_HEADROOM)).await;
    let client = gate.client().await;
    let answers = Flood::send(&client, requests, false).await.finish().await;
    assert_eq!(answers.len(), requests);
    assert!(
        answers.iter().all(|a| a.code == code::TIMEOUT),
        "{answers:?}"
    );
    assert_refused_or_timed_out(&answers);
    assert_eq!(bus.accepted(), 1, "the gate kept its one connection");
}

/// A gate given a stalled server first and a real broker (with an echo worker) second:
/// once a write has waited `write_timeout`, the gate declares the stalled connection
/// dead and moves to the broker, where the same client's requests are answered 200.
/// Without the bound it would wait on the stalled server for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_leaves_a_server_that_stops_reading_after_its_write_timeout() {
    const WRITE_TIMEOUT: Duration = Duration::from_millis(300);
    let _alone = ONE_AT_A_TIME.lock().await;
    let stalled = StalledBus::start();
    let broker = Bus::embedded().await;
    let _worker = echo_worker(&broker).await;
    let mut options = BusOptions::new([stalled.url.clone(), broker.url().to_owned()]);
    options.randomize = false;
    options.ping_interval = DEADLINE * 6;
    options.write_timeout = WRITE_TIMEOUT;
    let config = gate_config(|c| c.request_timeout = REQUEST_TIMEOUT);
    let gate = TestGate::start_on(options, config, Arc::new(AnyToken)).await;
    let client = gate.client().await;
    assert_eq!(
        stalled.accepted(),
        1,
        "the gate starts on the stalled server"
    );
    // Enough to block the gate's writer: more than every buffer on the way holds.
    let flood = Flood::send(&client, flood_size(&stalled), false).await;
    drop(flood);
    let moved = within(async {
        loop {
            let answer = client.request("echo.raw", "after").await.unwrap();
            if answer.code == code::OK {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(&moved.body[..], b"after");
    assert_eq!(
        stalled.accepted(),
        1,
        "the gate went back to the stalled server"
    );
}
