//! Flow control at its edges: a subscriber that falls behind but keeps reading makes its
//! publisher wait instead of being cut off; one that stops reading is still cut at
//! `max_pending`, after one stall window, and the publisher goes on.

mod common;

use std::time::Duration;

use broker::Config;
use broker::testing::EmbeddedServer;
use common::{Conn, get_json};
use testkit::{DEADLINE, within};
use tokio::net::TcpSocket;

const SIZE: usize = 1000;
/// 8 MB: more than `max_pending` and the kernel's socket buffers together, so without
/// flow control the subscriber's backlog would have to pass `max_pending`.
const COUNT: usize = 8 * 1024;
const MAX_PENDING: usize = 256 * 1024;
const MARK: usize = 32 * 1024;

fn config(stall_window: Duration) -> Config {
    Config {
        max_pending: MAX_PENDING,
        max_payload: MAX_PENDING,
        flow_control_pending: MARK,
        stall_window,
        ..Config::default()
    }
}

/// A subscriber on `foo` with a small receive window, so its backlog in the server grows
/// as soon as it stops reading.
async fn subscriber(server: &EmbeddedServer) -> Conn {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut sub = Conn::from_stream(socket.connect(server.addr).await.unwrap());
    sub.read_info().await;
    sub.send("CONNECT {\"verbose\":false}\r\nSUB foo 1\r\nPING\r\n")
        .await;
    sub.expect_line("PONG").await;
    sub
}

/// Publishes COUNT messages in one go, then waits for its PONG.
fn publish_all(server: &EmbeddedServer) -> tokio::task::JoinHandle<()> {
    let addr = server.addr;
    tokio::spawn(async move {
        let mut publisher = Conn::quiet(addr).await;
        let all = format!("PUB foo {SIZE}\r\n{}\r\n", "x".repeat(SIZE)).repeat(COUNT);
        publisher.send(&all).await;
        publisher.ping_pong().await;
    })
}

/// Waits until the server reports the subscriber's backlog past the flow-control mark.
async fn wait_for_backlog(monitor: std::net::SocketAddr) {
    within(async {
        loop {
            let connz = get_json(monitor, "/connz?sort=pending").await;
            let pending = connz["connections"][0]["pending_bytes"]
                .as_u64()
                .unwrap_or(0);
            if pending > MARK as u64 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_slow_reader_gets_everything_because_its_publisher_waits() {
    let server = EmbeddedServer::start(config(DEADLINE)).await;
    let monitor = server.start_monitor().await;
    let mut sub = subscriber(&server).await;
    let publisher = publish_all(&server);
    // The subscriber has not read anything yet: its backlog passes the mark, and the
    // publisher is held there instead of filling max_pending.
    wait_for_backlog(monitor).await;
    let payload = vec![b'x'; SIZE];
    for _ in 0..COUNT {
        sub.expect_msg(&format!("MSG foo 1 {SIZE}"), &payload).await;
    }
    within(publisher).await.unwrap();
    sub.ping_pong().await;
    let varz = get_json(monitor, "/varz").await;
    assert_eq!(varz["slow_consumers"], 0, "{varz}");
}

#[tokio::test]
async fn a_reader_that_stops_is_cut_and_the_publisher_goes_on() {
    let server = EmbeddedServer::start(config(Duration::from_millis(100))).await;
    let monitor = server.start_monitor().await;
    let mut sub = subscriber(&server).await;
    let publisher = publish_all(&server);
    // The subscriber never reads: after one stall window without progress the publisher
    // stops waiting, the backlog reaches max_pending and the subscriber is closed.
    within(publisher).await.unwrap();
    let varz = get_json(monitor, "/varz").await;
    assert_eq!(varz["slow_consumers"], 1, "{varz}");
    sub.auto_pong = false;
    // What the socket still held is readable; then the connection ends.
    loop {
        match sub.read().await {
            common::Read::Closed => break,
            common::Read::Line(_) => {}
        }
    }
}
