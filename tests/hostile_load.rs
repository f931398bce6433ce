//! `shaddock up` out of descriptors, as an attacker would leave it: started with a low
//! open-file limit and flooded with more connections than it can hold, the gate pauses
//! accepting instead of spinning (little CPU, a log line a second), a session opened
//! before the flood keeps being answered, and new sessions open once the flood is gone.

mod common;

use broker::testing::hostile::{assert_backs_off, flood};
use sdk::{Client, ClientOptions};
use testkit::within;

/// Descriptors `shaddock up` may hold: a few dozen for the broker, the workers and the
/// gate's own listeners and bus connection, the rest for WebSocket clients.
const NOFILE: u64 = 160;
async fn echo(client: &Client) {
    let response = within(client.request("echo.raw", b"still here"))
        .await
        .unwrap();
    assert_eq!(response.code, proto::code::OK, "{response:?}");
    assert_eq!(&response.body[..], b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_gate_backs_off_keeps_its_sessions_and_recovers() {
    // The flood needs more descriptors than this test process may have by default.
    net::nofile::raise().unwrap();
    let mut up = common::up(
        NOFILE,
        &[
            // One address floods: the descriptor limit, not the per-IP one, must bind.
            "--max-connections-per-ip=0",
            // Flood connections stay in their upgrade for the whole test.
            "--upgrade-timeout-ms=60000",
        ],
    );
    up.line("open-file limit").await;
    let addr = up
        .addr_after("Gate listening for WebSocket clients on ")
        .await;
    up.line("Server is ready").await;
    let url = format!("ws://{addr}");
    let session = within(Client::connect(&url, ClientOptions::default()))
        .await
        .unwrap();
    echo(&session).await;

    // More than the gate can hold, fewer than it can hold plus its backlog.
    let flood = flood(addr, NOFILE as usize + 64).await;
    tokio::join!(assert_backs_off(&mut up), echo(&session));
    echo(&session).await;

    drop(flood);
    let late = within(Client::connect(&url, ClientOptions::default()))
        .await
        .unwrap();
    echo(&late).await;
}
