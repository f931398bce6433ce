//! Lame duck mode on real processes: our `broker` binary signalled the way operators and
//! client test suites signal nats-server (`nats-server --signal ldm=PID`, or our own
//! `--signal`), with the checks a client can make also run against nats-server itself.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use async_nats::{ConnectOptions, Event};
use common::{Conn, Read};
use futures::StreamExt;
use testkit::{NatsServer, nats_server_path, temp_file, within};

/// A client that takes INFO updates, as async-nats and nats.go announce themselves.
const PROTOCOL_1: &str = r#"{"verbose":false,"pedantic":false,"protocol":1}"#;

fn ours() -> &'static Path {
    env!("CARGO_BIN_EXE_broker").as_ref()
}

/// Runs `binary --signal <arg>` to completion.
fn signal_with(binary: &Path, arg: &str) -> Output {
    Command::new(binary)
        .args(["--signal", arg])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()))
}

/// Puts `server` in lame duck mode with nats-server's own `--signal ldm=PID`.
fn ldm_by_nats_server(server: &NatsServer) {
    let out = signal_with(
        &nats_server_path(),
        &format!("ldm={}", server.process.pid()),
    );
    assert!(out.status.success(), "nats-server --signal: {out:?}");
}

/// async-nats raises `Event::LameDuckMode` when the server is signalled by nats-server
/// (async-nats' own `lame_duck_callback` test, against `binary`).
async fn client_sees_lame_duck_event(binary: &Path) {
    let server = NatsServer::start_binary(binary, &[]).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let client = ConnectOptions::new()
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let Event::LameDuckMode = event {
                    let _ = tx.send(()).await;
                }
            }
        })
        .connect(&server.url)
        .await
        .unwrap();
    let mut sub = client.subscribe("data").await.unwrap();
    client.publish("data", "data".into()).await.unwrap();
    within(sub.next()).await.unwrap();

    ldm_by_nats_server(&server);
    within(rx.recv()).await.expect("no LameDuckMode event");
}

/// The lame duck INFO is the connect INFO plus `"ldm":true`, sent only to clients that
/// take INFO updates (protocol 1); the listener is closed before it is sent.
async fn ldm_info_is_the_connect_info_and_new_clients_are_refused(binary: &Path) {
    let server = NatsServer::start_binary(binary, &[]).await;
    let (mut modern, connect_info) = Conn::connect_info(server.addr).await;
    modern
        .send(&format!("CONNECT {PROTOCOL_1}\r\nPING\r\n"))
        .await;
    modern.expect_line("PONG").await;
    let mut legacy = Conn::quiet(server.addr).await;

    ldm_by_nats_server(&server);
    // nats-server sends protocol 1 clients another INFO after CONNECT (`connect_info`).
    let ldm_info = loop {
        let info = modern.read_info().await;
        if info.get("ldm").is_some() {
            break info;
        }
    };
    assert_eq!(ldm_info["ldm"], true, "{ldm_info}");
    for (key, value) in connect_info.as_object().unwrap() {
        assert_eq!(&ldm_info[key], value, "{key} in {ldm_info}");
    }
    // Nothing was queued for the protocol 0 client.
    legacy.ping_pong().await;

    let refused = tokio::net::TcpStream::connect(server.addr).await;
    assert!(
        refused.is_err(),
        "a new client was accepted in lame duck mode"
    );
}

mod nats_server {
    use super::*;

    #[tokio::test]
    async fn client_sees_lame_duck_event() {
        super::client_sees_lame_duck_event(&nats_server_path()).await;
    }

    #[tokio::test]
    async fn ldm_info_is_the_connect_info_and_new_clients_are_refused() {
        super::ldm_info_is_the_connect_info_and_new_clients_are_refused(&nats_server_path()).await;
    }
}

mod broker_binary {
    use super::*;

    #[tokio::test]
    async fn client_sees_lame_duck_event() {
        super::client_sees_lame_duck_event(ours()).await;
    }

    #[tokio::test]
    async fn ldm_info_is_the_connect_info_and_new_clients_are_refused() {
        super::ldm_info_is_the_connect_info_and_new_clients_are_refused(ours()).await;
    }
}

