//! A worker told to stop while its bus is down (issue 45, item 8) exits within its drain
//! grace, saying what it could not deliver, instead of draining towards a broker that
//! is gone until a second signal. Real processes: nats-server, `shaddock worker` and
//! the Go echo worker (the TypeScript workers' is in `workers/ts/test/echo.test.ts`).

#[path = "common/builds.rs"]
mod builds;

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use testkit::{NatsServer, Process};

/// The workers' drain grace here: the Rust worker's drain window (500ms) and answer and
/// call timeouts (1s each) fit in it, as its flags' check requires.
const GRACE: &str = "2s";
const GRACE_TIME: Duration = Duration::from_secs(2);
/// What a slow machine may add to the grace, stopping the process.
const SLACK: Duration = Duration::from_secs(2);

/// Starts `command` (a worker on `broker`), stops the broker, and sends the worker
/// SIGTERM: it must exit, failing, within its grace and `SLACK`, having said what it
/// could not deliver in a line holding `said`. Returns how long it took.
async fn stop_with_the_bus_down(mut broker: NatsServer, command: Command, said: &str) -> Duration {
    let mut worker = Process::spawn("worker", command);
    worker.line("Worker is ready").await;
    broker.process.signal(Signal::SIGKILL);
    broker.process.exited().await;
    let stopping = Instant::now();
    let status = worker
        .stop(Signal::SIGTERM, GRACE_TIME + SLACK)
        .await
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        !status.success(),
        "a drain cut short is a failure: {status}"
    );
    let line = worker.line(said).await;
    assert!(line.contains("answers"), "{line}");
    assert!(line.contains("not delivered"), "{line}");
    took
}

#[tokio::test]
async fn a_worker_stopped_while_its_bus_is_down_exits_within_its_drain_grace_saying_what_it_lost() {
    let broker = NatsServer::start().await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_shaddock"));
    command.args(["worker", "--service", "echo", "--nats", &broker.url]);
    command.args([
        "--drain-grace",
        GRACE,
        "--answer-timeout",
        "1s",
        "--call-timeout",
        "1s",
    ]);
    let took =
        stop_with_the_bus_down(broker, command, "the drain did not end within its grace").await;
    assert!(
        took >= GRACE_TIME,
        "it waited its grace for the bus: {took:?}"
    );
}

#[tokio::test]
async fn the_go_echo_worker_stopped_while_its_bus_is_down_exits_within_its_drain_grace() {
    let broker = NatsServer::start().await;
    let mut command = Command::new(builds::go_echo());
    command.args(["--nats", &broker.url, "--drain-grace", GRACE]);
    stop_with_the_bus_down(broker, command, "the drain failed").await;
}
