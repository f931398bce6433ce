//! The open-loop WebSocket load generator: N SDK clients, each sending one request per
//! interval on an absolute schedule whether or not earlier answers came back.
//!
//! A run has four phases: connect (clients spread over `ramp`), warm-up (sent, not
//! recorded), the measured window (a duration, or a count of requests per client), and
//! the drain (answers to the window's requests, up to the request timeout). The run ends
//! by itself at the latest at a hard deadline: the last slot + request timeout +
//! [`HARD_MARGIN`]; anything still in flight then is reported as unanswered.
//!
//! Each client is one task that owns its SDK handle, a `FuturesUnordered` of its requests
//! in flight, and its own statistics: no spawn and no lock per request. A request's send
//! time is taken when its future is first polled, just before the SDK encodes and queues
//! the frame; the SDK then writes it with the other queued frames in one flush.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use gateway::sdk::{Client, ClientOptions, ErrorKind, Response, SdkError};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinSet;

use super::clock::{ClockKind, Metronome, Pacer, phase_groups};
use super::hist::Summary;
use super::procfs::{CpuSample, CpuUse, Watched};
use super::schedule::{Payload, Plan, RequestBody, Schedule, Stop, phase_offset, times};
use super::stats::{
    Answer, ClientStats, Outcome, Recorded, Recorder, ServerTiming, SharedRecorded, rate,
};

/// Time between deciding the start and the first slot, so every task is ready for it.
const LEAD: Duration = Duration::from_millis(20);
/// Slack after the last request's timeout before a run gives up on it.
pub const HARD_MARGIN: Duration = Duration::from_secs(1);
/// Completions a client counts locally before publishing them to the progress bar.
const PROGRESS_BATCH: u64 = 64;
/// How often the progress bar redraws.
const PROGRESS_TICK: Duration = Duration::from_millis(200);
/// Most distinct connect errors kept for the report.
const MAX_CONNECT_ERRORS: usize = 8;
/// How long closing the clients may take at the end.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// Phase groups the clients are spread over within one interval.
    pub phases: u32,
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
    pub tls: Option<Arc<gateway::sdk::rustls::ClientConfig>>,
    /// Processes whose CPU use over the window is reported.
    pub watched: Vec<Watched>,
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub target: Target,
    pub spec: LoadSpec,
    pub phases: u32,
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
    let phases = phase_groups(spec.interval, spec.phases);
    let schedules: Vec<Schedule> = (0..phases)
        .map(|g| {
            Schedule::new(
                start + phase_offset(spec.interval, g, phases),
                spec.interval,
            )
        })
        .collect();
    let window_start = start + spec.warmup;
    let window_end = window_start + spec.window();
    let stop = match spec.length {
        Length::Duration(d) => Stop::At(window_start + d),
        Length::Count(n) => Stop::Count(n),
    };
    let plans: Vec<Plan> = (0..spec.clients)
        .map(|i| Plan::new(schedules[i % schedules.len()], window_start, stop))
        .collect();
    let last_due = plans.iter().map(Plan::last_due).max().unwrap_or(start);
    let hard_deadline = last_due + spec.timeout + HARD_MARGIN;
    let clock = spec.clock.resolve(spec.offered_rps());
    let metronome = match clock {
        ClockKind::Thread | ClockKind::Auto => {
            let end = plans.iter().map(|p| p.end).max().unwrap_or(0);
            Some(Metronome::start(schedules.clone(), end)?)
        }
        ClockKind::Tokio => None,
    };

    let progress = Arc::new(Progress::default());
    let recorded = SharedRecorded::default();
    let route: Arc<str> = Arc::from(spec.route.as_str());
    let payload = Arc::new(spec.payload.clone());
    let mut tasks = JoinSet::new();
    for (i, (client, plan)) in clients.into_iter().zip(plans).enumerate() {
        let Some(client) = client else { continue };
        let pacer = match &metronome {
            Some(m) => m.pacer(i % schedules.len()),
            None => Pacer::tokio(),
        };
        let driver = Driver {
            client,
            plan,
            pacer,
            route: route.clone(),
            payload: payload.clone(),
            hard_deadline,
            progress: progress.clone(),
            recorder: Recorder::new(recorded.clone(), window_start, i, spec.clients),
        };
        tasks.spawn(async move { (i, driver.drive().await) });
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
    // Every driver has ended and dropped its recorder: this is the last handle.
    let Recorded {
        stats: totals,
        timeline,
    } = Arc::try_unwrap(recorded)
        .map_err(|_| anyhow::anyhow!("a load-test client still holds the record"))?
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let achieved_rps = rate(totals.ok, window_start, window_end, totals.last_answer);
    let end = totals.last_answer.map_or(window_end, |l| l.max(window_end));
    let timeline = timeline.seconds().collect();
    Ok(RunResult {
        target: target.clone(),
        spec: LoadSpec {
            clock,
            ..spec.clone()
        },
        phases,
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
) -> (Vec<Option<Client>>, BTreeMap<String, u64>) {
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
            (i, Client::connect(&url, options).await)
        });
    }
    let mut clients: Vec<Option<Client>> = vec![None; spec.clients];
    let mut errors = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, Ok(client))) => clients[i] = Some(client),
            Ok((_, Err(e))) => note_error(&mut errors, e.to_string()),
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

