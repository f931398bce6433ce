//! A worker that gets SIGTERM under steady load loses nothing (issue #15): clients keep
//! sending `echo.raw` through gates while, round after round, one of three echo workers
//! is stopped and replaced; every request is answered 200, no client times out, each
//! stopped worker exits 0 having answered requests that reached it after it started
//! draining, and it left its queue group by count (the lossless way, see
//! `services::drain`).
//!
//! On a three-node nats-server cluster with routes (gates on two nodes, one worker on
//! each node, so requests cross routes while interest is withdrawn) and on our broker.
//! Everything is a real process: nats-server, `shaddock broker`, `shaddock gate`,
//! `shaddock worker`.
//!
//! Lame duck: workers whose server enters lame duck mode (SIGUSR2, as `nats-server
//! --signal ldm` sends) move to another server make before break, well within the
//! server's grace period, and no request is lost or refused meanwhile.

#[path = "common/fleet.rs"]
mod fleet;

use std::time::Duration;

use fleet::{LameDuck, NatsCluster, Process, WAIT, echo_worker, gate, word_after};
use gateway::sdk::{Client, ClientOptions};
use nix::sys::signal::Signal;
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Clients sending, spread over the gates.
const CLIENTS: usize = 20;
/// Each client's pace: one request per interval (100 requests a second).
const INTERVAL: Duration = Duration::from_millis(5);
/// Workers stopped (and replaced), one after another, per test.
const ROUNDS: usize = 6;
/// Load before each stop, so the victim is busy when it gets SIGTERM.
const LOAD_BEFORE_STOP: Duration = Duration::from_millis(300);
/// The gate's own timeout: a request lost on the bus comes back 408 after this.
const GATE_TIMEOUT_MS: &str = "1500";

/// The tests load the machine (three servers, a gate, workers, thousands of requests a
/// second): they run one at a time, or each would measure the others.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// What the clients got.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    /// Every answer but 200, and every client error (a timeout), described.
    failed: Vec<String>,
}

/// `count` clients sending `echo.raw` at a steady pace through `gates` until `stop`;
/// then every outstanding request is awaited.
async fn load(gates: Vec<String>, count: usize, stop: CancellationToken) -> Tally {
    let mut clients = JoinSet::new();
    for c in 0..count {
        let url = gates[c % gates.len()].clone();
        let stop = stop.clone();
        clients.spawn(async move {
            let options = ClientOptions {
                request_timeout: Duration::from_secs(5),
                ..ClientOptions::default()
            };
            let client = Client::connect(&url, options).await.unwrap();
            let mut requests = JoinSet::new();
            let mut pace = tokio::time::interval(INTERVAL);
            let mut n = 0u64;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = pace.tick() => {}
                }
                let client = client.clone();
                let body = format!("c{c}-{n}");
                n += 1;
                requests.spawn(async move {
                    match client.request("echo.raw", body.as_bytes()).await {
                        Ok(r) if r.code == 200 && r.body == body.as_bytes() => Ok(()),
                        Ok(r) => Err(format!("{body}: {} {}", r.code, r.message)),
                        Err(e) => Err(format!("{body}: {e}")),
                    }
                });
            }
            let mut tally = Tally::default();
            while let Some(done) = requests.join_next().await {
                match done.unwrap() {
                    Ok(()) => tally.ok += 1,
                    Err(e) => tally.failed.push(e),
                }
            }
            client.close().await;
            tally
        });
    }
    let mut all = Tally::default();
    while let Some(tally) = clients.join_next().await {
        let tally = tally.unwrap();
        all.ok += tally.ok;
        all.failed.extend(tally.failed);
    }
    all
}

