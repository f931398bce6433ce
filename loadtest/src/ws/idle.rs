//! `idle`: resident memory a gate spends per idle session.
//!
//! Reads the gate's `VmRSS`, opens N sessions with the SDK (WebSocket + handshake, so
//! the gate has fully set each one up when its ack arrives), reads `VmRSS` again while
//! they are all open, and divides the difference by the sessions opened. The sessions
//! send nothing but the SDK's heartbeats.
//!
//! With `--detached` (a gate it launches) the sessions are resumable and reach the gate
//! through a TCP hop ([`testkit::Cut`]); once open, the hop cuts every link and refuses
//! the clients' redials, so each session waits on the gate, detached, for a client that
//! does not come (docs/protocol.md, "Resume"). When the gate counts them all detached
//! (`gate_sessions_detached`), `VmRSS` is read a third time. It hardly moves: what a
//! detached session lets go (its socket's buffers) stays with the allocator. So as many
//! sessions again are opened, live, and `VmRSS` read a last time: they are built mostly
//! from what the detached ones let go, and what they add on top, per session, is an
//! estimate of what each detached session still holds. Each detached session costs the
//! load tester three descriptors (its client and the hop's two sockets).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use nix::sys::signal::Signal;
use sdk::{Backoff, Client, ClientOptions};
use serde::{Deserialize, Serialize};
use testkit::fleet::{Role, scrape};
use testkit::{Cut, Process};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::target::{Gates, TargetArgs, with_topology};
use crate::proc::{CpuSample, CpuUse, rss_bytes};
use crate::report::{Doc, OutputArgs, Report, Section, cpu_line};
use crate::spread::{Children, SpreadArgs, Stop, explain, unix_ms};
/// Most sessions one run opens: each is a file descriptor here and in the gate.
pub const MAX_SESSIONS: usize = 50_000;

/// Flags of `shaddock loadtest idle`.
#[derive(Debug, clap::Args)]
pub struct IdleArgs {
    /// Sessions to open (on the first gate).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SESSIONS as u64))]
    pub sessions: u64,
    /// Pid of the gate given by --url, whose RSS is read from /proc (a launched gate's
    /// pid is known).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Handshakes in progress at once.
    #[arg(long, default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub concurrency: u64,
    /// Also measure the sessions detached (see the module docs); needs a launched gate.
    #[arg(long, conflicts_with_all = ["procs", "drain"])]
    pub detached: bool,
    /// With --procs: how long the sessions are held, only heartbeating, while every
    /// process's CPU is read.
    #[arg(long, default_value = "10s", value_parser = net::duration::parse)]
    pub hold: Duration,
    /// Every session dials the first of the launched gates (then the others), which is
    /// drained (SIGTERM) after --hold: how soon every player is served elsewhere.
    #[arg(long)]
    pub drain: bool,
    #[command(flatten)]
    pub spread: SpreadArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How long the gate may take to see every cut link once the hop cut them.
const DETACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a drained gate's players may take to be served elsewhere before those not
/// yet are counted lost: the gate's shutdown grace (5 s) and a reconnection's backoff.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a load process looks for players that moved.
const MOVE_POLL: Duration = Duration::from_millis(10);

/// Resident memory per idle session.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub url: String,
    pub pid: u32,
    pub sessions: usize,
    pub opened: usize,
    pub failed: usize,
    pub open_seconds: f64,
    pub rss_before: u64,
    pub rss_after: u64,
    pub bytes_per_session: f64,
    /// Sessions still open when the second RSS reading was taken.
    pub alive_after: usize,
    /// With `--detached`: the RSS once every session was detached, then with as many
    /// live sessions again, and the estimate of what a detached session holds (see the
    /// module docs).
    pub rss_detached: Option<u64>,
    pub rss_refilled: Option<u64>,
    pub bytes_per_detached: Option<f64>,
    #[serde(skip)]
    first_error: Option<String>,
}

pub async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    if args.spread.child {
        return child(&args).await;
    }
    let (gates, mut topology) = args.target.gates(1, 1).await?;
    if args.spread.procs > 1 || args.drain {
        // The drained gate is the scenario's to stop: its exit is no failure.
        let drained = match args.drain {
            true => Some(
                (topology.as_mut().and_then(|t| t.take(&Role::Gate(0))))
                    .filter(|_| gates.urls.len() > 1)
                    .context("--drain needs two gates or more that this command launches")?,
            ),
            false => None,
        };
        let spread = with_topology(topology, measure_spread(&args, &gates, drained)).await?;
        Report::new("idle", gates.setup.clone(), spread.clone()).write(&args.output)?;
        ensure!(
            spread.opened > 0,
            "no session could be opened: {}",
            spread.first_error
        );
        let lost = spread.drain.as_ref().map_or(0, |d| d.lost);
        ensure!(
            lost == 0,
            "{lost} player(s) of the drained gate were not served elsewhere"
        );
        return Ok(());
    }
    let metrics = (topology.iter())
        .flat_map(|t| t.metrics_urls())
        .find_map(|(role, url)| matches!(role, Role::Gate(_)).then_some(url));
    anyhow::ensure!(
        !args.detached || metrics.is_some(),
        "--detached needs a gate this command launches (it reads the gate's metrics)"
    );
    let idle = with_topology(topology, measure(&args, &gates, metrics)).await?;
    Report::new("idle", gates.setup.clone(), idle.clone()).write(&args.output)?;
    let error = idle.first_error.unwrap_or_default();
    if idle.opened == 0 {
        bail!("no session could be opened: {error}");
    }
    if idle.failed > 0 {
        tracing::warn!("{} session(s) failed to open, first: {error}", idle.failed);
    }
    Ok(())
}

