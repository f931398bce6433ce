//! `pomelo-compare`: one pomelo-protocol client, the same route and the same schedule,
//! against a Shaddock gate and against a real pomelo server (scripts/pomelo-peer.sh:
//! pomelo 2.2.7, 1 connector + 1 echo server, as the seed's comparison), in one run.
//!
//! Each client speaks the pomelo wire protocol (the gate's own codec,
//! [`gateway::pomelo::wire`]): handshake, ack, heartbeats answered, then one request per
//! interval on an absolute schedule, open loop, whether or not earlier answers came.
//! Latency is from the scheduled send time to the answer. A request counts as answered
//! when its response comes back without the error flag and without an error `code`.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use gateway::pomelo::wire::{self, MessageKind, PackageType, Route};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::Message;

use super::scenario::{MAX_CLIENTS, MIN_INTERVAL};
use super::target::{TargetArgs, with_topology};
use crate::hist::Hist;
use crate::proc::{CpuSample, STEAL};
use crate::report::{Doc, Meta, Table, print_stdout};

/// How long connecting and the pomelo handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests a client keeps track of: its whole run, sent in order with ids 1, 2, ...
const MAX_REQUESTS: u64 = 10_000_000;

/// `pomelo-compare`: the same pomelo client against the gate and a pomelo server.
#[derive(Debug, clap::Args)]
pub struct PomeloCompareArgs {
    /// Client counts, run in turn against each target.
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 50])]
    pub clients: Vec<usize>,
    /// The pomelo server's connector, `ws://host:port` (scripts/pomelo-peer.sh).
    /// Without it only the gate is measured.
    #[arg(long)]
    pub pomelo_url: Option<String>,
    /// Route requested on both: pomelo's `serverType.handler.method`; on Shaddock it
    /// is service `echo`, method `raw`, which answers the body unchanged.
    #[arg(long, default_value = "echo.echoHandler.raw")]
    pub route: String,
    /// JSON body of every request (the seed's 'Hello World').
    #[arg(long, default_value = r#"{"msg":"Hello World"}"#)]
    pub body: String,
    /// Time between one client's requests.
    #[arg(long, default_value = "1ms", value_parser = net::duration::parse)]
    pub interval: Duration,
    /// Requests per client in the measured window (the seed: 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Sent before the window, not recorded.
    #[arg(long, default_value = "1s", value_parser = net::duration::parse)]
    pub warmup: Duration,
    /// How long after the window's last request answers are still awaited.
    #[arg(long, default_value = "5s", value_parser = net::duration::parse)]
    pub timeout: Duration,
    #[command(flatten)]
    pub target: TargetArgs,
}

/// What one load against one target measured.
#[derive(Debug)]
struct Outcome {
    target: String,
    clients: usize,
    connected: usize,
    answered: u64,
    errors: u64,
    sent: u64,
    /// Window start to the later of its end and the last answer.
    elapsed: Duration,
    per_conn: Vec<f64>,
    latency: Hist,
    steal_percent: Option<f64>,
}

/// One client's record of the measured window.
#[derive(Debug, Default)]
struct ClientRecord {
    answered: u64,
    errors: u64,
    sent: u64,
    last_answer: Option<Instant>,
    latency: Hist,
}

pub async fn pomelo_compare(args: PomeloCompareArgs) -> anyhow::Result<()> {
    ensure!(
        args.interval >= MIN_INTERVAL,
        "interval must be at least {MIN_INTERVAL:?}"
    );
    ensure!(
        args.clients.iter().all(|n| (1..=MAX_CLIENTS).contains(n)),
        "clients must be 1..={MAX_CLIENTS}"
    );
    let warm = (args.warmup.as_nanos() / args.interval.as_nanos().max(1)) as u64;
    ensure!(
        (1..=MAX_REQUESTS).contains(&(args.count + warm)),
        "count plus warm-up must be 1..={MAX_REQUESTS} requests per client"
    );
    serde_json::from_str::<serde_json::Value>(&args.body).context("--body is not JSON")?;
    let (gates, topology) = args.target.gates(1, 1).await?;
    let work = async {
        let mut outcomes = Vec::new();
        for &clients in &args.clients {
            let gate = format!("shaddock ({})", gates.setup);
            outcomes.push(run(&args, &gate, &gates.urls[0], clients).await?);
            if let Some(url) = &args.pomelo_url {
                outcomes.push(run(&args, "pomelo 2.2.7", url, clients).await?);
            }
        }
        Ok(outcomes)
    };
    let outcomes = with_topology(topology, work).await?;
    print_stdout(&render(&args, &outcomes).text())
}

