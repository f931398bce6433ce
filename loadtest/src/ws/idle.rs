//! `idle`: resident memory a gate spends per idle session, and what a box of gates full
//! of idle players costs (docs/capacity.md). `--procs` load processes ([`crate::spread`])
//! open N SDK sessions over the gates round-robin (a gate has set one up fully when its
//! ack arrives); the gates' `VmRSS` growth ÷ N is the cost. `--hold` keeps them, only
//! heartbeating, while every process's CPU is read; `--drain` then drains (SIGTERM) the
//! first gate, which every session dialled: how soon each is served elsewhere.
//!
//! `--detached` opens resumable sessions here, through a TCP hop ([`testkit::Cut`]) that
//! then cuts every link and refuses redials: each waits on the gate, detached
//! (docs/protocol.md, "Resume"). What a detached session lets go (its socket buffers)
//! stays with the allocator, so `VmRSS` hardly moves; as many live sessions again are
//! built mostly from it, and what they add on top estimates what a detached one still
//! holds. Each costs this process three descriptors (client and the hop's two sockets).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use nix::sys::signal::Signal;
use sdk::{Backoff, Client, ClientOptions};
use serde::{Deserialize, Serialize};
use testkit::copies::AsCopy;
use testkit::fleet::{Role, Topology, scrape};
use testkit::{Cut, Process};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::target::{Gates, TargetArgs, with_topology};
use crate::proc::{CpuSample, CpuUse, rss_bytes};
use crate::report::{Doc, OutputArgs, Report, Section, cpu_line};
use crate::spread::{Children, SpreadArgs, explain, unix_ms};

/// Most sessions one run opens: each is a file descriptor in a load process and a gate.
pub const MAX_SESSIONS: usize = 1_000_000;
/// How long the gate may take to see every cut link once the hop cut them.
const DETACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a drained gate's players may take to be served elsewhere: the gate's 5 s
/// shutdown grace and a reconnection's backoff.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a load process looks for players that moved.
const MOVE_POLL: Duration = Duration::from_millis(10);

/// Flags of `shaddock loadtest idle`.
#[derive(Debug, clap::Args)]
pub struct IdleArgs {
    /// Sessions to open, over every gate round-robin (`--detached`: on the first).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SESSIONS as u64))]
    pub sessions: u64,
    /// Pids of the gates given by --url, comma-separated, whose RSS is read from /proc
    /// (a launched gate's pid is known).
    #[arg(long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Handshakes in progress at once, in each load process.
    #[arg(long, default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub concurrency: u64,
    /// Also measure the sessions detached (see the module docs); needs a launched gate.
    #[arg(long, conflicts_with_all = ["procs", "drain", "source_addrs"])]
    pub detached: bool,
    /// How long the sessions are held, only heartbeating, while every process's CPU is
    /// read.
    #[arg(long, default_value = "0s", value_parser = net::duration::parse)]
    pub hold: Duration,
    /// Every session dials the first of the launched gates, which is drained (SIGTERM)
    /// after --hold: how soon every player is served elsewhere.
    #[arg(long)]
    pub drain: bool,
    #[command(flatten)]
    pub spread: SpreadArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Idle sessions on the gates: every gate's and every load process's figures together.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub procs: u32,
    pub gates: usize,
    pub pids: Vec<u32>,
    pub sessions: u64,
    pub opened: usize,
    pub failed: usize,
    pub first_error: String,
    /// From the first process's first handshake to the last one's last.
    pub open_seconds: f64,
    pub handshakes_per_s: f64,
    /// Every process's CPU while the sessions opened.
    pub open_cpu: Vec<CpuUse>,
    pub rss_before: Vec<u64>,
    pub rss_after: Vec<u64>,
    /// The gates' RSS growth over the sessions opened.
    pub bytes_per_session: f64,
    pub hold_s: f64,
    pub cpu: Vec<CpuUse>,
    pub drain: Option<DrainReport>,
    /// With `--detached`: the RSS once every session was detached, then with as many
    /// live sessions again, and the estimate of what a detached session holds.
    pub rss_detached: Option<u64>,
    pub rss_refilled: Option<u64>,
    pub bytes_per_detached: Option<f64>,
}

