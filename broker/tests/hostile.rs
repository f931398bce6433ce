//! The broker out of descriptors: started with a low open-file limit and flooded with
//! more connections than it can hold, it pauses accepting instead of spinning (little
//! CPU, a log line a second), a subscriber connected before the flood receives
//! everything published during it, and a new client gets in once the flood is gone.

use std::time::Duration;

use broker::testing::hostile::{Limited, flood};
use broker::testing::{round_trip, within};
use futures::StreamExt;

/// Descriptors the broker may hold: a few dozen for itself, the rest for clients.
const NOFILE: u64 = 128;
/// How long the exhausted broker is watched.
const WINDOW: Duration = Duration::from_secs(2);
/// "A few lines a second": one per kind per second is what the broker writes, with room
/// for a second kind and a window edge. A spinning accept loop writes ~100,000.
const MAX_LINES: usize = 6;
/// A generous "few percent of a core" for a shared 2-core machine; a spinning accept
/// loop uses all of one.
const MAX_CPU_SHARE: f64 = 0.25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_broker_backs_off_and_keeps_delivering() {
    // The flood needs more descriptors than this test process may have by default.
    net::nofile::raise().unwrap();
    let broker = Limited::spawn(
        NOFILE,
        env!("CARGO_BIN_EXE_broker").as_ref(),
        &["-a", "127.0.0.1", "-p", "-1"],
    );
    broker.wait_for("Server is ready").await;
    let addr = broker
        .addr_after("Listening for client connections on ")
        .await;
    let url = format!("nats://{addr}");
    let subscriber = within(async_nats::connect(&url)).await.unwrap();
    let mut messages = within(subscriber.subscribe("hostile")).await.unwrap();
    round_trip(&subscriber).await;
    let publisher = within(async_nats::connect(&url)).await.unwrap();

    // More than the broker can hold, fewer than it can hold plus its backlog.
    let flood = flood(addr, NOFILE as usize + 64).await;
    broker.wait_for("Too many open files").await;
    let publishing = async {
        for i in 0..100u32 {
            publisher
                .publish("hostile", i.to_string().into())
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
    };
    let (load, ()) = tokio::join!(broker.watch(WINDOW, "accept failed"), publishing);
    for i in 0..100u32 {
        let message = within(messages.next()).await.unwrap();
        assert_eq!(message.payload, i.to_string().as_bytes());
    }
    assert!(
        load.lines <= MAX_LINES,
        "{} accept-failure lines in {WINDOW:?}:\n{}",
        load.lines,
        broker.log()
    );
    assert!(
        load.lines >= 1,
        "not exhausted during the window:\n{}",
        broker.log()
    );
    assert!(
        load.cpu_share < MAX_CPU_SHARE,
        "{:.0} % of a core while exhausted",
        load.cpu_share * 100.0
    );

    drop(flood);
    let late = within(async_nats::connect(&url)).await.unwrap();
    round_trip(&late).await;
}
