//! The bus against the real broker, in process: each test dials it through a [`Tap`]
//! that records what the bus wrote on each connection and can hold it back or cut it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Bus, BusError, BusOptions, Dispatch, Incoming, LocalStream, Reply, run};

mod direct;

/// How long a test waits for what must happen.
const DEADLINE: Duration = Duration::from_secs(10);

/// What a [`Heard`] dispatch heard.
#[derive(Debug, PartialEq)]
enum Event {
    Msg {
        target: u32,
        subject: String,
        reply: Option<String>,
        payload: Vec<u8>,
    },
    Up,
    Lost,
}

/// Passes on all it hears, in order.
struct Heard(mpsc::UnboundedSender<Event>);

impl Dispatch<u32> for Heard {
    fn deliver(&self, target: &u32, msg: Incoming<'_>) {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let _ = self.0.send(Event::Msg {
            target: *target,
            subject: text(msg.subject),
            reply: msg.reply.map(text),
            payload: msg.payload.to_vec(),
        });
    }
    fn connected(&self) {
        let _ = self.0.send(Event::Up);
    }
    fn lost(&self) {
        let _ = self.0.send(Event::Lost);
    }
}

/// Connections to a broker through a proxy: what the bus writes on each is recorded,
/// [`Tap::hold`] stops passing it on (so the server answers nothing more),
/// [`Tap::hold_answers`] keeps what the server sends until [`Tap::release_answers`], and
/// [`Tap::cut`] closes the current one.
#[derive(Default)]
struct Tap {
    written: Mutex<Vec<Arc<Mutex<Vec<u8>>>>>,
    held: AtomicBool,
    answers_held: AtomicBool,
    answers_released: tokio::sync::Notify,
    cut: Mutex<CancellationToken>,
}

impl Tap {
    fn options(self: &Arc<Tap>, server: broker::Server) -> BusOptions {
        let tap = self.clone();
        BusOptions::in_process(crate::dial_with(move || {
            tap.connect(server.connect_in_process())
        }))
    }

    fn connect(self: &Arc<Tap>, server: broker::InProcessStream) -> LocalStream {
        let (bus_end, proxy_end) = tokio::io::duplex(1 << 16);
        let written = Arc::new(Mutex::new(Vec::new()));
        self.written.lock().unwrap().push(written.clone());
        let cut = self.cut.lock().unwrap().clone();
        let tap = self.clone();
        tokio::spawn(async move {
            let (mut from_bus, mut to_bus) = tokio::io::split(proxy_end);
            let (mut from_server, mut to_server) = tokio::io::split(server);
            let (mut up, mut down) = (Vec::new(), Vec::new());
            loop {
                tokio::select! {
                    () = cut.cancelled() => return,
                    read = from_bus.read_buf(&mut up) => {
                        if read.unwrap_or(0) == 0 {
                            return;
                        }
                        if !tap.held.load(Ordering::Relaxed) {
                            written.lock().unwrap().extend_from_slice(&up);
                            let _ = to_server.write_all(&up).await;
                            up.clear();
                        }
                    }
                    read = from_server.read_buf(&mut down) => {
                        if read.unwrap_or(0) == 0 {
                            return;
                        }
                        if !tap.answers_held.load(Ordering::Relaxed) {
                            let _ = to_bus.write_all(&down).await;
                            down.clear();
                        }
                    }
                    () = tap.answers_released.notified(), if !down.is_empty() => {
                        let _ = to_bus.write_all(&down).await;
                        down.clear();
                    }
                }
            }
        });
        Box::new(bus_end)
    }

    /// What the bus wrote on connection `n` (from 0) that reached the server.
    fn written(&self, n: usize) -> String {
        let written = self.written.lock().unwrap()[n].lock().unwrap().clone();
        String::from_utf8_lossy(&written).into_owned()
    }

    fn hold(&self) {
        self.held.store(true, Ordering::Relaxed);
    }

    fn hold_answers(&self) {
        self.answers_held.store(true, Ordering::Relaxed);
    }

    /// Passes on what the server sent meanwhile, and all it sends from now on.
    fn release_answers(&self) {
        self.answers_held.store(false, Ordering::Relaxed);
        self.answers_released.notify_one();
    }

    fn cut(&self) {
        let mut cut = self.cut.lock().unwrap();
        cut.cancel();
        *cut = CancellationToken::new();
    }
}

/// A bus on `server` through a new tap, its first subscription `first.>` (target 1),
/// connected.
async fn connected(
    server: &broker::Server,
) -> (Arc<Bus<u32>>, Arc<Tap>, mpsc::UnboundedReceiver<Event>) {
    connected_with(server, |_| {}).await
}