/// One client's loop.
struct Driver {
    client: Client,
    plan: Plan,
    pacer: Pacer,
    route: Arc<str>,
    payload: Arc<Payload>,
    hard_deadline: Instant,
    progress: Arc<Progress>,
    recorder: Recorder,
}

/// What a client counts itself: its requests, and its answers for its own rate.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// Measured requests sent, and those that ended (answered, timed out, failed).
    sent: u64,
    ended: u64,
    ok: u64,
    last_answer: Option<Instant>,
}

impl Tally {
    fn end(&mut self, outcome: &Outcome) {
        self.ended += 1;
        if let Answer::Response { code, .. } = outcome.answer {
            self.last_answer = Some(
                self.last_answer
                    .map_or(outcome.received, |l| l.max(outcome.received)),
            );
            if code == proto::code::OK {
                self.ok += 1;
            }
        }
    }
}

impl Driver {
    async fn drive(self) -> Tally {
        let Driver {
            client,
            plan,
            mut pacer,
            route,
            payload,
            hard_deadline,
            progress,
            mut recorder,
        } = self;
        let mut tally = Tally::default();
        let mut counts = LocalCounts::default();
        let mut in_flight = FuturesUnordered::new();
        let mut next = 0u64;
        let hard = tokio::time::sleep_until(hard_deadline.into());
        tokio::pin!(hard);
        loop {
            // Checked here, not only by the `hard` branch: under overload an answer is
            // always ready and a biased select would never reach that branch.
            if (next >= plan.end && in_flight.is_empty()) || Instant::now() >= hard_deadline {
                break;
            }
            tokio::select! {
                // Due slots first: they come once per interval, so they cannot starve the
                // answers, while a stream of answers could starve them.
                biased;
                due = pacer.wait_due(&plan.schedule, next), if next < plan.end => {
                    let due = due.min(plan.end);
                    for slot in next..due {
                        if plan.is_measured(slot) {
                            tally.sent += 1;
                        }
                        let at = plan.schedule.at(slot);
                        in_flight.push(request(&client, &route, payload.body(slot), slot, at));
                    }
                    counts.sent(due - next, &progress);
                    next = due;
                }
                Some((slot, outcome)) = in_flight.next() => {
                    counts.done(&outcome.answer, &progress);
                    if plan.is_measured(slot) {
                        tally.end(&outcome);
                        recorder.record(outcome);
                    }
                }
                () = &mut hard => break,
            }
        }
        counts.flush(&progress);
        recorder.finish(tally.sent, tally.sent.saturating_sub(tally.ended));
        // The requests still in flight borrow the client: abandon them before closing.
        drop(in_flight);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, client.close()).await;
        tally
    }
}

/// One request, timed.
async fn request(
    client: &Client,
    route: &str,
    body: RequestBody,
    slot: u64,
    scheduled: Instant,
) -> (u64, Outcome) {
    let sent = Instant::now();
    let result = client.request(route, body).await;
    let received = Instant::now();
    let outcome = Outcome {
        scheduled,
        sent,
        received,
        answer: answer_of(result),
    };
    (slot, outcome)
}

fn answer_of(result: Result<Response, SdkError>) -> Answer {
    match result {
        Ok(r) => Answer::Response {
            code: r.code,
            timing: r.timing.map(|t| ServerTiming {
                total_us: t.total_us,
                queue_us: t.queue_us,
                handler_us: t.handler_us,
            }),
            message: r.message,
        },
        Err(e) => match e.kind() {
            ErrorKind::Timeout => Answer::Timeout,
            ErrorKind::Closed { .. } => Answer::Failed("closed"),
            ErrorKind::Protocol => Answer::Failed("protocol"),
            ErrorKind::Connect => Answer::Failed("connect"),
            ErrorKind::Handshake { .. } => Answer::Failed("handshake"),
        },
    }
}

/// Live counts for the progress bar (warm-up included).
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    fn draw(&self, bar: &ProgressBar, start: Instant) {
        let elapsed = Instant::now().saturating_duration_since(start);
        bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        bar.set_message(format!(
            "sent {} ok {} failed {}",
            self.sent.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        ));
    }
}

/// A client's counts not yet published, so the shared atomics are touched once per
/// [`PROGRESS_BATCH`] requests instead of once per request.
#[derive(Debug, Default)]
struct LocalCounts {
    sent: u64,
    ok: u64,
    failed: u64,
}

impl LocalCounts {
    fn sent(&mut self, n: u64, progress: &Progress) {
        self.sent += n;
        if self.sent >= PROGRESS_BATCH {
            self.flush(progress);
        }
    }

    fn done(&mut self, answer: &Answer, progress: &Progress) {
        match answer {
            Answer::Response { code: 200, .. } => self.ok += 1,
            _ => self.failed += 1,
        }
        if self.ok + self.failed >= PROGRESS_BATCH {
            self.flush(progress);
        }
    }

    fn flush(&mut self, progress: &Progress) {
        progress.sent.fetch_add(self.sent, Ordering::Relaxed);
        progress.ok.fetch_add(self.ok, Ordering::Relaxed);
        progress.failed.fetch_add(self.failed, Ordering::Relaxed);
        *self = LocalCounts::default();
    }
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