/// Connects `n` protocol 1 clients, signals lame duck mode with our `--signal`, and
/// returns when each client was closed, from the first lame duck INFO's arrival, in order.
async fn close_times(server: &NatsServer, n: usize) -> Vec<Duration> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(Conn::connect_with(server.addr, PROTOCOL_1).await);
    }
    let out = signal_with(ours(), &format!("ldm={}", server.process.pid()));
    assert!(out.status.success(), "--signal ldm: {out:?}");
    let mut waits = Vec::new();
    for mut client in clients {
        waits.push(tokio::spawn(async move {
            let info = client.read_info().await;
            let told = Instant::now();
            assert_eq!(info["ldm"], true);
            match client.read().await {
                Read::Closed => (told, Instant::now()),
                Read::Line(line) => panic!("unexpected {line:?} in lame duck mode"),
            }
        }));
    }
    let mut stamps = Vec::new();
    for wait in waits {
        stamps.push(wait.await.unwrap());
    }
    let first_told = stamps.iter().map(|(told, _)| *told).min().unwrap();
    let mut times: Vec<Duration> = stamps
        .iter()
        .map(|(_, closed)| *closed - first_told)
        .collect();
    times.sort();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_closed_spread_over_the_duration_and_the_process_exits_0() {
    let mut server = NatsServer::start_binary(
        ours(),
        &[
            "--lame-duck-grace-period",
            "200ms",
            "--lame-duck-duration",
            "1s",
        ],
    )
    .await;
    let times = close_times(&server, 5).await;
    server.process.line("Entering lame duck mode").await;
    // 5 clients over the 800 ms after the grace period: 160 ms apart, the first at 200 ms.
    let (first, last) = (times[0], times[4]);
    assert!(
        first >= Duration::from_millis(150),
        "closed within the grace period: {times:?}"
    );
    assert!(
        last - first >= Duration::from_millis(500),
        "not spread over the duration: {times:?}"
    );
    assert!(server.process.exit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_duration_closes_every_client_at_once() {
    let mut server = NatsServer::start_binary(
        ours(),
        &["--lame-duck-grace-period", "0", "--lame-duck-duration", "0"],
    )
    .await;
    let times = close_times(&server, 5).await;
    assert!(
        times[4] - times[0] < Duration::from_millis(200),
        "not closed together: {times:?}"
    );
    assert!(server.process.exit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_and_sigterm_do_not_cut_lame_duck_mode_short() {
    let mut server = NatsServer::start_binary(
        ours(),
        &[
            "--lame-duck-grace-period",
            "300ms",
            "--lame-duck-duration",
            "600ms",
        ],
    )
    .await;
    let mut client = Conn::connect_with(server.addr, PROTOCOL_1).await;
    let pid = server.process.pid();
    assert!(signal_with(ours(), &format!("ldm={pid}")).status.success());
    assert_eq!(client.read_info().await["ldm"], true);
    let told = Instant::now();
    assert!(signal_with(ours(), &format!("ldm={pid}")).status.success());
    server.process.line("Already in lame duck mode").await;
    assert!(signal_with(ours(), &format!("term={pid}")).status.success());
    server.process.line("not stopping").await;
    client.expect_closed().await;
    assert!(
        told.elapsed() >= Duration::from_millis(250),
        "closed before the grace period ended"
    );
    assert!(server.process.exit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_clients_lame_duck_mode_exits_at_once() {
    let mut server = NatsServer::start_binary(
        ours(),
        &[
            "--lame-duck-grace-period",
            "5s",
            "--lame-duck-duration",
            "10s",
        ],
    )
    .await;
    let started = Instant::now();
    assert!(
        signal_with(ours(), &format!("ldm={}", server.process.pid()))
            .status
            .success()
    );
    assert!(server.process.exit().await.success());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited for nobody"
    );
}

#[tokio::test]
async fn the_pid_file_is_written_usable_by_signal_and_removed() {
    let pid_file = temp_file("broker.pid", "");
    std::fs::remove_file(&pid_file).unwrap();
    let mut server = NatsServer::start_binary(ours(), &["--pid", pid_file.to_str().unwrap()]).await;
    let written = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(written, server.process.pid().to_string());
    let out = signal_with(ours(), &format!("quit={}", pid_file.display()));
    assert!(out.status.success(), "--signal quit=PIDFILE: {out:?}");
    assert!(server.process.exit().await.success());
    assert!(!pid_file.exists(), "pid file left behind");
}

#[test]
fn bad_signal_arguments_are_refused_with_a_clear_error() {
    // A pid nobody has: that of a process that has exited and been reaped.
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let cases = [
        ("ldm=notapid".to_owned(), "invalid pid \"notapid\""),
        ("bogus=1".to_owned(), "unknown signal \"bogus\""),
        ("ldm".to_owned(), "ldm=PID"),
        (format!("ldm={gone_pid}"), "No such process"),
    ];
    for (arg, expected) in cases {
        let out = signal_with(ours(), &arg);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--signal {arg} succeeded");
        assert!(stderr.contains(expected), "--signal {arg}: {stderr}");
    }
}
