//! The open-loop WebSocket load generator: N clients, each sending one request per
//! interval on an absolute schedule whether or not earlier answers came back.
//!
//! A run has four phases: connect (clients spread over `ramp`), warm-up (sent, not
//! recorded), the measured window (a duration, or a count of requests per client), and
//! the drain (answers to the window's requests, up to the request timeout). It ends by
//! itself at the latest at a hard deadline: the last slot + request timeout +
//! [`HARD_MARGIN`]; anything still in flight then is reported as unanswered. Each client
//! is one task with its own books: no spawn and no lock per request.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sdk::ClientOptions;
use tokio::task::JoinSet;

use super::books::{Books, Progress, Tally};
use super::clock::{ClockKind, Metronome, Pacer};
use super::lean::{CLOSE_TIMEOUT, ClientRun, Conn};
use super::schedule::{Payload, Plan, Schedule, Stop, times};
use super::stats::{ClientStats, Recorded, Recorder, SharedRecorded, rate, seconds};
use crate::hist::Summary;
use crate::proc::{CpuSample, CpuUse, Watched};

/// Time between deciding the start and the first slot, so every task is ready for it.
const LEAD: Duration = Duration::from_millis(20);
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
    /// The clients speak JSON text frames (typed bodies the gate transcodes) instead
    /// of protobuf.
    pub json: bool,
    pub server_timing: bool,
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

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub target: Target,
    pub spec: LoadSpec,
    pub connected: usize,
    pub connect_errors: BTreeMap<String, u64>,
    pub totals: ClientStats,
    /// Achieved req/s per client, 0 for clients that never connected.
    pub per_conn: Vec<f64>,
    pub achieved_rps: f64,
    /// Window start until the later of its end and the last answer.
    pub elapsed: Duration,
    /// Per second of the window (scheduled time): latency from the schedule.
    pub timeline: Vec<(usize, Summary)>,
    pub cpu: Vec<CpuUse>,
}

/// Runs one load against `target`.
pub async fn run(spec: &LoadSpec, target: &Target) -> anyhow::Result<RunResult> {
    if spec.clients == 0 || target.urls.is_empty() {
        bail!("a run needs at least one client and one URL");
    }
    let (clients, connect_errors) = connect_all(spec, target).await;
    let connected = clients.iter().filter(|c| c.is_some()).count();
    if connected == 0 {
        let why = connect_errors.keys().next().cloned().unwrap_or_default();
        bail!(
            "no client could connect to {}: {why}",
            target.urls.join(", ")
        );
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
    let plans: Vec<Plan> = (0..spec.clients)
        .map(|_| Plan::new(schedule, window_start, stop))
        .collect();
    let last_due = plans.iter().map(Plan::last_due).max().unwrap_or(start);
    let hard_deadline = last_due + spec.timeout + HARD_MARGIN;
    let clock = spec.clock.resolve(spec.offered_rps());
    let metronome = match clock {
        ClockKind::Thread | ClockKind::Auto => {
            let end = plans.iter().map(|p| p.end).max().unwrap_or(0);
            Some(Metronome::start(schedule, end)?)
        }
        ClockKind::Tokio => None,
    };

    let progress = Arc::new(Progress::default());
    let recorded = SharedRecorded::default();
    let route: Arc<str> = Arc::from(spec.route.as_str());
    let payload = Arc::new(spec.payload.clone());
    let mut tasks = JoinSet::new();
    for (i, (conn, plan)) in clients.into_iter().zip(plans).enumerate() {
        let Some(conn) = conn else { continue };
        let pacer = match &metronome {
            Some(m) => m.pacer(),
            None => Pacer::tokio(),
        };
        let recorder = Recorder::new(recorded.clone(), window_start, i, spec.clients);
        let run = ClientRun {
            plan,
            pacer,
            route: route.clone(),
            payload: payload.clone(),
            timeout: spec.timeout,
            hard_deadline,
            books: Books::new(plan, progress.clone(), recorder),
        };
        tasks.spawn(async move { (i, super::lean::drive(conn, run).await) });
    }

    let cpu = sample_cpu_over_window(&target.watched, window_start, window_end);
    let bar = progress_bar(spec, target, start, last_due);
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
            _ = tick.tick() => progress.draw(&bar, start),
            () = &mut give_up => {
                tasks.abort_all();
                bail!("load-test clients still running past the hard deadline");
            }
        }
    }
    bar.finish_and_clear();
    drop(metronome);
    let cpu = cpu.await.unwrap_or_default();

    let per_conn = per_client
        .iter()
        .map(|t| t.map_or(0.0, |t| rate(t.ok, window_start, window_end, t.last_answer)))
        .collect();
    // Every client has ended and dropped its recorder: this is the last handle.
    let Recorded {
        stats: totals,
        timeline,
    } = Arc::try_unwrap(recorded)
        .map_err(|_| anyhow::anyhow!("a load-test client still holds the record"))?
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let achieved_rps = rate(totals.ok, window_start, window_end, totals.last_answer);
    let end = totals.last_answer.map_or(window_end, |l| l.max(window_end));
    let timeline = seconds(&timeline);
    Ok(RunResult {
        target: target.clone(),
        spec: LoadSpec {
            clock,
            ..spec.clone()
        },
        connected,
        connect_errors,
        totals,
        per_conn,
        achieved_rps,
        elapsed: end.saturating_duration_since(window_start),
        timeline,
        cpu,
    })
}

