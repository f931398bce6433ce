//! Load through gates for fleet tests: clients sending `echo.raw` at a steady pace, and
//! what they and the workers' logs must show afterwards.

use std::time::Duration;

use sdk::{Client, ClientOptions};
use testkit::DEADLINE;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Clients sending, spread over the gates.
pub const CLIENTS: usize = 20;
/// Each client's pace: one request per interval (100 requests a second).
pub const INTERVAL: Duration = Duration::from_millis(5);
/// Load before a fault, so the processes are busy when it strikes.
pub const LOAD_BEFORE_STOP: Duration = Duration::from_millis(300);
/// The gate's own timeout: a request lost on the bus comes back 408 after this.
pub const GATE_TIMEOUT: &str = "1500ms";

/// What the clients got.
#[derive(Debug, Default)]
pub struct Tally {
    ok: usize,
    /// Every answer but 200, and every client error (a timeout), described.
    failed: Vec<String>,
}

/// `count` clients sending `echo.raw` at a steady pace through `gates` until `stop`;
/// then every outstanding request is awaited.
pub async fn load(gates: Vec<String>, count: usize, stop: CancellationToken) -> Tally {
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

/// Awaits the load and checks every request was answered 200.
pub async fn assert_all_answered(clients: tokio::task::JoinHandle<Tally>) {
    let tally = tokio::time::timeout(DEADLINE, clients)
        .await
        .unwrap()
        .unwrap();
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
pub fn assert_drained_by_count(logs: &[String]) {
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