/// Runs the load while `ROUNDS` times a worker is stopped with SIGTERM and replaced by a
/// new one on the same URLs (`workers[i]` connects to `urls[i]`); returns the stopped
/// workers' logs after checking each exited 0.
async fn drain_under_load(gates: Vec<String>, urls: Vec<String>) -> Vec<String> {
    let mut workers = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        workers.push(echo_worker(&format!("worker-{i}"), std::slice::from_ref(url), &[]).await);
    }
    let stop = CancellationToken::new();
    let clients = tokio::spawn(load(gates, CLIENTS, stop.clone()));
    let mut logs = Vec::new();
    for round in 0..ROUNDS {
        tokio::time::sleep(LOAD_BEFORE_STOP).await;
        // The last worker first: on the cluster it shares no node with a gate, so every
        // request it gets crosses a route.
        let i = urls.len() - 1 - round % urls.len();
        let replacement = echo_worker(
            &format!("worker-{i}-r{round}"),
            std::slice::from_ref(&urls[i]),
            &[],
        )
        .await;
        let mut victim: Process = std::mem::replace(&mut workers[i], replacement);
        victim.signal(Signal::SIGTERM);
        let status = victim.exit().await;
        assert!(
            status.success(),
            "{} exited {status}:\n{}",
            victim.name,
            victim.log()
        );
        logs.push(victim.log());
    }
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    stop.cancel();
    assert_all_answered(clients).await;
    logs
}

/// Awaits the load and checks every request was answered 200.
async fn assert_all_answered(clients: tokio::task::JoinHandle<Tally>) {
    let tally = tokio::time::timeout(WAIT, clients).await.unwrap().unwrap();
    eprintln!(
        "{} requests answered 200, {} not: {:?}",
        tally.ok,
        tally.failed.len(),
        tally.failed
    );
    assert!(
        tally.failed.is_empty(),
        "lost or refused: {:?}",
        tally.failed
    );
    assert!(tally.ok > 0);
}