/// Opens the clients, client `i` at `i / clients` of the ramp, on URL `i mod urls`.
async fn connect_all(
    spec: &LoadSpec,
    target: &Target,
) -> (Vec<Option<Conn>>, BTreeMap<String, u64>) {
    let urls = &target.urls;
    let options = ClientOptions {
        server_timing: spec.server_timing,
        request_timeout: spec.timeout,
        json: spec.json,
        client: concat!("shaddock-loadtest/", env!("CARGO_PKG_VERSION")).to_owned(),
        tls: target.tls.clone(),
        ..ClientOptions::default()
    };
    let began = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..spec.clients {
        let url = urls[i % urls.len()].clone();
        let options = options.clone();
        let at = began + spec.ramp.mul_f64(i as f64 / spec.clients as f64);
        set.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            (
                i,
                Conn::connect(&url, &options)
                    .await
                    .map_err(|e| format!("{e:#}")),
            )
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
    if errors.len() < MAX_CONNECT_ERRORS || errors.contains_key(&error) {
        *errors.entry(error).or_default() += 1;
    } else {
        *errors.entry("(other errors)".to_owned()).or_default() += 1;
    }
}

/// CPU use of the watched processes between the window's start and end, sampled by a
/// task that sleeps until each edge.
fn sample_cpu_over_window(
    watched: &[Watched],
    window_start: Instant,
    window_end: Instant,
) -> tokio::task::JoinHandle<Vec<CpuUse>> {
    let watched = watched.to_vec();
    tokio::spawn(async move {
        if watched.is_empty() {
            return Vec::new();
        }
        tokio::time::sleep_until(window_start.into()).await;
        let before = CpuSample::take(&watched);
        tokio::time::sleep_until(window_end.into()).await;
        before.until(&CpuSample::take(&watched))
    })
}

/// A bar over the run's time (warm-up to last slot) on stderr; hidden when stderr is
/// not a terminal or `--quiet`.
fn progress_bar(
    spec: &LoadSpec,
    target: &Target,
    start: Instant,
    last_due: Instant,
) -> ProgressBar {
    if !spec.progress {
        return ProgressBar::hidden();
    }
    let total = last_due.saturating_duration_since(start).as_millis();
    let bar = ProgressBar::new(u64::try_from(total).unwrap_or(u64::MAX));
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {elapsed_precise} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{} ({} clients)", target.label, spec.clients));
    bar
}
