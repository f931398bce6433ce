//! The open-loop WebSocket load generator: N clients, each sending one request per
//! interval on an absolute schedule, answered or not. A run connects (over `ramp`), warms
//! up, measures (a duration or a count per client) and drains; it ends by itself by the
//! last slot + request timeout + [`HARD_MARGIN`], what is still in flight then counted
//! unanswered. One task and recorder per client: no spawn and no lock per request.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sdk::ClientOptions;
use serde::Serialize;
use tokio::task::{JoinHandle, JoinSet};

use super::clock::{ClockKind, Metronome, Pacer};
use super::lean::{CLOSE_TIMEOUT, ClientRun, Codec, Conn};
use super::schedule::{Payload, Plan, Schedule, Stop, times};
use super::stats::{Latencies, Recorded, Recorder, ServerSplit, SharedRecorded, Tally, rate};
use crate::hist::{Hist, Summary};
use crate::proc::{CpuSample, CpuUse, LOADTEST, MACHINE, OTHERS, STEAL, Watched};

/// Time between deciding the start and the first slot, so every task is ready for it.
pub const LEAD: Duration = Duration::from_millis(20);
/// Slack after the last request's timeout before a run gives up on it.
pub const HARD_MARGIN: Duration = Duration::from_secs(1);
/// How often the progress bar redraws.
const PROGRESS_TICK: Duration = Duration::from_millis(200);
/// Most distinct connect errors kept for the report.
const MAX_CONNECT_ERRORS: usize = 8;
/// Time an overloaded runtime gets on top of that before the run is declared stuck.
const GIVE_UP_SLACK: Duration = Duration::from_secs(5);

/// How long the measured part lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    Duration(Duration),
    /// Requests per client.
    Count(u64),
}

/// Everything that defines the load.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub clients: usize,
    pub interval: Duration,
    pub length: Length,
    pub warmup: Duration,
    pub ramp: Duration,
    /// Client-side request timeout.
    pub timeout: Duration,
    pub route: String,
    pub payload: Payload,
    pub codec: Codec,
    pub clock: ClockKind,
    pub progress: bool,
}

impl LoadSpec {
    /// Offered load: requests per second scheduled over all clients.
    pub fn offered_rps(&self) -> f64 {
        self.clients as f64 / self.interval.as_secs_f64()
    }

    /// The measured window's nominal length.
    pub fn window(&self) -> Duration {
        match self.length {
            Length::Duration(d) => d,
            Length::Count(n) => times(self.interval, n),
        }
    }
}

/// Where the load goes and under what name it is reported.
#[derive(Debug, Clone)]
pub struct Target {
    pub label: String,
    /// `gateway` or `limit`.
    pub kind: &'static str,
    /// Clients are spread over these round-robin.
    pub urls: Vec<String>,
    /// What clients trust for `wss://` URLs ([`ClientOptions::tls`]).
    pub tls: Option<Arc<sdk::rustls::ClientConfig>>,
    /// Processes whose CPU use over the window is reported.
    pub watched: Vec<Watched>,
}

impl Target {
    /// A target without TLS: `kind` `urls` named `label`, watching `watched`.
    pub fn new(label: &str, kind: &'static str, urls: Vec<String>, watched: Vec<Watched>) -> Self {
        let (label, tls) = (label.to_owned(), None);
        Target {
            label,
            kind,
            urls,
            tls,
            watched,
        }
    }
}