/// Opens the sessions and reads the gate's RSS around it (and, `--detached`, once they
/// are detached: `metrics` is the gate's metrics URL).
async fn measure(
    args: &IdleArgs,
    gates: &Gates,
    metrics: Option<String>,
) -> anyhow::Result<IdleReport> {
    let url = gates.urls.first().context("no gate URL")?.clone();
    let hop = match args.detached {
        true => {
            let addr = url.trim_start_matches("ws://").parse()?;
            Some(Cut::start(addr).await.context("starting a TCP hop")?)
        }
        false => None,
    };
    let dial = hop.as_ref().map_or_else(|| url.clone(), Cut::ws_url);
    let options = ClientOptions {
        // Resumable sessions ask to be, and a resume needs a client that redials.
        reconnect: hop.is_some().then(Backoff::default),
        ..ClientOptions::default()
    };
    let Some(pid) = args.pid.or_else(|| gates.gate_pids.first().copied()) else {
        bail!("--pid is required with --url: the gate's RSS is read from /proc/<pid>");
    };
    let rss = || rss_bytes(pid).with_context(|| format!("reading VmRSS of pid {pid}"));
    let sessions = usize::try_from(args.sessions)?;
    let rss_before = rss()?;
    let began = Instant::now();
    let (clients, first_error) = open(args, |_| (vec![dial.clone()], options.clone())).await?;
    let open_seconds = began.elapsed().as_secs_f64();
    let rss_after = rss()?;
    let alive_after = clients.iter().filter(|c| !c.is_closed()).count();
    let opened = clients.len();
    let mut rss_detached = None;
    let mut rss_refilled = None;
    let mut refill = Vec::new();
    if let (Some(hop), Some(metrics)) = (hop, metrics) {
        // Every link cut, and no redial gets through: the hop is gone.
        hop.cut();
        drop(hop);
        let detached = async {
            loop {
                let counted = scrape(&metrics, &["gate_sessions_detached"]).await;
                if counted.is_some_and(|c| c[0] >= opened as f64) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(DETACH_TIMEOUT, detached)
            .await
            .context("the gate did not count every session detached")?;
        rss_detached = Some(rss()?);
        for _ in 0..opened {
            refill.push(Client::connect(&url, ClientOptions::default()).await?);
        }
        rss_refilled = Some(rss()?);
    }
    futures::future::join_all(refill.iter().map(Client::close)).await;
    futures::future::join_all(clients.iter().map(Client::close)).await;
    Ok(IdleReport {
        url,
        pid,
        sessions,
        opened,
        failed: sessions - opened,
        open_seconds,
        rss_before,
        rss_after,
        bytes_per_session: (rss_after as f64 - rss_before as f64) / opened.max(1) as f64,
        alive_after,
        rss_detached,
        rss_refilled,
        bytes_per_detached: rss_detached
            .zip(rss_refilled)
            .map(|(detached, refilled)| (refilled as f64 - detached as f64) / opened.max(1) as f64),
        first_error,
    })
}

impl Section for IdleReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
    }
}