/// Each stopped worker answered requests that reached it after draining started, and
/// left its queue group by count.
fn assert_drained_by_count(logs: &[String]) {
    for log in logs {
        let line = log
            .lines()
            .find(|l| l.contains("worker drained"))
            .unwrap_or_else(|| panic!("no drain report in:\n{log}"));
        eprintln!("{line}");
        let after: u64 = line
            .split("after_drain=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line:?}"));
        assert!(after > 0, "answered nothing while draining: {line}");
        assert!(line.contains("left=Some(ByCount)"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_nothing_on_a_nats_server_cluster() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = NatsCluster::start(3, &LameDuck { grace: WAIT }).await;
    let urls = cluster.urls();
    let timeout = ["--request-timeout-ms", GATE_TIMEOUT_MS];
    let (_g0, gate0) = gate("gate-0", &urls[0], &timeout).await;
    let (_g1, gate1) = gate("gate-1", &urls[1], &timeout).await;
    let logs = drain_under_load(vec![gate0, gate1], urls).await;
    assert_drained_by_count(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_nothing_on_our_broker() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut broker = Process::spawn(
        "broker",
        env!("CARGO_BIN_EXE_shaddock").as_ref(),
        &["broker", "-a", "127.0.0.1", "-p", "-1"],
        &[("RUST_LOG", "info")],
    );
    let listening = broker.line("Listening for client connections on ").await;
    let addr = listening
        .rsplit("client connections on ")
        .next()
        .unwrap()
        .trim()
        .to_owned();
    broker.line("Server is ready").await;
    let url = format!("nats://{addr}");
    let timeout = ["--request-timeout-ms", GATE_TIMEOUT_MS];
    let (_gate, gate_url) = gate("gate", &url, &timeout).await;
    let logs = drain_under_load(vec![gate_url], vec![url; 3]).await;
    assert_drained_by_count(&logs);
}

/// The lame-duck grace period of the cluster's nodes: a worker that only waited to be
/// closed would still be connected when half of it has passed.
const LAME_DUCK_GRACE: Duration = Duration::from_secs(10);

/// What a worker logged when its inputs left a server in lame duck mode.
const LEFT_LAME_DUCK: &str = "left the server in lame duck mode";

/// Two workers on the one node that enters lame duck mode, each given only that node's
/// URL (they learn the others from it), a gate on another node, clients sending all
/// along. Each worker moves its inputs to another node, make before break, well within
/// half the grace period, leaving the old node by count: every request is answered 200,
/// none lost on the wire and none refused for want of a worker. Then one of them is
/// stopped under load on its new node: the move did not cost it its lossless drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_move_off_a_server_in_lame_duck_mode_losing_nothing() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut cluster = NatsCluster::start(
        3,
        &LameDuck {
            grace: LAME_DUCK_GRACE,
        },
    )
    .await;
    let urls = cluster.urls();
    let going = std::slice::from_ref(&urls[0]);
    let mut workers = vec![
        echo_worker("moving-0", going, &[]).await,
        echo_worker("moving-1", going, &[]).await,
    ];
    let timeout = ["--request-timeout-ms", GATE_TIMEOUT_MS];
    let (_gate, gate_url) = gate("gate", &urls[1], &timeout).await;
    let stop = CancellationToken::new();
    let clients = tokio::spawn(load(vec![gate_url], CLIENTS, stop.clone()));
    tokio::time::sleep(LOAD_BEFORE_STOP).await;

    cluster.nodes[0].process.signal(Signal::SIGUSR2);
    cluster.nodes[0]
        .process
        .line("Entering lame duck mode")
        .await;
    for worker in &mut workers {
        let left = worker
            .line_within(LEFT_LAME_DUCK, LAME_DUCK_GRACE / 2)
            .await;
        eprintln!("{}: {left}", worker.name);
        assert!(left.contains("left=Some(ByCount)"), "{left}");
        let moved = worker.log();
        let to = moved
            .lines()
            .find(|l| l.contains("moved to another NATS server"))
            .expect("no move logged");
        assert_ne!(
            word_after(to, " to="),
            port_of(&urls[0]),
            "moved to the server in lame duck mode: {to}"
        );
    }
    // Served from the new nodes alone for a while.
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    let _replacement = echo_worker("replacement", std::slice::from_ref(&urls[2]), &[]).await;
    let mut stopped = workers.remove(0);
    stopped.signal(Signal::SIGTERM);
    assert!(stopped.exit().await.success(), "{}", stopped.log());
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    stop.cancel();
    assert_all_answered(clients).await;
    assert_drained_by_count(&[stopped.log()]);
}

/// The port of a `nats://host:port` URL.
fn port_of(url: &str) -> &str {
    url.rsplit(':').next().unwrap_or_default()
}

/// `--move-timeout` bounds a move: the only other server the worker knows accepts
/// connections but never says a word, so after the timeout, and not before, the worker
/// gives the move up with a warning and goes on serving from the server in lame duck
/// mode, which has not closed it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_not_made_within_the_move_timeout_is_given_up() {
    const MOVE_TIMEOUT: Duration = Duration::from_millis(300);
    let _one_at_a_time = SERIAL.lock().await;
    let mut cluster = NatsCluster::start(
        1,
        &LameDuck {
            grace: LAME_DUCK_GRACE,
        },
    )
    .await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("nats://{}", silent.local_addr().unwrap());
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            held.push(connection);
        }
    });
    let server = cluster.urls()[0].clone();
    let timeout = ["--request-timeout-ms", GATE_TIMEOUT_MS];
    let (_gate, gate_url) = gate("gate", &server, &timeout).await;
    let mut worker = echo_worker(
        "worker",
        &[server, silent_url],
        &["--move-timeout", "300ms"],
    )
    .await;
    echo_once(&gate_url).await;

    cluster.nodes[0].process.signal(Signal::SIGUSR2);
    cluster.nodes[0]
        .process
        .line("Entering lame duck mode")
        .await;
    let notice = worker.line("the NATS server is going away").await;
    let gave_up = worker.line("cannot move").await;
    let took = logged_at(&gave_up) - logged_at(&notice);
    assert!(gave_up.contains("in time"), "{gave_up}");
    assert!(took >= MOVE_TIMEOUT, "gave up after {took:?}");
    assert!(took < LAME_DUCK_GRACE / 2, "gave up after {took:?}");
    // Still serving from where it was.
    echo_once(&gate_url).await;
    holding.abort();
}

/// One `echo.raw` through `gate`, answered 200.
async fn echo_once(gate: &str) {
    let client = Client::connect(gate, ClientOptions::default())
        .await
        .unwrap();
    let response = client.request("echo.raw", b"once").await.unwrap();
    assert_eq!(response.code, 200, "{response:?}");
    client.close().await;
}

/// When a process logged `line` (`[pid] YYYY/MM/DD HH:MM:SS.micros ...`), from midnight.
fn logged_at(line: &str) -> Duration {
    let time = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no time in {line:?}"));
    let (hms, micros) = time.split_once('.').expect("a time with microseconds");
    let seconds = hms
        .split(':')
        .map(|part| part.parse::<u64>().expect("a number"))
        .fold(0, |total, part| total * 60 + part);
    Duration::from_secs(seconds) + Duration::from_micros(micros.parse().expect("microseconds"))
}