/// Everything one load against one target measured: the `--json` data of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub label: String,
    /// `gateway` or `limit` (the bare WebSocket echo server).
    pub target: String,
    pub urls: Vec<String>,
    pub route: String,
    pub clients: usize,
    pub connected: usize,
    pub connect_errors: BTreeMap<String, u64>,
    pub interval_us: f64,
    /// Requests per client in the window, when the run was given a count.
    pub count: Option<u64>,
    pub clock: String,
    pub warmup_s: f64,
    pub window_s: f64,
    /// Window start until the later of its end and the last answer.
    pub elapsed_s: f64,
    pub offered_rps: f64,
    pub sent: u64,
    pub ok: u64,
    pub achieved_rps: f64,
    pub per_conn: PerConn,
    pub timeouts: u64,
    pub unanswered: u64,
    /// Answers other than 200 by code, and the first message of each.
    pub errors_by_code: BTreeMap<u32, u64>,
    pub error_messages: BTreeMap<u32, String>,
    /// Requests cut by the connection ending (closed, kicked, protocol), by kind.
    pub failures: BTreeMap<&'static str, u64>,
    pub latency: Latencies<Summary>,
    /// Where the time went, when the server sent timing (`calls` empty when no answer
    /// waited on other services).
    pub server: Option<ServerSplit<Summary>>,
    /// The bare echo server under the same load, when measured in the same command.
    pub limit: Option<LimitComparison>,
    /// CPU over the measured window, per process (100 % = one core).
    pub cpu: Vec<CpuUse>,
    /// Per second of the window (by scheduled send time).
    pub timeline: Vec<SecondReport>,
    /// Percentile curves as `[nines, µs]` points.
    pub curves: Latencies<Vec<(f64, f64)>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PerConn {
    pub min: f64,
    pub avg: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LimitComparison {
    pub limit_rps: f64,
    /// Achieved ÷ the limit's achieved.
    pub fraction: f64,
    pub limit_p99_from_schedule_us: f64,
    /// µs of CPU per request sent of this run's servers (every process but the load
    /// tester's), and of the bare echo server, and the one ÷ the other: what a request
    /// costs beyond a bare WebSocket echo under the same load.
    pub server_cpu_us: Option<f64>,
    pub limit_server_cpu_us: Option<f64>,
    pub cpu_ratio: Option<f64>,
}

/// µs of CPU per request sent of the run's servers (not ours, not the machine-wide).
fn server_cpu_us(cpu: &[CpuUse], sent: u64) -> Option<f64> {
    let server = |c: &&CpuUse| ![LOADTEST, MACHINE, OTHERS, STEAL].contains(&c.name.as_str());
    let servers: Vec<&CpuUse> = cpu.iter().filter(server).collect();
    if servers.is_empty() || sent == 0 {
        return None;
    }
    let seconds: f64 = servers.iter().map(|c| c.cpu_seconds).sum();
    Some(seconds * 1e6 / sent as f64)
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SecondReport {
    pub second: usize,
    /// Answers that arrived in this second.
    pub answers: u64,
    /// Latency from the schedule of the requests scheduled in this second.
    #[serde(flatten)]
    pub from_schedule: Summary,
}

impl RunReport {
    /// Requests that got no answer: timeouts, cut, still in flight at the end.
    pub fn lost(&self) -> u64 {
        self.timeouts + self.unanswered + self.failures.values().sum::<u64>()
    }

    /// Sets the comparison with a bare-echo run under the same load.
    pub fn compare_with_limit(&mut self, limit: &RunReport) {
        let ours = server_cpu_us(&self.cpu, self.sent);
        let bare = server_cpu_us(&limit.cpu, limit.sent);
        let (rps, fraction) = (limit.achieved_rps, self.achieved_rps / limit.achieved_rps);
        self.limit = Some(LimitComparison {
            limit_rps: rps,
            fraction: if rps > 0.0 { fraction } else { 0.0 },
            limit_p99_from_schedule_us: limit.latency.from_schedule.p99_us,
            server_cpu_us: ours,
            limit_server_cpu_us: bare,
            cpu_ratio: ours.zip(bare).filter(|&(_, b)| b > 0.0).map(|(o, b)| o / b),
        });
    }
}

/// Runs one load against `target`.
pub async fn run(spec: &LoadSpec, target: &Target) -> anyhow::Result<RunReport> {
    if spec.clients == 0 || target.urls.is_empty() {
        bail!("a run needs at least one client and one URL");
    }
    let (clients, connect_errors) = connect_all(spec, target).await;
    let connected = clients.iter().filter(|c| c.is_some()).count();
    if connected == 0 {
        let why = connect_errors.keys().next().cloned().unwrap_or_default();
        let urls = target.urls.join(", ");
        bail!("no client could connect to {urls}: {why}");
    }

    let start = Instant::now() + LEAD;
    // Every client due at the same instant each interval, as a game's tick sends.
    let schedule = Schedule::new(start, spec.interval);
    let window_start = start + spec.warmup;
    let window_end = window_start + spec.window();
    let stop = match spec.length {
        Length::Duration(d) => Stop::At(window_start + d),
        Length::Count(n) => Stop::Count(n),
    };
    // Every client has the same plan.
    let plan = Plan::new(schedule, window_start, stop);
    let last_due = plan.last_due();
    let hard_deadline = last_due + spec.timeout + HARD_MARGIN;
    let clock = spec.clock.resolve(spec.offered_rps());
    let metronome = match clock {
        ClockKind::Thread | ClockKind::Auto => Some(Metronome::start(schedule, plan.end)?),
        ClockKind::Tokio => None,
    };

    let recorded = SharedRecorded::default();
    let run = ClientRun {
        plan,
        route: Arc::from(spec.route.as_str()),
        payload: Arc::new(spec.payload.clone()),
        timeout: spec.timeout,
        hard_deadline,
    };
    let mut tasks = JoinSet::new();
    for (i, conn) in clients.into_iter().enumerate() {
        let Some(conn) = conn else { continue };
        let (m, run) = (metronome.as_ref(), run.clone());
        let pacer = m.map_or_else(Pacer::tokio, Metronome::pacer);
        let rec = Recorder::new(recorded.clone(), plan, window_start, (i, spec.clients));
        tasks.spawn(async move { (i, super::lean::drive(conn, run, pacer, rec).await) });
    }

    let cpu = sample_cpu_over_window(&target.watched, window_start..window_end);
    let bar = progress_bar(spec, target, last_due.saturating_duration_since(start));
    let mut per_client: Vec<Option<Tally>> = vec![None; spec.clients];
    let mut tick = tokio::time::interval(PROGRESS_TICK);
    // Every task ends by the hard deadline; this only guards against a bug in one.
    let give_up = hard_deadline + HARD_MARGIN + CLOSE_TIMEOUT + GIVE_UP_SLACK;
    let give_up = tokio::time::sleep_until(give_up.into());
    tokio::pin!(give_up);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(joined) => {
                    let (i, stats) = joined.context("a load-test client task failed")?;
                    per_client[i] = Some(stats);
                }
                None => break,
            },
            _ = tick.tick() => {
                let elapsed = Instant::now().saturating_duration_since(start).as_millis();
                bar.set_position(u64::try_from(elapsed).unwrap_or(u64::MAX));
            }
            () = &mut give_up => {
                tasks.abort_all();
                bail!("load-test clients still running past the hard deadline");
            }
        }
    }
    bar.finish_and_clear();
    drop(metronome);
    let cpu = cpu.await.unwrap_or_default();

    let conn_rate =
        |t: &Option<Tally>| t.map_or(0.0, |t| rate(t.ok, window_start, window_end, t.last_answer));
    let per_conn: Vec<f64> = per_client.iter().map(conn_rate).collect();
    // Every client has ended and dropped its recorder: this is the last handle.
    let Recorded { stats: t, timeline } = Arc::try_unwrap(recorded)
        .map_err(|_| anyhow::anyhow!("a load-test client still holds the record"))?
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let end = t.last_answer.map_or(window_end, |l| l.max(window_end));
    let timeline = (timeline.iter().enumerate())
        .map(|(second, h)| SecondReport {
            second,
            answers: t.answers_per_second.get(second).copied().unwrap_or(0),
            from_schedule: h.summary(),
        })
        .collect();
    Ok(RunReport {
        label: target.label.clone(),
        target: target.kind.to_owned(),
        urls: target.urls.clone(),
        route: spec.route.clone(),
        clients: spec.clients,
        connected,
        connect_errors,
        interval_us: spec.interval.as_secs_f64() * 1e6,
        count: match spec.length {
            Length::Count(n) => Some(n),
            Length::Duration(_) => None,
        },
        clock: format!("{clock:?}").to_lowercase(),
        warmup_s: spec.warmup.as_secs_f64(),
        window_s: spec.window().as_secs_f64(),
        elapsed_s: end.saturating_duration_since(window_start).as_secs_f64(),
        offered_rps: spec.offered_rps(),
        sent: t.sent,
        ok: t.ok,
        achieved_rps: rate(t.ok, window_start, window_end, t.last_answer),
        per_conn: PerConn {
            min: per_conn.iter().copied().reduce(f64::min).unwrap_or(0.0),
            avg: per_conn.iter().sum::<f64>() / per_conn.len().max(1) as f64,
            max: per_conn.iter().copied().fold(0.0, f64::max),
        },
        timeouts: t.timeouts,
        unanswered: t.unanswered,
        errors_by_code: t.codes.clone(),
        error_messages: t.messages.clone(),
        failures: t.failures.clone(),
        latency: t.latency.map(Hist::summary),
        server: (!t.server.total.is_empty()).then(|| t.server.map(Hist::summary)),
        limit: None,
        cpu,
        timeline,
        curves: t.latency.map(Hist::curve),
    })
}

