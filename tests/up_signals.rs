//! `shaddock up` and the signals operators send: SIGUSR2 (what `--signal ldm` sends)
//! stops it gracefully, as SIGTERM does, instead of ending it by the signal's default.

mod common;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[tokio::test]
async fn sigusr2_stops_up_gracefully() {
    let up = common::up(4096, &[]);
    up.wait_for("Server is ready").await;
    kill(Pid::from_raw(up.pid() as i32), Signal::SIGUSR2).unwrap();
    up.wait_for("Trapped \"user defined signal 2\" signal")
        .await;
    up.wait_for("no other server to move to here; stopping gracefully")
        .await;
    // The gate and workers stop first, then the broker.
    up.wait_for("Initiating Shutdown...").await;
    up.wait_for("worker stopped").await;
}