/// [`connected`], its options changed by `change` first.
async fn connected_with(
    server: &broker::Server,
    change: impl FnOnce(&mut BusOptions),
) -> (Arc<Bus<u32>>, Arc<Tap>, mpsc::UnboundedReceiver<Event>) {
    let tap = Arc::new(Tap::default());
    let mut options = tap.options(server.clone());
    change(&mut options);
    let bus = Bus::new(options, "first.>".into(), 1, 1 << 20);
    let (tx, mut heard) = mpsc::unbounded_channel();
    tokio::spawn(run(bus.clone(), Arc::new(Heard(tx))));
    assert_eq!(next(&mut heard).await, Event::Up);
    (bus, tap, heard)
}

async fn next(heard: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(DEADLINE, heard.recv())
        .await
        .expect("heard within the deadline")
        .expect("the dispatch lives")
}

/// Every message heard until now, as (target, payload).
fn heard_now(heard: &mut mpsc::UnboundedReceiver<Event>) -> Vec<(u32, String)> {
    let mut msgs = Vec::new();
    while let Ok(event) = heard.try_recv() {
        if let Event::Msg {
            target, payload, ..
        } = event
        {
            msgs.push((target, String::from_utf8(payload).unwrap()));
        }
    }
    msgs
}

/// Waits until `tap`'s connection `n` has carried `text`.
async fn until_written(tap: &Tap, n: usize, text: &str) {
    tokio::time::timeout(DEADLINE, async {
        while tap.written.lock().unwrap().len() <= n || !tap.written(n).contains(text) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{text:?} not written on connection {n}"));
}

fn publish(bus: &Bus<u32>, subject: &str, payloads: impl IntoIterator<Item = u32>) {
    for p in payloads {
        bus.publish_bytes(subject, Reply::None, p.to_string().as_bytes())
            .unwrap();
    }
}

#[tokio::test]
async fn a_queue_subscription_names_its_group_and_shares_the_messages() {
    let detached = Bus::detached(0u32, 1024);
    detached.subscribe("s".into(), Some("workers".into()), 2);
    assert_eq!(detached.written_now(), "SUB s workers 2\r\n");

    let server = broker::Server::new(broker::Config::default());
    let (a, _, mut heard_a) = connected(&server).await;
    let (b, _, mut heard_b) = connected(&server).await;
    for bus in [&a, &b] {
        bus.subscribe("jobs".into(), Some("workers".into()), 2);
        bus.flush().await.unwrap();
    }
    publish(&a, "jobs", 0..20);
    a.flush().await.unwrap();
    b.flush().await.unwrap();
    let (got_a, got_b) = (heard_now(&mut heard_a), heard_now(&mut heard_b));
    assert_eq!(
        got_a.len() + got_b.len(),
        20,
        "each job to one member: {got_a:?} {got_b:?}"
    );
}

#[tokio::test]
async fn a_reply_subject_is_sent_as_given() {
    let detached = Bus::detached(0u32, 1024);
    detached
        .publish_bytes("a", Reply::Subject("back.to.me"), b"x")
        .unwrap();
    assert_eq!(detached.written_now(), "PUB a back.to.me 1\r\nx\r\n");

    let server = broker::Server::new(broker::Config::default());
    let (bus, _, mut heard) = connected(&server).await;
    bus.publish_bytes("first.q", Reply::Subject("back.to.me"), b"x")
        .unwrap();
    let Event::Msg { target, reply, .. } = next(&mut heard).await else {
        panic!("not a message");
    };
    assert_eq!((target, reply.as_deref()), (1, Some("back.to.me")));
}

#[tokio::test]
async fn server_info_is_the_current_server_s() {
    let server = broker::Server::new(broker::Config {
        max_payload: 12_345,
        ..broker::Config::default()
    });
    let tap = Arc::new(Tap::default());
    let bus = Bus::new(tap.options(server.clone()), "first.>".into(), 1u32, 1024);
    assert_eq!(bus.server_info(), None, "no connection yet");
    let (tx, mut heard) = mpsc::unbounded_channel();
    let connection = tokio::spawn(run(bus.clone(), Arc::new(Heard(tx))));
    assert_eq!(next(&mut heard).await, Event::Up);
    let info = bus.server_info().expect("connected");
    assert_eq!(info.max_payload, 12_345);
    assert!(!info.server_id.is_empty());
    bus.stop();
    connection.await.unwrap();
    assert_eq!(bus.server_info(), None, "stopped");
}

#[tokio::test]
async fn a_flush_resolves_once_the_server_has_answered_what_came_before() {
    assert_eq!(
        Bus::new(BusOptions::new(["nats://x"]), "f.>".into(), 1u32, 1024)
            .flush()
            .await,
        Err(BusError::Disconnected),
        "no connection"
    );
    let server = broker::Server::new(broker::Config::default());
    let (bus, _, mut heard) = connected(&server).await;
    bus.subscribe("echo".into(), None, 2);
    publish(&bus, "echo", 0..100);
    bus.flush().await.unwrap();
    // The server sent the messages before the PONG, and one reader reads both in order.
    assert_eq!(heard_now(&mut heard).len(), 100);
}

/// The keep-alive PINGs are counted too: a flush resolves on the PONG of its own PING,
/// not on the PONG of a keep-alive sent before it and answered after it was asked.
#[tokio::test]
async fn a_keep_alive_s_pong_answers_no_flush() {
    /// Two unanswered keep-alives are allowed: the test's window is twice this.
    const KEEP_ALIVE: Duration = Duration::from_millis(100);
    let server = broker::Server::new(broker::Config::default());
    let (bus, tap, mut heard) = connected_with(&server, |options| {
        options.ping_interval = KEEP_ALIVE;
    })
    .await;
    bus.subscribe("after".into(), None, 2);
    bus.flush().await.unwrap();
    let (other, _, _) = connected(&server).await;
    // A keep-alive goes out; its PONG is held back.
    tap.hold_answers();
    let pings = |tap: &Tap| tap.written(0).matches("PING\r\n").count();
    let before = pings(&tap);
    tokio::time::timeout(DEADLINE, async {
        while pings(&tap) == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("a keep-alive PING within the deadline");
    // A flush, whose PING never reaches the server.
    tap.hold();
    let mut flush = std::pin::pin!(bus.flush());
    assert!(futures::poll!(flush.as_mut()).is_pending());
    // The keep-alive's PONG comes, then a message the server sent after it.
    other.publish_bytes("after", Reply::None, b"1").unwrap();
    other.flush().await.unwrap();
    tap.release_answers();
    assert!(matches!(
        next(&mut heard).await,
        Event::Msg { target: 2, .. }
    ));
    assert!(
        futures::poll!(flush.as_mut()).is_pending(),
        "a keep-alive's PONG answered the flush"
    );
}

#[tokio::test]
async fn a_flush_fails_when_its_connection_is_lost() {
    let server = broker::Server::new(broker::Config::default());
    let (bus, tap, mut heard) = connected(&server).await;
    tap.hold();
    let flush = tokio::spawn({
        let bus = bus.clone();
        async move { bus.flush().await }
    });
    // Not answered while held back.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!flush.is_finished());
    tap.cut();
    assert_eq!(
        tokio::time::timeout(DEADLINE, flush)
            .await
            .unwrap()
            .unwrap(),
        Err(BusError::Disconnected)
    );
    assert_eq!(next(&mut heard).await, Event::Lost);
}

#[tokio::test]
async fn unsubscribe_after_ends_the_subscription_at_its_count_across_reconnects() {
    let server = broker::Server::new(broker::Config::default());
    let (bus, tap, mut heard) = connected(&server).await;
    let sid = bus.subscribe("u".into(), None, 2);
    let other = bus.subscribe("v".into(), None, 3);
    bus.unsubscribe_after(sid, 3);
    until_written(&tap, 0, &format!("UNSUB {sid} 3\r\n")).await;
    publish(&bus, "u", 0..2);
    publish(&bus, "v", 0..2);
    bus.flush().await.unwrap();
    assert_eq!(heard_now(&mut heard).len(), 4);
    // A max not above what was handed over ends it at once.
    bus.unsubscribe_after(other, 2);
    until_written(&tap, 0, &format!("UNSUB {other}\r\n")).await;

    // The new server is asked for what remains: 1 of 3.
    tap.cut();
    assert_eq!(next(&mut heard).await, Event::Lost);
    assert_eq!(next(&mut heard).await, Event::Up);
    bus.flush().await.unwrap();
    let resent = tap.written(1);
    assert!(
        resent.contains(&format!("SUB u {sid}\r\nUNSUB {sid} 1\r\n")),
        "{resent}"
    );
    assert!(!resent.contains("SUB v "), "ended: {resent}");
    publish(&bus, "u", 10..13);
    bus.flush().await.unwrap();
    assert_eq!(heard_now(&mut heard), [(2, "10".to_owned())]);

    // Ended here too: not subscribed again on the next connection.
    tap.cut();
    assert_eq!(next(&mut heard).await, Event::Lost);
    assert_eq!(next(&mut heard).await, Event::Up);
    bus.flush().await.unwrap();
    assert!(!tap.written(2).contains("SUB u "), "{}", tap.written(2));
}

#[tokio::test]
async fn a_backlogged_publisher_waits_until_the_writer_takes_the_buffer() {
    let bus = Bus::detached(0u32, 8);
    bus.writable().await; // room: at once
    bus.publish_bytes("s", Reply::None, b"0123456789").unwrap();
    assert_eq!(
        bus.publish_bytes("s", Reply::None, b"x"),
        Err(BusError::Backlogged)
    );
    let waiting = tokio::spawn({
        let bus = bus.clone();
        async move { bus.writable().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiting.is_finished(), "still backlogged");
    bus.written_now();
    tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("woken when taken")
        .unwrap();
    bus.publish_bytes("s", Reply::None, b"x").unwrap();
}