/// One load: `clients` clients against `url`.
async fn run(
    args: &PomeloCompareArgs,
    target: &str,
    url: &str,
    clients: usize,
) -> anyhow::Result<Outcome> {
    tracing::info!(target, clients, "pomelo load");
    let mut sockets = Vec::with_capacity(clients);
    for _ in 0..clients {
        let ws = tokio::time::timeout(CONNECT_TIMEOUT, connect(url))
            .await
            .context("connect timed out")??;
        sockets.push(ws);
    }
    let warm = (args.warmup.as_nanos() / args.interval.as_nanos()) as u64;
    let start = Instant::now() + Duration::from_millis(20);
    let window_start = start + args.interval * u32::try_from(warm).unwrap_or(u32::MAX);
    let window = args.interval * u32::try_from(args.count).unwrap_or(u32::MAX);
    let cpu_before = CpuSample::take(&[]);
    let mut tasks = JoinSet::new();
    for (i, ws) in sockets.into_iter().enumerate() {
        // Clients spread evenly over one interval: the pomelo comparison's load.
        let offset = args.interval * u32::try_from(i).unwrap_or(0) / clients as u32;
        let load = Load {
            start: start + offset,
            interval: args.interval,
            warm,
            count: args.count,
            route: args.route.clone(),
            body: Bytes::from(args.body.clone()),
            give_up: window_start + window + args.timeout,
        };
        tasks.spawn(load.drive(ws));
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        records.push(done.context("a client task failed")??);
    }
    let cpu = cpu_before.until(&CpuSample::take(&[]));
    let last = records.iter().filter_map(|r| r.last_answer).max();
    let elapsed = last
        .map_or(window, |l| l.saturating_duration_since(window_start))
        .max(window);
    let mut latency = Hist::new();
    for r in &records {
        latency.merge(&r.latency);
    }
    Ok(Outcome {
        target: target.to_owned(),
        clients,
        connected: records.len(),
        answered: records.iter().map(|r| r.answered).sum(),
        errors: records.iter().map(|r| r.errors).sum(),
        sent: records.iter().map(|r| r.sent).sum(),
        per_conn: records
            .iter()
            .map(|r| r.answered as f64 / elapsed.as_secs_f64())
            .collect(),
        elapsed,
        latency,
        steal_percent: cpu.iter().find(|c| c.name == STEAL).map(|c| c.percent),
    })
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a pomelo session: handshake, answer, ack, the server's first heartbeat.
async fn connect(url: &str) -> anyhow::Result<Ws> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let hello = br#"{"sys":{"type":"shaddock-loadtest","version":"0.0.1"},"user":{}}"#;
    ws.send(Message::Binary(wire::encode_package(
        PackageType::Handshake,
        hello,
    )))
    .await?;
    let answer = loop {
        match ws.next().await {
            Some(Ok(Message::Binary(b))) => break b,
            Some(Ok(_)) => continue,
            other => bail!("no handshake answer: {other:?}"),
        }
    };
    let Ok(Some((package, _))) = wire::parse_package(&answer, wire::MAX_BODY_LEN) else {
        bail!("the handshake answer is not a pomelo package");
    };
    let json: serde_json::Value = serde_json::from_slice(&package.body)?;
    ensure!(json["code"] == 200, "handshake refused: {json}");
    ws.send(Message::Binary(wire::encode_package(
        PackageType::HandshakeAck,
        &[],
    )))
    .await?;
    Ok(ws)
}

/// One client's schedule.
struct Load {
    start: Instant,
    interval: Duration,
    warm: u64,
    count: u64,
    route: String,
    body: Bytes,
    give_up: Instant,
}