/// Connect errors and how often each came.
type Counts = BTreeMap<String, u64>;

/// Opens the clients, client `i` at `i / clients` of the ramp, on URL `i mod urls`.
async fn connect_all(spec: &LoadSpec, target: &Target) -> (Vec<Option<Conn>>, Counts) {
    let urls = &target.urls;
    let options = ClientOptions {
        server_timing: true,
        request_timeout: spec.timeout,
        client: concat!("shaddock-loadtest/", env!("CARGO_PKG_VERSION")).to_owned(),
        tls: target.tls.clone(),
        ..ClientOptions::default()
    };
    let began = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..spec.clients {
        let url = urls[i % urls.len()].clone();
        let (options, codec) = (options.clone(), spec.codec);
        let at = began + spec.ramp.mul_f64(i as f64 / spec.clients as f64);
        set.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let conn = Conn::connect(&url, &options, codec).await;
            (i, conn.map_err(|e| format!("{e:#}")))
        });
    }
    let mut clients: Vec<Option<Conn>> = (0..spec.clients).map(|_| None).collect();
    let mut errors = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, Ok(client))) => clients[i] = Some(client),
            Ok((_, Err(e))) => note_error(&mut errors, e),
            Err(e) => note_error(&mut errors, format!("connect task: {e}")),
        }
    }
    (clients, errors)
}

