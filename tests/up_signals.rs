//! `shaddock up` and the signals operators send: SIGUSR2 (what `--signal ldm` sends)
//! stops it gracefully, as SIGTERM does, instead of ending it by the signal's default.

mod common;

use nix::sys::signal::Signal;

#[tokio::test]
async fn sigusr2_stops_up_gracefully() {
    let mut up = common::up(4096, &[]);
    up.line("Server is ready").await;
    up.signal(Signal::SIGUSR2);
    up.line("Trapped \"user defined signal 2\" signal").await;
    up.line("no other server to move to here; stopping gracefully")
        .await;
    // The gate and workers stop first, then the broker.
    up.line("Initiating Shutdown...").await;
    up.line("worker stopped").await;
}