impl Load {
    /// Sends on the schedule and reads answers until every request is answered or the
    /// run gives up; answers the server's heartbeats.
    async fn drive(self, ws: Ws) -> anyhow::Result<ClientRecord> {
        let (mut sink, mut stream) = ws.split();
        let total = self.warm + self.count;
        let mut ticks = tokio::time::interval_at(self.start, self.interval);
        // Open loop: a late tick sends at once, as many as are due.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
        let mut next_id = 1u64;
        let mut outstanding = 0u64;
        let mut record = ClientRecord::default();
        let give_up = tokio::time::sleep_until(self.give_up);
        tokio::pin!(give_up);
        while next_id <= total || outstanding > 0 {
            tokio::select! {
                _ = ticks.tick(), if next_id <= total => {
                    let message = wire::Message {
                        kind: MessageKind::Request(next_id),
                        route: Route::Name(&self.route),
                        error: false,
                        gzip: false,
                        body: &self.body,
                    };
                    sink.send(Message::Binary(wire::encode_message(&message))).await?;
                    if next_id > self.warm {
                        record.sent += 1;
                    }
                    next_id += 1;
                    outstanding += 1;
                }
                frame = stream.next() => {
                    let Some(Ok(frame)) = frame else { bail!("the server closed the session") };
                    let Message::Binary(bytes) = frame else { continue };
                    for package in wire::parse_packages(bytes, wire::MAX_BODY_LEN)? {
                        match package.kind {
                            PackageType::Heartbeat => {
                                let beat = wire::encode_package(PackageType::Heartbeat, &[]);
                                sink.send(Message::Binary(beat)).await?;
                            }
                            PackageType::Data => {
                                let now = Instant::now();
                                let message = wire::parse_message(&package.body)?;
                                let MessageKind::Response(id) = message.kind else { continue };
                                outstanding = outstanding.saturating_sub(1);
                                if id <= self.warm {
                                    continue;
                                }
                                let scheduled = self.start + self.interval * u32::try_from(id - 1).unwrap_or(u32::MAX);
                                if message.error || is_error(message.body) {
                                    record.errors += 1;
                                } else {
                                    record.answered += 1;
                                    record.latency.record(now.saturating_duration_since(scheduled));
                                    record.last_answer = Some(now);
                                }
                            }
                            PackageType::Kick => bail!("kicked by the server"),
                            _ => {}
                        }
                    }
                }
                () = &mut give_up => break,
            }
        }
        let _ = sink.close().await;
        Ok(record)
    }
}

/// Pomelo answers a failed request with a body `{"code": <not 200>, ...}`.
fn is_error(body: &[u8]) -> bool {
    // Echoed bodies are small; only an object with a `code` can be an error.
    if !body.windows(6).any(|w| w == b"\"code\"") {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("code").and_then(serde_json::Value::as_u64))
        .is_some_and(|code| code != 200)
}

fn render(args: &PomeloCompareArgs, outcomes: &[Outcome]) -> Doc {
    let title = format!(
        "pomelo-compare: route {}, body {}, {} requests per client at {:?} (+{:?} warm-up)",
        args.route, args.body, args.count, args.interval, args.warmup
    );
    let mut doc = Doc::new(title, Meta::now());
    let mut table = Table::new(&[
        "target",
        "clients",
        "answered req/s",
        "min per conn/s",
        "p50",
        "p99",
        "errors",
        "unanswered",
        "steal",
    ]);
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    for o in outcomes {
        table.rows.push(vec![
            o.target.clone(),
            format!("{}/{}", o.connected, o.clients),
            format!("{:.0}", o.answered as f64 / o.elapsed.as_secs_f64()),
            format!(
                "{:.0}",
                o.per_conn.iter().copied().reduce(f64::min).unwrap_or(0.0)
            ),
            ms(o.latency.at(0.5)),
            ms(o.latency.at(0.99)),
            o.errors.to_string(),
            o.sent.saturating_sub(o.answered + o.errors).to_string(),
            o.steal_percent.map_or("-".into(), |s| format!("{s:.1} %")),
        ]);
    }
    doc.table(table);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_code_other_than_200_is_an_error() {
        assert!(is_error(br#"{"code":500,"msg":"x"}"#));
        assert!(!is_error(br#"{"code":200}"#));
        assert!(!is_error(br#"{"msg":"Hello World"}"#));
        assert!(!is_error(b"not json \"code\""));
    }
}