/// What a drained gate's players saw.
#[derive(Debug, Clone, Serialize)]
pub struct DrainReport {
    pub players: usize,
    pub served_elsewhere: usize,
    pub lost: usize,
    /// From SIGTERM to the last player's first answer on another gate.
    pub last_served_after_s: f64,
    pub closed: usize,
    pub gate_stopped: String,
}

/// What a load process says once its sessions are open.
#[derive(Debug, Serialize, Deserialize)]
struct Opened {
    opened: usize,
    failed: usize,
    first_error: Option<String>,
    started_ms: f64,
    ended_ms: f64,
}

/// What a load process says at the end: with `--drain`, its players served elsewhere.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Moved {
    served: usize,
    closed: usize,
    last_served_ms: f64,
}

pub async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    if args.spread.child {
        return child(&args).await;
    }
    let (gates, mut topology) = args.target.gates(1, 1).await?;
    let pids = match args.pid.is_empty() {
        true => gates.gate_pids.clone(),
        false => args.pid.clone(),
    };
    let why = "--pid is required with --url: a gate's RSS is read from /proc/<pid>";
    ensure!(!pids.is_empty(), why);
    let mut metrics = topology.iter().flat_map(|t| t.metrics_urls());
    let metrics = metrics.find_map(|(role, url)| matches!(role, Role::Gate(_)).then_some(url));
    let why = "--detached needs a gate this command launches (it reads the gate's metrics)";
    ensure!(!args.detached || metrics.is_some(), why);
    // The drained gate is the scenario's to stop: its exit is no failure.
    let take = |t: &mut Topology| t.take(&Role::Gate(0)).filter(|_| gates.urls.len() > 1);
    let drained = (args.drain)
        .then(|| topology.as_mut().and_then(take))
        .map(|g| g.context("--drain needs two gates or more that this command launches"))
        .transpose()?;
    let metrics = metrics.filter(|_| args.detached);
    let measured = measure(&args, &gates, &pids, metrics, drained);
    let idle = with_topology(topology, measured).await?;
    let idle = Report::new("idle", gates.setup.clone(), idle).written(&args.output)?;
    let why = &idle.first_error;
    ensure!(idle.opened > 0, "no session could be opened: {why}");
    if idle.failed > 0 {
        tracing::warn!("{} session(s) failed to open, first: {why}", idle.failed);
    }
    let lost = idle.drain.as_ref().map_or(0, |d| d.lost);
    let why = "player(s) of the drained gate were not served elsewhere";
    ensure!(lost == 0, "{lost} {why}");
    Ok(())
}