/// Opens `args.sessions` sessions, `args.concurrency` handshakes at a time, the `k`-th
/// to the gates and with the options `dial(k)` gives (a `--source-addrs` address set
/// here): those that opened, and the first error of those that did not.
async fn open(
    args: &IdleArgs,
    dial: impl Fn(usize) -> (Vec<String>, ClientOptions),
) -> anyhow::Result<(Vec<Client>, Option<String>)> {
    let permits = Arc::new(Semaphore::new(usize::try_from(args.concurrency)?));
    let mut set = JoinSet::new();
    for k in 0..usize::try_from(args.sessions)? {
        let (urls, options) = dial(k);
        let options = ClientOptions {
            source_addr: args.spread.source(k),
            ..options
        };
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
    Ok((clients, first_error))
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

/// A load process of `--procs`: its share of sessions over the `--url` gates
/// round-robin (with `--drain`: the first gate, then the others from a different one
/// each), held until the parent's SIGTERM.
async fn child(args: &IdleArgs) -> anyhow::Result<()> {
    let mut stop = Stop::install()?;
    let urls = &args.target.url;
    let options = ClientOptions {
        // A drained gate's player moves, or reconnects after the kick at the grace's end.
        reconnect: args.drain.then(Backoff::default),
        ..ClientOptions::default()
    };
    let started_ms = unix_ms();
    let (clients, first_error) = open(args, |k| {
        let mut order = urls.clone();
        match args.drain {
            true => order[1..].rotate_left(k % (urls.len() - 1)),
            false => order.rotate_left(k % urls.len()),
        }
        (order, options.clone())
    })
    .await?;
    stop.ready(&Opened {
        opened: clients.len(),
        failed: usize::try_from(args.sessions)? - clients.len(),
        first_error,
        started_ms,
        ended_ms: unix_ms(),
    })?;
    let moved = match args.drain {
        true => served_elsewhere(&clients, &mut stop).await,
        false => {
            stop.wait().await;
            Moved::default()
        }
    };
    stop.result(&moved)?;
    futures::future::join_all(clients.iter().map(Client::close)).await;
    Ok(())
}

/// Until every client has moved (or reconnected) and had a request answered 200 on its
/// new gate, or SIGTERM: how many were, and when the last was.
async fn served_elsewhere(clients: &[Client], stop: &mut Stop) -> Moved {
    let mut asked = vec![false; clients.len()];
    let mut confirms = JoinSet::new();
    let mut moved = Moved::default();
    let mut poll = tokio::time::interval(MOVE_POLL);
    while moved.served < clients.len() {
        tokio::select! {
            () = stop.wait() => break,
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

/// Idle sessions on a box: every gate's, and every load process's, figures together.
#[derive(Debug, Clone, Serialize)]
pub struct SpreadReport {
    pub procs: u32,
    pub gates: usize,
    pub sessions: u64,
    pub opened: usize,
    pub failed: usize,
    pub first_error: String,
    /// From the first process's first handshake to the last one's last.
    pub open_seconds: f64,
    pub handshakes_per_s: f64,
    pub gate_rss_before: Vec<u64>,
    pub gate_rss_after: Vec<u64>,
    /// The gates' RSS growth over the sessions opened.
    pub bytes_per_session: f64,
    pub hold_s: f64,
    pub cpu: Vec<CpuUse>,
    pub drain: Option<DrainReport>,
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

/// Starts the load processes, reads the gates' RSS around their opening, the CPU over
/// the hold, and (with a `drained` gate) drains it.
async fn measure_spread(
    args: &IdleArgs,
    gates: &Gates,
    drained: Option<Process>,
) -> anyhow::Result<SpreadReport> {
    let rss = || {
        (gates.gate_pids.iter())
            .map(|pid| rss_bytes(*pid).unwrap_or(0))
            .collect()
    };
    let gate_rss_before: Vec<u64> = rss();
    let procs = u64::from(args.spread.procs);
    let mut children = Children::start(&args.spread, |i| {
        let share = args.sessions / procs + u64::from((i as u64) < args.sessions % procs);
        let mut child = ["idle", "--url", &gates.urls.join(",")]
            .map(String::from)
            .to_vec();
        child.extend(["--sessions".into(), share.to_string()]);
        child.extend(["--concurrency".into(), args.concurrency.to_string()]);
        child.extend(args.drain.then(|| "--drain".to_owned()));
        child
    })?;
    let opened: Vec<Opened> = children.ready().await?;
    let gate_rss_after: Vec<u64> = rss();
    let watched = [gates.watched.clone(), children.watched()].concat();
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
    let wait = if stopped.is_some() {
        DRAIN_TIMEOUT
    } else {
        Duration::ZERO
    };
    let moved: Vec<Moved> = children.finish(wait).await?;
    let count = |f: fn(&Opened) -> usize| opened.iter().map(f).sum::<usize>();
    let total = count(|o| o.opened);
    let started = opened.iter().map(|o| o.started_ms).fold(f64::MAX, f64::min);
    let ended = opened.iter().map(|o| o.ended_ms).fold(0.0, f64::max);
    let open_seconds = (ended - started) / 1e3;
    let grown: u64 = (gate_rss_after.iter().zip(&gate_rss_before))
        .map(|(a, b)| a.saturating_sub(*b))
        .sum();
    let drain = stopped.map(|(at, gate_stopped)| {
        let served = moved.iter().map(|m| m.served).sum();
        DrainReport {
            players: total,
            served_elsewhere: served,
            lost: total - served,
            last_served_after_s: (moved.iter().map(|m| m.last_served_ms).fold(at, f64::max) - at)
                / 1e3,
            closed: moved.iter().map(|m| m.closed).sum(),
            gate_stopped,
        }
    });
    Ok(SpreadReport {
        procs: args.spread.procs,
        gates: gates.urls.len(),
        sessions: args.sessions,
        opened: total,
        failed: count(|o| o.failed),
        first_error: opened
            .into_iter()
            .find_map(|o| o.first_error)
            .unwrap_or_default(),
        open_seconds,
        handshakes_per_s: total as f64 / open_seconds.max(1e-3),
        gate_rss_before,
        gate_rss_after,
        bytes_per_session: grown as f64 / total.max(1) as f64,
        hold_s: args.hold.as_secs_f64(),
        cpu,
        drain,
    })
}

impl Section for SpreadReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        doc.lines(vec![cpu_line(
            &self.cpu,
            self.opened as u64,
            "session held",
        )]);
        if let Some(drain) = &self.drain {
            doc.heading("the first gate drained");
            doc.fields(drain);
        }
    }
}