fn note_error(errors: &mut BTreeMap<String, u64>, error: String) {
    let kept = errors.len() < MAX_CONNECT_ERRORS || errors.contains_key(&error);
    let key = if kept { error } else { "(other errors)".into() };
    *errors.entry(key).or_default() += 1;
}

/// The watched processes' CPU over `window`, by a task that sleeps until each edge.
fn sample_cpu_over_window(watched: &[Watched], window: Range<Instant>) -> JoinHandle<Vec<CpuUse>> {
    let watched = watched.to_vec();
    tokio::spawn(async move {
        if watched.is_empty() {
            return Vec::new();
        }
        tokio::time::sleep_until(window.start.into()).await;
        let before = CpuSample::take(&watched);
        tokio::time::sleep_until(window.end.into()).await;
        before.until(&CpuSample::take(&watched))
    })
}

/// A bar over the run's `total` time on stderr; hidden when not a terminal or `--quiet`.
fn progress_bar(spec: &LoadSpec, target: &Target, total: Duration) -> ProgressBar {
    if !spec.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(u64::try_from(total.as_millis()).unwrap_or(u64::MAX));
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {elapsed_precise}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("{} ({} clients)", target.label, spec.clients));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(name: &str, cpu_seconds: f64) -> CpuUse {
        CpuUse {
            name: name.into(),
            pid: 1,
            cpu_seconds,
            percent: 0.0,
        }
    }

    #[test]
    fn server_cpu_counts_every_server_process_and_nothing_machine_wide() {
        let run = [
            cpu(LOADTEST, 5.0),
            cpu("broker", 0.1),
            cpu("gate-0", 0.3),
            cpu("worker-echo-0", 0.2),
            cpu(MACHINE, 9.0),
            cpu(OTHERS, 1.0),
            cpu(STEAL, 1.0),
        ];
        let us = server_cpu_us(&run, 100_000).unwrap();
        assert!((us - 6.0).abs() < 1e-9, "{us}");
        assert_eq!(server_cpu_us(&run, 0), None);
        let no_server = [cpu(LOADTEST, 1.0), cpu(MACHINE, 1.0)];
        assert_eq!(server_cpu_us(&no_server, 10), None);
    }
}