/// Opens the sessions, the gates' RSS around it and CPU over the hold; then drains or
/// (`metrics`: the gate's metrics URL) detaches.
async fn measure(
    args: &IdleArgs,
    gates: &Gates,
    pids: &[u32],
    metrics: Option<String>,
    drained: Option<Process>,
) -> anyhow::Result<IdleReport> {
    let read = |pid: &u32| rss_bytes(*pid).with_context(|| format!("reading VmRSS of pid {pid}"));
    let rss = || -> anyhow::Result<Vec<u64>> { pids.iter().map(read).collect() };
    let rss_before = rss()?;
    let (opened, rss_after, detached, children, open_cpu) = match metrics {
        Some(metrics) => {
            let (opened, rss_after, detached) =
                detach(args, &gates.urls[0], &metrics, &rss).await?;
            (vec![opened], rss_after, Some(detached), None, Vec::new())
        }
        None => {
            let mut flags = vec!["--concurrency".into(), args.concurrency.to_string()];
            flags.extend(args.drain.then(|| "--drain".to_owned()));
            let share = ("--sessions", args.sessions);
            let mut children = Children::start(&args.spread, "idle", &gates.urls, share, flags)?;
            let watched = [gates.watched.clone(), children.watched()].concat();
            let opening = CpuSample::take(&watched);
            let opened: Vec<Opened> = children.0.ready().await?;
            let open_cpu = opening.until(&CpuSample::take(&watched));
            (opened, rss()?, None, Some(children), open_cpu)
        }
    };
    let children_watched: Vec<_> = children.iter().flat_map(Children::watched).collect();
    let watched = [gates.watched.clone(), children_watched].concat();
    let before = CpuSample::take(&watched);
    // The measurement's window: sessions held as a game's idle players are.
    tokio::time::sleep(args.hold).await;
    let cpu = before.until(&CpuSample::take(&watched));
    let mut stopped = None;
    if let Some(mut gate) = drained {
        let at = unix_ms();
        let status = gate.stop(Signal::SIGTERM, DRAIN_TIMEOUT).await;
        stopped = Some((at, status.map_or_else(|e| e, |s| s.to_string())));
    }
    let wait = stopped.as_ref().map_or(Duration::ZERO, |_| DRAIN_TIMEOUT);
    let moved: Vec<Moved> = match children {
        Some(children) => children.0.finish(wait).await?,
        None => Vec::new(),
    };
    let total: usize = opened.iter().map(|o| o.opened).sum();
    let started = opened.iter().map(|o| o.started_ms).fold(f64::MAX, f64::min);
    let open_seconds = (opened.iter().map(|o| o.ended_ms).fold(0.0, f64::max) - started) / 1e3;
    let first_error = opened.iter().find_map(|o| o.first_error.clone());
    let per_session = |grown: i64| grown as f64 / total.max(1) as f64;
    let sum = |rss: &[u64]| rss.iter().sum::<u64>() as i64;
    let drain = stopped.map(|(at, gate_stopped)| {
        let served = moved.iter().map(|m| m.served).sum();
        let last = moved.iter().map(|m| m.last_served_ms).fold(at, f64::max);
        DrainReport {
            players: total,
            served_elsewhere: served,
            lost: total - served,
            last_served_after_s: (last - at) / 1e3,
            closed: moved.iter().map(|m| m.closed).sum(),
            gate_stopped,
        }
    });
    Ok(IdleReport {
        procs: args.spread.procs,
        gates: gates.urls.len(),
        pids: pids.to_vec(),
        sessions: args.sessions,
        opened: total,
        failed: opened.iter().map(|o| o.failed).sum(),
        first_error: first_error.unwrap_or_default(),
        open_seconds,
        handshakes_per_s: total as f64 / open_seconds.max(1e-3),
        open_cpu,
        bytes_per_session: per_session(sum(&rss_after) - sum(&rss_before)),
        rss_before,
        rss_after,
        hold_s: args.hold.as_secs_f64(),
        cpu,
        drain,
        rss_detached: detached.map(|(d, _)| d),
        rss_refilled: detached.map(|(_, r)| r),
        bytes_per_detached: detached.map(|(d, r)| per_session(r as i64 - d as i64)),
    })
}

/// `--detached`: sessions through a hop to `url`; the RSS open, detached, and refilled.
async fn detach(
    args: &IdleArgs,
    url: &str,
    metrics: &str,
    rss: &impl Fn() -> anyhow::Result<Vec<u64>>,
) -> anyhow::Result<(Opened, Vec<u64>, (u64, u64))> {
    let gate = url.trim_start_matches("ws://").parse()?;
    let hop = Cut::start(gate).await.context("starting a TCP hop")?;
    let options = ClientOptions {
        // Resumable sessions ask to be, and a resume needs a client that redials.
        reconnect: Some(Backoff::default()),
        ..ClientOptions::default()
    };
    let (clients, opened) = open(args, |_| (vec![hop.ws_url()], options.clone())).await?;
    let rss_after = rss()?;
    // Every link cut, and no redial gets through: the hop is gone.
    hop.cut();
    drop(hop);
    let (gauge, n) = (["gate_sessions_detached"], clients.len() as f64);
    let detached = async {
        while !scrape(metrics, &gauge).await.is_some_and(|c| c[0] >= n) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let counted = tokio::time::timeout(DETACH_TIMEOUT, detached).await;
    counted.context("the gate did not count every session detached")?;
    let rss_detached = rss()?.iter().sum();
    let mut refill = Vec::new();
    for _ in &clients {
        refill.push(Client::connect(url, ClientOptions::default()).await?);
    }
    let rss_refilled = rss()?.iter().sum();
    futures::future::join_all(refill.iter().chain(&clients).map(Client::close)).await;
    Ok((opened, rss_after, (rss_detached, rss_refilled)))
}

impl Section for IdleReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        let opened = self.opened as u64;
        if !self.open_cpu.is_empty() {
            doc.lines(vec![cpu_line(&self.open_cpu, opened, "handshake")]);
        }
        if self.hold_s > 0.0 {
            doc.lines(vec![cpu_line(&self.cpu, opened, "session held")]);
        }
        if let Some(drain) = &self.drain {
            doc.heading("the first gate drained");
            doc.fields(drain);
        }
    }
}

