//! The broker out of descriptors: started with a low open-file limit and flooded with
//! more connections than it can hold, it pauses accepting instead of spinning (little
//! CPU, a log line a second), a subscriber connected before the flood receives
//! everything published during it, and a new client gets in once the flood is gone.

use broker::testing::hostile::{assert_backs_off, flood, spawn_limited};
use broker::testing::round_trip;
use futures::StreamExt;
use testkit::within;

/// Descriptors the broker may hold: a few dozen for itself, the rest for clients.
const NOFILE: u64 = 128;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_broker_backs_off_and_keeps_delivering() {
    // The flood needs more descriptors than this test process may have by default.
    net::nofile::raise().unwrap();
    let mut broker = spawn_limited(
        NOFILE,
        env!("CARGO_BIN_EXE_broker").as_ref(),
        &["-a", "127.0.0.1", "-p", "-1"],
    );
    let addr = broker
        .addr_after("Listening for client connections on ")
        .await;
    broker.line("Server is ready").await;
    let url = format!("nats://{addr}");
    let subscriber = within(async_nats::connect(&url)).await.unwrap();
    let mut messages = within(subscriber.subscribe("hostile")).await.unwrap();
    round_trip(&subscriber).await;
    let publisher = within(async_nats::connect(&url)).await.unwrap();

    // More than the broker can hold, fewer than it can hold plus its backlog.
    let flood = flood(addr, NOFILE as usize + 64).await;
    let publishing = async {
        for i in 0..100u32 {
            publisher
                .publish("hostile", i.to_string().into())
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
    };
    tokio::join!(assert_backs_off(&mut broker), publishing);
    for i in 0..100u32 {
        let message = within(messages.next()).await.unwrap();
        assert_eq!(message.payload, i.to_string().as_bytes());
    }

    drop(flood);
    let late = within(async_nats::connect(&url)).await.unwrap();
    round_trip(&late).await;
}