/// Opens `--sessions`, `--concurrency` handshakes at a time, the `k`-th as `dial(k)`
/// says (plus its `--source-addrs` address): those that opened, and how it went.
async fn open(
    args: &IdleArgs,
    dial: impl Fn(usize) -> (Vec<String>, ClientOptions),
) -> anyhow::Result<(Vec<Client>, Opened)> {
    let started_ms = unix_ms();
    let permits = Arc::new(Semaphore::new(usize::try_from(args.concurrency)?));
    let mut set = JoinSet::new();
    for k in 0..usize::try_from(args.sessions)? {
        let (urls, mut options) = dial(k);
        options.source_addr = args.spread.source(k);
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            Client::connect_any(&urls, options).await
        });
    }
    let mut clients = Vec::with_capacity(set.len());
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined.map_err(anyhow::Error::from) {
            Ok(Ok(client)) => clients.push(client),
            Ok(Err(e)) => drop(first_error.get_or_insert_with(|| explain(e.to_string()))),
            Err(e) => drop(first_error.get_or_insert(e.to_string())),
        }
    }
    let opened = Opened {
        opened: clients.len(),
        failed: usize::try_from(args.sessions)? - clients.len(),
        first_error,
        started_ms,
        ended_ms: unix_ms(),
    };
    Ok((clients, opened))
}

/// A load process: its share of sessions over the `--url` gates round-robin (`--drain`:
/// the first gate, then the others from a different one each) until SIGTERM.
async fn child(args: &IdleArgs) -> anyhow::Result<()> {
    let mut stop = AsCopy::install()?;
    let urls = &args.target.url;
    let options = ClientOptions {
        // A drained gate's player moves, or reconnects after the kick at the grace's end.
        reconnect: args.drain.then(Backoff::default),
        ..ClientOptions::default()
    };
    let (clients, opened) = open(args, |k| {
        let mut order = urls.clone();
        match args.drain {
            true => order[1..].rotate_left(k % (urls.len() - 1).max(1)),
            false => order.rotate_left(k % urls.len()),
        }
        (order, options.clone())
    })
    .await?;
    stop.ready(&opened)?;
    let moved = match args.drain {
        true => served_elsewhere(&clients, &mut stop).await,
        false => {
            stop.stopped().await;
            Moved::default()
        }
    };
    stop.result(&moved)?;
    futures::future::join_all(clients.iter().map(Client::close)).await;
    Ok(())
}

/// How many clients moved and had a 200 on their new gate, and when the last did.
async fn served_elsewhere(clients: &[Client], stop: &mut AsCopy) -> Moved {
    let mut asked = vec![false; clients.len()];
    let mut confirms = JoinSet::new();
    let mut moved = Moved::default();
    let mut poll = tokio::time::interval(MOVE_POLL);
    while moved.served < clients.len() {
        tokio::select! {
            () = stop.stopped() => break,
            Some(Ok(true)) = confirms.join_next() => {
                moved.served += 1;
                moved.last_served_ms = unix_ms();
            }
            _ = poll.tick() => {
                for (client, asked) in clients.iter().zip(&mut asked) {
                    if !*asked && client.moves() + client.reconnects() > 0 {
                        *asked = true;
                        let client = client.clone();
                        confirms.spawn(async move {
                            let answer = client.request("echo.raw", b"moved").await;
                            answer.is_ok_and(|r| r.code == proto::code::OK)
                        });
                    }
                }
            }
        }
    }
    moved.closed = clients.iter().filter(|c| c.is_closed()).count();
    moved
}
